//! usermm: Linux's memory-management subsystem rebuilt in user space on userfaultfd.
//!
//! An [`Mm`] owns a memory budget (frames), a swap device, fault handler threads and kswapd.
//! [`Mm::map_anon`] returns a [`Region`] of any size; the manager keeps the resident set within
//! the budget by reclaiming pages to swap with Linux's LRU and watermark design, and faults them
//! back in. See ARCHITECTURE.md for the whole picture.
//!
//! No `unsafe` here: every system call goes through the usermm-sys crate.

#![forbid(unsafe_code)]

pub(crate) mod conv;
#[cfg(not(loom))]
pub mod error;
// The manager's internals: crate-private, except to the model checker (loom) and to the
// integration tests that drive internals (the `testing` feature).
#[cfg(any(loom, feature = "testing"))]
pub mod mm;
#[cfg(not(any(loom, feature = "testing")))]
pub(crate) mod mm;
pub mod settings;
#[cfg(not(loom))]
pub mod swap;
// The sync shim: public to the model checker (loom) only.
#[cfg(loom)]
pub mod sync;
#[cfg(not(loom))]
pub(crate) mod sync;
// The OS layer is its own crate (usermm-sys, the workspace's unsafe code); the core reaches it
// as `crate::sys` and does not re-export it.
#[cfg(not(loom))]
pub(crate) use usermm_sys as sys;
pub mod vmstat;

#[cfg(not(loom))]
pub use error::{
    ConfigError, Error, FileError, InvalidArgument, RegionError, Result, SwapError, UffdError,
};
#[cfg(not(loom))]
pub use mm::file::CachedFile;
#[cfg(not(loom))]
pub use mm::handler::StuckFault;
#[cfg(not(loom))]
pub use mm::memcontrol::{GroupStat, MemCgroup, MemberStat};
#[cfg(not(loom))]
pub use mm::region::{AccessPattern, MapKind, Region};
#[cfg(not(loom))]
pub use mm::{
    EnvManager, Health, Mm, MmConfig, UffdInfo, Watermarks, DEFAULT_BUDGET, MAX_HANDLER_THREADS,
    MIN_BUDGET,
};
pub use settings::{Behaviour, Settings, Switch};
#[cfg(not(loom))]
pub use swap::{SwapConfig, SwapDevice};
/// How the manager opens userfaultfd ([`MmConfig::uffd_policy`]) and how it was opened
/// ([`UffdInfo::origin`]): the OS layer's types, named here so the API is usable without it.
#[cfg(not(loom))]
pub use sys::uffd::{OpenPolicy, Origin};
pub use vmstat::Vmstat;

#[cfg(not(loom))]
/// Parses a size such as `4096`, `64k`, `256M`, `1.5G` or `2T` (binary units, case-insensitive,
/// optional trailing `B`/`iB`). Whole numbers are exact up to 2^64-1 bytes; a fraction is
/// rounded down to a whole byte. Anything else (empty, negative, an exponent, `inf`, an
/// unknown suffix, more than 2^64-1 bytes) is an error naming the value.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let err = || Error::from(error::ConfigError::Size { value: s.into() });
    let too_big = || Error::from(error::ConfigError::SizeTooLarge { value: s.into() });
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        Some(c) if c.is_ascii_digit() || c == '.' => (body, 1),
        _ => return Err(err()),
    };
    let num = num.trim();
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return Err(err());
    }
    // The whole part exactly (no float rounding of large byte counts)...
    let whole = if int.is_empty() {
        0
    } else {
        int.parse::<u64>().map_err(|_| too_big())?
    };
    let mut bytes = whole.checked_mul(mult).ok_or_else(too_big)?;
    // ...plus the fraction of the unit, rounded down to a byte.
    if !frac.is_empty() && mult > 1 {
        let f: f64 = format!("0.{frac}").parse().map_err(|_| err())?;
        bytes = bytes
            .checked_add((f * mult as f64) as u64)
            .ok_or_else(too_big)?;
    }
    Ok(bytes)
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("4096").unwrap(), 4096);
        assert_eq!(super::parse_size("64k").unwrap(), 65536);
        assert_eq!(super::parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(super::parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(super::parse_size("2GiB").unwrap(), 2 << 30);
        let e = super::parse_size("256Q").unwrap_err().to_string();
        assert!(e.contains("256Q") && e.contains("suffix"), "{e}");
        assert!(super::parse_size("").is_err());
        assert!(super::parse_size("-1").is_err());
        assert_eq!(
            super::parse_size("9007199254740993").unwrap(),
            9007199254740993,
            "exact above 2^53"
        );
        assert_eq!(super::parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(super::parse_size("18446744073709551616").is_err());
        assert!(super::parse_size("16777216T").is_err());
        assert_eq!(super::parse_size("16777215T").unwrap(), 16777215 << 40);
        assert_eq!(super::parse_size(".5k").unwrap(), 512);
        for bad in [
            "1e3", "inf", "nan", "+5", "1.2.3", ".", "k", "b", "5x", "1,5G",
        ] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
    }
}
