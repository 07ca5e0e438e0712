#!/usr/bin/env bash
# Issue 10's judgement loop: runs the random 8-task usemem workload N times, each under a hard
# timeout, and records for every run its exit status, wall time and the tripwire counters from
# its JSON (fault_refault_tripwire, fault_stale_unmapped, pool_slot_lost, pgunmap_zapped), and
# uffd_move_unreported (pages the kernel's UFFDIO_MOVE moved without reporting; recovered).
#
#   bench/hang-loop.sh N ram|file [USERMM_BINARY] [LOG]
#
# A run that reaches the timeout (TIMEOUT seconds, default 300) is a hang. Prints one line per
# run to LOG (default /tmp/hang-loop-SWAP.log) and a summary at the end.
set -u
n=${1:?usage: hang-loop.sh N ram|file [usermm] [log]}
swap=${2:?usage: hang-loop.sh N ram|file [usermm] [log]}
bin=${3:-$(dirname "$0")/../target/release/usermm}
log=${4:-/tmp/hang-loop-$swap.log}
tmo=${TIMEOUT:-300}
case $swap in ram|file) ;; *) echo "swap must be ram or file, not '$swap'" >&2; exit 2;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$log"
hangs=0; fails=0; trips=0
for i in $(seq 1 "$n"); do
  s=$(date +%s.%N)
  timeout -s KILL "$tmo" "$bin" bench usemem --tasks 8 --random -j 4096 --repeat 2 --budget 64M \
    --swap "$swap" --swap-size 2G --json 128M > "$work/out" 2> "$work/err"
  rc=$?
  e=$(date +%s.%N)
  c=$(python3 -c "
import json
v = json.load(open('$work/out'))['vmstat']
print(' '.join(str(v.get(k, '?')) for k in ('fault_refault_tripwire', 'fault_stale_unmapped', 'pool_slot_lost', 'pgunmap_zapped', 'uffd_move_unreported')))
" 2>/dev/null || echo "? ? ? ? ?")
  [ $rc = 137 ] && hangs=$((hangs + 1))
  [ $rc != 0 ] && [ $rc != 137 ] && fails=$((fails + 1))
  set -- $c
  [ "$1" != 0 ] && trips=$((trips + 1))
  printf "run %d rc=%d t=%.1f tripwire=%s stale_unmapped=%s pool_slot_lost=%s pgunmap_zapped=%s move_unreported=%s\n" \
    "$i" "$rc" "$(echo "$e - $s" | bc)" "$1" "$2" "$3" "$4" "$5" >> "$log"
  [ $rc != 0 ] && cp "$work/err" "$log.err.$i"
done
t=$(awk '{sub("t=","",$4); print $4}' "$log" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "swap=$swap runs=$n hangs=$hangs failures=$fails runs_with_tripwire=$trips median_s=$t" | tee -a "$log"
