//! `usermm.Region`: a Python object owning one usermm [`Region`](usermm::Region) and exporting
//! its memory through the buffer protocol (PEP 3118, like `bytearray`), writable, one
//! dimension of unsigned bytes. numpy arrays built on it (`numpy.ndarray(buffer=region)`) and
//! memoryviews of it hold a reference to it, so the region lives as long as anything views it;
//! when the last reference goes, the region is unmapped and its frames and swap slots are freed.
//!
//! PyO3's `__getbuffer__` needs the limited API of Python 3.11 (`Py_buffer` joined the stable
//! ABI there), but this module is one abi3 wheel for 3.9+. So the data and methods live in the
//! pyclass `_RegionBase`, and `Region` is a subclass made with `PyType_FromSpecWithBases` whose
//! only addition is the `bf_getbuffer` slot. CPython accepts buffer slots in type specs since
//! 3.9, and `Py_buffer`'s layout has not changed since 3.3 (it is frozen from 3.11 on). The
//! slot function fills the view the way `PyBuffer_FillInfo` does. Apart from the fork hook's
//! `madvise` (`fork.rs`), it is the crate's only `unsafe` code.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::args;
use crate::errors::{invalid, mm_err};
use crate::fork;
use crate::manager::Manager;

/// The data and methods of `usermm.Region` (use `Manager.map_anon` or `Region(manager, nbytes)`).
#[pyclass(frozen, subclass, module = "usermm", name = "_RegionBase")]
#[derive(Debug)]
pub struct RegionBase {
    /// Taken (and dropped without the GIL) only in `Drop`.
    region: Option<usermm::Region>,
    /// The exported length; the mapping is this rounded up to 4 KiB (at least one page).
    nbytes: usize,
    /// The process that mapped the region (see `fork.rs`).
    pid: u32,
}

impl RegionBase {
    fn region(&self) -> &usermm::Region {
        self.region
            .as_ref()
            .expect("the region is only taken when the object is dropped")
    }
}

impl Drop for RegionBase {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            if fork::is_inherited(self.pid) {
                // A fork child's copy: unmapping would unregister the parent's region through
                // the shared userfaultfd. Leak it.
                std::mem::forget(r);
                return;
            }
            // Unmapping frees frames and swap slots and may wait for pages under I/O; if this
            // was the last reference to its manager, the manager's threads are joined too.
            Python::attach(|py| py.detach(move || drop(r)));
        }
    }
}

