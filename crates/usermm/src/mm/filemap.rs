//! The page cache. Mirrors `mm/filemap.c` (`pagecache_get_page` with `FGP_*` flags and its
//! wrappers, `add_to_page_cache_lru`, `__delete_from_page_cache`, `generic_file_buffered_read`,
//! `generic_perform_write`, `filemap_write_and_wait_range`), the tag half of
//! `mm/page-writeback.c` (`__set_page_dirty_nobuffers`, `clear_page_dirty_for_io`,
//! `__test_set_page_writeback`, `test_clear_page_writeback`, `write_cache_pages`, a disk
//! file's `a_ops->writepages`). The `address_space` type and its operations trait are in
//! fs.rs, truncation in truncate.rs, in-memory files' swap in shmem.rs, the writeback error
//! cursor in errseq.rs. Also the readahead I/O: `do_page_cache_readahead` (synchronous, the
//! `page_cache_ra_unbounded` of a window) and `page_cache_async_ra`, which queues a window for
//! the `usermm-ra` worker (the queue and the window policies are in readahead.rs).
//!
//! A page-cache page's bytes live in its frame's pool slot, or, while PG_mapped, in the view of
//! the file region that maps it (shared, or private until its first store there); every access to the bytes holds the page lock, because
//! mapping and unmapping move them.

use std::fs::File;
use std::io;

use crate::error::{Error, Result};
use crate::settings::Switch;

use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use crate::sys::PAGE_SIZE;
use crate::vmstat::Item;

use super::fs::{AddressSpace, AddressSpaceOps, Entry, Host, LockSite};
use super::lru::mark_page_accessed;
use super::mmzone::Node;
use super::page::{pg, Owner, Pfn, PgOff};
use super::radix_tree::Mark;
use super::region::RegionInner;
use super::{page_alloc, page_writeback, pool, MmInner};
use crate::conv::Narrow;

/// `FGP_*` flags of [`pagecache_get_page`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fgp(pub u32);

impl Fgp {
    /// Mark the page accessed: an existing page through `mark_page_accessed`, a new one with a
    /// plain store of PG_referenced before it is visible (seed 002).
    pub const ACCESSED: Fgp = Fgp(1 << 0);
    /// Return the page locked.
    pub const LOCK: Fgp = Fgp(1 << 1);
    /// Create the page if it is not cached.
    pub const CREAT: Fgp = Fgp(1 << 2);
    /// The caller will write the page (kept for the write_begin semantics).
    pub const WRITE: Fgp = Fgp(1 << 3);
    /// Never block: fail instead of waiting for a lock or reclaiming.
    pub const NOWAIT: Fgp = Fgp(1 << 5);

    pub fn has(self, f: Fgp) -> bool {
        self.0 & f.0 == f.0
    }
}

impl std::ops::BitOr for Fgp {
    type Output = Fgp;
    fn bitor(self, o: Fgp) -> Fgp {
        Fgp(self.0 | o.0)
    }
}

/// `get_page`.
fn get_page(node: &Node, f: Pfn) {
    node.pages[f].get_page();
}

/// `put_page`: drops a reference taken by a lookup.
pub fn put_page(node: &Node, f: Pfn) {
    node.pages[f].put_page();
}

/// `find_get_entry`: the entry at `index`, with a reference on a page.
pub(crate) fn find_get_entry(m: &MmInner, mapping: &AddressSpace, index: PgOff) -> Option<Entry> {
    let t = mapping.lock_tree(&m.vm, LockSite::FindGetPage);
    let e = t.get(index.raw()).map(Entry::decode)?;
    if let Entry::Page(f) = e {
        get_page(&m.node, f);
    }
    Some(e)
}

/// `lock_page` with the page-still-here check: locks frame `f` and returns true if it is still
/// the page at `index` of `mapping` (false: it was truncated or reclaimed meanwhile; unlocked).
pub(crate) fn lock_page_in(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
    nowait: bool,
) -> bool {
    let p = &m.node.pages[f];
    if nowait {
        if !p.trylock() {
            return false;
        }
    } else {
        p.lock();
    }
    if p.owner() == Owner::Cache(mapping.id, index) {
        true
    } else {
        p.unlock();
        false
    }
}

/// `pagecache_get_page`: looks up the page at `index`, optionally locking it, marking it
/// accessed and creating it. A created page is not up to date: the caller fills it. Returns the
/// frame with a reference held (drop it with [`put_page`]); `Ok(None)` when absent and not
/// created, or when NOWAIT would have to wait. An in-memory file's swapped page is read back.
pub fn pagecache_get_page(
    m: &MmInner,
    mapping: &AddressSpace,
    index: PgOff,
    fgp: Fgp,
) -> Result<Option<Pfn>> {
    loop {
        match find_get_entry(m, mapping, index) {
            Some(Entry::Page(f)) => {
                if fgp.has(Fgp::LOCK) && !lock_page_in(m, mapping, f, index, fgp.has(Fgp::NOWAIT)) {
                    put_page(&m.node, f);
                    if fgp.has(Fgp::NOWAIT) {
                        return Ok(None);
                    }
                    continue;
                }
                if fgp.has(Fgp::ACCESSED) {
                    mark_page_accessed(&*m.node.lru, &m.node.pages, f, &m.vm);
                }
                return Ok(Some(f));
            }
            Some(Entry::Swap(slot)) => {
                if fgp.has(Fgp::NOWAIT) {
                    return Ok(None);
                }
                mapping.a_ops.swapin(m, mapping, index, slot)?;
                continue;
            }
            None => {}
        }
        if !fgp.has(Fgp::CREAT) {
            return Ok(None);
        }
        let mut frames = Vec::with_capacity(1);
        if fgp.has(Fgp::NOWAIT) {
            if m.node.nr_free() <= m.node.wmark.min || m.node.alloc_frames(1, &mut frames) == 0 {
                return Ok(None);
            }
            m.node.note_resident();
        } else if !page_alloc::alloc_pages(m, 1, &mut frames) {
            return Err(Error::io(
                out_of_memory(m, mapping),
                io::Error::from_raw_os_error(libc::ENOMEM),
            ));
        }
        let f = frames[0];
        // The new page is private until inserted: its flags are set with plain stores, including
        // PG_referenced under FGP_ACCESSED (seed 002's __SetPageReferenced).
        let mut flags = pg::LOCKED | pg::PAGECACHE;
        if mapping.is_memory() {
            flags |= pg::SWAPBACKED;
        }
        if fgp.has(Fgp::ACCESSED) && m.cfg.settings.is_new(Switch::AccessedInit) {
            // init_page_accessed.
            flags |= pg::REFERENCED;
            m.vm.inc(Item::InitPageAccessed);
        }
        let p = &m.node.pages[f];
        let pooled = p.test(pg::POOLED);
        p.init(
            Owner::Cache(mapping.id, index),
            flags | if pooled { pg::POOLED } else { 0 },
        );
        if !pool::ensure_slot(m, f) {
            pool::free_frames(m, &[f], false);
            return Err(Error::io(
                format!("page cache of {}", mapping.name()),
                io::Error::other("could not populate a frame's pool slot"),
            ));
        }
        if !add_to_page_cache_lru(m, mapping, f, index) {
            // Raced with another creator: use theirs.
            p.reset_flags(pg::POOLED);
            pool::recycle_frames(m, &[f]);
            continue;
        }
        get_page(&m.node, f);
        if !fgp.has(Fgp::LOCK) {
            p.unlock();
        }
        return Ok(Some(f));
    }
}

/// `add_to_page_cache_lru`: inserts locked frame `f` at `index`; false if the index is taken.
pub(super) fn add_to_page_cache_lru(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
) -> bool {
    // A frame's new page has no read hash until its read records one.
    pool::take_read_hash(m, f);
    {
        let mut t = mapping.lock_tree(&m.vm, LockSite::AddToPageCache);
        if t.get(index.raw()).is_some() {
            return false;
        }
        t.insert(index.raw(), Entry::Page(f).encode());
    }
    mapping.nrpages.fetch_add(1, Ordering::Relaxed);
    m.vm.inc(Item::NrFilePages);
    if mapping.is_memory() {
        m.vm.inc(Item::NrShmem);
    }
    if super::workingset::workingset_refault(m, mapping, index, !mapping.is_memory()) {
        m.node.pages[f].set(pg::ACTIVE);
    }
    m.node.lru.add(&m.node.pages, &[f], &m.vm);
    true
}

/// `find_get_page`.
pub fn find_get_page(m: &MmInner, mapping: &AddressSpace, index: PgOff) -> Result<Option<Pfn>> {
    pagecache_get_page(m, mapping, index, Fgp(0))
}

/// `find_lock_page`.
pub fn find_lock_page(m: &MmInner, mapping: &AddressSpace, index: PgOff) -> Result<Option<Pfn>> {
    pagecache_get_page(m, mapping, index, Fgp::LOCK)
}

/// `find_or_create_page`.
#[cfg(any(test, feature = "testing"))]
pub fn find_or_create_page(
    m: &MmInner,
    mapping: &AddressSpace,
    index: PgOff,
) -> Result<Option<Pfn>> {
    pagecache_get_page(m, mapping, index, Fgp::LOCK | Fgp::ACCESSED | Fgp::CREAT)
}

