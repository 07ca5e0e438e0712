//! The page state machine's locked critical sections, shared by the fault path and reclaim and
//! model-checked: a fault on a resident anonymous page (mm/memory.rs `frame_fault`: the
//! minor fault that stands for the hardware setting a pte's accessed bit, a write to a clean
//! swap-cache page as `do_wp_page`, a stale entry) and anonymous reclaim (mm/vmscan.rs
//! `shrink_page_list` with `page_check_references`, `add_to_swap` and `__remove_mapping`, as
//! in mm/vmscan.c). They are written over the descriptors ([`MemMap`]), a page table and the
//! replacement policy only, taking page locks before pte locks as everywhere; everything else
//! (userfaultfd ioctls, the frame pool, the swap device and swap cache, the region table) goes
//! through [`FaultEnv`] and [`ReclaimEnv`].
//!
//! mm/memory.rs and mm/vmscan.rs call these functions with the real environment. Under
//! `--cfg loom` this module is built with loom's primitives (crate::sync) and
//! tests/loom_page.rs runs these same functions against a model environment (a view and pool
//! slots whose contents it checks), exploring every interleaving of a fault with reclaim.

use crate::vmstat::{Counters, Item};

use super::page::{pg, MemMap, Owner, Pfn, PgOff, RegionId, SwapEntry};
use super::pgtable::{PageTable, Pte};
use super::replacement::ReplacementPolicy;

/// Outcome of one fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Resolved (or found already resolved) and the faulting thread woken.
    Done,
    /// A page it needs is locked (under reclaim I/O); try again shortly.
    Retry,
}

thread_local! {
    /// Whether a fault served on this thread may be parked on read I/O (handler threads, and
    /// any thread while it serves parked faults; handler.rs `IoWaiters`) instead of waiting
    /// for the page lock.
    static MAY_PARK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The page the fault just served (it returned `Fault::Retry`) was parked on.
    static PARKED_ON: std::cell::Cell<Option<Pfn>> = const { std::cell::Cell::new(None) };
}

/// Called by a fault that found page `f` locked and not up to date (under read I/O): on a
/// thread that may park, records `f` and returns true (the fault returns `Fault::Retry`, and
/// its server parks it); elsewhere false (the caller waits for the lock as before).
pub(crate) fn park_on_io(f: Pfn) -> bool {
    MAY_PARK.with(std::cell::Cell::get) && {
        PARKED_ON.with(|p| p.set(Some(f)));
        true
    }
}

/// The page the fault just served was parked on, if it was (and forgets it).
pub(crate) fn take_parked() -> Option<Pfn> {
    PARKED_ON.with(std::cell::Cell::take)
}

/// Lets faults served on this thread be parked (`true`) or not; returns the previous value.
pub(crate) fn set_may_park(may: bool) -> bool {
    MAY_PARK.with(|p| p.replace(may))
}

/// Whether a fault served on this thread may be parked on read I/O ([`set_may_park`]).
pub(crate) fn may_park() -> bool {
    MAY_PARK.with(std::cell::Cell::get)
}

