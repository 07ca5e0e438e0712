"""Arrays: dtypes, shapes, contents, the Region buffer, discard, file I/O, bad input."""

import os

import numpy as np
import pytest

import usermm
from conftest import MiB

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    np.longdouble,
    "S7",
    "U3",
    "V5",
    "datetime64[ns]",
    "timedelta64[s]",
    ">i4",
    np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")]),
    np.dtype([("x", "<u2"), ("y", "<f4")], align=True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(np.dtype(d)))
def test_dtypes_zero_filled_writable_contiguous(small_mm, dtype):
    shape = (37, 5)
    a = small_mm.array(shape, dtype)
    dt = np.dtype(dtype)
    assert a.shape == shape and a.dtype == dt
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    assert isinstance(a.base, usermm.Region)
    assert a.base.nbytes == a.nbytes == 37 * 5 * dt.itemsize
    assert a.tobytes() == bytes(a.nbytes)  # zero-filled
    # Bytes written through the region's buffer are the array's bytes.
    pattern = (np.arange(a.nbytes, dtype=np.uint64) % 251).astype(np.uint8)
    np.frombuffer(a.base, np.uint8)[:] = pattern
    assert a.tobytes() == pattern.tobytes()
    if dt.kind in "biufc":
        a[...] = 1
        assert (a == 1).all() and np.array_equal(a, np.ones(shape, dt))


def test_default_dtype_and_shapes(small_mm):
    assert small_mm.array(3).dtype == np.float64
    assert small_mm.array(np.int64(4), "i2").shape == (4,)
    assert small_mm.array([2, np.uint8(3)], "i2").shape == (2, 3)
    scalar = small_mm.array((), "f8")
    assert scalar.shape == () and scalar[()] == 0
    scalar[()] = 2.5
    assert scalar[()] == 2.5
    for shape in [(0,), (3, 0, 2)]:
        empty = small_mm.array(shape, "f4")
        assert empty.shape == shape and empty.size == 0
    sub = small_mm.array(4, ("f8", (2, 3)))  # a subarray dtype adds its shape
    assert sub.shape == (4, 2, 3) and sub.dtype == np.float64


def test_array_is_a_region_of_its_manager(small_mm):
    before = small_mm.committed_bytes
    a = small_mm.array((1000, 1000), "u1")
    assert small_mm.committed_bytes - before == 1000 * 1000 + 4096 - (1000 * 1000) % 4096
    region = a.base
    assert region.address == a.ctypes.data and region.address % 4096 == 0
    assert region.manager.budget == small_mm.budget
    a[:] = 1
    assert small_mm.resident_bytes >= 1000 * 1000
    assert small_mm.vmstat()["pgfault"] > 0


@pytest.mark.parametrize(
    "shape, dtype, exc, words",
    [
        ((4, -1), "f8", usermm.InvalidArgumentError, ["dimension 1 is -1", ">= 0"]),
        (-5, "f8", usermm.InvalidArgumentError, ["dimension 0 is -5"]),
        ((2, "x"), "f8", usermm.InvalidArgumentError, ["dimension 1", "'x'", "ints"]),
        ((2, 1.5), "f8", usermm.InvalidArgumentError, ["dimension 1", "1.5"]),
        ("abc", "f8", usermm.InvalidArgumentError, ["dimension 0"]),
        (None, "f8", usermm.InvalidArgumentError, ["shape must be an int", "NoneType"]),
        (10, "float99", usermm.InvalidArgumentError, ["dtype 'float99'", "not a numpy data type"]),
        (10, object, usermm.InvalidArgumentError, ["Python object references"]),
        (10, [("a", "f8"), ("o", "O")], usermm.InvalidArgumentError, ["object"]),
        ((1 << 40, 1 << 40), "f8", usermm.InvalidArgumentError, ["larger than the address space"]),
    ],
)
def test_bad_array_arguments(small_mm, shape, dtype, exc, words):
    with pytest.raises(exc) as ei:
        small_mm.array(shape, dtype)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_region_buffer_protocol(small_mm):
    r = small_mm.map_anon(10000)
    assert isinstance(r, usermm.Region) and len(r) == r.nbytes == 10000
    m = memoryview(r)
    assert m.nbytes == 10000 and not m.readonly and m.format == "B" and m.ndim == 1
    assert m.c_contiguous and m.strides == (1,)
    m[9999] = 200
    assert np.frombuffer(r, np.uint8)[9999] == 200
    assert bytes(m[9990:]) == bytes(9) + b"\xc8"
    # Public constructor, same thing.
    r2 = usermm.Region(small_mm, 4096)
    assert memoryview(r2).tobytes() == bytes(4096)
    with pytest.raises(TypeError):
        usermm.Region("not a manager", 10)
    assert len(small_mm.map_anon("1M")) == 1 << 20
    with pytest.raises(usermm.InvalidArgumentError, match="nbytes=-1"):
        small_mm.map_anon(-1)
    with pytest.raises(usermm.InvalidArgumentError, match="nbytes: cannot parse size"):
        small_mm.map_anon("lots")


