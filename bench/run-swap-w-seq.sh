#!/usr/bin/env bash
# Runs usermm's swap-w-seq matrix (budget 256M; ~1 GiB and ~4 GiB totals; 1 and 2 tasks; RAM and
# file swap), N runs each, alternating devices, and prints one line per run:
#   device total_MiB tasks elapsed_s swapout_MiB/s throughput_MiB/s peak_resident_MiB peak_rss_MiB verified
# Usage: bench/run-swap-w-seq.sh [RUNS]   (needs target/release/usermm: cargo build --release)
set -euo pipefail
runs=${1:-3}
bin=${USERMM_BIN:-target/release/usermm}
for r in $(seq "$runs"); do
  for swap_size in 1G 5G; do
    for tasks in 1 2; do
      for dev in ram file; do
        verify=""; [ "$swap_size" = 5G ] && verify="--no-verify"
        "$bin" bench swap-w-seq --budget 256M --swap "$dev" --swap-size "$swap_size" -n "$tasks" $verify --json 2>/dev/null |
          python3 -c '
import json, sys
v = json.load(sys.stdin)
total = v["bytes_per_task"] * v["tasks"] >> 20
print("%-4s %5d %d %6.2f %6.0f %6.0f %4d %5d %s" % (sys.argv[1], total, v["tasks"], v["elapsed_s"], v["swapout_mibs"], v["throughput_mibs"], v["peak_resident_bytes"] >> 20, v["peak_rss_bytes"] >> 20, v["verified"]))
' "$dev"
      done
    done
  done
done
