//! The multi-gen LRU (`lru_gen=on`): Linux 6.1's `CONFIG_LRU_GEN` as a [`ReplacementPolicy`].
//! Mirrors the lru_gen section of `mm/vmscan.c` (`inc_min_seq`, `try_to_inc_min_seq`,
//! `inc_max_seq`, `should_run_aging`, `scan_folios`/`sort_folio`/`isolate_folio`, the putback
//! of `evict_folios`), `include/linux/mm_inline.h` (`lru_gen_add_folio`, `lru_gen_del_folio`,
//! `lru_gen_is_active`) and the lru_gen half of `mm/workingset.c` (`lru_gen_eviction`,
//! `lru_gen_refault`).
//!
//! Pages of each type (anon = swap-backed, file) sit in generations numbered by sequence:
//! `min_seq[type]..=max_seq`, at least [`MIN_NR_GENS`] and at most [`MAX_NR_GENS`] of them,
//! generation `seq % MAX_NR_GENS` being one intrusive list per type (its number is kept in the
//! page flags, `pg::LRU_GEN_MASK`). Reclaim evicts from the oldest generation, never from the
//! two youngest. Aging (`inc_max_seq`) opens a new youngest generation; it runs only under
//! pressure, when eviction runs short of generations or the generations are out of balance
//! (`should_run_aging`), at most once per isolation.
//!
//! References: a fault maps a page (usermm's young pte), so pages instantiated by faults are
//! added to the youngest generation, and eviction's `page_check_references` (in the core) finds
//! a page mapped again since it was unmapped: such a page, like every page reclaim rejects, is
//! put back into the youngest generation, unmapped (its young bit cleared). Without Linux's page
//! table walk the aging itself never unmaps: eviction's look at the oldest generation is where
//! young bits are tested and cleared (Linux's `lru_gen_look_around` path).
//!
//! Not modelled: tiers and their PID controller. A reference through a file descriptor
//! (`mark_page_accessed`: PG_referenced) protects a page once, moving it to the second oldest
//! generation when eviction meets it (`sort_folio`'s "protected" case with one tier above the
//! threshold); anon and file are balanced by `swappiness` as in the two-list LRU, not by their
//! refault rates.
//!
//! Workingset: an evicted page's shadow holds the oldest generation's sequence it was evicted
//! from (`lru_gen_eviction`); a refault while that generation is still the oldest was evicted
//! too early and goes back to the youngest generation (`lru_gen_refault`).

use super::lru::{link_head, unlink, ListHead, Lru, EMPTY, NR_LRU};
use super::page::{pg, MemMap, Page, Pfn};
use super::replacement::{ReplacementPolicy, ScanInput};
use crate::conv::Narrow;
use crate::sync::Mutex;
use crate::vmstat::{Counters, Item};

/// Generations a type may have at most (`MAX_NR_GENS`).
pub const MAX_NR_GENS: u64 = NR_GENS as u64;
/// Generations a type has at least: the two youngest are never evicted (`MIN_NR_GENS`).
pub const MIN_NR_GENS: u64 = 2;

const ANON: usize = 0;
const FILE: usize = 1;
const NR_GENS: usize = 4;

/// `struct lru_gen_struct` of one lruvec.
#[derive(Debug)]
struct Gens {
    max_seq: u64,
    min_seq: [u64; 2],
    /// `folios[gen][type]`.
    lists: [[ListHead; 2]; NR_GENS],
}

/// The multi-gen LRU of one lruvec, all under one lock (`lru_lock`).
#[derive(Debug)]
pub struct LruGen {
    gens: Mutex<Gens>,
}

impl Default for LruGen {
    fn default() -> Self {
        LruGen {
            gens: Mutex::new(Gens {
                max_seq: MIN_NR_GENS - 1,
                min_seq: [0, 0],
                lists: [[EMPTY; 2]; NR_GENS],
            }),
        }
    }
}

/// The type of a page with these flags (`folio_is_file_lru`).
fn type_of(flags: u32) -> usize {
    if flags & pg::SWAPBACKED != 0 {
        ANON
    } else {
        FILE
    }
}

