//! Model-based property test: random operations over a few regions with a tiny budget (reclaim
//! runs all the time), checked against a shadow model of every page's contents.

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use usermm::{Mm, Region};

const WORDS: usize = PAGE / 8;
const NREG: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// Write `val` at (page, word); `hot` picks the page among the first 64 of the region.
    Write {
        reg: usize,
        page: u32,
        word: u16,
        val: u64,
        hot: bool,
    },
    /// Read one word and compare with the model.
    Read {
        reg: usize,
        page: u32,
        word: u16,
        hot: bool,
    },
    /// Write one word into each of `n` consecutive pages (a sequential writer).
    Fill {
        reg: usize,
        page: u32,
        n: u16,
        word: u16,
        seed: u64,
    },
    /// Copy a whole page in with write_bytes.
    WritePage { reg: usize, page: u32, seed: u64 },
    /// Read a whole page with read_bytes and compare.
    ReadPage { reg: usize, page: u32, hot: bool },
    /// Discard `n` pages from `page`.
    Discard { reg: usize, page: u32, n: u16 },
    /// Push everything out to swap.
    ReclaimAll,
    /// Drop the region and map a new one of `pages` pages.
    Recreate { reg: usize, pages: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    let reg = 0..NREG;
    prop_oneof![
        6 => (reg.clone(), any::<u32>(), 0..WORDS as u16, any::<u64>(), any::<bool>())
            .prop_map(|(reg, page, word, val, hot)| Op::Write { reg, page, word, val, hot }),
        4 => (reg.clone(), any::<u32>(), 0..WORDS as u16, any::<bool>())
            .prop_map(|(reg, page, word, hot)| Op::Read { reg, page, word, hot }),
        3 => (reg.clone(), any::<u32>(), 1..128u16, 0..WORDS as u16, any::<u64>())
            .prop_map(|(reg, page, n, word, seed)| Op::Fill { reg, page, n, word, seed }),
        1 => (reg.clone(), any::<u32>(), any::<u64>()).prop_map(|(reg, page, seed)| Op::WritePage { reg, page, seed }),
        2 => (reg.clone(), any::<u32>(), any::<bool>()).prop_map(|(reg, page, hot)| Op::ReadPage { reg, page, hot }),
        1 => (reg.clone(), any::<u32>(), 1..256u16).prop_map(|(reg, page, n)| Op::Discard { reg, page, n }),
        1 => Just(Op::ReclaimAll),
        1 => (reg, 256..2048u32).prop_map(|(reg, pages)| Op::Recreate { reg, pages }),
    ]
}

/// Shadow of one region: page -> its 512 words (absent = all zeros).
struct Shadow {
    pages: usize,
    data: HashMap<usize, Box<[u64; WORDS]>>,
}

impl Shadow {
    fn word(&self, p: usize, w: usize) -> u64 {
        self.data.get(&p).map_or(0, |d| d[w])
    }
    fn set(&mut self, p: usize, w: usize, v: u64) {
        self.data.entry(p).or_insert_with(|| Box::new([0; WORDS]))[w] = v;
    }
}

fn page_of(page: u32, hot: bool, pages: usize) -> usize {
    if hot {
        page as usize % pages.min(64)
    } else {
        page as usize % pages
    }
}

fn page_bytes(seed: u64, p: usize) -> Vec<u8> {
    (0..WORDS)
        .flat_map(|w| mix(seed ^ (p as u64) << 20 ^ w as u64).to_ne_bytes())
        .collect()
}

fn check_page(
    r: &Region,
    s: &Shadow,
    reg: usize,
    p: usize,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let mut buf = vec![0u8; PAGE];
    r.read_bytes(p * PAGE, &mut buf).unwrap();
    for w in 0..WORDS {
        let got = u64::from_ne_bytes(buf[w * 8..w * 8 + 8].try_into().unwrap());
        prop_assert_eq!(
            got,
            s.word(p, w),
            "{}: region {} page {} word {}",
            ctx,
            reg,
            p,
            w
        );
    }
    Ok(())
}

