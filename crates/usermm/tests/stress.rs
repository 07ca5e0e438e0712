//! Many threads faulting at once, with a working set several times the budget: every thread
//! writes and verifies its own words in regions shared by all threads and in a private region.
//! Each test runs under a watchdog so that a deadlock fails with a message instead of hanging.

mod common;

use std::sync::Arc;

use common::*;
use usermm::Region;

const BUDGET: u64 = 8 * MIB;

/// Word `t` of each page belongs to thread `t` in the shared regions.
fn shared_off(page: usize, t: usize) -> usize {
    page * PAGE + t * 8
}

/// Private regions: 8 words per page, spread over the page.
fn private_off(page: usize, w: usize) -> usize {
    page * PAGE + w * 512
}

struct Setup {
    mm: usermm::Mm,
    shared: Vec<Region>,
    private: Vec<Region>,
}

fn setup(
    threads: usize,
    shared_mib: &[u64],
    private_each: usize,
    (lru_gen, sigbus): (bool, bool),
) -> Arc<Setup> {
    let mm = mm_ram_mode(BUDGET, 128 * MIB, lru_gen, sigbus);
    let shared = shared_mib
        .iter()
        .map(|&m| mm.map_anon((m * MIB) as usize).unwrap())
        .collect();
    let private = (0..threads)
        .map(|_| mm.map_anon(private_each).unwrap())
        .collect();
    Arc::new(Setup {
        mm,
        shared,
        private,
    })
}

/// One thread's pass over everything it owns: writes `tag`'s pattern (`write`) or checks it.
/// Threads start at different pages so that they fault on different pages at the same time.
fn pass(s: &Setup, t: usize, tag: u64, write: bool, stride: usize) {
    for (ri, r) in s.shared.iter().enumerate() {
        let pages = r.len() / PAGE;
        let start = (t * 97) % pages;
        for k in (0..pages).step_by(stride) {
            let p = (start + k) % pages;
            let v = pattern(tag ^ (ri as u64) << 32, p as u64, t as u64);
            if write {
                r.write_u64(shared_off(p, t), v);
            } else {
                let got = r.read_u64(shared_off(p, t));
                assert_eq!(
                    got, v,
                    "thread {t}: shared region {ri} page {p} (tag {tag})"
                );
            }
        }
    }
    let r = &s.private[t];
    let pages = r.len() / PAGE;
    for p in (0..pages).step_by(stride) {
        for w in 0..8 {
            let v = pattern(tag ^ 0xabc, (t * 100_000 + p) as u64, w as u64);
            if write {
                r.write_u64(private_off(p, w), v);
            } else {
                assert_eq!(
                    r.read_u64(private_off(p, w)),
                    v,
                    "thread {t}: private page {p} word {w} (tag {tag})"
                );
            }
        }
    }
}

/// What every run here ends with: the budget held, nothing poisoned, the manager consistent.
/// `swapped`: pages went out to swap and came back.
fn assert_clean_run(mm: &usermm::Mm, swapped: bool) {
    let vm = mm.vmstat();
    assert!(mm.peak_resident_bytes() <= BUDGET, "{vm}");
    if swapped {
        assert!(vm.val("pswpout") > 0 && vm.val("pswpin") > 0, "{vm}");
    }
    assert_eq!(vm.val("oom_poison"), 0, "{vm}");
    assert_consistent(mm);
}

fn run_threads(
    s: &Arc<Setup>,
    threads: usize,
    body: impl Fn(&Setup, usize, &AbortBarrier) + Send + Sync + 'static,
) {
    let body = Arc::new(body);
    let barrier = Arc::new(AbortBarrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (s, b, body) = (s.clone(), barrier.clone(), body.clone());
            std::thread::Builder::new()
                .name(format!("stress-{t}"))
                .spawn(move || {
                    let _g = b.guard();
                    body(&s, t, &b)
                })
                .unwrap()
        })
        .collect();
    let mut panics = Vec::new();
    for (t, h) in hs.into_iter().enumerate() {
        if let Err(p) = h.join() {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panics.push(format!("thread {t}: {}", msg.unwrap_or_default()));
        }
    }
    // Threads that only stopped because another failed say so; list the real failures.
    let real: Vec<&String> = panics
        .iter()
        .filter(|m| !m.ends_with("another thread failed"))
        .collect();
    assert!(
        panics.is_empty(),
        "{} threads failed ({} stopped early because of them):\n{}\n{}",
        real.len(),
        panics.len() - real.len(),
        real.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        s.mm.vmstat()
    );
}

