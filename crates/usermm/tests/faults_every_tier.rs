//! Faults injected on every swap tier (issue 16 part 2): the fault-injecting device wraps each
//! tier a manager can use (RAM, a file, zswap over RAM, zswap over a file, a live Redis Cluster
//! from tests/redis_fixture) and, for zswap, also sits below it (the compressed pool's
//! writeback and swap-in from the lower device fail).
//!
//! For every tier: write errors, short writes and ENOSPC in the middle of a run lose nothing
//! (the pages stay resident and dirty and are written again later); read errors and short
//! reads poison exactly the page whose data could not be read (kernel-mode reads see EFAULT,
//! a user-mode toucher gets SIGBUS, the rest of the region is intact and the loss is counted); a device whose every write fails
//! keeps the dirty pages resident (reclaim gives up on them, nothing hangs) until it works
//! again; slow writes and slow reads under 64 faulting threads finish with every word right and
//! no fault left outstanding. The Redis Cluster tier
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

/// The tiers by name: the fault injector wraps the whole tier (`faulty(...)`), or, for the
/// `zswap+faulty(...)` chains, sits below the compressed pool (whose 256 KiB pool overflows at
/// once, so pages are written back through it).
const LOCAL_TIERS: [&str; 6] = [
    "faulty(ram)",
    "faulty(file)",
    "faulty(zswap+ram)",
    "faulty(zswap+file)",
    "zswap+faulty(ram)",
    "zswap+faulty(file)",
];
const REDIS_TIER: &str = "faulty(redis)";

/// Tier `name` (one of [`LOCAL_TIERS`] or [`REDIS_TIER`]), freshly made; the Redis tier on the
/// cluster `redis` (a spec with its user).
fn tier(name: &'static str, redis: Option<&str>) -> Tier {
    let ram = || Arc::new(RamSwap::new(SWAP).unwrap()) as Arc<dyn SwapDevice>;
    let file = || Arc::new(FileSwap::open(None, SWAP).unwrap()) as Arc<dyn SwapDevice>;
    let zswap = |lower: Arc<dyn SwapDevice>| {
        Arc::new(Zswap::new(lower, Compressor::Lz4, 256 << 10)) as Arc<dyn SwapDevice>
    };
    let wrap = |dev: Arc<dyn SwapDevice>| {
        let f = Arc::new(FaultySwap::new(dev));
        (name, f.clone(), f as Arc<dyn SwapDevice>)
    };
    let below = |lower: Arc<dyn SwapDevice>| {
        let f = Arc::new(FaultySwap::new(lower));
        (name, f.clone(), zswap(f))
    };
    match name {
        "faulty(ram)" => wrap(ram()),
        "faulty(file)" => wrap(file()),
        "faulty(zswap+ram)" => wrap(zswap(ram())),
        "faulty(zswap+file)" => wrap(zswap(file())),
        "zswap+faulty(ram)" => below(ram()),
        "zswap+faulty(file)" => below(file()),
        "faulty(redis)" => {
            let spec = redis.expect("the Redis tier needs a cluster");
            let mut cfg = RedisConfig::parse(spec, SWAP).unwrap();
            cfg.password = Some(redis_fixture::PASSWORD.into());
            wrap(Arc::new(RedisSwap::open(&cfg).unwrap()))
        }
        other => panic!("no tier {other}"),
    }
}

/// Every tier, freshly made. The Redis Cluster tier runs on a cluster started here (returned:
/// it stops when dropped); without redis-server it is a skip, which fails under
/// USERMM_TEST_STRICT (CI).
fn tiers() -> (Option<redis_fixture::Cluster>, Vec<Tier>) {
    let mut v: Vec<Tier> = LOCAL_TIERS.iter().map(|n| tier(n, None)).collect();
    let Some(cluster) = cluster() else {
        return (None, v);
    };
    v.push(tier(REDIS_TIER, Some(&cluster.spec(true))));
    (Some(cluster), v)
}

/// A running Redis Cluster, or a skip (a failure under USERMM_TEST_STRICT) without
/// redis-server.
fn cluster() -> Option<redis_fixture::Cluster> {
    if !redis_fixture::available() {
        skip("redis-server/redis-cli not installed: the Redis tier is not tested");
        return None;
    }
    Some(redis_fixture::Cluster::start())
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
            if top_is_faulty(name) {
                // Every injected failure reached the swap-out path, was counted and logged.
                assert_eq!(
                    vm.val("swap_write_error"),
                    f.injected_write_failures(),
                    "{name}\n{vm}"
                );
            }
            assert_eq!(vm.val("oom_poison"), 0, "{name}\n{vm}");
            assert_eq!(vm.val("swap_read_error"), 0, "{name}\n{vm}");
            assert!(mm.peak_resident_bytes() <= BUDGET, "{name}");

            // A device whose every write fails: dirty pages cannot leave. Reclaim gives up on
            // them (it does not hang), they stay resident with their data, and once the device
            // works again they are written and evicted like any others.
            f.set_write_mode(FailMode::Never);
            f.set_short_io(false);
            reclaim_all(&mm);
            const DIRTY: usize = 256; // 1 MiB: a quarter of the budget
            for p in 0..DIRTY {
                fill(&r, 21, p);
            }
            let failed = f.injected_write_failures();
            f.set_write_mode(FailMode::All);
            mm.reclaim_to(0);
            settle(&mm);
            let vm = mm.vmstat();
            assert!(
                f.injected_write_failures() > failed,
                "{name}: reclaim never tried to write the dirty pages\n{vm}"
            );
            // zswap above the failing device keeps what fits in its 256 KiB pool (about a
            // hundred of these pages); the rest, and all of them elsewhere, stay resident.
            assert!(
                mm.resident_bytes() >= (DIRTY / 2 * PAGE) as u64,
                "{name}: {} bytes resident after reclaim with every write failing: dirty pages \
                 were dropped\n{vm}",
                mm.resident_bytes()
            );
            f.set_write_mode(FailMode::Never);
            mm.reclaim_to(0);
            settle(&mm);
            assert!(
                mm.resident_bytes() <= (DIRTY / 8 * PAGE) as u64,
                "{name}: {} bytes still resident once writes work again",
                mm.resident_bytes()
            );
            for p in 0..PAGES {
                let tag = if p < DIRTY { 21 } else { 11 };
                check(&r, tag, p, &format!("{name} after every write failed"));
            }
            assert_eq!(mm.vmstat().val("oom_poison"), 0, "{name}");
            assert_consistent(&mm);
        });
    }
}