/// `grab_cache_page_nowait`.
#[cfg(any(test, feature = "testing"))]
pub fn grab_cache_page_nowait(
    m: &MmInner,
    mapping: &AddressSpace,
    index: PgOff,
) -> Result<Option<Pfn>> {
    pagecache_get_page(m, mapping, index, Fgp::LOCK | Fgp::CREAT | Fgp::NOWAIT)
}

/// `grab_cache_page_write_begin`: LOCK|WRITE|CREAT, plus ACCESSED with the new behaviour of
/// seed 002 (the old one marks the page accessed after the copy, in write_end).
pub fn grab_cache_page_write_begin(
    m: &MmInner,
    mapping: &AddressSpace,
    index: PgOff,
) -> Result<Option<Pfn>> {
    let mut fgp = Fgp::LOCK | Fgp::WRITE | Fgp::CREAT;
    if m.cfg.settings.is_new(Switch::AccessedInit) {
        fgp = fgp | Fgp::ACCESSED;
    }
    pagecache_get_page(m, mapping, index, fgp)
}

/// Where a locked page-cache page's bytes are.
pub(crate) enum Loc {
    Pool(usize),
    View(Arc<RegionInner>, usize),
}

/// The location of locked frame `f`'s bytes.
pub(crate) fn page_loc(m: &MmInner, f: Pfn) -> Loc {
    let p = &m.node.pages[f];
    if p.test(pg::MAPPED) {
        let (rid, idx) = p.mapped_at();
        if let Some(r) = m.mm.region(rid) {
            if idx < r.end() {
                return Loc::View(r, idx.offset());
            }
        }
        log::error!("frame {f} is mapped in region {rid} page {idx}, which is gone");
    }
    Loc::Pool(f.offset())
}

/// Copies bytes out of locked page `f` at `off`.
pub(crate) fn copy_from_page(m: &MmInner, f: Pfn, off: usize, buf: &mut [u8]) {
    let r = match page_loc(m, f) {
        Loc::Pool(o) => m.pool.slots.read_bytes(o + off, buf),
        Loc::View(r, o) => r.view.read_bytes(o + off, buf),
    };
    if let Err(e) = r {
        log::error!("copy out of frame {f}: {e}");
    }
}

/// Copies `buf` into locked page `f` at `off`.
/// A page mapped write-protected (clean) in a shared region is unprotected first and dirtied:
/// the store would otherwise be a write-protect fault on a page whose lock the caller holds. A
/// page mapped in a private region is taken back from it first (that region must not be able
/// to store into the cache page; its next access maps the new contents).
pub(crate) fn copy_to_page(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    f: Pfn,
    off: usize,
    buf: &[u8],
) {
    if matches!(page_loc(m, f), Loc::View(r, _) if r.file.as_ref().is_some_and(|fm| !fm.shared)) {
        super::rmap::unmap_file_page(m, f);
    }
    let r = match page_loc(m, f) {
        Loc::Pool(o) => m.pool.slots.write_bytes(o + off, buf),
        Loc::View(r, o) => {
            let p = &m.node.pages[f];
            if p.test(pg::WP) {
                if let Err(e) =
                    m.mm.uffd
                        .writeprotect(r.view.addr() + o, PAGE_SIZE, false, true)
                {
                    log::error!("unprotecting a mapped file page to write it: {e}");
                    return;
                }
                p.clear(pg::WP);
                set_page_dirty(m, mapping, f);
            }
            r.view.write_bytes(o + off, buf)
        }
    };
    if let Err(e) = r {
        log::error!("copy into frame {f}: {e}");
    }
}

/// `set_page_dirty` for a locked page of `mapping`: the DIRTY flag, the tree's DIRTY mark, the
/// dirty counters and the mapping's place on its flusher's dirty list. In-memory files have no
/// writeback: only the flag (`__set_page_dirty_no_writeback`).
pub fn set_page_dirty(m: &MmInner, mapping: &Arc<AddressSpace>, f: Pfn) {
    let p = &m.node.pages[f];
    // Its contents may change from here on: the hash its read recorded no longer holds.
    pool::take_read_hash(m, f);
    if p.test_set(pg::DIRTY) {
        return;
    }
    if mapping.is_memory() {
        return;
    }
    let index = p.index();
    mapping
        .lock_tree(&m.vm, LockSite::SetPageDirty)
        .set_mark(index.raw(), Mark::Dirty);
    m.vm.inc(Item::NrDirty);
    m.vm.inc(Item::NrDirtied);
    page_writeback::account_mapping_dirtied(m, mapping);
}

/// The first half of `clear_page_dirty_for_io` for a batch of locked pages: write-protects
/// the ones mapped writable, one `UFFDIO_WRITEPROTECT` per run of pages consecutive in one
/// view (one TLB flush per run, not per page: with the writer running on the other vCPU each
/// flush is an IPI). A run that fails is left to the per-page call, which retries and logs.
fn write_protect_mapped(m: &MmInner, locked: &[(PgOff, Pfn)]) {
    let views: Vec<Option<(Arc<RegionInner>, usize)>> = locked
        .iter()
        .map(|&(_, f)| {
            let p = &m.node.pages[f];
            if !p.test(pg::MAPPED) || p.test(pg::WP) {
                return None;
            }
            match page_loc(m, f) {
                Loc::View(r, o) => Some((r, o)),
                Loc::Pool(_) => None,
            }
        })
        .collect();
    let ks: Vec<usize> = (0..locked.len()).collect();
    let next = |a: usize, b: usize| match (&views[a], &views[b]) {
        (Some((ra, oa)), Some((rb, ob))) => Arc::ptr_eq(ra, rb) && oa + PAGE_SIZE == *ob,
        _ => false,
    };
    for run in pool::runs(&ks, next) {
        let Some((r, o)) = &views[run.start] else {
            continue;
        };
        if run.len() < 2 {
            continue;
        }
        let len = run.len() * PAGE_SIZE;
        if m.mm
            .uffd
            .writeprotect(r.view.addr() + o, len, true, true)
            .is_ok()
        {
            for k in run {
                m.node.pages[locked[k].1].set(pg::WP);
            }
        }
    }
}

/// `clear_page_dirty_for_io`: write-protects the page where it is mapped (so the next store is
/// seen and redirties it), then clears PG_dirty. The DIRTY mark stays until writeback starts.
pub(crate) fn clear_page_dirty_for_io(m: &MmInner, mapping: &AddressSpace, f: Pfn) -> bool {
    let p = &m.node.pages[f];
    if p.test(pg::MAPPED) && !p.test(pg::WP) {
        if let Loc::View(r, o) = page_loc(m, f) {
            match m
                .mm
                .uffd
                .writeprotect(r.view.addr() + o, PAGE_SIZE, true, true)
            {
                Ok(()) => p.set(pg::WP),
                Err(e) => {
                    log::error!("write-protecting a mapped file page for writeback: {e}");
                    return false;
                }
            }
        }
    }
    if p.test_clear(pg::DIRTY) {
        if !mapping.is_memory() {
            m.vm.sub(Item::NrDirty, 1);
        }
        true
    } else {
        false
    }
}

/// `__test_set_page_writeback`: PG_writeback, and unless the mapping has NO_WRITEBACK_TAGS, the
/// WRITEBACK mark set and the DIRTY (if clean now) and TOWRITE marks cleared under the tree lock.
pub(crate) fn set_page_writeback(m: &MmInner, mapping: &AddressSpace, f: Pfn, index: PgOff) {
    let p = &m.node.pages[f];
    if p.test_set(pg::WRITEBACK) {
        return;
    }
    if mapping.use_writeback_tags() {
        let mut t = mapping.lock_tree(&m.vm, LockSite::SetPageWriteback);
        t.set_mark(index.raw(), Mark::Writeback);
        if !p.test(pg::DIRTY) {
            t.clear_mark(index.raw(), Mark::Dirty);
        }
        t.clear_mark(index.raw(), Mark::Towrite);
    }
    m.vm.inc(Item::NrWriteback);
}

/// `test_clear_page_writeback` (`end_page_writeback`).
pub(crate) fn end_page_writeback(m: &MmInner, mapping: &AddressSpace, f: Pfn, index: PgOff) {
    let p = &m.node.pages[f];
    if !p.test_clear(pg::WRITEBACK) {
        return;
    }
    if mapping.use_writeback_tags() {
        mapping
            .lock_tree(&m.vm, LockSite::EndPageWriteback)
            .clear_mark(index.raw(), Mark::Writeback);
    }
    m.vm.sub(Item::NrWriteback, 1);
    m.vm.inc(Item::NrWritten);
}

/// One contiguous transfer of a run of pages: the page offsets `offs` in one location (the
/// pool's slots, or one region's view), written to the file from `file_off`.
struct SubRun {
    loc: Loc,
    offs: Vec<usize>,
    file_off: u64,
}

impl SubRun {
    fn mem<'a>(&'a self, m: &'a MmInner) -> &'a crate::sys::Mapping {
        match &self.loc {
            Loc::Pool(_) => &m.pool.slots,
            Loc::View(r, _) => &r.view,
        }
    }
    fn len(&self) -> u64 {
        (self.offs.len() * PAGE_SIZE) as u64
    }
}

