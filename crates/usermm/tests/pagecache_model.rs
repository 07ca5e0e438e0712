//! Property test of the page cache against a shadow copy: random write_at / read_at / set_len /
//! sync / map / store / load / flush / unmap sequences, through shared and private (MAP_PRIVATE:
//! the file shows until a page's first store there) regions, on two files of up to 2 MiB each with a
//! 1 MiB budget, every read and load checked as it happens, then every file read back through
//! the cache and on disk compared byte for byte with its shadow. The model also follows which
//! file pages the cache must have held (touched, not truncated) and which were dirty (written,
//! not since synced, flushed or truncated): a case in which the first set outgrew the budget
//! must show file pages evicted (`pgsteal_file`), and one in which the dirty set outgrew it
//! must show pages written back by reclaim or the flushers (`nr_written` outside the explicit
//! syncs), both read before the final read-back and sync (so the test cannot pass by never
//! leaving memory, nor count the final sync as writeback); a plain test writes both files whole
//! and checks the same before any sync, in every run. Both properties draw the fault path and
//! how writeback reaches the disk (io_uring, or the synchronous fallback `file_io=sync`). A
//! second property runs four threads of mapped loads and stores through two shared regions of
//! one file at once, against per-thread shadows.

use proptest::prelude::*;
use usermm::{CachedFile, MapKind, Mm, MmConfig, Region, SwapConfig};

const MAX_LEN: u64 = 2 << 20;
const MAP_LEN: usize = 256 << 10;

#[derive(Debug, Clone)]
enum Op {
    Write {
        f: usize,
        off: u64,
        len: usize,
        seed: u8,
    },
    Read {
        f: usize,
        off: u64,
        len: usize,
    },
    SetLen {
        f: usize,
        len: u64,
    },
    Sync {
        f: usize,
    },
    Map {
        f: usize,
    },
    Unmap {
        f: usize,
    },
    Store {
        f: usize,
        word: usize,
        v: u64,
    },
    Load {
        f: usize,
        word: usize,
    },
    Flush {
        f: usize,
    },
    /// A private region of file `f` (MAP_PRIVATE): shows the file until a page is first stored
    /// to there, then that page is its own.
    MapPrivate {
        f: usize,
    },
    UnmapPrivate {
        f: usize,
    },
    PStore {
        f: usize,
        word: usize,
        v: u64,
    },
    PLoad {
        f: usize,
        word: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..2usize;
    prop_oneof![
        6 => (f.clone(), 0..MAX_LEN, 1..120_000usize, any::<u8>())
            .prop_map(|(f, off, len, seed)| Op::Write { f, off, len, seed }),
        4 => (f.clone(), 0..MAX_LEN, 1..120_000usize).prop_map(|(f, off, len)| Op::Read { f, off, len }),
        1 => (f.clone(), 0..MAX_LEN).prop_map(|(f, len)| Op::SetLen { f, len }),
        1 => f.clone().prop_map(|f| Op::Sync { f }),
        1 => f.clone().prop_map(|f| Op::Map { f }),
        1 => f.clone().prop_map(|f| Op::Unmap { f }),
        4 => (f.clone(), 0..MAP_LEN / 8, any::<u64>()).prop_map(|(f, word, v)| Op::Store { f, word, v }),
        3 => (f.clone(), 0..MAP_LEN / 8).prop_map(|(f, word)| Op::Load { f, word }),
        1 => f.clone().prop_map(|f| Op::Flush { f }),
        1 => f.clone().prop_map(|f| Op::MapPrivate { f }),
        1 => f.clone().prop_map(|f| Op::UnmapPrivate { f }),
        3 => (f.clone(), 0..MAP_LEN / 8, any::<u64>()).prop_map(|(f, word, v)| Op::PStore { f, word, v }),
        3 => (f, 0..MAP_LEN / 8).prop_map(|(f, word)| Op::PLoad { f, word }),
    ]
}

fn bytes(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed ^ ((off + i as u64) as u8).rotate_left(3) ^ ((off + i as u64) >> 9) as u8)
        .collect()
}

