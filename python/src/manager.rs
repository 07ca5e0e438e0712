//! `usermm.Manager` (one [`Mm`]: budget, swap device, handler threads, kswapd, counters),
//! `Manager.array` (numpy arrays on a `usermm.Region`), and the process-wide default manager
//! `usermm.default()` configured from the environment like the C ABI's and `usermm run`'s.
//!
//! Managers open userfaultfd with the policy of every usermm front end (`OpenPolicy::Auto`:
//! the most capable mode the process may open, /dev/userfaultfd or the full syscall before
//! user-mode-only), so that system calls touching array memory that is swapped out
//! (`ndarray.tofile`, `file.readinto`, `os.write`) fault the pages in wherever full mode is
//! allowed. Where only user-mode-only is, such calls fail with EFAULT on non-resident pages.
//! `Manager.uffd_mode` says which one was obtained.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyList, PyTuple};
use usermm::{Behaviour, Mm, MmConfig, OpenPolicy, Origin};

use crate::args;
use crate::errors::{invalid, mm_err};
use crate::fork;
use crate::region::region_type;

/// Budget of `Manager()` without arguments (the same default as `USERMM_BUDGET`).
const DEFAULT_BUDGET: &str = "256M";

/// A usermm memory manager: a memory budget, a swap device, fault handler threads and kswapd.
///
/// budget: the most memory the manager keeps resident, as "256M", "1.5G" or an int of bytes.
/// swap: "file" (an unlinked temporary file in $TMPDIR, written with O_DIRECT), "file:PATH",
///     "ram" (RAM allocated on demand), "none", or a compressed tier in front of one:
///     "zswap+file", "zswap+ram", "zswap:zstd,pool=25%+file:PATH" (options lz4 (default), zstd,
///     zstd=LEVEL, pool=SIZE, pool=N% of the budget (default 20%)).
/// swap_size: capacity of the swap device (default 4x the budget), as for budget.
/// overcommit: False (default) = strict accounting, mapping more than budget + swap raises
///     CommitLimitError; True = allowed, and a page that then finds swap full is poisoned (the
///     process gets SIGBUS when it touches it).
/// settings: the seed switches and laptop_mode, as "name=value,..." (like USERMM_SET) or a dict.
/// swap_encrypt: True = the file and Redis tiers store every page encrypted (ChaCha20-Poly1305,
///     a random key held only in memory; like USERMM_SWAP_ENCRYPT=1).
/// swap_keep: True = a "file:PATH" swap file is kept at its path when the manager goes
///     (default: the file never has a name on disk, or its path is unlinked as it is opened, so
///     its blocks are freed when the manager goes, even if the process is killed).
///
/// Arrays and regions keep their manager alive: deleting the Manager object does not invalidate
/// them; the manager stops when the last of them is gone.
#[pyclass(frozen, module = "usermm")]
#[derive(Debug)]
pub struct Manager {
    /// Taken (and dropped without the GIL) only in `Drop`.
    mm: Option<Mm>,
    /// The process that made the manager (see `fork.rs`).
    pub(crate) pid: u32,
}

impl Drop for Manager {
    fn drop(&mut self) {
        if let Some(mm) = self.mm.take() {
            if fork::is_inherited(self.pid) {
                // A fork child's copy: its threads do not exist here and its userfaultfd is the
                // parent's. Leak it.
                std::mem::forget(mm);
                return;
            }
            // The last handle on a manager joins its threads.
            Python::attach(|py| py.detach(move || drop(mm)));
        }
    }
}

impl Manager {
    pub fn mm(&self) -> &Mm {
        self.mm
            .as_ref()
            .expect("the manager is only taken when the object is dropped")
    }

    /// A handle on `mm`, made by process `pid`.
    pub fn from_mm(mm: Mm, pid: u32) -> Manager {
        Manager { mm: Some(mm), pid }
    }

    /// Creates the manager `cfg` describes (userfaultfd: `OpenPolicy::Auto`, see the module
    /// doc).
    fn open(py: Python<'_>, mut cfg: MmConfig) -> PyResult<Manager> {
        cfg.uffd_policy = OpenPolicy::Auto;
        let mm = py.detach(move || Mm::new(cfg)).map_err(mm_err)?;
        Ok(Manager::from_mm(mm, fork::pid()))
    }
}