/// Splits locked pages `run` (consecutive indices) into transfers by where their bytes are.
fn plan_run(m: &MmInner, run: &[(PgOff, Pfn)]) -> Vec<SubRun> {
    let mut subs = Vec::new();
    let mut k = 0;
    while k < run.len() {
        let loc = page_loc(m, run[k].1);
        let mut offs = Vec::new();
        let mut e = k;
        while e < run.len() {
            let l = page_loc(m, run[e].1);
            match (&loc, &l) {
                (Loc::Pool(_), Loc::Pool(o)) => offs.push(*o),
                (Loc::View(a, _), Loc::View(b, o)) if a.id == b.id => offs.push(*o),
                _ => break,
            }
            e += 1;
        }
        subs.push(SubRun {
            loc,
            offs,
            file_off: run[k].0.byte_offset(),
        });
        k = e;
    }
    subs
}

/// Writes locked, dirty-for-io runs of pages (each of consecutive indices) to the mapping's
/// file in as few calls as their locations allow, extending the file only to i_size; one
/// result per run. With `file_io=io_uring` (where available) every transfer of the batch is in
/// flight at once (`sys::ring`); otherwise one `pwritev` per transfer in turn.
fn write_runs(
    m: &MmInner,
    mapping: &AddressSpace,
    runs: &[&[(PgOff, Pfn)]],
) -> Vec<io::Result<()>> {
    let Some(file) = mapping.file() else {
        return runs
            .iter()
            .map(|_| {
                if mapping.is_file() {
                    // Closed: it had no dirty page at its last close and nothing can dirty one
                    // since.
                    Err(closed_error(mapping))
                } else {
                    Ok(())
                }
            })
            .collect();
    };
    let file = &*file;
    let direct = matches!(mapping.host, Host::File { direct: true, .. });
    let end = runs
        .iter()
        .map(|r| r[r.len() - 1].0.next().byte_offset())
        .max()
        .unwrap_or(0);
    let _eof = (end > mapping.size.load(Ordering::Acquire)).then(|| mapping.eof_lock.lock());
    let plans: Vec<Vec<SubRun>> = runs.iter().map(|r| plan_run(m, r)).collect();
    m.vm.add(Item::FileWriteRuns, runs.len() as u64);
    let mut res: Vec<io::Result<()>> = Vec::with_capacity(runs.len());
    let uring = m.cfg.settings.is_new(Switch::FileIo) && crate::sys::ring::available();
    if uring {
        let ios: Vec<crate::sys::ring::PageIo<'_>> = plans
            .iter()
            .flatten()
            .map(|s| crate::sys::ring::PageIo {
                mem: s.mem(m),
                pages: &s.offs,
                file_off: s.file_off,
            })
            .collect();
        let mut out = crate::sys::ring::write_pages(file, &ios).into_iter();
        for plan in &plans {
            let mut first = Ok(());
            for r in out.by_ref().take(plan.len()) {
                if let (Ok(()), Err(e)) = (&first, r) {
                    first = Err(io::Error::from(e));
                }
            }
            res.push(first);
        }
        m.vm.add(Item::FileIoUring, ios.len() as u64);
    } else {
        for plan in &plans {
            res.push(
                plan.iter()
                    .try_for_each(|s| s.mem(m).pwrite_pages(file, s.file_off, &s.offs))
                    .map_err(io::Error::from),
            );
        }
    }
    for (k, plan) in plans.iter().enumerate() {
        if res[k].is_err() {
            continue;
        }
        if !direct {
            for s in plan {
                if let Err(e) = crate::sys::sync_file_range_wait(file, s.file_off, s.len()) {
                    res[k] = Err(e.into());
                    break;
                }
                m.vm.warn_on(
                    crate::sys::fadvise_dontneed(file, s.file_off, s.len()),
                    "dropping written pages from the kernel's page cache",
                );
            }
        }
        if res[k].is_ok() {
            m.vm.add(
                Item::Pgpgout,
                runs[k].len() as u64 * (PAGE_SIZE as u64 / 1024),
            );
        }
    }
    // Whole pages were written: cut the file back to i_size if the last one reached past it
    // (under eof_lock, so i_size cannot grow meanwhile).
    let size = mapping.size.load(Ordering::Acquire);
    if end > size {
        let cut = file.metadata().and_then(|md| {
            if md.len() > size {
                file.set_len(size)
            } else {
                Ok(())
            }
        });
        if let Err(e) = cut {
            for r in res.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(io::Error::new(e.kind(), e.to_string()));
            }
        }
    }
    res
}

/// `batch` (sorted by index) cut into runs of consecutive indices, at most 512 pages each.
fn index_runs(batch: &[(PgOff, Pfn)]) -> Vec<&[(PgOff, Pfn)]> {
    pool::runs_max(batch, 512, |a, b| b.0 == a.0 + 1)
        .map(|r| &batch[r])
        .collect()
}

/// Writes locked pages `batch` (sorted by index) in runs of consecutive indices; the first error.
pub(crate) fn write_pages_locked(
    m: &MmInner,
    mapping: &AddressSpace,
    batch: &[(PgOff, Pfn)],
) -> io::Result<()> {
    write_runs(m, mapping, &index_runs(batch))
        .into_iter()
        .find(|r| r.is_err())
        .unwrap_or(Ok(()))
}

/// Writes back a batch of locked pages that were dirty (`clear_page_dirty_for_io` done): sets
/// writeback, writes runs of consecutive indices, ends writeback, redirties on error (the data
/// is never dropped), unlocks. Returns the first error.
pub(crate) fn writeback_locked(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    mut batch: Vec<(PgOff, Pfn)>,
) -> io::Result<()> {
    batch.sort_unstable();
    let mut first_err = None;
    let runs = index_runs(&batch);
    for &(i, f) in &batch {
        set_page_writeback(m, mapping, f, i);
    }
    let results = write_runs(m, mapping, &runs);
    // Failed runs are dirty again before their writeback ends: a page is never seen neither
    // dirty nor under writeback while its data is only in memory.
    let mut failed = 0;
    for (&run, res) in runs.iter().zip(results) {
        if let Err(err) = res {
            failed += 1;
            log::error!(
                "writeback of {} pages at page {} of {} failed: {err}; they stay dirty",
                run.len(),
                run[0].0,
                mapping.name()
            );
            mapping.wb_err.set(err.raw_os_error().unwrap_or(libc::EIO));
            for &(_, f) in run {
                m.node.pages[f].set(pg::ERROR);
                set_page_dirty(m, mapping, f);
            }
            first_err.get_or_insert(err);
        }
    }
    for &(i, f) in &batch {
        end_page_writeback(m, mapping, f, i);
    }
    // Counted once the pages are dirty again: whoever sees the error sees them dirty (a test
    // polling the counter found neither dirty nor writeback pages in between).
    m.vm.add(Item::FileWriteError, failed);
    for &(_, f) in &batch {
        m.node.pages[f].unlock();
        put_page(&m.node, f);
    }
    first_err.map_or(Ok(()), Err)
}

/// A disk file's `address_space_operations`: writeback through [`write_cache_pages`].
#[derive(Debug)]
pub(crate) struct FileAops;

/// The operations of every disk file's mapping.
pub(crate) static FILE_AOPS: FileAops = FileAops;

impl AddressSpaceOps for FileAops {
    fn writepages(
        &self,
        m: &MmInner,
        mapping: &Arc<AddressSpace>,
        start: PgOff,
        end: PgOff,
        sync: bool,
        nr_to_write: i64,
    ) -> io::Result<u64> {
        write_cache_pages(m, mapping, start, end, sync, nr_to_write)
    }
}

/// What a page-cache allocation that found no frame says: the budget, why nothing could be
/// reclaimed, and what to do.
fn out_of_memory(m: &MmInner, mapping: &AddressSpace) -> String {
    let budget = (m.node.nr_frames() * PAGE_SIZE as u64) >> 20;
    let why = match &m.swap {
        _ if !mapping.is_memory() => "every page is in use and none could be reclaimed",
        None => "an in-memory file's pages can only go to swap, and there is none",
        Some(s) if s.slots.nr_free() == 0 => "an in-memory file's pages go to swap, and it is full",
        Some(_) => "no page could be reclaimed",
    };
    format!(
        "page cache of {}: no free page in the budget of {budget} MiB ({why}); give the manager \
         a larger budget or swap (MmConfig::swap, --swap ram|file, USERMM_SWAP)",
        mapping.name()
    )
}

/// Dirty pages looked up, locked and written as one batch by [`write_cache_pages`]: 2 MiB, so
/// that a run of them is one large device request (Linux builds a bio across its page batches;
/// here a batch of 64 was a 256 KiB write, where the kernel's writeback sent 905 KiB ones).
const WRITE_BATCH: usize = 512;

/// [`WRITE_BATCH`] for a file some region maps: 8 MiB. Each batch first write-protects its
/// mapped pages (`write_protect_mapped`: a TLB-flush IPI to every CPU the program runs on),
/// and its runs go to the device together. A mapped 2 GiB sequential write at 256 MiB,
/// alternating runs (medians): 1164 -> 1397 MiB/s (4 runs) and 1267 -> 1371 (5) with 1
/// thread, 912 -> 1024 with 4 (3); random writes with 4 threads unchanged. Buffered writers
/// keep the smaller batch: `bench dd --count 512 --budget 128M --fdatasync` went from about
/// 1070 to 680 MiB/s with 2048 (a batch's pages leave writeback all at once, at its end, and
/// writers throttled on dirty + writeback pages wait for the whole batch).
const WRITE_BATCH_MAPPED: usize = 2048;

