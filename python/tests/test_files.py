"""File mappings through usermm's page cache: shared (stores reach the file after flush/sync),
private (copy-on-write), errors."""
import os

import numpy as np
import pytest

import usermm


def test_shared_file_mapping_reaches_the_file(tmp_path):
    path = tmp_path / "data.bin"
    n = 4 << 20
    path.write_bytes(b"\0" * (8 * n))
    mm = usermm.Manager(budget="8M", swap="ram", swap_size="32M")
    r = mm.map_file(str(path))
    assert r.nbytes == 8 * n
    a = np.frombuffer(r, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64)          # 32 MiB through an 8 MiB budget
    r.flush()
    mm.sync()
    back = np.fromfile(path, dtype=np.uint64)
    assert np.array_equal(back, np.arange(back.size, dtype=np.uint64))
    assert mm.peak_resident_bytes <= mm.budget
    assert mm.vmstat()["nr_written"] > 0


def test_private_file_mapping_is_copy_on_write(tmp_path):
    path = tmp_path / "p.bin"
    path.write_bytes(bytes(range(256)) * 64)
    mm = usermm.Manager(budget="4M", swap="ram", swap_size="16M")
    r = mm.map_file(str(path), 4096, offset=4096, shared=False)
    b = np.frombuffer(r, dtype=np.uint8)
    assert b[0] == 0 and b[1] == 1
    b[:] = 7
    r.flush()
    assert path.read_bytes()[4096] == 0, "the file is unchanged"


def test_file_mapping_errors_name_the_problem(tmp_path):
    mm = usermm.Manager(budget="4M", swap="none")
    with pytest.raises(usermm.Error, match="missing"):
        mm.map_file(str(tmp_path / "missing"), 4096)
    f = tmp_path / "f"
    f.write_bytes(b"x" * 8192)
    with pytest.raises(ValueError, match="4096"):
        mm.map_file(str(f), 4096, offset=100)
    with pytest.raises(ValueError, match="past the end"):
        mm.map_file(str(f), offset=8192)


def test_advise_random_sequential_willneed(tmp_path):
    """Region.advise: "random" makes faults read only their page, "willneed" reads a range in
    the background so its faults find it cached; bad advice and ranges are named."""
    path = tmp_path / "adv.bin"
    n = 16 << 20
    path.write_bytes(np.arange(n // 8, dtype=np.uint64).tobytes())
    mm = usermm.Manager(budget="4M", swap="ram", swap_size="16M")
    r = mm.map_file(str(path))
    a = np.frombuffer(r, dtype=np.uint64)
    assert r.access_pattern == "normal"
    r.advise("random")
    assert r.access_pattern == "random"
    before = mm.vmstat()["pgpgin"]
    pages = [(k * 2741) % (n // 4096) for k in range(100)]
    for p in pages:
        assert a[p * 512] == p * 512
    assert mm.vmstat()["pgpgin"] - before == 100 * 4, "one page read per random fault"
    r.advise("normal")
    r.advise("sequential")
    assert r.access_pattern == "sequential"
    start = mm.vmstat()["file_ra_async"]
    r.advise("willneed", 8 << 20, 1 << 20)
    import time
    deadline = time.time() + 10
    while mm.vmstat()["file_ra_async"] < start + 256 and time.time() < deadline:
        time.sleep(0.005)
    majors = mm.vmstat()["pgmajfault"]
    assert all(a[i] == i for i in range((8 << 20) // 8, (9 << 20) // 8, 512))
    assert mm.vmstat()["pgmajfault"] == majors, "willneed pages were cached"
    with pytest.raises(usermm.InvalidArgumentError, match="unknown"):
        r.advise("soon")
    with pytest.raises(usermm.InvalidArgumentError, match="whole region"):
        r.advise("random", 0, 4096)
    with pytest.raises(usermm.InvalidArgumentError, match="not 4 KiB aligned"):
        r.advise("willneed", 100, 4096)
    with pytest.raises(usermm.InvalidArgumentError, match="past the end"):
        r.advise("willneed", n + 4096)
