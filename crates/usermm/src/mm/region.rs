//! Regions: the address ranges a manager serves. Mirrors the VMA side of `mm/mmap.c`
//! (`mmap_region`, `__vm_enough_memory` for strict commit accounting, `unmap_region`) and
//! `mm/madvise.c` (`MADV_DONTNEED`/`MADV_FREE` semantics of `discard`).
//!
//! A region is a private anonymous mapping registered with the manager's userfaultfd for MISSING
//! and WP faults, plus a page table of where each page lives.

use crate::error::{Error, Result};
use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::sys::uffd::mode;
use crate::sys::{Advice, Mapping, PAGE_SIZE};
use crate::vmstat::Item;

use super::file::MapKind;
use super::filemap::{self, AddressSpace};
use super::page::{pg, RegionId, MAX_REGION_PAGES};
use super::pgtable::{PageTable, Pte};
use super::{Mm, MmHandle, MmInner};
use crate::conv::Narrow;

/// The shared part of a region.
#[derive(Debug)]
pub struct RegionInner {
    pub(crate) id: RegionId,
    pub(crate) view: Mapping,
    pub(crate) pt: PageTable,
    pub(crate) dead: AtomicBool,
    /// Next page index a sequential write run would fault (write fault-around detection).
    pub(crate) next_write: AtomicU64,
    /// Current write fault-around window (pages).
    pub(crate) write_win: AtomicU32,
    /// Page index of the last major fault (swap readahead detection).
    pub(crate) last_major: AtomicU64,
    /// Readahead pages used since the last major fault.
    pub(crate) ra_hits: AtomicU32,
    /// Last readahead window.
    pub(crate) ra_win: AtomicU32,
    /// The file a file-backed region maps.
    pub(crate) file: Option<FileMap>,
    /// Faults in 2 MiB units where aligned (anonymous regions of a `thp` manager).
    pub(crate) huge: bool,
    /// Not charged to the commit limit (`MAP_NORESERVE`, `VM_NORESERVE`).
    pub(crate) noreserve: bool,
}

/// What a file-backed region maps.
#[derive(Debug)]
pub(crate) struct FileMap {
    pub(crate) mapping: Arc<AddressSpace>,
    /// File page of region page 0.
    pub(crate) pgoff: u64,
    pub(crate) shared: bool,
    /// errseq cursor of `Region::flush`.
    pub(crate) err_cursor: AtomicU64,
}

impl RegionInner {
    pub(crate) fn npages(&self) -> u64 {
        self.pt.npages()
    }
    pub(crate) fn page_addr(&self, idx: u64) -> usize {
        self.view.addr() + idx.usize() * PAGE_SIZE
    }
}

/// A range of managed anonymous memory. It exposes raw pointers only: its memory changes under
/// the fault handler and reclaim, so no Rust reference into it is ever handed out.
pub struct Region {
    pub(crate) r: Arc<RegionInner>,
    pub(crate) h: Arc<MmHandle>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.r.view.addr()))
            .field("len", &self.r.view.len())
            .finish()
    }
}

pub(crate) fn map_anon(mm: &Mm, len: usize) -> Result<Region> {
    new_region(mm, len, None, false)
}

/// Anonymous memory not charged to the commit limit (see `Mm::map_anon_noreserve`).
pub(crate) fn map_anon_noreserve(mm: &Mm, len: usize) -> Result<Region> {
    new_region(mm, len, None, true)
}

