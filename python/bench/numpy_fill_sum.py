"""numpy fill + sum over one array, timed; the same workload on usermm memory or plain numpy.

    python numpy_fill_sum.py usermm --budget 256M --swap file [--size 1G]
    python numpy_fill_sum.py plain [--size 1G]     # plain numpy memory (run it in a cgroup)

The array is float64 of --size bytes (default 4x the budget). Phase 1 fills it
(ndarray.fill: a sequential write of every page), phase 2 sums it (a sequential read). Prints
one JSON line: MiB/s of each phase (array MiB / phase seconds), of both together (2 x array MiB
/ total seconds), the process's peak RSS (VmHWM) and, for usermm, the counters that moved.
"""

import argparse
import json
import time

import numpy as np

MiB = 1 << 20


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = s.strip().lower()
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["usermm", "plain"])
    ap.add_argument("--budget", default="256M", help="usermm budget (and the default size / 4)")
    ap.add_argument("--swap", default="file", help="usermm swap device: file, file:PATH or ram")
    ap.add_argument("--size", help="array size (default 4x the budget)")
    args = ap.parse_args()
    size = parse_size(args.size) if args.size else 4 * parse_size(args.budget)
    n = size // 8

    mm = None
    if args.mode == "usermm":
        import usermm

        mm = usermm.Manager(budget=args.budget, swap=args.swap)
        a = mm.array(n, np.float64)
        before = mm.vmstat()
    else:
        a = np.empty(n, np.float64)  # untouched: the kernel faults it in during the fill

    t0 = time.perf_counter()
    a.fill(1.0)
    t1 = time.perf_counter()
    total = a.sum()
    t2 = time.perf_counter()
    if total != float(n):
        raise SystemExit(f"wrong sum {total}, expected {n}")

    mib = a.nbytes / MiB
    out = {
        "mode": args.mode,
        "array_mib": mib,
        "fill_s": round(t1 - t0, 3),
        "sum_s": round(t2 - t1, 3),
        "fill_mib_s": round(mib / (t1 - t0), 1),
        "sum_mib_s": round(mib / (t2 - t1), 1),
        "fill_sum_mib_s": round(2 * mib / (t2 - t0), 1),
        "vm_hwm_mib": round(status("VmHWM") / MiB, 1),
    }
    if mm is not None:
        after = mm.vmstat()
        out.update(
            budget=mm.budget,
            swap=mm.swap,
            uffd_mode=mm.uffd_mode,
            peak_resident_mib=round(mm.peak_resident_bytes / MiB, 1),
            vmstat={
                k: after[k] - before[k]
                for k in after
                if not k.startswith("nr_") and after[k] != before[k]
            },
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
