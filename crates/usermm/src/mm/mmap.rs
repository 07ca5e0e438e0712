//! Creating and tearing down regions. Mirrors `mm/mmap.c` (`mmap_region`, `__vm_enough_memory`
//! for strict commit accounting, `unmap_region` on drop) and `mm/msync.c` (`Region::flush`).

use crate::error::{Error, RegionError, Result};
use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::sys::uffd::mode;
use crate::sys::{Advice, Mapping, PAGE_SIZE};
use std::path::Path;

use super::file::{put_mapping, CachedFile};
use super::filemap;
use super::fs::AddressSpace;
use super::madvise::zap_page_range;
use super::page::MAX_REGION_PAGES;
use super::page::{pg, Owner, PgOff};
use super::pgtable::PageTable;
use super::pgtable::Pte;
use super::region::{AccessPattern, FileMap, MapKind, Region, RegionInner};
use super::Mm;
use crate::conv::Narrow;
use crate::vmstat::Item;

pub(crate) fn map_anon(mm: &Mm, len: usize) -> Result<Region> {
    new_region(mm, len, None, false, None)
}

/// Anonymous memory not charged to the commit limit (see `Mm::map_anon_noreserve`).
pub(crate) fn map_anon_noreserve(mm: &Mm, len: usize) -> Result<Region> {
    new_region(mm, len, None, true, None)
}

/// An existing private anonymous mapping made a region in place, its resident pages charged
/// and put on the LRU lists as if this manager had faulted them in (see `Mm::adopt_anon`).
pub(crate) fn adopt_anon(mm: &Mm, addr: usize, len: usize, noreserve: bool) -> Result<Region> {
    let r = new_region(mm, len, None, noreserve, Some(addr))?;
    let m = mm.inner();
    let present =
        r.r.view
            .resident(0, r.r.view.len())
            .map_err(|e| Error::io("mincore on an adopted range", e))?;
    let idxs: Vec<PgOff> = (0..present.len())
        .filter(|&i| present[i])
        .map(|i| PgOff::new(i as u64))
        .collect();
    for chunk in idxs.chunks(super::pool::BOUNCE_PAGES) {
        let mut frames = Vec::with_capacity(chunk.len());
        while frames.len() < chunk.len() {
            let before = frames.len();
            if !super::page_alloc::alloc_pages(m, chunk.len() - before, &mut frames) {
                super::pool::free_frames(m, &frames, false);
                return Err(Error::io(
                    "adopting a range: no frame for its pages",
                    std::io::Error::from(std::io::ErrorKind::OutOfMemory),
                ));
            }
        }
        let flags = pg::ANON_MAPPED;
        for (&idx, &f) in chunk.iter().zip(&frames) {
            // The page is in the view already: a mapped page's pool slot is empty.
            super::pool::empty_slot(m, f);
            let mut g = r.r.pt.lock(idx);
            m.node.pages[f].init(Owner::Anon(r.r.id, idx), flags);
            g.set(Pte::Frame(f));
        }
        m.node.lru.add(&m.node.pages, &frames, &m.vm);
        let n = frames.len() as u64;
        m.vm.add(Item::Pgalloc, n);
        m.vm.add(Item::NrAnonPages, n);
        m.vm.add(Item::NrMapped, n);
        m.node.note_resident();
    }
    Ok(r)
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
        return Err(RegionError::FileOffset { offset }.into());
    }
    if !mapping.is_file() {
        return Err(RegionError::NotFileBacked {
            name: mapping.name(),
        }
        .into());
    }
    mapping.users.fetch_add(1, Ordering::AcqRel);
    let fm = FileMap {
        err_cursor: AtomicU64::new(mapping.wb_err.sample()),
        mmap_miss: AtomicU32::new(0),
        ra_next: AtomicU64::new(u64::MAX),
        pgoff: PgOff::of_byte(offset),
        shared: kind == MapKind::Shared,
        mapping: mapping.clone(),
    };
    let r = new_region(mm, len, Some(fm), false, None)
        .inspect_err(|_| put_mapping(mm.inner(), &mapping))?;
    mapping.i_mmap.lock().push(r.r.id);
    Ok(r)
}