/// A region over `mapping` from byte `offset` (see `Mm::map_file`).
pub(crate) fn map_file(
    mm: &Mm,
    mapping: Arc<AddressSpace>,
    offset: u64,
    len: usize,
    kind: MapKind,
) -> Result<Region> {
    if !offset.is_multiple_of(PAGE_SIZE as u64) {
        return Err(Error::inval(format!(
            "file offset {offset} is not a multiple of 4096; align it to the page size"
        )));
    }
    if mapping.file().is_none() {
        return Err(Error::inval(format!(
            "{} is not backed by a file; map files opened with Mm::open or a path",
            mapping.name()
        )));
    }
    mapping.users.fetch_add(1, Ordering::AcqRel);
    let fm = FileMap {
        err_cursor: AtomicU64::new(mapping.wb_err.sample()),
        pgoff: offset / PAGE_SIZE as u64,
        shared: kind == MapKind::Shared,
        mapping: mapping.clone(),
    };
    let r = new_region(mm, len, Some(fm), false)
        .inspect_err(|_| super::file::put_mapping(mm.inner(), &mapping))?;
    if kind == MapKind::Shared {
        mapping.i_mmap.lock().push(Arc::downgrade(&r.r));
    }
    Ok(r)
}

fn new_region(mm: &Mm, len: usize, file: Option<FileMap>, noreserve: bool) -> Result<Region> {
    let m = mm.inner();
    if len == 0 {
        return Err(Error::inval("region length must be greater than zero"));
    }
    let npages = (len as u64).div_ceil(PAGE_SIZE as u64);
    if npages > MAX_REGION_PAGES {
        return Err(Error::inval(format!(
            "region length {len} exceeds the maximum of 4 PiB"
        )));
    }
    // Strict commit accounting (`__vm_enough_memory` with overcommit_memory=2). Shared file
    // mappings commit nothing: their pages are backed by the file; nor do MAP_NORESERVE ones
    // (`mmap_region`: VM_NORESERVE is not accounted).
    let npages_commit = if noreserve || file.as_ref().is_some_and(|f| f.shared) {
        0
    } else {
        npages
    };
    let prev = m.committed.fetch_add(npages_commit, Ordering::AcqRel);
    let npages_all = npages;
    let npages = npages_commit;
    if !m.cfg.overcommit && prev + npages > m.commit_limit {
        m.committed.fetch_sub(npages, Ordering::AcqRel);
        return Err(Error::CommitLimit {
            requested: npages * PAGE_SIZE as u64,
            committed: prev * PAGE_SIZE as u64,
            limit: m.commit_limit * PAGE_SIZE as u64,
        });
    }
    let undo = |e: Error| {
        m.committed.fetch_sub(npages, Ordering::AcqRel);
        e
    };
    let huge = file.is_none() && m.cfg.thp;
    let align = if huge {
        super::huge_memory::HPAGE_PMD_SIZE
    } else {
        0
    };
    let view = Mapping::anon(npages_all.usize() * PAGE_SIZE, align)
        .map_err(|e| undo(Error::io(format!("mmap of {len} bytes"), e)))?;
    view.advise(0, view.len(), Advice::NoHugePage)
        .map_err(|e| undo(Error::io("madvise(NOHUGEPAGE) on a region", e)))?;
    // Not inherited by fork(2): a child would share the pages, and the kernel refuses to move
    // pages mapped twice, stalling this manager's faults and reclaim until the child exits. A
    // child touching the range gets SIGSEGV, never stale data.
    view.advise(0, view.len(), Advice::DontFork)
        .map_err(|e| undo(Error::io("madvise(DONTFORK) on a region", e)))?;
    m.uffd
        .register(view.addr(), view.len(), mode::MISSING | mode::WP)
        .map_err(|e| undo(Error::io("registering the region with userfaultfd", e)))?;
    let r = m.regions.write().insert(|id| {
        Arc::new(RegionInner {
            id,
            view,
            pt: PageTable::new(npages_all),
            dead: AtomicBool::new(false),
            next_write: AtomicU64::new(u64::MAX),
            write_win: AtomicU32::new(1),
            last_major: AtomicU64::new(u64::MAX),
            ra_hits: AtomicU32::new(0),
            ra_win: AtomicU32::new(0),
            file,
            huge,
            noreserve,
        })
    });
    Ok(Region { r, h: mm.h.clone() })
}

