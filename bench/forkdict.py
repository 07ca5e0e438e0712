"""forkdict: a Python process whose data is its heap (a dict of 1.5M small strings, many times
a 64 MiB budget) forks 10 children that each verify a third of the dict and write to it; the
parent checks its own copy did not change. Prints the fork times in ms. Side by side:

    usermm run --budget 64M -- python3 bench/forkdict.py
    bash ../shared/measure/kernel-run.sh file 64 4096 -- python3 bench/forkdict.py
"""
import os
import time

d = {i: str(i * 7) for i in range(1_500_000)}
ts = []
for k in range(10):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        ok = all(d[i] == str(i * 7) for i in range(0, 1_500_000, 3))
        d[5] = "x"
        os._exit(0 if ok else 3)
    ts.append((time.perf_counter() - t0) * 1000)
    _, st = os.waitpid(pid, 0)
    assert st == 0, st
assert d[5] == "35"
print("forkdict ok", " ".join("%.1f" % t for t in ts))
