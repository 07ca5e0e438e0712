"""numpy work on a usermm array 4x the budget, checked against a reference computed in chunks
that fit in the budget. Prints one JSON object: the checks' results and the memory numbers
(usermm's peak resident bytes, the process's VmHWM and VmRSS before the work).

Run by test_big.py in a fresh process, so that VmHWM (the process's peak RSS) measures this
work only: python bigwork.py BUDGET SWAP
"""

import json
import sys

import numpy as np

import usermm

K = 2654435761  # odd, so i -> i*K mod 2**32 is a bijection on [0, 2**32)
KINV = pow(K, -1, 1 << 32)
MASK = (1 << 32) - 1
CHUNK = 1 << 18  # elements per reference chunk: 2 MiB of uint64


def pattern(lo, hi):
    """The known pattern: element i holds i*K mod 2**32 (distinct, pseudo-random order)."""
    i = np.arange(lo, hi, dtype=np.uint64)
    i *= np.uint64(K)
    i &= np.uint64(MASK)
    return i


def chunks(lo, hi):
    for c in range(lo, hi, CHUNK):
        yield c, min(hi, c + CHUNK)


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def main(budget, swap):
    rss_before = status("VmRSS")
    mm = usermm.Manager(budget=budget, swap=swap)
    n = 4 * mm.budget // 8
    a = mm.array(n, np.uint64)  # 4x the budget
    out = {"budget": mm.budget, "array_bytes": a.nbytes, "uffd_mode": mm.uffd_mode}

    # Fill with the pattern, a chunk at a time (as a program producing data would).
    for lo, hi in chunks(0, n):
        a[lo:hi] = pattern(lo, hi)

    # Whole-array reductions, against references summed chunk by chunk.
    ref_sum = sum(int(pattern(lo, hi).sum()) for lo, hi in chunks(0, n))
    out["sum_ok"] = int(a.sum()) == ref_sum

    # Whole-array in-place arithmetic, checked element by element.
    a *= np.uint64(3)
    out["arith_ok"] = all(
        np.array_equal(a[lo:hi], pattern(lo, hi) * np.uint64(3)) for lo, hi in chunks(0, n)
    )
    a //= np.uint64(3)

    # Sort a slice of half the budget, in place.
    s, m = n // 3, n // 8
    a[s : s + m].sort()
    # Exact check in chunks: strictly increasing means distinct values; their preimages under
    # the bijection all lie in [s, s+m); m distinct preimages in a range of m are all of it.
    increasing = True
    in_range = True
    prev = -1
    for lo, hi in chunks(s, s + m):
        c = a[lo:hi]
        increasing &= bool(c[0] > prev) and bool((c[1:] > c[:-1]).all())
        prev = int(c[-1])
        pre = (c * np.uint64(KINV)) & np.uint64(MASK)
        in_range &= bool(((pre >= s) & (pre < s + m)).all())
    out["sort_ok"] = increasing and in_range
    # The rest of the array is untouched.
    out["rest_ok"] = all(
        np.array_equal(a[lo:hi], pattern(lo, hi))
        for lo, hi in list(chunks(0, s)) + list(chunks(s + m, n))
    )

    v = mm.vmstat()
    out.update(
        pswpout=v["pswpout"],
        pswpin=v["pswpin"],
        peak_resident_bytes=mm.peak_resident_bytes,
        rss_before=rss_before,
        vm_hwm=status("VmHWM"),
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
