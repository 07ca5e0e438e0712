//! LRU lists and page aging. Mirrors `mm/swap.c` (`lru_cache_add`, `mark_page_accessed`,
//! `activate_page`, `putback`), `include/linux/mm_inline.h` (`add_page_to_lru_list`) and the
//! isolation half of `mm/vmscan.c` (`isolate_lru_pages`).
//!
//! The lists are intrusive doubly linked lists threaded through the descriptors by frame number,
//! all under one `lru_lock` per lruvec (Linux's `lruvec->lru_lock`). Head = most recently added;
//! reclaim takes from the tail, so LRU order holds.
//!
//! This is the two-list policy (`lru_gen=off`) behind [`ReplacementPolicy`]; the list helpers
//! (`ListHead`, `link_head`, `unlink`) are shared with the multi-gen LRU (lru_gen.rs). It has no
//! refault feedback (`workingset_refault` counts its refaults but never activates): usermm's
//! two-list LRU has always aged without it, and it stays as it was. It departs from Linux in one
//! number: the inactive anonymous list is kept [`ANON_INACTIVE_SHRINK`] times shorter, because
//! here a page on it is unmapped and each access to it costs a fault.

use super::page::{pg, MemMap, Pfn};
use super::replacement::{ReplacementPolicy, ScanInput};
use crate::sync::Mutex;
use crate::vmstat::{Counters, Item};

pub use super::replacement::{Lru, NR_LRU};

/// One intrusive list: head = most recent, tail = next to scan.
#[derive(Debug, Clone, Copy)]
pub(super) struct ListHead {
    pub(super) head: Pfn,
    pub(super) tail: Pfn,
    pub(super) len: u64,
}

pub(super) const EMPTY: ListHead = ListHead {
    head: Pfn::NONE,
    tail: Pfn::NONE,
    len: 0,
};

/// How many times smaller than Linux's the inactive anonymous list is kept. Linux sizes it for
/// free observation: a deactivated page keeps its mapping and only its accessed bit is cleared.
/// Here a deactivated page is unmapped (the accessed bit cannot be read), so every access to a
/// page on the inactive list is a minor fault of 10-20 us: with Linux's 1:1 balance below 1 GiB,
/// half of the resident pages fault on their next access. mawk building a hash of 2M keys
/// (`bench apps --case awk --budget 176M`, 194 MiB of data) took 428-436k reference faults for
/// 18k pages reclaimed: 13.6-14.2 s with RAM swap and 21.6 s with file swap, against the
/// kernel's 5.0-5.3 s. Single runs by factor, RAM / file swap: 1 -> 13.6 / 21.6 s, 4 -> 9.7 /
/// 13.9 s, 8 -> 7.7-7.9 / 11.3 s (135k reference faults, 10k major), 16 -> 7.4-7.8 / 12.2 s
/// (115k, but 15-20k major), 64 -> 10.4 s and 256 -> 9.5 s with RAM swap (the list too short to
/// tell hot pages: 110-130k major faults). The Python dict, numpy and GNU sort cases and random
/// usemem did not change (within noise).
pub const ANON_INACTIVE_SHRINK: u64 = 8;

/// The fewest pages the shortened inactive anonymous list keeps (where Linux's balance keeps
/// more): four of the largest windows that put pages on it ahead of their use (256-page swap
/// readahead, 128-page write fault-around). New pages start on the inactive list; a shorter one
/// reclaimed pages a write fault-around had just mapped before the program reached them (a
/// 4 MiB budget: the next pass read them back from swap and found them written, so a region
/// only ever read was judged one whose pages come back written).
pub const ANON_INACTIVE_MIN: u64 = 1024;

/// One lruvec: the lists and their lock.
#[derive(Debug)]
pub struct Lruvec {
    lists: Mutex<[ListHead; NR_LRU]>,
}

impl Default for Lruvec {
    fn default() -> Self {
        Lruvec {
            lists: Mutex::new([EMPTY; NR_LRU]),
        }
    }
}

pub(super) fn link_head(pages: &MemMap, l: &mut ListHead, f: Pfn) {
    let p = &pages[f];
    p.set_lru_prev(Pfn::NONE);
    p.set_lru_next(l.head);
    if l.head != Pfn::NONE {
        pages[l.head].set_lru_prev(f);
    } else {
        l.tail = f;
    }
    l.head = f;
    l.len += 1;
}

