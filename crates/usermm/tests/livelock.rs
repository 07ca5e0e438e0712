//! Issue 10: a fault that never resolves. The kernel reports a resolving ioctl that stopped part
//! way through its range (UFFDIO_MOVE/COPY/ZEROPAGE meeting a present, missing or busy page) as
//! EAGAIN with the bytes it did; the real error is not reported. usermm used to take that EAGAIN
//! at face value: re-issuing the whole range made its first page fail with EEXIST and the pages
//! that *had* moved were forgotten. Reclaim's unmap of a run then left pages flagged mapped that
//! sat in their pool slots, and every later fault on one was answered with a bare wake: the
//! thread faulted again at once, forever (one run in eight of the 8-task random usemem).
//!
//! This test makes every multi-page resolving ioctl partial (`sys::uffd::inject`), which is what
//! the kernel does under contention, so the interleaving that hung is deterministic. It runs the
//! hanging workload's shape (8 threads, random page order, 16x the budget, every word verified)
//! plus sequential and read-before-write phases that produce runs of every kind (fault-around,
//! zero-page fault-around, swap readahead, reclaim's unmap runs). Before the fix it hangs (the
//! watchdog fails it); after it, every word verifies and the tripwire counters stay zero.

mod common;

use std::sync::Arc;

use common::*;
use usermm::sys::uffd::inject;

const THREADS: usize = 8;
const BUDGET: u64 = 8 * MIB;
const REGION: usize = 16 << 20; // 8 x 16 MiB = 16x the budget

/// A deterministic permutation-free random page sequence (with replacement), like usemem's.
fn random_pages(seed: u64, pages: usize, n: usize) -> Vec<usize> {
    (0..n)
        .map(|i| (mix(seed ^ (i as u64).wrapping_mul(0x9e37)) % pages as u64) as usize)
        .collect()
}

#[test]
fn partial_resolving_ioctls_never_strand_a_fault() {
    init_log();
    inject::partial_results(1);
    let mm = Arc::new(mm_ram(BUDGET, 512 * MIB));
    let regions: Arc<Vec<_>> =
        Arc::new((0..THREADS).map(|_| mm.map_anon(REGION).unwrap()).collect());
    let pages = REGION / PAGE;
    let r2 = regions.clone();
    with_watchdog(240, "8 threads under partial ioctl results", move || {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let regions = r2.clone();
                std::thread::spawn(move || {
                    let r = &regions[t];
                    // Read before write: zero-page fault-around runs, then writes over them.
                    for p in 0..pages / 4 {
                        assert_eq!(r.read_u64(p * PAGE), 0, "thread {t} page {p} untouched");
                    }
                    // Sequential write: growing write fault-around windows.
                    for p in 0..pages {
                        r.write_u64(p * PAGE + 8, pattern(1, p as u64, t as u64));
                    }
                    // Random writes (usemem --random), two passes.
                    let seq = random_pages(t as u64, pages, 2 * pages);
                    for &p in &seq {
                        r.write_u64(p * PAGE + 16, pattern(2, p as u64, t as u64));
                    }
                    // Sequential verification: swap readahead runs, reclaim unmapping runs.
                    for p in 0..pages {
                        assert_eq!(
                            r.read_u64(p * PAGE + 8),
                            pattern(1, p as u64, t as u64),
                            "thread {t} page {p} (sequential pass)"
                        );
                    }
                    // Random verification (usemem's read_back replays the generator).
                    for &p in &seq {
                        assert_eq!(
                            r.read_u64(p * PAGE + 16),
                            pattern(2, p as u64, t as u64),
                            "thread {t} page {p} (random pass)"
                        );
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("worker thread");
        }
    });
    inject::partial_results(0);
    let injected = inject::injected();
    let v = mm.vmstat();
    let get = |n: &str| v.get(n).unwrap_or_else(|| panic!("no counter {n}"));
    eprintln!(
        "partial results injected: {injected}; pswpin {} pswpout {} swap_ra {} fault_around_pages {}",
        get("pswpin"),
        get("pswpout"),
        get("swap_ra"),
        get("fault_around_pages")
    );
    assert!(
        injected > 1000,
        "the injection must have hit many runs: {injected}"
    );
    assert!(
        get("pswpout") > 0 && get("pswpin") > 0,
        "the workload must swap"
    );
    for c in [
        "fault_refault_tripwire",
        "fault_stale_unmapped",
        "pool_slot_lost",
        "pgunmap_zapped",
    ] {
        assert_eq!(get(c), 0, "{c} must stay zero:\n{v}");
    }
    assert_consistent(&mm);
}