fn run(initial: Vec<u32>, ops: Vec<Op>, lru_gen: bool, sigbus: bool) -> Result<(), TestCaseError> {
    let budget = 2 * MIB;
    let mm: Mm = mm_ram_mode(budget, 40 * MIB, lru_gen, sigbus);
    let mut regions: Vec<Region> = initial
        .iter()
        .map(|&n| mm.map_anon(n as usize * PAGE).unwrap())
        .collect();
    let mut shadow: Vec<Shadow> = initial
        .iter()
        .map(|&n| Shadow {
            pages: n as usize,
            data: HashMap::new(),
        })
        .collect();
    let t0 = std::time::Instant::now();
    for (i, op) in ops.iter().enumerate() {
        if std::env::var("USERMM_PT_TRACE").is_ok() {
            eprintln!("{:?} op {i} {op:?}", t0.elapsed());
        }
        let ctx = format!("op {i} {op:?}");
        match *op {
            Op::Write {
                reg,
                page,
                word,
                val,
                hot,
            } => {
                let p = page_of(page, hot, shadow[reg].pages);
                regions[reg].write_u64(p * PAGE + word as usize * 8, val);
                shadow[reg].set(p, word as usize, val);
            }
            Op::Read {
                reg,
                page,
                word,
                hot,
            } => {
                let p = page_of(page, hot, shadow[reg].pages);
                let got = regions[reg].read_u64(p * PAGE + word as usize * 8);
                prop_assert_eq!(got, shadow[reg].word(p, word as usize), "{}", ctx);
            }
            Op::Fill {
                reg,
                page,
                n,
                word,
                seed,
            } => {
                let pages = shadow[reg].pages;
                let first = page as usize % pages;
                for p in first..(first + n as usize).min(pages) {
                    let v = mix(seed ^ p as u64);
                    regions[reg].write_u64(p * PAGE + word as usize * 8, v);
                    shadow[reg].set(p, word as usize, v);
                }
            }
            Op::WritePage { reg, page, seed } => {
                let p = page as usize % shadow[reg].pages;
                let bytes = page_bytes(seed, p);
                regions[reg].write_bytes(p * PAGE, &bytes).unwrap();
                for w in 0..WORDS {
                    shadow[reg].set(
                        p,
                        w,
                        u64::from_ne_bytes(bytes[w * 8..w * 8 + 8].try_into().unwrap()),
                    );
                }
            }
            Op::ReadPage { reg, page, hot } => {
                let p = page_of(page, hot, shadow[reg].pages);
                check_page(&regions[reg], &shadow[reg], reg, p, &ctx)?;
            }
            Op::Discard { reg, page, n } => {
                let pages = shadow[reg].pages;
                let first = page as usize % pages;
                let n = (n as usize).min(pages - first);
                regions[reg].discard(first * PAGE, n * PAGE).unwrap();
                shadow[reg]
                    .data
                    .retain(|&p, _| !(first..first + n).contains(&p));
            }
            Op::ReclaimAll => {
                mm.reclaim_to(0);
            }
            Op::Recreate { reg, pages } => {
                // Drop first so that the commit charge is released before the new map.
                regions[reg] = mm.map_anon(PAGE).unwrap();
                regions[reg] = mm.map_anon(pages as usize * PAGE).unwrap();
                shadow[reg] = Shadow {
                    pages: pages as usize,
                    data: HashMap::new(),
                };
            }
        }
    }
    prop_assert!(
        mm.peak_resident_bytes() <= budget,
        "peak resident above the budget\n{}",
        mm.vmstat()
    );
    prop_assert_eq!(mm.vmstat().val("oom_poison"), 0);
    settle(&mm);
    let bad = mm.audit();
    prop_assert!(
        bad.is_empty(),
        "page accounting is inconsistent:\n{}",
        bad.join("\n")
    );
    if std::env::var("USERMM_PT_TRACE").is_ok() {
        let vm = mm.vmstat();
        eprintln!(
            "case done: {} ops, pswpout {} pswpin {} pgdiscard {} oom_poison {}",
            ops.len(),
            vm.val("pswpout"),
            vm.val("pswpin"),
            vm.val("pgdiscard"),
            vm.val("oom_poison")
        );
    }
    // Everything, every word of every page.
    for (reg, (r, s)) in regions.iter().zip(&shadow).enumerate() {
        for p in 0..s.pages {
            check_page(r, s, reg, p, "final read-back")?;
        }
    }
    // Dropping everything returns all memory and swap.
    drop(regions);
    settle(&mm);
    let vm = mm.vmstat();
    prop_assert_eq!(mm.resident_bytes(), 0, "{}", vm);
    prop_assert_eq!(vm.val("nr_swap_used"), 0, "{}", vm);
    prop_assert_eq!(mm.commit().0, 0);
    Ok(())
}

proptest! {
    // USERMM_PT_CASES overrides the number of cases (e.g. for a long soak run).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("USERMM_PT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        max_shrink_iters: 1000,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_ops_match_the_model(
        initial in proptest::collection::vec(256..2048u32, NREG),
        ops in proptest::collection::vec(op(), 1..400),
        // The replacement policy: the two-list LRU or the multi-gen LRU.
        lru_gen in any::<bool>(),
        // The fault path: handler threads or the faulting thread itself (fault_path=sigbus).
        sigbus in any::<bool>(),
    ) {
        init_log();
        run(initial, ops, lru_gen, sigbus)?;
    }
}