/// 24 threads; 4 shared regions of 8 MiB (every page written by every thread) plus a 1.5 MiB
/// private region each: 68 MiB with an 8 MiB budget. Write once, verify twice.
/// Over both replacement policies (`lru_gen=off`, `on`) and both fault paths.
#[test]
fn many_threads_write_then_verify() {
    for mode in MODES {
        many_threads_write_then_verify_with(mode);
    }
}

fn many_threads_write_then_verify_with(mode: (bool, bool)) {
    init_log();
    const T: usize = 24;
    with_watchdog(
        120,
        "24 threads over 68 MiB with an 8 MiB budget",
        move || {
            let s = setup(T, &[8, 8, 8, 8], 1536 << 10, mode);
            run_threads(&s, T, |s, t, b| {
                b.wait();
                pass(s, t, 1, true, 1);
                b.wait();
                pass(s, t, 1, false, 1);
                b.wait();
                pass(s, t, 1, false, 3);
            });
            let vm = s.mm.vmstat();
            eprintln!("{vm}");
            assert_clean_run(&s.mm, true);
            assert_eq!(
                vm.val("swap_write_error") + vm.val("swap_read_error"),
                0,
                "{vm}"
            );
        },
    );
}

/// Like above but every round rewrites the data (pages that came back from swap are written
/// again), so stale swap copies would show up as old values.
/// Over both replacement policies (`lru_gen=off`, `on`) and both fault paths.
#[test]
fn many_threads_rewrite_rounds() {
    for mode in MODES {
        many_threads_rewrite_rounds_with(mode);
    }
}

fn many_threads_rewrite_rounds_with(mode: (bool, bool)) {
    init_log();
    const T: usize = 16;
    with_watchdog(
        120,
        "16 threads rewriting 40 MiB with an 8 MiB budget",
        move || {
            let s = setup(T, &[8, 8], 1536 << 10, mode);
            run_threads(&s, T, |s, t, b| {
                for round in 1..=3u64 {
                    b.wait();
                    pass(s, t, round, true, 1);
                    b.wait();
                    pass(s, t, round, false, 1);
                }
            });
            assert_clean_run(&s.mm, false);
        },
    );
}

/// 64 threads fault on one region at the same moment, each in its own slice: no deadlock, no
/// collapse, no lost data.
#[test]
fn sixty_four_threads_fault_at_once_on_one_region() {
    init_log();
    const T: usize = 64;
    with_watchdog(120, "64 threads faulting on one region", || {
        let mm = mm_ram(BUDGET, 64 * MIB);
        let r = Arc::new(mm.map_anon(32 * MIB as usize).unwrap());
        let slice = r.len() / PAGE / T; // 128 pages each
        let barrier = Arc::new(AbortBarrier::new(T));
        let hs: Vec<_> = (0..T)
            .map(|t| {
                let (r, b) = (r.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let _g = b.guard();
                    let first = t * slice;
                    for round in 0..3u64 {
                        b.wait();
                        for p in first..first + slice {
                            r.write_u64(p * PAGE + (p % 512) * 8, pattern(40 + round, p as u64, 0));
                        }
                        b.wait();
                        // Read back in reverse so that recently evicted pages are read first.
                        for p in (first..first + slice).rev() {
                            let got = r.read_u64(p * PAGE + (p % 512) * 8);
                            assert_eq!(
                                got,
                                pattern(40 + round, p as u64, 0),
                                "thread {t} round {round} page {p}"
                            );
                        }
                    }
                })
            })
            .collect();
        let failed: Vec<usize> = hs
            .into_iter()
            .enumerate()
            .filter_map(|(t, h)| h.join().is_err().then_some(t))
            .collect();
        let vm = mm.vmstat();
        assert!(failed.is_empty(), "threads {failed:?} failed\n{vm}");
        assert!(mm.peak_resident_bytes() <= BUDGET, "{vm}");
        assert!(vm.val("pswpout") > 0, "{vm}");
        assert_eq!(vm.val("oom_poison"), 0, "{vm}");
        assert_consistent(&mm);
    });
}

