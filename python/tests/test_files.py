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
