//! Errors returned across the API. Every message names what was wrong and what to do.
//!
//! One top-level [`Error`] whose variants carry a typed error per concern, so callers match on
//! the concern and the values: [`InvalidArgument`] (a value the caller gave: [`ConfigError`]
//! for sizes, `MmConfig` fields, environment variables and seed switches, [`SwapError`] for
//! swap device specs, [`RegionError`] for addresses, lengths and alignment, [`FileError`] for
//! cached files), [`UffdError`] (userfaultfd missing or lacking a feature, with the fix), the
//! commit limit, and OS errors (`Io`, `Sys`). Mirrors no kernel file: it is what the kernel
//! says with `-EINVAL`, `-ENOMEM` and friends, with the value and the fix named.

use std::io;
use std::path::PathBuf;

use crate::sys::SysError;

/// usermm's error type. Exhaustive on purpose: a new kind of error is a decision for every
/// front end (the C ABI's error codes, Python's exception classes).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller-supplied value is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(InvalidArgument),
    /// Mapping would exceed the commit limit (strict accounting).
    #[error(
        "commit limit exceeded: mapping {} ({requested} bytes) on top of {} already committed \
         would exceed the limit of {} (budget + swap); map less, add swap, or enable overcommit",
        mib(.requested),
        mib(.committed),
        mib(.limit)
    )]
    CommitLimit {
        requested: u64,
        committed: u64,
        limit: u64,
    },
    /// userfaultfd could not be opened or lacks a feature usermm needs.
    #[error("userfaultfd: {0}")]
    Userfaultfd(UffdError),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A call into the OS layer (usermm-sys) failed: what usermm was doing, and the system call
    /// with its own error.
    #[error("{context}: {source}")]
    Sys {
        context: String,
        #[source]
        source: SysError,
    },
}

/// A value the caller gave that usermm cannot use, by concern.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidArgument {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Swap(#[from] SwapError),
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error(transparent)]
    File(#[from] FileError),
    /// `source`, found in `what` (an environment variable such as `USERMM_BUDGET="x"`).
    #[error("{what}: {source}")]
    In {
        what: String,
        #[source]
        source: Box<InvalidArgument>,
    },
}

/// A size, an `MmConfig` field, an environment variable or a seed switch out of range or
/// malformed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error(
        "cannot parse size {value:?}: use a number with an optional k, M, G or T suffix, e.g. 256M"
    )]
    Size { value: String },
    #[error(
        "size {value:?} is too large: the largest is 2^64-1 bytes (16 EiB); give a smaller size"
    )]
    SizeTooLarge { value: String },
    /// A yes/no environment variable (`USERMM_OVERCOMMIT`, ...).
    #[error("{var}={value:?}: use 1 or 0")]
    Flag { var: String, value: String },
    #[error(
        "budget of {budget} bytes is below the minimum of {min} bytes (1 MiB); give a larger budget"
    )]
    BudgetTooSmall { budget: u64, min: u64 },
    #[error("budget of {budget} bytes is above the maximum of 16 TiB; give a smaller budget")]
    BudgetTooLarge { budget: u64 },
    #[error(
        "handler_threads {threads} is above the maximum of {max}; use 0 (one per CPU) or a \
         number up to {max}"
    )]
    HandlerThreads { threads: usize, max: usize },
    /// An `MmConfig` field outside its range (`unit` follows `hi`, e.g. " percent").
    #[error("{field} {value} is outside {lo}..={hi}{unit}; give a value in that range")]
    OutOfRange {
        field: &'static str,
        value: u32,
        lo: u32,
        hi: u32,
        unit: &'static str,
    },
    #[error(
        "watermarks min {min} <= low {low} <= high {high} must hold and high must be below half \
         the budget ({half} pages)"
    )]
    Watermarks {
        min: u64,
        low: u64,
        high: u64,
        half: u64,
    },
    /// `known` lists the switches.
    #[error("unknown switch {name:?}: the switches are {known} (and the setting laptop_mode)")]
    UnknownSwitch { name: String, known: String },
    #[error("setting {item:?} has no value: write name=value, e.g. accessed_init=old")]
    NoValue { item: String },
    #[error("setting {item:?} has no name before '=': write name=value, e.g. accessed_init=old")]
    NoName { item: String },
    #[error("laptop_mode={value:?}: use on or off")]
    LaptopMode { value: String },
    /// A setting this front end cannot honour; `why` says why and what to use instead.
    #[error("{what} is not supported: {why}")]
    Unsupported { what: String, why: String },
    #[error("{switch}={value:?}: use old ({old}) or new ({new})")]
    SwitchValue {
        switch: &'static str,
        value: String,
        old: &'static str,
        new: &'static str,
    },
}