/// Threads read untouched memory, write it, discard it and write it again concurrently in a
/// shared region while others stream through their own: mixed fault types at once.
/// Over both replacement policies (`lru_gen=off`, `on`) and both fault paths.
#[test]
fn mixed_faults_with_concurrent_discard() {
    for mode in MODES {
        mixed_faults_with_concurrent_discard_with(mode);
    }
}

fn mixed_faults_with_concurrent_discard_with(mode: (bool, bool)) {
    init_log();
    const T: usize = 16;
    with_watchdog(120, "mixed faults with discard", move || {
        let mm = mm_ram_mode(BUDGET, 64 * MIB, mode.0, mode.1);
        let r = Arc::new(mm.map_anon(32 * MIB as usize).unwrap());
        let slice = r.len() / PAGE / T; // 512 pages each
        let barrier = Arc::new(AbortBarrier::new(T));
        let hs: Vec<_> = (0..T)
            .map(|t| {
                let (r, b) = (r.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let _g = b.guard();
                    let first = t * slice;
                    b.wait();
                    for p in first..first + slice {
                        assert_eq!(r.read_u64(p * PAGE), 0, "thread {t} page {p} untouched");
                    }
                    for p in first..first + slice {
                        r.write_u64(p * PAGE + 8, pattern(50, p as u64, 1));
                    }
                    // Discard the odd 16-page chunks of the slice.
                    for c in (0..slice / 16).filter(|c| c % 2 == 1) {
                        r.discard((first + c * 16) * PAGE, 16 * PAGE).unwrap();
                    }
                    for p in first..first + slice {
                        let chunk = (p - first) / 16;
                        let want = if chunk % 2 == 1 {
                            0
                        } else {
                            pattern(50, p as u64, 1)
                        };
                        assert_eq!(r.read_u64(p * PAGE + 8), want, "thread {t} page {p}");
                    }
                })
            })
            .collect();
        let failed: Vec<usize> = hs
            .into_iter()
            .enumerate()
            .filter_map(|(t, h)| h.join().is_err().then_some(t))
            .collect();
        let vm = mm.vmstat();
        assert!(failed.is_empty(), "threads {failed:?} failed\n{vm}");
        assert_clean_run(&mm, false);
    });
}