/// Where `got` first differs from `want` (same length): the page, the bytes of it that differ,
/// and whether what was read there is zeros (a page read from a hole or past an old end) or
/// other data (a stale page).
fn first_difference(got: &[u8], want: &[u8]) -> String {
    let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) else {
        return "no difference".into();
    };
    let pg = i / 4096;
    let range = pg * 4096..(pg * 4096 + 4096).min(got.len());
    let differ = range.clone().filter(|&k| got[k] != want[k]).count();
    let zeros = got[range.clone()].iter().all(|&x| x == 0);
    let pages = (0..got.len().div_ceil(4096))
        .filter(|p| {
            let r = p * 4096..(p * 4096 + 4096).min(got.len());
            got[r.clone()] != want[r]
        })
        .count();
    format!(
        "first at byte {i} (page {pg}): {differ} of its {} bytes differ, read {}; {pages} \
         page(s) differ in all",
        range.len(),
        if zeros { "as zeros" } else { "as other data" }
    )
}

/// A 1 MiB manager with 4 MiB of RAM swap, its faults served by handler threads or, with
/// `sigbus`, on the faulting threads (`fault_path=sigbus`); writeback through io_uring or, with
/// `sync_io`, one pwritev per run (`file_io=sync`, the synchronous fallback); clean file pages
/// mapped by fault-around moved then write-protected (`clean_map=move`) or, with `copy_clean`,
/// copied write-protected (`clean_map=copy`).
fn small_mm(sigbus: bool, sync_io: bool, copy_clean: bool) -> Mm {
    let b = |new: bool| {
        if new {
            usermm::Behaviour::New
        } else {
            usermm::Behaviour::Old
        }
    };
    Mm::new(
        MmConfig::new(1 << 20)
            .swap(SwapConfig::Ram { size: 4 << 20 })
            .settings(
                usermm::Settings::default()
                    .with(usermm::Switch::FaultPath, b(sigbus))
                    .with(usermm::Switch::FileIo, b(!sync_io))
                    .with(usermm::Switch::CleanMap, b(!copy_clean)),
            ),
    )
    .unwrap()
}

