//! The exception classes and the conversion of core errors ([`usermm::Error`]) into them.
//!
//! `usermm.Error` (an `Exception`) is the base of every error usermm raises; each kind also
//! derives from the builtin a Python caller would expect, so `except ValueError` works too:
//!
//! | core error | Python class | also a |
//! |---|---|---|
//! | `InvalidArgument` (and bad Python arguments) | `InvalidArgumentError` | `ValueError` |
//! | `CommitLimit` | `CommitLimitError` | `MemoryError` |
//! | `Userfaultfd` | `UserfaultfdError` | `OSError` |
//! | `Io`, `Sys` | `IoError` (with `errno` set) | `OSError` |
//! | a Rust panic (a bug in usermm) | `InternalError` | |
//!
//! The message is the core's `Display` text, which names what was wrong and what to do.
//!
//! No panic crosses into Python: every method and function of the module runs its body in
//! [`guard`], which turns a panic into `InternalError` (an ordinary `Exception`, unlike PyO3's
//! own `PanicException`, which derives from `BaseException` and escapes `except Exception`).
//! python/tests/test_inputs.py checks both the conversion and that every entry point in
//! python/src is guarded.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    usermm,
    Error,
    PyException,
    "Base class of every error usermm raises. The message says what was wrong and what to do."
);

create_exception!(
    usermm,
    InternalError,
    Error,
    "A bug in usermm: a Rust panic was caught at the Python boundary. The message names the \
     call and the panic; please report it. The interpreter and other managers keep working."
);

/// Runs the body of the Python entry point `what`; a panic inside it becomes `InternalError`
/// naming `what` and the panic's message, so no panic unwinds into the interpreter.
pub fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(InternalError::new_err(format!(
                "internal error in usermm (a panic was caught at the Python boundary in \
                 {what}): {msg}; please report it"
            )))
        }
    }
}

/// `usermm._test_panic(message)`: panics inside [`guard`] (for the test that no panic reaches
/// Python).
#[pyfunction]
pub fn _test_panic(message: &str) -> PyResult<()> {
    guard("_test_panic", || panic!("{message}"))
}

/// The subclasses with two bases (`Error` and a builtin), made once per process.
struct Kinds {
    invalid: Py<PyType>,
    commit: Py<PyType>,
    uffd: Py<PyType>,
    io: Py<PyType>,
}

static KINDS: PyOnceLock<Kinds> = PyOnceLock::new();

const KIND_DOCS: [(&str, &str); 4] = [
    (
        "InvalidArgumentError",
        "A malformed or out-of-range argument (a size like \"256Q\", an unknown swap device or \
         switch, a negative shape, an unknown dtype). Also a ValueError.",
    ),
    (
        "CommitLimitError",
        "Mapping would exceed the commit limit (budget + swap) under strict accounting. Also a \
         MemoryError. Map less, give a larger swap_size, or pass overcommit=True.",
    ),
    (
        "UserfaultfdError",
        "userfaultfd could not be opened or lacks a feature usermm needs (Linux 6.8+). Also an \
         OSError.",
    ),
    (
        "IoError",
        "An operating-system call failed (opening the swap file, mmap, registering a region). \
         Also an OSError, with errno set.",
    ),
];

fn make_kind(
    py: Python<'_>,
    name: &str,
    doc: &str,
    builtin: Bound<'_, PyType>,
) -> PyResult<Py<PyType>> {
    let bases = PyTuple::new(py, [py.get_type::<Error>(), builtin])?;
    let dict = PyDict::new(py);
    dict.set_item("__module__", "usermm")?;
    dict.set_item("__doc__", doc)?;
    let t = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(t.cast_into::<PyType>()?.unbind())
}

fn kinds(py: Python<'_>) -> PyResult<&'static Kinds> {
    KINDS.get_or_try_init(py, || {
        Python::attach(|py| {
            Ok(Kinds {
                invalid: make_kind(
                    py,
                    KIND_DOCS[0].0,
                    KIND_DOCS[0].1,
                    py.get_type::<PyValueError>(),
                )?,
                commit: make_kind(
                    py,
                    KIND_DOCS[1].0,
                    KIND_DOCS[1].1,
                    py.get_type::<PyMemoryError>(),
                )?,
                uffd: make_kind(
                    py,
                    KIND_DOCS[2].0,
                    KIND_DOCS[2].1,
                    py.get_type::<PyOSError>(),
                )?,
                io: make_kind(
                    py,
                    KIND_DOCS[3].0,
                    KIND_DOCS[3].1,
                    py.get_type::<PyOSError>(),
                )?,
            })
        })
    })
}

/// Adds `Error` and its subclasses to the module.
pub fn add_to_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(_test_panic, m)?)?;
    let k = kinds(py)?;
    for (t, (name, _)) in [&k.invalid, &k.commit, &k.uffd, &k.io]
        .into_iter()
        .zip(KIND_DOCS)
    {
        m.add(name, t.bind(py))?;
    }
    Ok(())
}

/// The Python exception for a core error, carrying the core's message.
pub fn to_py(py: Python<'_>, e: usermm::Error) -> PyErr {
    let k = match kinds(py) {
        Ok(k) => k,
        Err(err) => return err,
    };
    let msg = e.to_string();
    match &e {
        usermm::Error::InvalidArgument(_) => PyErr::from_type(k.invalid.bind(py).clone(), msg),
        usermm::Error::CommitLimit { .. } => PyErr::from_type(k.commit.bind(py).clone(), msg),
        usermm::Error::Userfaultfd(_) => PyErr::from_type(k.uffd.bind(py).clone(), msg),
        usermm::Error::Io { .. } | usermm::Error::Sys { .. } => match errno_of(&e) {
            // OSError(errno, strerror) sets .errno and prints "[Errno N] message".
            Some(errno) => PyErr::from_type(k.io.bind(py).clone(), (errno, msg)),
            None => PyErr::from_type(k.io.bind(py).clone(), msg),
        },
    }
}

/// The errno of an I/O error: its OS error code, or for an error the core re-wrapped with a
/// message (keeping only the kind), the errno of that kind.
fn errno_of(e: &usermm::Error) -> Option<i32> {
    use std::io::ErrorKind as K;
    e.raw_os_error().or(match e.io_kind()? {
        K::NotFound => Some(libc::ENOENT),
        K::PermissionDenied => Some(libc::EACCES),
        K::AlreadyExists => Some(libc::EEXIST),
        K::InvalidInput => Some(libc::EINVAL),
        K::OutOfMemory => Some(libc::ENOMEM),
        K::StorageFull => Some(libc::ENOSPC),
        K::ReadOnlyFilesystem => Some(libc::EROFS),
        K::NotADirectory => Some(libc::ENOTDIR),
        K::IsADirectory => Some(libc::EISDIR),
        K::Unsupported => Some(libc::EOPNOTSUPP),
        _ => None,
    })
}

/// [`to_py`] for `map_err` where no `Python` token is at hand.
pub fn mm_err(e: usermm::Error) -> PyErr {
    Python::attach(|py| to_py(py, e))
}

/// An `InvalidArgumentError` with `msg` (prefixed "invalid argument: " like the core's), for
/// a bad Python argument the core never sees.
pub fn invalid(msg: impl Into<String>) -> PyErr {
    let msg = format!("invalid argument: {}", msg.into());
    Python::attach(|py| match kinds(py) {
        Ok(k) => PyErr::from_type(k.invalid.bind(py).clone(), msg),
        Err(err) => err,
    })
}
