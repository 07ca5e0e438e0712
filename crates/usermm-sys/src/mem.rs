//! Owned anonymous mappings and the operations usermm performs on them: madvise, copies between
//! mappings, volatile word access and file I/O straight into or out of mapped pages.
//! Mirrors the user side of `mm/mmap.c` and `mm/madvise.c`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use super::PAGE_SIZE;
use crate::error::{Result, SysError, Syscall};

/// An owned, page-aligned, private anonymous mapping (`MAP_NORESERVE`: untouched pages cost no
/// memory). Unmapped on drop. The memory may be changed behind Rust's back (by userfaultfd
/// ioctls, the kernel, or application threads), so it is only reached through addresses, copies and
/// volatile accessors, never through references.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Advised `DontFork`: recorded for fork children ([`crate::forkguard`]) until dropped.
    fork_guarded: std::sync::atomic::AtomicBool,
}

// SAFETY: a Mapping is an address range owned by this process; every access goes through
// copies, volatile operations or system calls, so sharing the handle between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above; no method hands out references into the memory.
unsafe impl Sync for Mapping {}

/// madvise(2) advice values usermm uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Drop the pages; the next access sees zeros (or a userfault on a registered range).
    DontNeed,
    /// Populate (prefault) the pages writable.
    PopulateWrite,
    /// Populate the pages readable (maps the zero page for untouched anonymous memory).
    PopulateRead,
    /// Never back this range with transparent huge pages.
    NoHugePage,
    /// Back this range with transparent huge pages where possible.
    HugePage,
    /// Not inherited by a fork(2) child (the child sees nothing mapped there).
    DontFork,
    /// Random access expected: no readahead around faults on a file mapping (MADV_RANDOM).
    Random,
}

impl Advice {
    fn raw(self) -> libc::c_int {
        match self {
            Advice::DontNeed => libc::MADV_DONTNEED,
            Advice::PopulateWrite => 23, // MADV_POPULATE_WRITE
            Advice::PopulateRead => 22,  // MADV_POPULATE_READ
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::Random => libc::MADV_RANDOM,
        }
    }
}

/// Pages per process_madvise(2) call (UIO_MAXIOV).
pub const MAX_IOV: usize = 1024;

/// `PIDFD_SELF_THREAD_GROUP` (Linux >= 6.14): the calling process, with no pidfd to open.
const PIDFD_SELF_THREAD_GROUP: libc::c_int = -10001;

/// Set once process_madvise(2) turned out unable to advise the calling process.
static PROCESS_MADVISE_UNSUPPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn check_range(size: usize, off: usize, len: usize) -> Result<()> {
    if off.checked_add(len).is_none_or(|end| end > size) {
        return Err(SysError::OutOfRange { off, len, size });
    }
    Ok(())
}