/// A swap device spec or size that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwapError {
    #[error("unknown swap device {spec:?}: {}", crate::swap::SPEC_HELP)]
    UnknownDevice { spec: String },
    /// A known device with options or a size it cannot take; `reason` says which and why.
    #[error("swap device {spec:?}: {reason}")]
    Spec { spec: String, reason: String },
    #[error(
        "swap file directory {}: {source}: give an existing, writable directory",
        dir.display()
    )]
    Directory {
        dir: PathBuf,
        #[source]
        source: SysError,
    },
    /// The device refused a size or path the caller gave (its message names it and the fix).
    #[error("{source}")]
    Device {
        #[source]
        source: io::Error,
    },
}

/// An address, length, offset or alignment that does not fit a region.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    #[error("region length must be greater than zero")]
    ZeroLength,
    #[error("region length {len} exceeds the maximum of 4 PiB")]
    TooLong { len: usize },
    #[error("file offset {offset} is not a multiple of 4096; align it to the page size")]
    FileOffset { offset: u64 },
    /// `name` (an address space) has no file to map.
    #[error("{name} is not backed by a file; map files opened with Mm::open or a path")]
    NotFileBacked { name: String },
    /// `op` (discard, ...) over a range that is not page aligned.
    #[error("{op} range {off:#x}+{len:#x} is not 4 KiB aligned; align offset and length to 4096")]
    Unaligned {
        op: &'static str,
        off: usize,
        len: usize,
    },
    /// `op` (discard, flush) over a range that ends past the region's `size` bytes.
    #[error("{op} range {off:#x}+{len:#x} goes past the end of the region ({size:#x} bytes)")]
    PastEnd {
        op: &'static str,
        off: usize,
        len: usize,
        size: usize,
    },
    /// A copy into or out of the region outside it.
    #[error("range {off:#x}+{len:#x} outside mapping of {size:#x} bytes")]
    OutOfRange { off: usize, len: usize, size: usize },
}

/// A file the page cache cannot serve, or an access outside it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error("{} is not a regular file; the page cache serves regular files", path.display())]
    NotRegular { path: PathBuf },
    /// `fs` is a pseudo filesystem (procfs, sysfs, ...).
    #[error(
        "{} is on {fs}, whose files do not have the size they report; the page cache serves \
         files on ordinary filesystems: copy it to one first",
        path.display()
    )]
    PseudoFs { path: PathBuf, fs: &'static str },
    #[error("read of {len} bytes at {pos} of {name} reaches past its end ({size} bytes)")]
    ReadPastEnd {
        len: usize,
        pos: u64,
        name: String,
        size: u64,
    },
    /// A swap entry in the page cache of a file that is not in memory (a bug, named).
    #[error(
        "page {index} of {name} is a swap entry ({entry}), but only in-memory files are swapped"
    )]
    UnexpectedSwapEntry {
        index: u64,
        name: String,
        entry: String,
    },
    /// An in-memory file's page is in swap but the manager has no swap device.
    #[error("in-memory file page in swap without a swap device")]
    SwappedWithoutDevice,
}

/// userfaultfd unavailable, or without a feature usermm needs; each message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UffdError {
    /// No path could open one (the message names `vm.unprivileged_userfaultfd` and
    /// /dev/userfaultfd), or the handshake failed.
    #[error("{0}")]
    Open(#[source] SysError),
    #[error("this kernel's userfaultfd lacks UFFDIO_MOVE (Linux 6.8+ needed); upgrade the kernel")]
    NoMove,
    #[error("this kernel's userfaultfd lacks write-protect mode (Linux 5.7+)")]
    NoWriteProtect,
    /// `fault_path=sigbus` on a userfaultfd without `UFFD_FEATURE_SIGBUS` (Linux 4.14+).
    #[error("fault_path=sigbus: this kernel's userfaultfd lacks UFFD_FEATURE_SIGBUS (Linux 4.14+); use fault_path=handler")]
    NoSigbus,
    /// `fault_path=sigbus`: the SIGBUS handler could not be installed.
    #[error("fault_path=sigbus: {source}")]
    Sigbus {
        #[source]
        source: SysError,
    },
}