impl Region {
    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.r.view.as_ptr()
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> usize {
        self.r.view.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The manager serving this region.
    pub fn mm(&self) -> Mm {
        Mm { h: self.h.clone() }
    }

    /// Volatile load of the 64-bit word at byte offset `off` (8-byte aligned; panics outside the
    /// region). Faults are served by the manager's handler threads.
    pub fn read_u64(&self, off: usize) -> u64 {
        self.r.view.read_u64(off)
    }

    /// Volatile store of a 64-bit word at byte offset `off`.
    pub fn write_u64(&self, off: usize, v: u64) {
        self.r.view.write_u64(off, v)
    }

    /// Copies `buf.len()` bytes at `off` out of the region.
    pub fn read_bytes(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        self.r
            .view
            .read_bytes(off, buf)
            .map_err(|e| Error::inval(e.to_string()))
    }

    /// Copies `buf` into the region at `off`.
    pub fn write_bytes(&self, off: usize, buf: &[u8]) -> Result<()> {
        self.r
            .view
            .write_bytes(off, buf)
            .map_err(|e| Error::inval(e.to_string()))
    }

    /// Pages of this region resident now (in frames).
    pub fn resident_pages(&self) -> u64 {
        let mut n = 0;
        self.r.pt.for_each_used(0, self.r.npages(), |_, p| {
            n += matches!(p, Pte::Frame(_)) as u64
        });
        n
    }

    /// Pages of this region on the swap device now.
    pub fn swapped_pages(&self) -> u64 {
        let mut n = 0;
        self.r.pt.for_each_used(0, self.r.npages(), |_, p| {
            n += matches!(p, Pte::Swap(_)) as u64
        });
        n
    }

    /// The byte ranges `(offset, len)` of this region whose pages hold data (resident or on the
    /// swap device), merged and in address order; everything else reads as zeros. A snapshot
    /// (unlocked reads): used to copy an address space for a fork(2) child without touching
    /// the pages that were never written.
    pub fn populated_ranges(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = Vec::new();
        self.r.pt.for_each_used(0, self.r.npages(), |i, p| {
            if matches!(p, Pte::Frame(_) | Pte::Swap(_)) {
                let off = i.usize() * PAGE_SIZE;
                match v.last_mut() {
                    Some((o, l)) if *o + *l == off => *l += PAGE_SIZE,
                    _ => v.push((off, PAGE_SIZE)),
                }
            }
        });
        v
    }

    /// Writes back the dirty pages of `[off, off+len)` of a shared file region and fdatasyncs
    /// the file (`msync(MS_SYNC)`), returning a writeback error once per region (errseq); the
    /// pages that failed stay dirty. Anonymous and private regions have nothing to write.
    pub fn flush(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(Error::inval(format!(
                "flush range {off:#x}+{len:#x} goes past the end of the region ({:#x} bytes)",
                self.len()
            )));
        }
        let Some(fm) = self.r.file.as_ref().filter(|f| f.shared) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let first = fm.pgoff + (off / PAGE_SIZE) as u64;
        let last = fm.pgoff + ((off + len - 1) / PAGE_SIZE) as u64;
        filemap::sync_range(&self.h.inner, &fm.mapping, first, last, &fm.err_cursor)
    }

    /// Frees the memory and swap space of `[off, off+len)` (4 KiB aligned); reads of it then
    /// return zeros (anonymous) or the file's contents (file regions). Like `MADV_DONTNEED`.
    pub fn discard(&self, off: usize, len: usize) -> Result<()> {
        if !off.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(Error::inval(format!(
                "discard range {off:#x}+{len:#x} is not 4 KiB aligned; align offset and length to 4096"
            )));
        }
        if off.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(Error::inval(format!(
                "discard range {off:#x}+{len:#x} goes past the end of the region ({:#x} bytes)",
                self.len()
            )));
        }
        let m = &self.h.inner;
        let first = (off / PAGE_SIZE) as u64;
        release_range(m, &self.r, first, first + (len / PAGE_SIZE) as u64, true);
        Ok(())
    }
}

