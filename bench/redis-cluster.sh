#!/usr/bin/env bash
# A Redis Cluster for `usermm bench ... --swap redis://...`: 3 primaries and 3 replicas on
# loopback ports, in a directory of its own, password-protected, with an ACL user `swapper`.
# The same setup as the tests' fixture (crates/usermm/tests/redis_fixture).
#
#   bench/redis-cluster.sh start [tls] [BASE_PORT]   # prints the --swap spec and the variables
#   bench/redis-cluster.sh stop
#
# Example:
#   eval "$(bench/redis-cluster.sh start)"     # sets USERMM_REDIS_PASSWORD and SWAP
#   target/release/usermm bench swap-w-seq --budget 256M --swap "$SWAP"
#   target/release/usermm bench swap-w-seq --budget 256M --swap "zswap+$SWAP"
#   bench/redis-cluster.sh stop
#
# `start tls`: the nodes speak only TLS (--port 0 --tls-port, TLS on the cluster bus and for
# replication, client certificates required), with a throwaway CA, server and client
# certificates made by openssl in $DIR/tls; it also exports USERMM_REDIS_CACERT,
# USERMM_REDIS_CERT and USERMM_REDIS_KEY, and SWAP is rediss://...
set -euo pipefail
DIR=${USERMM_REDIS_DIR:-/tmp/usermm-redis-bench}
PW=${USERMM_REDIS_PASSWORD:-usermm-bench-pw}
cmd=${1:-}
case "$cmd" in
start)
  tls=; [ "${2:-}" = tls ] && { tls=1; shift; }
  base=${2:-23000}
  command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server redis-tools" >&2; exit 1; }
  [ -n "$tls" ] && ! command -v openssl >/dev/null && { echo "openssl not found: apt-get install openssl" >&2; exit 1; }
  [ -e "$DIR/pids" ] && { echo "a cluster is already running in $DIR: bench/redis-cluster.sh stop" >&2; exit 1; }
  mkdir -p "$DIR"
  srv=(); cli=(redis-cli -a "$PW" --no-auth-warning); scheme=redis
  if [ -n "$tls" ]; then
    T=$DIR/tls; mkdir -p "$T"; ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 -new "${ec[@]}" -keyout "$T/ca.key" -out "$T/ca.crt" -days 30 -subj "/CN=usermm bench CA" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > "$T/server.ext"
    printf 'extendedKeyUsage=clientAuth\n' > "$T/client.ext"
    for n in server client; do
      openssl req -new "${ec[@]}" -keyout "$T/$n.key" -out "$T/$n.csr" -subj "/CN=usermm bench $n" 2>/dev/null
      openssl x509 -req -in "$T/$n.csr" -CA "$T/ca.crt" -CAkey "$T/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
        -days 30 -out "$T/$n.crt" -extfile "$T/$n.ext" 2>/dev/null
    done
    chmod 600 "$T"/*.key
    srv=(--tls-cluster yes --tls-replication yes --tls-auth-clients yes --tls-cert-file "$T/server.crt"
      --tls-key-file "$T/server.key" --tls-ca-cert-file "$T/ca.crt")
    cli+=(--tls --cacert "$T/ca.crt" --cert "$T/client.crt" --key "$T/client.key"); scheme=rediss
  fi
  nodes=()
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); mkdir -p "$DIR/$p"
    if [ -n "$tls" ]; then ports=(--port 0 --tls-port "$p"); else ports=(--port "$p"); fi
    redis-server "${ports[@]}" "${srv[@]}" --bind 127.0.0.1 --dir "$DIR/$p" --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 1500 --save '' --appendonly no \
      --requirepass "$PW" --masterauth "$PW" --logfile redis.log --daemonize yes --pidfile "$DIR/$p/pid"
    nodes+=("127.0.0.1:$p")
    echo "$p" >> "$DIR/pids"
  done
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); t=0
    until [ "$("${cli[@]}" -p "$p" ping 2>/dev/null)" = PONG ]; do
      t=$((t + 1)); [ $t -gt 100 ] && { echo "node $p did not start" >&2; "$0" stop; exit 1; }; sleep 0.1
    done
  done
  "${cli[@]}" -p "$base" --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); t=0
    until "${cli[@]}" -p "$p" cluster info | grep -q cluster_state:ok; do
      t=$((t + 1)); [ $t -gt 300 ] && { echo "cluster not ok" >&2; "$0" stop; exit 1; }; sleep 0.1
    done
    "${cli[@]}" -p "$p" acl setuser swapper on ">$PW" '~*' '&*' +@all >/dev/null
  done
  echo "export USERMM_REDIS_PASSWORD='$PW'"
  [ -n "$tls" ] && echo "export USERMM_REDIS_CACERT='$T/ca.crt' USERMM_REDIS_CERT='$T/client.crt' USERMM_REDIS_KEY='$T/client.key'"
  echo "SWAP='$scheme://swapper@$(IFS=,; echo "${nodes[*]}")'"
  ;;
stop)
  [ -e "$DIR/pids" ] || exit 0
  while read -r p; do
    [ -e "$DIR/$p/pid" ] && kill "$(cat "$DIR/$p/pid")" 2>/dev/null || true
  done < "$DIR/pids"
  sleep 0.5
  rm -rf "$DIR"
  ;;
*) echo "usage: $0 start [tls] [BASE_PORT] | stop" >&2; exit 2 ;;
esac
