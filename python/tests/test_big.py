"""numpy work on an array 4x the budget (bigwork.py in a fresh process): fill with a known
pattern, sum, in-place arithmetic, sort a slice, each checked against a reference computed in
chunks within budget; usermm's peak resident memory within the budget and the process's peak
RSS within the budget plus a fixed overhead."""

import json
import os

import pytest

from conftest import HERE, MiB, run_python

# What the process may use beyond the memory it had before the manager existed and the budget:
# the reference chunks (2 MiB arrays and their temporaries), page descriptors (0.8% of the
# budget), bounce buffers, handler thread stacks, page tables. Measured: ~13 MiB.
FIXED_OVERHEAD = 32 * MiB


@pytest.mark.parametrize("budget, swap", [("64M", "file"), ("16M", "ram")])
def test_numpy_work_on_4x_budget(budget, swap):
    r = run_python(os.path.join(HERE, "bigwork.py"), budget, swap)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["array_bytes"] == 4 * out["budget"]
    for check in ("sum_ok", "arith_ok", "sort_ok", "rest_ok"):
        assert out[check] is True, (check, out)
    # The array really went through swap, and usermm kept to its budget.
    assert out["pswpout"] >= 3 * out["budget"] // 4096
    assert out["pswpin"] > 0
    assert 0 < out["peak_resident_bytes"] <= out["budget"]
    if swap == "file":
        # With the RAM device the process's RSS also holds the device; with the file it is the
        # budget plus a fixed overhead (the O_DIRECT swap file adds no page cache either).
        grown = out["vm_hwm"] - out["rss_before"]
        assert grown <= out["budget"] + FIXED_OVERHEAD, (grown / MiB, out)
