//! Reverse mapping: from a page to where it is mapped, and unmapping it from there. Mirrors
//! `mm/rmap.c` (`try_to_unmap`, `try_to_unmap_one`, `page_referenced`'s role of clearing the
//! young bit). In usermm a page is mapped in at most one place: its owner's view (anonymous
//! pages: the region and index in the descriptor's owner) or, for a page-cache page, the file
//! region named by its `private` word (shared, or private until the page's first store there). Unmapping moves the page into its pool slot with
//! UFFDIO_MOVE (one ioctl per run of pages consecutive in both the view and the pool); the next
//! access is a minor fault, which is how usermm observes references. Unmapping is also where
//! a store to a clean swap-cache page mapped writable (`anon_clean=hash`) is seen: its hash
//! no longer matches ([`verify_clean`], the pte dirty bit `try_to_unmap_one` reads in Linux).

use crate::sys::{Advice, PAGE_SIZE};
use crate::vmstat::Item;

use super::mmzone::Node;
use super::page::{pg, Owner, Pfn, PgOff, RegionId};
use super::pgtable::Pte;
use super::pool;
use super::region::RegionInner;
use super::swap_state;
use super::MmInner;

/// Unmaps locked, mapped pages into their pool slots ("clears the young bit"): one UFFDIO_MOVE
/// per run of pages consecutive both in the view and in the pool.
pub fn try_to_unmap(m: &MmInner, frames: &[Pfn]) {
    if frames.is_empty() {
        return;
    }
    // A slot whose stale copy is still queued for dropping must be empty before a page moves in.
    if frames.iter().any(|&f| m.node.pages[f].test(pg::ZAPPENDING)) {
        pool::flush_zaps(m);
    }
    let mut v: Vec<(RegionId, PgOff, Pfn)> = frames
        .iter()
        .map(|&f| {
            let p = &m.node.pages[f];
            let (rid, idx) = match p.owner() {
                Owner::Anon(rid, idx) => (rid, idx),
                // Where a mapped page-cache page is mapped.
                Owner::Cache(..) => p.mapped_at(),
            };
            (rid, idx, f)
        })
        .collect();
    v.sort_unstable();
    for run in pool::runs(&v, |a, b| {
        b.0 == a.0 && b.1 == a.1.next() && b.2 == a.2.next()
    }) {
        let (k, e) = (run.start, run.end);
        let (rid, idx0, f0) = v[k];
        let Some(r) = m.mm.region(rid).filter(|r| v[e - 1].1 < r.end()) else {
            continue;
        };
        let moved = move_run_out(m, &r, idx0, f0, e - k);
        for &(_, i, f) in &v[k..k + moved] {
            verify_clean(m, &r, f);
            mark_unmapped(m, f);
            clear_file_pte(&m.node, &r, i, f);
        }
        for &(_, idx, f) in &v[k + moved..e] {
            try_to_unmap_one(m, &r, idx, f);
        }
    }
}

/// Moves the `n` mapped pages from page `idx0` of `r`'s view into the pool slots from frame
/// `f0` with one UFFDIO_MOVE (one TLB shootdown) and returns how many moved: a partial move
/// reports every page it moved (sys::uffd resumes the kernel's partial results); the caller
/// unmaps the rest one by one.
fn move_run_out(m: &MmInner, r: &RegionInner, idx0: PgOff, f0: Pfn, n: usize) -> usize {
    let dst = m.pool.slots.addr() + f0.offset();
    match m
        .mm
        .uffd
        .move_pages(dst, r.page_addr(idx0), n * PAGE_SIZE, false, true)
    {
        Ok(b) => b / PAGE_SIZE,
        Err(e) => e.done / PAGE_SIZE,
    }
    .min(n)
}