#[pymethods]
impl RegionBase {
    /// Maps `nbytes` bytes of zero-filled memory managed by `manager`. The memory is committed
    /// against the manager's commit limit (budget + swap) unless it overcommits.
    /// `nbytes` is an int or a size string such as "64M".
    /// With `path`: `nbytes` bytes of that file from byte `offset` (a multiple of 4096) through
    /// usermm's page cache, shared (stores reach the file; `flush` makes them durable) or
    /// private (copy-on-write); `nbytes=None` maps the rest of the file.
    #[new]
    #[pyo3(signature = (manager, nbytes, path = None, offset = None, shared = true))]
    fn new(
        py: Python<'_>,
        manager: &Manager,
        nbytes: &Bound<'_, PyAny>,
        path: Option<std::path::PathBuf>,
        offset: Option<&Bound<'_, PyAny>>,
        shared: bool,
    ) -> PyResult<Self> {
        crate::errors::guard("Region()", || {
            fork::check(manager.pid, "Manager")?;
            let offset = match offset.filter(|o| !o.is_none()) {
                Some(o) => args::length("offset", o)? as u64,
                None => 0,
            };
            if path.is_none() && offset != 0 {
                return Err(invalid(format!(
                    "offset={offset}: an offset is only meaningful with a path"
                )));
            }
            // The file's size now: a mapping reaching past it would raise SIGBUS on access, which
            // kills the interpreter, so it is refused here (as Python's own mmap module does).
            let file_len = match &path {
                Some(p) => Some(args::mappable_file_len(p)?),
                None => None,
            };
            let nbytes = if nbytes.is_none() {
                let (Some(p), Some(len)) = (&path, file_len) else {
                    return Err(invalid(
                        "nbytes: None is only allowed with a path (the rest of the file)",
                    ));
                };
                len.checked_sub(offset).filter(|n| *n > 0).ok_or_else(|| {
                    invalid(format!(
                        "offset {offset} is at or past the end of {} ({len} bytes)",
                        p.display()
                    ))
                })? as usize
            } else {
                args::length("nbytes", nbytes)?
            };
            if let (Some(p), Some(len)) = (&path, file_len) {
                let end = offset.checked_add(nbytes as u64);
                if end.is_none_or(|end| end > len) {
                    return Err(invalid(format!(
                    "offset {offset} + nbytes {nbytes} reaches past the end of {} ({len} bytes); \
                     touching that part would kill the process with SIGBUS: map less, or extend \
                     the file first (os.truncate)",
                    p.display()
                )));
                }
            }
            let mm = manager.mm().clone();
            let region = py
                .detach(move || match path {
                    Some(p) => mm.map_file(
                        p,
                        offset,
                        nbytes.max(1),
                        if shared {
                            usermm::MapKind::Shared
                        } else {
                            usermm::MapKind::Private
                        },
                    ),
                    None => mm.map_anon(nbytes.max(1)),
                })
                .map_err(mm_err)?;
            Ok(RegionBase {
                region: Some(region),
                nbytes,
                pid: fork::pid(),
            })
        })
    }

