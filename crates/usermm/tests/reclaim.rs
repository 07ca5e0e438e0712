//! Reclaim's promises as Linux makes them (`mm/vmscan.c`, `mm/page_alloc.c`): kswapd is woken
//! when free frames fall below the low watermark and reclaims until they reach high, then
//! sleeps; an allocation that would take free frames below min reclaims directly and counts an
//! `allocstall`. Checked on the counters and on the free count itself.

mod common;

use common::*;
use usermm::{Mm, MmConfig, SwapConfig, Watermarks};

const BUDGET: u64 = 32 * MIB; // 8192 frames

fn mm_with(w: Watermarks) -> Mm {
    Mm::new(
        MmConfig::new(BUDGET)
            .swap(SwapConfig::Ram { size: 256 * MIB })
            .watermarks(w),
    )
    .expect("manager")
}

/// One writer at a moderate pace. While free frames stay above low (the first 6656 pages of
/// 8192), kswapd never runs and nothing is reclaimed. Past that, kswapd alone keeps up: each
/// wake takes free frames from below low back to high (so it reclaims at least high - low
/// frames a wake on average, half that allowed for frames taken meanwhile), the writer never
/// stalls in direct reclaim, and free frames end between low and high plus one reclaim batch.
#[test]
fn kswapd_wakes_below_low_and_stops_at_high() {
    init_log();
    let w = Watermarks {
        min: 128,
        low: 1024,
        high: 2048,
    };
    let mm = mm_with(w);
    let r = mm.map_anon(128 << 20).unwrap();
    let pages = r.len() / PAGE;
    // Above low: 8192 frames - 1024 (low) - 512 (slack for a fault-around window).
    let quiet = (BUDGET as usize / PAGE) - w.low as usize - 512;
    let start = mm.vmstat();
    let write = |from: usize, to: usize| {
        for p in from..to {
            r.write_u64(p * PAGE, pattern(3, p as u64, 0));
            if p % 16 == 0 {
                // A pace kswapd can follow on two vCPUs shared with the test harness and
                // whatever else runs: 8k pages/s at most. (One 300 us pause per 256 pages
                // outran it: 35-71 allocstalls a run.)
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    };
    write(0, quiet);
    settle(&mm);
    let vm = mm.vmstat().delta(&start);
    assert!(
        vm.val("nr_free_pages") > w.low,
        "the first {quiet} pages took free frames below low\n{vm}"
    );
    for k in [
        "kswapd_wake",
        "pgscan_kswapd",
        "pgsteal_kswapd",
        "allocstall",
    ] {
        assert_eq!(
            vm.val(k),
            0,
            "{k} while free frames stayed above low ({})\n{vm}",
            vm.val("nr_free_pages")
        );
    }
    write(quiet, pages);
    settle(&mm);
    let vm = mm.vmstat().delta(&start);
    let free = vm.val("nr_free_pages");
    let (wakes, stolen) = (vm.val("kswapd_wake"), vm.val("pgsteal_kswapd"));
    eprintln!(
        "free {free} (low {}, high {}); kswapd woke {wakes} times, reclaimed {stolen}\n{vm}",
        w.low, w.high
    );
    assert!(wakes > 0, "kswapd never woke\n{vm}");
    assert!(stolen > 0, "{vm}");
    // Each wake reclaims from below low up to high, not just back above low.
    assert!(
        stolen / wakes >= (w.high - w.low) / 2,
        "kswapd reclaimed {} frames a wake on average: it stops short of high\n{vm}",
        stolen / wakes
    );
    assert_eq!(
        vm.val("allocstall"),
        0,
        "the writer stalled in direct reclaim although kswapd keeps up\n{vm}"
    );
    assert!(
        free >= w.low,
        "kswapd let free frames rest below low: {free}\n{vm}"
    );
    // It stops once high is reached: not far above it (a batch of 32 per list and a readahead
    // window of slack), never the whole budget.
    assert!(
        free <= w.high + 256,
        "kswapd reclaimed far past high: {free}\n{vm}"
    );
    for p in (0..pages).step_by(61) {
        assert_eq!(r.read_u64(p * PAGE), pattern(3, p as u64, 0), "page {p}");
    }
}

/// Low and high at min: kswapd only brings free frames back to min, so the writer keeps
/// finding them at min and reclaims for itself: `allocstall` and `pgsteal_direct` rise.
#[test]
fn direct_reclaim_raises_allocstall() {
    init_log();
    let w = Watermarks {
        min: 512,
        low: 512,
        high: 512,
    };
    let mm = mm_with(w);
    let r = mm.map_anon(64 << 20).unwrap();
    let pages = r.len() / PAGE;
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(4, p as u64, 0));
    }
    settle(&mm);
    let vm = mm.vmstat();
    assert!(vm.val("allocstall") > 0, "no direct reclaim\n{vm}");
    assert!(vm.val("pgsteal_direct") > 0, "{vm}");
    assert!(mm.peak_resident_bytes() <= BUDGET, "{vm}");
    for p in (0..pages).step_by(61) {
        assert_eq!(r.read_u64(p * PAGE), pattern(4, p as u64, 0), "page {p}");
    }
}

