//! No fault waits forever (issue 16 part 1): a handler that panics while serving a fault serves
//! it again (or poisons the page when it panics again), and a fault outstanding too long is
//! reported by the watchdog; `Mm::health` says so. The panics are injected process-wide
//! (`mm::handler::inject`), so the tests of this binary run one at a time.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use usermm::mm::handler::inject;
use usermm::swap::{FaultySwap, RamSwap};
use usermm::{Mm, MmConfig, SwapConfig};

static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_handler_panic_is_caught_and_the_fault_served_again() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    with_watchdog(120, "faults with injected handler panics", || {
        let mm = mm_ram(4 * MIB, 64 * MIB);
        let r = mm.map_anon(16 << 20).unwrap();
        let pages = r.len() / PAGE;
        assert!(mm.health().is_ok());
        for p in 0..pages / 2 {
            r.write_u64(p * PAGE, pattern(7, p as u64, 0));
        }
        // Three faults in the second half panic once each in the handler (a second panic on
        // the same fault would poison its page: the next test).
        for chunk in 0..3 {
            inject::handler_panics(1);
            let (from, to) = (
                pages / 2 + chunk * pages / 6,
                pages / 2 + (chunk + 1) * pages / 6,
            );
            for p in from..to {
                r.write_u64(p * PAGE, pattern(7, p as u64, 0));
            }
        }
        for p in 0..pages {
            assert_eq!(r.read_u64(p * PAGE), pattern(7, p as u64, 0), "page {p}");
        }
        inject::handler_panics(0);
        let h = mm.health();
        assert_eq!(h.handler_panics, 3, "{h:?}");
        assert!(!h.is_ok());
        assert_eq!(mm.vmstat().val("handler_panic"), 3);
        assert_consistent(&mm);
    });
}

/// Child: every fault panics, so the fault at the marked page is poisoned: SIGBUS, not a hang.
#[test]
fn a_handler_that_keeps_panicking_poisons_the_page() {
    const NAME: &str = "a_handler_that_keeps_panicking_poisons_the_page";
    if is_child(NAME) {
        let mm = mm_ram(4 * MIB, 64 * MIB);
        let r = mm.map_anon(1 << 20).unwrap();
        inject::handler_panics(u64::MAX);
        eprintln!("touching the page");
        r.write_u64(0, 1);
        eprintln!("the store went through: no SIGBUS");
        std::process::exit(0);
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    expect_child_sigbus(NAME, "touching the page");
    assert!(t0.elapsed() < Duration::from_secs(60));
}

#[test]
fn the_watchdog_reports_a_fault_outstanding_too_long() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    with_watchdog(120, "a fault on a stalling swap device", || {
        let dev = Arc::new(FaultySwap::new(Arc::new(RamSwap::new(64 << 20).unwrap())));
        let mm = Arc::new(
            Mm::new(MmConfig::new(4 * MIB).swap(SwapConfig::Device(dev.clone()))).unwrap(),
        );
        mm.set_stuck_fault_threshold(Duration::from_millis(300));
        let r = Arc::new(mm.map_anon(16 << 20).unwrap());
        let pages = r.len() / PAGE;
        for p in 0..pages {
            r.write_u64(p * PAGE, pattern(9, p as u64, 0));
        }
        // Everything is on swap now; the read of page 0 stalls in the device.
        assert!(reclaim_all(&mm) > 0);
        dev.set_read_delay(Duration::from_millis(2500));
        let r2 = r.clone();
        let reader = std::thread::spawn(move || r2.read_u64(0));
        // While the read waits on the device, the watchdog sees the fault.
        assert!(
            eventually(|| !mm.health().stuck_faults.is_empty()),
            "the stalled fault was never reported: {:?}",
            mm.health()
        );
        let h = mm.health();
        let addr = r.as_ptr() as usize;
        assert!(
            h.stuck_faults.iter().any(|s| s.addr & !(PAGE - 1) == addr),
            "{h:?} (region at {addr:#x})"
        );
        assert_eq!(reader.join().unwrap(), pattern(9, 0, 0));
        dev.set_read_delay(Duration::ZERO);
        assert!(mm.vmstat().val("fault_stuck") >= 1);
        assert!(eventually(|| mm.health().stuck_faults.is_empty()));
        assert_eq!(mm.health().handler_panics, 0);
    });
}

