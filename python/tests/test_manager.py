"""Manager construction, properties, settings, the default manager and every error path."""

import errno
import json

import pytest

import usermm
from conftest import MiB, run_python


def test_defaults():
    mm = usermm.Manager()
    assert mm.budget == 256 * MiB
    assert mm.swap_bytes == 1024 * MiB  # 4x the budget
    assert mm.swap.startswith("file")
    assert mm.commit_limit_bytes == mm.budget + mm.swap_bytes
    assert mm.committed_bytes == 0
    assert mm.resident_bytes == 0 and mm.peak_resident_bytes == 0
    assert mm.overcommit is False
    # Full-mode userfaultfd when allowed (root here), so system calls on the memory fault.
    assert mm.uffd_mode in ("dev_userfaultfd", "syscall_full", "user_mode_only")
    assert "budget=268435456" in repr(mm)


def test_sizes_as_str_and_int():
    mm = usermm.Manager(budget=32 * MiB, swap="ram", swap_size="96M")
    assert mm.budget == 32 * MiB and mm.swap_bytes == 96 * MiB and mm.swap.startswith("ram")
    mm = usermm.Manager(budget="1.5G", swap="none")
    assert mm.budget == 3 << 29 and mm.swap_bytes == 0 and mm.swap == "none"
    assert mm.commit_limit_bytes == mm.budget


def test_vmstat_is_a_dict_of_ints(small_mm):
    v = small_mm.vmstat()
    assert isinstance(v, dict)
    for name in ("pgfault", "pgmajfault", "pswpin", "pswpout", "nr_free_pages", "allocstall"):
        assert isinstance(v[name], int)
    assert v["nr_free_pages"] == 16 * MiB // 4096
    assert v["pgfault"] == 0


def test_settings_default_and_round_trip():
    names = [s["name"] for s in usermm.switches()]
    assert "accessed_init" in names and "laptop_mode_isolate" in names
    for s in usermm.switches():
        assert set(s) == {"name", "seed", "old", "new", "default", "what"}
        assert s["default"] in (s["old"], s["new"])
    mm = usermm.Manager(budget="8M", swap="none")
    st = mm.settings
    assert st["laptop_mode"] == "off"
    # Every switch starts at its default: the new behaviour, except lru_gen (off).
    assert {k: v for k, v in st.items() if k != "laptop_mode"} == {
        s["name"]: s["default"] for s in usermm.switches()
    }
    assert st["lru_gen"] == "off" and st["accessed_init"] == "nonatomic"
    # As a string (like USERMM_SET), with old/new or the descriptive values.
    mm = usermm.Manager(budget="8M", swap="none", settings="accessed_init=old,laptop_mode=on")
    assert mm.settings["accessed_init"] == "atomic"
    assert mm.settings["laptop_mode"] == "on"
    # As a dict, with a bool for laptop_mode; the settings dict round-trips.
    mm2 = usermm.Manager(
        budget="8M", swap="none", settings={"huge_zero_refcount": "global", "laptop_mode": True}
    )
    assert mm2.settings["huge_zero_refcount"] == "global" and mm2.settings["laptop_mode"] == "on"
    mm3 = usermm.Manager(budget="8M", swap="none", settings=mm2.settings)
    assert mm3.settings == mm2.settings


def test_exception_hierarchy():
    assert issubclass(usermm.InvalidArgumentError, usermm.Error)
    assert issubclass(usermm.InvalidArgumentError, ValueError)
    assert issubclass(usermm.CommitLimitError, MemoryError)
    assert issubclass(usermm.UserfaultfdError, OSError)
    assert issubclass(usermm.IoError, OSError)
    assert issubclass(usermm.Error, Exception)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"budget": "256Q"}, ["budget", "256Q", "suffix"]),
        ({"budget": ""}, ["budget", "cannot parse size"]),
        ({"budget": -1}, ["budget=-1", "between 0"]),
        ({"budget": True}, ["budget=True"]),
        ({"budget": 1.5}, ["budget must be a size", "float"]),
        ({"budget": "512k"}, ["below the minimum", "1 MiB"]),
        ({"budget": "8M", "swap_size": "lots"}, ["swap_size", "lots"]),
        ({"budget": "8M", "swap": "tape"}, ["swap", "tape", "file, file:PATH, ram, none", "zswap"]),
        ({"budget": "8M", "swap": "zswap:lz5+ram"}, ["swap", "lz5", "zstd"]),
        ({"budget": "8M", "swap": "zswap+tape"}, ["swap", '"tape"', "below zswap"]),
        ({"budget": "8M", "settings": "nosuch=old"}, ["settings", "nosuch", "accessed_init"]),
        ({"budget": "8M", "settings": "accessed_init=maybe"}, ["accessed_init", "atomic"]),
        ({"budget": "8M", "settings": "accessed_init"}, ["name=value"]),
        ({"budget": "8M", "settings": {"laptop_mode": 2.5}}, ["laptop_mode", "2.5"]),
        ({"budget": "8M", "settings": {1: "old"}}, ["key 1"]),
        ({"budget": "8M", "settings": 7}, ["settings must be", "int"]),
    ],
)
def test_bad_arguments_raise_invalid_argument(kwargs, words):
    with pytest.raises(usermm.InvalidArgumentError) as ei:
        usermm.Manager(**kwargs)
    msg = str(ei.value)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, usermm.Error)
    for w in words:
        assert w in msg, (w, msg)