    /// The number of bytes the buffer exports.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        crate::errors::guard("Region.nbytes", || Ok(self.nbytes))
    }

    fn __len__(&self) -> PyResult<usize> {
        crate::errors::guard("Region.__len__", || Ok(self.nbytes))
    }

    /// The address of the first byte (for ctypes and C code; the memory changes under reclaim,
    /// so access it only through pointers, never cache it).
    #[getter]
    fn address(&self) -> PyResult<usize> {
        crate::errors::guard("Region.address", || Ok(self.region().as_ptr() as usize))
    }

    /// The Manager serving this region (a new handle on the same manager).
    #[getter]
    fn manager(&self) -> PyResult<Manager> {
        crate::errors::guard("Region.manager", || {
            Ok(Manager::from_mm(self.region().mm(), self.pid))
        })
    }

    /// Frees the memory and swap of `[offset, offset + length)` (like `madvise(MADV_DONTNEED)`):
    /// later reads return zeros. `offset` and `length` must be multiples of 4096; `length=None`
    /// means to the end of the mapping.
    #[pyo3(signature = (offset = None, length = None), text_signature = "($self, offset=0, length=None)")]
    fn discard(
        &self,
        py: Python<'_>,
        offset: Option<&Bound<'_, PyAny>>,
        length: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        crate::errors::guard("Region.discard", || {
            fork::check(self.pid, "Region")?;
            let r = self.region();
            let (offset, len) = range_args(r, "discard", offset, length)?;
            py.detach(|| r.discard(offset, len)).map_err(mm_err)
        })
    }

    /// Advice on how the region will be used (`madvise(2)`): "random" (faults read only their
    /// own page, of the file and of swap), "sequential" (faults read whole windows ahead),
    /// "normal" (read ahead by what the faults look like; the default), for the whole region;
    /// or "willneed": start reading `[offset, offset + length)` of a file region into the page
    /// cache in the background (`length=None`: to the end; nothing to do for anonymous memory).
    #[pyo3(signature = (advice, offset = None, length = None), text_signature = "($self, advice, offset=0, length=None)")]
    fn advise(
        &self,
        py: Python<'_>,
        advice: &str,
        offset: Option<&Bound<'_, PyAny>>,
        length: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        crate::errors::guard("Region.advise", || {
            fork::check(self.pid, "Region")?;
            let r = self.region();
            let pattern = match advice {
            "normal" => usermm::AccessPattern::Normal,
            "random" => usermm::AccessPattern::Random,
            "sequential" => usermm::AccessPattern::Sequential,
            "willneed" => {
                let (offset, len) = range_args(r, "willneed", offset, length)?;
                return py.detach(|| r.willneed(offset, len)).map_err(mm_err);
            }
            other => {
                return Err(invalid(format!(
                    "advice {other:?} is unknown: use \"normal\", \"random\", \"sequential\" or \"willneed\""
                )))
            }
        };
            if offset.is_some_and(|o| !o.is_none()) || length.is_some_and(|l| !l.is_none()) {
                return Err(invalid(format!(
                    "advice {advice:?} applies to the whole region: give no offset or length"
                )));
            }
            r.set_access_pattern(pattern);
            Ok(())
        })
    }

    /// The access pattern set by `advise`: "normal", "random" or "sequential".
    #[getter]
    fn access_pattern(&self) -> PyResult<&'static str> {
        crate::errors::guard("Region.access_pattern", || {
            Ok(match self.region().access_pattern() {
                usermm::AccessPattern::Random => "random",
                usermm::AccessPattern::Sequential => "sequential",
                _ => "normal",
            })
        })
    }

    /// Writes back the dirty pages of `[offset, offset + length)` of a shared file region and
    /// fdatasyncs the file (msync(MS_SYNC)); raises the first writeback error not yet reported
    /// to this region. Anonymous and private regions have nothing to write.
    #[pyo3(signature = (offset = None, length = None), text_signature = "($self, offset=0, length=None)")]
    fn flush(
        &self,
        py: Python<'_>,
        offset: Option<&Bound<'_, PyAny>>,
        length: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        crate::errors::guard("Region.flush", || {
            fork::check(self.pid, "Region")?;
            let r = self.region();
            let (offset, len) = range_args(r, "flush", offset, length)?;
            py.detach(|| r.flush(offset, len)).map_err(mm_err)
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        crate::errors::guard("Region.__repr__", || {
            Ok(format!(
                "<usermm.Region nbytes={} address={:#x}>",
                self.nbytes,
                self.region().as_ptr() as usize
            ))
        })
    }
}

/// `Py_buffer` and the request flags, from CPython's `Include/pybuffer.h`. PyO3's ffi exposes
/// them only when built for the 3.11 limited API; the layout is the same in 3.9 and 3.10.
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut std::ffi::c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_ND: c_int = 0x0008;
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;

static REGION_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const REGION_DOC: &std::ffi::CStr = c"Region(manager, nbytes)\n--\n\n\
Zero-filled memory of nbytes bytes managed by a usermm Manager, exported through the buffer \
protocol (writable bytes): numpy.ndarray(buffer=region), memoryview(region), file.readinto(region). \
Anything viewing it keeps it alive; when the last reference goes, its memory and swap are freed.";

/// The `usermm.Region` type: `_RegionBase` plus the buffer slot.
pub fn region_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let t = REGION_TYPE.get_or_try_init(py, || {
        Python::attach(|py| {
            let bases = PyTuple::new(py, [py.get_type::<RegionBase>()])?;
            let mut slots = [
                ffi::PyType_Slot {
                    slot: ffi::Py_bf_getbuffer,
                    pfunc: region_getbuffer as *mut c_void,
                },
                ffi::PyType_Slot {
                    slot: ffi::Py_tp_doc,
                    pfunc: REGION_DOC.as_ptr() as *mut c_void,
                },
                ffi::PyType_Slot {
                    slot: 0,
                    pfunc: std::ptr::null_mut(),
                },
            ];
            let mut spec = ffi::PyType_Spec {
                // CPython keeps this pointer as tp_name: it must be static.
                name: c"usermm.Region".as_ptr(),
                basicsize: 0, // inherit _RegionBase's layout
                itemsize: 0,
                flags: ffi::Py_TPFLAGS_DEFAULT as _,
                slots: slots.as_mut_ptr(),
            };
            // SAFETY: the spec and slots are valid for the call (CPython copies the slots and
            // the doc string; the name is a static C string); bases is a tuple holding one
            // heap type whose instances have the layout the subclass inherits (basicsize 0).
            let t = unsafe { ffi::PyType_FromSpecWithBases(&mut spec, bases.as_ptr()) };
            // SAFETY: t is a new reference or null with an exception set.
            let t = unsafe { Bound::from_owned_ptr_or_err(py, t) }?;
            Ok::<_, PyErr>(t.cast_into::<PyType>()?.unbind())
        })
    })?;
    Ok(t.bind(py))
}

