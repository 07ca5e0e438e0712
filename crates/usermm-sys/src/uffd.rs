//! Our own thin userfaultfd wrapper (no libclang, no compile-time feature assumptions).
//! Mirrors `fs/userfaultfd.c` (the file and its ioctls) and `mm/userfaultfd.c` (COPY, ZEROPAGE,
//! CONTINUE, WRITEPROTECT, MOVE, POISON).
//!
//! Opening order: `userfaultfd(UFFD_USER_MODE_ONLY)` first (works for unprivileged users with the
//! default `vm.unprivileged_userfaultfd=0`), then `/dev/userfaultfd`, then a full-mode syscall.
//! Features are learned from a probe UFFDIO_API handshake on a throw-away descriptor, then the
//! real descriptor asks for the wanted subset: a kernel never sees a feature it lacks.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::mem::resident_at;
use super::PAGE_SIZE;
use crate::error::{Result, SysError, Syscall};

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xAA << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_CONTINUE: u64 = iowr(0x07, 32);
const UFFDIO_POISON: u64 = iowr(0x08, 32);
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// UFFDIO_API feature bits (include/uapi/linux/userfaultfd.h).
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const MOVE: u64 = 1 << 16;

    /// Human names, for reports.
    pub const NAMES: &[(u64, &str)] = &[
        (PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
        (EVENT_FORK, "EVENT_FORK"),
        (EVENT_REMAP, "EVENT_REMAP"),
        (EVENT_REMOVE, "EVENT_REMOVE"),
        (MISSING_HUGETLBFS, "MISSING_HUGETLBFS"),
        (MISSING_SHMEM, "MISSING_SHMEM"),
        (EVENT_UNMAP, "EVENT_UNMAP"),
        (SIGBUS, "SIGBUS"),
        (THREAD_ID, "THREAD_ID"),
        (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
        (MINOR_SHMEM, "MINOR_SHMEM"),
        (EXACT_ADDRESS, "EXACT_ADDRESS"),
        (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
        (WP_UNPOPULATED, "WP_UNPOPULATED"),
        (POISON, "POISON"),
        (WP_ASYNC, "WP_ASYNC"),
        (MOVE, "MOVE"),
    ];
}

/// Register modes.
pub mod mode {
    pub const MISSING: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

/// Bits of the `ioctls` masks returned by UFFDIO_API / UFFDIO_REGISTER (`1 << _UFFDIO_x`).
pub mod ioctl_bit {
    pub const WAKE: u64 = 1 << 0x02;
    pub const COPY: u64 = 1 << 0x03;
    pub const ZEROPAGE: u64 = 1 << 0x04;
    pub const MOVE: u64 = 1 << 0x05;
    pub const WRITEPROTECT: u64 = 1 << 0x06;
    pub const CONTINUE: u64 = 1 << 0x07;
    pub const POISON: u64 = 1 << 0x08;
}

/// Event codes of `uffd_msg`.
pub mod event {
    pub const PAGEFAULT: u8 = 0x12;
    pub const FORK: u8 = 0x13;
    pub const REMAP: u8 = 0x14;
    pub const REMOVE: u8 = 0x15;
    pub const UNMAP: u8 = 0x16;
}

/// `uffd_msg.arg.pagefault.flags`.
pub mod pf {
    pub const WRITE: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

/// `struct uffd_msg` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Msg {
    pub event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    /// pagefault: flags; remove/unmap: start; remap: from
    pub arg0: u64,
    /// pagefault: address; remove/unmap: end; remap: to
    pub arg1: u64,
    /// pagefault: thread id (with THREAD_ID); remap: len
    pub arg2: u64,
}

impl Msg {
    pub fn is_pagefault(&self) -> bool {
        self.event == event::PAGEFAULT
    }
    pub fn fault_flags(&self) -> u64 {
        self.arg0
    }
    pub fn fault_address(&self) -> usize {
        self.arg1 as usize
    }
    /// The faulting thread's id (with UFFD_FEATURE_THREAD_ID; 0 without).
    pub fn fault_tid(&self) -> u32 {
        self.arg2 as u32
    }
}

#[repr(C)]
#[derive(Default)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}
#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct ZeroArg {
    range: Range,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
struct WpArg {
    range: Range,
    mode: u64,
}

/// How the descriptor was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `userfaultfd(UFFD_USER_MODE_ONLY)`: faults from kernel mode (a `read(2)` into the range)
    /// are not delivered; such system calls fail with EFAULT instead.
    SyscallUserModeOnly,
    /// `/dev/userfaultfd`: full mode.
    DevUserfaultfd,
    /// `userfaultfd(0)` with privilege: full mode.
    SyscallFull,
}

/// Which opening paths to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenPolicy {
    /// The most capable descriptor this process may open: /dev/userfaultfd, then the full
    /// syscall (root, or `vm.unprivileged_userfaultfd=1`), then the user-mode-only syscall
    /// (unprivileged with the default `vm.unprivileged_userfaultfd=0`; a system call writing
    /// into non-resident managed memory then fails with EFAULT). Every front end (Rust, C,
    /// Python, `usermm run`) uses it, so `read(2)` into managed memory behaves the same in all.
    #[default]
    Auto,
    /// Only full-mode paths (/dev/userfaultfd, then the full syscall): kernel-mode accesses are
    /// delivered as faults.
    Full,
}

/// Failed resolving ioctl: the errno and how many bytes were done before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpError {
    pub errno: i32,
    pub done: usize,
}

