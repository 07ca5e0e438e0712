//! The page replacement policy behind reclaim: the split between mechanism and policy.
//!
//! The core (vmscan.rs, memory.rs, filemap.rs) owns the page descriptors, isolation's page
//! locks, `page_check_references` (a mapped page is a young pte; clearing it is unmapping),
//! unmapping, writeback and freeing. A [`ReplacementPolicy`] owns the order of the resident
//! pages: where a page goes when it is added or put back, how a reference promotes it
//! (`mark_page_accessed`), how the lists age and which pages reclaim isolates next, and what a
//! refault of an evicted page means (the workingset feedback, mm/workingset.c).
//!
//! Two policies, one file each, selected by the setting `lru_gen` ([`crate::Switch::LruGen`])
//! and registered in `mmzone.rs` (`new_policy`); this file does not know them:
//! * `lru.rs`, `Lruvec`: the two-list active/inactive LRU (Linux before 6.1, and 6.1 with
//!   `CONFIG_LRU_GEN` off), `lru_gen=off`;
//! * `lru_gen.rs`, `LruGen`: Linux 6.1's multi-gen LRU, `lru_gen=on`.
//!
//! Both pass one conformance suite (`conformance` below) and one proptest over the trait; the
//! core's own proptest and stress tests run with each.

use std::fmt::Debug;

use super::page::{pg, MemMap, Pfn};
use crate::vmstat::{Counters, Item};

/// The lists (`enum lru_list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lru {
    InactiveAnon = 0,
    ActiveAnon = 1,
    InactiveFile = 2,
    ActiveFile = 3,
}

pub const NR_LRU: usize = 4;

impl Lru {
    pub fn active(self) -> bool {
        matches!(self, Lru::ActiveAnon | Lru::ActiveFile)
    }
    pub fn file(self) -> bool {
        matches!(self, Lru::InactiveFile | Lru::ActiveFile)
    }
    pub(super) fn item(self) -> Item {
        match self {
            Lru::InactiveAnon => Item::NrInactiveAnon,
            Lru::ActiveAnon => Item::NrActiveAnon,
            Lru::InactiveFile => Item::NrInactiveFile,
            Lru::ActiveFile => Item::NrActiveFile,
        }
    }
    /// The isolated-pages counter of this list's type.
    pub fn isolated_item(self) -> Item {
        if self.file() {
            Item::NrIsolatedFile
        } else {
            Item::NrIsolatedAnon
        }
    }
    /// The list a page with these flags belongs on (`page_lru`): swap-backed pages (anonymous
    /// and in-memory file pages) on the anon lists, file pages on the file lists.
    pub fn of(flags: u32) -> Lru {
        match (flags & pg::SWAPBACKED != 0, flags & pg::ACTIVE != 0) {
            (true, false) => Lru::InactiveAnon,
            (true, true) => Lru::ActiveAnon,
            (false, false) => Lru::InactiveFile,
            (false, true) => Lru::ActiveFile,
        }
    }
}

/// What `get_scan_count` needs to know of the reclaim pass (`struct scan_control` and the node).
#[derive(Debug, Clone, Copy)]
pub struct ScanInput {
    /// A pass scans `size >> priority` of a list (at least `batch` of a non-empty one).
    pub priority: u32,
    /// Pages isolated per batch.
    pub batch: usize,
    /// Anonymous pages can go to swap (there is a device, and `may_swap`).
    pub can_swap: bool,
    /// `vm.swappiness`: anon : file scan pressure = swappiness : 200 - swappiness.
    pub swappiness: u32,
}

impl ScanInput {
    /// `size >> priority`, at least one batch of a non-empty list.
    pub fn scan(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (n >> self.priority).max(self.batch.min(n))
        }
    }

    /// `get_scan_count`'s SCAN_FRACT for the four lists, given what each would scan alone:
    /// nothing of anon without swap or anon pages, nothing of file without file pages,
    /// otherwise anon and file in proportion `swappiness : 200 - swappiness`.
    pub fn fract(&self, anon: [usize; 2], file: [usize; 2]) -> [usize; NR_LRU] {
        if !self.can_swap || anon == [0, 0] {
            return [0, 0, file[0], file[1]];
        }
        if file == [0, 0] {
            return [anon[0], anon[1], 0, 0];
        }
        let ap = self.swappiness.min(200) as usize;
        let fp = 200 - ap;
        let part = |n: usize, p: usize| {
            if n == 0 {
                0
            } else {
                (n * p / (ap + fp).max(1)).max(1)
            }
        };
        [
            part(anon[0], ap),
            part(anon[1], ap),
            part(file[0], fp),
            part(file[1], fp),
        ]
    }
}

