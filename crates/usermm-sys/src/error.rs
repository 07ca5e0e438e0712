//! The OS layer's error: which system call failed, on what, and the OS error it returned, or
//! which argument was refused before any call was made. The usermm core turns it into
//! `usermm::Error::Sys` (keeping it as the source); front ends that work in `io::Result` convert
//! it with `From`, which keeps the errno.
//!
//! Mirrors no kernel file: it is the user-space side of a system call's `-errno` return.

use std::fmt;
use std::io;

/// The system call (or ioctl) an error came from, by its kernel name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Syscall {
    Mmap,
    Madvise,
    Msync,
    ProcessMadvise,
    Mincore,
    Pread,
    Preadv,
    Pwritev,
    Fallocate,
    Lseek,
    Fadvise,
    SyncFileRange,
    MemfdCreate,
    Fstatfs,
    Fstat,
    Flock,
    Linkat,
    Statvfs,
    Getrandom,
    Kill,
    SchedSetaffinity,
    /// The pipe round trip of a kernel-mode word access (`kernel_read_u64`/`kernel_write_u64`).
    Pipe,
    /// Opening `/proc/self/pagemap` or the `PAGEMAP_SCAN` ioctl on it.
    PagemapScan,
    /// The `userfaultfd(2)` system call or `/dev/userfaultfd`'s `USERFAULTFD_IOC_NEW`.
    Userfaultfd,
    UffdioApi,
    UffdioRegister,
    UffdioUnregister,
    UffdioWake,
    UffdioWriteprotect,
    /// `read(2)` of userfaultfd messages.
    UffdRead,
    /// `poll(2)` on the userfaultfd.
    UffdPoll,
    Eventfd,
    /// Installing or reading the SIGBUS handler of the faulting-thread fault path.
    Sigaction,
}

impl fmt::Display for Syscall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Syscall::Mmap => "mmap",
            Syscall::Madvise => "madvise",
            Syscall::Msync => "msync",
            Syscall::ProcessMadvise => "process_madvise",
            Syscall::Mincore => "mincore",
            Syscall::Pread => "pread",
            Syscall::Preadv => "preadv",
            Syscall::Pwritev => "pwritev",
            Syscall::Fallocate => "fallocate",
            Syscall::Lseek => "lseek",
            Syscall::Fadvise => "posix_fadvise",
            Syscall::SyncFileRange => "sync_file_range",
            Syscall::MemfdCreate => "memfd_create",
            Syscall::Fstatfs => "fstatfs",
            Syscall::Fstat => "fstat",
            Syscall::Flock => "flock",
            Syscall::Linkat => "linkat",
            Syscall::Statvfs => "statvfs",
            Syscall::Getrandom => "getrandom",
            Syscall::Kill => "kill",
            Syscall::SchedSetaffinity => "sched_setaffinity",
            Syscall::Pipe => "pipe",
            Syscall::PagemapScan => "PAGEMAP_SCAN",
            Syscall::Userfaultfd => "userfaultfd",
            Syscall::UffdioApi => "UFFDIO_API",
            Syscall::UffdioRegister => "UFFDIO_REGISTER",
            Syscall::UffdioUnregister => "UFFDIO_UNREGISTER",
            Syscall::UffdioWake => "UFFDIO_WAKE",
            Syscall::UffdioWriteprotect => "UFFDIO_WRITEPROTECT",
            Syscall::UffdRead => "read of userfaultfd messages",
            Syscall::UffdPoll => "poll of the userfaultfd",
            Syscall::Eventfd => "eventfd",
            Syscall::Sigaction => "sigaction(SIGBUS)",
        })
    }
}