thread_local! {
    /// This thread is serving faults parked on read I/O again (handler.rs `serve_parked`).
    static REPLAYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as serving parked faults again (`true`) or not; returns the previous
/// value. A parked fault was counted when it first ran (its miss, `pgmajfault`); served again,
/// the page it finds is not a new cache hit.
pub(crate) fn set_replaying(on: bool) -> bool {
    REPLAYING.with(|p| p.replace(on))
}

/// Whether this thread is serving parked faults again ([`set_replaying`]).
pub(crate) fn replaying() -> bool {
    REPLAYING.with(std::cell::Cell::get)
}

/// Largest minor-fault fault-around run over readahead pages.
pub const RA_AROUND: u64 = 32;

/// Largest run a reference fault maps (switch `ref_around`): the faulting page and the pages
/// next to it that reclaim unmapped for observation and are still parked.
pub const REF_AROUND: u64 = 16;

/// What a fault on a resident page does outside the descriptors and the page table: the
/// region's view and the frame pool (userfaultfd ioctls), the swap cache, waking the faulter.
pub trait FaultEnv {
    /// Whether the view has a page at `idx`.
    fn view_present(&self, idx: PgOff) -> bool;
    /// A fault found entry `pte` and the view disagreeing (logged and counted).
    fn note_stale(&self, idx: PgOff, pte: Pte);
    /// Makes locked frame `f`'s pool slot hold its page if it is empty (from its swap copy, or
    /// zeros for a page discarded behind the manager's back); false if it could not.
    fn ensure_parked(&self, f: Pfn) -> bool;
    /// `try_to_free_swap`: drops the swap copy of locked page `f`, about to be written, and
    /// marks it dirty.
    fn try_to_free_swap(&self, f: Pfn);
    /// Clears the write protection of the `n` pages mapped from `idx` (errors are logged).
    fn unprotect(&self, idx: PgOff, n: u64);
    /// The write fault-around window (pages, at least 1) for a write at `idx`: it grows while
    /// the region's writes continue a sequential run, as for never-written pages
    /// ([`WriteStreams`](super::region::WriteStreams)).
    fn write_window(&self, idx: PgOff) -> u64;
    /// Whether a sequential write run expects its next write at `idx`: a read fault there is
    /// the read half of a read-modify-write pass, so the pages are mapped writable at once.
    fn write_expected(&self, idx: PgOff) -> bool;
    /// The write run that reached `idx` continues at `next`.
    fn writes_advance(&self, idx: PgOff, next: PgOff);
    /// Places locked, parked frame `f` at page `idx` of the view from its pool slot,
    /// write-protected when `wp`; false if it could not be mapped (it stays parked).
    fn place(&self, idx: PgOff, f: Pfn, wp: bool) -> bool;
    /// [`FaultEnv::place`] for consecutive pages, each locked (`items`: page and frame;
    /// `clean[k]`: item `k` may be mapped write-protected): returns how many from the first
    /// were mapped (the rest stay parked). By default page by page.
    fn place_run(&self, items: &[(PgOff, Pfn)], clean: &[bool]) -> usize {
        items
            .iter()
            .zip(clean)
            .take_while(|(&(idx, f), &wp)| self.place(idx, f, wp))
            .count()
    }
    /// The largest run a reference fault maps (1: the faulting page alone; switch
    /// `ref_around`, [`REF_AROUND`] when on).
    fn ref_around(&self) -> u64 {
        1
    }
    /// A readahead page was used (the region's readahead hit count).
    fn ra_hit(&self);
    /// The faulting thread used readahead page `idx` and was woken: a swap-in stream's marker
    /// queues its next window here (memory.rs, `swap_ra_marker`).
    fn ra_marker(&self, _idx: PgOff) {}
    /// Wakes the threads faulting on `n` pages from `idx`.
    fn wake(&self, idx: PgOff, n: u64);
}

/// Maps locked frame `f`, parked in its pool slot, at page `idx` (`env.place`):
/// write-protected if it is a clean swap-cache page whose swap copy stays valid (a write drops
/// the copy first). Sets PG_mapped. False if the page could not be mapped (it stays parked).
pub fn map_parked(
    pages: &MemMap,
    vm: &Counters,
    env: &impl FaultEnv,
    idx: PgOff,
    f: Pfn,
    write: bool,
) -> bool {
    let keep_wp = before_map(pages, env, f, write);
    if !env.place(idx, f, keep_wp) {
        return false;
    }
    after_map(pages, f, keep_wp);
    vm.inc(Item::NrMapped);
    true
}

/// Before locked, parked page `f` is mapped (writable when `write`: its swap copy is dropped
/// first): whether it may be mapped write-protected, a clean swap-cache page whose swap copy
/// stays valid.
fn before_map(pages: &MemMap, env: &impl FaultEnv, f: Pfn, write: bool) -> bool {
    if write {
        env.try_to_free_swap(f);
    }
    let p = &pages[f];
    p.test(pg::SWAPCACHE) && !p.test(pg::DIRTY)
}

/// Page `f` has been mapped (`keep_wp` as [`before_map`] said): PG_wp while its swap copy stays
/// valid, and PG_mapped.
fn after_map(pages: &MemMap, f: Pfn, keep_wp: bool) {
    let p = &pages[f];
    if keep_wp && p.test(pg::SWAPCACHE) {
        p.set(pg::WP);
    }
    p.set(pg::MAPPED);
}

/// A fault on page `idx` whose entry names resident frame `f`: mapped already (a stale fault,
/// or a write to a write-protected clean page: `do_wp_page`), or parked in the pool (a minor
/// fault: the analogue of the hardware setting the accessed bit), mapped back with the
/// readahead pages after it. Trylocks the page (a locked page defers the fault), then the pte
/// lock, and re-checks the entry (None: it changed, look again).
#[allow(clippy::too_many_arguments)]
pub fn frame_fault(
    pages: &MemMap,
    pt: &PageTable,
    vm: &Counters,
    env: &impl FaultEnv,
    idx: PgOff,
    f: Pfn,
    write: bool,
    wp: bool,
) -> Option<Fault> {
    let p = &pages[f];
    if !p.trylock() {
        vm.inc(Item::FaultDeferred);
        return Some(Fault::Retry);
    }
    let g = pt.lock(idx);
    if g.get() != Pte::Frame(f) {
        drop(g);
        p.unlock();
        return None;
    }
    if p.test(pg::MAPPED) && !wp && !env.view_present(idx) {
        // Flagged mapped, but the view has no page: the page went back to its pool slot (a
        // partial unmap) or was zapped. Mark it unmapped and fault it in like a parked page
        // (a zapped page reads as zeros).
        env.note_stale(idx, Pte::Frame(f));
        p.clear(pg::MAPPED | pg::WP);
        vm.sub(Item::NrMapped, 1);
        if !env.ensure_parked(f) {
            drop(g);
            p.unlock();
            return Some(Fault::Retry);
        }
    }
    if p.test(pg::MAPPED) {
        if wp && p.test(pg::WP) {
            // do_wp_page on a clean swap-cache page: it becomes dirty, its swap copy is stale.
            env.try_to_free_swap(f);
            p.clear(pg::WP);
            // Write fault-around: a sequential writer over swapped-in pages (a read-modify-write
            // pass) takes the clean pages mapped after this one with it, one ioctl for the run,
            // instead of one write-protect fault per page.
            let around = wp_around(pages, pt, env, idx, env.write_window(idx));
            env.unprotect(idx, 1 + around.len() as u64);
            env.writes_advance(idx, idx + 1 + around.len() as u64);
            for (g2, f2) in around.into_iter().rev() {
                drop(g2);
                pages[f2].unlock();
            }
            vm.inc(Item::WpFault);
            vm.inc(Item::Pgfault);
        } else if wp {
            // Write-protected though we did not ask (a leftover marker): clear it.
            env.unprotect(idx, 1);
        }
        drop(g);
        p.unlock();
        env.wake(idx, 1);
        return Some(Fault::Done);
    }
    let was_ra = p.test_clear(pg::READAHEAD);
    // A read where a sequential writer expects its next write (a read-modify-write pass over
    // swapped pages): map writable, as the write that follows would make it.
    let rmw = !write && env.write_expected(idx);
    if !map_parked(pages, vm, env, idx, f, write || rmw) {
        // The thread stays asleep: the deferred retry resolves it (a wake would only make it
        // fault again on the same unmapped page).
        drop(g);
        p.unlock();
        return Some(Fault::Retry);
    }
    vm.inc(Item::Pgfault);
    vm.inc(Item::Pgminfault);
    if was_ra {
        vm.inc(Item::SwapRaHit);
        env.ra_hit();
    } else {
        vm.inc(Item::RefFault);
    }
    // Fault-around over the readahead pages that follow (filemap_map_pages for swap cache), or
    // those before it when none follows (a stream walking down the region).
    let (mut first, mut last) = (idx, idx);
    // A reference fault takes the neighbours unmapped for observation that are still parked
    // (switch ref_around): a program that touches a page again mostly touches the pages next
    // to it in a moment, each of which would be a round trip of its own.
    let (kind, win) = if was_ra {
        (Around::Readahead, RA_AROUND)
    } else {
        (Around::Referenced, env.ref_around())
    };
    if win > 1 {
        last = idx + parked_around(pages, pt, vm, env, idx, kind, win, false, rmw);
        if last == idx {
            first = idx - parked_around(pages, pt, vm, env, idx, kind, win, true, rmw);
        }
    }
    if rmw {
        env.writes_advance(idx, last + 1);
    }
    drop(g);
    p.unlock();
    env.wake(first, last - first + 1);
    if was_ra {
        env.ra_marker(idx);
    }
    Some(Fault::Done)
}

/// Which parked neighbours a minor fault maps with its page ([`parked_around`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Around {
    /// Readahead pages waiting for their first access (PG_readahead): a swap-in stream.
    Readahead,
    /// Pages reclaim unmapped for observation, still parked in their pool slots: the
    /// neighbours of a reference fault (switch `ref_around`).
    Referenced,
}

