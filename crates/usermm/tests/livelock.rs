//! Issue 10: a fault that never resolves, and the page lost on the way to fixing it.
//!
//! 1. The kernel reports a resolving ioctl that stopped part way through its range
//!    (UFFDIO_MOVE/COPY/ZEROPAGE meeting a present, missing or busy page) as EAGAIN with the bytes
//!    it did; the real error is not reported. usermm used to take that EAGAIN at face value:
//!    re-issuing the whole range made its first page fail with EEXIST and the pages that *had*
//!    moved were forgotten. Reclaim's unmap of a run then left pages flagged mapped that sat in
//!    their pool slots, and every later fault on one was answered with a bare wake: the thread
//!    faulted again at once, forever (one run in eight of the 8-task random usemem).
//!    `partial_resolving_ioctls_never_strand_a_fault` makes every multi-page resolving ioctl
//!    partial (`sys::uffd::inject`), so that interleaving is deterministic. Before that fix it
//!    hung (the watchdog fails it).
//! 2. Linux 6.18's UFFDIO_MOVE under-reports: after an internal retry (a source pte changed
//!    under it, e.g. compaction migrating the page) it moves the next batch of pages without
//!    counting them and fails with EEXIST on the page it has just moved. usermm took such a
//!    page for a stray and dropped it, or dropped the pool slot it had just been moved into: the
//!    page read back as zeros (a `--swap file` run of the loop). `sys::uffd::move_pages`
//!    now counts pages that left the source and arrived at the destination.
//!    `unreported_moves_lose_no_page` injects exactly the kernel's report into every third
//!    MOVE; before the fix it fails verification. `kernel_move_undercount_under_compaction`
//!    (ignored: about a minute) reproduces the kernel's own behaviour with compaction.
//!
//! Both run the hanging workload's shape (8 threads, random page order, 16x the budget, every
//! word verified) plus sequential and read-before-write phases that produce runs of every kind
//! (fault-around, zero-page fault-around, swap readahead, reclaim's unmap runs).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use usermm_sys::uffd::inject;

const THREADS: usize = 8;
const BUDGET: u64 = 8 * MIB;
const REGION: usize = 16 << 20; // 8 x 16 MiB = 16x the budget

/// A deterministic permutation-free random page sequence (with replacement), like usemem's.
fn random_pages(seed: u64, pages: usize, n: usize) -> Vec<usize> {
    (0..n)
        .map(|i| (mix(seed ^ (i as u64).wrapping_mul(0x9e37)) % pages as u64) as usize)
        .collect()
}

/// The injections are process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the workload on a fresh manager and checks every word and the tripwire counters.
fn run_workload(what: &str) -> usermm::vmstat::Vmstat {
    let mm = Arc::new(mm_ram(BUDGET, 512 * MIB));
    let regions: Arc<Vec<_>> =
        Arc::new((0..THREADS).map(|_| mm.map_anon(REGION).unwrap()).collect());
    let pages = REGION / PAGE;
    let r2 = regions.clone();
    with_watchdog(240, what, move || {
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
    let v = mm.vmstat();
    assert!(
        v.val("pswpout") > 0 && v.val("pswpin") > 0,
        "the workload must swap"
    );
    for c in [
        "fault_refault_tripwire",
        "fault_stale_unmapped",
        "pool_slot_lost",
        "pgunmap_zapped",
        "mm_warn",
    ] {
        assert_eq!(v.val(c), 0, "{c} must stay zero:\n{v}");
    }
    assert_consistent(&mm);
    v
}

#[test]
fn partial_resolving_ioctls_never_strand_a_fault() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    inject::partial_results(1);
    let v = run_workload("8 threads under partial ioctl results");
    inject::partial_results(0);
    let injected = inject::injected();
    eprintln!(
        "partial results injected: {injected}; pswpin {} pswpout {} swap_ra {} fault_around_pages {}",
        v.val("pswpin"),
        v.val("pswpout"),
        v.val("swap_ra"),
        v.val("fault_around_pages")
    );
    assert!(
        injected > 1000,
        "the injection must have hit many runs: {injected}"
    );
}

#[test]
fn unreported_moves_lose_no_page() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    let before = inject::unreported();
    inject::unreported_moves(3);
    let v = run_workload("8 threads under under-reported moves");
    inject::unreported_moves(0);
    let injected = inject::unreported() - before;
    eprintln!(
        "moves under-reported: {injected}; pages recovered: {}; pswpin {} pswpout {}",
        v.val("uffd_move_unreported"),
        v.val("pswpin"),
        v.val("pswpout")
    );
    assert!(
        injected > 1000,
        "the injection must have hit many moves: {injected}"
    );
    assert!(
        v.val("uffd_move_unreported") >= injected,
        "every under-reported move recovers at least one page:\n{v}"
    );
}

/// The kernel's own under-report, provoked: UFFDIO_MOVE of 16-page runs while another thread
/// compacts memory (`/proc/sys/vm/compact_memory`, root), which migrates the source pages and
/// makes the kernel retry internally. On Linux 6.18 about one move in 20,000 moved pages it did
/// not report; every call must still report every page, with the data at the destination.
#[test]
#[ignore = "about a minute; root; run with --ignored to see the kernel's under-report"]
fn kernel_move_undercount_under_compaction() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use usermm_sys::uffd::{feature, mode, OpenPolicy, Uffd};
    use usermm_sys::Mapping;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let u = Uffd::open(feature::MOVE, OpenPolicy::Auto).expect("userfaultfd");
    assert!(u.has(feature::MOVE), "this kernel has no UFFDIO_MOVE");
    const N: usize = 16;
    let src = Mapping::anon(N * PAGE, 0).unwrap();
    let dst = Mapping::anon(N * PAGE, 0).unwrap();
    u.register(dst.addr(), dst.len(), mode::MISSING).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let compactor = std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/vm/compact_memory")
            .expect("compact_memory (root)");
        while !s2.load(Ordering::Relaxed) {
            f.write_all(b"1").expect("compact_memory");
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut moves = 0u64;
    while std::time::Instant::now() < deadline && u.move_unreported() < 3 * N as u64 {
        for p in 0..N {
            src.write_u64(p * PAGE, pattern(9, p as u64, moves));
        }
        let r = u.move_pages(dst.addr(), src.addr(), N * PAGE, false, true);
        assert_eq!(r, Ok(N * PAGE), "move {moves}");
        for p in 0..N {
            assert_eq!(
                dst.read_u64(p * PAGE),
                pattern(9, p as u64, moves),
                "move {moves} page {p}"
            );
        }
        dst.advise(0, N * PAGE, usermm_sys::Advice::DontNeed)
            .unwrap();
        moves += 1;
    }
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();
    eprintln!(
        "{moves} moves of {N} pages; pages the kernel moved without reporting them: {}",
        u.move_unreported()
    );
}
