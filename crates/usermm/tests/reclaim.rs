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

/// One writer at a moderate pace: kswapd alone keeps up. Free frames end between low and high
/// plus one reclaim batch, and the writer never stalled in direct reclaim.
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
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(3, p as u64, 0));
        if p % 256 == 0 {
            // A pace kswapd can follow on two vCPUs shared with the test harness.
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
    }
    settle(&mm);
    let vm = mm.vmstat();
    let free = vm.val("nr_free_pages");
    eprintln!("free {free} (low {}, high {})\n{vm}", w.low, w.high);
    assert!(vm.val("kswapd_wake") > 0, "kswapd never woke\n{vm}");
    assert!(vm.val("pgsteal_kswapd") > 0, "{vm}");
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
