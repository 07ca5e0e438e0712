//! Errors returned across the API. Every message names what was wrong and what to do.

use std::io;

/// usermm's error type.
#[derive(Debug)]
pub enum Error {
    /// A caller-supplied value is out of range or malformed.
    InvalidArgument(String),
    /// Mapping would exceed the commit limit (strict accounting).
    CommitLimit {
        requested: u64,
        committed: u64,
        limit: u64,
    },
    /// userfaultfd could not be opened or used.
    Userfaultfd(String),
    /// An operating-system call failed.
    Io { context: String, source: io::Error },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
    pub(crate) fn inval(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
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
            Error::Userfaultfd(m) => Error::Userfaultfd(format!("{what}: {m}")),
            other => Error::InvalidArgument(format!("{what}: {other}")),
        }
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::CommitLimit { requested, committed, limit } => write!(
                f,
                "commit limit exceeded: mapping {} ({requested} bytes) on top of {} already committed \
                 would exceed the limit of {} (budget + swap); map less, add swap, or enable overcommit",
                mib(*requested),
                mib(*committed),
                mib(*limit)
            ),
            Error::Userfaultfd(m) => write!(f, "userfaultfd: {m}"),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