/// Frees every page in `[from, to)`: frames back to the allocator, slots back to the device,
/// mapped pages zapped. `count` counts the pages as discarded.
pub(crate) fn release_range(m: &MmInner, r: &RegionInner, from: u64, to: u64, count: bool) {
    const CHUNK: u64 = 512;
    if r.huge && from < to {
        let n = super::huge_memory::HPAGE_PMD_NR;
        for unit in [from - from % n, (to - 1) - (to - 1) % n] {
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
        let mut zap_from = u64::MAX;
        let mut zap_to = 0;
        let mut freed = Vec::new();
        for &i in &used {
            loop {
                let pte = r.pt.get(i);
                let frame = match pte {
                    Pte::Frame(f) => {
                        // Page lock before pte lock, as everywhere.
                        m.pages[f].lock();
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
                        m.pages[f].unlock();
                    }
                    continue;
                }
                match g.get() {
                    Pte::None => {}
                    Pte::Zero => {
                        m.vm.sub(Item::NrZeroPageMapped, 1);
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i + 1);
                    }
                    Pte::Poison => {
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i + 1);
                    }
                    Pte::HugeZero => {
                        // Whole units only (partial ones were split above).
                        if i % super::huge_memory::HPAGE_PMD_NR == 0 {
                            m.vm.sub(Item::NrThpZeroMapped, 1);
                            super::huge_memory::put_huge_zero_unit(m);
                        }
                        zap_from = zap_from.min(i);
                        zap_to = zap_to.max(i + 1);
                    }
                    Pte::Swap(s) => {
                        if let Some(sw) = &m.swap {
                            sw.swap_free(s, &m.vm);
                        }
                    }
                    Pte::Frame(f) if m.pages[f].test(pg::PAGECACHE) => {
                        // A shared file page: back to the page cache, not freed.
                        let p = &m.pages[f];
                        if p.test(pg::MAPPED) {
                            super::rmap::unmap_file_page_at(m, r, i, f);
                        }
                        g.set(Pte::None);
                        drop(g);
                        p.unlock();
                        break;
                    }
                    Pte::Frame(f) => {
                        let p = &m.pages[f];
                        m.lru.del(&m.pages, f, &m.vm);
                        if p.test(pg::SWAPCACHE) {
                            if let Some(sw) = &m.swap {
                                sw.swap_free(p.swap_entry(), &m.vm);
                            }
                        }
                        if p.test(pg::MAPPED) {
                            m.vm.sub(Item::NrMapped, 1);
                            zap_from = zap_from.min(i);
                            zap_to = zap_to.max(i + 1);
                        } else {
                            let _ = m.pool.advise(f.offset(), PAGE_SIZE, Advice::DontNeed);
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
        if zap_from < zap_to {
            let _ = r.view.advise(
                zap_from.usize() * PAGE_SIZE,
                (zap_to - zap_from).usize() * PAGE_SIZE,
                Advice::DontNeed,
            );
        }
        m.frames.free(&freed);
        m.vm.add(Item::Pgfree, freed.len() as u64);
        start = end;
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let m = &self.h.inner;
        self.r.dead.store(true, Ordering::Release);
        m.regions.write().remove_addr(self.r.view.addr());
        release_range(m, &self.r, 0, self.r.npages(), false);
        let _ = m.uffd.unregister(self.r.view.addr(), self.r.view.len());
        m.regions.write().remove_id(self.r.id);
        let shared = self.r.file.as_ref().is_some_and(|f| f.shared);
        if !shared && !self.r.noreserve {
            m.committed.fetch_sub(self.r.npages(), Ordering::AcqRel);
        }
        if let Some(fm) = &self.r.file {
            super::file::put_mapping(m, &fm.mapping);
        }
    }
}