impl OpError {
    pub fn is_exists(&self) -> bool {
        self.errno == libc::EEXIST
    }
    pub fn is_again(&self) -> bool {
        self.errno == libc::EAGAIN
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {} bytes",
            io::Error::from_raw_os_error(self.errno),
            self.done
        )
    }
}

/// An open, handshaken userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
    ioctls: u64,
    origin: Origin,
    /// Pages UFFDIO_MOVE moved without reporting them (see [`Uffd::move_pages`]).
    move_unreported: AtomicU64,
}

fn raw_open(flags: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: the userfaultfd syscall takes one int of flags and returns a new descriptor.
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if r < 0 {
        return Err(SysError::last(
            Syscall::Userfaultfd,
            format!("(flags {flags:#x})"),
        ));
    }
    // SAFETY: r is a fresh descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

fn dev_open(flags: libc::c_int) -> Result<OwnedFd> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .map_err(|e| SysError::os(Syscall::Userfaultfd, "opening /dev/userfaultfd", e))?;
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument and returns a new descriptor.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if r < 0 {
        return Err(SysError::last(
            Syscall::Userfaultfd,
            "(USERFAULTFD_IOC_NEW on /dev/userfaultfd)",
        ));
    }
    // SAFETY: r is a fresh descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn api(fd: &OwnedFd, features: u64) -> Result<ApiArg> {
    let mut a = ApiArg {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one ApiArg that lives on our stack.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut a as *mut ApiArg) };
    if r < 0 {
        return Err(SysError::last(
            Syscall::UffdioApi,
            format!("(features {features:#x})"),
        ));
    }
    Ok(a)
}