pub(super) fn unlink(pages: &MemMap, l: &mut ListHead, f: Pfn) {
    let p = &pages[f];
    let (prev, next) = p.lru_links();
    if prev != Pfn::NONE {
        pages[prev].set_lru_next(next);
    } else {
        l.head = next;
    }
    if next != Pfn::NONE {
        pages[next].set_lru_prev(prev);
    } else {
        l.tail = prev;
    }
    l.len -= 1;
}

impl Lruvec {
    /// Moves an LRU page to the active list (`activate_page`).
    pub fn activate(&self, pages: &MemMap, f: Pfn, vm: &Counters) {
        let mut ls = self.lists.lock();
        let p = &pages[f];
        if p.test(pg::LRU) && !p.test(pg::ACTIVE) {
            let from = Lru::of(p.flags());
            unlink(pages, &mut ls[from as usize], f);
            p.set(pg::ACTIVE);
            let to = Lru::of(p.flags());
            link_head(pages, &mut ls[to as usize], f);
            vm.sub(from.item(), 1);
            vm.inc(to.item());
            vm.inc(Item::Pgactivate);
        }
    }

    /// Frames on `lru` from head to tail (tests and debugging).
    #[cfg(any(test, loom, feature = "testing"))]
    pub fn list(&self, pages: &MemMap, lru: Lru) -> Vec<Pfn> {
        let ls = self.lists.lock();
        let mut v = vec![];
        let mut f = ls[lru as usize].head;
        while f != Pfn::NONE {
            v.push(f);
            f = pages[f].lru_links().1;
        }
        v
    }

    /// `inactive_list_is_low`: the inactive list of a type should hold at least 1/ratio of its
    /// pages, where ratio = sqrt(10 * GiB of that type) (1 below 1 GiB); for anonymous pages
    /// [`ANON_INACTIVE_SHRINK`] times less, but never less than [`ANON_INACTIVE_MIN`] pages
    /// while Linux's share is more.
    fn inactive_list_is_low(&self, file: bool) -> bool {
        let (il, al) = if file {
            (Lru::InactiveFile, Lru::ActiveFile)
        } else {
            (Lru::InactiveAnon, Lru::ActiveAnon)
        };
        let inactive = self.size(il);
        let active = self.size(al);
        // GiB of 4 KiB pages (2^18 pages each).
        let gb = (inactive + active) >> 18;
        let ratio = if gb > 0 {
            // A square root of a u64 fits a u64.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ratio = ((10 * gb) as f64).sqrt() as u64;
            ratio
        } else {
            1
        };
        if file {
            return inactive * ratio < active;
        }
        inactive * ratio < active
            && (inactive < ANON_INACTIVE_MIN || inactive * ratio * ANON_INACTIVE_SHRINK < active)
    }
}

