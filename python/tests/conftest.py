"""Shared helpers for the usermm pytest suite."""

import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def thread_count():
    """The number of threads of this process."""
    return len(os.listdir("/proc/self/task"))


def settles_at(expected, timeout=5.0):
    """True once thread_count() == expected. A joined thread can stay listed in /proc for a
    moment after pthread_join returns (it is woken before the task is released)."""
    deadline = time.monotonic() + timeout
    while thread_count() != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_python(code_or_script, *args, env=None, timeout=300):
    """Runs Python in a fresh process (clean VmHWM, clean default manager); returns the result."""
    cmd = [sys.executable]
    cmd += [code_or_script] if code_or_script.endswith(".py") else ["-c", code_or_script]
    full_env = dict(os.environ)
    for k in list(full_env):
        if k.startswith("USERMM_"):
            del full_env[k]
    full_env.update(env or {})
    return subprocess.run(
        cmd + [str(a) for a in args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def small_mm():
    """A 16 MiB manager with a 64 MiB RAM swap device."""
    import usermm

    return usermm.Manager(budget="16M", swap="ram", swap_size="64M")