proptest! {
    // USERMM_PT_CASES overrides the number of cases (e.g. for a long soak run).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("USERMM_PT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]
    #[test]
    fn page_cache_matches_a_shadow(
        ops in proptest::collection::vec(op(), 1..250),
        // Faults served by handler threads or on the faulting thread (fault_path=sigbus).
        sigbus in any::<bool>(),
        // Writeback through io_uring or the synchronous fallback (file_io=sync).
        sync_io in any::<bool>(),
        // Clean pages mapped by fault-around moved or copied (clean_map=copy).
        copy_clean in any::<bool>(),
    ) {
        // Errors the page cache logs (a failed read, a failed writeback) show with a failure.
        let _ = env_logger::try_init();
        let d = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
        let mm = small_mm(sigbus, sync_io, copy_clean);
        let paths: Vec<_> = (0..2).map(|i| d.path().join(format!("f{i}"))).collect();
        let files: Vec<CachedFile> = paths.iter().map(|p| mm.open(p).unwrap()).collect();
        let mut shadow: Vec<Vec<u8>> = vec![Vec::new(), Vec::new()];
        let mut maps: Vec<Option<Region>> = vec![None, None];
        // Private regions and the pages they own (copied at their first store there).
        let mut pmaps: Vec<Option<Region>> = vec![None, None];
        let mut own: Vec<std::collections::HashMap<usize, Vec<u8>>> = vec![Default::default(); 2];
        // File pages the cache has had to hold since they were last truncated away (`live`),
        // and those of them dirty since their file was last synced or flushed (`dirty`); the
        // largest either set grew to; what the explicit syncs and flushes wrote.
        let mut live = std::collections::HashSet::new();
        let mut dirty = std::collections::HashSet::new();
        let (mut max_live, mut max_dirty, mut sync_written) = (0usize, 0usize, 0u64);
        let pages = |off: u64, len: usize| off / 4096..(off + len as u64).div_ceil(4096);
        for op in ops {
            // The pages this op brings into the cache: written ranges, and read or mapped
            // ranges inside the file; the pages it dirties.
            match &op {
                Op::Write { f, off, len, .. } => {
                    for pg in pages(*off, *len) {
                        live.insert((*f, pg));
                        dirty.insert((*f, pg));
                    }
                }
                Op::Read { f, off, len } => {
                    let end = (shadow[*f].len() as u64).min(*off + *len as u64);
                    if end > *off {
                        live.extend(pages(*off, (end - *off) as usize).map(|pg| (*f, pg)));
                    }
                }
                Op::Store { f, word, .. } | Op::Load { f, word }
                    if maps[*f].is_some() && word * 8 + 8 <= shadow[*f].len() =>
                {
                    let pg = (*word * 8 / 4096) as u64;
                    live.insert((*f, pg));
                    if matches!(op, Op::Store { .. }) {
                        dirty.insert((*f, pg));
                    }
                }
                Op::PStore { f, word, .. } | Op::PLoad { f, word }
                    if pmaps[*f].is_some() && word * 8 + 8 <= shadow[*f].len() =>
                {
                    live.insert((*f, (*word * 8 / 4096) as u64));
                }
                Op::SetLen { f, len } => {
                    // Pages wholly past the new end leave the cache unwritten.
                    let keep = len.div_ceil(4096);
                    live.retain(|&(g, pg)| g != *f || pg < keep);
                    dirty.retain(|&(g, pg)| g != *f || pg < keep);
                }
                Op::Sync { f } => dirty.retain(|&(g, _)| g != *f),
                Op::Flush { f } if maps[*f].is_some() => {
                    let end = (MAP_LEN / 4096) as u64;
                    dirty.retain(|&(g, pg)| g != *f || pg >= end);
                }
                _ => {}
            }
            max_live = max_live.max(live.len());
            max_dirty = max_dirty.max(dirty.len());
            let written_before = matches!(op, Op::Sync { .. } | Op::Flush { .. })
                .then(|| mm.vmstat().val("nr_written"));
            match op {
                Op::Write { f, off, len, seed } => {
                    let b = bytes(seed, off, len);
                    prop_assert_eq!(files[f].write_at(off, &b).unwrap(), len);
                    let s = &mut shadow[f];
                    if s.len() < off as usize + len {
                        s.resize(off as usize + len, 0);
                    }
                    s[off as usize..off as usize + len].copy_from_slice(&b);
                }
                Op::Read { f, off, len } => {
                    let mut b = vec![0u8; len];
                    let n = files[f].read_at(off, &mut b).unwrap();
                    let s = &shadow[f];
                    let want = s.len().saturating_sub(off as usize).min(len);
                    prop_assert_eq!(n, want);
                    if n > 0 {
                        prop_assert!(b[..n] == s[off as usize..off as usize + n], "read at {}", off);
                    }
                }
                Op::SetLen { f, len } => {
                    files[f].set_len(len).unwrap();
                    shadow[f].resize(len as usize, 0);
                    // Truncation takes a private region's pages wholly past the end, its own
                    // copies included (truncate_pagecache's even_cows).
                    own[f].retain(|&pg, _| pg * 4096 < len.div_ceil(4096) as usize * 4096);
                }
                Op::Sync { f } => files[f].sync().unwrap(),
                Op::Map { f } => {
                    if maps[f].is_none() {
                        maps[f] = Some(files[f].map(0, MAP_LEN, MapKind::Shared).unwrap());
                    }
                }
                Op::Unmap { f } => maps[f] = None,
                Op::Store { f, word, v } => {
                    let off = word * 8;
                    if let Some(r) = &maps[f] {
                        if off + 8 <= shadow[f].len() {
                            r.write_u64(off, v);
                            shadow[f][off..off + 8].copy_from_slice(&v.to_ne_bytes());
                        }
                    }
                }
                Op::Load { f, word } => {
                    let off = word * 8;
                    if let Some(r) = &maps[f] {
                        if off + 8 <= shadow[f].len() {
                            let want = u64::from_ne_bytes(shadow[f][off..off + 8].try_into().unwrap());
                            prop_assert_eq!(r.read_u64(off), want, "load at {}", off);
                        }
                    }
                }
                Op::Flush { f } => {
                    if let Some(r) = &maps[f] {
                        r.flush(0, MAP_LEN).unwrap();
                    }
                }
                Op::MapPrivate { f } => {
                    if pmaps[f].is_none() {
                        pmaps[f] = Some(files[f].map(0, MAP_LEN, MapKind::Private).unwrap());
                    }
                }
                Op::UnmapPrivate { f } => {
                    pmaps[f] = None;
                    own[f].clear();
                }
                Op::PStore { f, word, v } => {
                    let off = word * 8;
                    if let Some(r) = &pmaps[f] {
                        if off + 8 <= shadow[f].len() {
                            r.write_u64(off, v);
                            let pg = off / 4096;
                            let file = &shadow[f];
                            let page = own[f].entry(pg).or_insert_with(|| {
                                let mut b = vec![0u8; 4096];
                                let end = file.len().min(pg * 4096 + 4096);
                                b[..end - pg * 4096].copy_from_slice(&file[pg * 4096..end]);
                                b
                            });
                            page[off % 4096..off % 4096 + 8].copy_from_slice(&v.to_ne_bytes());
                        }
                    }
                }
                Op::PLoad { f, word } => {
                    let off = word * 8;
                    if let Some(r) = &pmaps[f] {
                        if off + 8 <= shadow[f].len() {
                            let src = match own[f].get(&(off / 4096)) {
                                Some(page) => &page[off % 4096..off % 4096 + 8],
                                None => &shadow[f][off..off + 8],
                            };
                            let want = u64::from_ne_bytes(src.try_into().unwrap());
                            prop_assert_eq!(r.read_u64(off), want, "private load at {}", off);
                        }
                    }
                }
            }
            if let Some(before) = written_before {
                // Counted as the sync's, with whatever the flushers wrote meanwhile.
                sync_written += mm.vmstat().val("nr_written") - before;
            }
        }
        // What reclaim and writeback did during the ops, before the read-back and the final
        // sync below bring in and write out pages of their own.
        let during = mm.vmstat();
        // The budget holds 256 pages (fewer for the cache, as private copies take frames
        // too); 64 more for slack. More file pages held than that: some were evicted. More
        // dirty than that: some were written back by reclaim or the flushers, as no explicit
        // sync or flush had cleaned them.
        if max_live > 256 + 64 {
            prop_assert!(
                during.val("pgsteal_file") > 0,
                "the cache held {} file pages in a 256-page budget, none evicted:\n{}", max_live, during
            );
        }
        if max_dirty > 256 + 64 {
            let background = during.val("nr_written").saturating_sub(sync_written);
            prop_assert!(
                background > 0,
                "{} file pages dirty at once in a 256-page budget, none written back outside \
                 the explicit syncs ({} written in all, {} by them):\n{}",
                max_dirty, during.val("nr_written"), sync_written, during
            );
        }
        // Everything read back through the cache (evicted pages come back from disk).
        for f in 0..2 {
            let mut b = vec![0u8; shadow[f].len()];
            let n = files[f].read_at(0, &mut b).unwrap();
            prop_assert_eq!(n, shadow[f].len());
            prop_assert!(
                b == shadow[f],
                "file {} read back through the cache: {}\n{}",
                f,
                first_difference(&b, &shadow[f]),
                mm.vmstat()
            );
        }
        for f in &files {
            f.sync().unwrap();
        }
        prop_assert!(mm.peak_resident_bytes() <= 1 << 20);
        let vm = mm.vmstat();
        // Writeback went the way the setting says (io_uring: every run, where the kernel has
        // it; the synchronous fallback: none). Runs written to the files, not `nr_written`:
        // that counts private copies written to swap too, as Linux's NR_WRITTEN does.
        if sync_io {
            prop_assert_eq!(vm.val("file_io_uring"), 0);
        } else if vm.val("file_write_runs") > 0 {
            if usermm_sys::ring::available() {
                prop_assert!(
                    vm.val("file_io_uring") > 0,
                    "{} runs written to the files, none through io_uring",
                    vm.val("file_write_runs")
                );
            } else {
                usermm_sys::skip_test("io_uring unavailable: only the synchronous fallback wrote");
            }
        }
        // Quiet first: the flushers, kswapd and the readahead worker hold frames mid-operation.
        mm.settle(std::time::Duration::from_secs(2));
        let bad = mm.audit();
        prop_assert!(bad.is_empty(), "{:?}", bad);
        drop(maps);
        drop(pmaps);
        drop(files);
        for f in 0..2 {
            let disk = std::fs::read(&paths[f]).unwrap();
            prop_assert_eq!(disk.len(), shadow[f].len(), "file {} length", f);
            prop_assert!(disk == shadow[f], "file {} contents", f);
        }
    }
}