impl Around {
    /// Whether page `p` is one of those this fault-around maps.
    fn takes(self, p: &super::page::Page) -> bool {
        !p.test(pg::MAPPED)
            && match self {
                Around::Readahead => p.test(pg::READAHEAD),
                Around::Referenced => p.test(pg::LRU) && !p.test(pg::READAHEAD),
            }
    }
}

/// Maps the parked pages of `kind` next to page `idx` (after it, or before it when `down`),
/// up to `win - 1` of them, stopping at the first that is not one (or is busy); writable when
/// `rmw`. Readahead pages count as readahead hits; observed pages as referenced, as the young
/// ptes of x86 Linux's fault-around do. Returns how many were mapped.
#[allow(clippy::too_many_arguments)]
fn parked_around(
    pages: &MemMap,
    pt: &PageTable,
    vm: &Counters,
    env: &impl FaultEnv,
    idx: PgOff,
    kind: Around,
    win: u64,
    down: bool,
    rmw: bool,
) -> u64 {
    // Lock the run first (trylocks: it stops at the first page that is busy or different),
    // then map it in one go.
    let mut held = Vec::new();
    for k in 1..win.min(pt.room(idx, down)) {
        let j = idx.step(k, down);
        let Pte::Frame(f2) = pt.get(j) else { break };
        let p2 = &pages[f2];
        if !kind.takes(p2) || !p2.trylock() {
            break;
        }
        match pt.try_lock(j) {
            Some(g2) if g2.get() == Pte::Frame(f2) && kind.takes(p2) => {
                if kind == Around::Readahead {
                    p2.clear(pg::READAHEAD);
                }
                held.push((j, f2, g2));
            }
            other => {
                drop(other);
                p2.unlock();
                break;
            }
        }
    }
    let items: Vec<(PgOff, Pfn)> = held.iter().map(|&(j, f2, _)| (j, f2)).collect();
    // Mapped from the fault outwards: the count is of the pages next to it. A run walking up is
    // mapped in one go; one walking down page by page (a partly mapped run would keep the
    // pages farthest from the fault).
    let placed = if down {
        items
            .iter()
            .take_while(|&&(j, f2)| map_parked(pages, vm, env, j, f2, rmw))
            .count()
    } else {
        map_parked_run(pages, vm, env, &items, rmw)
    };
    for (k, (_, f2, g2)) in held.into_iter().enumerate() {
        drop(g2);
        if kind == Around::Readahead {
            if k < placed {
                vm.inc(Item::SwapRaHit);
                env.ra_hit();
            } else {
                // Not mapped: still a readahead page waiting for its first access.
                pages[f2].set(pg::READAHEAD);
            }
        }
        pages[f2].unlock();
    }
    if kind == Around::Referenced {
        vm.add(Item::RefAround, placed as u64);
    }
    vm.add(Item::FaultAround, placed as u64);
    placed as u64
}

