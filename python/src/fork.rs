//! Safety across `fork()`. userfaultfd does not follow fork: usermm does not ask for
//! `UFFD_FEATURE_EVENT_FORK`. Three things go wrong without care:
//! - The parent's manager can stall for good. After `os.fork()` the parent's managed pages are
//!   shared copy-on-write, and `UFFDIO_MOVE` refuses pages that are not exclusive (EBUSY).
//!   Reclaim can then not unmap them, nor can the fault path move pooled pages back: an
//!   allocation waits forever. Reproduced: fill an array 4x the budget, `os.fork()`, the child
//!   exits at once, the parent's next pass over the array hangs.
//! - In the child, the copies of the regions are plain memory with no handler threads.
//!   Swapped-out pages would read as zeros.
//! - The child's userfaultfd is the parent's, so its ioctls act on the parent's address space.
//!   A child that drops a region would unregister the parent's region.
//!
//! So, before `os.fork()` (hook registered with `os.register_at_fork`), every
//! userfaultfd-registered mapping of the process gets `MADV_DONTFORK`: frame pools and region
//! views, found in /proc/self/smaps by their `um` VmFlag. The child then has no such mappings
//! (reading an inherited array crashes it with SIGSEGV, after a line on stderr saying why:
//! usermm-sys `forkguard`), and the parent's pages stay exclusive.
//! Every `Manager` and `Region` remembers the process that made it. In another process, mapping
//! or discarding through it raises `usermm.Error`, and dropping it leaks the child's copy instead
//! of touching the shared userfaultfd.
//!
//! Not covered: a `fork()` from C code that Python's hooks do not see (`subprocess` uses
//! vfork/posix_spawn and execs at once). The lasting fix is `MADV_DONTFORK` at map time in the
//! core (frame pool and region views); this hook is then redundant and harmless.

use pyo3::prelude::*;

use crate::errors::Error;

/// The current process id.
pub fn pid() -> u32 {
    std::process::id()
}

/// Whether an object made by process `owner` is a copy inherited through fork.
pub fn is_inherited(owner: u32) -> bool {
    owner != pid()
}

/// An error unless the object made by process `owner` may be used here.
pub fn check(owner: u32, what: &str) -> PyResult<()> {
    if is_inherited(owner) {
        return Err(Error::new_err(format!(
            "this {what} was created by process {owner} and cannot be used in process {} (a \
             fork() child): userfaultfd does not follow fork, so the child has no fault \
             handlers; create a new usermm.Manager in the child, or start workers with \
             multiprocessing's \"spawn\" or \"forkserver\" method",
            pid()
        )));
    }
    Ok(())
}

/// The userfaultfd-registered mappings of this process, as (start, end): the VMAs whose
/// smaps `VmFlags` include `um` (userfaultfd missing-mode tracking).
fn uffd_mappings() -> std::io::Result<Vec<(usize, usize)>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut out = Vec::new();
    let mut range = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == "um") {
                out.extend(range.take());
            }
            continue;
        }
        // A VMA header: "start-end perms offset dev inode [path]".
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                range = Some((lo, hi));
            }
        }
    }
    Ok(out)
}

/// `os.register_at_fork(before=...)` hook: keeps every userfaultfd-registered mapping out of
/// the child. Returns how many mappings it marked (for tests).
#[pyfunction]
fn _before_fork() -> PyResult<usize> {
    crate::errors::guard("_before_fork", || {
        let maps = uffd_mappings()
            .map_err(|e| Error::new_err(format!("reading /proc/self/smaps before fork: {e}")))?;
        for &(lo, hi) in &maps {
            // SAFETY: [lo, hi) is a whole mapping of this process (a VMA from smaps). MADV_DONTFORK
            // only stops the child from inheriting it; it changes neither contents, protection nor
            // addresses in this process, so nothing that points into it is affected.
            let rc =
                unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTFORK) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return Err(Error::new_err(format!(
                    "madvise(MADV_DONTFORK) on {lo:#x}-{hi:#x} before fork: {e}"
                )));
            }
        }
        Ok(maps.len())
    })
}

/// Registers the fork hook (and exposes it as `usermm._before_fork` for the tests).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(_before_fork, m)?;
    m.add_function(hook.clone())?;
    let kw = pyo3::types::PyDict::new(m.py());
    kw.set_item("before", hook)?;
    m.py()
        .import("os")?
        .getattr("register_at_fork")?
        .call((), Some(&kw))?;
    Ok(())
}
