//! The file swap device: swap slots stored in a preallocated file, written and read with
//! `pwritev`/`preadv` straight from and into the frame pool. Mirrors `mm/page_io.c`
//! (`swap_writepage`, `swap_read_folio`, the swap-over-file path) and the swapfile setup in
//! `mm/swapfile.c` (`swapon`: size checks, preallocation, no holes).
//!
//! The file is opened with `O_DIRECT` when the filesystem allows it, so swapped-out pages are not
//! also kept in the kernel's page cache. Filesystems that refuse `O_DIRECT` (older tmpfs, some
//! FUSE) get buffered I/O instead: after each write batch the range is written back and dropped
//! from the page cache (`sync_file_range` + `POSIX_FADV_DONTNEED`), and read ranges are dropped
//! after reading, so the cache does not hold a second copy either (on tmpfs the file itself is
//! memory; nothing can help there).
//!
//! Without a path the device is an unlinked temporary file in `$TMPDIR` (mode 0600) that lives as
//! long as the device.
//!
//! A given path (`--swap file:PATH`) holds process memory, so usermm never writes over a file it
//! did not make and never leaves memory behind:
//! - a new file is made without a name (`O_TMPFILE`, mode 0600, in the path's directory),
//!   locked and given its header; only a kept one ([`FileSwapOptions::keep`]) is then linked at
//!   the path. An unkept file never has a name: process memory never outlives the process on
//!   disk, not even after SIGKILL, nothing is left to clean up at exit, and managers starting at
//!   once on one path each get their own file (none ever sees another's half-made file).
//!   Filesystems without `O_TMPFILE` get the file created at the path (`O_CREAT | O_EXCL`),
//!   locked, and (unless kept) unlinked at once;
//! - an existing path must be a swap file usermm made earlier: one whose first page is
//!   usermm's swap header ([`HEADER_MAGIC`], a version, the page size and the slot count), e.g.
//!   a kept one or one left by a killed process. Any other file (even an empty one), a symbolic
//!   link, or a file owned by another user is refused with an error naming it. A reused file is
//!   truncated to nothing before use, so nothing of the earlier process survives, and (unless
//!   kept) its path is unlinked at once (only if it still names the same file);
//! - slots start after the header page (slot `s` is at byte `(s + 1) * 4096`);
//! - an exclusive `flock` is taken before anything else: a second manager (in this process or
//!   another) opening a path whose file is in use gets an error (`ResourceBusy`) instead of
//!   overwriting pages.
//!
//! A kept file stays after the process (as asked); with [`FileSwapOptions::encrypt`] (see
//! `crypt.rs`) what it holds is unreadable without the key, which died with the process.
//!
//! Also holds the size, slot-range and pool-page checks every backend shares.

use crate::sync::{AtomicU64, Ordering};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::crypt::SlotCipher;
use super::{SlotRun, SwapDevice};
use crate::conv::Narrow;
use crate::sys::{self, Mapping, PAGE_SIZE};

const PAGE: u64 = PAGE_SIZE as u64;

/// The first bytes of a swap file usermm made (its header page).
pub const HEADER_MAGIC: &[u8; 16] = b"usermm swapfile\0";
/// The header layout version this build writes and reuses.
pub const HEADER_VERSION: u32 = 1;

/// Choices for a file swap device, from [`crate::MmConfig`]'s `swap_encrypt` and `swap_keep`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileSwapOptions {
    /// Encrypt every page written (ChaCha20-Poly1305, a random key held only in memory).
    pub encrypt: bool,
    /// Keep a named swap file on disk (default: the file has no name while in use, so
    /// nothing outlives the process). Its pages are useless to anyone without the process
    /// (and, encrypted, unreadable).
    pub keep: bool,
    /// Leave the file sparse (blocks allocated as pages are first written) instead of
    /// preallocating it: the default swap file of `MmConfig::from_env`, sized by the free
    /// space of its filesystem.
    pub sparse: bool,
}

