//! usermm-sys: the workspace's OS layer and the only crate with `unsafe` besides the FFI edges
//! (the C ABI in usermm-capi, the interposed allocator in usermm-preload). Thin wrappers over the
//! system calls the memory manager and its front ends need (mmap/madvise, pread/pwrite into
//! mapped memory and batches of them through io_uring, fallocate, userfaultfd and PAGEMAP_SCAN
//! ioctls, a few process calls, the SIGBUS handler through which a faulting thread serves its
//! own fault, the SIGSEGV note a fork child gets where its parent's usermm memory was).
//! Everything above it (the usermm core, usermm-vma, the CLI, the Python module) is safe Rust;
//! the core reaches this crate as `crate::sys` and does not re-export it.
//!
//! Mirrors no single kernel file; it is the user-space edge of `mm/userfaultfd.c`,
//! `fs/userfaultfd.c`, `mm/madvise.c` and `fs/proc/task_mmu.c` (PAGEMAP_SCAN).
//!
//! Memory rule: managed memory (region views, the frame pool, the RAM swap device) is never exposed
//! as `&[u8]`/`&mut [u8]`, because a fault handler or reclaimer may change or remove it at any
//! moment. [`Mapping`] hands out addresses and offers copies, volatile word accessors and I/O
//! that the kernel performs directly on the mapping.

pub mod error;
pub mod forkguard;
pub mod mem;
pub mod net;
pub mod pagemap;
pub mod ring;
pub mod sigbus;
pub mod uffd;

pub use error::{Result, SysError, Syscall};
pub use mem::{process_vm_write, Advice, Mapping, VmSrc};

/// Base page size usermm manages (x86-64 and arm64 4 KiB kernels).
pub const PAGE_SIZE: usize = 4096;
/// log2(PAGE_SIZE).
pub const PAGE_SHIFT: u32 = 12;

/// Set by CI (`.ci/run`): a test that would skip because this machine lacks a feature, a
/// privilege or a tool fails instead, since CI's machine has them all.
pub const TEST_STRICT_ENV: &str = "USERMM_TEST_STRICT";

/// Test support for every crate of the workspace (here because they all reach this crate):
/// a test that cannot run here calls this and returns. It prints the reason (`SKIPPED: ...`,
/// seen with `--nocapture`), or panics when [`TEST_STRICT_ENV`] is `1`, so a skip in CI, which
/// would hide a check that never ran, is a failure.
#[doc(hidden)]
pub fn skip_test(why: &str) {
    if std::env::var(TEST_STRICT_ENV).as_deref() == Ok("1") {
        panic!("{TEST_STRICT_ENV}=1 and this test would skip: {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// FUTEX_WAIT on a word that other processes map too (a shared futex: no FUTEX_PRIVATE_FLAG):
/// sleeps while `word` holds `expected`, until a [`futex_wake`] on it or `timeout`. Returns
/// when woken, timed out, interrupted, or at once if the word no longer holds `expected`.
pub fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: std::time::Duration,
) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call (borrowed); FUTEX_WAIT
    // only reads it and sleeps; `ts` is a valid relative timeout. The result (woken, EAGAIN,
    // ETIMEDOUT, EINTR) needs no handling: the caller looks at the state again either way.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// FUTEX_WAKE of up to `n` waiters on a shared futex word; returns how many were woken.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32, n: u32) -> u32 {
    // SAFETY: `word` is a valid, aligned u32 (borrowed); FUTEX_WAKE does not touch memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::try_from(n).unwrap_or(i32::MAX),
        )
    };
    u32::try_from(r).unwrap_or(0)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine (std's `Instant`
/// reads it too but cannot be compared across processes).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time used so far by every thread of this process, living or exited, in nanoseconds
/// (CLOCK_PROCESS_CPUTIME_ID: user and system time).
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Clock `id` in nanoseconds (one that always exists).
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    debug_assert_eq!(rc, 0, "clock {id} always exists");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The calling thread's kernel thread id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The CPU the calling thread runs on right now (a hint; it may move at once).
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no arguments; it returns -1 only on kernels without getcpu.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// Pins the calling thread to one CPU (best effort; errors are ignored by callers).
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; cpu is bounded by the set size check below.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(SysError::arg(
                Syscall::SchedSetaffinity,
                format!("CPU {cpu} is beyond CPU_SETSIZE ({})", libc::CPU_SETSIZE),
            ));
        }
        libc::CPU_SET(cpu, &mut set);
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 means the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::SchedSetaffinity,
            format!("pinning to CPU {cpu}"),
        ));
    }
    Ok(())
}