def test_zswap_tier_round_trips_mixed_pages():
    import numpy as np  # a dependency of the package's array API; the other tests import it too
    mm = usermm.Manager(budget="8M", swap="zswap:pool=25%+ram", swap_size="64M")
    assert mm.swap.startswith("zswap(lz4, pool max 2097152 bytes)+ram"), mm.swap
    tiers = mm.swap_tiers()
    assert [t[0].split("(")[0].split(" ")[0] for t in tiers] == ["zswap", "ram"], tiers
    a = mm.array(4 << 20, dtype=np.uint64)  # 32 MiB through an 8 MiB budget
    pages = np.arange(a.size, dtype=np.uint64) // 512
    # Even pages same-filled, odd pages a compressible ramp.
    want = np.where(pages % 2 == 0, pages, np.arange(a.size, dtype=np.uint64) & 0xFF)
    a[:] = want
    assert np.array_equal(a, want)
    vm = mm.vmstat()
    assert vm["zswpout"] > 0 and vm["zswpin"] > 0 and vm["zswap_same_filled"] >= 0, vm
    assert tiers[0][1]["zswpout"] == 0 and mm.swap_tiers()[0][1]["zswpout"] == vm["zswpout"]


def test_commit_limit_raises_memory_error():
    mm = usermm.Manager(budget="16M", swap="ram", swap_size="16M")
    a = mm.array(24 * MiB, "u1")  # fits: 24 of 32 MiB
    with pytest.raises(usermm.CommitLimitError) as ei:
        mm.array(16 * MiB, "u1")
    assert isinstance(ei.value, MemoryError)
    msg = str(ei.value)
    assert "commit limit exceeded" in msg and "overcommit" in msg and "32.0 MiB" in msg
    assert mm.committed_bytes == 24 * MiB
    del a
    # With overcommit the same mapping is allowed (untouched pages cost nothing).
    mm = usermm.Manager(budget="16M", swap="ram", swap_size="16M", overcommit=True)
    b = mm.array(64 * MiB, "u1")
    assert mm.overcommit and b.sum() == 0


def test_swap_file_in_missing_directory_raises_oserror_with_errno():
    with pytest.raises(usermm.IoError) as ei:
        usermm.Manager(budget="8M", swap="file:/nonexistent-usermm-dir/swap")
    assert isinstance(ei.value, OSError)
    assert ei.value.errno == errno.ENOENT
    assert "swap" in str(ei.value)


def test_parse_size():
    assert usermm.parse_size("64k") == 65536
    assert usermm.parse_size("2GiB") == 2 << 30
    with pytest.raises(usermm.InvalidArgumentError, match="256Q"):
        usermm.parse_size("256Q")