/// The two files written whole (4 MiB of dirty pages, four times the 1 MiB budget) through
/// buffered writes and a shared mapping, then read back: before any sync, reclaim has evicted
/// file pages (`pgsteal_file`) and dirty pages have been written back to make room
/// (`nr_written`), and every byte reads back right. The property above checks the same on
/// the random cases whose files outgrow the budget; this case always does.
#[test]
fn files_four_times_the_budget_are_evicted_and_written_back_before_any_sync() {
    for (sigbus, sync_io) in [(false, false), (true, true)] {
        let d = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
        let mm = small_mm(sigbus, sync_io, false);
        let files: Vec<CachedFile> = (0..2)
            .map(|i| mm.open(d.path().join(format!("f{i}"))).unwrap())
            .collect();
        let len = MAX_LEN as usize;
        for (i, f) in files.iter().enumerate() {
            for off in (0..len).step_by(64 << 10) {
                let b = bytes(i as u8, off as u64, 64 << 10);
                assert_eq!(f.write_at(off as u64, &b).unwrap(), b.len());
            }
        }
        // A shared mapping's stores dirty the first pages again.
        let r = files[0].map(0, MAP_LEN, MapKind::Shared).unwrap();
        for p in 0..MAP_LEN / 4096 {
            r.write_u64(p * 4096, p as u64 ^ 0xabcd);
        }
        let vm = mm.vmstat();
        let what = format!("sigbus {sigbus}, sync_io {sync_io}");
        assert!(
            vm.val("pgsteal_file") > 0,
            "{what}: 4 MiB of file pages in a 1 MiB budget, none evicted\n{vm}"
        );
        assert!(
            vm.val("nr_written") >= 512,
            "{what}: 1024 dirty pages in a 256-page budget, {} written back before any sync\n{vm}",
            vm.val("nr_written")
        );
        assert!(mm.peak_resident_bytes() <= 1 << 20, "{what}\n{vm}");
        for (i, f) in files.iter().enumerate() {
            let mut want = bytes(i as u8, 0, len);
            if i == 0 {
                for p in 0..MAP_LEN / 4096 {
                    want[p * 4096..p * 4096 + 8]
                        .copy_from_slice(&(p as u64 ^ 0xabcd).to_ne_bytes());
                }
            }
            let mut got = vec![0u8; len];
            assert_eq!(f.read_at(0, &mut got).unwrap(), len);
            assert!(got == want, "{what}: file {i} read back");
        }
    }
}