/// An error of the OS layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysError {
    /// `call` failed with `source` while doing `what` (e.g. "of 0x2000 bytes at 0x7f00..").
    #[error("{call} {what}: {source}")]
    Call {
        call: Syscall,
        what: String,
        #[source]
        source: io::Error,
    },
    /// An argument `call` would have been given was refused before the call (a range outside
    /// its mapping, a zero length, an alignment that is not a power of two, an interior NUL).
    #[error("{call}: {what}")]
    Argument { call: Syscall, what: String },
    /// `[off, off+len)` is not inside the mapping of `size` bytes it was meant for; nothing
    /// was done.
    #[error("range {off:#x}+{len:#x} outside mapping of {size:#x} bytes")]
    OutOfRange { off: usize, len: usize, size: usize },
    /// The kernel transferred less than asked and then nothing (end of file inside a page run).
    #[error("{call}: short {} at file offset {file_off}", if *.write { "write" } else { "read" })]
    Short {
        call: Syscall,
        write: bool,
        file_off: u64,
    },
    /// This kernel has no `call` (e.g. PAGEMAP_SCAN before Linux 6.7).
    #[error("{call} not supported by this kernel")]
    Unsupported { call: Syscall },
    /// No userfaultfd could be opened by any path; `tried` says what each path answered.
    #[error(
        "cannot open a userfaultfd ({tried}); as root run `sysctl -w vm.unprivileged_userfaultfd=1`, \
         or give this user read/write access to /dev/userfaultfd"
    )]
    NoUserfaultfd { tried: String },
}

/// The OS layer's result.
pub type Result<T, E = SysError> = std::result::Result<T, E>;

impl SysError {
    /// `call` failed with the calling thread's `errno`.
    pub(crate) fn last(call: Syscall, what: impl Into<String>) -> SysError {
        SysError::os(call, what, io::Error::last_os_error())
    }
    /// `call` failed with `source`.
    pub(crate) fn os(call: Syscall, what: impl Into<String>, source: io::Error) -> SysError {
        SysError::Call {
            call,
            what: what.into(),
            source,
        }
    }
    /// `call` was not made: `what` is wrong with its arguments.
    pub(crate) fn arg(call: Syscall, what: impl Into<String>) -> SysError {
        SysError::Argument {
            call,
            what: what.into(),
        }
    }
    /// The system call this error came from (None for a range check or a userfaultfd no path
    /// could open).
    pub fn call(&self) -> Option<Syscall> {
        match self {
            SysError::Call { call, .. }
            | SysError::Argument { call, .. }
            | SysError::Short { call, .. }
            | SysError::Unsupported { call } => Some(*call),
            SysError::OutOfRange { .. } | SysError::NoUserfaultfd { .. } => None,
        }
    }
    /// The OS error number, where the kernel returned one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SysError::Call { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
    /// The `io::ErrorKind` the error maps to.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            SysError::Call { source, .. } => source.kind(),
            SysError::Argument { .. } | SysError::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            SysError::Short { .. } => io::ErrorKind::UnexpectedEof,
            SysError::Unsupported { .. } => io::ErrorKind::Unsupported,
            SysError::NoUserfaultfd { .. } => io::ErrorKind::PermissionDenied,
        }
    }
}

/// For callers that work in `io::Result` (swap devices, front ends): an OS error stays that OS
/// error (its errno reaches errseq and the C ABI's `errno`; the call's name is dropped), any
/// other error becomes an `io::Error` of its kind carrying this error.
impl From<SysError> for io::Error {
    fn from(e: SysError) -> io::Error {
        match e {
            SysError::Call { source, .. } => source,
            other => io::Error::new(other.kind(), other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_call_and_keep_the_errno() {
        let e = SysError::os(
            Syscall::Madvise,
            "(MADV_DONTNEED) of 0x1000 bytes at 0x7000",
            io::Error::from_raw_os_error(libc::EINVAL),
        );
        assert!(
            e.to_string()
                .starts_with("madvise (MADV_DONTNEED) of 0x1000 bytes at 0x7000: Invalid argument"),
            "{e}"
        );
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(e.call(), Some(Syscall::Madvise));
        assert_eq!(io::Error::from(e).raw_os_error(), Some(libc::EINVAL));
        let a = SysError::arg(Syscall::Mmap, "mapping length must be greater than zero");
        assert_eq!(a.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            a.to_string(),
            "mmap: mapping length must be greater than zero"
        );
        let io = io::Error::from(a);
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
        assert!(io.to_string().contains("greater than zero"), "{io}");
        let s = SysError::Short {
            call: Syscall::Pwritev,
            write: true,
            file_off: 8192,
        };
        assert_eq!(s.to_string(), "pwritev: short write at file offset 8192");
    }
}
