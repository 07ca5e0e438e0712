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
//! long as the device. A given path is created or reused (mode 0600) and kept afterwards.
//!
//! Also holds the size, slot-range and pool-page checks every backend shares.

use crate::sync::{AtomicU64, Ordering};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::SwapDevice;
use crate::sys::{self, Mapping, PAGE_SIZE};

const PAGE: u64 = PAGE_SIZE as u64;

/// A swap device backed by a file (see the module documentation).
#[derive(Debug)]
pub struct FileSwap {
    file: File,
    nr_pages: u64,
    direct: bool,
    location: Location,
}

#[derive(Debug)]
enum Location {
    /// A path the caller gave; the file stays after the device is dropped.
    Path(PathBuf),
    /// An unlinked temporary file created in this directory.
    Unlinked(PathBuf),
}

impl FileSwap {
    /// Opens a swap file of `size` bytes (rounded down to whole pages; at least one page).
    ///
    /// `None` creates an unlinked temporary file in [`std::env::temp_dir`] (honours `$TMPDIR`);
    /// `Some(path)` creates or reuses that file, sets its mode to 0600 and its length to the
    /// device size, and leaves it in place when the device is dropped.
    pub fn open(path: Option<&Path>, size: u64) -> io::Result<Self> {
        Self::open_with(path, size, true)
    }

    /// [`FileSwap::open`] choosing whether the file's blocks are preallocated (fallocate) or
    /// the file stays sparse, its blocks allocated as pages are first written (the default
    /// swap file of `MmConfig::from_env`, sized by the free space of its filesystem).
    pub fn open_with(path: Option<&Path>, size: u64, prealloc: bool) -> io::Result<Self> {
        match path {
            None => Self::create_unlinked(&std::env::temp_dir(), size, true, prealloc),
            Some(p) => Self::open_path(p, size, prealloc),
        }
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
        })
    }

    fn open_path(path: &Path, size: u64, prealloc: bool) -> io::Result<Self> {
        let nr_pages = pages_for_size(size)?;
        let hint = "pass a writable swap path";
        let what = format!("cannot open swap file {}", path.display());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| annotate(&e, &what, hint))?;
        let meta = file.metadata().map_err(|e| annotate(&e, &what, hint))?;
        if !meta.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("swap path {} is not a regular file: {hint}", path.display()),
            ));
        }
        if meta.mode() & 0o077 != 0 {
            // Swapped pages are process memory: keep them private like a fresh file.
            if let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(0o600)) {
                log::warn!("cannot set mode 0600 on swap file {}: {e}", path.display());
            }
        }
        let (file, direct) = set_up(file, path, nr_pages * PAGE, hint, true, prealloc)?;
        Ok(FileSwap {
            file,
            nr_pages,
            direct,
            location: Location::Path(path.to_path_buf()),
        })
    }

    /// Whether the file is accessed with `O_DIRECT` (false: buffered fallback).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's path, if the caller gave one (None for the unlinked temporary file).
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::Path(p) => Some(p),
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
        let mode = if self.direct { "O_DIRECT" } else { "buffered" };
        match &self.location {
            Location::Path(p) => format!("file:{} ({mode})", p.display()),
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
        let (off, len) = (slot * PAGE, pages.len() as u64 * PAGE);
        pool.pwrite_pages(&self.file, off, pages)
            .map_err(|e| self.io_error(&e, "write", slot, pages.len()))?;
        if !self.direct {
            // Write the batch back now and drop it from the page cache: the device copy is the
            // only copy, as with O_DIRECT.
            sys::sync_file_range_wait(&self.file, off, len)
                .map_err(|e| self.io_error(&e, "writeback", slot, pages.len()))?;
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
        pool.pread_pages(&self.file, slot * PAGE, pages)
            .map_err(|e| self.io_error(&e, "read", slot, pages.len()))?;
        if !self.direct {
            if let Err(e) =
                sys::fadvise_dontneed(&self.file, slot * PAGE, pages.len() as u64 * PAGE)
            {
                log::debug!("fadvise(DONTNEED) on {}: {e}", self.name());
            }
        }
        Ok(())
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)?;
        if n == 0 {
            return Ok(());
        }
        match sys::punch_hole(&self.file, slot * PAGE, n * PAGE) {
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
        sys::fallocate(&file, len)
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

/// Reopens `path` with O_DIRECT and probes one aligned write and read. Ok(None) when the
/// filesystem refuses O_DIRECT (EINVAL), so the caller keeps the buffered file.
fn open_direct(buffered: &File, path: &Path) -> io::Result<Option<File>> {
    let direct = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
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
        Err(e) => Err(e),
    }
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