#[pymethods]
impl Manager {
    // Python's keyword arguments, one parameter each.
    #[allow(clippy::too_many_arguments)]
    #[new]
    #[pyo3(
        signature = (budget = None, swap = "file", swap_size = None, overcommit = false, settings = None, swap_encrypt = false, swap_keep = false, group = None),
        text_signature = "(budget='256M', swap='file', swap_size=None, overcommit=False, settings=None, swap_encrypt=False, swap_keep=False, group=None)"
    )]
    fn new(
        py: Python<'_>,
        budget: Option<&Bound<'_, PyAny>>,
        swap: &str,
        swap_size: Option<&Bound<'_, PyAny>>,
        overcommit: bool,
        settings: Option<&Bound<'_, PyAny>>,
        swap_encrypt: bool,
        swap_keep: bool,
        group: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        crate::errors::guard("Manager()", || {
            let budget = match budget.filter(|b| !b.is_none()) {
                Some(b) => args::size("budget", b)?,
                None => usermm::parse_size(DEFAULT_BUDGET).map_err(mm_err)?,
            };
            let swap_size = match swap_size.filter(|s| !s.is_none()) {
                Some(s) => args::size("swap_size", s)?,
                None => budget.saturating_mul(4),
            };
            let mut cfg = MmConfig::new(budget)
                .swap(args::swap(swap, swap_size)?)
                .overcommit(overcommit)
                .settings(args::settings(settings)?);
            cfg.swap_encrypt = swap_encrypt;
            cfg.swap_keep = swap_keep;
            cfg.group = group;
            Manager::open(py, cfg)
        })
    }

    /// A writable, C-contiguous, zero-filled numpy array of `shape` and `dtype` (any numpy dtype
    /// without Python objects; default float64) whose memory is a usermm region of this
    /// manager. The array's `.base` is the `usermm.Region`; the memory lives as long as any
    /// array or memoryview viewing it.
    #[pyo3(signature = (shape, dtype = None))]
    fn array<'py>(
        slf: &Bound<'py, Self>,
        shape: &Bound<'py, PyAny>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::errors::guard("Manager.array", || {
            let py = slf.py();
            let dims = args::shape(shape)?;
            let np = py.import("numpy")?;
            let dtype = dtype.cloned().unwrap_or_else(|| py.None().into_bound(py));
            let dt = match np.getattr("dtype")?.call1((&dtype,)) {
                Ok(dt) => dt,
                Err(e) => {
                    let err = invalid(format!(
                        "dtype {}: not a numpy data type ({})",
                        dtype.repr()?,
                        e.value(py)
                    ));
                    err.set_cause(py, Some(e));
                    return Err(err);
                }
            };
            if dt.getattr("hasobject")?.is_truthy()? {
                return Err(invalid(format!(
                    "dtype {}: holds Python object references, which cannot live in a usermm \
                 region; use a numeric, bool, bytes, str or structured dtype without objects",
                    dt.repr()?
                )));
            }
            // A subarray dtype such as ('f8', (2, 3)) adds its shape to the array's.
            let itemsize: usize = dt.getattr("itemsize")?.extract()?;
            let nbytes = args::nbytes(&dims, itemsize)?;
            let region = region_type(py)?.call1((slf, nbytes))?;
            let kw = PyDict::new(py);
            kw.set_item("shape", PyTuple::new(py, &dims)?)?;
            kw.set_item("dtype", dt)?;
            kw.set_item("buffer", region)?;
            kw.set_item("order", "C")?;
            np.getattr("ndarray")?.call((), Some(&kw))
        })
    }

    /// Maps `nbytes` bytes (an int or a size string such as "64M") of zero-filled memory as a
    /// `usermm.Region` (a writable buffer: memoryview(region), numpy.frombuffer(region, dtype),
    /// file.readinto(region)).
    fn map_anon<'py>(
        slf: &Bound<'py, Self>,
        nbytes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::errors::guard("Manager.map_anon", || {
            region_type(slf.py())?.call1((slf, nbytes))
        })
    }

    /// Maps a file through usermm's page cache as a `usermm.Region`: `nbytes` bytes from
    /// `offset` (None: the rest of the file), shared (stores reach the file after `flush` or
    /// `sync`) or private (copy-on-write). `numpy.frombuffer(region, dtype)` views it as an
    /// array. A mapping reaching past the end of the file is refused (an access there would
    /// raise SIGBUS and kill the interpreter), as are files that are not regular files on an
    /// ordinary filesystem (/proc, /sys, devices, pipes).
    #[pyo3(
        signature = (path, nbytes = None, offset = None, shared = true),
        text_signature = "($self, path, nbytes=None, offset=0, shared=True)"
    )]
    fn map_file<'py>(
        slf: &Bound<'py, Self>,
        path: std::path::PathBuf,
        nbytes: Option<&Bound<'py, PyAny>>,
        offset: Option<&Bound<'py, PyAny>>,
        shared: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::errors::guard("Manager.map_file", || {
            let py = slf.py();
            let kw = pyo3::types::PyDict::new(py);
            kw.set_item("path", path)?;
            kw.set_item("offset", offset)?;
            kw.set_item("shared", shared)?;
            let n = match nbytes {
                Some(n) => n.clone(),
                None => py.None().into_bound(py),
            };
            region_type(py)?.call((slf, n), Some(&kw))
        })
    }

    /// Writes back every dirty file page and fdatasyncs the files (sync(2)); raises the first
    /// writeback error not yet reported to this manager's syncs.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::guard("Manager.sync", || {
            let mm = self.mm().clone();
            py.detach(move || mm.sync()).map_err(mm_err)
        })
    }

    /// The counters, named as in /proc/vmstat (pgfault, pgmajfault, pswpin, pswpout,
    /// pgscan_kswapd, allocstall, nr_anon_pages, ...): a dict of name to int.
    fn vmstat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::errors::guard("Manager.vmstat", || {
            let d = PyDict::new(py);
            for (name, v) in self.mm().vmstat().iter() {
                d.set_item(name, v)?;
            }
            Ok(d)
        })
    }

    /// The memory budget in bytes.
    #[getter]
    fn budget(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.budget", || Ok(self.mm().budget()))
    }

    /// Bytes of memory (frames) in use now; at most the budget.
    #[getter]
    fn resident_bytes(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.resident_bytes", || Ok(self.mm().resident_bytes()))
    }

    /// The highest resident_bytes seen since the manager started.
    #[getter]
    fn peak_resident_bytes(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.peak_resident_bytes", || {
            Ok(self.mm().peak_resident_bytes())
        })
    }

    /// The swap device's capacity in bytes (0 without swap).
    #[getter]
    fn swap_bytes(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.swap_bytes", || Ok(self.mm().swap_bytes()))
    }

    /// A description of the swap device, e.g. "file:/tmp/usermm-swap-123 (O_DIRECT)" or "ram".
    #[getter]
    fn swap(&self) -> PyResult<String> {
        crate::errors::guard("Manager.swap", || Ok(self.mm().swap_name()))
    }

    /// The swap tiers, top first: a list of (description, counters dict), e.g. the zswap pool
    /// with zswpout, zswpin, zswpwb, zswap_pool_bytes, ..., then the device below it.
    fn swap_tiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::errors::guard("Manager.swap_tiers", || {
            let out = PyList::empty(py);
            for (tier, counters) in self.mm().swap_tiers() {
                let d = PyDict::new(py);
                for (n, v) in counters {
                    d.set_item(n, v)?;
                }
                out.append((tier, d))?;
            }
            Ok(out)
        })
    }

    /// Bytes committed by live regions (strict accounting counts every mapped byte).
    #[getter]
    fn committed_bytes(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.committed_bytes", || Ok(self.mm().commit().0))
    }

    /// The commit limit in bytes: budget + swap.
    #[getter]
    fn commit_limit_bytes(&self) -> PyResult<u64> {
        crate::errors::guard("Manager.commit_limit_bytes", || Ok(self.mm().commit().1))
    }

    /// Whether mapping beyond the commit limit is allowed.
    #[getter]
    fn overcommit(&self) -> PyResult<bool> {
        crate::errors::guard("Manager.overcommit", || Ok(self.mm().config().overcommit))
    }

    /// The seed switches and laptop_mode this manager runs with: a dict of name to value
    /// (each switch's descriptive value, see usermm.switches(); laptop_mode "on" or "off").
    /// Passing it back as Manager(settings=...) gives the same settings.
    #[getter]
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::errors::guard("Manager.settings", || {
            let s = &self.mm().config().settings;
            let d = PyDict::new(py);
            for (info, b) in s.iter() {
                d.set_item(
                    info.name,
                    match b {
                        Behaviour::Old => info.old,
                        Behaviour::New => info.new,
                    },
                )?;
            }
            d.set_item("laptop_mode", if s.laptop_mode { "on" } else { "off" })?;
            Ok(d)
        })
    }

    /// How userfaultfd was opened: "dev_userfaultfd" or "syscall_full" (full mode: system calls
    /// on swapped-out array memory fault it in), or "user_mode_only" (such calls fail with
    /// EFAULT; touch the memory first).
    #[getter]
    fn uffd_mode(&self) -> PyResult<&'static str> {
        crate::errors::guard("Manager.uffd_mode", || {
            Ok(match self.mm().uffd_info().origin {
                Origin::DevUserfaultfd => "dev_userfaultfd",
                Origin::SyscallFull => "syscall_full",
                Origin::SyscallUserModeOnly => "user_mode_only",
            })
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        crate::errors::guard("Manager.__repr__", || {
            Ok({
                let mm = self.mm();
                format!(
                    "<usermm.Manager budget={} swap={} resident={} peak={}>",
                    mm.budget(),
                    mm.swap_name(),
                    mm.resident_bytes(),
                    mm.peak_resident_bytes()
                )
            })
        })
    }
}

