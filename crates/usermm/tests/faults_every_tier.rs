//! Faults injected on every swap tier (issue 16 part 2): the fault-injecting device wraps each
//! tier a manager can use (RAM, a file, zswap over RAM, zswap over a file, a live Redis Cluster
//! from tests/redis_fixture) and, for zswap, also sits below it (the compressed pool's
//! writeback and swap-in from the lower device fail).
//!
//! For every tier: write errors, short writes and ENOSPC in the middle of a run lose nothing
//! (the pages stay resident and dirty and are written again later); read errors and short
//! reads poison exactly the page whose data could not be read (kernel-mode reads see EFAULT,
//! the rest of the region is intact and the loss is counted); slow reads under 64 faulting
//! threads finish with every word right and no fault left outstanding. The Redis Cluster tier
//! also gets real node failures in tests/redis.rs (a failover, every node killed).

mod common;
mod redis_fixture;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use usermm::swap::faulty::FailMode;
use usermm::swap::{
    Compressor, FaultySwap, FileSwap, RamSwap, RedisConfig, RedisSwap, SwapDevice, Zswap,
};
use usermm::{Error, Mm, MmConfig, Region, SwapConfig};
use usermm_sys::kernel_read_u64;
use usermm_sys::uffd::OpenPolicy;

const SWAP: u64 = 64 * MIB;
const BUDGET: u64 = 4 * MIB;
const PAGES: usize = 2048; // 8 MiB: twice the budget