/// A page replacement policy over the resident pages of one lruvec. Every method takes the
/// descriptors and the counters it maintains (`nr_{in,}active_{anon,file}`, `nr_isolated_*`,
/// `pgactivate`); the policy's own lock is the lruvec's `lru_lock`, never held across a call.
///
/// A page is on the policy's lists exactly while PG_lru is set. A page is "anon" when it is
/// swap-backed (`Lru::of`): anonymous and in-memory file pages.
pub trait ReplacementPolicy: Send + Sync + Debug {
    /// `lru_gen=off` or `lru_gen=on` (tests and debugging).
    #[cfg(any(test, loom, feature = "testing"))]
    fn name(&self) -> &'static str;

    /// `lru_cache_add` of new pages (not on a list, not isolated). Their flags say how they
    /// came: PG_mapped = instantiated by a fault, PG_active = a refault the workingset wants
    /// protected, PG_swapcache on an anonymous page = read from swap.
    fn add(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters);

    /// Takes a page off the lists if it is on one (`del_page_from_lru_list`: truncation,
    /// discard); returns whether it was.
    fn del(&self, pages: &MemMap, f: Pfn, vm: &Counters) -> bool;

    /// `putback_lru_page` of isolated, locked pages reclaim kept, then unlocks them. What reclaim
    /// decided is in their flags: PG_active (activate), PG_referenced (kept for a reference),
    /// PG_reclaim with PG_dirty/PG_writeback (waiting for writeback).
    fn putback(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters);

    /// `mark_page_accessed`: a reference seen by the core without a fault (buffered I/O, a
    /// page-cache lookup with FGP_ACCESSED, a copy from the page cache).
    fn mark_accessed(&self, pages: &MemMap, f: Pfn, vm: &Counters);

    /// Pages on the lists counted as `lru` (for the multi-gen LRU, the two youngest generations
    /// are "active", as Linux reports them).
    fn size(&self, lru: Lru) -> u64;

    /// `get_scan_count`: pages to scan of each list this pass (indexed by `Lru as usize`).
    fn get_scan_count(&self, s: &ScanInput) -> [usize; NR_LRU];

    /// Whether reclaim should age the active list of this type with `shrink_active_list`
    /// (`inactive_list_is_low`). A policy that ages inside isolation answers false.
    fn inactive_is_low(&self, file: bool) -> bool;

    /// `isolate_lru_pages`: takes up to `nr` pages of `lru` the policy wants to look at next,
    /// scanning at most `nr_scan`. Only pages whose lock it takes are isolated (the caller owns
    /// them, locked, PG_lru clear); `clean_only` (ISOLATE_CLEAN) leaves dirty pages and pages
    /// under writeback on the lists. Returns pages scanned.
    #[allow(clippy::too_many_arguments)]
    fn isolate_lru_pages(
        &self,
        pages: &MemMap,
        lru: Lru,
        nr: usize,
        nr_scan: usize,
        clean_only: bool,
        out: &mut Vec<Pfn>,
        vm: &Counters,
    ) -> usize;

    /// Whether a page reclaim activates is unmapped at once (its young bit cleared) so that its
    /// next reference is seen. False for a policy whose aging unmaps every page it moves down
    /// and looks at no reference before that: the two-list LRU's `shrink_active_list`
    /// deactivates every anonymous page it scans whatever its young bit, as Linux's does, so a
    /// reference to an active page would be a fault (a round trip here) that tells nobody
    /// anything.
    fn activate_unmaps(&self) -> bool;

    /// `workingset_eviction`: the token a page of this type evicted now leaves in its shadow.
    fn eviction_token(&self, file: bool) -> u32;

    /// `workingset_refault`'s test: whether a page whose shadow holds `token` refaulted soon
    /// enough to be added as part of the working set (PG_active).
    fn refault_activates(&self, token: u32, file: bool) -> bool;

    /// The pages of one type in the order the policy would evict them, first victim first
    /// (tests and debugging).
    #[cfg(any(test, loom, feature = "testing"))]
    fn eviction_order(&self, pages: &MemMap, file: bool) -> Vec<Pfn>;
}

