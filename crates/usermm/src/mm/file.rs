//! Files through the page cache: [`CachedFile`] (buffered `read_at`/`write_at`/`set_len`/`sync`,
//! on a file or in memory), the inode table that gives every open of one file the same
//! [`AddressSpace`], and file-backed regions ([`Mm::map_file`]). Mirrors the VFS side:
//! `fs/inode.c` (`iget`/`iput`/`evict`), `mm/filemap.c`'s `generic_file_read_iter` /
//! `generic_file_write_iter` callers, `mm/shmem.c` for in-memory files, and `fs/sync.c`.
//!
//! Files are opened with O_DIRECT where the filesystem allows it, so the kernel's page cache
//! does not keep a second copy; otherwise buffered, with `sync_file_range` and
//! `posix_fadvise(DONTNEED)` after each writeback run and read.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
// (MetadataExt also gives nlink for the unlinked check.)
use std::path::Path;

use crate::error::{Error, FileError, Result};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, RwLock};

use super::filemap::{self, FileRaState};
use super::fs::{AddressSpace, FileStamp, Host};
use super::page::{IdTable, MappingId, PgOff};
use super::{Mm, MmHandle, MmInner};

/// Live address spaces by id (the id is what page descriptors name) and by inode.
#[derive(Debug, Default)]
pub struct MappingTable {
    by_id: IdTable<MappingId, AddressSpace>,
    by_inode: HashMap<(u64, u64), MappingId>,
}

impl MappingTable {
    pub(crate) fn get(&self, id: MappingId) -> Option<&Arc<AddressSpace>> {
        self.by_id.get(id)
    }
    /// All live mappings.
    pub(crate) fn all(&self) -> Vec<Arc<AddressSpace>> {
        self.by_id.iter().cloned().collect()
    }
}

/// The file table (the kernel's inode hash): every live address space of the manager, shared by
/// every open of its inode. Its operations take only the table.
#[derive(Debug, Default)]
pub struct FileTable(RwLock<MappingTable>);