type Tier = (&'static str, Arc<FaultySwap>, Arc<dyn SwapDevice>);

/// Every tier, by name, freshly made: `faulty` wraps the whole of it, and for the `zswap+faulty`
/// chains the fault injector sits below the compressed pool (whose 256 KiB pool overflows at
/// once, so pages are written back through it). The Redis Cluster tier runs on a cluster
/// started here (returned: it stops when dropped); without redis-server it is a skip, which
/// fails under USERMM_TEST_STRICT (CI).
fn tiers() -> (Option<redis_fixture::Cluster>, Vec<Tier>) {
    let ram = || Arc::new(RamSwap::new(SWAP).unwrap()) as Arc<dyn SwapDevice>;
    let file = || Arc::new(FileSwap::open(None, SWAP).unwrap()) as Arc<dyn SwapDevice>;
    let zswap = |lower: Arc<dyn SwapDevice>| {
        Arc::new(Zswap::new(lower, Compressor::Lz4, 256 << 10)) as Arc<dyn SwapDevice>
    };
    let mut v: Vec<Tier> = Vec::new();
    for (name, dev) in [
        ("faulty(ram)", ram()),
        ("faulty(file)", file()),
        ("faulty(zswap+ram)", zswap(ram())),
        ("faulty(zswap+file)", zswap(file())),
    ] {
        let f = Arc::new(FaultySwap::new(dev));
        v.push((name, f.clone(), f as Arc<dyn SwapDevice>));
    }
    for (name, lower) in [("zswap+faulty(ram)", ram()), ("zswap+faulty(file)", file())] {
        let f = Arc::new(FaultySwap::new(lower));
        v.push((name, f.clone(), zswap(f)));
    }
    if !redis_fixture::available() {
        skip("redis-server/redis-cli not installed: the Redis tier is not tested");
        return (None, v);
    }
    let cluster = redis_fixture::Cluster::start();
    let mut cfg = RedisConfig::parse(&cluster.spec(true), SWAP).unwrap();
    cfg.password = Some(redis_fixture::PASSWORD.into());
    let redis = Arc::new(RedisSwap::open(&cfg).unwrap()) as Arc<dyn SwapDevice>;
    let f = Arc::new(FaultySwap::new(redis));
    v.push(("faulty(redis)", f.clone(), f as Arc<dyn SwapDevice>));
    (Some(cluster), v)
}

fn manager(dev: &Arc<dyn SwapDevice>, policy: OpenPolicy) -> usermm::Result<Mm> {
    let mut cfg = MmConfig::new(BUDGET).swap(SwapConfig::Device(dev.clone()));
    cfg.uffd_policy = policy;
    Mm::new(cfg)
}

/// Fills page `p` with data that compresses about 2:1 (half random words, half a repeated
/// word), so that zswap stores it compressed rather than same-filled or rejected.
fn fill(r: &Region, tag: u64, p: usize) {
    for w in 0..512u64 {
        let v = if w % 2 == 0 {
            pattern(tag, p as u64, w)
        } else {
            tag
        };
        r.write_u64(p * PAGE + w as usize * 8, v);
    }
}

fn check(r: &Region, tag: u64, p: usize, what: &str) {
    for w in [0u64, 1, 2, 255, 510, 511] {
        let want = if w % 2 == 0 {
            pattern(tag, p as u64, w)
        } else {
            tag
        };
        assert_eq!(
            r.read_u64(p * PAGE + w as usize * 8),
            want,
            "{what}: page {p} word {w}"
        );
    }
}

#[test]
fn write_errors_short_writes_and_enospc_lose_nothing_on_every_tier() {
    init_log();
    let (_cluster, tiers) = tiers();
    for (name, f, dev) in tiers {
        with_watchdog(120, name, move || {
            let mm = manager(&dev, OpenPolicy::Auto).unwrap();
            // Every third write fails; failing writes put half their pages on the device
            // first (a short write), and report ENOSPC (the device filled up mid-run).
            f.set_short_io(true);
            f.set_errno(libc::ENOSPC);
            f.set_write_mode(FailMode::EveryNth(3));
            let r = mm.map_anon(PAGES * PAGE).unwrap();
            for p in 0..PAGES {
                fill(&r, 11, p);
            }
            for round in 0..2 {
                for p in 0..PAGES {
                    check(&r, 11, p, &format!("{name} round {round}"));
                }
                // Dirty half of the pages again so that the next round writes them again.
                for p in (0..PAGES).step_by(2) {
                    fill(&r, 11, p);
                }
                mm.reclaim_to(0);
            }
            settle(&mm);
            let vm = mm.vmstat();
            assert!(
                f.injected_write_failures() > 0,
                "{name}: nothing injected\n{vm}"
            );
            assert_eq!(vm.val("oom_poison"), 0, "{name}\n{vm}");
            assert_eq!(vm.val("swap_read_error"), 0, "{name}\n{vm}");
            assert!(mm.peak_resident_bytes() <= BUDGET, "{name}");
            assert_consistent(&mm);
        });
    }
}

#[test]
fn read_errors_and_short_reads_poison_only_the_page_on_every_tier() {
    init_log();
    let (_cluster, tiers) = tiers();
    for (name, f, dev) in tiers {
        with_watchdog(120, name, move || {
            let mm = match manager(&dev, OpenPolicy::Full) {
                Ok(m) => m,
                Err(e @ Error::Userfaultfd(_)) => {
                    skip(&format!("no full-mode userfaultfd here ({e})"));
                    return;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let r = mm.map_anon(PAGES * PAGE).unwrap();
            for p in 0..PAGES {
                fill(&r, 12, p);
            }
            reclaim_all(&mm);
            let before = mm.vmstat();
            let base = r.as_ptr() as usize;
            f.set_short_io(true);
            f.set_read_mode(FailMode::AfterN(5));
            let mut lost = None;
            for p in 0..PAGES {
                match kernel_read_u64(base + p * PAGE) {
                    Ok(v) => assert_eq!(v, pattern(12, p as u64, 0), "{name}: page {p}"),
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                        lost = Some(p);
                        break;
                    }
                    Err(e) => panic!("{name}: kernel read of page {p}: {e}"),
                }
            }
            f.set_read_mode(FailMode::Never);
            settle(&mm);
            let d = mm.vmstat().delta(&before);
            let lost = lost.unwrap_or_else(|| {
                panic!("{name}: no read failed though the device fails reads after 5 ops\n{d}")
            });
            assert!(d.val("swap_read_error") >= 1, "{name}\n{d}");
            // The lost page stays lost; every other page is intact.
            let e = kernel_read_u64(base + lost * PAGE + 8).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{name}: page {lost}");
            for p in (0..PAGES).filter(|&p| p != lost) {
                check(&r, 12, p, &format!("{name} (lost page {lost})"));
            }
            assert_consistent(&mm);
        });
    }
}

#[test]
fn slow_reads_under_64_faulting_threads_on_every_tier() {
    init_log();
    const THREADS: usize = 64;
    let (_cluster, tiers) = tiers();
    for (name, f, dev) in tiers {
        with_watchdog(180, name, move || {
            let mm = manager(&dev, OpenPolicy::Auto).unwrap();
            let r = Arc::new(mm.map_anon(PAGES * PAGE).unwrap());
            for p in 0..PAGES {
                fill(&r, 13, p);
            }
            reclaim_all(&mm);
            // A device that stalls: every read sleeps 2 ms first.
            f.set_read_delay(Duration::from_millis(2));
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let r = r.clone();
                    std::thread::spawn(move || {
                        for p in (t..PAGES).step_by(THREADS) {
                            check(&r, 13, p, &format!("{name} thread {t}"));
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("a faulting thread failed");
            }
            f.set_read_delay(Duration::ZERO);
            let h = mm.health();
            assert!(h.stuck_faults.is_empty(), "{name}: {h:?}");
            assert_eq!(h.handler_panics, 0, "{name}: {h:?}");
            assert_eq!(mm.vmstat().val("swap_read_error"), 0, "{name}");
            assert_consistent(&mm);
        });
    }
}