/// Focused form of the lost-write race: 4 threads rewrite their own 4 MiB region round after
/// round (budget 4 MiB, 4 handler threads). A read must always return the current round's
/// value, never the previous one.
#[test]
fn rewrites_by_a_few_threads_are_never_lost() {
    init_log();
    const T: usize = 4;
    const PAGES: usize = 1024;
    with_watchdog(120, "4 threads rewriting private regions", || {
        for attempt in 0..3 {
            let cfg = usermm::MmConfig::new(4 * MIB)
                .swap(usermm::SwapConfig::Ram { size: 64 * MIB })
                .handler_threads(4);
            let mm = usermm::Mm::new(cfg).unwrap();
            let regions: Vec<Arc<Region>> = (0..T)
                .map(|_| Arc::new(mm.map_anon(PAGES * PAGE).unwrap()))
                .collect();
            let hs: Vec<_> = regions
                .iter()
                .enumerate()
                .map(|(t, r)| {
                    let r = r.clone();
                    std::thread::spawn(move || -> Result<(), String> {
                        for round in 1..=6u64 {
                            for p in 0..PAGES {
                                r.write_u64(p * PAGE, pattern(round, p as u64, t as u64));
                            }
                            for p in 0..PAGES {
                                let got = r.read_u64(p * PAGE);
                                if got != pattern(round, p as u64, t as u64) {
                                    let was = (0..round).find(|&k| pattern(k, p as u64, t as u64) == got);
                                    return Err(format!(
                                        "thread {t} round {round} page {p}: read {got:#x}, the value of round {was:?}"
                                    ));
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            let errs: Vec<String> = hs
                .into_iter()
                .filter_map(|h| h.join().unwrap().err())
                .collect();
            assert!(
                errs.is_empty(),
                "attempt {attempt}: lost writes:\n{}\n{}",
                errs.join("\n"),
                mm.vmstat()
            );
        }
    });
}

/// Read-modify-write passes (each word read, then rewritten: the write fault-around over clean
/// swap-cache pages and the writable swap-ins of a write run) by 8 threads at once, each over
/// its own word of every page of two shared 8 MiB regions (so one thread's run unprotects pages
/// another is reading or writing) and over a private 2 MiB region, at a quarter of the data's
/// size. Every round's value must be read back: a lost write shows as the previous round's.
/// Over both replacement policies and both fault paths.
#[test]
fn read_modify_write_passes_by_many_threads() {
    for mode in MODES {
        read_modify_write_passes_with(mode);
    }
}

fn read_modify_write_passes_with(mode: (bool, bool)) {
    init_log();
    const T: usize = 8;
    with_watchdog(
        120,
        "8 threads read-modify-writing 34 MiB with an 8 MiB budget",
        move || {
            let s = setup(T, &[8, 8], 2 << 20, mode);
            run_threads(&s, T, |s, t, b| {
                b.wait();
                pass(s, t, 1, true, 1);
                for round in 1..=3u64 {
                    b.wait();
                    // The values `pass` writes and checks, round by round.
                    for (ri, r) in s.shared.iter().enumerate() {
                        let tag = |k: u64| k ^ (ri as u64) << 32;
                        let pages = r.len() / PAGE;
                        let start = t * pages / T;
                        for k in 0..pages {
                            let p = (start + k) % pages;
                            let off = shared_off(p, t);
                            let got = r.read_u64(off);
                            let want = pattern(tag(round), p as u64, t as u64);
                            assert_eq!(got, want, "thread {t} round {round} shared {ri} page {p}");
                            r.write_u64(off, pattern(tag(round + 1), p as u64, t as u64));
                        }
                    }
                    let r = &s.private[t];
                    for p in 0..r.len() / PAGE {
                        let q = (t * 100_000 + p) as u64;
                        for w in 0..8 {
                            let off = private_off(p, w);
                            let got = r.read_u64(off);
                            let want = pattern(round ^ 0xabc, q, w as u64);
                            assert_eq!(got, want, "thread {t} round {round} private page {p}");
                            r.write_u64(off, pattern((round + 1) ^ 0xabc, q, w as u64));
                        }
                    }
                }
                b.wait();
                pass(s, t, 4, false, 1);
            });
            eprintln!("{}", s.mm.vmstat());
            assert_clean_run(&s.mm, true);
        },
    );
}

/// 8 threads writing top down at once (the windows below the fault of a writer walking down),
/// each its own word of every page of two shared 8 MiB regions and its own private region,
/// with constant reclaim; then every word is checked. Both policies, both fault paths.
#[test]
fn descending_writers_by_many_threads() {
    for mode in MODES {
        init_log();
        const T: usize = 8;
        with_watchdog(
            120,
            "8 threads writing 32 MiB top down with an 8 MiB budget",
            move || {
                let s = setup(T, &[8, 8], 2 << 20, mode);
                run_threads(&s, T, |s, t, b| {
                    b.wait();
                    // The values `pass` checks, written from the last page down.
                    for (ri, r) in s.shared.iter().enumerate() {
                        for p in (0..r.len() / PAGE).rev() {
                            let v = pattern(5 ^ (ri as u64) << 32, p as u64, t as u64);
                            r.write_u64(shared_off(p, t), v);
                        }
                    }
                    let r = &s.private[t];
                    for p in (0..r.len() / PAGE).rev() {
                        for w in (0..8).rev() {
                            let v = pattern(5 ^ 0xabc, (t * 100_000 + p) as u64, w as u64);
                            r.write_u64(private_off(p, w), v);
                        }
                    }
                    b.wait();
                    pass(s, t, 5, false, 1);
                });
                assert_clean_run(&s.mm, true);
            },
        );
    }
}

/// The shape of issue 10's livelock reproduction (`usermm bench usemem --tasks 8 --random -j 4096
/// --repeat 2 --budget 64M 128M`), scaled to CI: 8 threads, each writing one word per page of its
/// own 16 MiB region in random page order (with replacement, two passes), then replaying the
/// generator to verify every word; 16x the budget. Repeated on RAM and file swap, each run under
/// a watchdog, with the tripwire counters (a fault answered without mapping its page) at zero.
#[test]
fn usemem_random_shape_repeated_without_a_stuck_fault() {
    init_log();
    const T: usize = 8;
    const REGION: usize = 16 << 20;
    let pages = REGION / PAGE;
    for (run, swap) in [
        (0u64, usermm::SwapConfig::Ram { size: 256 * MIB }),
        (
            1,
            usermm::SwapConfig::File {
                path: None,
                size: 256 * MIB,
            },
        ),
        (2, usermm::SwapConfig::Ram { size: 256 * MIB }),
        (
            3,
            usermm::SwapConfig::File {
                path: None,
                size: 256 * MIB,
            },
        ),
    ] {
        let what = format!("run {run}: 8 random writers at 16x the budget ({swap:?})");
        with_watchdog(120, &what.clone(), move || {
            let mm = Arc::new(
                usermm::Mm::new(usermm::MmConfig::new(BUDGET).swap(swap)).expect("manager"),
            );
            let hs: Vec<_> = (0..T)
                .map(|t| {
                    let r = mm.map_anon(REGION).unwrap();
                    std::thread::spawn(move || {
                        let seed = run * 1000 + t as u64;
                        let idx = |i: usize| (mix(seed ^ (i as u64) << 8) % pages as u64) as usize;
                        for i in 0..2 * pages {
                            let p = idx(i);
                            r.write_u64(p * PAGE, pattern(seed, p as u64, 0));
                        }
                        for i in 0..2 * pages {
                            let p = idx(i);
                            assert_eq!(
                                r.read_u64(p * PAGE),
                                pattern(seed, p as u64, 0),
                                "thread {t} page {p}"
                            );
                        }
                        r
                    })
                })
                .collect();
            let regions: Vec<_> = hs.into_iter().map(|h| h.join().expect("worker")).collect();
            let vm = mm.vmstat();
            assert!(vm.val("pswpout") > 0 && vm.val("pswpin") > 0, "{vm}");
            // Swap-ins into recycled frames copy the page and drop the slot in batches: the
            // batched path is what this test exercises.
            assert!(vm.val("pool_zap_batched") > 0, "{vm}");
            for c in [
                "fault_refault_tripwire",
                "fault_stale_unmapped",
                "pool_slot_lost",
                "pgunmap_zapped",
                "oom_poison",
                "mm_warn",
            ] {
                assert_eq!(vm.val(c), 0, "{what}: {c} must stay zero\n{vm}");
            }
            assert!(mm.peak_resident_bytes() <= BUDGET, "{vm}");
            assert_consistent(&mm);
            drop(regions);
        });
    }
}

/// Swap-in streams read ahead by the readahead workers (switch `swap_ra_async`: the windows
/// after a stream's fault are read and mapped before the stream gets there) while other
/// threads store into the same pages. Four 4 MiB regions at 8 MiB: thread t < 4 owns word 0
/// of every page of region t and reads it back bottom up (a stream), while thread t + 4 owns
/// word 1 of the same pages and stores it walking down across the stream (its stores land on
/// pages the workers are reading or have just mapped), round after round, on a swap file. A
/// stream's load must see its own last store and every word its owner's last value at the
/// end of each round: a window mapped from a stale swap copy, or a store lost on a page mapped
/// ahead, shows as an old round's value. Over the replacement policies and fault paths, and
/// both ways of mapping a clean swap-cache page (`anon_clean=wp|hash`).
#[test]
fn swap_in_streams_read_ahead_while_others_store() {
    for (i, (lru_gen, sigbus)) in MODES.into_iter().enumerate() {
        for anon_clean in [usermm::Behaviour::Old, usermm::Behaviour::New] {
            if i > 0 && anon_clean == usermm::Behaviour::Old {
                // The write-protected way once (the default is hash).
                continue;
            }
            swap_in_streams_read_ahead_while_others_store_with(lru_gen, sigbus, anon_clean);
        }
    }
}

fn swap_in_streams_read_ahead_while_others_store_with(
    lru_gen: bool,
    sigbus: bool,
    anon_clean: usermm::Behaviour,
) {
    use usermm::{Behaviour, MmConfig, Settings, SwapConfig, Switch};
    init_log();
    const T: usize = 8;
    const ROUNDS: u64 = 3;
    with_watchdog(
        120,
        "4 swap-in streams and 4 writers over 16 MiB with an 8 MiB budget",
        move || {
            let b = |on: bool| if on { Behaviour::New } else { Behaviour::Old };
            let mm = usermm::Mm::new(
                // A swap file: the workers read ahead only where a read waits for a device.
                MmConfig::new(BUDGET)
                    .swap(SwapConfig::File {
                        path: None,
                        size: 64 * MIB,
                    })
                    .settings(
                        Settings::default()
                            .with(Switch::LruGen, b(lru_gen))
                            .with(Switch::FaultPath, b(sigbus))
                            .with(Switch::AnonClean, anon_clean)
                            .with(Switch::SwapRaAsync, Behaviour::New),
                    ),
            )
            .unwrap();
            let shared = (0..4)
                .map(|_| mm.map_anon(4 * MIB as usize).unwrap())
                .collect();
            let s = Arc::new(Setup {
                mm,
                shared,
                private: Vec::new(),
            });
            let pages = 4 * MIB as usize / PAGE;
            // Thread t's value for `round` at page p.
            let val = |t: usize, round: u64, p: usize| pattern(round * 16 + t as u64, p as u64, 7);
            run_threads(&s, T, move |s, t, bar| {
                let r = &s.shared[t % 4];
                let stream = t < 4;
                let word = |p: usize| p * PAGE + (t / 4) * 8;
                for round in 1..=ROUNDS {
                    // Everyone stores this round's values: the streams bottom up, the writers
                    // in a random order.
                    bar.wait();
                    let mut order: Vec<usize> = (0..pages).collect();
                    if !stream {
                        let mut x = round * 131 + t as u64;
                        for i in (1..pages).rev() {
                            x = mix(x);
                            order.swap(i, (x % (i as u64 + 1)) as usize);
                        }
                    }
                    for &p in &order {
                        r.write_u64(word(p), val(t, round, p));
                    }
                    // The streams read theirs back while the writers store a second value
                    // walking down the same pages (from the top in odd rounds, from the middle
                    // in even ones), across the streams' windows. (Walking up behind a stream,
                    // a writer's write run makes the stream's reads read-modify-write faults,
                    // which map writable and read no window ahead.)
                    bar.wait();
                    if stream {
                        for p in 0..pages {
                            assert_eq!(
                                r.read_u64(word(p)),
                                val(t, round, p),
                                "stream {t}, round {round}, page {p}"
                            );
                        }
                    } else {
                        let from = if round % 2 == 1 { pages - 1 } else { pages / 2 };
                        for k in 0..pages {
                            let p = (from + pages - k) % pages;
                            r.write_u64(word(p), val(t, round + 100, p));
                        }
                    }
                    // Every word holds its owner's last value.
                    bar.wait();
                    let last = if stream { round } else { round + 100 };
                    for p in 0..pages {
                        assert_eq!(
                            r.read_u64(word(p)),
                            val(t, last, p),
                            "thread {t}, round {round}, page {p} at the end of the round"
                        );
                    }
                }
            });
            let vm = s.mm.vmstat();
            eprintln!(
                "lru_gen {lru_gen} sigbus {sigbus} anon_clean {anon_clean:?}: swap_ra_async {} \
                 swap_ra_mapped {} pgmajfault {} pswpin {}",
                vm.val("swap_ra_async"),
                vm.val("swap_ra_mapped"),
                vm.val("pgmajfault"),
                vm.val("pswpin")
            );
            assert!(
                vm.val("swap_ra_async") > 0,
                "the streams' windows were never read ahead by the workers\n{vm}"
            );
            assert_clean_run(&s.mm, true);
            assert_eq!(
                vm.val("swap_write_error") + vm.val("swap_read_error"),
                0,
                "{vm}"
            );
        },
    );
}