impl Uffd {
    /// Opens a non-blocking userfaultfd with `wanted & available` features.
    pub fn open(wanted: u64, policy: OpenPolicy) -> Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        type Opener = (Origin, Box<dyn Fn() -> Result<OwnedFd>>);
        let mut tries: Vec<Opener> = Vec::new();
        tries.push((Origin::DevUserfaultfd, Box::new(move || dev_open(flags))));
        tries.push((Origin::SyscallFull, Box::new(move || raw_open(flags))));
        if policy == OpenPolicy::Auto {
            tries.push((
                Origin::SyscallUserModeOnly,
                Box::new(move || raw_open(flags | UFFD_USER_MODE_ONLY)),
            ));
        }
        let mut errs = Vec::new();
        for (origin, open) in tries {
            let probe = match open() {
                Ok(fd) => fd,
                Err(e) => {
                    errs.push(format!("{origin:?}: {}", io::Error::from(e)));
                    continue;
                }
            };
            let avail = match api(&probe, 0) {
                Ok(a) => a.features,
                Err(e) => {
                    errs.push(format!("{origin:?} UFFDIO_API: {}", io::Error::from(e)));
                    continue;
                }
            };
            drop(probe);
            let fd = open()?;
            let want = wanted & avail;
            let a = api(&fd, want)?;
            // On success the kernel enables exactly `want` (and reports everything it offers).
            return Ok(Uffd {
                fd,
                features: want,
                ioctls: a.ioctls,
                origin,
                move_unreported: AtomicU64::new(0),
            });
        }
        Err(SysError::NoUserfaultfd {
            tried: errs.join("; "),
        })
    }

    /// Features negotiated with the kernel.
    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn has(&self, f: u64) -> bool {
        self.features & f == f
    }

    /// The API-level ioctl mask.
    pub fn ioctls(&self) -> u64 {
        self.ioctls
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> Result<(), i32> {
        // SAFETY: every request code is paired by its caller with the argument struct of the
        // matching size and layout; the kernel only touches the pages of registered ranges, which
        // belong to Mappings owned by the memory manager.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
        if r < 0 {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        } else {
            Ok(())
        }
    }

    /// UFFDIO_REGISTER; returns the range's ioctl mask.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> Result<u64> {
        let mut a = RegisterArg {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut a).map_err(|errno| {
            SysError::os(
                Syscall::UffdioRegister,
                format!("(mode {mode:#x}) of {len:#x} bytes at {start:#x}"),
                io::Error::from_raw_os_error(errno),
            )
        })?;
        Ok(a.ioctls)
    }

    /// UFFDIO_UNREGISTER.
    pub fn unregister(&self, start: usize, len: usize) -> Result<()> {
        let mut a = Range {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_UNREGISTER, &mut a).map_err(|errno| {
            SysError::os(
                Syscall::UffdioUnregister,
                format!("of {len:#x} bytes at {start:#x}"),
                io::Error::from_raw_os_error(errno),
            )
        })
    }

    /// UFFDIO_WAKE: wakes threads faulting in the range without resolving anything.
    pub fn wake(&self, start: usize, len: usize) -> Result<()> {
        let mut a = Range {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_WAKE, &mut a).map_err(|errno| {
            SysError::os(
                Syscall::UffdioWake,
                format!("of {len:#x} bytes at {start:#x}"),
                io::Error::from_raw_os_error(errno),
            )
        })
    }

    /// The two-address resolving ioctls (COPY, MOVE): returns bytes done.
    fn two_addr(
        &self,
        req: u64,
        dst: usize,
        src: usize,
        len: usize,
        mode: u64,
    ) -> Result<usize, OpError> {
        resume(len, |done| {
            injected(len - done, |n| {
                let mut a = CopyArg {
                    dst: (dst + done) as u64,
                    src: (src + done) as u64,
                    len: n as u64,
                    mode,
                    copy: 0,
                };
                let r = finish(self.ioctl(req, &mut a), a.copy);
                if req == UFFDIO_MOVE {
                    inject::unreport(n, r)
                } else {
                    r
                }
            })
        })
    }

    /// The range resolving ioctls (ZEROPAGE, CONTINUE, POISON): returns bytes done.
    fn range_op(&self, req: u64, start: usize, len: usize, mode: u64) -> Result<usize, OpError> {
        resume(len, |done| {
            injected(len - done, |n| {
                let mut a = ZeroArg {
                    range: Range {
                        start: (start + done) as u64,
                        len: n as u64,
                    },
                    mode,
                    zeropage: 0,
                };
                let r = self.ioctl(req, &mut a);
                finish(r, a.zeropage)
            })
        })
    }

    /// UFFDIO_COPY (`wp`: map write-protected; `dontwake`: leave faulting threads asleep).
    pub fn copy(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wp: bool,
        dontwake: bool,
    ) -> Result<usize, OpError> {
        self.two_addr(
            UFFDIO_COPY,
            dst,
            src,
            len,
            (dontwake as u64) | ((wp as u64) << 1),
        )
    }

    /// UFFDIO_ZEROPAGE: maps the shared zero page.
    pub fn zeropage(&self, start: usize, len: usize, dontwake: bool) -> Result<usize, OpError> {
        self.range_op(UFFDIO_ZEROPAGE, start, len, dontwake as u64)
    }

    /// UFFDIO_MOVE: moves present anonymous pages from `src` to the unpopulated `dst`.
    ///
    /// The returned byte count (or the error's `done`) includes pages the kernel moved without
    /// reporting them. Linux 6.18's batched `move_pages()` keeps an internal `-EAGAIN` (a source
    /// pte that changed under it, e.g. a page migrated by compaction) after retrying: the next
    /// batch is moved but not counted, and the retry at the same address fails with EEXIST on
    /// the page it has just moved. The caller sees EEXIST (or a short count) for pages that are
    /// in fact at `dst`; believing it, usermm dropped them as strays (issue 10's lost page).
    /// So after a failure, the pages from the first unreported one on whose source is now empty
    /// and whose destination is populated are counted as moved (without `allow_src_holes` a
    /// source page was present when the call began, so nothing else can have emptied it while
    /// the caller holds the pages' locks). [`Uffd::move_unreported`] counts them.
    pub fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        allow_src_holes: bool,
        dontwake: bool,
    ) -> Result<usize, OpError> {
        let mode = (dontwake as u64) | ((allow_src_holes as u64) << 1);
        let mut done = 0;
        loop {
            let e = match self.two_addr(UFFDIO_MOVE, dst + done, src + done, len - done, mode) {
                Ok(n) => return Ok(done + n),
                Err(e) => e,
            };
            done += e.done;
            let unreported = if allow_src_holes || done >= len {
                0
            } else {
                moved_unreported(dst + done, src + done, len - done)
            };
            if unreported == 0 {
                return Err(OpError {
                    errno: e.errno,
                    done,
                });
            }
            self.move_unreported
                .fetch_add((unreported / PAGE_SIZE) as u64, Ordering::Relaxed);
            done += unreported;
            if done >= len {
                return Ok(done);
            }
        }
    }

    /// Pages UFFDIO_MOVE moved without reporting them, recovered by [`Uffd::move_pages`].
    pub fn move_unreported(&self) -> u64 {
        self.move_unreported.load(Ordering::Relaxed)
    }

    /// UFFDIO_CONTINUE: maps existing page-cache pages (MINOR faults on shmem).
    pub fn continue_(&self, start: usize, len: usize, dontwake: bool) -> Result<usize, OpError> {
        self.continue_wp(start, len, false, dontwake)
    }

    /// UFFDIO_CONTINUE with UFFDIO_CONTINUE_MODE_WP when `wp`: maps existing page-cache pages
    /// write-protected (the range must be registered MINOR | WP, which on shmem needs
    /// [`feature::WP_HUGETLBFS_SHMEM`]), so the first store to each is a write-protect fault.
    pub fn continue_wp(
        &self,
        start: usize,
        len: usize,
        wp: bool,
        dontwake: bool,
    ) -> Result<usize, OpError> {
        self.range_op(
            UFFDIO_CONTINUE,
            start,
            len,
            (dontwake as u64) | ((wp as u64) << 1),
        )
    }

    /// UFFDIO_POISON: later accesses to the range raise SIGBUS.
    pub fn poison(&self, start: usize, len: usize, dontwake: bool) -> Result<usize, OpError> {
        self.range_op(UFFDIO_POISON, start, len, dontwake as u64)
    }

    /// UFFDIO_WRITEPROTECT: set (`wp`) or clear write protection; clearing wakes unless
    /// `dontwake`.
    pub fn writeprotect(&self, start: usize, len: usize, wp: bool, dontwake: bool) -> Result<()> {
        // The kernel rejects WP|DONTWAKE (EINVAL): setting protection never wakes anyway.
        let dontwake = dontwake && !wp;
        let mode = (wp as u64) | ((dontwake as u64) << 1);
        let mut a = WpArg {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode,
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut a).map_err(|errno| {
            SysError::os(
                Syscall::UffdioWriteprotect,
                format!("(wp {wp}) of {len:#x} bytes at {start:#x}"),
                io::Error::from_raw_os_error(errno),
            )
        })
    }

    /// Reads up to `buf.len()` messages without blocking; Ok(0) when none are queued.
    pub fn read_msgs(&self, buf: &mut [Msg]) -> Result<usize> {
        loop {
            // SAFETY: the kernel writes whole 32-byte uffd_msg records into `buf`, which is a
            // properly sized and aligned array of #[repr(C)] Msg.
            let r = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    std::mem::size_of_val(buf),
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(0),
                    Some(libc::EINTR) => continue,
                    _ => {
                        return Err(SysError::os(
                            Syscall::UffdRead,
                            format!("on descriptor {}", self.fd.as_raw_fd()),
                            e,
                        ))
                    }
                }
            }
            return Ok(r as usize / std::mem::size_of::<Msg>());
        }
    }

    /// Waits up to `timeout_ms` for the userfaultfd or any of `extra` (up to three more
    /// descriptors; a negative one is ignored) to be readable; whether the userfaultfd is.
    pub fn poll_with(&self, extra: &[RawFd], timeout_ms: i32) -> Result<bool> {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }; 4];
        fds[0].fd = self.fd.as_raw_fd();
        for (p, &fd) in fds[1..].iter_mut().zip(extra) {
            p.fd = fd;
        }
        let n = 1 + extra.len().min(3);
        // SAFETY: fds is a valid array of at least `n` pollfd structs on our stack.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(SysError::os(
                Syscall::UffdPoll,
                format!("on descriptor {}", self.fd.as_raw_fd()),
                e,
            ));
        }
        Ok(fds[0].revents != 0)
    }

    /// Waits until a message is readable or `timeout_ms` passes (-1: forever). Also returns when
    /// `extra` (an eventfd) becomes readable. Returns (uffd_ready, extra_ready).
    pub fn poll(&self, extra: Option<RawFd>, timeout_ms: i32) -> Result<(bool, bool)> {
        let mut fds = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: extra.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if extra.is_some() { 2 } else { 1 };
        // SAFETY: fds is a valid array of `n` pollfd structs on our stack.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), n, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok((false, false));
            }
            return Err(SysError::os(
                Syscall::UffdPoll,
                format!("on descriptor {}", self.fd.as_raw_fd()),
                e,
            ));
        }
        Ok((fds[0].revents != 0, n == 2 && fds[1].revents != 0))
    }
}