impl FileTable {
    /// The live mapping `id` (the rmap's way from a page-cache page to its file).
    pub(crate) fn get(&self, id: MappingId) -> Option<Arc<AddressSpace>> {
        self.0.read().get(id).cloned()
    }
    /// All live mappings.
    pub(crate) fn all(&self) -> Vec<Arc<AddressSpace>> {
        self.0.read().all()
    }
    /// `iget`: the address space of the file at `path`, shared by every open of that inode.
    /// A closed file's cached pages are reused when the file is as it was left at close
    /// ([`FileStamp`]); otherwise the inode gets a new address space and the old one comes
    /// back second, for the caller to evict (outside the table lock).
    pub(crate) fn iget(
        &self,
        path: &Path,
        create: bool,
    ) -> Result<(Arc<AddressSpace>, Option<Arc<AddressSpace>>)> {
        let (file, direct) = open_file(path, create).map_err(|e| {
            Error::io(
                format!(
                    "opening {} for the page cache (read-write{})",
                    path.display(),
                    if create { ", created if missing" } else { "" }
                ),
                e,
            )
        })?;
        let md = file
            .metadata()
            .map_err(|e| Error::io(format!("stat of {}", path.display()), e))?;
        if !md.is_file() {
            return Err(FileError::NotRegular {
                path: path.to_path_buf(),
            }
            .into());
        }
        match crate::sys::pseudo_fs(&file) {
            Ok(Some(fs)) => {
                return Err(FileError::PseudoFs {
                    path: path.to_path_buf(),
                    fs,
                }
                .into())
            }
            Ok(None) => {}
            Err(e) => return Err(Error::io(format!("statfs of {}", path.display()), e)),
        }
        let key = (md.dev(), md.ino());
        let mut t = self.0.write();
        let mut stale = None;
        if let Some(&id) = t.by_inode.get(&key) {
            let a = t.get(id).expect("inode table names a live mapping").clone();
            let Host::File {
                file: fd,
                closed,
                direct: was_direct,
                ..
            } = &a.host
            else {
                unreachable!("the inode table holds files only");
            };
            let mut fd = fd.write();
            if fd.is_some() {
                a.users.fetch_add(1, Ordering::AcqRel);
                return Ok((a.clone(), None));
            }
            // Closed: reuse its pages only if nobody changed the file since.
            let left = closed.lock().take();
            if left == Some(FileStamp::of(&md)) && *was_direct == direct {
                *fd = Some(Arc::new(file));
                a.users.fetch_add(1, Ordering::AcqRel);
                return Ok((a.clone(), None));
            }
            log::debug!(
                "{}: changed since it was closed ({left:?} -> {:?}); its cached pages are dropped",
                path.display(),
                FileStamp::of(&md)
            );
            drop(fd);
            t.by_inode.remove(&key);
            stale = Some(a);
        }
        let a = t.by_id.insert(|id| {
            Arc::new(AddressSpace::new(
                id,
                Host::File {
                    file: RwLock::new(Some(Arc::new(file))),
                    path: path.to_path_buf(),
                    direct,
                    dev: md.dev(),
                    ino: md.ino(),
                    closed: Mutex::new(None),
                },
                md.len(),
                0,
                &filemap::FILE_AOPS,
            ))
        });
        a.users.store(1, Ordering::Release);
        t.by_inode.insert(key, a.id);
        Ok((a.clone(), stale))
    }
    /// A new in-memory file's address space.
    pub(crate) fn new_memory(&self, name: &str) -> Arc<AddressSpace> {
        let mut t = self.0.write();
        let a = t.by_id.insert(|id| {
            Arc::new(AddressSpace::new(
                id,
                Host::Memory { name: name.into() },
                0,
                0,
                &super::shmem::SHMEM_AOPS,
            ))
        });
        a.users.store(1, Ordering::Release);
        a
    }
    /// Forgets a closed file's mapping once it holds no page (called at last close and when
    /// reclaim takes a closed file's last page).
    pub(crate) fn forget_if_unused(&self, a: &AddressSpace) {
        if a.users.load(Ordering::Acquire) != 0 || a.nrpages.load(Ordering::Acquire) != 0 {
            return;
        }
        let mut t = self.0.write();
        if a.users.load(Ordering::Acquire) != 0 || a.nrpages.load(Ordering::Acquire) != 0 {
            return;
        }
        if !t.get(a.id).is_some_and(|x| std::ptr::eq(&**x, a)) {
            return;
        }
        if let Host::File { dev, ino, .. } = &a.host {
            // The inode may have a newer address space by now (the file changed while closed).
            if t.by_inode.get(&(*dev, *ino)) == Some(&a.id) {
                t.by_inode.remove(&(*dev, *ino));
            }
        }
        t.by_id.remove(a.id);
    }
}

/// [`FileTable::iget`], evicting the pages of a closed file that changed since its close.
pub(crate) fn iget(m: &MmInner, path: &Path, create: bool) -> Result<Arc<AddressSpace>> {
    let (a, stale) = m.files.iget(path, create)?;
    if let Some(old) = stale {
        super::truncate::evict_all(m, &old);
        m.files.forget_if_unused(&old);
    }
    // The device's flusher starts here, on the caller's thread, not at the first dirty page:
    // that can be a write fault, and a fault handler must never start a thread (pthread_create
    // can itself fault on managed memory under `usermm run`: `RaQueue::pop`, readahead.rs).
    if !a.is_memory() {
        super::page_writeback::bdi_start(m, a.dev());
        // A mapped file's faults read from its device: the standby readers too.
        if let Some(me) = m.self_arc() {
            super::handler::start_standby_readers(&me);
        }
    }
    Ok(a)
}