/// `try_to_unmap_one`: unmaps one locked, mapped page into its pool slot (the fallback of
/// [`try_to_unmap`] for the pages of a run that did not move with it).
fn try_to_unmap_one(m: &MmInner, r: &RegionInner, idx: PgOff, f: Pfn) {
    pool::settle(m, f);
    let src = r.page_addr(idx);
    let dst = m.pool.slots.addr() + f.offset();
    let mut res = m.retry_again(PAGE_SIZE, |_| {
        m.mm.uffd.move_pages(dst, src, PAGE_SIZE, false, true)
    });
    if matches!(res, Err(e) if e.is_exists()) {
        // The slot holds a stale page (a frame's slot must be empty while its page is mapped):
        // drop it and move again.
        m.vm.inc(Item::PoolSlotLost);
        log::warn!("frame {f}: pool slot occupied while its page is mapped; slot dropped");
        m.vm.warn_on(
            m.pool.slots.advise(f.offset(), PAGE_SIZE, Advice::DontNeed),
            "MADV_DONTNEED of pool slots",
        );
        res = m.retry_again(PAGE_SIZE, |_| {
            m.mm.uffd.move_pages(dst, src, PAGE_SIZE, false, true)
        });
    }
    match res {
        Ok(_) => {
            verify_clean(m, r, f);
            mark_unmapped(m, f);
            clear_file_pte(&m.node, r, idx, f);
        }
        Err(e) if e.errno == libc::ENOENT => {
            // Nothing mapped there: the program discarded the page (MADV_DONTNEED) behind our
            // back. Its slot gets its swap copy or zeros, and it is parked like any other.
            if m.node.pages[f].test(pg::PAGECACHE) {
                log::error!("file page in frame {f} lost from its mapping at {src:#x}");
            }
            if refill_lost_slot(m, f) {
                mark_unmapped(m, f);
                clear_file_pte(&m.node, r, idx, f);
            }
        }
        Err(e) => log::debug!("UFFDIO_MOVE out of {src:#x}: {e}; page stays mapped"),
    }
}

/// Locked page `f` has just gone back to its pool slot (or been found there) from a view where
/// it was mapped writable: if it is a clean swap-cache page mapped under `anon_clean=hash` and
/// its contents no longer hash to what they were mapped with, it was written while mapped. Its
/// swap copy is stale, so it is dropped and the page marked dirty (`try_to_free_swap`), as
/// Linux's `try_to_unmap_one` moves the pte dirty bit to the folio. xxh3's 64 bits make a
/// changed page hashing equal a 2^-64 event per unmap of a written page. The verdict is
/// recorded in region `r`'s [`DirtyVerdicts`](super::region::DirtyVerdicts).
pub(crate) fn verify_clean(m: &MmInner, r: &RegionInner, f: Pfn) {
    let h = pool::take_clean_hash(m, f);
    let p = &m.node.pages[f];
    if h == 0 || !p.test(pg::SWAPCACHE) || p.test(pg::DIRTY) {
        return;
    }
    match m.pool.slots.hash_page(f.offset()) {
        Ok(now) if now | 1 == h => {
            m.vm.inc(Item::CleanHashClean);
            r.verdicts.note(false);
        }
        res => {
            r.verdicts.note(true);
            if let Err(e) = res {
                log::error!("hashing pool slot {f}: {e}; the page counts as written");
            }
            m.vm.inc(Item::CleanHashDirty);
            swap_state::try_to_free_swap(m, f);
        }
    }
}

/// A page-cache page unmapped from a file region leaves no entry behind: the region's
/// next access looks the page up in the cache again.
fn clear_file_pte(node: &Node, r: &RegionInner, idx: PgOff, f: Pfn) {
    if node.pages[f].test(pg::PAGECACHE) {
        let mut g = r.pt.lock(idx);
        if g.get() == Pte::Frame(f) {
            g.set(Pte::None);
        }
    }
}

fn mark_unmapped(m: &MmInner, f: Pfn) {
    let p = &m.node.pages[f];
    p.clear(pg::MAPPED | pg::WP);
    m.vm.sub(Item::NrMapped, 1);
    m.vm.inc(Item::PgUnmapRef);
}

/// [`unmap_file_page_at`] for many locked, mapped page-cache pages of `r` (`(idx, frame)`,
/// ascending by page): one UFFDIO_MOVE per run consecutive in both the view and the pool, so a
/// munmap of a large file mapping costs a TLB shootdown per run, not per page. Pages a run's
/// move did not take go one by one ([`unmap_file_page_at`], which also copies a page whose
/// slot still holds its stale copy).
pub(crate) fn unmap_file_pages_at(m: &MmInner, r: &RegionInner, pages: &[(PgOff, Pfn)]) {
    for run in pool::runs(pages, |a, b| b.0 == a.0.next() && b.1 == a.1.next()) {
        let run = &pages[run];
        let (idx0, f0) = run[0];
        for &(_, f) in run {
            pool::settle(m, f);
        }
        let moved = move_run_out(m, r, idx0, f0, run.len());
        for &(_, f) in &run[..moved] {
            m.node.pages[f].clear(pg::MAPPED | pg::WP);
        }
        m.vm.sub(Item::NrMapped, moved as u64);
        for &(idx, f) in &run[moved..] {
            unmap_file_page_at(m, r, idx, f);
        }
    }
}