/// A swap device backed by a file (see the module documentation).
#[derive(Debug)]
pub struct FileSwap {
    file: File,
    nr_pages: u64,
    direct: bool,
    location: Location,
    /// Byte offset of slot 0: one header page for a named file, 0 for an unlinked one.
    base: u64,
    crypt: Option<SlotCipher>,
    /// The descriptor holding the `flock` on a named file (the I/O descriptor may be a second
    /// open with O_DIRECT).
    _lock: Option<File>,
}

#[derive(Debug)]
enum Location {
    /// A path the caller gave: the file has no name while in use unless `keep`.
    Path { path: PathBuf, keep: bool },
    /// An unlinked temporary file created in this directory.
    Unlinked(PathBuf),
}

/// Truncates (through `file` if given, else by path) and removes `path` if it still names the
/// file (`dev`, `ino`).
fn remove_if_same(path: &Path, dev: u64, ino: u64, file: Option<&File>) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (dev, ino) => {
            // Truncate first: the blocks go even if another name (a hard link) refers to it.
            let t = match file {
                Some(f) => f.set_len(0),
                None => OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(path)
                    .and_then(|f| f.set_len(0)),
            };
            if let Err(e) = t {
                log::warn!("cannot truncate swap file {}: {e}", path.display());
            }
            if let Err(e) = std::fs::remove_file(path) {
                log::warn!(
                    "cannot remove swap file {}: {e}; remove it by hand",
                    path.display()
                );
            }
        }
        _ => {
            if let Some(f) = file {
                let _ = f.set_len(0);
            }
            log::warn!(
                "swap file {} was moved or replaced while in use; its data was truncated",
                path.display()
            );
        }
    }
}

impl Drop for FileSwap {
    fn drop(&mut self) {
        if let Location::Path {
            path, keep: true, ..
        } = &self.location
        {
            log::info!("keeping swap file {} as asked", path.display());
        }
        // Otherwise the file was unlinked when it was opened: closing it frees its blocks.
    }
}

impl FileSwap {
    /// What follows a read of slots `slot..` into `pages`: the page cache's copy dropped (a
    /// buffered file), the pages decrypted and authenticated (an encrypted one).
    fn after_read(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        if !self.direct {
            let off = self.base + slot * PAGE;
            if let Err(e) = sys::fadvise_dontneed(&self.file, off, pages.len() as u64 * PAGE) {
                log::debug!("fadvise(DONTNEED) on {}: {e}", self.name());
            }
        }
        if let Some(c) = &self.crypt {
            open_pages(c, slot, pool, pages)
                .map_err(|e| self.io_error(&e, "read", slot, pages.len()))?;
        }
        Ok(())
    }

    /// Opens a swap file of `size` bytes (rounded down to whole pages; at least one page).
    ///
    /// `None` creates an unlinked temporary file in [`std::env::temp_dir`] (honours `$TMPDIR`);
    /// `Some(path)` creates or reuses that file (mode 0600, its length the device size plus the
    /// header page); unless kept, its path is unlinked at once (module docs).
    pub fn open(path: Option<&Path>, size: u64) -> io::Result<Self> {
        Self::open_with(path, size, FileSwapOptions::default())
    }

    /// [`FileSwap::open`] with options (encryption, keeping a named file, sparse).
    pub fn open_with(path: Option<&Path>, size: u64, opts: FileSwapOptions) -> io::Result<Self> {
        let prealloc = !opts.sparse;
        let mut dev = match path {
            None => Self::create_unlinked(&std::env::temp_dir(), size, true, prealloc)?,
            Some(p) => Self::open_path(p, size, opts.keep, prealloc)?,
        };
        if opts.encrypt {
            dev.crypt = Some(SlotCipher::new(dev.nr_pages)?);
        }
        Ok(dev)
    }

    /// Whether pages are encrypted before they reach the file.
    pub fn is_encrypted(&self) -> bool {
        self.crypt.is_some()
    }

