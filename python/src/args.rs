//! Conversion of Python arguments: sizes (`"256M"` or an int of bytes), swap devices, the seed
//! switches (a `"name=value,..."` string or a dict) and array shapes. Every error is an
//! `InvalidArgumentError` naming the parameter, the value and what to give instead.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use usermm::{Settings, SwapConfig};

use crate::errors::invalid;

/// The message of a core `InvalidArgument` without the "invalid argument: " prefix, so that it
/// can be prefixed with the parameter's name.
fn core_msg(e: usermm::Error) -> String {
    match e {
        usermm::Error::InvalidArgument(m) => m.to_string(),
        other => other.to_string(),
    }
}

/// A size: a string such as `"256M"`, `"1.5G"` or `"4096"` (binary units), or an int of bytes.
pub fn size(name: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    let kind = || {
        v.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    };
    if v.is_instance_of::<PyBool>() {
        return Err(invalid(format!(
            "{name}={v}: give a size such as \"256M\" or a number of bytes"
        )));
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_cow()?;
        return usermm::parse_size(&s).map_err(|e| invalid(format!("{name}: {}", core_msg(e))));
    }
    if v.hasattr("__index__")? {
        return v.extract::<u64>().map_err(|_| {
            invalid(format!(
                "{name}={v}: a size must be between 0 and 2**64-1 bytes"
            ))
        });
    }
    Err(invalid(format!(
        "{name} must be a size such as \"256M\" or an int of bytes, not {}",
        kind()
    )))
}

/// A byte count or offset within the address space (`size` rules: an int or a size string).
pub fn length(name: &str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = size(name, v)?;
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| invalid(format!("{name}={n} is larger than the address space")))
}

/// The size of the file at `p`, if it is a regular file whose size is its contents (not on
/// procfs, sysfs or another pseudo filesystem, where sizes are 0 or 4096 whatever the file
/// holds, and mapping it would raise SIGBUS on the first read).
pub fn mappable_file_len(p: &std::path::Path) -> PyResult<u64> {
    let f = std::fs::File::open(p).map_err(|e| invalid(format!("path {}: {e}", p.display())))?;
    let md = f
        .metadata()
        .map_err(|e| invalid(format!("path {}: {e}", p.display())))?;
    if !md.is_file() {
        return Err(invalid(format!(
            "path {} is not a regular file (a directory, device, pipe or socket); map_file maps \
             regular files",
            p.display()
        )));
    }
    match usermm_sys::pseudo_fs(&f) {
        Ok(Some(fs)) => Err(invalid(format!(
            "path {} is on {fs}, whose files do not have the size they report; copy it to a \
             regular file first",
            p.display()
        ))),
        Ok(None) => Ok(md.len()),
        Err(e) => Err(invalid(format!("path {}: statfs: {e}", p.display()))),
    }
}

/// The swap device named `spec` (`file`, `file:PATH`, `ram` or `none`) of `size` bytes.
pub fn swap(spec: &str, size: u64) -> PyResult<SwapConfig> {
    SwapConfig::parse(spec, size).map_err(|e| invalid(format!("swap: {}", core_msg(e))))
}

/// Seed switches and laptop_mode: None (defaults), `"name=value,..."` as in `USERMM_SET`, or a
/// dict of name to value (str, or bool for laptop_mode).
pub fn settings(v: Option<&Bound<'_, PyAny>>) -> PyResult<Settings> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(Settings::default());
    };
    let wrap = |e: usermm::Error| invalid(format!("settings: {}", core_msg(e)));
    if let Ok(s) = v.cast::<PyString>() {
        return Settings::parse(&s.to_cow()?).map_err(wrap);
    }
    let Ok(d) = v.cast::<PyDict>() else {
        return Err(invalid(format!(
            "settings must be a \"name=value,...\" string or a dict, not {}",
            v.get_type().name()?
        )));
    };
    let mut s = Settings::default();
    for (k, val) in d.iter() {
        let Ok(name) = k.cast::<PyString>() else {
            return Err(invalid(format!(
                "settings: key {} is not a string; keys are switch names (see usermm.switches()) or laptop_mode",
                k.repr()?
            )));
        };
        let value = if let Ok(b) = val.cast::<PyBool>() {
            if b.is_true() { "on" } else { "off" }.to_string()
        } else if let Ok(t) = val.cast::<PyString>() {
            t.to_cow()?.to_string()
        } else if val.hasattr("__index__")? {
            // Any int, however large: the switch names what it accepts.
            val.str()?.to_cow()?.to_string()
        } else {
            return Err(invalid(format!(
                "settings: {}={}: values are strings such as \"old\"/\"new\" (or True/False for laptop_mode)",
                name.to_cow()?,
                val.repr()?
            )));
        };
        s.set(&name.to_cow()?, &value).map_err(wrap)?;
    }
    Ok(s)
}

/// An array shape: an int or a sequence of ints, each >= 0.
pub fn shape(v: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let dims: Vec<i64> = if !v.is_instance_of::<PyBool>() && v.hasattr("__index__")? {
        vec![v
            .extract::<i64>()
            .map_err(|_| invalid(format!("shape {v}: dimension 0 does not fit in 64 bits")))?]
    } else if let Ok(it) = v.try_iter() {
        let mut dims = Vec::new();
        for (i, d) in it.enumerate() {
            let d = d?;
            if d.is_instance_of::<PyBool>() || !d.hasattr("__index__")? {
                return Err(invalid(format!(
                    "shape {}: dimension {i} is {} ({}); dimensions must be ints",
                    v.repr()?,
                    d.repr()?,
                    d.get_type().name()?
                )));
            }
            dims.push(d.extract::<i64>().map_err(|_| {
                invalid(format!("shape {v}: dimension {i} does not fit in 64 bits"))
            })?);
        }
        dims
    } else {
        return Err(invalid(format!(
            "shape must be an int or a sequence of ints, not {}",
            v.get_type().name()?
        )));
    };
    dims.iter()
        .enumerate()
        .map(|(i, &d)| {
            usize::try_from(d).map_err(|_| {
                invalid(format!(
                    "shape {:?}: dimension {i} is {d}; dimensions must be >= 0",
                    dims
                ))
            })
        })
        .collect()
}

/// The bytes an array of `dims` elements of `itemsize` bytes needs, if it is below numpy's
/// limit (the largest `isize`).
pub fn nbytes(dims: &[usize], itemsize: usize) -> PyResult<usize> {
    dims.iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            invalid(format!(
                "shape {dims:?} with {itemsize}-byte items is larger than the address space"
            ))
        })
}

/// Parses a size such as "4096", "64k", "256M", "1.5G" or "2T" (binary units, case-insensitive,
/// optional trailing B/iB) into bytes, as the budget and swap_size arguments do.
#[pyfunction]
pub fn parse_size(s: &str) -> PyResult<u64> {
    crate::errors::guard("parse_size", || {
        usermm::parse_size(s).map_err(crate::errors::mm_err)
    })
}