/// Eight threads writing pages in a scattered order, twice, at a budget a sixteenth of their
/// data, on swap `swap`; every page is checked afterwards. Returns the counters.
fn eight_scattered_writers(swap: SwapConfig) -> usermm::Vmstat {
    let mm = Mm::new(MmConfig::new(8 * MIB).swap(swap)).expect("manager");
    let regions: Vec<_> = (0..8).map(|_| mm.map_anon(16 << 20).unwrap()).collect();
    let pages = (16 << 20) / PAGE;
    std::thread::scope(|s| {
        for (t, r) in regions.iter().enumerate() {
            s.spawn(move || {
                for pass in 0..2u64 {
                    // A stride coprime with the page count visits every page once, scattered.
                    for k in 0..pages {
                        let p = (k * 1237 + t * 97) % pages;
                        r.write_u64(p * PAGE, pattern(t as u64, p as u64, pass));
                    }
                }
            });
        }
    });
    for (t, r) in regions.iter().enumerate() {
        for p in 0..pages {
            assert_eq!(
                r.read_u64(p * PAGE),
                pattern(t as u64, p as u64, 1),
                "thread {t} page {p}"
            );
        }
    }
    assert!(mm.peak_resident_bytes() <= 8 * MIB);
    mm.vmstat()
}

/// One reclaim pass runs at a time: a direct reclaimer that finds kswapd's pass running waits
/// for it (`pgscan_direct_throttle`) instead of scanning alongside, and nothing is lost.
#[test]
fn direct_reclaimers_wait_for_the_running_pass() {
    init_log();
    let vm = eight_scattered_writers(SwapConfig::Ram { size: 256 * MIB });
    assert!(
        vm.val("pgscan_direct_throttle") > 0,
        "no reclaimer waited\n{vm}"
    );
}

/// A handler waiting for a swap-file read hands the reading of the userfaultfd to a standby
/// reader when no other handler reads, so the other threads' faults do not queue behind it;
/// swap-ins from RAM wake none (their reads do not wait).
#[test]
fn handlers_waiting_for_the_disk_hand_reading_to_standby_readers() {
    init_log();
    let vm = eight_scattered_writers(SwapConfig::File {
        path: None,
        size: 256 * MIB,
    });
    assert!(vm.val("handler_standby_wake") > 0, "{vm}");
    let vm = eight_scattered_writers(SwapConfig::Ram { size: 256 * MIB });
    assert_eq!(vm.val("handler_standby_wake"), 0, "{vm}");
}

/// A hot half of the budget read over and over while a stream of new pages four times the
/// budget goes past it: reclaim keeps unmapping the hot pages to observe their next use, and
/// each of the next reads faults one back. With `ref_around=on` (the default) a reference
/// fault maps the parked pages next to its page with it (`pgreffault_around`), so the hot
/// reads take fewer reference faults than with `off`, and every page still holds its own data
/// (both ends of each page are checked, so a neighbour mapped at the wrong place would show).
#[test]
fn a_reference_fault_maps_its_parked_neighbours() {
    use usermm::{Behaviour, Settings, Switch};
    init_log();
    let run = |b: Behaviour| {
        let mm = Mm::new(
            MmConfig::new(BUDGET)
                .swap(SwapConfig::Ram { size: 256 * MIB })
                .settings(Settings::default().with(Switch::RefAround, b)),
        )
        .expect("manager");
        let hot = mm.map_anon(BUDGET as usize / 2).unwrap();
        let stream = mm.map_anon(4 * BUDGET as usize).unwrap();
        let (nh, ns) = (hot.len() / PAGE, stream.len() / PAGE);
        let last = PAGE - 8;
        for p in 0..nh {
            hot.write_u64(p * PAGE, pattern(9, p as u64, 0));
            hot.write_u64(p * PAGE + last, pattern(9, p as u64, 1));
        }
        let start = mm.vmstat();
        let mut h = 0;
        for q in 0..ns {
            stream.write_u64(q * PAGE, pattern(10, q as u64, 0));
            // Two hot pages read for every new page: the hot set goes round 8 times.
            for _ in 0..2 {
                assert_eq!(hot.read_u64(h * PAGE), pattern(9, h as u64, 0), "page {h}");
                assert_eq!(
                    hot.read_u64(h * PAGE + last),
                    pattern(9, h as u64, 1),
                    "page {h}, last word"
                );
                h = (h + 1) % nh;
            }
        }
        for q in (0..ns).step_by(7) {
            assert_eq!(
                stream.read_u64(q * PAGE),
                pattern(10, q as u64, 0),
                "new page {q}"
            );
        }
        assert!(mm.peak_resident_bytes() <= BUDGET);
        let health = mm.health();
        assert!(health.is_ok(), "{health:?}");
        mm.vmstat().delta(&start)
    };
    let off = run(Behaviour::Old);
    let on = run(Behaviour::New);
    eprintln!(
        "pgreffault / pgreffault_around / pgmajfault: off {} / {} / {}, on {} / {} / {}",
        off.val("pgreffault"),
        off.val("pgreffault_around"),
        off.val("pgmajfault"),
        on.val("pgreffault"),
        on.val("pgreffault_around"),
        on.val("pgmajfault")
    );
    assert_eq!(off.val("pgreffault_around"), 0, "ref_around=off\n{off}");
    assert!(
        off.val("pgreffault") > 0,
        "no reference fault at all\n{off}"
    );
    assert!(
        on.val("pgreffault_around") > 0,
        "no neighbour came with a reference fault\n{on}"
    );
    assert!(
        on.val("pgreffault") < off.val("pgreffault"),
        "reference faults: {} with ref_around=on, {} with off\non: {on}\noff: {off}",
        on.val("pgreffault"),
        off.val("pgreffault")
    );
}
