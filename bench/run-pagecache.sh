#!/bin/bash
# Page-cache benchmarks of issue 5, usermm and the kernel alternately on this machine.
# Usage: bench/run-pagecache.sh [RUNS]   (root: mounts a tmpfs and a memory cgroup; cleans up)
#  1. dd of 1 GiB, budget 256M: file async / file fsync / in-memory, against plain
#     `dd if=/dev/zero of=FILE bs=1M count=1024 [conv=fsync]` (file on $DIR, tmpfs for memory);
#  2. shared file mapping, 4 GiB, budget 512M: `usermm bench mmap-file` against bench/mmapseq.c
#     (kernel mmap) under a cgroup v1 memory limit of 512 MiB.
set -u
runs=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/../target/release/usermm
DIR=${DIR:-/var/tmp}
mnt=$(mktemp -d); cg=/sys/fs/cgroup/memory/usermm_pagecache_bench
cleanup() { umount "$mnt" 2>/dev/null; rmdir "$mnt" "$cg" 2>/dev/null; rm -f "$DIR/kdd.bin"; }
trap cleanup EXIT
mount -t tmpfs -o size=2g none "$mnt" || exit 2
gcc -O2 -o /tmp/usermm-mmapseq "$here/mmapseq.c" || exit 2
mkdir -p $cg && echo $((512 << 20)) > $cg/memory.limit_in_bytes || exit 2
kdd() { dd if=/dev/zero of="$1" bs=1M count=1024 ${2:-} 2>&1 | awk '/copied/ {print $(NF-1), $NF}'; rm -f "$1"; }
for i in $(seq $runs); do
  echo "== run $i"
  echo "dd file async : usermm $($bin bench dd --budget 256M --count 1024 --iterations 1 --dir $DIR 2>/dev/null | grep -o 'throughput [0-9]* MiB/s')  kernel $(kdd $DIR/kdd.bin)"
  echo "dd file fsync : usermm $($bin bench dd --budget 256M --count 1024 --iterations 1 --fdatasync --dir $DIR 2>/dev/null | grep -o 'throughput [0-9]* MiB/s')  kernel $(kdd $DIR/kdd.bin conv=fsync)"
  echo "dd in memory  : usermm $($bin bench dd --budget 256M --swap ram --swap-size 2G --count 1024 --iterations 1 --memory 2>/dev/null | grep -o 'throughput [0-9]* MiB/s')  kernel tmpfs $(kdd $mnt/kdd.bin)"
  echo "mmap 4G/512M  : usermm $($bin bench mmap-file --budget 512M --size 4G --dir $DIR 2>/dev/null | head -1 | grep -o 'write.*read [0-9]* MiB/s')  kernel $(sh -c "echo \$\$ > $cg/cgroup.procs; exec /tmp/usermm-mmapseq $DIR/kmmap.bin 4096")"
done
