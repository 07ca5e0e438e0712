//! usermm: Linux's memory-management subsystem rebuilt in user space on userfaultfd.
//!
//! An [`Mm`] owns a memory budget (frames), a swap device, fault handler threads and kswapd.
//! [`Mm::map_anon`] returns a [`Region`] of any size; the manager keeps the resident set within
//! the budget by reclaiming pages to swap with Linux's LRU and watermark design, and faults them
//! back in. See ARCHITECTURE.md for the whole picture.

#[cfg(not(loom))]
pub mod error;
pub mod mm;
pub mod settings;
#[cfg(not(loom))]
pub mod swap;
pub mod sync;
#[cfg(not(loom))]
pub mod sys;
pub mod vmstat;

#[cfg(not(loom))]
pub use error::{Error, Result};
#[cfg(not(loom))]
pub use mm::file::{CachedFile, MapKind};
#[cfg(not(loom))]
pub use mm::handler::StuckFault;
#[cfg(not(loom))]
pub use mm::region::Region;
#[cfg(not(loom))]
pub use mm::{Health, Mm, MmConfig, UffdInfo, Watermarks};
pub use settings::{Behaviour, Settings, Switch};
#[cfg(not(loom))]
pub use swap::{SwapConfig, SwapDevice};
pub use vmstat::Vmstat;

#[cfg(not(loom))]
/// Parses a size such as `4096`, `64k`, `256M`, `1.5G` or `2T` (binary units, case-insensitive,
/// optional trailing `B`/`iB`).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let err = || {
        Error::inval(format!(
            "cannot parse size {s:?}: use a number with an optional k, M, G or T suffix, e.g. 256M"
        ))
    };
    if t.is_empty() {
        return Err(err());
    }
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        Some(c) if c.is_ascii_digit() => (body, 1),
        _ => return Err(err()),
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 || v * mult as f64 > u64::MAX as f64 {
        return Err(err());
    }
    Ok((v * mult as f64) as u64)
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
    }
}