macro_rules! invalid_from {
    ($($t:ident),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::InvalidArgument(InvalidArgument::from(e))
            }
        }
    )*};
}
invalid_from!(ConfigError, SwapError, RegionError, FileError);

impl From<UffdError> for Error {
    fn from(e: UffdError) -> Error {
        Error::Userfaultfd(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `context` (what usermm was doing) failed with `source`: an `io::Error` (`Error::Io`) or
    /// the OS layer's `SysError` (`Error::Sys`).
    pub(crate) fn io(context: impl Into<String>, source: impl OsCause) -> Error {
        source.with_context(context.into())
    }
    /// The kind of an OS error (`Io`, `Sys`); None for the others.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            Error::Sys { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
    /// The errno of an OS error (`Io`, `Sys`) where the kernel returned one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Sys { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
    /// This error with `what` (e.g. `USERMM_BUDGET="x"`) in front of its message, keeping its
    /// kind (and not repeating "invalid argument"). The commit limit and userfaultfd errors
    /// name no value the caller gave and are returned as they are.
    pub(crate) fn prefixed(self, what: &str) -> Error {
        match self {
            Error::InvalidArgument(source) => Error::InvalidArgument(InvalidArgument::In {
                what: what.to_owned(),
                source: Box::new(source),
            }),
            Error::Io { context, source } => Error::Io {
                context: format!("{what}: {context}"),
                source,
            },
            Error::Sys { context, source } => Error::Sys {
                context: format!("{what}: {context}"),
                source,
            },
            other @ (Error::CommitLimit { .. } | Error::Userfaultfd(_)) => other,
        }
    }
}

/// An OS error a context can be put on: `io::Error` or the OS layer's `SysError`.
pub(crate) trait OsCause {
    fn with_context(self, context: String) -> Error;
}

impl OsCause for io::Error {
    fn with_context(self, context: String) -> Error {
        Error::Io {
            context,
            source: self,
        }
    }
}

impl OsCause for SysError {
    fn with_context(self, context: String) -> Error {
        Error::Sys {
            context,
            source: self,
        }
    }
}

/// A bare `?` on the OS layer's result: the system call's error is the whole message.
impl From<SysError> for Error {
    fn from(e: SysError) -> Error {
        Error::Sys {
            context: "system call".into(),
            source: e,
        }
    }
}

fn mib(b: &u64) -> String {
    format!("{:.1} MiB", *b as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_value_and_what_to_do() {
        let e = Error::CommitLimit {
            requested: 3 << 20,
            committed: 1 << 20,
            limit: 2 << 20,
        };
        assert_eq!(
            e.to_string(),
            "commit limit exceeded: mapping 3.0 MiB (3145728 bytes) on top of 1.0 MiB already \
             committed would exceed the limit of 2.0 MiB (budget + swap); map less, add swap, or \
             enable overcommit"
        );
        assert_eq!(
            Error::from(RegionError::ZeroLength).to_string(),
            "invalid argument: region length must be greater than zero"
        );
        let io = Error::io("opening /nope", io::Error::from_raw_os_error(libc::ENOENT));
        assert!(io.to_string().starts_with("opening /nope: No such file"));
        assert!(
            std::error::Error::source(&io).is_some(),
            "the OS error is the source"
        );
        let sys = Error::io(
            "mapping the frame pool",
            crate::sys::Mapping::anon(0, 0).unwrap_err(),
        );
        assert!(matches!(sys, Error::Sys { .. }), "{sys:?}");
        assert_eq!(
            sys.to_string(),
            "mapping the frame pool: mmap: mapping length must be greater than zero"
        );
        assert_eq!(sys.io_kind(), Some(io::ErrorKind::InvalidInput));
        let os = Error::io("reading", io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(os.raw_os_error(), Some(libc::EIO));
        assert_eq!(
            Error::from(ConfigError::Size { value: "x".into() })
                .prefixed("USERMM_BUDGET")
                .to_string(),
            "invalid argument: USERMM_BUDGET: cannot parse size \"x\": use a number with an \
             optional k, M, G or T suffix, e.g. 256M"
        );
    }
}