/// Opens `path` read-write (creating it when `create`), with O_DIRECT when possible.
fn open_file(path: &Path, create: bool) -> io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(create);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// `iput`: drops a user (an open [`CachedFile`] or a file region). The last one writes the
/// file's dirty pages back and closes its descriptor ([`release_file`]); its clean pages
/// outlive the close, as the kernel's inode cache keeps them, leave through reclaim, and the
/// mapping is forgotten when its last page goes ([`FileTable::forget_if_unused`]); a reopen of
/// the unchanged file finds them. An unlinked file's pages are dropped at once (nobody can
/// read them again); an in-memory file goes with its last handle.
pub(crate) fn put_mapping(m: &MmInner, a: &Arc<AddressSpace>) {
    if a.users.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    if let Some(f) = a.file() {
        let unlinked = f.metadata().is_ok_and(|md| md.nlink() == 0);
        drop(f);
        if !unlinked {
            release_file(m, a);
            m.files.forget_if_unused(a);
            return;
        }
    }
    let mut t = m.files.0.write();
    if a.users.load(Ordering::Acquire) != 0 {
        // Reopened meanwhile.
        return;
    }
    if let Host::File { dev, ino, .. } = &a.host {
        t.by_inode.remove(&(*dev, *ino));
    }
    drop(t);
    super::truncate::evict_all(m, a);
    let mut t = m.files.0.write();
    t.by_id.remove(a.id);
}

/// The last user of file `a` is gone: its dirty pages are written back (WB_SYNC_ALL, without
/// waiting for the disk: the kernel has the data once the writes return) and its descriptor is
/// closed, so nothing of a closed file keeps a descriptor open, as no `struct file` outlives
/// its last close. A page that fails to write keeps the descriptor open: the flushers retry it
/// and a later sync reports the error (errseq). A reopen meanwhile keeps the descriptor.
fn release_file(m: &MmInner, a: &Arc<AddressSpace>) {
    if let Err(e) = filemap::write_cache_pages(m, a, PgOff::ZERO, PgOff::MAX, true, i64::MAX) {
        log::warn!(
            "writeback of {} at its last close: {e}; kept open",
            a.name()
        );
        return;
    }
    if a.tagged(&m.vm, super::radix_tree::Mark::Dirty) {
        log::warn!(
            "{} still has dirty pages at its last close; kept open",
            a.name()
        );
        return;
    }
    let Host::File { file, closed, .. } = &a.host else {
        return;
    };
    // Under the table lock: a reopen (iget) either took a user before (kept open) or comes
    // after and finds the descriptor closed.
    let _t = m.files.0.write();
    if a.users.load(Ordering::Acquire) != 0 {
        return;
    }
    let mut fd = file.write();
    if let Some(f) = fd.as_ref() {
        match f.metadata() {
            Ok(md) => *closed.lock() = Some(FileStamp::of(&md)),
            // Never reused without a stamp: a reopen starts afresh.
            Err(e) => log::debug!("stat of {} at close: {e}", a.name()),
        }
    }
    *fd = None;
}

/// Writes back every closed file's dirty pages (manager teardown).
pub(crate) fn writeback_all(m: &MmInner) {
    let all = m.files.all();
    for a in all {
        if a.file().is_some() {
            let cursor = AtomicU64::new(a.wb_err.sample());
            if let Err(e) = filemap::sync_range(m, &a, PgOff::ZERO, PgOff::MAX, &cursor) {
                log::error!("writeback of {} at manager teardown: {e}", a.name());
            }
        }
    }
}

/// A file read and written through usermm's page cache (or an in-memory file).
///
/// ```no_run
/// # use usermm::{Mm, MmConfig};
/// let mm = Mm::new(MmConfig::new(64 << 20)).unwrap();
/// let f = mm.open("/tmp/data.bin").unwrap();
/// f.write_at(0, b"hello").unwrap();
/// let mut b = [0u8; 5];
/// f.read_at(0, &mut b).unwrap();
/// f.sync().unwrap(); // written back and fdatasync'd; reports a writeback error once
/// ```
pub struct CachedFile {
    pub(crate) mapping: Arc<AddressSpace>,
    pub(crate) h: Arc<MmHandle>,
    ra: Mutex<FileRaState>,
    err_cursor: AtomicU64,
}