/// `adopt`: the view is the existing mapping at that address (`Mapping::adopt`), else a new
/// one where the kernel puts it.
fn new_region(
    mm: &Mm,
    len: usize,
    file: Option<FileMap>,
    noreserve: bool,
    adopt: Option<usize>,
) -> Result<Region> {
    let m = mm.inner();
    if len == 0 {
        return Err(RegionError::ZeroLength.into());
    }
    let npages = (len as u64).div_ceil(PAGE_SIZE as u64);
    if npages > MAX_REGION_PAGES {
        return Err(RegionError::TooLong { len }.into());
    }
    // Strict commit accounting (`__vm_enough_memory` with overcommit_memory=2). Shared file
    // mappings commit nothing: their pages are backed by the file; nor do MAP_NORESERVE ones
    // (`mmap_region`: VM_NORESERVE is not accounted).
    let npages_commit = if noreserve || file.as_ref().is_some_and(|f| f.shared) {
        0
    } else {
        npages
    };
    m.mm.vm_enough_memory(npages_commit, m.cfg.overcommit)?;
    let npages_all = npages;
    let npages = npages_commit;
    let undo = |e: Error| {
        m.mm.vm_unacct_memory(npages);
        e
    };
    let huge = file.is_none() && m.cfg.thp && adopt.is_none();
    let align = if huge {
        super::huge_memory::HPAGE_PMD_SIZE
    } else {
        0
    };
    let view = match adopt {
        Some(addr) => Mapping::adopt(addr, npages_all.usize() * PAGE_SIZE),
        None => Mapping::anon(npages_all.usize() * PAGE_SIZE, align),
    }
    .map_err(|e| undo(Error::io(format!("mmap of {len} bytes"), e)))?;
    view.advise(0, view.len(), Advice::NoHugePage)
        .map_err(|e| undo(Error::io("madvise(NOHUGEPAGE) on a region", e)))?;
    // Not inherited by fork(2): a child would share the pages, and the kernel refuses to move
    // pages mapped twice, stalling this manager's faults and reclaim until the child exits. A
    // child touching the range gets SIGSEGV, never stale data, after a line saying why
    // (usermm-sys forkguard, which the DontFork advice registers the range with).
    view.advise(0, view.len(), Advice::DontFork)
        .map_err(|e| undo(Error::io("madvise(DONTFORK) on a region", e)))?;
    m.mm.uffd
        .register(view.addr(), view.len(), mode::MISSING | mode::WP)
        .map_err(|e| undo(Error::io("registering the region with userfaultfd", e)))?;
    let r = m.mm.regions.write().insert(|id| {
        Arc::new(RegionInner {
            id,
            view,
            pt: PageTable::new(npages_all),
            dead: AtomicBool::new(false),
            writes: Default::default(),
            pattern: AtomicU32::new(AccessPattern::Normal.code()),
            last_major: AtomicU64::new(u64::MAX),
            ra_hits: AtomicU32::new(0),
            ra_win: AtomicU32::new(0),
            swap_stream: Default::default(),
            file,
            huge,
            noreserve,
            verdicts: Default::default(),
        })
    });
    Ok(Region { r, h: mm.h.clone() })
}

impl Mm {
    /// Maps `len` bytes of the file at `path` from `offset` (a multiple of 4 KiB). Shared: the
    /// region shows the page cache and stores reach the file through writeback. The file is not
    /// extended: as with mmap(2), touching a page wholly past its end raises SIGBUS until the
    /// file grows (`CachedFile::set_len` or a write). Private: copy-on-write against the file.
    pub fn map_file(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        len: usize,
        kind: MapKind,
    ) -> Result<Region> {
        let a = super::file::iget(self.inner(), path.as_ref(), false)?;
        let r = map_file(self, a.clone(), offset, len, kind);
        put_mapping(self.inner(), &a);
        r
    }
}

impl CachedFile {
    /// Maps `len` bytes of this file from `offset` (see [`Mm::map_file`]).
    pub fn map(&self, offset: u64, len: usize, kind: MapKind) -> Result<Region> {
        let mm = Mm { h: self.h.clone() };
        map_file(&mm, self.mapping.clone(), offset, len, kind)
    }

    /// The address space (tests and benchmarks inspect marks and pages).
    pub fn mapping(&self) -> &Arc<AddressSpace> {
        &self.mapping
    }
}

impl Region {
    /// Writes back the dirty pages of `[off, off+len)` of a shared file region and fdatasyncs
    /// the file (`msync(MS_SYNC)`), returning a writeback error once per region (errseq); the
    /// pages that failed stay dirty. Anonymous and private regions have nothing to write.
    pub fn flush(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(RegionError::PastEnd {
                op: "flush",
                off,
                len,
                size: self.len(),
            }
            .into());
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
}

impl Drop for Region {
    fn drop(&mut self) {
        let m = &self.h.inner;
        self.r.dead.store(true, Ordering::Release);
        m.mm.regions.write().remove_addr(self.r.view.addr());
        zap_page_range(m, &self.r, PgOff::ZERO, self.r.end(), false);
        m.vm.warn_on(
            m.mm.uffd.unregister(self.r.view.addr(), self.r.view.len()),
            "UFFDIO_UNREGISTER of a region",
        );
        m.mm.regions.write().remove_id(self.r.id);
        let shared = self.r.file.as_ref().is_some_and(|f| f.shared);
        if !shared && !self.r.noreserve {
            m.mm.vm_unacct_memory(self.r.npages());
        }
        if let Some(fm) = &self.r.file {
            put_mapping(m, &fm.mapping);
        }
    }
}
