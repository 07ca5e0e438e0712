"""fork1g: how long os.fork() takes in a process holding 1 GiB of numpy array, most of it
swapped out under `usermm run --budget 64M` (issue 12's target: under 50 ms). Prints the 20
fork times in ms; the kernel's own fork of the same process (no usermm) takes ~0.4 ms.

    usermm run --budget 64M -- python3 bench/fork1g.py
"""
import os
import time

import numpy as np

n = (1 << 30) // 8
a = np.ones(n, dtype=np.int64)
a[::512] = np.arange(len(a[::512]))
time.sleep(2)
ts = []
for _ in range(20):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if a[512] == 1 else 3)
    ts.append((time.perf_counter() - t0) * 1000)
    _, st = os.waitpid(pid, 0)
    assert st == 0, st
print("fork ms", " ".join("%.1f" % t for t in ts))