/// `lru_gen_from_seq`.
fn gen_of(seq: u64) -> usize {
    (seq % MAX_NR_GENS).usize()
}

/// The generation recorded in a listed page's flags.
fn page_gen(p: &Page) -> usize {
    ((p.flags() & pg::LRU_GEN_MASK) >> pg::LRU_GEN_PGOFF) as usize - 1
}

fn set_page_gen(p: &Page, gen: usize) {
    p.clear(pg::LRU_GEN_MASK);
    // gen < MAX_NR_GENS: the mask holds gen + 1.
    p.set((gen.u32() + 1) << pg::LRU_GEN_PGOFF);
}

impl Gens {
    fn nr_gens(&self, ty: usize) -> u64 {
        self.max_seq - self.min_seq[ty] + 1
    }

    /// `lru_gen_is_active`: the two youngest generations count as the active list.
    fn lru(&self, gen: usize, ty: usize) -> Lru {
        let active = gen == gen_of(self.max_seq) || gen == gen_of(self.max_seq - 1);
        match (ty == FILE, active) {
            (false, false) => Lru::InactiveAnon,
            (false, true) => Lru::ActiveAnon,
            (true, false) => Lru::InactiveFile,
            (true, true) => Lru::ActiveFile,
        }
    }

    fn link(&mut self, pages: &MemMap, f: Pfn, seq: u64, vm: &Counters) -> Lru {
        let p = &pages[f];
        let ty = type_of(p.flags());
        let gen = gen_of(seq);
        link_head(pages, &mut self.lists[gen][ty], f);
        set_page_gen(p, gen);
        p.set(pg::LRU);
        let lru = self.lru(gen, ty);
        vm.inc(lru.item());
        lru
    }

    /// Takes a listed page off its generation; returns the list it was counted on.
    fn unlink(&mut self, pages: &MemMap, f: Pfn, vm: &Counters) -> Lru {
        let p = &pages[f];
        let ty = type_of(p.flags());
        let gen = page_gen(p);
        unlink(pages, &mut self.lists[gen][ty], f);
        p.clear(pg::LRU | pg::LRU_GEN_MASK);
        let lru = self.lru(gen, ty);
        vm.sub(lru.item(), 1);
        lru
    }

    /// `try_to_inc_min_seq`: drops empty oldest generations of `ty`, keeping MIN_NR_GENS.
    fn try_to_inc_min_seq(&mut self, ty: usize) -> bool {
        let mut moved = false;
        while self.nr_gens(ty) > MIN_NR_GENS && self.lists[gen_of(self.min_seq[ty])][ty].len == 0 {
            self.min_seq[ty] += 1;
            moved = true;
        }
        moved
    }

    /// `inc_min_seq`: the oldest generation of `ty` joins the next one, its pages as the
    /// next one's oldest (`folio_inc_gen` + `list_move_tail`).
    fn inc_min_seq(&mut self, pages: &MemMap, ty: usize) {
        let old = gen_of(self.min_seq[ty]);
        let new = gen_of(self.min_seq[ty] + 1);
        // From the old list's head (youngest) to the new list's tail: the oldest page of the
        // old generation ends up the new one's first victim. No counter moves: both are
        // inactive while there are MAX_NR_GENS generations.
        let mut f = self.lists[old][ty].head;
        while f != Pfn::NONE {
            let next = pages[f].lru_links().1;
            unlink(pages, &mut self.lists[old][ty], f);
            link_tail(pages, &mut self.lists[new][ty], f);
            set_page_gen(&pages[f], new);
            f = next;
        }
        self.min_seq[ty] += 1;
    }

    /// `inc_max_seq`: opens a new youngest generation; a type at MAX_NR_GENS generations first
    /// folds its oldest into the next. The generation that stops being one of the two youngest
    /// moves from the active to the inactive counters.
    fn inc_max_seq(&mut self, pages: &MemMap, vm: &Counters) {
        for ty in [ANON, FILE] {
            if self.nr_gens(ty) >= MAX_NR_GENS {
                self.inc_min_seq(pages, ty);
            }
        }
        let leaving = gen_of(self.max_seq - 1);
        self.max_seq += 1;
        for ty in [ANON, FILE] {
            let n = self.lists[leaving][ty].len;
            let (active, inactive) = if ty == FILE {
                (Item::NrActiveFile, Item::NrInactiveFile)
            } else {
                (Item::NrActiveAnon, Item::NrInactiveAnon)
            };
            vm.sub(active, n);
            vm.add(inactive, n);
        }
        vm.inc(Item::LruGenAging);
    }