/// The conformance suite every policy passes, and the proptest over the trait. The harness
/// plays the core's part: it isolates, decides with the core's own `page_check_references`,
/// "unmaps" the pages it keeps (clears PG_mapped: the young bit) and puts them back, and
/// frees the others.
#[cfg(all(test, not(loom)))]
mod conformance {
    use super::*;
    use crate::mm::mmzone::new_policy;
    use crate::mm::vmscan::{page_check_references, PageRef};
    use proptest::prelude::*;

    fn policies() -> [Box<dyn ReplacementPolicy>; 2] {
        [new_policy(false), new_policy(true)]
    }

    fn setup(n: u32, flags: u32) -> (MemMap, Counters) {
        let pages = MemMap::new(n);
        pages.iter().for_each(|(_, p)| p.reset_flags(flags));
        (pages, Counters::default())
    }

    fn pf(v: impl IntoIterator<Item = u32>) -> Vec<Pfn> {
        v.into_iter().map(Pfn::new).collect()
    }

    /// One reclaim pass of the core over one type, at most `nr` pages: get_scan_count, age
    /// where the policy asks, isolate, page_check_references, "unmap" and put back what is
    /// kept. Returns the evicted pages (off the lists, unlocked, flags cleared).
    fn reclaim(
        p: &dyn ReplacementPolicy,
        pages: &MemMap,
        vm: &Counters,
        file: bool,
        touch: &dyn Fn(),
    ) -> Vec<Pfn> {
        let (il, al) = if file {
            (Lru::InactiveFile, Lru::ActiveFile)
        } else {
            (Lru::InactiveAnon, Lru::ActiveAnon)
        };
        let s = ScanInput {
            priority: 0,
            batch: 4,
            can_swap: !file,
            swappiness: 60,
        };
        let mut evicted = vec![];
        // The core raises the priority until something is reclaimed; a policy may need a few
        // passes to age before it has a victim.
        for _ in 0..8 {
            touch();
            let nr = p.get_scan_count(&s);
            if s.can_swap && on_lists(p) > 0 {
                assert!(
                    nr.iter().sum::<usize>() > 0,
                    "{}: nothing to scan",
                    p.name()
                );
            }
            if p.inactive_is_low(file) {
                let mut iso = vec![];
                p.isolate_lru_pages(pages, al, 4, 16, false, &mut iso, vm);
                for &f in &iso {
                    pages[f].clear(pg::MAPPED | pg::ACTIVE);
                }
                p.putback(pages, &iso, vm);
            }
            let mut iso = vec![];
            p.isolate_lru_pages(pages, il, 4, 16, false, &mut iso, vm);
            let mut keep = vec![];
            for f in iso {
                match page_check_references(&pages[f]) {
                    PageRef::Activate => {
                        pages[f].set(pg::ACTIVE);
                        if p.activate_unmaps() {
                            pages[f].clear(pg::MAPPED);
                        }
                        keep.push(f);
                    }
                    PageRef::Keep => {
                        pages[f].clear(pg::MAPPED);
                        keep.push(f);
                    }
                    PageRef::Reclaim | PageRef::ReclaimClean => {
                        let isolated = Lru::of(pages[f].flags()).isolated_item();
                        vm.sub(isolated, 1);
                        pages[f].unlock();
                        pages[f].reset_flags(if file { 0 } else { pg::SWAPBACKED });
                        evicted.push(f);
                    }
                }
            }
            p.putback(pages, &keep, vm);
            if !evicted.is_empty() {
                break;
            }
        }
        evicted
    }

    fn on_lists(p: &dyn ReplacementPolicy) -> u64 {
        [
            Lru::InactiveAnon,
            Lru::ActiveAnon,
            Lru::InactiveFile,
            Lru::ActiveFile,
        ]
        .iter()
        .map(|&l| p.size(l))
        .sum()
    }