/// Moves locked, mapped page-cache page `f` from page `idx` of `r`'s view back into its pool
/// slot (the pte lock of `idx` is held by the caller or not needed).
pub(crate) fn unmap_file_page_at(m: &MmInner, r: &RegionInner, idx: PgOff, f: Pfn) {
    pool::settle(m, f);
    let p = &m.node.pages[f];
    let dst = m.pool.slots.addr() + f.offset();
    match m
        .mm
        .uffd
        .move_pages(dst, r.page_addr(idx), PAGE_SIZE, false, true)
    {
        Ok(_) => {}
        Err(e) if e.errno == libc::EEXIST => {
            // The slot still holds the page's copy (mapped by COPY, slot not yet dropped): the
            // view copy is the current one if dirty; copy it over.
            m.vm.warn_on(
                m.pool
                    .slots
                    .copy_from(f.offset(), &r.view, idx.offset(), PAGE_SIZE),
                "copying a page into a pool slot",
            );
            m.vm.warn_on(
                r.view.advise(idx.offset(), PAGE_SIZE, Advice::DontNeed),
                "MADV_DONTNEED of view pages",
            );
        }
        Err(e) => log::error!("moving file page {f} out of {:#x}: {e}", r.page_addr(idx)),
    }
    p.clear(pg::MAPPED | pg::WP);
    m.vm.sub(Item::NrMapped, 1);
}

/// Unmaps locked page-cache page `f` from the file region that maps it (taking that region's
/// pte lock) and clears the entry, so the next access there faults.
pub(crate) fn unmap_file_page(m: &MmInner, f: Pfn) {
    let p = &m.node.pages[f];
    if !p.test(pg::MAPPED) {
        return;
    }
    let (rid, idx) = p.mapped_at();
    let Some(r) = m.mm.region(rid) else {
        p.clear(pg::MAPPED | pg::WP);
        m.vm.sub(Item::NrMapped, 1);
        return;
    };
    let mut g = r.pt.lock(idx);
    unmap_file_page_at(m, &r, idx, f);
    if g.get() == Pte::Frame(f) {
        g.set(Pte::None);
    }
}

/// Frame `f` (locked) is in neither its view nor its pool slot: its page was discarded behind
/// the manager's back (a `MADV_DONTNEED` by the program) or moved away by a bug. Refills the
/// slot so the page can be mapped again: from its swap copy when that copy is still valid (a
/// clean swap-cache page), else with zeros (what a discarded anonymous page reads as; the swap
/// copy, now stale, is dropped). Counted as `pgunmap_zapped` and logged. False if the swap read
/// failed (the caller retries).
pub(crate) fn refill_lost_slot(m: &MmInner, f: Pfn) -> bool {
    let p = &m.node.pages[f];
    // The slot is refilled below: the hash of what was mapped no longer applies.
    pool::take_clean_hash(m, f);
    m.vm.inc(Item::PgunmapZapped);
    if p.test(pg::SWAPCACHE) && !p.test(pg::DIRTY) {
        if let Some(sw) = &m.swap {
            let slot = p.swap_entry();
            log::warn!(
                "frame {f}: page in neither view nor pool slot; reread from swap slot {slot}"
            );
            return pool::with_bounce(1, |b| {
                if !super::page_io::swap_readpage(m, sw, &[slot], b)[0] {
                    return false;
                }
                p.clear(pg::POOLED);
                pool::fill_slot(m, f, b, 0)
            });
        }
    }
    log::warn!(
        "frame {f} ({:?}): page in neither view nor pool slot; it was discarded (reads as zeros)",
        p.owner()
    );
    p.clear(pg::POOLED);
    if !pool::ensure_slot(m, f) {
        return false;
    }
    swap_state::try_to_free_swap(m, f);
    true
}