/// Preallocates `len` bytes of `file` from offset 0 (fallocate mode 0).
pub fn fallocate(file: &std::fs::File, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a valid, owned file descriptor.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Fallocate,
            format!("of {len} bytes"),
        ));
    }
    Ok(())
}

/// Deallocates (punches a hole over) `[off, off+len)` of `file`, keeping its size.
pub fn punch_hole(file: &std::fs::File, off: u64, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a valid, owned file descriptor.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Fallocate,
            format!("(PUNCH_HOLE) of {len} bytes at {off}"),
        ));
    }
    Ok(())
}

/// `lseek(SEEK_DATA)`: the first offset at or after `off` where `file` has data, or None when
/// none follows (ENXIO: only holes, or `off` at or beyond the end). A filesystem without hole
/// tracking reports the whole file as data, as Linux's generic implementation does.
pub fn seek_data(file: &std::fs::File, off: u64) -> Result<Option<u64>> {
    seek_whence(file, off, libc::SEEK_DATA)
}

/// `lseek(SEEK_HOLE)`: the first offset at or after `off` that is in a hole (the end of the
/// file counts as one), or None when `off` is at or beyond the end (ENXIO).
pub fn seek_hole(file: &std::fs::File, off: u64) -> Result<Option<u64>> {
    seek_whence(file, off, libc::SEEK_HOLE)
}

fn seek_whence(file: &std::fs::File, off: u64, whence: libc::c_int) -> Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let Ok(off) = libc::off_t::try_from(off) else {
        return Ok(None);
    };
    // SAFETY: plain syscall on a valid, owned file descriptor; no memory is passed. The file
    // offset it moves is not used by usermm, which reads and writes with pread/pwrite only.
    let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        let name = if whence == libc::SEEK_DATA {
            "(SEEK_DATA)"
        } else {
            "(SEEK_HOLE)"
        };
        return Err(SysError::os(
            Syscall::Lseek,
            format!("{name} from {off}"),
            e,
        ));
    }
    Ok(Some(r as u64))
}