    /// The sizes the policy reports are the counters it maintains, and PG_lru marks exactly
    /// the pages in its eviction order.
    fn check_counts(p: &dyn ReplacementPolicy, pages: &MemMap, vm: &Counters) {
        for (l, i) in [
            (Lru::InactiveAnon, Item::NrInactiveAnon),
            (Lru::ActiveAnon, Item::NrActiveAnon),
            (Lru::InactiveFile, Item::NrInactiveFile),
            (Lru::ActiveFile, Item::NrActiveFile),
        ] {
            assert_eq!(p.size(l), vm.get(i), "{}: {l:?}", p.name());
        }
        let mut listed: Vec<Pfn> = p.eviction_order(pages, false);
        listed.extend(p.eviction_order(pages, true));
        let n = listed.len();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), n, "{}: a page listed twice", p.name());
        let flagged: Vec<Pfn> = pages
            .iter()
            .filter(|(_, pg_)| pg_.test(pg::LRU))
            .map(|(f, _)| f)
            .collect();
        assert_eq!(listed, flagged, "{}: PG_lru vs the lists", p.name());
        assert_eq!(on_lists(p), n as u64, "{}", p.name());
    }

    #[test]
    fn a_page_referenced_between_scans_outlives_unreferenced_ones() {
        for file in [false, true] {
            for p in policies() {
                let base = if file { 0 } else { pg::SWAPBACKED };
                let (pages, vm) = setup(16, base);
                // Faulted in: mapped (young).
                pages.iter().for_each(|(_, pg_)| pg_.set(pg::MAPPED));
                p.add(&pages, &pf(0..16), &vm);
                let hot = Pfn::new(3);
                let mut order = vec![];
                // Between scans the hot page is touched again: a fault maps it.
                let touch = || pages[hot].set(pg::MAPPED);
                while order.len() < 15 {
                    let ev = reclaim(&*p, &pages, &vm, file, &touch);
                    if ev.is_empty() {
                        break;
                    }
                    order.extend(ev);
                    check_counts(&*p, &pages, &vm);
                }
                assert!(order.len() >= 15, "{} file={file}: {order:?}", p.name());
                assert!(
                    !order[..15].contains(&hot),
                    "{} file={file}: {order:?}",
                    p.name()
                );
            }
        }
    }

    #[test]
    fn unreferenced_pages_go_oldest_first() {
        for file in [false, true] {
            for p in policies() {
                let base = if file { 0 } else { pg::SWAPBACKED };
                let (pages, vm) = setup(12, base);
                for k in 0..12 {
                    p.add(&pages, &pf([k]), &vm);
                }
                let mut order = vec![];
                loop {
                    let ev = reclaim(&*p, &pages, &vm, file, &|| {});
                    if ev.is_empty() {
                        break;
                    }
                    order.extend(ev);
                }
                assert_eq!(order, pf(0..12), "{} file={file}", p.name());
                check_counts(&*p, &pages, &vm);
            }
        }
    }

    #[test]
    fn isolation_never_returns_a_page_twice() {
        for p in policies() {
            let (pages, vm) = setup(40, pg::SWAPBACKED);
            p.add(&pages, &pf(0..20), &vm);
            for k in 20..40 {
                pages[Pfn::new(k)].reset_flags(0);
            }
            p.add(&pages, &pf(20..40), &vm);
            let mut all = vec![];
            for _ in 0..64 {
                for l in [
                    Lru::InactiveAnon,
                    Lru::ActiveAnon,
                    Lru::InactiveFile,
                    Lru::ActiveFile,
                ] {
                    p.isolate_lru_pages(&pages, l, 3, 8, false, &mut all, &vm);
                }
            }
            let n = all.len();
            assert!(n > 0, "{}", p.name());
            let mut d = all.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), n, "{}: isolated twice", p.name());
            assert!(all
                .iter()
                .all(|&f| pages[f].test(pg::LOCKED) && !pages[f].test(pg::LRU)));
            assert_eq!(
                vm.get(Item::NrIsolatedAnon) + vm.get(Item::NrIsolatedFile),
                n as u64
            );
            check_counts(&*p, &pages, &vm);
            p.putback(&pages, &all, &vm);
            assert_eq!(on_lists(&*p), 40, "{}", p.name());
            assert_eq!(
                vm.get(Item::NrIsolatedAnon) + vm.get(Item::NrIsolatedFile),
                0
            );
            assert!(all.iter().all(|&f| !pages[f].test(pg::LOCKED)));
            check_counts(&*p, &pages, &vm);
        }
    }

    #[test]
    fn busy_and_dirty_pages_stay_on_the_lists() {
        for p in policies() {
            let (pages, vm) = setup(8, 0);
            p.add(&pages, &pf(0..8), &vm);
            assert!(pages[Pfn::new(0)].trylock());
            pages[Pfn::new(1)].set(pg::DIRTY);
            let mut out = vec![];
            for _ in 0..8 {
                p.isolate_lru_pages(&pages, Lru::InactiveFile, 8, 8, true, &mut out, &vm);
            }
            assert!(
                !out.contains(&Pfn::new(0)) && !out.contains(&Pfn::new(1)),
                "{}",
                p.name()
            );
            assert!(pages[Pfn::new(0)].test(pg::LRU) && pages[Pfn::new(1)].test(pg::LRU));
            check_counts(&*p, &pages, &vm);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(u32, bool, bool),
        Del(u32),
        Access(u32),
        Map(u32),
        Isolate(u8, u8),
        Putback(u8),
        Reclaim(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..32u32, any::<bool>(), any::<bool>()).prop_map(|(f, a, m)| Op::Add(f, a, m)),
            1 => (0..32u32).prop_map(Op::Del),
            2 => (0..32u32).prop_map(Op::Access),
            2 => (0..32u32).prop_map(Op::Map),
            2 => (0..4u8, 1..8u8).prop_map(|(l, n)| Op::Isolate(l, n)),
            2 => (0..16u8).prop_map(Op::Putback),
            2 => any::<bool>().prop_map(Op::Reclaim),
        ]
    }

    proptest! {
        /// Random sequences of the core's calls against a model of what is on the lists and
        /// what is isolated: membership, PG_lru and the counters always agree, isolation
        /// returns only listed pages, each once, and `del` answers membership.
        #[test]
        fn random_ops_keep_the_invariants(lru_gen in any::<bool>(), ops in proptest::collection::vec(op(), 1..200)) {
            let p = new_policy(lru_gen);
            let (pages, vm) = setup(32, 0);
            let mut listed = std::collections::BTreeSet::new();
            let mut isolated: Vec<Pfn> = vec![];
            for op in ops {
                match op {
                    Op::Add(f, anon, mapped) => {
                        let f = Pfn::new(f);
                        if listed.contains(&f) || isolated.contains(&f) {
                            continue;
                        }
                        pages[f].reset_flags(
                            if anon { pg::SWAPBACKED } else { 0 } | if mapped { pg::MAPPED } else { 0 },
                        );
                        p.add(&pages, &[f], &vm);
                        listed.insert(f);
                    }
                    Op::Del(f) => {
                        let f = Pfn::new(f);
                        if isolated.contains(&f) {
                            continue;
                        }
                        prop_assert_eq!(p.del(&pages, f, &vm), listed.remove(&f));
                    }
                    Op::Access(f) => {
                        let f = Pfn::new(f);
                        if listed.contains(&f) || isolated.contains(&f) {
                            p.mark_accessed(&pages, f, &vm);
                        }
                    }
                    Op::Map(f) => {
                        let f = Pfn::new(f);
                        if listed.contains(&f) || isolated.contains(&f) {
                            pages[f].set(pg::MAPPED);
                        }
                    }
                    Op::Isolate(l, n) => {
                        let l = [Lru::InactiveAnon, Lru::ActiveAnon, Lru::InactiveFile, Lru::ActiveFile][l as usize];
                        let mut out = vec![];
                        p.isolate_lru_pages(&pages, l, n as usize, 2 * n as usize, false, &mut out, &vm);
                        for f in out {
                            prop_assert!(listed.remove(&f), "isolated {f} that was not listed");
                            prop_assert!(!isolated.contains(&f));
                            prop_assert!(pages[f].test(pg::LOCKED) && !pages[f].test(pg::LRU));
                            prop_assert_eq!(Lru::of(pages[f].flags()).file(), l.file());
                            isolated.push(f);
                        }
                    }
                    Op::Putback(n) => {
                        let n = (n as usize).min(isolated.len());
                        let back: Vec<Pfn> = isolated.drain(..n).collect();
                        p.putback(&pages, &back, &vm);
                        listed.extend(back);
                    }
                    Op::Reclaim(file) => {
                        for f in reclaim(&*p, &pages, &vm, file, &|| {}) {
                            prop_assert!(listed.remove(&f));
                        }
                    }
                }
                prop_assert_eq!(on_lists(&*p), listed.len() as u64);
                let iso = vm.get(Item::NrIsolatedAnon) + vm.get(Item::NrIsolatedFile);
                prop_assert_eq!(iso, isolated.len() as u64);
                for (f, pg_) in pages.iter() {
                    prop_assert_eq!(pg_.test(pg::LRU), listed.contains(&f), "PG_lru of {}", f);
                }
            }
            check_counts(&*p, &pages, &vm);
        }
    }
}