def test_default_manager_from_environment():
    code = (
        "import json, usermm\n"
        "m = usermm.default()\n"
        "assert m is usermm.default()\n"
        "a = m.array(1000, 'i8'); a[:] = 7\n"
        "print(json.dumps({'budget': m.budget, 'swap': m.swap, 'swap_bytes': m.swap_bytes,\n"
        "  'settings': m.settings, 'overcommit': m.overcommit, 'sum': int(a.sum())}))\n"
    )
    r = run_python(
        code,
        env={
            "USERMM_BUDGET": "32M",
            "USERMM_SWAP": "ram",
            "USERMM_SWAP_SIZE": "48M",
            "USERMM_OVERCOMMIT": "1",
            "USERMM_SET": "laptop_mode=on,accessed_init=old",
        },
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["budget"] == 32 * MiB and out["swap"].startswith("ram") and out["swap_bytes"] == 48 * MiB
    assert out["overcommit"] is True
    assert out["settings"]["laptop_mode"] == "on"
    assert out["settings"]["accessed_init"] == "atomic"
    assert out["sum"] == 7000
    # Without variables: 256M and a swap file.
    r = run_python("import usermm; m = usermm.default(); print(m.budget, m.swap)")
    assert r.returncode == 0, r.stderr
    budget, swap = r.stdout.split(maxsplit=1)
    assert int(budget) == 256 * MiB and swap.startswith("file")


def test_default_manager_bad_environment_names_the_variable_and_retries():
    code = (
        "import os, usermm\n"
        "try:\n"
        "    usermm.default()\n"
        "except usermm.InvalidArgumentError as e:\n"
        "    print('ERR', e)\n"
        "os.environ['USERMM_BUDGET'] = '8M'\n"
        "print('OK', usermm.default().budget)\n"
    )
    r = run_python(code, env={"USERMM_BUDGET": "256Q"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ERR") and "USERMM_BUDGET" in lines[0] and "256Q" in lines[0]
    assert lines[1] == f"OK {8 * MiB}"
    r = run_python("import usermm; usermm.default()", env={"USERMM_SWAP": "tape"})
    assert r.returncode != 0
    assert "InvalidArgumentError" in r.stderr and "USERMM_SWAP" in r.stderr
    assert "tape" in r.stderr


def test_fault_path_sigbus_serves_faults_on_the_faulting_thread(tmp_path):
    """settings="fault_path=sigbus": a numpy array four times the budget is filled and summed
    with every fault served on the thread that touched the page (a SIGBUS handler, not a
    handler thread); a read(2) into pages that are not resident fails with EFAULT under this
    path (the documented cost), and works once the pages were touched."""
    import numpy as np

    mm = usermm.Manager(budget="8M", swap="ram", swap_size="64M", settings="fault_path=sigbus")
    a = mm.array(4 * 1024 * 1024, np.int64)  # 32 MiB
    a[:] = np.arange(a.size, dtype=np.int64) * 3
    assert int(a.sum()) == 3 * a.size * (a.size - 1) // 2
    vm = mm.vmstat()
    assert vm["fault_self_served"] > 0 and vm["pswpout"] > 0, vm
    assert vm["handler_spin_hit"] == 0, vm  # no fault message ever reached a handler thread
    p = tmp_path / "data"
    p.write_bytes(b"y" * 8192)
    b = mm.array(8192, np.uint8)
    with open(p, "rb", buffering=0) as f:
        with pytest.raises(OSError) as e:
            f.readinto(b)
        assert e.value.errno == errno.EFAULT
        b[:] = 0  # touched: resident now
        f.seek(0)
        assert f.readinto(b) == 8192
    assert bytes(b) == b"y" * 8192


def test_managers_in_a_group_share_one_budget(tmp_path):
    import numpy as np

    path = tmp_path / "group"
    usermm.create_group(path, "16M")
    a = usermm.Manager(budget="16M", swap="ram", swap_size="256M", group=path)
    b = usermm.Manager(budget="16M", swap="ram", swap_size="256M", group=str(path))
    x = a.array(8 << 20, dtype=np.int64)  # 64 MiB each
    y = b.array(8 << 20, dtype=np.int64)
    for k in range(2):
        x[:] = np.arange(x.size) * 3
        y[:] = np.arange(y.size) * 5
        # Both are swapped in and out: together they stay within the one 16 MiB budget.
        assert a.resident_bytes + b.resident_bytes <= 16 * MiB
    assert int(x.sum()) == 3 * (x.size * (x.size - 1) // 2)
    assert int(y.sum()) == 5 * (y.size * (y.size - 1) // 2)
    assert a.peak_resident_bytes <= 16 * MiB and b.peak_resident_bytes <= 16 * MiB
    assert a.vmstat()["pswpout"] > 0 and b.vmstat()["pswpout"] > 0
    # The file exists now: a second create names it.
    with pytest.raises(usermm.Error, match="group"):
        usermm.create_group(path, "16M")
    with pytest.raises(usermm.InvalidArgumentError, match="limit"):
        usermm.create_group(tmp_path / "other", "x")