/// Whether the fault injector is the tier the manager writes to (not below a zswap pool, whose
/// own writeback meets the failures).
fn top_is_faulty(name: &str) -> bool {
    name.starts_with("faulty(")
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
fn slow_reads_and_writes_under_64_faulting_threads_on_every_tier() {
    init_log();
    const THREADS: usize = 64;
    let (_cluster, tiers) = tiers();
    for (name, f, dev) in tiers {
        with_watchdog(240, name, move || {
            let mm = manager(&dev, OpenPolicy::Auto).unwrap();
            let r = Arc::new(mm.map_anon(PAGES * PAGE).unwrap());
            // A device that stalls: every write, then also every read, sleeps 2 ms first.
            // Phase 0: 64 threads write twice the budget (reclaim writes to the slow device
            // while they fault); phase 1: they read it back from swap and write it again.
            f.set_write_delay(Duration::from_millis(2));
            for phase in 0..2u64 {
                if phase == 1 {
                    reclaim_all(&mm);
                    f.set_read_delay(Duration::from_millis(2));
                }
                let threads: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let r = r.clone();
                        std::thread::spawn(move || {
                            for p in (t..PAGES).step_by(THREADS) {
                                if phase == 1 {
                                    check(&r, 13, p, &format!("{name} thread {t}"));
                                }
                                fill(&r, 13 + phase, p);
                            }
                        })
                    })
                    .collect();
                for t in threads {
                    t.join().expect("a faulting thread failed");
                }
            }
            reclaim_all(&mm);
            for p in 0..PAGES {
                check(&r, 14, p, &format!("{name} after both phases"));
            }
            f.set_read_delay(Duration::ZERO);
            f.set_write_delay(Duration::ZERO);
            let h = mm.health();
            assert!(h.stuck_faults.is_empty(), "{name}: {h:?}");
            assert_eq!(h.handler_panics, 0, "{name}: {h:?}");
            let vm = mm.vmstat();
            assert_eq!(vm.val("swap_read_error"), 0, "{name}\n{vm}");
            assert_eq!(vm.val("swap_write_error"), 0, "{name}\n{vm}");
            assert!(
                vm.val("pswpout") >= PAGES as u64,
                "{name}: slow writes were not exercised\n{vm}"
            );
            assert!(mm.peak_resident_bytes() <= BUDGET, "{name}");
            assert_consistent(&mm);
        });
    }
}

/// A read error on swap-in raises SIGBUS in the thread that touched the page (a user-mode
/// access: nothing else can tell the program its data is gone), on every tier: each tier in a
/// child process (SIGBUS ends it) that swaps everything out, makes every read of the device
/// fail, and touches the pages from the last one down; the first page whose data must come
/// from the device kills it. A child that reads every page without a SIGBUS fails the test.
#[test]
fn a_read_error_raises_sigbus_in_the_toucher_on_every_tier() {
    const NAME: &str = "a_read_error_raises_sigbus_in_the_toucher_on_every_tier";
    if is_child(NAME) {
        let name = std::env::var("USERMM_TEST_TIER").expect("tier from the parent");
        let name = *LOCAL_TIERS
            .iter()
            .chain([&REDIS_TIER])
            .find(|n| **n == name)
            .expect("a known tier");
        let spec = std::env::var("USERMM_TEST_REDIS").ok();
        let (_, f, dev) = tier(name, spec.as_deref());
        let mm = manager(&dev, OpenPolicy::Auto).unwrap();
        let r = mm.map_anon(PAGES * PAGE).unwrap();
        for p in 0..PAGES {
            fill(&r, 15, p);
        }
        reclaim_all(&mm);
        f.set_read_mode(FailMode::All);
        eprintln!("CHILD {name}: reads now fail");
        for p in (0..PAGES).rev() {
            check(&r, 15, p, name);
        }
        eprintln!("CHILD {name}: every page read back though every device read fails: no SIGBUS");
        return;
    }
    let cluster = cluster();
    let spec = cluster.as_ref().map(|c| c.spec(true));
    let mut names: Vec<&str> = LOCAL_TIERS.to_vec();
    if spec.is_some() {
        names.push(REDIS_TIER);
    }
    for name in names {
        let mut env = vec![("USERMM_TEST_TIER", name)];
        if let Some(s) = &spec {
            env.push(("USERMM_TEST_REDIS", s.as_str()));
        }
        expect_child_sigbus_env(NAME, &format!("CHILD {name}: reads now fail"), &env);
    }
}