    /// Creates the swap file as an unlinked temporary file in `dir` (mode 0600, unique name,
    /// removed from the directory before this returns).
    pub fn open_unlinked_in(dir: &Path, size: u64) -> io::Result<Self> {
        Self::create_unlinked(dir, size, true, true)
    }

    /// [`FileSwap::open_unlinked_in`] that never tries O_DIRECT, to test the buffered path.
    #[cfg(test)]
    pub(super) fn open_unlinked_buffered_in(dir: &Path, size: u64) -> io::Result<Self> {
        Self::create_unlinked(dir, size, false, true)
    }

    fn create_unlinked(
        dir: &Path,
        size: u64,
        try_direct: bool,
        prealloc: bool,
    ) -> io::Result<Self> {
        let nr_pages = pages_for_size(size)?;
        let hint = "set TMPDIR or pass a writable swap path";
        let (file, path) = create_unique(dir).map_err(|e| {
            annotate(
                &e,
                &format!("cannot create swap file in {}", dir.display()),
                hint,
            )
        })?;
        // The file exists on disk from here on: remove its name whatever happens next.
        let set_up = set_up(file, &path, nr_pages * PAGE, hint, try_direct, prealloc);
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!(
                "cannot unlink temporary swap file {}: {e}; remove it by hand",
                path.display()
            );
        }
        let (file, direct) = set_up?;
        Ok(FileSwap {
            file,
            nr_pages,
            direct,
            location: Location::Unlinked(dir.to_path_buf()),
            base: 0,
            crypt: None,
            _lock: None,
        })
    }

    fn open_path(path: &Path, size: u64, keep: bool, prealloc: bool) -> io::Result<Self> {
        let nr_pages = pages_for_size(size)?;
        match Self::create_nameless(path, nr_pages, keep, prealloc)? {
            Some(dev) => Ok(dev),
            // The path names something already (or the filesystem has no O_TMPFILE).
            None => Self::open_named(path, nr_pages, keep, prealloc),
        }
    }

    /// A new swap file for `path` made without a name (`O_TMPFILE` in the path's directory),
    /// locked and given its header, then (only if kept) linked at `path`: no other opener ever
    /// sees it half made (an empty file it would refuse, or an unlocked one). An unkept file
    /// never gets a name at all. None when `path` already names something (it is reused or
    /// refused by [`FileSwap::open_named`]) or the filesystem cannot make nameless files.
    fn create_nameless(
        path: &Path,
        nr_pages: u64,
        keep: bool,
        prealloc: bool,
    ) -> io::Result<Option<Self>> {
        if std::fs::symlink_metadata(path).is_ok() || no_tmpfile_for_test() {
            return Ok(None);
        }
        let hint = "pass a writable swap path";
        let p = path.display();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(dir)
        {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(annotate(&e, &format!("cannot open swap file {p}"), hint)),
        };
        // Nobody else can reach the file yet; the lock is held before it gets a name.
        if !sys::flock_exclusive_nb(&file).map_err(io::Error::from)? {
            return Err(io::Error::other(format!(
                "cannot lock the new swap file for {p}"
            )));
        }
        let lock = file.try_clone()?;
        let (file, direct) = set_up_named(file, path, nr_pages, hint, prealloc)?;
        if keep {
            match sys::link_open_file(&lock, path) {
                Ok(()) => {}
                // Made meanwhile by someone else: that file is reused or refused instead.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(None),
                Err(e) => {
                    return Err(annotate(
                        &e.into(),
                        &format!("cannot create swap file {p}"),
                        hint,
                    ))
                }
            }
        }
        Ok(Some(Self::named(file, direct, lock, nr_pages, path, keep)))
    }

    /// The swap file at `path` when it exists (reused if usermm made it, else refused) or when
    /// nameless files cannot be made there (created with `O_EXCL`).
    fn open_named(path: &Path, nr_pages: u64, keep: bool, prealloc: bool) -> io::Result<Self> {
        let hint = "pass a writable swap path";
        let p = path.display();
        let what = format!("cannot open swap file {p}");
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        // A new file, created here (O_EXCL); or one usermm made before (checked below).
        let (file, created) = match o.clone().create_new(true).open(path) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => (
                o.open(path).map_err(|e| {
                    if e.raw_os_error() == Some(libc::ELOOP) {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("swap path {p} is a symbolic link: give the file's own path"),
                        )
                    } else {
                        annotate(&e, &what, hint)
                    }
                })?,
                false,
            ),
            Err(e) => return Err(annotate(&e, &what, hint)),
        };
        let meta = file.metadata().map_err(|e| annotate(&e, &what, hint))?;
        if !meta.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("swap path {p} is not a regular file: {hint}"),
            ));
        }
        if !sys::flock_exclusive_nb(&file).map_err(|e| annotate(&e.into(), &what, hint))? {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "swap file {p} is in use by another usermm manager: give each manager its \
                     own swap path"
                ),
            ));
        }
        let lock = file.try_clone().map_err(|e| annotate(&e, &what, hint))?;
        if !created {
            check_reusable(&file, &meta, path)?;
            // Nothing of the earlier process survives: drop its pages before anything else.
            file.set_len(0).map_err(|e| annotate(&e, &what, hint))?;
        }
        if !keep {
            // Unlinked at once (the open descriptor keeps it): process memory never outlives
            // the process on disk, not even after SIGKILL. The lock is taken first, so a
            // manager opening the path meanwhile gets "in use" rather than this file.
            remove_if_same(path, meta.dev(), meta.ino(), Some(&file));
        }
        if meta.mode() & 0o077 != 0 {
            // Swapped pages are process memory: keep them private like a fresh file.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| {
                    annotate(&e, &format!("cannot set mode 0600 on swap file {p}"), hint)
                })?;
        }
        let set = set_up_named(file, path, nr_pages, hint, prealloc);
        let (file, direct) = match set {
            Ok(x) => x,
            Err(e) => {
                // Leave nothing behind: a file made here goes, a reused one stays empty.
                let _ = lock.set_len(0);
                // (Without keep the path was unlinked already, and may name another's file.)
                if created && keep {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
        };
        Ok(Self::named(file, direct, lock, nr_pages, path, keep))
    }

    /// The device on a named swap file, its header page first (`lock` holds the flock).
    fn named(file: File, direct: bool, lock: File, nr_pages: u64, path: &Path, keep: bool) -> Self {
        FileSwap {
            file,
            nr_pages,
            direct,
            location: Location::Path {
                path: path.to_path_buf(),
                keep,
            },
            base: PAGE,
            crypt: None,
            _lock: Some(lock),
        }
    }

    /// Whether the file is accessed with `O_DIRECT` (false: buffered fallback).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's path, if the caller gave one (None for the unlinked temporary file).
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::Path { path, .. } => Some(path),
            Location::Unlinked(_) => None,
        }
    }

    fn io_error(&self, e: &io::Error, op: &str, slot: u64, n: usize) -> io::Error {
        io::Error::new(
            e.kind(),
            format!(
                "swap {op} of {n} pages at slot {slot} on {}: {e}",
                self.name()
            ),
        )
    }
}