/// `bf_getbuffer` of `usermm.Region`: fills `view` over the region's memory like
/// `PyBuffer_FillInfo(view, obj, buf, len, readonly=0, flags)`.
unsafe extern "C" fn region_getbuffer(
    slf: *mut ffi::PyObject,
    view: *mut PyBuffer,
    flags: c_int,
) -> c_int {
    // SAFETY: CPython calls bf_getbuffer with the calling thread attached to the interpreter.
    let py = unsafe { Python::assume_attached() };
    let fill = || -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("getbuffer: view==NULL is obsolete"));
        }
        // SAFETY: slf is a valid borrowed reference to the object whose slot this is.
        let obj = unsafe { Bound::from_borrowed_ptr(py, slf) };
        let owner = obj.cast::<RegionBase>()?;
        let rb = owner.get();
        let buf = rb.region().as_ptr();
        // SAFETY: view points to a Py_buffer the caller owns; every field is written below, as
        // PyBuffer_FillInfo does. `obj` gets a new reference, released by PyBuffer_Release. The
        // format string is static and never written through; shape and strides point into the
        // view itself, which is what PyBuffer_FillInfo does for one dimension.
        unsafe {
            let v = &mut *view;
            v.buf = buf.cast::<c_void>();
            v.obj = obj.clone().into_ptr();
            v.len = rb.nbytes as ffi::Py_ssize_t;
            v.readonly = 0;
            v.itemsize = 1;
            v.format = if flags & PYBUF_FORMAT == PYBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            v.ndim = 1;
            v.shape = if flags & PYBUF_ND == PYBUF_ND {
                &mut v.len
            } else {
                std::ptr::null_mut()
            };
            v.strides = if flags & PYBUF_STRIDES == PYBUF_STRIDES {
                &mut v.itemsize
            } else {
                std::ptr::null_mut()
            };
            v.suboffsets = std::ptr::null_mut();
            v.internal = std::ptr::null_mut();
        }
        Ok(())
    };
    let err = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(fill)) {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e,
        Err(_) => crate::errors::InternalError::new_err(
            "internal error in usermm (a panic was caught at the Python boundary in \
             Region.__getbuffer__); please report it",
        ),
    };
    if !view.is_null() {
        // SAFETY: on failure the protocol wants view->obj NULL; view is valid (checked).
        unsafe { (*view).obj = std::ptr::null_mut() };
    }
    err.restore(py);
    -1
}

/// `offset` (default 0) and `length` (default: to the end of `r`) of a range operation `op`.
fn range_args(
    r: &usermm::Region,
    op: &str,
    offset: Option<&Bound<'_, PyAny>>,
    length: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, usize)> {
    let offset = match offset.filter(|o| !o.is_none()) {
        Some(o) => args::length("offset", o)?,
        None => 0,
    };
    let len = match length.filter(|l| !l.is_none()) {
        Some(l) => args::length("length", l)?,
        None => r.len().checked_sub(offset).ok_or_else(|| {
            invalid(format!(
                "{op} offset {offset:#x} is past the end of the region ({:#x} bytes)",
                r.len()
            ))
        })?,
    };
    Ok((offset, len))
}