    /// `should_run_aging` for type `ty`: eviction would stall (only MIN_NR_GENS generations),
    /// or with MIN_NR_GENS + 1 generations the youngest holds more than 1/MIN_NR_GENS of the
    /// pages or the oldest less than 1/(MIN_NR_GENS + 2).
    fn should_run_aging(&self, ty: usize) -> bool {
        let min_seq = self.min_seq[ty];
        if min_seq + MIN_NR_GENS > self.max_seq {
            return true;
        }
        if min_seq + MIN_NR_GENS < self.max_seq {
            return false;
        }
        let total: u64 = (min_seq..=self.max_seq)
            .map(|seq| self.lists[gen_of(seq)][ty].len)
            .sum();
        let young = self.lists[gen_of(self.max_seq)][ty].len;
        let old = self.lists[gen_of(min_seq)][ty].len;
        young * MIN_NR_GENS > total || old * (MIN_NR_GENS + 2) < total
    }

    /// Where `lru_gen_add_folio` puts a page: the youngest generation for a hot one (faulted
    /// in: mapped, or activated); the second oldest for one that cannot be evicted at once (an
    /// anonymous page without a swap slot, a page waiting for writeback); the oldest otherwise.
    fn add_seq(&self, flags: u32) -> u64 {
        let ty = type_of(flags);
        if flags & (pg::ACTIVE | pg::MAPPED) != 0 {
            self.max_seq
        } else if (ty == ANON && flags & pg::SWAPCACHE == 0)
            || (flags & pg::RECLAIM != 0 && flags & (pg::DIRTY | pg::WRITEBACK) != 0)
        {
            self.min_seq[ty] + 1
        } else {
            self.min_seq[ty]
        }
    }
}

fn link_tail(pages: &MemMap, l: &mut ListHead, f: Pfn) {
    let p = &pages[f];
    p.set_lru_next(Pfn::NONE);
    p.set_lru_prev(l.tail);
    if l.tail != Pfn::NONE {
        pages[l.tail].set_lru_next(f);
    } else {
        l.head = f;
    }
    l.tail = f;
    l.len += 1;
}