impl SwapDevice for FileSwap {
    fn name(&self) -> String {
        let mode = match (self.direct, self.crypt.is_some()) {
            (true, false) => "O_DIRECT",
            (false, false) => "buffered",
            (true, true) => "O_DIRECT, encrypted",
            (false, true) => "buffered, encrypted",
        };
        match &self.location {
            Location::Path { path, .. } => format!("file:{} ({mode})", path.display()),
            Location::Unlinked(dir) => format!("file:(unlinked in {}, {mode})", dir.display()),
        }
    }

    fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        if pages.is_empty() {
            return Ok(());
        }
        let (off, len) = (self.base + slot * PAGE, pages.len() as u64 * PAGE);
        match &self.crypt {
            None => pool
                .pwrite_pages(&self.file, off, pages)
                .map_err(io::Error::from),
            Some(c) => seal_pages(c, slot, pool, pages)
                .and_then(|(bounce, offs)| Ok(bounce.pwrite_pages(&self.file, off, &offs)?)),
        }
        .map_err(|e| self.io_error(&e, "write", slot, pages.len()))?;
        if !self.direct {
            // Write the batch back now and drop it from the page cache: the device copy is the
            // only copy, as with O_DIRECT.
            sys::sync_file_range_wait(&self.file, off, len)
                .map_err(|e| self.io_error(&e.into(), "writeback", slot, pages.len()))?;
            if let Err(e) = sys::fadvise_dontneed(&self.file, off, len) {
                log::debug!("fadvise(DONTNEED) on {}: {e}", self.name());
            }
        }
        Ok(())
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        if pages.is_empty() {
            return Ok(());
        }
        let off = self.base + slot * PAGE;
        pool.pread_pages(&self.file, off, pages)
            .map_err(|e| self.io_error(&e.into(), "read", slot, pages.len()))?;
        self.after_read(slot, pool, pages)
    }

    /// All runs in flight at once through io_uring where this process has it (the runs of a
    /// readahead window are scattered over the file: one device round trip instead of one per
    /// run); otherwise, or for a single run, [`FileSwap::read_pages`] per run.
    fn read_runs(&self, runs: &[SlotRun<'_>], pool: &Mapping) -> Vec<io::Result<()>> {
        if runs.len() < 2 || !sys::ring::available() {
            return super::read_runs_in_turn(self, runs, pool);
        }
        let mut out: Vec<io::Result<()>> = runs
            .iter()
            .map(|r| {
                check_slots(r.slot, r.pages.len() as u64, self.nr_pages)?;
                check_pool_pages(pool, r.pages)
            })
            .collect();
        let todo: Vec<usize> = (0..runs.len())
            .filter(|&k| out[k].is_ok() && !runs[k].pages.is_empty())
            .collect();
        let ops: Vec<sys::ring::PageIo<'_>> = todo
            .iter()
            .map(|&k| sys::ring::PageIo {
                mem: pool,
                pages: runs[k].pages,
                file_off: self.base + runs[k].slot * PAGE,
            })
            .collect();
        for (&k, res) in todo.iter().zip(sys::ring::read_pages(&self.file, &ops)) {
            let (slot, pages) = (runs[k].slot, runs[k].pages);
            out[k] = res
                .map_err(|e| self.io_error(&e.into(), "read", slot, pages.len()))
                .and_then(|()| self.after_read(slot, pool, pages));
        }
        out
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(c) = &self.crypt {
            c.forget(slot, n);
        }
        match sys::punch_hole(&self.file, self.base + slot * PAGE, n * PAGE) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!(
                    "swap discard of {n} pages at slot {slot} on {}: {e}",
                    self.name()
                ),
            )),
        }
    }
}