/// [`map_parked`] for consecutive locked pages (`items`, ascending), mapped with one
/// [`FaultEnv::place_run`]; writable when `write`. Returns how many were mapped, from the first.
fn map_parked_run(
    pages: &MemMap,
    vm: &Counters,
    env: &impl FaultEnv,
    items: &[(PgOff, Pfn)],
    write: bool,
) -> usize {
    let clean: Vec<bool> = items
        .iter()
        .map(|&(_, f)| before_map(pages, env, f, write))
        .collect();
    let placed = env.place_run(items, &clean);
    for (&(_, f), &keep_wp) in items[..placed].iter().zip(&clean) {
        after_map(pages, f, keep_wp);
    }
    vm.add(Item::NrMapped, placed as u64);
    placed
}

/// The write fault-around of a write-protect fault at `idx` (whose page and pte the caller
/// holds locked): up to `win - 1` pages after it that are mapped, clean and write-protected
/// (swap-cache pages whose swap copy is still valid), each locked (page, then pte; trylock:
/// the run stops at the first page that is busy or different), its swap copy dropped and
/// PG_wp cleared. The caller unprotects the run and releases the locks.
fn wp_around<'a>(
    pages: &MemMap,
    pt: &'a PageTable,
    env: &impl FaultEnv,
    idx: PgOff,
    win: u64,
) -> Vec<(super::pgtable::PteGuard<'a>, Pfn)> {
    let mut out = Vec::new();
    for k in 1..win.min(pt.room(idx, false)) {
        let j = idx + k;
        let Pte::Frame(f2) = pt.get(j) else { break };
        let p2 = &pages[f2];
        if !(p2.test(pg::MAPPED) && p2.test(pg::WP) && p2.trylock()) {
            break;
        }
        match pt.try_lock(j) {
            Some(g2) if g2.get() == Pte::Frame(f2) && p2.test(pg::MAPPED) && p2.test(pg::WP) => {
                env.try_to_free_swap(f2);
                p2.clear(pg::WP);
                out.push((g2, f2));
            }
            other => {
                drop(other);
                p2.unlock();
                break;
            }
        }
    }
    out
}

