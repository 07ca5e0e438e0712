"""Lifetime: a region lives exactly as long as something views it, and keeps its manager alive."""

import gc

import numpy as np

import usermm
from conftest import MiB, settles_at, thread_count


def released(mm):
    """True when no region of `mm` holds memory, swap or commit any more."""
    v = mm.vmstat()
    return (
        mm.resident_bytes == 0
        and mm.committed_bytes == 0
        and v["nr_anon_pages"] == 0
        and v["nr_swap_used"] == 0
        and v["nr_free_pages"] == mm.budget // 4096
    )


def test_array_outlives_its_manager_object():
    gc.collect()  # managers of earlier tests still referenced from tracebacks
    threads_before = thread_count()
    mm = usermm.Manager(budget="8M", swap="ram", swap_size="64M")
    a = mm.array(32 * MiB // 8, np.int64)  # 4x the budget
    assert thread_count() > threads_before  # handler threads and kswapd
    del mm
    gc.collect()
    # The manager keeps serving faults and swapping for the array.
    a[:] = np.int64(3)
    a[::1000] = np.arange(a[::1000].size)
    assert a[1:1000].sum() == 3 * 999
    assert a[::1000].sum() == np.arange(a[::1000].size).sum()
    mm2 = a.base.manager
    assert mm2.vmstat()["pswpout"] > 0 and mm2.peak_resident_bytes <= 8 * MiB
    del mm2
    # Views of views keep the region alive too.
    v = a[100:200]
    del a
    gc.collect()
    assert (v == 3).all()
    v[:] = 5
    assert v.sum() == 500
    # The last view gone, the region and then the manager go: its threads stop.
    del v
    gc.collect()
    assert settles_at(threads_before)


def test_deleting_the_array_releases_its_region():
    mm = usermm.Manager(budget="8M", swap="ram", swap_size="64M")
    a = mm.array(32 * MiB, np.uint8)
    a[:] = 1
    v = mm.vmstat()
    assert v["nr_swap_used"] > 0 and mm.resident_bytes > 0
    assert mm.committed_bytes == 32 * MiB
    del a
    assert released(mm)  # synchronously, on the last reference
    assert mm.vmstat()["swap_slot_free"] > 0


def test_memoryview_keeps_the_region_alive():
    mm = usermm.Manager(budget="8M", swap="none")
    r = mm.map_anon(3 * 4096)
    m = memoryview(r)
    arr = np.frombuffer(r, np.uint8)
    del r
    gc.collect()
    m[5] = 42
    assert arr[5] == 42
    assert mm.committed_bytes == 3 * 4096
    del arr
    assert mm.committed_bytes == 3 * 4096  # m still holds it
    m.release()
    del m
    gc.collect()
    assert released(mm)


def test_region_of_a_deleted_manager_and_repeated_cycles():
    """Managers and regions made and dropped in a loop leave nothing behind."""
    gc.collect()  # managers of earlier tests still referenced from tracebacks
    threads_before = thread_count()
    for i in range(5):
        mm = usermm.Manager(budget="4M", swap="ram", swap_size="32M")
        a = mm.array(16 * MiB // 4, np.float32)
        a[:] = i
        assert a.sum() == i * a.size
        del mm, a
    gc.collect()
    assert settles_at(threads_before)