/// Creates a fresh file with a unique name in `dir`, mode 0600.
fn create_unique(dir: &Path) -> io::Result<(File, PathBuf)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last_err = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "usermm-swap-{}-{}-{nanos:09}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// Checks that the existing file at `path` is a swap file usermm made, owned by this user:
/// anything else is refused, never overwritten.
fn check_reusable(file: &File, meta: &std::fs::Metadata, path: &Path) -> io::Result<()> {
    let p = path.display();
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "swap path {p} already exists and {why}; usermm only reuses swap files it made: \
                 remove it or give a new path"
            ),
        )
    };
    if meta.uid() != sys::geteuid() {
        return Err(refuse(format!("belongs to user {}", meta.uid())));
    }
    let mut head = [0u8; 32];
    let n = read_head(file, &mut head)?;
    if n < head.len() || &head[..16] != HEADER_MAGIC {
        return Err(refuse(if meta.len() == 0 {
            "is empty, not a usermm swap file".into()
        } else {
            format!(
                "is not a usermm swap file ({} bytes without usermm's swap header)",
                meta.len()
            )
        }));
    }
    let version = u32::from_le_bytes(head[16..20].try_into().expect("4 bytes"));
    if version != HEADER_VERSION {
        return Err(refuse(format!(
            "is a usermm swap file of header version {version} (this usermm writes \
             {HEADER_VERSION})"
        )));
    }
    Ok(())
}