impl ReplacementPolicy for Lruvec {
    #[cfg(any(test, loom, feature = "testing"))]
    fn name(&self) -> &'static str {
        "lru_gen=off"
    }

    fn size(&self, lru: Lru) -> u64 {
        self.lists.lock()[lru as usize].len
    }

    /// `lru_cache_add` for a batch: puts pages at the head of the list their PG_active says.
    fn add(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters) {
        if frames.is_empty() {
            return;
        }
        let mut ls = self.lists.lock();
        for &f in frames {
            let p = &pages[f];
            debug_assert!(!p.test(pg::LRU), "frame {f} already on an LRU list");
            let lru = Lru::of(p.flags());
            link_head(pages, &mut ls[lru as usize], f);
            p.set(pg::LRU);
            vm.inc(lru.item());
        }
    }

    /// Removes a page from its list if it is on one (`del_page_from_lru_list`); returns whether it
    /// was.
    fn del(&self, pages: &MemMap, f: Pfn, vm: &Counters) -> bool {
        let mut ls = self.lists.lock();
        let p = &pages[f];
        if !p.test(pg::LRU) {
            return false;
        }
        let lru = Lru::of(p.flags());
        unlink(pages, &mut ls[lru as usize], f);
        p.clear(pg::LRU);
        vm.sub(lru.item(), 1);
        true
    }

    /// `isolate_lru_pages`: takes up to `nr` pages from the tail of `lru`, scanning at most
    /// `nr_scan` entries. Only pages whose lock can be taken are isolated (the caller owns them,
    /// locked, off the list); busy pages are rotated to the head. With `ISOLATE_CLEAN`
    /// (`clean_only`), dirty pages and pages under writeback are not taken but rotated to the
    /// head. Returns pages scanned.
    fn isolate_lru_pages(
        &self,
        pages: &MemMap,
        lru: Lru,
        nr: usize,
        nr_scan: usize,
        clean_only: bool,
        out: &mut Vec<Pfn>,
        vm: &Counters,
    ) -> usize {
        let mut ls = self.lists.lock();
        let l = &mut ls[lru as usize];
        let mut scanned = 0;
        let mut taken = 0;
        while scanned < nr_scan && taken < nr && l.tail != Pfn::NONE {
            let f = l.tail;
            scanned += 1;
            let p = &pages[f];
            unlink(pages, l, f);
            if clean_only && p.test(pg::DIRTY | pg::WRITEBACK) {
                link_head(pages, l, f);
                continue;
            }
            if p.trylock() {
                p.clear(pg::LRU);
                out.push(f);
                taken += 1;
            } else {
                link_head(pages, l, f);
            }
        }
        drop(ls);
        vm.sub(lru.item(), taken as u64);
        vm.add(lru.isolated_item(), taken as u64);
        scanned
    }

    /// `putback_lru_page` for isolated, locked pages: relinks each on the list its flags say,
    /// then unlocks it.
    fn putback(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters) {
        if frames.is_empty() {
            return;
        }
        let mut ls = self.lists.lock();
        for &f in frames {
            let p = &pages[f];
            let lru = Lru::of(p.flags());
            link_head(pages, &mut ls[lru as usize], f);
            p.set(pg::LRU);
            vm.inc(lru.item());
            vm.sub(lru.isolated_item(), 1);
        }
        drop(ls);
        for &f in frames {
            pages[f].unlock();
        }
    }

    /// inactive,unreferenced -> inactive,referenced -> active,unreferenced.
    fn mark_accessed(&self, pages: &MemMap, f: Pfn, vm: &Counters) {
        let p = &pages[f];
        let flags = p.flags();
        if flags & pg::ACTIVE == 0 && flags & pg::REFERENCED != 0 {
            if flags & pg::LRU != 0 {
                self.activate(pages, f, vm);
            } else {
                // Not on a list (isolated or not yet added): the flag makes putback activate it.
                p.set(pg::ACTIVE);
                vm.inc(Item::Pgactivate);
            }
            p.clear(pg::REFERENCED);
        } else if flags & pg::REFERENCED == 0 {
            p.set(pg::REFERENCED);
        }
    }

    /// Without swap, or with enough inactive page cache, only file pages (SCAN_FILE);
    /// otherwise anon and file in proportion to `swappiness` : `200 - swappiness`.
    fn get_scan_count(&self, s: &ScanInput) -> [usize; NR_LRU] {
        let size = |l: Lru| crate::conv::Narrow::usize(self.size(l));
        let anon = [
            s.scan(size(Lru::InactiveAnon)),
            s.scan(size(Lru::ActiveAnon)),
        ];
        let file = [
            s.scan(size(Lru::InactiveFile)),
            s.scan(size(Lru::ActiveFile)),
        ];
        let anon_total = size(Lru::InactiveAnon) + size(Lru::ActiveAnon);
        let file_total = size(Lru::InactiveFile) + size(Lru::ActiveFile);
        // Enough inactive cache: leave the anon working set alone (SCAN_FILE).
        if s.can_swap
            && anon_total > 0
            && file_total > 0
            && !self.inactive_list_is_low(true)
            && size(Lru::InactiveFile) >> s.priority > 0
        {
            return [0, 0, file[0], file[1]];
        }
        s.fract(anon, file)
    }

    fn inactive_is_low(&self, file: bool) -> bool {
        self.inactive_list_is_low(file)
    }

    /// `shrink_active_list` unmaps every page it deactivates; nothing looks at an active
    /// page's references before that.
    fn activate_unmaps(&self) -> bool {
        false
    }

    fn eviction_token(&self, _file: bool) -> u32 {
        0
    }

    fn refault_activates(&self, _token: u32, _file: bool) -> bool {
        false
    }

    #[cfg(any(test, loom, feature = "testing"))]
    fn eviction_order(&self, pages: &MemMap, file: bool) -> Vec<Pfn> {
        // Inactive from its tail, then active from its tail: the order deactivation feeds
        // reclaim when nothing is referenced.
        let (il, al) = if file {
            (Lru::InactiveFile, Lru::ActiveFile)
        } else {
            (Lru::InactiveAnon, Lru::ActiveAnon)
        };
        let mut v: Vec<Pfn> = self.list(pages, il).into_iter().rev().collect();
        v.extend(self.list(pages, al).into_iter().rev());
        v
    }
}