/// One access of a thread in [`concurrent_mapped_access_across_two_regions`]: through region
/// `region` (0 or 1), at the thread's word `slot` of page `page`; a store of `v` or a load.
#[derive(Debug, Clone)]
struct Access {
    region: usize,
    page: usize,
    slot: usize,
    store: Option<u64>,
}

const CPAGES: usize = 512; // 2 MiB, twice the budget
const CTHREADS: usize = 4;

/// A thread's accesses: random ones, or a sequential sweep of pages (the readahead and
/// fault-around paths).
fn accesses() -> impl Strategy<Value = Vec<Access>> {
    let one = (
        0..2usize,
        0..CPAGES,
        0..8usize,
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(region, page, slot, store)| Access {
            region,
            page,
            slot,
            store,
        });
    prop_oneof![
        proptest::collection::vec(one, 1..300),
        (0..2usize, 0..CPAGES, 1..CPAGES, any::<bool>(), any::<u64>()).prop_map(
            |(region, start, len, store, v)| (start..(start + len).min(CPAGES))
                .map(|page| Access {
                    region,
                    page,
                    slot: page % 8,
                    store: store.then_some(v ^ page as u64),
                })
                .collect()
        ),
    ]
}

/// The word a thread's access names: thread `t` owns words `t`, `t + CTHREADS`, ... of every
/// page, so threads share pages (and move them between the two views) but never words.
fn word_of(t: usize, a: &Access) -> usize {
    a.page * 4096 + (a.slot * CTHREADS + t) * 8
}