/// What `page_check_references` decided for an isolated page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageRef {
    Activate,
    Keep,
    Reclaim,
    /// Referenced but unmapped clean file page: reclaim it if clean, never write it for this.
    ReclaimClean,
}

/// `page_check_references`: what reclaim does with an isolated, locked page. A mapped page was
/// referenced through its pte (usermm's "young bit": all mapped pages start out young from the
/// instantiating fault, so a page takes a second trip around the inactive list to be reclaimed
/// unless it is referenced again meanwhile); it is kept, or activated if it was referenced
/// before too (or is an in-memory file page, whose eviction costs swap I/O), with PG_referenced
/// set either way.
/// An unmapped page-cache page referenced by read/write is reclaimed only if clean.
pub fn page_check_references(p: &super::page::Page) -> PageRef {
    let referenced_ptes = p.test(pg::MAPPED);
    let referenced_page = p.test_clear(pg::REFERENCED);
    let swapbacked = p.test(pg::SWAPBACKED);
    if referenced_ptes {
        // The mark is set for activated pages as well (as Linux's folio_check_references
        // does), so that a page deactivated later and used again is activated on its next
        // check: one probe fault per trip for a hot page, not two.
        p.set(pg::REFERENCED);
        if referenced_page || (swapbacked && p.test(pg::PAGECACHE)) {
            return PageRef::Activate;
        }
        return PageRef::Keep;
    }
    if referenced_page && !swapbacked {
        return PageRef::ReclaimClean;
    }
    PageRef::Reclaim
}

/// A referenced page stays (`activate_locked` for Activate), unmapped so that its next
/// reference is seen; an activated one stays mapped when the policy does not look at it before
/// aging unmaps it (`ReplacementPolicy::activate_unmaps`). False for a page to reclaim.
pub fn keep_referenced(
    pages: &MemMap,
    lru: &dyn ReplacementPolicy,
    vm: &Counters,
    f: Pfn,
    r: PageRef,
    to_unmap: &mut Vec<Pfn>,
    keep: &mut Vec<Pfn>,
) -> bool {
    match r {
        PageRef::Activate => {
            pages[f].set(pg::ACTIVE);
            vm.inc(Item::Pgactivate);
            if lru.activate_unmaps() {
                to_unmap.push(f);
            }
        }
        PageRef::Keep => to_unmap.push(f),
        PageRef::Reclaim | PageRef::ReclaimClean => return false,
    }
    keep.push(f);
    true
}

