"""fork(): the parent's manager keeps working, a child cannot use the parent's manager or read
its arrays (it crashes instead of reading swapped-out pages as zeros), and a child dropping
them leaves the parent's arrays intact. Each case runs forkwork.py in a fresh process with a
timeout, so that a stall fails the test instead of hanging the run."""

import os

import pytest

from conftest import HERE, run_python


def case(name, **kw):
    r = run_python(os.path.join(HERE, "forkwork.py"), name, timeout=120, **kw)
    assert r.returncode == 0, r.stderr
    if name == "read":
        # The child is told why before it dies: one line naming the address, the parent and
        # the way out (the SIGSEGV itself is unchanged).
        assert "usermm: SIGSEGV at 0x" in r.stderr, r.stderr
        assert "fork() child of pid " in r.stderr and '"spawn"' in r.stderr, r.stderr
    else:
        assert "usermm: SIGSEGV" not in r.stderr, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize(
    "name, child",
    [
        ("parent", ["exit", "0"]),
        ("use", ["exit", "0"]),
        ("drop", ["exit", "0"]),
        ("read", ["signal", "SIGSEGV"]),
    ],
)
def test_fork(name, child):
    out = case(name)
    assert out[:2] == child, out
    # Before the fork, the hook kept the frame pool and the region view out of the child.
    assert int(out[2]) >= 2, out
    assert out[3] == "intact", out


def test_child_gets_its_own_default_manager():
    out = case("default", env={"USERMM_BUDGET": "8M", "USERMM_SWAP": "ram"})
    assert out == ["exit", "0", "True"]