impl Mapping {
    /// Maps `len` bytes (rounded up to a page) of private anonymous memory, or `align`-aligned if
    /// `align` is a power of two larger than a page (used for 2 MiB alignment).
    pub fn anon(len: usize, align: usize) -> Result<Self> {
        if len == 0 {
            return Err(SysError::arg(
                Syscall::Mmap,
                "mapping length must be greater than zero",
            ));
        }
        let overflow =
            || SysError::arg(Syscall::Mmap, format!("mapping length {len:#x} overflows"));
        let len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(overflow)?;
        let align = align.max(PAGE_SIZE);
        if !align.is_power_of_two() {
            return Err(SysError::arg(
                Syscall::Mmap,
                format!("alignment {align:#x} must be a power of two"),
            ));
        }
        let over = len.checked_add(align - PAGE_SIZE).ok_or_else(overflow)?;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address; no existing memory is
        // affected. MAP_NORESERVE keeps untouched address space free of commit charge.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last(
                Syscall::Mmap,
                format!("of {over:#x} bytes of anonymous memory"),
            ));
        }
        let base = p as usize;
        let start = base.next_multiple_of(align);
        let head = start - base;
        let tail = over - head - len;
        if head > 0 {
            // SAFETY: [base, start) is the unaligned head of the mapping we just created.
            unsafe { libc::munmap(base as *mut libc::c_void, head) };
        }
        if tail > 0 {
            // SAFETY: the tail past start+len belongs to the mapping we just created.
            unsafe { libc::munmap((start + len) as *mut libc::c_void, tail) };
        }
        Ok(Mapping {
            ptr: NonNull::new(start as *mut u8).expect("mmap returned null"),
            len,
            fork_guarded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Takes ownership of `[addr, addr+len)` (page-aligned, nonzero), an existing private
    /// anonymous read-write mapping, contents and all: the returned `Mapping` unmaps it when
    /// dropped. No system call. For a fork child's copy of the ranges its parent's manager
    /// served, which the child's own manager then adopts page by page (`Mm::adopt_anon`).
    pub fn adopt(addr: usize, len: usize) -> Result<Self> {
        if len == 0
            || addr == 0
            || !addr.is_multiple_of(PAGE_SIZE)
            || !len.is_multiple_of(PAGE_SIZE)
        {
            return Err(SysError::arg(
                Syscall::Mmap,
                format!("adopting {len:#x} bytes at {addr:#x}: address and length must be nonzero multiples of the page size"),
            ));
        }
        // The range must be mapped: mincore fails with ENOMEM on a hole.
        resident_at(addr, len)?;
        Ok(Mapping {
            ptr: NonNull::new(addr as *mut u8).expect("nonzero address"),
            len,
            fork_guarded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Maps `len` bytes of `fd` (from offset 0) MAP_SHARED, read-write.
    pub fn shared(fd: &impl AsRawFd, len: usize) -> Result<Self> {
        Self::file(fd, len, libc::MAP_SHARED, "MAP_SHARED")
    }

    /// Maps `len` bytes of `fd` (from offset 0) MAP_PRIVATE, read-write: reads see the file's
    /// pages, the first store to a page copies it (the file is never written through it).
    pub fn private_file(fd: &impl AsRawFd, len: usize) -> Result<Self> {
        Self::file(fd, len, libc::MAP_PRIVATE, "MAP_PRIVATE")
    }

    /// Maps `len` bytes of `fd` (from offset 0), read-write, with `flags` (named `what`).
    fn file(fd: &impl AsRawFd, len: usize, flags: libc::c_int, what: &str) -> Result<Self> {
        if len == 0 {
            return Err(SysError::arg(
                Syscall::Mmap,
                "mapping length must be greater than zero",
            ));
        }
        let len = len.next_multiple_of(PAGE_SIZE);
        // SAFETY: a new mapping of a file we hold open, at a kernel-chosen address; no existing
        // memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last(
                Syscall::Mmap,
                format!("({what}) of {len:#x} bytes of a file"),
            ));
        }
        Ok(Mapping {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned null"),
            len,
            fork_guarded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// First address of the mapping.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// madvise(2) over `[off, off+len)`.
    pub fn advise(&self, off: usize, len: usize, advice: Advice) -> Result<()> {
        check_range(self.len, off, len)?;
        // SAFETY: the range lies inside this mapping (checked); madvise does not invalidate any
        // Rust reference because none exist into managed memory.
        let r = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(off) as *mut libc::c_void,
                len,
                advice.raw(),
            )
        };
        if r != 0 {
            return Err(SysError::last(
                Syscall::Madvise,
                format!("({advice:?}) of {len:#x} bytes at {:#x}", self.addr() + off),
            ));
        }
        if advice == Advice::DontFork {
            // A fork child touching the range is told why it gets SIGSEGV.
            self.fork_guarded
                .store(true, std::sync::atomic::Ordering::Relaxed);
            crate::forkguard::remember(self.addr() + off, len);
        }
        Ok(())
    }

    /// msync(MS_SYNC) over the whole mapping: a shared file mapping's dirty pages are written to
    /// the file before it returns.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: the range is exactly this mapping; msync reads page tables and writes back
        // file pages, it does not change what the addresses map.
        let r = unsafe {
            libc::msync(
                self.ptr.as_ptr() as *mut libc::c_void,
                self.len,
                libc::MS_SYNC,
            )
        };
        if r != 0 {
            return Err(SysError::last(
                Syscall::Msync,
                format!("(MS_SYNC) of {:#x} bytes at {:#x}", self.len, self.addr()),
            ));
        }
        Ok(())
    }

    /// MADV_DONTNEED over one page at each of the (page-aligned) offsets `offs`, in one
    /// process_madvise(2) call per [`MAX_IOV`] pages: the kernel (>= 6.16) gathers the TLB
    /// flush of the whole vector into one shootdown, where a madvise(2) per page would send one
    /// inter-processor interrupt each (11-15 us per page on this VM when another thread of the
    /// process runs on the other vCPU, against 1.2-1.7 us per page in batches of 32;
    /// bench/ipi.md). Falls back to a madvise(2) per page where process_madvise cannot advise
    /// the calling process (before Linux 6.13).
    pub fn dontneed_pages(&self, offs: &[usize]) -> Result<()> {
        for &o in offs {
            check_range(self.len, o, PAGE_SIZE)?;
        }
        for chunk in offs.chunks(MAX_IOV) {
            if !PROCESS_MADVISE_UNSUPPORTED.load(std::sync::atomic::Ordering::Relaxed) {
                let iov: Vec<libc::iovec> = chunk
                    .iter()
                    .map(|&o| libc::iovec {
                        iov_base: self.ptr.as_ptr().wrapping_add(o) as *mut libc::c_void,
                        iov_len: PAGE_SIZE,
                    })
                    .collect();
                // SAFETY: every iovec names a page inside this mapping; MADV_DONTNEED does not
                // invalidate any Rust reference because none exist into managed memory.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        PIDFD_SELF_THREAD_GROUP,
                        iov.as_ptr(),
                        iov.len(),
                        libc::MADV_DONTNEED,
                        0u32,
                    )
                };
                if r >= 0 && r as usize == chunk.len() * PAGE_SIZE {
                    continue;
                }
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // No PIDFD_SELF (before 6.14), no self-advice (before 6.13), no syscall:
                    // per-page madvise from now on.
                    Some(libc::EBADF | libc::EINVAL | libc::ENOSYS | libc::EPERM) if r < 0 => {
                        PROCESS_MADVISE_UNSUPPORTED
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ if r < 0 => {
                        return Err(SysError::os(
                            Syscall::ProcessMadvise,
                            format!("(MADV_DONTNEED) of {} pages", chunk.len()),
                            e,
                        ))
                    }
                    // A partial result: the rest one by one below.
                    _ => {}
                }
            }
            for &o in chunk {
                self.advise(o, PAGE_SIZE, Advice::DontNeed)?;
            }
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_off` to this mapping at `off` (plain memcpy).
    pub fn copy_from(&self, off: usize, src: &Mapping, src_off: usize, len: usize) -> Result<()> {
        check_range(self.len, off, len)?;
        check_range(src.len, src_off, len)?;
        // SAFETY: both ranges are inside live mappings (checked). Callers own the pages involved
        // (frames under I/O or device slots), so concurrent writers are excluded by the page lock
        // protocol; even if not, the bytes copied are merely stale, never out of bounds.
        unsafe {
            std::ptr::copy(src.as_ptr().add(src_off), self.as_ptr().add(off), len);
        }
        Ok(())
    }

    /// Copies `buf` into the mapping at `off`.
    pub fn write_bytes(&self, off: usize, buf: &[u8]) -> Result<()> {
        check_range(self.len, off, buf.len())?;
        // SAFETY: destination inside the mapping (checked); `buf` is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.as_ptr().add(off), buf.len()) };
        Ok(())
    }

    /// Copies from the mapping at `off` into `buf`.
    pub fn read_bytes(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        check_range(self.len, off, buf.len())?;
        // SAFETY: source inside the mapping (checked); `buf` is a separate Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// The xxh3 hash of each of the `n` pages from `off` (page aligned). Callers hash pages
    /// nobody can store into meanwhile (a pool slot they own, a view page they write-protected):
    /// two hashes of a page taken around a moment when it could be written tell whether it was.
    /// Every page must be present (a missing page of a userfaultfd-registered range faults).
    pub fn hash_pages(&self, off: usize, n: usize) -> Result<Vec<u64>> {
        check_range(self.len, off, n * PAGE_SIZE)?;
        (0..n)
            .map(|k| self.hash_page(off + k * PAGE_SIZE))
            .collect()
    }

    /// [`Mapping::hash_pages`] of the one page at `off`, without allocating (the fault path
    /// may run in a signal handler).
    pub fn hash_page(&self, off: usize) -> Result<u64> {
        check_range(self.len, off, PAGE_SIZE)?;
        // SAFETY: the page is inside the mapping (checked) and present (the caller's
        // contract); the slice lives only for the hash, and the caller excludes stores to the
        // page meanwhile (a concurrent store could only make the hash differ, which callers
        // treat as "written").
        let page = unsafe { std::slice::from_raw_parts(self.as_ptr().add(off), PAGE_SIZE) };
        Ok(twox_hash::XxHash3_64::oneshot(page))
    }

    /// Which pages of `[off, off+len)` (page aligned) have a page mapped (mincore(2)): a store
    /// to a page that has none would fault (on a userfaultfd-registered range: into the
    /// handler).
    pub fn resident(&self, off: usize, len: usize) -> Result<Vec<bool>> {
        check_range(self.len, off, len)?;
        resident_at(self.as_ptr() as usize + off, len)
    }

    /// Fills `[off, off+len)` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<()> {
        check_range(self.len, off, len)?;
        // SAFETY: range inside the mapping (checked).
        unsafe { std::ptr::write_bytes(self.as_ptr().add(off), byte, len) };
        Ok(())
    }

    /// Panics unless a 64-bit word at `off` is aligned and inside the mapping, naming `op` and
    /// which of the two it is not.
    fn check_word(&self, op: &str, off: usize) {
        assert!(
            off.is_multiple_of(8),
            "{op} at {off:#x}: the offset is not a multiple of 8"
        );
        assert!(
            off.checked_add(8).is_some_and(|e| e <= self.len),
            "{op} at {off:#x}: past the end of the {}-byte mapping",
            self.len
        );
    }

    /// Volatile 64-bit load at `off` (8-byte aligned).
    pub fn read_u64(&self, off: usize) -> u64 {
        self.check_word("read_u64", off);
        // SAFETY: aligned and in bounds (asserted); volatile because the page may change.
        unsafe { std::ptr::read_volatile(self.as_ptr().add(off) as *const u64) }
    }

    /// Volatile 64-bit store at `off` (8-byte aligned).
    pub fn write_u64(&self, off: usize, v: u64) {
        self.check_word("write_u64", off);
        // SAFETY: aligned and in bounds (asserted); volatile because the page may change.
        unsafe { std::ptr::write_volatile(self.as_ptr().add(off) as *mut u64, v) }
    }

    /// The 64-bit word at `off` (8-byte aligned, in bounds: asserted) as an atomic, for a
    /// `MAP_SHARED` mapping whose words other processes update too (a budget shared by a process
    /// tree, `memcontrol.rs`). Only for memory no fault handler or reclaimer manages: such
    /// memory is never registered with userfaultfd, so the word stays mapped while `self` lives.
    pub fn atomic_u64(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.check_word("atomic_u64", off);
        // SAFETY: in bounds and 8-byte aligned (asserted), and AtomicU64 has u64's size and
        // alignment; the mapping lives as long as the returned reference (tied to &self). Every
        // access to these words, in this process or another mapping the same file, goes through
        // atomics, so no non-atomic reference to them exists.
        unsafe { &*(self.as_ptr().add(off) as *const std::sync::atomic::AtomicU64) }
    }

    /// The 32-bit word at `off` (4-byte aligned, in bounds: asserted) as an atomic, on the same
    /// terms as [`Mapping::atomic_u64`] (a futex word shared by processes).
    pub fn atomic_u32(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off.checked_add(4).is_some_and(|e| e <= self.len),
            "atomic_u32 at {off:#x}: unaligned or past the end of the {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds and 4-byte aligned (asserted), AtomicU32 has u32's size and
        // alignment, the mapping outlives the reference (tied to &self), and every access to the
        // word, here or in another process, is atomic.
        unsafe { &*(self.as_ptr().add(off) as *const std::sync::atomic::AtomicU32) }
    }

    /// Writes the pages at mapping offsets `pages` (each PAGE_SIZE long) to `file` at `file_off`,
    /// consecutively, with one pwritev per up to 512 pages.
    pub fn pwrite_pages(&self, file: &File, file_off: u64, pages: &[usize]) -> Result<()> {
        self.page_io(file, file_off, pages, true)
    }

    /// Reads `len` bytes of `file` at `file_off` into the mapping at `off`, stopping at end of
    /// file and zero-filling the rest. Returns the bytes read from the file. With O_DIRECT,
    /// `file_off`, `off` and `len` must be 4 KiB multiples (they are: callers read whole pages).
    /// A read that comes back short at a position inside a page found the end of the file: it
    /// is not read again from there. (With O_DIRECT such a read would be refused, EINVAL,
    /// whenever a writeback of a later page had meanwhile extended the file on disk: the page
    /// cache writes whole pages, then cuts the file back to its size.)
    pub fn pread_at(&self, file: &File, file_off: u64, off: usize, len: usize) -> Result<usize> {
        check_range(self.len, off, len)?;
        let mut done = 0usize;
        while done < len {
            // SAFETY: the destination [off+done, off+len) is inside this mapping (checked); the
            // kernel writes at most len-done bytes there.
            let r = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.as_ptr().add(off + done) as *mut libc::c_void,
                    len - done,
                    (file_off + done as u64) as libc::off_t,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(SysError::os(
                    Syscall::Pread,
                    format!(
                        "of {} bytes at file offset {}",
                        len - done,
                        file_off + done as u64
                    ),
                    e,
                ));
            }
            if r == 0 {
                break;
            }
            done += r as usize;
            if !(file_off + done as u64).is_multiple_of(PAGE_SIZE as u64) {
                break;
            }
        }
        if done < len {
            self.fill(off + done, len - done, 0)?;
        }
        Ok(done)
    }

    /// Reads consecutive pages of `file` from `file_off` into the mapping offsets `pages`.
    pub fn pread_pages(&self, file: &File, file_off: u64, pages: &[usize]) -> Result<()> {
        self.page_io(file, file_off, pages, false)
    }

    fn page_io(&self, file: &File, mut file_off: u64, pages: &[usize], write: bool) -> Result<()> {
        let call = if write {
            Syscall::Pwritev
        } else {
            Syscall::Preadv
        };
        for &p in pages {
            check_range(self.len, p, PAGE_SIZE)?;
        }
        for chunk in pages.chunks(512) {
            // Merge physically adjacent pages into one iovec.
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(chunk.len());
            for &p in chunk {
                // SAFETY: p is in bounds (checked above).
                let base = unsafe { self.as_ptr().add(p) };
                if let Some(last) = iov.last_mut() {
                    if last.iov_base as usize + last.iov_len == base as usize {
                        last.iov_len += PAGE_SIZE;
                        continue;
                    }
                }
                iov.push(libc::iovec {
                    iov_base: base as *mut libc::c_void,
                    iov_len: PAGE_SIZE,
                });
            }
            let mut total = chunk.len() * PAGE_SIZE;
            let mut idx = 0usize;
            while total > 0 {
                // SAFETY: every iovec covers PAGE_SIZE-multiples inside this mapping; the kernel
                // copies to or from them. Partial transfers advance the iovec array below.
                let r = unsafe {
                    if write {
                        libc::pwritev(
                            file.as_raw_fd(),
                            iov.as_ptr().add(idx),
                            (iov.len() - idx) as libc::c_int,
                            file_off as libc::off_t,
                        )
                    } else {
                        libc::preadv(
                            file.as_raw_fd(),
                            iov.as_ptr().add(idx),
                            (iov.len() - idx) as libc::c_int,
                            file_off as libc::off_t,
                        )
                    }
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(SysError::os(
                        call,
                        format!("of {total} bytes at file offset {file_off}"),
                        e,
                    ));
                }
                if r == 0 {
                    return Err(SysError::Short {
                        call,
                        write,
                        file_off,
                    });
                }
                let mut done = r as usize;
                total -= done;
                file_off += done as u64;
                if !write && total > 0 && !file_off.is_multiple_of(PAGE_SIZE as u64) {
                    // Short inside a page: the end of the file (as `pread_at`; with O_DIRECT
                    // the read from there would be refused).
                    return Err(SysError::Short {
                        call,
                        write,
                        file_off,
                    });
                }
                while done > 0 {
                    let v = &mut iov[idx];
                    if done >= v.iov_len {
                        done -= v.iov_len;
                        idx += 1;
                    } else {
                        // SAFETY: advancing within the same iovec's range.
                        v.iov_base =
                            unsafe { (v.iov_base as *mut u8).add(done) } as *mut libc::c_void;
                        v.iov_len -= done;
                        done = 0;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if *self.fork_guarded.get_mut() {
            crate::forkguard::forget(self.addr(), self.len);
        }
        // SAFETY: we own [ptr, ptr+len) since creation; no references into it exist.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// Which pages of `[addr, addr+len)` (page aligned) have a page mapped in this process
/// (mincore(2)). Reads page tables only: never faults, never touches the pages.
pub fn resident_at(addr: usize, len: usize) -> Result<Vec<bool>> {
    let n = len.div_ceil(PAGE_SIZE);
    let mut vec = vec![0u8; n];
    // SAFETY: mincore only reads page tables; it writes one byte per page of the range into
    // `vec`, which has n bytes, and fails with ENOMEM (not a fault) on unmapped addresses.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Mincore,
            format!("of {len:#x} bytes at {addr:#x}"),
        ));
    }
    Ok(vec.iter().map(|b| b & 1 != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dontneed_pages_drops_exactly_the_named_pages() {
        let m = Mapping::anon(3500 * PAGE_SIZE, 0).unwrap();
        for p in 0..3500 {
            m.write_u64(p * PAGE_SIZE, p as u64 + 1);
        }
        // More than one process_madvise vector (MAX_IOV) and scattered pages.
        let drop: Vec<usize> = (0..3500).filter(|p| p % 3 == 1).collect();
        let offs: Vec<usize> = drop.iter().map(|p| p * PAGE_SIZE).collect();
        assert!(offs.len() > MAX_IOV);
        m.dontneed_pages(&offs).unwrap();
        for p in 0..3500 {
            let want = if p % 3 == 1 { 0 } else { p as u64 + 1 };
            assert_eq!(m.read_u64(p * PAGE_SIZE), want, "page {p}");
        }
        let e = m.dontneed_pages(&[0, 3500 * PAGE_SIZE]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert_eq!(
            m.read_u64(0),
            1,
            "nothing dropped when one offset is out of range"
        );
        m.dontneed_pages(&[]).unwrap();
    }

    #[test]
    fn anon_aligned_and_accessible() {
        let m = Mapping::anon(3 * PAGE_SIZE + 1, 2 << 20).unwrap();
        assert_eq!(m.addr() % (2 << 20), 0);
        assert_eq!(m.len(), 4 * PAGE_SIZE);
        m.write_u64(8, 42);
        assert_eq!(m.read_u64(8), 42);
        m.advise(0, PAGE_SIZE, Advice::DontNeed).unwrap();
        assert_eq!(m.read_u64(8), 0);
    }

    #[test]
    fn zero_length_is_an_error() {
        let e = Mapping::anon(0, 0).unwrap_err();
        assert!(e.to_string().contains("greater than zero"));
    }

    #[test]
    fn out_of_range_is_an_error() {
        let m = Mapping::anon(PAGE_SIZE, 0).unwrap();
        assert!(m.fill(1, PAGE_SIZE, 0).is_err());
        assert!(m.advise(PAGE_SIZE, PAGE_SIZE, Advice::DontNeed).is_err());
    }

    /// A file that ends inside a block, read with O_DIRECT across its end: the bytes up to the
    /// end, zeros after, no error. Skips visibly where the filesystem refuses O_DIRECT (tmpfs).
    #[test]
    fn pread_at_stops_at_an_unaligned_end_of_an_o_direct_file() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::var("TMPDIR").unwrap_or_else(|_| "/var/tmp".into());
        let path =
            std::path::Path::new(&dir).join(format!("usermm-odirect-{}", std::process::id()));
        let body: Vec<u8> = (0..3 * PAGE_SIZE + 1234)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        std::fs::write(&path, &body).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        std::fs::remove_file(&path).unwrap();
        let Ok(f) = f else {
            crate::skip_test(&format!("{dir} refuses O_DIRECT"));
            return;
        };
        let m = Mapping::anon(8 * PAGE_SIZE, 0).unwrap();
        m.fill(0, 8 * PAGE_SIZE, 0xee).unwrap();
        // From page 1: two whole pages and 1234 bytes, then zeros to the end of the 6 pages.
        let n = m
            .pread_at(&f, PAGE_SIZE as u64, PAGE_SIZE, 6 * PAGE_SIZE)
            .unwrap();
        assert_eq!(n, 2 * PAGE_SIZE + 1234);
        let mut got = vec![0u8; 6 * PAGE_SIZE];
        m.read_bytes(PAGE_SIZE, &mut got).unwrap();
        assert_eq!(&got[..n], &body[PAGE_SIZE..]);
        assert!(got[n..].iter().all(|&b| b == 0), "zeros after the end");
        assert!(
            m.read_u64(0) == 0xeeee_eeee_eeee_eeee
                && m.read_u64(7 * PAGE_SIZE) == 0xeeee_eeee_eeee_eeee,
            "nothing outside the range touched"
        );
        // Wholly past the end: nothing read, all zeros.
        assert_eq!(
            m.pread_at(&f, 4 * PAGE_SIZE as u64, 0, PAGE_SIZE).unwrap(),
            0
        );
        // Pages read straight into place across the end: short, named as such.
        let e = m
            .pread_pages(&f, 2 * PAGE_SIZE as u64, &[0, PAGE_SIZE])
            .unwrap_err();
        assert!(
            matches!(e, crate::SysError::Short { write: false, .. }),
            "{e}"
        );
    }

    #[test]
    fn page_io_roundtrip() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("usermm-memtest-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let m = Mapping::anon(8 * PAGE_SIZE, 0).unwrap();
        for i in 0..8 {
            m.fill(i * PAGE_SIZE, PAGE_SIZE, i as u8 + 1).unwrap();
        }
        m.pwrite_pages(&f, 0, &[0, PAGE_SIZE, 5 * PAGE_SIZE])
            .unwrap();
        let n = Mapping::anon(8 * PAGE_SIZE, 0).unwrap();
        n.pread_pages(&f, 0, &[7 * PAGE_SIZE, 2 * PAGE_SIZE, 3 * PAGE_SIZE])
            .unwrap();
        let mut b = [0u8; 1];
        n.read_bytes(7 * PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b[0], 1);
        n.read_bytes(2 * PAGE_SIZE + 100, &mut b).unwrap();
        assert_eq!(b[0], 2);
        n.read_bytes(3 * PAGE_SIZE + 4095, &mut b).unwrap();
        assert_eq!(b[0], 6);
        assert!(n.pread_pages(&f, 100 * PAGE_SIZE as u64, &[0]).is_err());
    }
}

/// One source page of [`process_vm_write`]: a page of a mapping of this process, or a buffer.
#[derive(Debug, Clone, Copy)]
pub enum VmSrc<'a> {
    /// The page at byte offset `.1` of the mapping. The caller keeps it present and unchanged
    /// for the call (a missing page of a userfaultfd-registered mapping would fault).
    Page(&'a Mapping, usize),
    /// A page-sized buffer.
    Buf(&'a [u8]),
}

/// `process_vm_writev(2)`: writes each source page to its address in process `pid` (a fork
/// child: its parent may write its memory), at most 1024 pages per system call. Returns the
/// pages written (fewer than asked if one could not be: an error stops it; EPERM where the
/// kernel's ptrace rules refuse, ESRCH for a process gone).
pub fn process_vm_write(pid: i32, pages: &[(VmSrc<'_>, usize)]) -> io::Result<usize> {
    let mut local = Vec::with_capacity(pages.len());
    let mut remote = Vec::with_capacity(pages.len());
    for &(s, to) in pages {
        let base = match s {
            VmSrc::Page(m, off) => {
                check_range(m.len(), off, PAGE_SIZE).map_err(io::Error::other)?;
                // SAFETY: off + PAGE_SIZE is within the mapping (checked just above).
                unsafe { m.as_ptr().add(off) }
            }
            VmSrc::Buf(b) => {
                if b.len() != PAGE_SIZE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("a source buffer of {} bytes, not a page", b.len()),
                    ));
                }
                b.as_ptr() as *mut u8
            }
        };
        local.push(libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: PAGE_SIZE,
        });
        remote.push(libc::iovec {
            iov_base: to as *mut libc::c_void,
            iov_len: PAGE_SIZE,
        });
    }
    let mut done = 0usize;
    for (l, r) in local.chunks(1024).zip(remote.chunks(1024)) {
        // SAFETY: every local vector is a readable page of this process (a live mapping's page,
        // range-checked, or a buffer of exactly one page borrowed for this call); the remote
        // vectors are the other process's memory, which the kernel checks.
        let n = unsafe {
            libc::process_vm_writev(
                pid,
                l.as_ptr(),
                l.len() as libc::c_ulong,
                r.as_ptr(),
                r.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            if done == 0 {
                return Err(io::Error::last_os_error());
            }
            break;
        }
        done += n as usize / PAGE_SIZE;
        if (n as usize) < l.len() * PAGE_SIZE {
            break;
        }
    }
    Ok(done)
}
