//! The `usermm` Python extension module: a [`Manager`](manager::Manager) owning a usermm
//! memory manager, numpy arrays whose memory is a usermm region, the counters, the seed
//! switches, the process-wide default manager and the exception classes.
//!
//! Built by maturin as one abi3 wheel for CPython >= 3.9 (pyproject.toml). The `unsafe` code
//! is the buffer-protocol export in `region.rs` and the fork hook's `madvise` in `fork.rs`.

use pyo3::prelude::*;

mod args;
mod errors;
mod fork;
mod manager;
mod region;

/// usermm: numpy arrays larger than memory, paged by Linux's mm rebuilt in user space.
///
/// A Manager owns a memory budget, a swap device (a file or RAM), fault handler threads and
/// kswapd. Manager.array(shape, dtype) returns a writable numpy array of any size whose memory
/// the manager keeps within the budget by swapping pages out and faulting them back in.
#[pymodule]
#[pyo3(name = "usermm")]
fn usermm_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<manager::Manager>()?;
    m.add("Region", region::region_type(py)?)?;
    m.add_function(wrap_pyfunction!(manager::default, m)?)?;
    m.add_function(wrap_pyfunction!(manager::switches, m)?)?;
    m.add_function(wrap_pyfunction!(manager::create_group, m)?)?;
    m.add_function(wrap_pyfunction!(args::parse_size, m)?)?;
    errors::add_to_module(m)?;
    fork::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "__all__",
        [
            "Manager",
            "Region",
            "default",
            "switches",
            "create_group",
            "parse_size",
            "Error",
            "InvalidArgumentError",
            "CommitLimitError",
            "UserfaultfdError",
            "IoError",
            "InternalError",
        ],
    )?;
    Ok(())
}