/// `mark_page_accessed`, counted, as the policy promotes a reference (the two-list LRU:
/// inactive,unreferenced -> inactive,referenced -> active,unreferenced).
pub fn mark_page_accessed(lru: &dyn ReplacementPolicy, pages: &MemMap, f: Pfn, vm: &Counters) {
    vm.inc(Item::MarkPageAccessed);
    lru.mark_accessed(pages, f, vm);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(n: u32) -> (MemMap, Lruvec, Counters) {
        let pages = MemMap::new(n);
        pages.iter().for_each(|(_, p)| p.set(pg::SWAPBACKED));
        (pages, Lruvec::default(), Counters::default())
    }

    /// Frames by number.
    fn pf(v: &[u32]) -> Vec<Pfn> {
        v.iter().map(|&n| Pfn::new(n)).collect()
    }

    #[test]
    fn lru_order_and_isolation_from_tail() {
        let (pages, l, vm) = setup(8);
        l.add(&pages, &pf(&[0, 1, 2, 3]), &vm);
        assert_eq!(l.list(&pages, Lru::InactiveAnon), pf(&[3, 2, 1, 0]));
        let mut out = vec![];
        l.isolate_lru_pages(&pages, Lru::InactiveAnon, 2, 32, false, &mut out, &vm);
        assert_eq!(out, pf(&[0, 1]), "oldest first");
        assert_eq!(vm.get(Item::NrInactiveAnon), 2);
        assert!(pages[Pfn::new(0)].test(pg::LOCKED));
        l.putback(&pages, &out, &vm);
        assert_eq!(l.list(&pages, Lru::InactiveAnon), pf(&[1, 0, 3, 2]));
        assert!(!pages[Pfn::new(0)].test(pg::LOCKED));
    }

    /// The anonymous inactive list is kept 8x shorter than Linux's 1:1, but not below
    /// ANON_INACTIVE_MIN pages; the file lists keep Linux's balance.
    #[test]
    fn the_inactive_anon_list_is_short_but_not_too_short() {
        let low = |inactive: u32, active: u32, file: bool| {
            let n = inactive + active;
            let (pages, l, vm) = setup(n);
            if file {
                pages.iter().for_each(|(_, p)| p.clear(pg::SWAPBACKED));
            }
            let all: Vec<Pfn> = (0..n).map(Pfn::new).collect();
            for &f in &all[inactive as usize..] {
                pages[f].set(pg::ACTIVE);
            }
            l.add(&pages, &all, &vm);
            l.inactive_is_low(file)
        };
        let min = u32::try_from(ANON_INACTIVE_MIN).unwrap();
        // 16k pages: Linux would keep 8k inactive; usermm keeps ~1.8k (16k / 9).
        assert!(!low(2000, 14000, false));
        assert!(low(1700, 14300, false));
        assert!(low(2000, 14000, true), "file pages keep Linux's 1:1");
        // A small lruvec: the floor holds where 1/9 would be less than it.
        assert!(low(min - 1, 2 * min, false));
        assert!(!low(min, 2 * min, false));
        // And Linux's own share is never exceeded for the floor's sake.
        assert!(!low(600, 500, false));
    }

    #[test]
    fn locked_pages_are_skipped() {
        let (pages, l, vm) = setup(4);
        l.add(&pages, &pf(&[0, 1]), &vm);
        assert!(pages[Pfn::new(0)].trylock());
        let mut out = vec![];
        l.isolate_lru_pages(&pages, Lru::InactiveAnon, 2, 2, false, &mut out, &vm);
        assert_eq!(out, pf(&[1]));
        assert_eq!(l.list(&pages, Lru::InactiveAnon), pf(&[0]));
    }

    #[test]
    fn two_step_promotion() {
        let (pages, l, vm) = setup(2);
        l.add(&pages, &pf(&[0]), &vm);
        mark_page_accessed(&l, &pages, Pfn::new(0), &vm);
        assert!(pages[Pfn::new(0)].test(pg::REFERENCED) && !pages[Pfn::new(0)].test(pg::ACTIVE));
        mark_page_accessed(&l, &pages, Pfn::new(0), &vm);
        assert!(pages[Pfn::new(0)].test(pg::ACTIVE) && !pages[Pfn::new(0)].test(pg::REFERENCED));
        assert_eq!(l.list(&pages, Lru::ActiveAnon), pf(&[0]));
        assert_eq!(vm.get(Item::Pgactivate), 1);
        assert_eq!(vm.get(Item::NrActiveAnon), 1);
        assert_eq!(vm.get(Item::NrInactiveAnon), 0);
    }
}