impl std::fmt::Debug for CachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedFile")
            .field("name", &self.mapping.name())
            .field("len", &self.len())
            .finish()
    }
}

impl Mm {
    /// Opens `path` (created if missing) for buffered I/O through the page cache.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<CachedFile> {
        let a = iget(self.inner(), path.as_ref(), true)?;
        Ok(self.cached(a))
    }

    /// A new in-memory file (tmpfs-like): no backing file; its pages go to swap when evicted.
    pub fn memfile(&self, name: &str) -> Result<CachedFile> {
        if self.inner().swap.is_none() {
            log::debug!("in-memory file {name} without swap: its pages cannot be evicted");
        }
        Ok(self.cached(self.inner().files.new_memory(name)))
    }

    fn cached(&self, a: Arc<AddressSpace>) -> CachedFile {
        CachedFile {
            err_cursor: AtomicU64::new(a.wb_err.sample()),
            mapping: a,
            h: self.h.clone(),
            ra: Mutex::new(FileRaState::default()),
        }
    }

    /// Writes back every dirty file page and fdatasyncs every file (`sync(2)`), returning the
    /// first writeback error not yet reported to this manager's syncs.
    pub fn sync(&self) -> Result<()> {
        let m = self.inner();
        let all = m.files.all();
        let mut first = None;
        for a in all {
            if a.file().is_none() {
                continue;
            }
            if let Err(e) = filemap::sync_range(m, &a, PgOff::ZERO, PgOff::MAX, &a.sync_cursor) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl CachedFile {
    fn m(&self) -> &MmInner {
        &self.h.inner
    }

    /// Reads up to `buf.len()` bytes at `pos`; returns bytes read (0 at end of file).
    pub fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<usize> {
        filemap::file_read(self.m(), &self.mapping, &self.ra, pos, buf)
    }

    /// Reads exactly `buf.len()` bytes at `pos`.
    pub fn read_exact_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let n = self.read_at(pos, buf)?;
        if n < buf.len() {
            return Err(FileError::ReadPastEnd {
                len: buf.len(),
                pos,
                name: self.mapping.name(),
                size: self.len(),
            }
            .into());
        }
        Ok(())
    }

    /// Writes `buf` at `pos` into the page cache (extending the file); written back later by
    /// the flusher, or now by [`CachedFile::sync`].
    pub fn write_at(&self, pos: u64, buf: &[u8]) -> Result<usize> {
        filemap::file_write(self.m(), &self.mapping, pos, buf)
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        self.mapping.size.load(Ordering::Acquire)
    }

    /// True when the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Truncates or extends the file.
    pub fn set_len(&self, size: u64) -> Result<()> {
        super::truncate::truncate(self.m(), &self.mapping, size)
    }

    /// Writes back the dirty pages and fdatasyncs; returns a writeback error once per handle.
    pub fn sync(&self) -> Result<()> {
        filemap::sync_range(
            self.m(),
            &self.mapping,
            PgOff::ZERO,
            PgOff::MAX,
            &self.err_cursor,
        )
    }

    /// Bytes of this file in the page cache now.
    pub fn cached_bytes(&self) -> u64 {
        filemap::cached_bytes(&self.mapping)
    }

    /// The file's name (its path, or `memory:NAME`).
    pub fn name(&self) -> String {
        self.mapping.name()
    }

    /// Test builds only: the next `n` reads of this file's pages from its disk fail with EIO,
    /// as a failing device's would (`u32::MAX`: every read, until set to 0 again).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn inject_read_errors(&self, n: u32) {
        self.mapping
            .inject_read_errors
            .store(n, crate::sync::Ordering::SeqCst);
    }

    /// Whether the file is accessed with O_DIRECT (false: buffered with fadvise, or memory).
    pub fn is_direct(&self) -> bool {
        matches!(self.mapping.host, Host::File { direct: true, .. })
    }

    /// Turns readahead on (Linux's ondemand, the default) or off for this handle.
    pub fn set_readahead(&self, on: bool) {
        self.ra.lock().ondemand = on;
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        put_mapping(&self.h.inner, &self.mapping);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm::filemap::*;
    use crate::mm::page::pg;
    use crate::{Behaviour, MmConfig, Settings, SwapConfig, Switch};

    fn mm(s: Settings) -> Mm {
        Mm::new(MmConfig::new(4 << 20).swap(SwapConfig::None).settings(s)).unwrap()
    }

    #[test]
    fn fgp_flags_and_wrappers() {
        let m = mm(Settings::default());
        let f = m.memfile("t").unwrap();
        let (inner, a) = (m.inner(), &f.mapping);
        assert!(
            find_get_page(inner, a, PgOff::new(0)).unwrap().is_none(),
            "no CREAT"
        );
        let p = find_or_create_page(inner, a, PgOff::new(0))
            .unwrap()
            .unwrap();
        let d = &inner.node.pages[p];
        assert!(d.test(pg::LOCKED) && d.test(pg::REFERENCED) && d.test(pg::LRU));
        assert!(!d.test(pg::ACTIVE));
        assert_eq!(d.page_count(), 2, "cache + caller");
        assert!(
            grab_cache_page_nowait(inner, a, PgOff::new(0))
                .unwrap()
                .is_none(),
            "NOWAIT does not wait for a locked page"
        );
        d.unlock();
        put_page(&inner.node, p);
        let q = find_lock_page(inner, a, PgOff::new(0)).unwrap().unwrap();
        assert_eq!(p, q);
        assert!(d.test(pg::LOCKED));
        d.unlock();
        put_page(&inner.node, q);
        // ACCESSED on an existing, referenced page activates it (mark_page_accessed).
        let r = pagecache_get_page(inner, a, PgOff::new(0), Fgp::ACCESSED)
            .unwrap()
            .unwrap();
        assert!(d.test(pg::ACTIVE) && !d.test(pg::REFERENCED));
        put_page(&inner.node, r);
        assert_eq!(d.page_count(), 1);
        assert_eq!(a.nrpages.load(Ordering::Relaxed), 1);
    }

    /// Seed 002: with the new behaviour write_begin returns a new page already referenced (a
    /// plain store before it was inserted) and write_end does not mark it again; with the old
    /// one it is marked after the copy. The end state is the same.
    #[test]
    fn seed_002_accessed_init() {
        for b in [Behaviour::New, Behaviour::Old] {
            let m = mm(Settings::default().with(Switch::AccessedInit, b));
            let f = m.memfile("t").unwrap();
            let (inner, a) = (m.inner(), &f.mapping);
            let p = grab_cache_page_write_begin(inner, a, PgOff::new(3))
                .unwrap()
                .unwrap();
            let d = &inner.node.pages[p];
            assert_eq!(d.test(pg::REFERENCED), b == Behaviour::New, "{b:?}");
            d.unlock();
            put_page(&inner.node, p);
            f.write_at(8 << 12, &[1u8; 4096]).unwrap();
            let p = find_get_page(inner, a, PgOff::new(8)).unwrap().unwrap();
            let d = &inner.node.pages[p];
            assert!(d.test(pg::REFERENCED) && !d.test(pg::ACTIVE), "{b:?}");
            put_page(&inner.node, p);
            // A second write to the page activates it either way.
            f.write_at(8 << 12, &[2u8; 16]).unwrap();
            assert!(d.test(pg::ACTIVE), "{b:?}");
        }
    }
}