fn read_head(file: &File, head: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes the header page (magic, version, page size, slot count, creator pid) at offset 0.
fn write_header(file: &File, nr_pages: u64) -> io::Result<()> {
    let mut h = [0u8; 40];
    h[..16].copy_from_slice(HEADER_MAGIC);
    h[16..20].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    h[20..24].copy_from_slice(&PAGE_SIZE.u32().to_le_bytes());
    h[24..32].copy_from_slice(&nr_pages.to_le_bytes());
    h[32..36].copy_from_slice(&std::process::id().to_le_bytes());
    // Through a page-aligned buffer, so that an O_DIRECT descriptor takes it.
    let page = Mapping::anon(PAGE_SIZE, 0)?;
    page.write_bytes(0, &h)?;
    Ok(page.pwrite_pages(file, 0, &[0])?)
}

/// Encrypts the pool pages into a bounce buffer for slots `slot..`; returns the buffer and its
/// page offsets.
fn seal_pages(
    c: &SlotCipher,
    slot: u64,
    pool: &Mapping,
    pages: &[usize],
) -> io::Result<(Mapping, Vec<usize>)> {
    let bounce = Mapping::anon(pages.len() * PAGE_SIZE, 0)?;
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut offs = Vec::with_capacity(pages.len());
    for (i, &p) in pages.iter().enumerate() {
        pool.read_bytes(p, &mut buf)?;
        c.seal(slot + i as u64, &mut buf)?;
        bounce.write_bytes(i * PAGE_SIZE, &buf)?;
        offs.push(i * PAGE_SIZE);
    }
    Ok((bounce, offs))
}

/// Decrypts in place the pool pages just read from slots `slot..`.
fn open_pages(c: &SlotCipher, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, &p) in pages.iter().enumerate() {
        pool.read_bytes(p, &mut buf)?;
        c.open(slot + i as u64, &mut buf)?;
        pool.write_bytes(p, &buf)?;
    }
    Ok(())
}

/// Sizes and preallocates the freshly opened `file` at `path` and switches it to O_DIRECT where
/// the filesystem supports it. Returns the file to use and whether it is O_DIRECT.
fn set_up(
    file: File,
    path: &Path,
    len: u64,
    hint: &str,
    try_direct: bool,
    prealloc: bool,
) -> io::Result<(File, bool)> {
    let p = path.display();
    file.set_len(len).map_err(|e| {
        annotate(
            &e,
            &format!("cannot size swap file {p} to {len} bytes"),
            hint,
        )
    })?;
    match if prealloc {
        sys::fallocate(&file, len).map_err(io::Error::from)
    } else {
        Ok(())
    } {
        Ok(()) => {}
        // The filesystem cannot preallocate; the file is sized, blocks come on first write.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
            ) => {}
        Err(e) => {
            return Err(annotate(
                &e,
                &format!("cannot preallocate {len} bytes for swap file {p}"),
                "choose a smaller swap size or a filesystem with more free space",
            ))
        }
    }
    if !try_direct {
        return Ok((file, false));
    }
    match open_direct(&file, path) {
        Ok(Some(direct)) => Ok((direct, true)),
        Ok(None) => Ok((file, false)),
        Err(e) => Err(annotate(&e, &format!("cannot use swap file {p}"), hint)),
    }
}