/// The default manager of this process. In a fork child the parent's is replaced on first use.
static DEFAULT: Mutex<Option<Py<Manager>>> = Mutex::new(None);

/// The default manager if this process made it.
fn current_default(py: Python<'_>) -> Option<Py<Manager>> {
    let g = DEFAULT
        .lock_py_attached(py)
        .unwrap_or_else(|e| e.into_inner());
    g.as_ref()
        .filter(|m| !fork::is_inherited(m.get().pid))
        .map(|m| m.clone_ref(py))
}

/// The process-wide default Manager, created on first use from the environment:
/// USERMM_BUDGET (default 256M), USERMM_SWAP (file, file:PATH, ram, none,
/// zswap+file, zswap+ram, ...; default file),
/// USERMM_SWAP_SIZE (default 4x the budget), USERMM_OVERCOMMIT (1/0), USERMM_SET (seed
/// switches, "name=value,..."). The same variables configure the C ABI's default manager and
/// `usermm run`. A bad variable raises InvalidArgumentError naming it (and the next call tries
/// again). A fork() child gets its own default manager. A swap file named by USERMM_SWAP that
/// another manager holds (another process given the same environment) is never shared: this
/// manager swaps to an unlinked temporary file and a UserWarning names the file.
#[pyfunction]
pub fn default(py: Python<'_>) -> PyResult<Py<Manager>> {
    crate::errors::guard("default", || {
        if let Some(m) = current_default(py) {
            return Ok(m);
        }
        // Made without the lock held (creation releases the GIL); if another thread won the race,
        // its manager is kept and this one dropped.
        // The one way every front end makes a process's default manager (Mm::from_env): a swap
        // file named by USERMM_SWAP=file:PATH that another manager holds (another process of the
        // same program, a multiprocessing worker) is not shared; this one swaps to a temporary
        // file, with a warning naming the file.
        let made = py.detach(Mm::from_env).map_err(mm_err)?;
        if let Some(note) = &made.swap_note {
            let warnings = py.import("warnings")?;
            warnings.call_method1("warn", (format!("usermm: {note}"),))?;
        }
        let made = Py::new(py, Manager::from_mm(made.mm, fork::pid()))?;
        let (result, replaced) = {
            let mut g = DEFAULT
                .lock_py_attached(py)
                .unwrap_or_else(|e| e.into_inner());
            match g.as_ref() {
                Some(m) if !fork::is_inherited(m.get().pid) => (m.clone_ref(py), Some(made)),
                _ => (made.clone_ref(py), g.replace(made)),
            }
        };
        drop(replaced); // the loser of a race, or the parent's (leaked by Manager's Drop)
        Ok(result)
    })
}