proptest! {
    // USERMM_PT_CASES overrides the number of cases.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("USERMM_PT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]
    /// Concurrent mapped readers and writers across two shared regions of one file twice the
    /// budget: every load sees the thread's last store to that word (or the file's original
    /// word), whichever region it goes through; after both regions are flushed the file on disk
    /// holds every thread's last stores and the original bytes elsewhere.
    #[test]
    fn concurrent_mapped_access_across_two_regions(
        plans in proptest::collection::vec(accesses(), CTHREADS..=CTHREADS),
        sigbus in any::<bool>(),
        sync_io in any::<bool>(),
        copy_clean in any::<bool>(),
    ) {
        let d = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
        let path = d.path().join("shared");
        let original = bytes(0x5c, 0, CPAGES * 4096);
        std::fs::write(&path, &original).unwrap();
        let mm = small_mm(sigbus, sync_io, copy_clean);
        let len = CPAGES * 4096;
        let regions: Vec<Region> = (0..2)
            .map(|_| mm.map_file(&path, 0, len, MapKind::Shared).unwrap())
            .collect();
        let orig_word = |w: usize| u64::from_ne_bytes(original[w..w + 8].try_into().unwrap());
        let results: Vec<Result<Vec<(usize, u64)>, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = plans
                .iter()
                .enumerate()
                .map(|(t, plan)| {
                    let regions = &regions;
                    s.spawn(move || {
                        let mut mine = std::collections::HashMap::new();
                        for (k, a) in plan.iter().enumerate() {
                            let w = word_of(t, a);
                            let r = &regions[a.region];
                            match a.store {
                                Some(v) => {
                                    r.write_u64(w, v);
                                    mine.insert(w, v);
                                }
                                None => {
                                    let want = mine.get(&w).copied().unwrap_or_else(|| orig_word(w));
                                    let got = r.read_u64(w);
                                    if got != want {
                                        return Err(format!(
                                            "thread {t} access {k} ({a:?}): word {w:#x} is {got:#x}, want {want:#x}"
                                        ));
                                    }
                                }
                            }
                        }
                        Ok(mine.into_iter().collect())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut want = original.clone();
        for r in results {
            let stores = r.map_err(TestCaseError::fail)?;
            for (w, v) in stores {
                want[w..w + 8].copy_from_slice(&v.to_ne_bytes());
            }
        }
        for r in &regions {
            r.flush(0, len).unwrap();
        }
        prop_assert!(mm.peak_resident_bytes() <= 1 << 20);
        let disk = std::fs::read(&path).unwrap();
        prop_assert_eq!(disk.len(), want.len());
        if disk != want {
            let first = (0..want.len()).find(|&i| disk[i] != want[i]).unwrap();
            prop_assert!(false, "file differs first at byte {:#x} (page {})", first, first / 4096);
        }
        // Both views read the final contents too.
        for (i, r) in regions.iter().enumerate() {
            for page in (0..CPAGES).step_by(7) {
                let w = page * 4096 + 8 * (page % 512);
                let w = w.min(len - 8) & !7;
                let expect = u64::from_ne_bytes(want[w..w + 8].try_into().unwrap());
                prop_assert_eq!(r.read_u64(w), expect, "region {} word {:#x}", i, w);
            }
        }
    }
}