/// [`set_up`] of a named swap file (`nr_pages` slots after the header page), then its header.
fn set_up_named(
    file: File,
    path: &Path,
    nr_pages: u64,
    hint: &str,
    prealloc: bool,
) -> io::Result<(File, bool)> {
    let (file, direct) = set_up(file, path, (nr_pages + 1) * PAGE, hint, true, prealloc)?;
    write_header(&file, nr_pages).map_err(|e| {
        annotate(
            &e,
            &format!("cannot write the header of swap file {}", path.display()),
            hint,
        )
    })?;
    Ok((file, direct))
}

/// Reopens the file with O_DIRECT and probes one aligned write and read. Ok(None) when the
/// filesystem refuses O_DIRECT (EINVAL), so the caller keeps the buffered file.
///
/// The reopen goes through `/proc/self/fd/N` (the open file itself, even once its path is
/// unlinked, as a named swap file's is before this runs); `path` only when `/proc` is not
/// mounted.
fn open_direct(buffered: &File, path: &Path) -> io::Result<Option<File>> {
    use std::os::fd::AsRawFd;
    let mut o = OpenOptions::new();
    o.read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC);
    let by_fd = Path::new("/proc/self/fd").join(buffered.as_raw_fd().to_string());
    let reopened = match o.open(&by_fd) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !Path::new("/proc/self").exists() => {
            o.open(path)
        }
        r => r,
    };
    let direct = match reopened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => {
            log::warn!(
                "cannot reopen swap file {} with O_DIRECT ({e}); using buffered I/O",
                path.display()
            );
            return Ok(None);
        }
    };
    let (a, b) = (buffered.metadata()?, direct.metadata()?);
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(io::Error::other(
            "the file was replaced while it was being opened",
        ));
    }
    let probe = Mapping::anon(PAGE_SIZE, 0)?;
    let probed = probe
        .pwrite_pages(&direct, 0, &[0])
        .and_then(|()| probe.pread_pages(&direct, 0, &[0]));
    match probed {
        Ok(()) => Ok(Some(direct)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: this thread's opens behave as on a filesystem without `O_TMPFILE`.
    pub(super) static NO_TMPFILE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn no_tmpfile_for_test() -> bool {
    #[cfg(test)]
    return NO_TMPFILE.with(|c| c.get());
    #[cfg(not(test))]
    false
}

/// `"{what} ({error text}): {hint}"`, keeping the error's kind.
fn annotate(e: &io::Error, what: &str, hint: &str) -> io::Error {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    io::Error::new(e.kind(), format!("{what} ({text}): {hint}"))
}

/// The number of pages in a device of `size` bytes (rounded down); at least one.
pub(super) fn pages_for_size(size: u64) -> io::Result<u64> {
    let nr_pages = size / PAGE;
    if nr_pages == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("swap size {size} bytes is below the minimum of {PAGE} bytes (one page)"),
        ));
    }
    let max = (i64::MAX as u64 / PAGE).min(usize::MAX as u64 / PAGE);
    if nr_pages > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "swap size {size} bytes exceeds the maximum of {} bytes",
                max * PAGE
            ),
        ));
    }
    Ok(nr_pages)
}

/// Checks that slots `[slot, slot+n)` lie inside a device of `nr_pages` slots.
pub(super) fn check_slots(slot: u64, n: u64, nr_pages: u64) -> io::Result<()> {
    if !matches!(slot.checked_add(n), Some(end) if end <= nr_pages) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("swap slots {slot}+{n} outside device of {nr_pages} pages"),
        ));
    }
    Ok(())
}

/// Checks that every pool offset is a page-aligned page inside `pool`.
pub(super) fn check_pool_pages(pool: &Mapping, pages: &[usize]) -> io::Result<()> {
    for &p in pages {
        let inside = matches!(p.checked_add(PAGE_SIZE), Some(end) if end <= pool.len());
        if p & (PAGE_SIZE - 1) != 0 || !inside {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pool offset {p:#x} is not a page inside the pool of {:#x} bytes",
                    pool.len()
                ),
            ));
        }
    }
    Ok(())
}