/// What anonymous reclaim does outside the descriptors, the page tables and the policy: the
/// views and the pool (unmapping), the swap device and cache, the region table, freeing frames.
pub trait ReclaimEnv {
    /// `try_to_unmap`: unmaps locked, mapped pages into their pool slots; clears PG_mapped of
    /// each page it unmapped.
    fn try_to_unmap(&self, frames: &[Pfn]);
    /// `get_swap_pages`: appends up to `n` free swap entries to `out`.
    fn get_swap_pages(&self, n: usize, out: &mut Vec<SwapEntry>);
    /// Adds locked page `f` to the swap cache under `entry`.
    fn add_to_swap_cache(&self, entry: SwapEntry, f: Pfn);
    /// `pageout`: writes the dirty swap-cache pages among `ready` to swap (clearing PG_dirty of
    /// those written); returns those whose write failed (dirty, out of the swap cache).
    fn pageout(&self, ready: &[Pfn]) -> Vec<Pfn>;
    /// Runs `op` on the page table of region `rid` when the region is live and has page
    /// `idx` (None otherwise).
    fn with_page_table<T>(
        &self,
        rid: RegionId,
        idx: PgOff,
        op: impl FnOnce(Option<&PageTable>) -> T,
    ) -> T;
    /// The page whose swap copy is `entry` left memory: its shadow is recorded
    /// (`workingset_eviction`) and it leaves the swap cache.
    fn evicted(&self, entry: SwapEntry);
    /// `swap_free`: releases `entry`.
    fn swap_free(&self, entry: SwapEntry);
    /// Whether slot `entry` has other users (a fork child's share): its contents must not be
    /// rewritten.
    fn swap_shared(&self, entry: SwapEntry) -> bool {
        let _ = entry;
        false
    }
    /// Returns reclaimed frames to the free frames.
    fn free_frames(&self, frames: &[Pfn]);
}

/// `shrink_page_list` for anonymous pages: decides each isolated (locked) page's fate
/// (`page_check_references`), unmaps the referenced ones (kept), gives the others swap slots
/// (`add_to_swap`), writes the dirty ones when `may_writepage` (`pageout`), and frees the clean
/// ones (`__remove_mapping`); everything kept goes back to the policy. Returns pages freed.
pub fn shrink_page_list(
    pages: &MemMap,
    lru: &dyn ReplacementPolicy,
    vm: &Counters,
    env: &impl ReclaimEnv,
    isolated: Vec<Pfn>,
    may_unmap: bool,
    may_writepage: bool,
) -> usize {
    let mut keep = Vec::new();
    let mut reclaim = Vec::new();
    let mut to_unmap = Vec::new();
    for f in isolated {
        let r = page_check_references(&pages[f]);
        if !keep_referenced(pages, lru, vm, f, r, &mut to_unmap, &mut keep) {
            reclaim.push(f);
        }
    }
    env.try_to_unmap(&to_unmap);
    if !may_unmap {
        keep.append(&mut reclaim);
    }
    let ready = add_to_swap(pages, vm, env, reclaim, &mut keep);
    let failed = if may_writepage {
        env.pageout(&ready)
    } else {
        Vec::new()
    };
    let freed = __remove_mapping(pages, env, ready, &failed, &mut keep);
    keep.extend(failed);
    vm.sub(Item::NrIsolatedAnon, freed.len() as u64);
    vm.sub(Item::NrAnonPages, freed.len() as u64);
    env.free_frames(&freed);
    lru.putback(pages, &keep, vm);
    freed.len()
}

/// `add_to_swap`: gives the pages to reclaim that have no swap slot consecutive slots in view
/// order and puts them in the swap cache, dirty. Returns the pages now in the swap cache; the
/// others (swap full) are activated into `keep` (`activate_locked`).
pub fn add_to_swap(
    pages: &MemMap,
    vm: &Counters,
    env: &impl ReclaimEnv,
    mut reclaim: Vec<Pfn>,
    keep: &mut Vec<Pfn>,
) -> Vec<Pfn> {
    reclaim.sort_unstable_by_key(|&f| pages[f].owner());
    for &f in &reclaim {
        // A dirty page whose slot another process shares (`swap_duplicate` at fork) gives
        // this user's share back and takes a slot of its own: the shared copy is the other's.
        let p = &pages[f];
        if p.test(pg::SWAPCACHE) && p.test(pg::DIRTY) && env.swap_shared(p.swap_entry()) {
            env.swap_free(p.swap_entry());
            p.clear(pg::SWAPCACHE);
        }
    }
    let need: Vec<Pfn> = reclaim
        .iter()
        .copied()
        .filter(|&f| !pages[f].test(pg::SWAPCACHE))
        .collect();
    let mut slots = Vec::with_capacity(need.len());
    env.get_swap_pages(need.len(), &mut slots);
    for (k, &f) in need.iter().enumerate() {
        let p = &pages[f];
        if let Some(&s) = slots.get(k) {
            p.set_swap_entry(s);
            p.set(pg::SWAPCACHE | pg::DIRTY);
            env.add_to_swap_cache(s, f);
        }
    }
    let mut ready = Vec::with_capacity(reclaim.len());
    for f in reclaim {
        let p = &pages[f];
        if p.test(pg::SWAPCACHE) {
            ready.push(f);
        } else {
            p.set(pg::ACTIVE);
            vm.inc(Item::Pgactivate);
            keep.push(f);
        }
    }
    ready
}