/// `write_cache_pages`: writes the dirty pages of `[start, end]`. `sync` (WB_SYNC_ALL) first
/// tags them TOWRITE and walks that tag, waiting for page locks, so pages dirtied during the
/// walk do not extend it; otherwise (WB_SYNC_NONE) it walks DIRTY, skips locked pages and stops
/// after `nr_to_write`. Returns pages written, or the first error (after trying them all).
pub fn write_cache_pages(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    start: PgOff,
    end: PgOff,
    sync: bool,
    mut nr_to_write: i64,
) -> io::Result<u64> {
    if mapping.file().is_none() {
        return Ok(0);
    }
    let _io = mapping.io_lock.lock();
    let mark = if sync {
        mapping
            .lock_tree(&m.vm, LockSite::TagPagesForWriteback)
            .tag_pages_for_writeback(start.raw(), end.raw());
        Mark::Towrite
    } else {
        Mark::Dirty
    };
    let mut written = 0u64;
    let mut first_err = None;
    let mut next = start;
    let batch_max = if mapping.i_mmap.lock().is_empty() {
        WRITE_BATCH
    } else {
        WRITE_BATCH_MAPPED
    };
    let mut found = Vec::with_capacity(batch_max);
    while next <= end && nr_to_write > 0 {
        found.clear();
        {
            let t = mapping.lock_tree(&m.vm, LockSite::FindGetPagesTag);
            t.gang_lookup_tag(next.raw(), end.raw(), mark, batch_max, &mut found);
            for &(_, v) in &found {
                if let Entry::Page(f) = Entry::decode(v) {
                    get_page(&m.node, f);
                }
            }
        }
        if found.is_empty() {
            break;
        }
        next = PgOff::new(found[found.len() - 1].0 + 1);
        let mut locked = Vec::with_capacity(found.len());
        for &(i, v) in &found {
            let i = PgOff::new(i);
            let Entry::Page(f) = Entry::decode(v) else {
                continue;
            };
            // WB_SYNC_ALL waits for each page lock; WB_SYNC_NONE skips locked pages.
            if lock_page_in(m, mapping, f, i, !sync) {
                locked.push((i, f));
            } else {
                put_page(&m.node, f);
            }
        }
        write_protect_mapped(m, &locked);
        let mut batch = Vec::with_capacity(locked.len());
        for (i, f) in locked {
            if !clear_page_dirty_for_io(m, mapping, f) {
                // Cleaned meanwhile: drop a stale TOWRITE mark.
                if sync {
                    mapping
                        .lock_tree(&m.vm, LockSite::SetPageWriteback)
                        .clear_mark(i.raw(), Mark::Towrite);
                }
                m.node.pages[f].unlock();
                put_page(&m.node, f);
                continue;
            }
            batch.push((i, f));
        }
        let n = batch.len() as u64;
        if let Err(e) = writeback_locked(m, mapping, batch) {
            first_err.get_or_insert(e);
            if !sync {
                break;
            }
        }
        written += n;
        nr_to_write -= n as i64;
    }
    if !mapping.tagged(&m.vm, Mark::Dirty) {
        mapping.dirtied_when.store(0, Ordering::Release);
    }
    first_err.map_or(Ok(written), Err)
}

/// `filemap_write_and_wait_range` plus `fdatasync`, then the mapping's error since `cursor`
/// (errseq: each caller sees each error once; a failed page stays dirty).
pub fn sync_range(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    start: PgOff,
    end: PgOff,
    cursor: &AtomicU64,
) -> Result<()> {
    let res = write_cache_pages(m, mapping, start, end, true, i64::MAX);
    let mut err = res.err();
    if let Some(file) = mapping.file() {
        if let Err(e) = file.sync_data() {
            mapping.wb_err.set(e.raw_os_error().unwrap_or(libc::EIO));
            err.get_or_insert(e);
        }
    }
    if let Some(errno) = mapping.wb_err.check_and_advance(cursor) {
        let e = err.unwrap_or_else(|| io::Error::from_raw_os_error(errno));
        return Err(Error::io(format!("writing back {}", mapping.name()), e));
    }
    Ok(())
}

/// I/O on a file whose last user closed it.
fn closed_error(mapping: &AddressSpace) -> io::Error {
    io::Error::other(format!("{} was closed by its last user", mapping.name()))
}

/// `data_pages`' fallback when lseek(SEEK_DATA/SEEK_HOLE) fails: every page counts as data
/// (read as before holes were detected); logged, never silent.
fn lseek_failed(e: impl std::fmt::Display, n: usize) -> Vec<bool> {
    log::warn!("lseek(SEEK_DATA/SEEK_HOLE) failed ({e}); reading {n} pages without hole detection");
    vec![true; n]
}

/// Which of the `n` pages from page `start` of `file` (the host of `mapping`) may hold data,
/// by `SEEK_DATA` / `SEEK_HOLE`: a page wholly inside a hole, or beyond the end of the file's
/// data on disk, does not. If lseek fails, every page counts as data (read as before).
///
/// A range inside the last data extent found (`AddressSpace::data_extent`) is data without
/// asking: a random reader of a file without holes paid two lseeks per 4 KiB read (two of
/// the eight system calls of a miss in `bench mmap-file --pattern randread`). A hole punched
/// into that extent since is then read from the device, which returns its zeros: slower, never
/// wrong. Truncation forgets the extent.
pub(super) fn data_pages(mapping: &AddressSpace, file: &File, start: PgOff, n: usize) -> Vec<bool> {
    let ps = PAGE_SIZE as u64;
    let (lo, hi) = (start.byte_offset(), (start + n as u64).byte_offset());
    {
        let (a, b) = *mapping.data_extent.lock();
        if a <= lo && hi <= b {
            return vec![true; n];
        }
    }
    let mut data = vec![false; n];
    let mut pos = lo;
    while pos < hi {
        let d = match crate::sys::seek_data(file, pos) {
            Ok(Some(d)) if d < hi => d.max(pos),
            Ok(_) => break,
            Err(e) => return lseek_failed(e, n),
        };
        let h = match crate::sys::seek_hole(file, d) {
            Ok(Some(h)) => {
                if h > d {
                    *mapping.data_extent.lock() = (d, h);
                }
                h.clamp(d + 1, hi)
            }
            // The file shrank under us: read the rest, the read itself finds the end.
            Ok(None) => hi,
            Err(e) => return lseek_failed(e, n),
        };
        for k in (d - lo) / ps..(h - lo).div_ceil(ps) {
            data[k.usize()] = true;
        }
        pos = h;
    }
    data
}

/// Puts pages `[k0, k0 + len)` of `frames` (new, locked frames) in their pool slots: from `src`
/// at `src_off` (page `k0` first), or zeros when `src` is None. A slot that still holds a
/// recycled page (`present`) is overwritten in place; runs of consecutive empty slots are filled
/// with one UFFDIO_COPY each (from the zero source for zeros).
pub(super) fn fill_frames(
    m: &MmInner,
    frames: &[Pfn],
    present: &[bool],
    k0: usize,
    len: usize,
    src: Option<(&crate::sys::Mapping, usize)>,
) -> io::Result<()> {
    let ks: Vec<usize> = (k0..k0 + len).collect();
    let from = |k: usize| match src {
        Some((b, off)) => (b, off + (k - k0) * PAGE_SIZE),
        None => (
            &m.pool.zero_src,
            ((k - k0) * PAGE_SIZE) % m.pool.zero_src.len(),
        ),
    };
    for run in pool::runs(&ks, |a, b| {
        frames[b] == frames[a].next() && present[a] == present[b]
    }) {
        let (ka, kb) = (ks[run.start], ks[run.end - 1] + 1);
        if present[ka] {
            for (k, f) in frames.iter().enumerate().take(kb).skip(ka) {
                let off = f.offset();
                match src {
                    Some(_) => {
                        let (b, o) = from(k);
                        m.pool.slots.copy_from(off, b, o, PAGE_SIZE)?;
                    }
                    None => m.pool.slots.fill(off, PAGE_SIZE, 0)?,
                }
            }
            continue;
        }
        // Empty slots: one copy for the run while the source is contiguous (the zero source
        // is 2 MiB; longer runs of zeros go in pieces).
        let mut k = ka;
        while k < kb {
            let (b, o) = from(k);
            let n = (kb - k).min((b.len() - o) / PAGE_SIZE).max(1);
            let dst = m.pool.slots.addr() + frames[k].offset();
            let len = n * PAGE_SIZE;
            let res = m.retry_again(len, |d| {
                m.mm.uffd
                    .copy(dst + d, b.addr() + o + d, len - d, false, true)
            });
            let done = match res {
                Ok(d) => d / PAGE_SIZE,
                Err(e) if e.is_exists() => {
                    // The slot held a page after all: overwrite it in place.
                    let j = k + e.done / PAGE_SIZE;
                    let (b2, o2) = from(j);
                    m.pool
                        .slots
                        .copy_from(frames[j].offset(), b2, o2, PAGE_SIZE)?;
                    e.done / PAGE_SIZE + 1
                }
                Err(e) => return Err(io::Error::from_raw_os_error(e.errno)),
            };
            k += done.max(1);
        }
    }
    Ok(())
}