impl ReplacementPolicy for LruGen {
    #[cfg(any(test, loom, feature = "testing"))]
    fn name(&self) -> &'static str {
        "lru_gen=on"
    }

    fn add(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters) {
        if frames.is_empty() {
            return;
        }
        let mut g = self.gens.lock();
        for &f in frames {
            let p = &pages[f];
            debug_assert!(!p.test(pg::LRU), "frame {f} already on an LRU list");
            let seq = g.add_seq(p.flags());
            // The generation says what PG_active said (`lru_gen_add_folio` clears it).
            p.clear(pg::ACTIVE);
            g.link(pages, f, seq, vm);
        }
    }

    fn del(&self, pages: &MemMap, f: Pfn, vm: &Counters) -> bool {
        let mut g = self.gens.lock();
        if !pages[f].test(pg::LRU) {
            return false;
        }
        g.unlink(pages, f, vm);
        true
    }

    /// `evict_folios`' putback: a page reclaim activated or rejected (referenced, mapped,
    /// dirty, under writeback) goes to the youngest generation with its reference flags
    /// cleared, one waiting for writeback after PG_reclaim to the second oldest, the rest back
    /// to the oldest.
    fn putback(&self, pages: &MemMap, frames: &[Pfn], vm: &Counters) {
        if frames.is_empty() {
            return;
        }
        let mut g = self.gens.lock();
        for &f in frames {
            let p = &pages[f];
            let flags = p.flags();
            let ty = type_of(flags);
            let waiting = flags & pg::RECLAIM != 0 && flags & (pg::DIRTY | pg::WRITEBACK) != 0;
            let seq = if flags & pg::ACTIVE != 0 {
                g.max_seq
            } else if waiting {
                g.min_seq[ty] + 1
            } else if flags & (pg::REFERENCED | pg::MAPPED | pg::DIRTY | pg::WRITEBACK) != 0 {
                g.max_seq
            } else {
                g.min_seq[ty]
            };
            p.clear(pg::ACTIVE | pg::REFERENCED);
            let lru = g.link(pages, f, seq, vm);
            vm.sub(lru.isolated_item(), 1);
        }
        drop(g);
        for &f in frames {
            pages[f].unlock();
        }
    }

    /// `folio_mark_accessed` with lru_gen: the reference is recorded (`folio_inc_refs`, here
    /// PG_referenced) and acted on when eviction meets the page, never by moving it now.
    fn mark_accessed(&self, pages: &MemMap, f: Pfn, _vm: &Counters) {
        pages[f].set(pg::REFERENCED);
    }

    fn size(&self, lru: Lru) -> u64 {
        let g = self.gens.lock();
        let ty = usize::from(lru.file());
        (g.min_seq[ty]..=g.max_seq)
            .map(gen_of)
            .filter(|&gen| g.lru(gen, ty) == lru)
            .map(|gen| g.lists[gen][ty].len)
            .sum()
    }

    /// `get_nr_to_scan`: each type's pages `>> priority`, all of them on the inactive side
    /// (eviction ages as it needs), balanced by swappiness.
    fn get_scan_count(&self, s: &ScanInput) -> [usize; NR_LRU] {
        let total = |ty: usize| {
            let g = self.gens.lock();
            (g.min_seq[ty]..=g.max_seq)
                .map(|seq| g.lists[gen_of(seq)][ty].len)
                .sum::<u64>()
                .usize()
        };
        s.fract([s.scan(total(ANON)), 0], [s.scan(total(FILE)), 0])
    }

    fn inactive_is_low(&self, _file: bool) -> bool {
        false
    }

    /// `isolate_folios` from the oldest generation of the type (`scan_folios`, `sort_folio`,
    /// `isolate_folio`), aging first when `should_run_aging` says so and at most once.
    /// Nothing is isolated from the "active" lists: aging is by generation, inside this call.
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
        if lru.active() {
            return 0;
        }
        let ty = usize::from(lru.file());
        let mut g = self.gens.lock();
        g.try_to_inc_min_seq(ty);
        let mut aged = false;
        if g.should_run_aging(ty) {
            g.inc_max_seq(pages, vm);
            g.try_to_inc_min_seq(ty);
            aged = true;
        }
        let mut scanned = 0;
        let mut taken = 0;
        while scanned < nr_scan && taken < nr {
            if g.nr_gens(ty) <= MIN_NR_GENS {
                if aged {
                    break;
                }
                g.inc_max_seq(pages, vm);
                aged = true;
                continue;
            }
            let gen = gen_of(g.min_seq[ty]);
            let f = g.lists[gen][ty].tail;
            if f == Pfn::NONE {
                if !g.try_to_inc_min_seq(ty) {
                    break;
                }
                continue;
            }
            scanned += 1;
            let p = &pages[f];
            g.unlink(pages, f, vm);
            if p.test_clear(pg::REFERENCED) {
                // Protected: referenced through a file descriptor since it was added.
                let seq = g.min_seq[ty] + 1;
                g.link(pages, f, seq, vm);
                continue;
            }
            if clean_only && p.test(pg::DIRTY | pg::WRITEBACK) || !p.trylock() {
                let seq = g.min_seq[ty];
                g.link(pages, f, seq, vm);
                continue;
            }
            p.clear(pg::LRU);
            out.push(f);
            taken += 1;
        }
        drop(g);
        vm.add(lru.isolated_item(), taken as u64);
        scanned
    }

    /// Eviction judges a page of the oldest generation by its young bit (PG_mapped): a page
    /// promoted while still mapped would look referenced there however cold it had become.
    fn activate_unmaps(&self) -> bool {
        true
    }

    fn eviction_token(&self, file: bool) -> u32 {
        // The low 32 bits of a sequence number: the test below compares for equality.
        #[allow(clippy::cast_possible_truncation)]
        let t = self.gens.lock().min_seq[usize::from(file)] as u32;
        t
    }

    fn refault_activates(&self, token: u32, file: bool) -> bool {
        #[allow(clippy::cast_possible_truncation)]
        let t = self.gens.lock().min_seq[usize::from(file)] as u32;
        t == token
    }

    #[cfg(any(test, loom, feature = "testing"))]
    fn eviction_order(&self, pages: &MemMap, file: bool) -> Vec<Pfn> {
        let g = self.gens.lock();
        let ty = usize::from(file);
        let mut v = vec![];
        for seq in g.min_seq[ty]..=g.max_seq {
            let mut f = g.lists[gen_of(seq)][ty].tail;
            while f != Pfn::NONE {
                v.push(f);
                f = pages[f].lru_links().0;
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pf(v: impl IntoIterator<Item = u32>) -> Vec<Pfn> {
        v.into_iter().map(Pfn::new).collect()
    }

    #[test]
    fn faulted_pages_start_young_and_read_pages_old() {
        let pages = MemMap::new(4);
        let vm = Counters::default();
        let l = LruGen::default();
        pages[Pfn::new(0)].reset_flags(pg::SWAPBACKED | pg::MAPPED);
        pages[Pfn::new(1)].reset_flags(0);
        pages[Pfn::new(2)].reset_flags(pg::SWAPBACKED);
        pages[Pfn::new(3)].reset_flags(pg::SWAPBACKED | pg::SWAPCACHE);
        l.add(&pages, &pf(0..4), &vm);
        let g = l.gens.lock();
        assert_eq!(page_gen(&pages[Pfn::new(0)]), gen_of(g.max_seq));
        assert_eq!(page_gen(&pages[Pfn::new(1)]), gen_of(g.min_seq[FILE]));
        assert_eq!(page_gen(&pages[Pfn::new(2)]), gen_of(g.min_seq[ANON] + 1));
        assert_eq!(page_gen(&pages[Pfn::new(3)]), gen_of(g.min_seq[ANON]));
    }

    #[test]
    fn aging_keeps_between_two_and_four_generations_and_the_counters() {
        let pages = MemMap::new(64);
        let vm = Counters::default();
        let l = LruGen::default();
        for k in 0..64 {
            pages[Pfn::new(k)].reset_flags(if k % 2 == 0 { pg::SWAPBACKED } else { 0 });
            pages[Pfn::new(k)].set(pg::MAPPED);
            l.add(&pages, &[Pfn::new(k)], &vm);
            let mut g = l.gens.lock();
            g.inc_max_seq(&pages, &vm);
            for ty in [ANON, FILE] {
                assert!((MIN_NR_GENS..=MAX_NR_GENS).contains(&g.nr_gens(ty)));
            }
            g.try_to_inc_min_seq(ANON);
        }
        let active = vm.get(Item::NrActiveAnon) + vm.get(Item::NrActiveFile);
        let inactive = vm.get(Item::NrInactiveAnon) + vm.get(Item::NrInactiveFile);
        assert_eq!(active + inactive, 64);
        assert_eq!(l.size(Lru::ActiveAnon), vm.get(Item::NrActiveAnon));
        assert_eq!(l.size(Lru::InactiveFile), vm.get(Item::NrInactiveFile));
        assert_eq!(l.eviction_order(&pages, false).len(), 32);
        assert_eq!(vm.get(Item::LruGenAging), 64);
    }

    #[test]
    fn a_refault_from_the_oldest_generation_activates() {
        let l = LruGen::default();
        let pages = MemMap::new(1);
        let vm = Counters::default();
        let t = l.eviction_token(true);
        assert!(l.refault_activates(t, true));
        {
            let mut g = l.gens.lock();
            g.inc_max_seq(&pages, &vm);
            g.inc_max_seq(&pages, &vm);
            g.try_to_inc_min_seq(FILE);
        }
        assert!(!l.refault_activates(t, true), "evicted generations ago");
    }
}
