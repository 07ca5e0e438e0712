#!/usr/bin/env bash
# A Redis Cluster for `usermm bench ... --swap redis://...`: 3 primaries and 3 replicas on
# loopback ports, in a directory of its own, password-protected, with an ACL user `swapper`.
# The same setup as the tests' fixture (crates/usermm/tests/redis_fixture).
#
#   bench/redis-cluster.sh start [BASE_PORT]   # prints the --swap spec and the password variable
#   bench/redis-cluster.sh stop
#
# Example:
#   eval "$(bench/redis-cluster.sh start)"     # sets USERMM_REDIS_PASSWORD and SWAP
#   target/release/usermm bench swap-w-seq --budget 256M --swap "$SWAP"
#   target/release/usermm bench swap-w-seq --budget 256M --swap "zswap+$SWAP"
#   bench/redis-cluster.sh stop
set -euo pipefail
DIR=${USERMM_REDIS_DIR:-/tmp/usermm-redis-bench}
PW=${USERMM_REDIS_PASSWORD:-usermm-bench-pw}
cmd=${1:-}
case "$cmd" in
start)
  base=${2:-23000}
  command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server redis-tools" >&2; exit 1; }
  [ -e "$DIR/pids" ] && { echo "a cluster is already running in $DIR: bench/redis-cluster.sh stop" >&2; exit 1; }
  mkdir -p "$DIR"
  nodes=()
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); mkdir -p "$DIR/$p"
    redis-server --port "$p" --bind 127.0.0.1 --dir "$DIR/$p" --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 1500 --save '' --appendonly no \
      --requirepass "$PW" --masterauth "$PW" --logfile redis.log --daemonize yes --pidfile "$DIR/$p/pid"
    nodes+=("127.0.0.1:$p")
    echo "$p" >> "$DIR/pids"
  done
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); t=0
    until [ "$(redis-cli -p "$p" -a "$PW" --no-auth-warning ping 2>/dev/null)" = PONG ]; do
      t=$((t + 1)); [ $t -gt 100 ] && { echo "node $p did not start" >&2; "$0" stop; exit 1; }; sleep 0.1
    done
  done
  redis-cli -p "$base" -a "$PW" --no-auth-warning --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  for i in 0 1 2 3 4 5; do
    p=$((base + i)); t=0
    until redis-cli -p "$p" -a "$PW" --no-auth-warning cluster info | grep -q cluster_state:ok; do
      t=$((t + 1)); [ $t -gt 300 ] && { echo "cluster not ok" >&2; "$0" stop; exit 1; }; sleep 0.1
    done
    redis-cli -p "$p" -a "$PW" --no-auth-warning acl setuser swapper on ">$PW" '~*' '&*' +@all >/dev/null
  done
  echo "export USERMM_REDIS_PASSWORD='$PW'"
  echo "SWAP='redis://swapper@$(IFS=,; echo "${nodes[*]}")'"
  ;;
stop)
  [ -e "$DIR/pids" ] || exit 0
  while read -r p; do
    [ -e "$DIR/$p/pid" ] && kill "$(cat "$DIR/$p/pid")" 2>/dev/null || true
  done < "$DIR/pids"
  sleep 0.5
  rm -rf "$DIR"
  ;;
*) echo "usage: $0 start [BASE_PORT] | stop" >&2; exit 2 ;;
esac
