//! Advice on ranges of a region. Mirrors `mm/madvise.c`: `MADV_DONTNEED` semantics of
//! `Region::discard`, `MADV_RANDOM` / `MADV_SEQUENTIAL` / `MADV_NORMAL` as
//! `Region::set_access_pattern` (the region is one VMA, so the pattern is the whole region's),
//! `MADV_WILLNEED` as `Region::willneed` (`madvise_willneed` -> `vfs_fadvise` ->
//! `force_page_cache_readahead`), and the zap side of `mm/memory.c` (`zap_page_range`), which
//! unmapping a whole region uses too.

use crate::error::{RegionError, Result};
use crate::sys::{Advice, PAGE_SIZE};
use crate::vmstat::Item;

use super::filemap;
use super::page::pg;
use super::page::PgOff;
use super::pgtable::Pte;
use super::region::{AccessPattern, Region, RegionInner};
use super::MmInner;
use crate::conv::Narrow;
use crate::sync::Ordering;

impl Region {
    /// Declares how the program will access this region (`MADV_RANDOM`, `MADV_SEQUENTIAL`,
    /// `MADV_NORMAL`): see [`AccessPattern`]. Applies to the whole region.
    pub fn set_access_pattern(&self, p: AccessPattern) {
        self.r.pattern.store(p.code(), Ordering::Relaxed);
    }

    /// The access pattern declared with [`Region::set_access_pattern`] (`Normal` by default).
    pub fn access_pattern(&self) -> AccessPattern {
        self.r.access_pattern()
    }

    /// `MADV_WILLNEED`: starts reading the file pages of `[off, off+len)` of a file region
    /// into the page cache in the background and returns at once (4 KiB aligned). At most half
    /// the budget is read ahead per call, so the advice cannot push the working set out. For
    /// an anonymous region it does nothing (its swapped-out pages come back at their faults,
    /// with swap readahead).
    pub fn willneed(&self, off: usize, len: usize) -> Result<()> {
        check_range(self, "willneed", off, len)?;
        let Some(fm) = &self.r.file else {
            return Ok(());
        };
        let m = &self.h.inner;
        let first = fm.linear_page_index(PgOff::of_offset(off));
        let cap = (u64::from(m.node.frames.nr()) / 2).max(1);
        let nr = ((len / PAGE_SIZE) as u64).min(cap);
        if nr > 0 {
            filemap::page_cache_async_ra(m, &fm.mapping, first, nr, None);
        }
        Ok(())
    }

    /// Frees the memory and swap space of `[off, off+len)` (4 KiB aligned); reads of it then
    /// return zeros (anonymous) or the file's contents (file regions). Like `MADV_DONTNEED`.
    pub fn discard(&self, off: usize, len: usize) -> Result<()> {
        check_range(self, "discard", off, len)?;
        let m = &self.h.inner;
        let first = PgOff::of_offset(off);
        zap_page_range(m, &self.r, first, first + (len / PAGE_SIZE) as u64, true);
        Ok(())
    }
}

/// `[off, off+len)` must be 4 KiB aligned and inside the region.
fn check_range(r: &Region, op: &'static str, off: usize, len: usize) -> Result<()> {
    if !off.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
        return Err(RegionError::Unaligned { op, off, len }.into());
    }
    if off.checked_add(len).is_none_or(|e| e > r.len()) {
        return Err(RegionError::PastEnd {
            op,
            off,
            len,
            size: r.len(),
        }
        .into());
    }
    Ok(())
}

