//! Errors returned across the API. Every message names what was wrong and what to do.

use std::io;

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
        assert_eq!(
            Error::inval("bad")
                .prefixed("USERMM_BUDGET=\"x\"")
                .to_string(),
            "invalid argument: USERMM_BUDGET=\"x\": bad"
        );
    }
}