/// A manager with one handler thread over a RAM swap device, `pages` pages written with seed
/// `seed` and then all reclaimed to swap, so every access is a major fault.
fn swapped_out(seed: u64, len: usize) -> (Arc<Mm>, Arc<usermm::Region>) {
    let mm = Arc::new(
        Mm::new(
            MmConfig::new(4 * MIB)
                .swap(SwapConfig::Ram { size: 64 * MIB })
                .handler_threads(1),
        )
        .unwrap(),
    );
    let r = Arc::new(mm.map_anon(len).unwrap());
    for p in 0..len / PAGE {
        r.write_u64(p * PAGE, pattern(seed, p as u64, 0));
    }
    assert!(reclaim_all(&mm) > 0);
    (mm, r)
}

/// Part 1's "kill a handler thread": the only handler dies three times right after reading a
/// batch of faults (an injected panic outside the per-fault guard). The faults it held are
/// woken, their threads fault again, the restarted handler serves them, and the deaths are
/// counted and in `health()`. Without the wake the readers sleep for ever (the test watchdog
/// fails it).
#[test]
fn a_dead_handler_wakes_the_faults_it_held() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    with_watchdog(120, "faults while the handler thread dies", || {
        let (mm, r) = swapped_out(11, 8 << 20);
        let pages = r.len() / PAGE;
        inject::handler_deaths(3);
        let readers: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for p in (t..pages).step_by(4) {
                        assert_eq!(r.read_u64(p * PAGE), pattern(11, p as u64, 0), "page {p}");
                    }
                })
            })
            .collect();
        for t in readers {
            t.join().unwrap();
        }
        inject::handler_deaths(0);
        let h = mm.health();
        assert_eq!(h.handler_deaths, 3, "{h:?}");
        assert_eq!(mm.vmstat().val("handler_died"), 3);
        assert!(!h.is_ok());
        assert_eq!(h.handler_panics, 0, "{h:?}");
        assert_consistent(&mm);
    });
}

/// Faults that no handler reads (the only handler wedged for 4 s) are invisible to the handler
/// slots; the watchdog notices the userfaultfd staying readable with no reads, reads them,
/// reports each address and serves them itself, long before the handler comes back.
#[test]
fn faults_no_handler_reads_are_served_by_the_watchdog() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    init_log();
    with_watchdog(120, "faults while the handler is wedged", || {
        let (mm, r) = swapped_out(13, 4 << 20);
        mm.set_stuck_fault_threshold(Duration::from_millis(300));
        inject::handler_pause(4000);
        // The handler reaches its pause within one poll timeout (100 ms).
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let r2 = r.clone();
        let reader = std::thread::spawn(move || (r2.read_u64(0), t0.elapsed()));
        let (v, took) = reader.join().unwrap();
        inject::handler_pause(0);
        assert_eq!(v, pattern(13, 0, 0));
        assert!(
            took < Duration::from_millis(3000),
            "the fault waited {took:?}: served by the handler after its pause, not the watchdog"
        );
        let h = mm.health();
        assert!(h.unread_faults >= 1, "{h:?}");
        assert!(mm.vmstat().val("fault_unread") >= 1);
        assert!(!h.is_ok());
        // Everything else still reads back once the handler is back.
        for p in 0..r.len() / PAGE {
            assert_eq!(r.read_u64(p * PAGE), pattern(13, p as u64, 0), "page {p}");
        }
        assert_consistent(&mm);
    });
}