/// `zap_page_range`: frees every page in `[from, to)`: frames back to the allocator, slots back to the device,
/// mapped pages zapped. `count` counts the pages as discarded.
pub(crate) fn zap_page_range(m: &MmInner, r: &RegionInner, from: PgOff, to: PgOff, count: bool) {
    const CHUNK: u64 = 512;
    if r.huge && from < to {
        let n = super::huge_memory::HPAGE_PMD_NR;
        for unit in [from - from.raw() % n, (to - 1) - (to - 1).raw() % n] {
            if unit < from || unit + n > to {
                super::memory::split_huge_zero(m, r, unit);
            }
        }
    }
    let mut used = Vec::new();
    let mut start = from;
    while start < to {
        let end = (start + CHUNK).min(to);
        used.clear();
        r.pt.for_each_used(start, end, |i, _| used.push(i));
        let mut zap_from = PgOff::MAX;
        let mut zap_to = PgOff::ZERO;
        let mut freed = Vec::new();
        let mut file_pages = Vec::new();
        for &i in &used {
            loop {
                let pte = r.pt.get(i);
                let frame = match pte {
                    Pte::Frame(f) => {
                        // Page lock before pte lock, as everywhere.
                        m.node.pages[f].lock();
                        Some(f)
                    }
                    _ => None,
                };
                let mut g = r.pt.lock(i);
                let changed = match (frame, g.get()) {
                    (Some(f), cur) => cur != Pte::Frame(f),
                    (None, Pte::Frame(_)) => true,
                    _ => false,
                };
                if changed {
                    // A fault or reclaim changed the entry meanwhile: take the locks again.
                    drop(g);
                    if let Some(f) = frame {
                        m.node.pages[f].unlock();
                    }
                    continue;
                }
                match g.get() {
                    Pte::None => {}
                    Pte::Zero => {
                        m.vm.sub(Item::NrZeroPageMapped, 1);
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i.next());
                    }
                    Pte::Poison => {
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i.next());
                    }
                    Pte::HugeZero => {
                        // Whole units only (partial ones were split above).
                        if i.raw() % super::huge_memory::HPAGE_PMD_NR == 0 {
                            m.vm.sub(Item::NrThpZeroMapped, 1);
                            super::huge_memory::put_huge_zero_unit(m);
                        }
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i.next());
                    }
                    Pte::Swap(s) => {
                        if let Some(sw) = &m.swap {
                            sw.swap_free(s, &m.vm);
                        }
                    }
                    Pte::Frame(f) if m.node.pages[f].test(pg::PAGECACHE) => {
                        // A shared file page: back to the page cache, not freed. Mapped ones
                        // move back below, a run per ioctl, still locked (a store meanwhile
                        // lands in the page and moves with it; a fault waits for the lock).
                        let p = &m.node.pages[f];
                        g.set(Pte::None);
                        drop(g);
                        if p.test(pg::MAPPED) {
                            file_pages.push((i, f));
                        } else {
                            p.unlock();
                        }
                        break;
                    }
                    Pte::Frame(f) => {
                        let p = &m.node.pages[f];
                        m.node.lru.del(&m.node.pages, f, &m.vm);
                        if p.test(pg::SWAPCACHE) {
                            if let Some(sw) = &m.swap {
                                sw.swap_free(p.swap_entry(), &m.vm);
                            }
                        }
                        if p.test(pg::MAPPED) {
                            m.vm.sub(Item::NrMapped, 1);
                            zap_from = zap_from.min(i);
                            zap_to = zap_to.max(i.next());
                        } else {
                            m.vm.warn_on(
                                m.pool.slots.advise(f.offset(), PAGE_SIZE, Advice::DontNeed),
                                "MADV_DONTNEED of a pool slot",
                            );
                        }
                        m.vm.sub(Item::NrAnonPages, 1);
                        p.reset_flags(0);
                        freed.push(f);
                    }
                }
                if count && g.get() != Pte::None {
                    m.vm.inc(Item::PgDiscard);
                }
                g.set(Pte::None);
                // Keep the pte lock until the zap below would be ideal; the page lock (held for
                // frames) already keeps faults away, and None/Zero entries fault into a fresh
                // zero page either way.
                drop(g);
                break;
            }
        }
        super::rmap::unmap_file_pages_at(m, r, &file_pages);
        for &(_, f) in &file_pages {
            m.node.pages[f].unlock();
        }
        if zap_from < zap_to {
            m.vm.warn_on(
                r.view.advise(
                    zap_from.offset(),
                    (zap_to - zap_from).usize() * PAGE_SIZE,
                    Advice::DontNeed,
                ),
                "MADV_DONTNEED of view pages",
            );
        }
        super::pool::free_frames(m, &freed, false);
        start = end;
    }
}