/// Tells the kernel the page cache of `[off, off+len)` of `file` is not needed
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`): clean cached pages are dropped, dirty ones are queued
/// for writeback.
pub fn fadvise_dontneed(file: &std::fs::File, off: u64, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a valid, owned file descriptor; no memory is passed.
    let r = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    // posix_fadvise returns the error number instead of setting errno.
    if r != 0 {
        return Err(SysError::os(
            Syscall::Fadvise,
            format!("(DONTNEED) of {len} bytes at {off}"),
            std::io::Error::from_raw_os_error(r),
        ));
    }
    Ok(())
}

/// Writes back the dirty page cache of `[off, off+len)` of `file` and waits for it
/// (`sync_file_range` with WAIT_BEFORE | WRITE | WAIT_AFTER; data only, no metadata flush).
pub fn sync_file_range_wait(file: &std::fs::File, off: u64, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain syscall on a valid, owned file descriptor; no memory is passed.
    let r = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            off as libc::off64_t,
            len as libc::off64_t,
            flags,
        )
    };
    if r != 0 {
        return Err(SysError::last(
            Syscall::SyncFileRange,
            format!("of {len} bytes at {off}"),
        ));
    }
    Ok(())
}

/// An anonymous memory file (memfd) of `len` bytes, sparse.
pub fn memfd(name: &str, len: u64) -> Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let cname = std::ffi::CString::new(name).map_err(|_| {
        SysError::arg(
            Syscall::MemfdCreate,
            format!("name {name:?} holds a NUL byte"),
        )
    })?;
    // SAFETY: memfd_create takes a NUL-terminated name and flags and returns a new descriptor.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(SysError::last(Syscall::MemfdCreate, format!("{name:?}")));
    }
    // SAFETY: fd is a fresh descriptor we now own.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).map_err(|e| {
        SysError::os(
            Syscall::MemfdCreate,
            format!("{name:?}: sizing to {len} bytes"),
            e,
        )
    })?;
    Ok(f)
}

/// Reads the word at `addr` from kernel mode (write(2) of it into a pipe), so that an access to
/// a poisoned page fails with EFAULT instead of raising SIGBUS. With a user-mode-only
/// userfaultfd, kernel accesses to non-resident pages fail with EFAULT too.
pub fn kernel_read_u64(addr: usize) -> Result<u64> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SysError::last(
            Syscall::Pipe,
            "pipe2 for a kernel-mode read",
        ));
    }
    // SAFETY: the kernel reads 8 bytes at `addr` with copy_from_user, which reports a bad or
    // poisoned address as EFAULT rather than faulting this thread.
    let w = unsafe { libc::write(fds[1], addr as *const libc::c_void, 8) };
    let res = if w == 8 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes from the pipe into a local u64.
        let r = unsafe { libc::read(fds[0], &mut v as *mut u64 as *mut libc::c_void, 8) };
        if r == 8 {
            Ok(v)
        } else {
            Err(SysError::last(
                Syscall::Pipe,
                format!("reading back the word at {addr:#x}"),
            ))
        }
    } else if w < 0 {
        Err(SysError::last(
            Syscall::Pipe,
            format!("kernel-mode read of the word at {addr:#x}"),
        ))
    } else {
        Err(SysError::os(
            Syscall::Pipe,
            format!("kernel-mode read of the word at {addr:#x}"),
            std::io::Error::other(format!("short pipe write of {w} bytes")),
        ))
    };
    // SAFETY: closing the two descriptors created above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    res
}

/// Writes `v` to the word at `addr` from kernel mode (read(2) of it from a pipe), so that a
/// store that the manager answers with poison fails with EFAULT instead of raising SIGBUS.
pub fn kernel_write_u64(addr: usize, v: u64) -> Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SysError::last(
            Syscall::Pipe,
            "pipe2 for a kernel-mode write",
        ));
    }
    // SAFETY: writes 8 bytes from a local u64 into the pipe.
    let w = unsafe { libc::write(fds[1], &v as *const u64 as *const libc::c_void, 8) };
    let res = if w != 8 {
        Err(SysError::last(
            Syscall::Pipe,
            "writing the word into the pipe",
        ))
    } else {
        // SAFETY: the kernel stores 8 bytes at `addr` with copy_to_user, which reports a bad or
        // poisoned address as EFAULT rather than faulting this thread.
        let r = unsafe { libc::read(fds[0], addr as *mut libc::c_void, 8) };
        match r {
            8 => Ok(()),
            r if r < 0 => Err(SysError::last(
                Syscall::Pipe,
                format!("kernel-mode write of the word at {addr:#x}"),
            )),
            r => Err(SysError::os(
                Syscall::Pipe,
                format!("kernel-mode write of the word at {addr:#x}"),
                std::io::Error::other(format!("short pipe read of {r} bytes")),
            )),
        }
    };
    // SAFETY: closing the two descriptors created above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    res
}

/// Resident set size of this process in bytes (VmRSS from /proc/self/status).
pub fn process_rss() -> u64 {
    read_status_kib("VmRSS:") * 1024
}

/// Peak resident set size of this process in bytes (VmHWM).
pub fn process_peak_rss() -> u64 {
    read_status_kib("VmHWM:") * 1024
}

fn read_status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The name of the pseudo filesystem `file` lives on (procfs, sysfs, ...), whose files report
/// sizes that are not their contents (0 or 4096 whatever they hold), so they cannot be mapped
/// through the page cache; None for ordinary filesystems.
pub fn pseudo_fs(file: &std::fs::File) -> Result<Option<&'static str>> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills the statfs struct `st` points to; the descriptor is valid and owned.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(SysError::last(Syscall::Fstatfs, "of a file to map"));
    }
    // SAFETY: fstatfs succeeded, so it initialised the struct.
    let magic = unsafe { st.assume_init() }.f_type as u64;
    Ok(match magic {
        0x9fa0 => Some("procfs"),
        0x6265_6572 => Some("sysfs"),
        0x6462_6720 => Some("debugfs"),
        0x7472_6163 => Some("tracefs"),
        0x7363_6673 => Some("securityfs"),
        0x2788_2006 | 0x6367_7270 => Some("cgroupfs"),
        0x6265_6570 => Some("configfs"),
        0xcafe_4a11 => Some("bpffs"),
        0x6573_5546 => Some("fusectl"),
        0x4249_4e4d => Some("binfmt_misc"),
        0xde5e_81e4 => Some("efivarfs"),
        0x7375_6970 => Some("pstore"),
        _ => None,
    })
}

/// Gives the open, nameless file `file` (made with `O_TMPFILE`, without `O_EXCL`) the name
/// `path` (linkat(2) of `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW`, which needs no privilege).
/// Fails with EEXIST when `path` already names something: nothing is replaced.
pub fn link_open_file(file: &std::fs::File, path: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .expect("no NUL in a /proc path");
    let to = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SysError::arg(Syscall::Linkat, format!("NUL in path {}", path.display())))?;
    // SAFETY: both arguments are NUL-terminated strings that outlive the call; linkat reads
    // them and writes no memory of ours.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(SysError::last(
            Syscall::Linkat,
            format!("{}", path.display()),
        ))
    }
}

/// The file type bits (`st_mode & S_IFMT`) of descriptor `fd` (fstat(2)); any value may be
/// passed: an fd that is not open is an error (EBADF).
pub fn fd_file_type(fd: i32) -> Result<u32> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one struct stat into `st`; any fd value is safe to pass.
    let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Fstat,
            format!("of descriptor {fd}"),
        ));
    }
    // SAFETY: fstat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() }.st_mode & libc::S_IFMT)
}

/// Takes an exclusive `flock` on `file` without waiting: Ok(false) when another open file
/// description (this process or another) holds it.
pub fn flock_exclusive_nb(file: &std::fs::File) -> Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a valid, owned file descriptor; no memory is passed.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(SysError::os(Syscall::Flock, "(LOCK_EX | LOCK_NB)", e))
}

/// The effective user id of this process.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Fills `buf` from the kernel's random number generator (getrandom(2), blocking until it is
/// seeded).
pub fn random_bytes(buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the kernel writes at most buf.len()-done bytes into the rest of `buf`.
        let r = unsafe {
            libc::getrandom(
                buf[done..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - done,
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(SysError::os(
                Syscall::Getrandom,
                format!("of {} bytes", buf.len()),
                e,
            ));
        }
        done += r as usize;
    }
    Ok(())
}

/// Sends signal `sig` to process `pid` (kill(2)); for front ends that forward signals to a
/// program they started.
pub fn kill(pid: u32, sig: i32) -> Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| SysError::arg(Syscall::Kill, format!("pid {pid} is out of range")))?;
    if pid <= 0 {
        return Err(SysError::arg(
            Syscall::Kill,
            format!("pid {pid} names no single process"),
        ));
    }
    // SAFETY: kill takes a pid and a signal number by value; pid > 0 names one process.
    let r = unsafe { libc::kill(pid, sig) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Kill,
            format!("of pid {pid} with signal {sig}"),
        ));
    }
    Ok(())
}

/// Bytes available to an unprivileged user on the filesystem holding `path` (statvfs(3)'s
/// f_bavail x f_frsize).
pub fn fs_available_bytes(path: &std::path::Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        SysError::arg(
            Syscall::Statvfs,
            format!("path {} holds a NUL byte", path.display()),
        )
    })?;
    // SAFETY: statvfs is plain data; zeroed is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs the call fills in.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if r != 0 {
        return Err(SysError::last(
            Syscall::Statvfs,
            format!("of {}", path.display()),
        ));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}
