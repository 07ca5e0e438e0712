#!/bin/bash
# The kernel's own swap on the numpy fill+sum workload: numpy_fill_sum.py in "plain" mode (plain
# numpy memory) inside a cgroup v1 memory limit equal to the budget, swap on zram. The approach
# of shared/measure/kernel-usemem.sh. Root only; sets up and tears down everything it creates.
#
# Usage: kernel_numpy.sh [LIMIT_MIB [SIZE_MIB]]   (defaults 256 and 4x the limit)
# Env:   PYTHON (default python3): an interpreter with numpy.
# Prints numpy_fill_sum.py's JSON line, then the cgroup's peak usage and zram's mm_stat.
set -u
limit=${1:-256}
size=${2:-$((4 * limit))}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
cg=/sys/fs/cgroup/memory/usermm_kernel_numpy
cleanup() {
  swapoff /dev/zram0 2>/dev/null
  [ -e /sys/block/zram0/reset ] && echo 1 > /sys/block/zram0/reset
  [ -d $cg ] && rmdir $cg 2>/dev/null
}
[ "$(id -u)" = 0 ] || { echo "kernel_numpy.sh: needs root (zram, swapon, cgroups)" >&2; exit 2; }
[ "$(wc -l < /proc/swaps)" -gt 1 ] && { echo "kernel_numpy.sh: swap already on; refusing" >&2; exit 2; }
[ -d /sys/fs/cgroup/memory ] || { echo "kernel_numpy.sh: no cgroup v1 memory controller" >&2; exit 2; }
[ -e /sys/block/zram0 ] || modprobe zram || { echo "kernel_numpy.sh: no zram" >&2; exit 2; }
trap cleanup EXIT
echo $(( (size + 512) << 20 )) > /sys/block/zram0/disksize && mkswap /dev/zram0 >/dev/null \
  && swapon /dev/zram0 || exit 2
mkdir -p $cg && echo $((limit << 20)) > $cg/memory.limit_in_bytes || exit 2
echo "zram0 $(cat /sys/block/zram0/comp_algorithm), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)" >&2
sh -c "echo \$\$ > $cg/cgroup.procs; exec $py $here/numpy_fill_sum.py plain --size ${size}M"
rc=$?
echo "cgroup max_usage_in_bytes $(cat $cg/memory.max_usage_in_bytes); zram mm_stat $(cat /sys/block/zram0/mm_stat)" >&2
exit $rc