/// The switches: a list of dicts with name, seed (the commit in shared/seeds), old, new and
/// default (the descriptive values; "old" and "new" are accepted too; every switch defaults to
/// new except lru_gen) and what (one line). Besides these, settings take laptop_mode
/// ("on"/"off").
/// create_group(path, limit)
/// --
///
/// Creates a budget group file at `path` (mode 0600; it must not exist) holding `limit` (bytes
/// or a size string such as '256M') for every Manager made with `group=path`, in this process
/// or others: one budget for several managers, as a memory cgroup holds a process tree.
/// Remove the file when the group is done.
#[pyfunction]
pub fn create_group(path: std::path::PathBuf, limit: &Bound<'_, PyAny>) -> PyResult<()> {
    crate::errors::guard("create_group", || {
        let limit = args::size("limit", limit)?;
        usermm::MemCgroup::create(&path, limit)
            .map(drop)
            .map_err(mm_err)
    })
}

#[pyfunction]
pub fn switches(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    crate::errors::guard("switches", || {
        let l = PyList::empty(py);
        for i in usermm::settings::SWITCHES {
            let d = PyDict::new(py);
            d.set_item("name", i.name)?;
            d.set_item("seed", i.seed)?;
            d.set_item("old", i.old)?;
            d.set_item("new", i.new)?;
            let default = match i.default {
                usermm::Behaviour::Old => i.old,
                usermm::Behaviour::New => i.new,
            };
            d.set_item("default", default)?;
            d.set_item("what", i.what)?;
            l.append(d)?;
        }
        Ok(l)
    })
}
