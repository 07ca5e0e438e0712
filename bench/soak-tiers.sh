#!/usr/bin/env bash
# Issue 16: `usermm bench soak` on every swap tier at once, each for DURATION, and one summary
# file in the form of bench/soak-30m-*.txt (operations, pages verified, the counters the soak
# checks, its verdict and exit status per tier).
#
#   bench/soak-tiers.sh [DURATION] [OUT]     # default 30m, bench/soak-DURATION-YYYY-MM-DD.txt
#
# Tiers: ram, file, zswap+file, zswap+ram, a Redis Cluster (bench/redis-cluster.sh, started and
# stopped here), ram with fault_path=sigbus, an encrypted file. Each soak: 16 MiB budget, 256 MiB
# swap, 4 threads, audits every 5 s, at nice 10 (seven at once on a small machine is slower per
# soak than one alone; the checks are the same). Exits 1 if any soak failed.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-30m}
out=${2:-bench/soak-$dur-$(date +%F).txt}
bin=target/release/usermm
[ -x "$bin" ] || cargo build --release -p usermm-cli
work=$(mktemp -d /var/tmp/usermm-soak-XXXXXX)
eval "$(bench/redis-cluster.sh start)"
trap 'bench/redis-cluster.sh stop >/dev/null 2>&1 || true' EXIT

names=(ram file zswap+file zswap+ram redis sigbus encrypted-file)
declare -A args=(
  [ram]="--swap ram"
  [file]="--swap file"
  [zswap+file]="--swap zswap+file"
  [zswap+ram]="--swap zswap+ram"
  [redis]="--swap $SWAP"
  [sigbus]="--swap ram --set fault_path=sigbus"
  [encrypted-file]="--swap file --swap-encrypt"
)
start=$(date -u +%FT%TZ)
rev="$(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
for n in "${names[@]}"; do
  mkdir -p "$work/$n"
  # shellcheck disable=SC2086 # args are words
  ( nice -n 10 "$bin" bench soak --duration "$dur" --budget 16M --swap-size 256M --dir "$work/$n" \
      ${args[$n]} > "$work/$n.out" 2> "$work/$n.err"; echo "exit $?" >> "$work/$n.out" ) &
done
wait
{
  echo "# Issue 16: $dur soaks on each swap tier, all seven at once at nice 10 on $(nproc) vCPUs,"
  echo "# $start to $(date -u +%FT%TZ), $bin at HEAD $rev (when it started)."
  echo "#   usermm bench soak --duration $dur --budget 16M --swap TIER --swap-size 256M --dir DIR [extra]"
  echo "# (4 threads, seed 1, audits every 5 s; each fails on a mismatch, an Mm::audit inconsistency, a"
  echo "# stuck fault, an unhealthy Mm::health() or a counter only a usermm bug makes nonzero)."
  echo "# Redis: bench/redis-cluster.sh start (3 primaries + 3 replicas on loopback, ACL user swapper)."
  for n in "${names[@]}"; do
    echo
    echo "== $n (${args[$n]})"
    grep -E '^(operations|pages verified|vmstat|result):|^exit ' "$work/$n.out" || true
    grep -E 'ERROR|MISMATCH|panicked' "$work/$n.err" | head -5 || true
  done
} > "$out"
cat "$out"
rm -rf "$work"
! grep -q '^exit [^0]' "$out"