def test_discard(small_mm):
    a = small_mm.array(4 * 4096, "u1")
    a[:] = 9
    a.base.discard(4096, 8192)
    assert (a[:4096] == 9).all() and (a[4096:12288] == 0).all() and (a[12288:] == 9).all()
    assert small_mm.vmstat()["pgdiscard"] == 2
    a.base.discard()
    assert not a.any()
    with pytest.raises(usermm.InvalidArgumentError, match="not 4 KiB aligned"):
        a.base.discard(100, 4096)
    with pytest.raises(usermm.InvalidArgumentError, match="past the end"):
        a.base.discard(8 * 4096)
    with pytest.raises(usermm.InvalidArgumentError, match="offset=-4096"):
        a.base.discard(-4096)


def test_system_calls_on_swapped_out_memory(tmp_path):
    """tofile and readinto make the kernel read and write array pages that are swapped out."""
    small_mm = usermm.Manager(budget="16M", swap="file", swap_size="128M")
    n = 48 * MiB // 8  # 3x the 16 MiB budget
    a = small_mm.array(n, np.uint64)
    for i in range(0, n, 1 << 20):
        a[i : i + (1 << 20)] = np.arange(i, min(n, i + (1 << 20)), dtype=np.uint64)
    assert small_mm.vmstat()["pswpout"] > 0  # the head of the array is in swap now
    path = tmp_path / "data.bin"
    if small_mm.uffd_mode == "user_mode_only":
        # Documented limitation of the fallback: kernel accesses to non-resident pages fail.
        with pytest.raises(OSError):
            a.tofile(str(path))
        return
    a.tofile(str(path))  # write(2) from swapped-out pages
    assert os.path.getsize(path) == a.nbytes
    b = small_mm.array(n, np.uint64)
    a[:] = 0
    with open(path, "rb") as f:  # read(2) into untouched region pages, then swapped-out ones
        assert f.readinto(b.base) == b.nbytes
        f.seek(0)
        assert f.readinto(b.base) == b.nbytes
    for i in range(0, n, 1 << 20):
        chunk = np.arange(i, min(n, i + (1 << 20)), dtype=np.uint64)
        assert np.array_equal(b[i : i + (1 << 20)], chunk)
    assert small_mm.peak_resident_bytes <= small_mm.budget


def test_threads_work_on_one_array_concurrently():
    """numpy releases the GIL in ufunc loops: several threads fault on one array at once."""
    from concurrent.futures import ThreadPoolExecutor

    mm = usermm.Manager(budget="16M", swap="ram", swap_size="96M")
    n = 64 * MiB // 8  # 4x the budget
    a = mm.array(n, np.int64)
    parts = 8
    step = n // parts

    def work(k):
        s = a[k * step : (k + 1) * step]
        s[:] = k
        np.add(s, 10 * k, out=s)
        return int(s.sum())

    with ThreadPoolExecutor(4) as ex:
        sums = list(ex.map(work, range(parts)))
    assert sums == [11 * k * step for k in range(parts)]
    for k in range(parts):
        assert (a[k * step : (k + 1) * step] == 11 * k).all()
    assert mm.peak_resident_bytes <= mm.budget