/// `__remove_mapping`: the clean pages among `ready` (their swap copy is valid) leave memory:
/// under the pte lock each entry becomes its swap entry and the page leaves the swap cache.
/// Dirty pages that did not fail their write (not written this round) go to `keep`. Returns
/// the freed frames.
pub fn __remove_mapping(
    pages: &MemMap,
    env: &impl ReclaimEnv,
    ready: Vec<Pfn>,
    failed: &[Pfn],
    keep: &mut Vec<Pfn>,
) -> Vec<Pfn> {
    let mut freed = Vec::with_capacity(ready.len());
    for f in ready {
        let p = &pages[f];
        if p.test(pg::DIRTY) {
            if !failed.contains(&f) {
                keep.push(f);
            }
            continue;
        }
        let Owner::Anon(rid, idx) = p.owner() else {
            log::error!("frame {f} on the anon reclaim path is a page-cache page; keeping it");
            keep.push(f);
            continue;
        };
        let slot = p.swap_entry();
        env.with_page_table(rid, idx, |pt| match pt {
            Some(pt) => {
                let mut g = pt.lock(idx);
                if g.get() == Pte::Frame(f) {
                    g.set(Pte::Swap(slot));
                    env.evicted(slot);
                } else {
                    // Cannot happen while the page lock orders us with faults and teardown;
                    // never corrupt another page's entry if it does.
                    log::error!(
                        "frame {f} names region {rid} page {idx}, whose entry is {:?}; freeing it",
                        g.get()
                    );
                    env.swap_free(slot);
                }
            }
            None => env.swap_free(slot),
        });
        freed.push(f);
    }
    freed
}

/// What the install half of a swap-in does outside the descriptors, the page table and the
/// policy: the swap cache and placing the page read from swap in the view.
pub trait SwapinEnv {
    /// Adds page `f` to the swap cache under `entry`.
    fn add_to_swap_cache(&self, entry: SwapEntry, f: Pfn);
    /// `swap_free`: releases `entry`.
    fn swap_free(&self, entry: SwapEntry);
    /// Places the page read from swap for frame `f` at page `idx` of the view, write-protected
    /// when `wp` (errors are logged: the entry still names the frame, whose next fault maps it).
    fn place_read(&self, idx: PgOff, f: Pfn, wp: bool);
}

/// The install half of `do_swap_page`, under the pte lock `g` of page `idx` whose entry is
/// `Swap(slot)`: frame `f` (fresh, on no list, so no other path can reach it) holding the
/// page read from swap becomes the page of `owner`: kept in the swap cache and mapped
/// write-protected while its swap copy stays valid (`keep`: a later write is a wp fault that
/// drops the copy), else dirty with the slot freed; active when its refault distance says so.
/// The entry names the frame before the lock is released, and the frame joins the policy's
/// lists with the readahead pages parked alongside (`parked`).
#[allow(clippy::too_many_arguments)]
pub fn swapin_install(
    pages: &MemMap,
    lru: &dyn ReplacementPolicy,
    vm: &Counters,
    env: &impl SwapinEnv,
    g: &mut super::pgtable::PteGuard<'_>,
    owner: Owner,
    idx: PgOff,
    slot: SwapEntry,
    f: Pfn,
    keep: bool,
    active: bool,
    mut parked: Vec<Pfn>,
) {
    debug_assert_eq!(g.get(), Pte::Swap(slot), "swap-in under a changed entry");
    let mut flags = pg::UPTODATE | pg::SWAPBACKED | pg::MAPPED;
    if active {
        flags |= pg::ACTIVE;
    }
    if keep {
        flags |= pg::SWAPCACHE | pg::WP;
        env.add_to_swap_cache(slot, f);
    } else {
        env.swap_free(slot);
        flags |= pg::DIRTY;
    }
    g.set(Pte::Frame(f));
    env.place_read(idx, f, keep);
    let p = &pages[f];
    p.init(owner, flags);
    p.set_swap_entry(slot);
    parked.push(f);
    lru.add(pages, &parked, vm);
}