/// Fault injection for tests (tests/livelock.rs), making rare kernel reports deterministic:
/// partial results (every Nth resolving ioctl over more than one page does only the first half
/// of its range and reports EAGAIN with the bytes done, as the kernel does when a page inside a
/// run is busy, present or missing), and Linux 6.18's under-reported UFFDIO_MOVE.
#[doc(hidden)]
pub mod inject {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::super::PAGE_SIZE;
    use super::OpError;

    /// "Every nth call": a process-wide injection switch with its call and hit counts.
    struct Every {
        n: AtomicU32,
        calls: AtomicU64,
        hits: AtomicU64,
    }

    impl Every {
        const fn new() -> Every {
            Every {
                n: AtomicU32::new(0),
                calls: AtomicU64::new(0),
                hits: AtomicU64::new(0),
            }
        }
        /// Whether this call is one to inject into (counted as a hit).
        fn fire(&self) -> bool {
            let n = self.n.load(Ordering::Relaxed);
            if n == 0
                || !self
                    .calls
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(n as u64)
            {
                return false;
            }
            self.hits.fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    static PARTIAL: Every = Every::new();
    static UNREPORT: Every = Every::new();

    /// Makes every `n`th multi-page resolving ioctl partial (0: never). Process-wide.
    pub fn partial_results(n: u32) {
        PARTIAL.n.store(n, Ordering::SeqCst);
    }

    /// How many partial results were injected so far.
    pub fn injected() -> u64 {
        PARTIAL.hits.load(Ordering::SeqCst)
    }

    /// Makes every `n`th UFFDIO_MOVE that moves everything report what Linux 6.18 reports after
    /// an internal retry (see [`super::Uffd::move_pages`]): only the first half of the pages
    /// (EAGAIN), or for a single page none (EEXIST). 0: never. Process-wide.
    pub fn unreported_moves(n: u32) {
        UNREPORT.n.store(n, Ordering::SeqCst);
    }

    /// How many moves were made to under-report so far.
    pub fn unreported() -> u64 {
        UNREPORT.hits.load(Ordering::SeqCst)
    }

    /// The result to report for a UFFDIO_MOVE over `len` bytes whose real result is `r`.
    pub(super) fn unreport(len: usize, r: Result<usize, OpError>) -> Result<usize, OpError> {
        if r != Ok(len) || !UNREPORT.fire() {
            return r;
        }
        let pages = len / PAGE_SIZE;
        Err(OpError {
            errno: if pages >= 2 {
                libc::EAGAIN
            } else {
                libc::EEXIST
            },
            done: pages / 2 * PAGE_SIZE,
        })
    }

    /// The length to issue for a call over `len` bytes: `len`, or half of it (whole pages) when
    /// this call is to be made partial.
    pub(super) fn cut(len: usize) -> usize {
        let pages = len / PAGE_SIZE;
        if pages < 2 || !PARTIAL.fire() {
            return len;
        }
        pages / 2 * PAGE_SIZE
    }
}

/// Issues one resolving ioctl through the injection point: `call(len)` runs it over `len`
/// bytes; a cut call that succeeds reports the kernel's partial result.
fn injected(
    len: usize,
    call: impl FnOnce(usize) -> Result<usize, OpError>,
) -> Result<usize, OpError> {
    let cut = inject::cut(len);
    match call(cut) {
        Ok(n) if cut < len => Err(OpError {
            errno: libc::EAGAIN,
            done: n,
        }),
        r => r,
    }
}

/// Runs a resolving ioctl over `[done, len)` until it is complete or stops making progress.
///
/// The kernel reports a *partial* result (some pages resolved, then an error such as EEXIST or
/// ENOENT on the next one) as `-EAGAIN` with the bytes done in the argument's result field: the
/// real error is not reported at all. Taking that at face value and re-issuing the whole range
/// (what an EAGAIN normally asks for) makes the first page fail with EEXIST and the caller believe
/// nothing was done, while pages were in fact moved: the cause of issue 10's livelock (a page
/// moved into its pool slot but still flagged mapped, faulting forever) and of `pool_slot_lost`
/// (a pooled page moved into a view while its frame was freed as still pooled). So a partial
/// result is resumed here at the first page not done, which reports the real error (or completes);
/// the returned `done` always counts every byte resolved across the calls.
fn resume(
    len: usize,
    mut op: impl FnMut(usize) -> Result<usize, OpError>,
) -> Result<usize, OpError> {
    let mut done = 0;
    loop {
        match op(done) {
            Ok(n) => return Ok(done + n),
            Err(e) if e.errno == libc::EAGAIN && e.done > 0 => {
                done += e.done;
                if done >= len {
                    return Ok(done);
                }
            }
            Err(e) => {
                return Err(OpError {
                    errno: e.errno,
                    done: done + e.done,
                })
            }
        }
    }
}

/// Bytes at the start of `[0, len)` whose page left `src` and is now at `dst`: moved by a
/// UFFDIO_MOVE that did not report it (see [`Uffd::move_pages`]). 0 if residency cannot be read.
fn moved_unreported(dst: usize, src: usize, len: usize) -> usize {
    let (Ok(s), Ok(d)) = (resident_at(src, len), resident_at(dst, len)) else {
        return 0;
    };
    s.iter().zip(&d).take_while(|&(&s, &d)| !s && d).count() * PAGE_SIZE
}

fn finish(r: Result<(), i32>, field: i64) -> Result<usize, OpError> {
    match r {
        Ok(()) => Ok(field.max(0) as usize),
        Err(errno) => Err(OpError {
            errno,
            done: field.max(0) as usize,
        }),
    }
}

/// A non-blocking eventfd used to kick pollers (shutdown, work available).
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd> {
        // SAFETY: plain syscall creating a new descriptor.
        let r = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if r < 0 {
            return Err(SysError::last(Syscall::Eventfd, "(CLOEXEC | NONBLOCK)"));
        }
        // SAFETY: fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(r) }))
    }
    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    pub fn signal(&self) {
        let v: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to the eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &v as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local u64; EAGAIN when empty is fine.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mapping, PAGE_SIZE};