/// Reads `frames.len()` consecutive pages from `start` into the (locked, new) frames: one I/O
/// per run of pages that hold data; pages in a hole or beyond the file's data are zero-filled
/// without I/O (`file_read_hole`). Where every slot of a run holds a page (recycled frames, the
/// common case under reclaim) and the file is O_DIRECT, the device reads straight into the
/// slots (`file_read_direct`); otherwise the data goes from the bounce buffer into the slots
/// with one UFFDIO_COPY per run of empty slots (a recycled page is overwritten in place).
pub(super) fn read_into(
    m: &MmInner,
    mapping: &AddressSpace,
    start: PgOff,
    frames: &[Pfn],
) -> io::Result<()> {
    let res = {
        // A file on disk: a handler waiting here hands its reading to a standby reader.
        let _io = super::handler::blocking_io(m, mapping.file().is_some());
        read_into_slots(m, mapping, start, frames)
    };
    if res.is_err() {
        // Whatever the read left, every slot holds a page again (the frames are freed as
        // recycled ones).
        for &f in frames {
            pool::ensure_slot(m, f);
        }
    }
    res
}

fn read_into_slots(
    m: &MmInner,
    mapping: &AddressSpace,
    start: PgOff,
    frames: &[Pfn],
) -> io::Result<()> {
    let n = frames.len();
    for &f in frames {
        pool::settle(m, f);
        m.node.pages[f].clear(pg::POOLED);
    }
    // Which slots hold a page (recycled, or populated by the caller).
    let mut present = pool::slots_present(m, frames);
    let Some(file) = mapping.file() else {
        if mapping.is_file() {
            // Closed meanwhile (a readahead window queued before the last close).
            return Err(closed_error(mapping));
        }
        // In-memory file: new pages are zeros.
        return fill_frames(m, frames, &present, 0, n, None);
    };
    let file = &*file;
    if mapping.inject_read_errors.load(Ordering::Relaxed) > 0
        && mapping
            .inject_read_errors
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| match k {
                0 => None,
                u32::MAX => Some(k),
                _ => Some(k - 1),
            })
            .is_ok()
    {
        // A test's failing device (`CachedFile::inject_read_errors`).
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    let direct = matches!(mapping.host, Host::File { direct: true, .. });
    let data = data_pages(mapping, file, start, n);
    if direct && m.cfg.settings.is_new(Switch::PoolFill) && present.iter().any(|&p| !p) {
        // Empty slots get pages from a huge page, so the read below goes straight into them.
        pool::fill_empty_from_huge(m, frames, &mut present);
    }
    let ks: Vec<usize> = (0..n).collect();
    let runs: Vec<std::ops::Range<usize>> = pool::runs(&ks, |a, b| data[a] == data[b]).collect();
    // Pages `k0..k0+len` into their frames: read ones from `src` (then out of the kernel's
    // cache for a buffered file), hole pages as zeros.
    let place = |k0: usize, len: usize, src: Option<(&crate::sys::Mapping, usize)>| {
        let _cpu = ra_worker_cpu(m);
        if src.is_some() && !direct {
            m.vm.warn_on(
                crate::sys::fadvise_dontneed(
                    file,
                    (start + k0 as u64).byte_offset(),
                    (len * PAGE_SIZE) as u64,
                ),
                "dropping read pages from the kernel's page cache",
            );
        }
        fill_frames(m, frames, &present, k0, len, src)
    };
    let data_runs = runs.iter().filter(|r| data[r.start]).count();
    if data_runs > 1
        && n <= 512
        && m.cfg.settings.is_new(Switch::FileIo)
        && crate::sys::ring::available()
    {
        // Several runs of data between holes: every read in flight at once, into one bounce
        // buffer at the pages' own positions; a read that comes back short (the end of the
        // file) or fails is done again by pread, which zero-fills past the end.
        pool::with_bounce(n, |bounce| {
            let offs: Vec<Vec<usize>> = runs
                .iter()
                .filter(|r| data[r.start])
                .map(|r| r.clone().map(|k| k * PAGE_SIZE).collect())
                .collect();
            let ios: Vec<crate::sys::ring::PageIo<'_>> = runs
                .iter()
                .filter(|r| data[r.start])
                .zip(&offs)
                .map(|(r, o)| crate::sys::ring::PageIo {
                    mem: bounce,
                    pages: o,
                    file_off: (start + r.start as u64).byte_offset(),
                })
                .collect();
            let ok = crate::sys::ring::try_read_pages(file, &ios);
            m.vm.add(Item::FileIoUring, ok.iter().filter(|&&b| b).count() as u64);
            for (io, ok) in ios.iter().zip(ok) {
                if !ok {
                    let len = io.pages.len() * PAGE_SIZE;
                    bounce.pread_at(file, io.file_off, io.pages[0], len)?;
                }
            }
            for r in &runs {
                let src = data[r.start].then_some((bounce, r.start * PAGE_SIZE));
                place(r.start, r.len(), src)?;
            }
            io::Result::Ok(())
        })?;
    } else {
        // Parts (at most 512 pages of one data run) the device reads straight into their
        // slots: every slot holds a page and the file is O_DIRECT. Several are put in flight
        // at once through io_uring; whatever it does not read in full goes the way below.
        let reads_direct = |p: usize, l: usize| direct && present[p..p + l].iter().all(|&b| b);
        let direct_parts: Vec<(usize, usize)> = runs
            .iter()
            .filter(|r| data[r.start])
            .flat_map(|r| {
                (r.start..r.end)
                    .step_by(512)
                    .map(move |p| (p, (r.end - p).min(512)))
            })
            .filter(|&(p, l)| reads_direct(p, l))
            .collect();
        let mut read_direct = vec![false; n];
        if direct_parts.len() > 1
            && m.cfg.settings.is_new(Switch::FileIo)
            && crate::sys::ring::available()
        {
            let offs: Vec<Vec<usize>> = direct_parts
                .iter()
                .map(|&(p, l)| frames[p..p + l].iter().map(|f| f.offset()).collect())
                .collect();
            let ios: Vec<crate::sys::ring::PageIo<'_>> = direct_parts
                .iter()
                .zip(&offs)
                .map(|(&(p, _), o)| crate::sys::ring::PageIo {
                    mem: &m.pool.slots,
                    pages: o,
                    file_off: (start + p as u64).byte_offset(),
                })
                .collect();
            let ok = crate::sys::ring::try_read_pages(file, &ios);
            for (&(p, l), ok) in direct_parts.iter().zip(ok) {
                if ok {
                    read_direct[p..p + l].fill(true);
                    m.vm.inc(Item::FileIoUring);
                    m.vm.add(Item::FileReadDirect, l as u64);
                }
            }
        }
        for r in runs {
            let (k0, len) = (r.start, r.len());
            if !data[k0] {
                place(k0, len, None)?;
                continue;
            }
            for part in (k0..k0 + len).step_by(512) {
                let plen = (k0 + len - part).min(512);
                let off = (start + part as u64).byte_offset();
                if read_direct[part] {
                    continue;
                }
                if reads_direct(part, plen) {
                    // Every slot holds a page: the device writes straight into them (no bounce
                    // copy; O_DIRECT needs the page-aligned slots it gets). A read that comes
                    // back short (the file on disk ends inside the run) goes the bounce way,
                    // which zero-fills past the end.
                    let offs: Vec<usize> = frames[part..part + plen]
                        .iter()
                        .map(|f| f.offset())
                        .collect();
                    match m.pool.slots.pread_pages(file, off, &offs) {
                        Ok(()) => {
                            m.vm.add(Item::FileReadDirect, plen as u64);
                            continue;
                        }
                        Err(crate::sys::SysError::Short { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                pool::with_bounce(plen, |bounce| {
                    bounce.pread_at(file, off, 0, plen * PAGE_SIZE)?;
                    place(part, plen, Some((bounce, 0)))
                })?;
            }
        }
    }
    let read = data.iter().filter(|&&d| d).count() as u64;
    m.vm.add(Item::Pgpgin, read * (PAGE_SIZE as u64 / 1024));
    m.vm.add(Item::FileReadHole, n as u64 - read);
    record_read_hashes(m, mapping, frames, &data);
    Ok(())
}

/// The most pages read as one batch of frames by [`do_page_cache_readahead`]: 8 MiB, a block
/// device's usual `read_ahead_kb` (this VM's disk: 8192). Its 2 MiB parts are read at once.
const RA_RUN_MAX: usize = 2048;

/// `page_cache_ra_unbounded`: reads the uncached pages of `[start, start+nr)` (below EOF) with
/// one I/O per run; the page at `mark` gets PG_readahead (the async trigger). Returns the
/// pages read.
pub fn do_page_cache_readahead(
    m: &MmInner,
    mapping: &AddressSpace,
    start: PgOff,
    nr: u64,
    mark: Option<PgOff>,
) -> u64 {
    if mapping.is_file() && mapping.file().is_none() {
        // Closed by its last user after this window was queued: nobody wants the pages.
        return 0;
    }
    let eof = PgOff::new(
        mapping
            .size
            .load(Ordering::Acquire)
            .div_ceil(PAGE_SIZE as u64),
    );
    let end = (start + nr).min(eof);
    let mut read = 0;
    let mut i = start;
    let mut cpu = ra_worker_cpu(m);
    while i < end {
        // A run of absent indices.
        let mut run = Vec::new();
        while i < end && run.len() < RA_RUN_MAX {
            if mapping.peek(&m.vm, i).is_some() {
                break;
            }
            run.push(i);
            i += 1;
        }
        if run.is_empty() {
            i += 1;
            continue;
        }
        let mut frames = Vec::with_capacity(run.len());
        // Frames for the whole run, so that it is one read: the allocator gives what is free
        // above the min watermark (kswapd keeps only low..high, 256 pages at a 256 MiB budget,
        // so a 512-page window came in halves: two reads at queue depth one), then reclaims
        // for the rest. Fails only when nothing can be freed; a run that got some frames is
        // read with those.
        if !page_alloc::alloc_pages(m, run.len(), &mut frames) {
            break;
        }
        while frames.len() < run.len() {
            if page_alloc::alloc_more_pages(m, run.len() - frames.len(), &mut frames) == 0 {
                break;
            }
        }
        // Fewer frames than pages (memory is short): the rest of the run is read next round.
        i = run[0] + frames.len() as u64;
        run.truncate(frames.len());
        let mut added = Vec::with_capacity(frames.len());
        for (k, &f) in frames.iter().enumerate() {
            let idx = run[0] + k as u64;
            let p = &m.node.pages[f];
            let pooled = p.test(pg::POOLED);
            let mut flags = pg::LOCKED | pg::PAGECACHE;
            if mapping.is_memory() {
                flags |= pg::SWAPBACKED;
            }
            if Some(idx) == mark {
                flags |= pg::READAHEAD;
            }
            p.init(
                Owner::Cache(mapping.id, idx),
                flags | if pooled { pg::POOLED } else { 0 },
            );
            // The slot is filled by read_into (the page is locked and not up to date: nobody
            // looks into it before).
            if added.len() == k && add_to_page_cache_lru(m, mapping, f, idx) {
                added.push(f);
            } else {
                p.reset_flags(0);
                pool::free_frames(m, &[f], true);
            }
        }
        if added.is_empty() {
            continue;
        }
        drop(cpu);
        let ok = read_into(m, mapping, run[0], &added);
        cpu = ra_worker_cpu(m);
        if let Err(e) = &ok {
            if mapping.is_file() && mapping.file().is_none() {
                // Closed by its last user during the read: nobody wants the pages.
                log::debug!("readahead of {}: {e}", mapping.name());
            } else {
                log::error!(
                    "read of {} pages at page {} of {}: {e}",
                    added.len(),
                    run[0],
                    mapping.name()
                );
                m.vm.inc(Item::FileReadError);
            }
        }
        for &f in &added {
            let p = &m.node.pages[f];
            if ok.is_ok() {
                p.set(pg::UPTODATE);
            } else {
                p.set(pg::ERROR);
            }
            p.unlock();
        }
        // Flags stored, then parked faults looked for; a parker does the reverse (handler.rs
        // `park_all`): the fences make sure one of the two sees the other.
        crate::sync::fence(Ordering::SeqCst);
        if m.handlers.io_waiters.any() {
            // Faults parked on these pages are served here, now (handler.rs `IoWaiters`).
            drop(cpu);
            super::handler::serve_io_waiters(m);
            cpu = ra_worker_cpu(m);
        }
        if ok.is_err() {
            // Drop them so a later read retries the I/O.
            for (k, &f) in added.iter().enumerate() {
                let p = &m.node.pages[f];
                if p.trylock() && !remove_page(m, mapping, f, run[0] + k as u64, false) {
                    p.unlock();
                }
            }
            break;
        }
        read += added.len() as u64;
        if added.len() > 1 || mark.is_some() {
            m.vm.add(Item::FileRa, added.len() as u64);
        }
    }
    read
}

/// `clean_map=move`: records the hashes of pages `frames` of `mapping` (locked, just read into
/// their slots; `data[k]`: page `k` holds file data, else it is a hole, zeros) for the
/// fault-around that will move them into a shared mapping of the file
/// (`memory::map_clean_run`). That move must compare each page's contents before and after
/// (a store between the move and the write protection is otherwise unseen); hashing the
/// slots here, on the thread that completed the read, leaves the fault path only the view to
/// hash. In a mapped sequential read the two hashes on the fault path were 8-9% of all samples.
/// A hole gets the zero page's hash without hashing (a sequential writer's new pages are all
/// holes). Only for a file some region maps: a page only ever read with `read_at` is not hashed.
pub(super) fn record_read_hashes(
    m: &MmInner,
    mapping: &AddressSpace,
    frames: &[Pfn],
    data: &[bool],
) {
    if !m.cfg.settings.is_new(crate::settings::Switch::CleanMap) || mapping.i_mmap.lock().is_empty()
    {
        return;
    }
    static ZERO_PAGE_HASH: crate::sync::OnceLock<Option<u64>> = crate::sync::OnceLock::new();
    let zero = *ZERO_PAGE_HASH.get_or_init(|| m.pool.zero_src.hash_page(0).ok());
    let ks: Vec<usize> = (0..frames.len()).collect();
    for r in pool::runs(&ks, |a, b| {
        data[a] == data[b] && frames[b] == frames[a].next()
    }) {
        let run = &frames[r.clone()];
        if !data[r.start] {
            if let Some(h) = zero {
                for &f in run {
                    pool::set_read_hash(m, f, h);
                }
            }
            continue;
        }
        match m.pool.slots.hash_pages(run[0].offset(), run.len()) {
            Ok(h) => {
                for (&f, h) in run.iter().zip(h) {
                    pool::set_read_hash(m, f, h);
                }
            }
            Err(e) => log::debug!("hashing {} slots from frame {}: {e}", run.len(), run[0]),
        }
    }
}

/// `filemap_read_folio`: reads page `f` (locked, in the cache at `index`, not up to date: new,
/// or a readahead's read of it failed or was cut short by a close), synchronously, and marks
/// it up to date. On failure it is counted (`file_read_error`), gets PG_error, and the caller's
/// reference is dropped with the page: removed from the cache, or unlocked where somebody else
/// still holds it (whose next reader reads it again).
pub(crate) fn filemap_read_folio(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
) -> io::Result<()> {
    let p = &m.node.pages[f];
    p.clear(pg::ERROR);
    match read_into(m, mapping, index, &[f]) {
        Ok(()) => {
            p.set(pg::UPTODATE);
            Ok(())
        }
        Err(e) => {
            p.set(pg::ERROR);
            m.vm.inc(Item::FileReadError);
            put_page(&m.node, f);
            if !remove_page(m, mapping, f, index, false) {
                p.unlock();
            }
            Err(e)
        }
    }
}

/// `folio_end_read`: page `f` (locked, read or not) is marked up to date, or left not up to
/// date with PG_error for its next reader to read again (a fault reads it once more itself
/// and raises SIGBUS if that fails too: memory.rs `filemap_fault`); unlocked; the faults
/// parked on it served.
pub(super) fn folio_end_read(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
    res: io::Result<()>,
) {
    let p = &m.node.pages[f];
    match res {
        Ok(()) => p.set(pg::UPTODATE),
        Err(e) => {
            if mapping.is_file() && mapping.file().is_none() {
                log::debug!("read of page {index} of {}: {e}", mapping.name());
            } else {
                log::error!("read of page {index} of {}: {e}", mapping.name());
                m.vm.inc(Item::FileReadError);
            }
            p.set(pg::ERROR);
        }
    }
    p.unlock();
    // Flags stored, then parked faults looked for; a parker does the reverse (handler.rs
    // `park_all`).
    crate::sync::fence(Ordering::SeqCst);
    if m.handlers.io_waiters.any() {
        super::handler::serve_io_waiters(m);
    }
}

/// `page_cache_async_ra`: queues the window `[start, start + nr)` of `mapping` (PG_readahead on
/// `mark`) for the readahead workers and returns at once.
pub fn page_cache_async_ra(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    start: PgOff,
    nr: u64,
    mark: Option<PgOff>,
) {
    use super::readahead::{RaRequest, RaTarget};
    ra_queue(
        m,
        RaRequest {
            target: RaTarget::File {
                mapping: mapping.clone(),
                mark,
            },
            start,
            nr,
        },
    );
}

/// Queues a readahead window for the workers (readahead.rs) and returns at once. Where no
/// worker runs (the manager is going away, or none could be started) the window is read here,
/// synchronously.
pub(crate) fn ra_queue(m: &MmInner, req: super::readahead::RaRequest) {
    use super::readahead::RaPush;
    match m.ra.push(req) {
        RaPush::Queued | RaPush::Dropped => {}
        RaPush::Shutdown(req) | RaPush::NoWorker(req) => {
            ra_read(m, &req);
        }
    }
}

/// Starts a readahead worker (`usermm-ra`), counted already (`RaQueue::add_worker`, or `pop`
/// asking for one). False if it could not be started (uncounted again).
pub(crate) fn ra_start_worker(m: &Arc<MmInner>) -> bool {
    let me = m.clone();
    match super::spawn_thread("usermm-ra".into(), move || ra_worker_main(me)) {
        Ok(t) => {
            m.ra.threads.lock().push(t);
            true
        }
        Err(e) => {
            log::error!("starting a readahead worker: {e}");
            if !m.ra.worker_failed() {
                log::error!("no readahead worker runs: reading synchronously");
                while let Some(r) = m.ra.try_pop() {
                    ra_read(m, &r);
                }
            }
            false
        }
    }
}

/// Reads one queued window. A window of a file no longer in the file table (closed and
/// forgotten, its id perhaps reused by another file since) is skipped: its pages would name
/// that other file. Returns the pages read.
fn ra_read(m: &MmInner, r: &super::readahead::RaRequest) -> u64 {
    match &r.target {
        super::readahead::RaTarget::File { mapping, mark } => {
            if !m
                .files
                .get(mapping.id)
                .is_some_and(|a| Arc::ptr_eq(&a, mapping))
            {
                return 0;
            }
            let n = do_page_cache_readahead(m, mapping, r.start, r.nr, *mark);
            m.vm.add(Item::FileRaAsync, n);
            n
        }
        super::readahead::RaTarget::Swap { region, read } => read(m, region, r.start, r.nr),
    }
}

std::thread_local! {
    /// This thread is a readahead worker.
    static RA_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// On a readahead worker, the workers' CPU lock ([`RaQueue::cpu`](super::readahead::RaQueue)):
/// held for a window's CPU work, dropped for its reads.
fn ra_worker_cpu(m: &MmInner) -> Option<crate::sync::MutexGuard<'_, ()>> {
    RA_WORKER.with(|w| w.get()).then(|| m.ra.cpu.lock())
}

/// A readahead worker (`usermm-ra`): reads queued windows until the manager goes away.
fn ra_worker_main(m: Arc<MmInner>) {
    RA_WORKER.with(|w| w.set(true));
    let mut done = false;
    while let Some((r, more)) = m.ra.pop(done) {
        done = true;
        if more {
            ra_start_worker(&m);
        }
        ra_read(&m, &r);
    }
}

/// Removes locked page `f` from `mapping` if nobody else holds a reference (`__remove_mapping`
/// for reclaim with `reclaim`, `truncate` otherwise, which waits for none). The frame is freed
/// (recycled: its slot keeps a page). Returns whether it was removed; if not, it stays locked.
pub(crate) fn remove_page(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
    reclaim: bool,
) -> bool {
    let p = &m.node.pages[f];
    {
        let mut t = mapping.lock_tree(&m.vm, LockSite::DeleteFromPageCache);
        if t.get(index.raw()) != Some(Entry::Page(f).encode()) || (reclaim && p.page_count() != 1) {
            return false;
        }
        t.remove(index.raw());
    }
    if !reclaim {
        // Truncation: off the LRU (reclaim isolated its pages already).
        m.node.lru.del(&m.node.pages, f, &m.vm);
    }
    page_cache_deleted(m, mapping, &[f]);
    true
}

/// The accounting of pages `freed`, just taken out of `mapping`'s tree (and off the LRU), and
/// their frames' release: the file's and the node's page counts, the dirty ones, the flags
/// (only PG_pooled kept), the frames recycled with their slots' pages.
fn page_cache_deleted(m: &MmInner, mapping: &AddressSpace, freed: &[Pfn]) {
    let n = freed.len() as u64;
    mapping.nrpages.fetch_sub(n, Ordering::Relaxed);
    m.vm.sub(Item::NrFilePages, n);
    if mapping.is_memory() {
        m.vm.sub(Item::NrShmem, n);
    } else {
        let dirty = freed
            .iter()
            .filter(|&&f| m.node.pages[f].test(pg::DIRTY))
            .count();
        m.vm.sub(Item::NrDirty, dirty as u64);
    }
    for &f in freed {
        let p = &m.node.pages[f];
        p.reset_flags(pg::POOLED);
        p.set_page_count(0);
    }
    pool::recycle_frames(m, freed);
}

/// [`remove_page`] for reclaim, of a batch of `mapping`'s clean isolated pages (frame, index)
/// under one hold of the tree lock: `__remove_mapping` for each page that is still the
/// cache's and has no other user. Returns which were removed. Per page, the lock, the file's
/// page count and the counters were cache lines the readahead workers adding the next windows
/// also wrote: in a mapped sequential read the tree lock alone was 5% of the samples.
pub(crate) fn remove_pages_for_reclaim(
    m: &MmInner,
    mapping: &AddressSpace,
    pages: &[(Pfn, PgOff)],
) -> Vec<bool> {
    let mut removed = vec![false; pages.len()];
    {
        let mut t = mapping.lock_tree(&m.vm, LockSite::DeleteFromPageCache);
        for (k, &(f, index)) in pages.iter().enumerate() {
            if t.get(index.raw()) == Some(Entry::Page(f).encode())
                && m.node.pages[f].page_count() == 1
            {
                t.remove(index.raw());
                removed[k] = true;
            }
        }
    }
    let freed: Vec<Pfn> = pages
        .iter()
        .zip(&removed)
        .filter(|&(_, &r)| r)
        .map(|(&(f, _), _)| f)
        .collect();
    if !freed.is_empty() {
        page_cache_deleted(m, mapping, &freed);
    }
    removed
}

/// Readahead state of one open file (`struct file_ra_state`).
pub use super::readahead::FileRaState;

/// `generic_file_buffered_read`: copies `buf.len()` bytes at `pos` (up to EOF) out of the page
/// cache, reading and reading ahead as needed. Returns bytes copied.
pub fn file_read(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    ra: &Mutex<FileRaState>,
    pos: u64,
    buf: &mut [u8],
) -> Result<usize> {
    let size = mapping.size.load(Ordering::Acquire);
    if pos >= size || buf.is_empty() {
        return Ok(0);
    }
    let len = buf.len().min((size - pos).usize());
    let first = PgOff::of_byte(pos);
    let last = PgOff::of_byte(pos + len as u64 - 1);
    let max = super::readahead::ra_pages(m.cfg.read_ahead_kb, m.node.nr_frames());
    let mut done = 0usize;
    let mut index = first;
    while index <= last {
        let req = last - index + 1;
        let mut f = find_get_page(m, mapping, index)?;
        if f.is_none() {
            let w = ra.lock().on_miss(index.raw(), req, max);
            do_page_cache_readahead(
                m,
                mapping,
                PgOff::new(w.start),
                w.size,
                w.mark().map(PgOff::new),
            );
            f = find_get_page(m, mapping, index)?;
        }
        let f = match f {
            Some(f) => f,
            None => {
                // No readahead possible (memory is short): read just this page.
                match pagecache_get_page(m, mapping, index, Fgp::LOCK | Fgp::CREAT)? {
                    Some(f) => {
                        if !m.node.pages[f].test(pg::UPTODATE) {
                            if let Err(e) = filemap_read_folio(m, mapping, f, index) {
                                return Err(Error::io(format!("reading {}", mapping.name()), e));
                            }
                        }
                        m.node.pages[f].unlock();
                        f
                    }
                    None => continue,
                }
            }
        };
        let p = &m.node.pages[f];
        if p.test_clear(pg::READAHEAD) {
            // The next window is read in the background while this one is copied out.
            m.vm.inc(Item::FileRaHit);
            let w = ra.lock().on_marker(index.raw(), req, max);
            page_cache_async_ra(
                m,
                mapping,
                PgOff::new(w.start),
                w.size,
                w.mark().map(PgOff::new),
            );
        }
        if !lock_page_in(m, mapping, f, index, false) {
            put_page(&m.node, f);
            continue;
        }
        if !p.test(pg::UPTODATE) {
            // Its readahead failed: read it again here; only this read's failure is the
            // caller's error (`filemap_update_page`).
            if let Err(e) = filemap_read_folio(m, mapping, f, index) {
                return Err(Error::io(
                    format!("reading page {index} of {}", mapping.name()),
                    e,
                ));
            }
        }
        let page_start = index.byte_offset();
        let from = (pos + done as u64 - page_start).usize();
        let n = (PAGE_SIZE - from).min(len - done);
        copy_from_page(m, f, from, &mut buf[done..done + n]);
        p.unlock();
        mark_page_accessed(&*m.node.lru, &m.node.pages, f, &m.vm);
        put_page(&m.node, f);
        ra.lock().prev_index = index.raw();
        done += n;
        index += 1;
    }
    Ok(done)
}

/// `generic_perform_write`: copies `buf` into the page cache at `pos` page by page
/// (`write_begin`, copy, `write_end`), throttled by `balance_dirty_pages_ratelimited`.
pub fn file_write(m: &MmInner, mapping: &Arc<AddressSpace>, pos: u64, buf: &[u8]) -> Result<usize> {
    let ps = PAGE_SIZE as u64;
    let mut done = 0usize;
    while done < buf.len() {
        let at = pos + done as u64;
        let index = PgOff::of_byte(at);
        let from = (at % ps).usize();
        let n = (PAGE_SIZE - from).min(buf.len() - done);
        page_writeback::balance_dirty_pages_ratelimited(m, mapping);
        let Some(f) = grab_cache_page_write_begin(m, mapping, index)? else {
            continue;
        };
        let p = &m.node.pages[f];
        if !p.test(pg::UPTODATE) {
            let size = mapping.size.load(Ordering::Acquire);
            if n == PAGE_SIZE {
                // Overwritten in full: nothing to read.
                m.vm.inc(Item::FileWriteNoread);
            } else if index.byte_offset() >= size {
                // Beyond EOF: the rest is zeros.
                m.vm.warn_on(
                    m.pool.slots.fill(f.offset(), PAGE_SIZE, 0),
                    "zeroing a new page-cache page",
                );
                m.vm.inc(Item::FileReadHole);
            } else if let Err(e) = filemap_read_folio(m, mapping, f, index) {
                return Err(Error::io(
                    format!("reading {} before a partial write", mapping.name()),
                    e,
                ));
            }
            p.set(pg::UPTODATE);
        }
        copy_to_page(m, mapping, f, from, &buf[done..done + n]);
        // write_end.
        if !m.cfg.settings.is_new(Switch::AccessedInit) {
            // Before seed 002: marked accessed after the copy, with atomic operations.
            mark_page_accessed(&*m.node.lru, &m.node.pages, f, &m.vm);
        }
        // i_size first, then the dirty page: writeback never sees a dirty page past i_size.
        let old_size = mapping.size.load(Ordering::Acquire);
        if at + n as u64 > old_size {
            let _eof = mapping.eof_lock.lock();
            mapping.size.fetch_max(at + n as u64, Ordering::AcqRel);
            drop(_eof);
            pagecache_isize_extended(m, mapping, old_size, at + n as u64);
        }
        set_page_dirty(m, mapping, f);
        p.unlock();
        put_page(&m.node, f);
        done += n;
    }
    Ok(done)
}

/// The bytes of a mapping held by the page cache now.
pub fn cached_bytes(mapping: &AddressSpace) -> u64 {
    mapping.nrpages.load(Ordering::Relaxed) * PAGE_SIZE as u64
}

/// The live regions mapping `mapping` (its `i_mmap`), pruning ids of dropped ones.
pub(crate) fn i_mmap_regions(m: &MmInner, mapping: &AddressSpace) -> Vec<Arc<RegionInner>> {
    // An id names a region only while that region maps this file: ids are reused.
    let maps_this = |r: &Arc<RegionInner>| {
        r.file
            .as_ref()
            .is_some_and(|fm| std::ptr::eq(&*fm.mapping, mapping))
    };
    let mut l = mapping.i_mmap.lock();
    // A reused id may have been pushed twice (its old and its new region).
    l.sort_unstable();
    l.dedup();
    let live: Vec<_> = l
        .iter()
        .filter_map(|&id| m.mm.region(id).filter(maps_this))
        .collect();
    l.retain(|id| live.iter().any(|r| r.id == *id));
    live
}

/// `pagecache_isize_extended`: the file grew from `old` to `new` bytes, so pages of the regions
/// mapping it that faulted beyond the old end (SIGBUS markers) become accessible again.
pub(crate) fn pagecache_isize_extended(m: &MmInner, mapping: &AddressSpace, old: u64, new: u64) {
    let regions = i_mmap_regions(m, mapping);
    let ps = PAGE_SIZE as u64;
    for r in regions {
        let Some(fm) = &r.file else { continue };
        // Only pages wholly past the old end carry beyond-EOF markers (a marker inside it is a
        // lost page, which stays poisoned).
        let first = PgOff::new(old.div_ceil(ps).saturating_sub(fm.pgoff.raw()));
        let last = PgOff::new(new.div_ceil(ps).saturating_sub(fm.pgoff.raw())).min(r.end());
        let mut used = Vec::new();
        r.pt.for_each_used(first, last, |i, p| {
            if p == super::pgtable::Pte::Poison {
                used.push(i);
            }
        });
        log::debug!(
            "pagecache_isize_extended {old}->{new}: region {} pages {first}..{last} poisoned {:?}",
            r.id,
            used
        );
        for i in used {
            let mut g = r.pt.lock(i);
            if g.get() == super::pgtable::Pte::Poison {
                m.vm.warn_on(
                    r.view
                        .advise(i.offset(), PAGE_SIZE, crate::sys::Advice::DontNeed),
                    "MADV_DONTNEED of a view page",
                );
                g.set(super::pgtable::Pte::None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MapKind, Mm, MmConfig, SwapConfig};
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !cond() {
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A 4-page file of distinct bytes in a new directory (kept alive by the caller).
    fn four_page_file() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..4 * PAGE_SIZE)
            .map(|i| u8::try_from((i / PAGE_SIZE * 16 + i % 13) % 256).unwrap())
            .collect();
        std::fs::write(&path, &data).unwrap();
        (dir, path, data)
    }

    /// A fault on a page under read I/O is parked, not waited for by its handler, and served
    /// when the read completes: by the thread that completes it (`serve_io_waiters`, as
    /// `do_page_cache_readahead` does), or, where the page is unlocked by a path that does not
    /// look for parked faults, by an idle handler. Meanwhile the handlers serve other faults.
    #[test]
    fn a_fault_on_a_page_under_read_io_is_parked_and_served_when_the_read_completes() {
        let (_dir, path, data) = four_page_file();
        let word =
            |page: usize| u64::from_ne_bytes(data[page * PAGE_SIZE..][..8].try_into().unwrap());
        let mm = Mm::new(MmConfig::new(16 << 20).swap(SwapConfig::None)).unwrap();
        let cf = mm.open(&path).unwrap();
        let r = Arc::new(
            mm.map_file(&path, 0, 4 * PAGE_SIZE, MapKind::Shared)
                .unwrap(),
        );
        // Each fault reads only its own page (no read-around of the pages the test locks).
        r.set_access_pattern(crate::AccessPattern::Random);
        let m = mm.inner();
        for (page, wake) in [(1usize, true), (3, false)] {
            let idx = PgOff::new(page as u64);
            // The page as a read in flight has it: in the cache, locked, not up to date.
            let f = find_or_create_page(m, &cf.mapping, idx).unwrap().unwrap();
            // A failed assertion below unlocks it, so the region's teardown does not wait for
            // it for ever.
            struct Unlock<'a>(&'a crate::mm::page::Page);
            impl Drop for Unlock<'_> {
                fn drop(&mut self) {
                    if std::thread::panicking() {
                        self.0.set(pg::ERROR);
                        self.0.unlock();
                    }
                }
            }
            let _unlock = Unlock(&m.node.pages[f]);
            let parked = m.vm.get(Item::FaultIoParked);
            let served = m.vm.get(Item::FaultIoServed);
            let r2 = r.clone();
            let reader = std::thread::spawn(move || r2.read_u64(page * PAGE_SIZE));
            wait_for("the fault was never parked", || {
                m.vm.get(Item::FaultIoParked) > parked
            });
            // The handlers are free: a fault on another page is served meanwhile.
            assert_eq!(r.read_u64(0), word(0));
            assert!(!reader.is_finished(), "served before its page was read");
            read_into(m, &cf.mapping, idx, &[f]).unwrap();
            let p = &m.node.pages[f];
            p.set(pg::UPTODATE);
            p.unlock();
            put_page(&m.node, f);
            if wake {
                super::super::handler::serve_io_waiters(m);
                assert!(
                    m.vm.get(Item::FaultIoServed) > served,
                    "not served by the reader"
                );
            }
            assert_eq!(reader.join().unwrap(), word(page), "page {page}");
            // The server counts a fault served after it has woken the faulting thread.
            wait_for("the served fault was never counted", || {
                m.vm.get(Item::FaultIoServed) > served
            });
        }
        assert!(!m.handlers.io_waiters.any());
    }

    /// A page a failed readahead left in the cache (not up to date, PG_error, unlocked: the
    /// worker drops such pages, but not one somebody held locked at that moment) is read again
    /// by the next reader, as Linux's `filemap_update_page` and `filemap_fault` do: `read_at`
    /// returns the file's bytes, not EIO, and a fault on it resolves instead of finding it
    /// again and again.
    #[test]
    fn a_page_left_by_a_failed_readahead_is_read_again_by_its_next_reader() {
        let (_dir, path, data) = four_page_file();
        let mm = Mm::new(MmConfig::new(16 << 20).swap(SwapConfig::None)).unwrap();
        let cf = mm.open(&path).unwrap();
        let r = mm
            .map_file(&path, 0, 4 * PAGE_SIZE, MapKind::Shared)
            .unwrap();
        r.set_access_pattern(crate::AccessPattern::Random);
        let m = mm.inner();
        let errors = m.vm.get(Item::FileReadError);
        for page in [1usize, 2] {
            let f = find_or_create_page(m, &cf.mapping, PgOff::new(page as u64))
                .unwrap()
                .unwrap();
            let p = &m.node.pages[f];
            p.set(pg::ERROR);
            p.unlock();
            put_page(&m.node, f);
        }
        let mut b = vec![0u8; PAGE_SIZE + 100];
        assert_eq!(cf.read_at(PAGE_SIZE as u64 - 50, &mut b).unwrap(), b.len());
        assert!(b[..] == data[PAGE_SIZE - 50..2 * PAGE_SIZE + 50], "read_at");
        let want = u64::from_ne_bytes(data[2 * PAGE_SIZE + 8..][..8].try_into().unwrap());
        assert_eq!(
            r.read_u64(2 * PAGE_SIZE + 8),
            want,
            "a load through the mapping"
        );
        assert_eq!(
            m.vm.get(Item::FileReadError),
            errors,
            "the reads again succeeded"
        );
        for page in [1u64, 2] {
            let f = find_get_page(m, &cf.mapping, PgOff::new(page))
                .unwrap()
                .unwrap();
            let p = &m.node.pages[f];
            assert!(p.test(pg::UPTODATE) && !p.test(pg::ERROR), "page {page}");
            put_page(&m.node, f);
        }
    }
}
