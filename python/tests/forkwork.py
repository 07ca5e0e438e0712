"""fork() scenarios for test_fork.py, each in a fresh process (so a hang is a timeout, not a
stuck test run): python forkwork.py CASE. Prints one line of results; exits 0 when the parent
side completed.

Cases:
  parent     the child exits at once; the parent then reads and rewrites its array (4x budget)
  use        the child tries to map and to discard through the parent's manager and region
  drop       the child drops its copies of the parent's manager and array
  read       the child reads the parent's array (must die of SIGSEGV, not read zeros)
  default    the child calls usermm.default()
"""

import gc
import os
import signal
import sys

import numpy as np

import usermm
from usermm import usermm as native  # the extension module itself (private names)

MiB = 1 << 20
CH = 1 << 18


def make():
    mm = usermm.Manager(budget="8M", swap="ram", swap_size="64M")
    a = mm.array(32 * MiB // 8, np.int64)  # 4x the budget
    for i in range(0, a.size, CH):
        a[i : i + CH] = np.arange(i, min(a.size, i + CH))
    assert mm.vmstat()["nr_swap_used"] > 0
    return mm, a


def intact(a, add=0):
    return all(
        np.array_equal(a[i : i + CH], np.arange(i, min(a.size, i + CH)) + add)
        for i in range(0, a.size, CH)
    )


def fork(child):
    """Runs child() in a fork child that exits with its return value; returns the wait status."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = child()
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def describe(status):
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def main(case):
    if case == "default":
        parent = usermm.default()

        def child():
            m = usermm.default()
            ok = m is not parent and m is usermm.default() and m.array(1000, "u1").sum() == 0
            return 0 if ok else 1

        st = fork(child)
        print(describe(st), usermm.default() is parent)
        return
    mm, a = make()
    marked = native._before_fork()  # what the at-fork hook marks: pool and region view
    if case == "parent":
        st = fork(lambda: 0)
    elif case == "use":

        def child():
            try:
                mm.array(10)
                return 1
            except usermm.Error as e:
                if "fork() child" not in str(e) or "spawn" not in str(e):
                    return 2
            try:
                a.base.discard()
                return 3
            except usermm.Error:
                return 0

        st = fork(child)
    elif case == "drop":
        holder = {"mm": mm, "a": a}
        del mm, a

        def child():
            holder.clear()  # the child's last references: Region and Manager drop here
            gc.collect()
            return 0

        st = fork(child)
        mm, a = holder["mm"], holder["a"]
    elif case == "read":
        st = fork(lambda: 0 if int(a[12345]) == 12345 and int(a[-1]) == a.size - 1 else 1)
    else:
        raise SystemExit(f"unknown case {case}")
    # The parent's manager keeps working: read everything back, rewrite, read again.
    ok = intact(a)
    a += 1
    ok = ok and intact(a, 1) and mm.peak_resident_bytes <= mm.budget
    print(describe(st), marked, "intact" if ok else "CORRUPT")


if __name__ == "__main__":
    main(sys.argv[1])