    fn uffd() -> Uffd {
        Uffd::open(
            feature::MOVE | feature::POISON | feature::PAGEFAULT_FLAG_WP | feature::THREAD_ID,
            OpenPolicy::Auto,
        )
        .expect("userfaultfd must be available for these tests")
    }

    /// A missing kernel feature skips the rest of a test visibly, or fails it under
    /// `USERMM_TEST_STRICT=1` (set by .ci/run: CI's kernel has every feature).
    use crate::skip_test as skip;

    /// `1 << _UFFDIO_x` for the ioctls the handshake reports (include/uapi/linux/userfaultfd.h:
    /// `_UFFDIO_REGISTER` 0x00, `_UFFDIO_UNREGISTER` 0x01, `_UFFDIO_API` 0x3F).
    const API_IOCTLS: u64 = (1 << 0x00) | (1 << 0x01) | (1 << 0x3F);

    /// The handshake reports exactly UFFD_API_IOCTLS (REGISTER, UNREGISTER, API: what the
    /// code issues on the descriptor itself); the features enabled are exactly the wanted
    /// ones the kernel offers, none that was not asked for.
    #[test]
    fn handshake_reports_the_api_ioctls_and_enables_only_what_was_asked() {
        let u = uffd();
        assert_eq!(u.ioctls(), API_IOCTLS, "API ioctls {:#x}", u.ioctls());
        let needed = [
            (feature::MOVE, "MOVE"),
            (feature::POISON, "POISON"),
            (feature::PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
            (feature::THREAD_ID, "THREAD_ID"),
        ];
        for (f, name) in needed {
            if u.features() & f == 0 {
                skip(&format!("this kernel offers no UFFD_FEATURE_{name}"));
                return;
            }
        }
        assert_eq!(
            u.features(),
            feature::MOVE | feature::POISON | feature::PAGEFAULT_FLAG_WP | feature::THREAD_ID
        );
        // Asked for THREAD_ID alone: nothing else is enabled, MOVE included.
        let one = Uffd::open(feature::THREAD_ID, OpenPolicy::Auto).unwrap();
        assert_eq!(one.features(), feature::THREAD_ID);
        assert!(!one.has(feature::MOVE));
        assert_eq!(one.ioctls(), API_IOCTLS);
    }

    /// A registered range reports the resolving ioctls usermm issues on it: WAKE, COPY,
    /// ZEROPAGE, MOVE and POISON in MISSING mode, WRITEPROTECT only when WP mode is registered
    /// too, CONTINUE (MINOR mode) not at all.
    #[test]
    fn a_registered_range_reports_the_ioctls_usermm_uses() {
        let u = uffd();
        if !u.has(feature::MOVE | feature::POISON | feature::PAGEFAULT_FLAG_WP) {
            skip(&format!(
                "this kernel lacks MOVE, POISON or PAGEFAULT_FLAG_WP (features {:#x})",
                u.features()
            ));
            return;
        }
        let m = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        let base = ioctl_bit::WAKE
            | ioctl_bit::COPY
            | ioctl_bit::ZEROPAGE
            | ioctl_bit::MOVE
            | ioctl_bit::POISON;
        let missing = u.register(m.addr(), m.len(), mode::MISSING).unwrap();
        assert_eq!(missing, base, "MISSING mode: {missing:#x}");
        u.unregister(m.addr(), m.len()).unwrap();
        let both = u
            .register(m.addr(), m.len(), mode::MISSING | mode::WP)
            .unwrap();
        assert_eq!(
            both,
            base | ioctl_bit::WRITEPROTECT,
            "MISSING|WP mode: {both:#x}"
        );
        u.unregister(m.addr(), m.len()).unwrap();
    }

    /// COPY places the source page's bytes (all of them) and leaves the source as it was;
    /// a second COPY over the present page is EEXIST; ZEROPAGE maps zeros.
    #[test]
    fn register_copy_and_eexist() {
        let u = uffd();
        let m = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        u.register(m.addr(), m.len(), mode::MISSING).unwrap();
        let src = Mapping::anon(PAGE_SIZE, 0).unwrap();
        let img: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 + i / 256) as u8).collect();
        src.write_bytes(0, &img).unwrap();
        assert_eq!(m.resident(0, PAGE_SIZE).unwrap(), [false]);
        assert_eq!(
            u.copy(m.addr(), src.addr(), PAGE_SIZE, false, false)
                .unwrap(),
            PAGE_SIZE
        );
        let mut got = vec![0u8; PAGE_SIZE];
        m.read_bytes(0, &mut got).unwrap();
        assert!(got == img, "COPY placed other bytes");
        src.read_bytes(0, &mut got).unwrap();
        assert!(got == img, "COPY changed its source");
        let e = u
            .copy(m.addr(), src.addr(), PAGE_SIZE, false, false)
            .unwrap_err();
        assert!(
            e.is_exists(),
            "second COPY over a present page is EEXIST: {e}"
        );
        assert_eq!(
            u.zeropage(m.addr() + PAGE_SIZE, PAGE_SIZE, false).unwrap(),
            PAGE_SIZE
        );
        assert_eq!(m.resident(PAGE_SIZE, PAGE_SIZE).unwrap(), [true]);
        m.read_bytes(PAGE_SIZE, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0));
        u.unregister(m.addr(), m.len()).unwrap();
    }

    /// MOVE takes the pages: the destination holds the source's bytes, the source's pages are
    /// gone (not resident; a read maps a fresh zero page).
    #[test]
    fn move_pages_between_mappings() {
        let u = uffd();
        if !u.has(feature::MOVE) {
            skip("this kernel offers no UFFD_FEATURE_MOVE (Linux >= 6.8)");
            return;
        }
        let dst = Mapping::anon(2 * PAGE_SIZE, 0).unwrap();
        let src = Mapping::anon(2 * PAGE_SIZE, 0).unwrap();
        u.register(dst.addr(), dst.len(), mode::MISSING).unwrap();
        let img: Vec<u8> = (0..2 * PAGE_SIZE)
            .map(|i| (i * 13 + i / 512) as u8)
            .collect();
        src.write_bytes(0, &img).unwrap();
        assert_eq!(
            u.move_pages(dst.addr(), src.addr(), 2 * PAGE_SIZE, false, false)
                .unwrap(),
            2 * PAGE_SIZE
        );
        assert_eq!(src.resident(0, 2 * PAGE_SIZE).unwrap(), [false, false]);
        assert_eq!(dst.resident(0, 2 * PAGE_SIZE).unwrap(), [true, true]);
        let mut got = vec![0u8; 2 * PAGE_SIZE];
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == img, "MOVE placed other bytes");
        src.read_bytes(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0), "the source still holds data");
    }

    /// WRITEPROTECT: a store to a protected page faults with the WP flag and waits; clearing
    /// the protection (with a wake) lets it complete.
    #[test]
    fn writeprotect_faults_a_store_until_cleared() {
        let u = std::sync::Arc::new(uffd());
        if !u.has(feature::PAGEFAULT_FLAG_WP) {
            skip("this kernel offers no UFFD_FEATURE_PAGEFAULT_FLAG_WP");
            return;
        }
        let m = std::sync::Arc::new(Mapping::anon(PAGE_SIZE, 0).unwrap());
        u.register(m.addr(), m.len(), mode::MISSING | mode::WP)
            .unwrap();
        let src = Mapping::anon(PAGE_SIZE, 0).unwrap();
        src.fill(0, PAGE_SIZE, 3).unwrap();
        u.copy(m.addr(), src.addr(), PAGE_SIZE, true, false)
            .unwrap();
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.write_u64(8, 5));
        let mut msgs = [Msg::default(); 4];
        let t0 = std::time::Instant::now();
        let n = loop {
            u.poll(None, 1000).unwrap();
            let n = u.read_msgs(&mut msgs).unwrap();
            if n > 0 {
                break n;
            }
            assert!(
                t0.elapsed().as_secs() < 10,
                "no write-protect fault within 10 s (word 8 now {:#x})",
                m.read_u64(8)
            );
        };
        assert_eq!(n, 1);
        assert!(msgs[0].is_pagefault());
        assert_eq!(msgs[0].fault_address() & !(PAGE_SIZE - 1), m.addr());
        let fl = msgs[0].fault_flags();
        assert!(fl & pf::WP != 0 && fl & pf::WRITE != 0, "flags {fl:#x}");
        assert_eq!(m.read_u64(8), 0x0303030303030303, "the store went through");
        u.writeprotect(m.addr(), PAGE_SIZE, false, false).unwrap();
        t.join().unwrap();
        assert_eq!(m.read_u64(8), 5);
        assert_eq!(m.read_u64(0), 0x0303030303030303);
    }

    #[test]
    fn fault_message_is_delivered() {
        let u = std::sync::Arc::new(uffd());
        let m = std::sync::Arc::new(Mapping::anon(PAGE_SIZE, 0).unwrap());
        u.register(m.addr(), m.len(), mode::MISSING).unwrap();
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.read_u64(16));
        let mut msgs = [Msg::default(); 4];
        let n = loop {
            u.poll(None, 1000).unwrap();
            let n = u.read_msgs(&mut msgs).unwrap();
            if n > 0 {
                break n;
            }
        };
        assert_eq!(n, 1);
        assert!(msgs[0].is_pagefault());
        assert_eq!(msgs[0].fault_address() & !(PAGE_SIZE - 1), m.addr());
        assert_eq!(msgs[0].fault_flags() & pf::WRITE, 0);
        u.zeropage(m.addr(), PAGE_SIZE, false).unwrap();
        assert_eq!(t.join().unwrap(), 0);
    }

    /// The kernel's partial result (EAGAIN with the bytes done) is resumed, so a run that meets
    /// an occupied page reports the real error and every byte that was resolved.
    #[test]
    fn partial_results_report_the_real_error_and_all_bytes_done() {
        let u = uffd();
        let one = Mapping::anon(PAGE_SIZE, 0).unwrap();
        one.fill(0, PAGE_SIZE, 1).unwrap();
        let occupied = |m: &Mapping| {
            u.register(m.addr(), m.len(), mode::MISSING).unwrap();
            u.copy(m.addr() + 2 * PAGE_SIZE, one.addr(), PAGE_SIZE, false, true)
                .unwrap();
        };
        let src = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        src.fill(0, 4 * PAGE_SIZE, 9).unwrap();
        // COPY of 4 pages over [hole, hole, present, hole].
        let c = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        occupied(&c);
        let e = u
            .copy(c.addr(), src.addr(), 4 * PAGE_SIZE, false, true)
            .unwrap_err();
        assert_eq!((e.errno, e.done), (libc::EEXIST, 2 * PAGE_SIZE), "{e}");
        assert_eq!(c.read_u64(PAGE_SIZE), 0x0909090909090909);
        // ZEROPAGE likewise.
        let z = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        occupied(&z);
        let e = u.zeropage(z.addr(), 4 * PAGE_SIZE, true).unwrap_err();
        assert_eq!((e.errno, e.done), (libc::EEXIST, 2 * PAGE_SIZE), "{e}");
        if !u.has(feature::MOVE) {
            skip("this kernel offers no UFFD_FEATURE_MOVE: partial MOVE results not checked");
            return;
        }
        let d = Mapping::anon(4 * PAGE_SIZE, 0).unwrap();
        occupied(&d);
        let e = u
            .move_pages(d.addr(), src.addr(), 4 * PAGE_SIZE, false, true)
            .unwrap_err();
        assert_eq!((e.errno, e.done), (libc::EEXIST, 2 * PAGE_SIZE), "{e}");
        // The two pages moved are in the destination and gone from the source.
        assert_eq!(d.read_u64(0), 0x0909090909090909);
        assert_eq!(
            src.resident(0, 4 * PAGE_SIZE).unwrap(),
            [false, false, true, true]
        );
    }
}
