//! Errors returned across the API. Every message names what was wrong and what to do.

use std::io;

use crate::sys::SysError;

/// usermm's error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller-supplied value is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
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
    /// userfaultfd could not be opened or used.
    #[error("userfaultfd: {0}")]
    Userfaultfd(String),
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

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `context` (what usermm was doing) failed with `source`: an `io::Error` (`Error::Io`) or
    /// the OS layer's `SysError` (`Error::Sys`).
    pub(crate) fn io(context: impl Into<String>, source: impl OsCause) -> Error {
        source.with_context(context.into())
    }
    pub(crate) fn inval(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
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
    /// kind (and not repeating "invalid argument").
    pub(crate) fn prefixed(self, what: &str) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
            Error::Io { context, source } => Error::Io {
                context: format!("{what}: {context}"),
                source,
            },
            Error::Sys { context, source } => Error::Sys {
                context: format!("{what}: {context}"),
                source,
            },
            Error::Userfaultfd(m) => Error::Userfaultfd(format!("{what}: {m}")),
            other => Error::InvalidArgument(format!("{what}: {other}")),
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
        assert_eq!(Error::inval("x").to_string(), "invalid argument: x");
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
            Error::inval("bad")
                .prefixed("USERMM_BUDGET=\"x\"")
                .to_string(),
            "invalid argument: USERMM_BUDGET=\"x\": bad"
        );
    }
}
