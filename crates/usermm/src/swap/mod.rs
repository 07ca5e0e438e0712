//! Swap devices and swap slot allocation. Mirrors `mm/swapfile.c` (swap_info, cluster-based slot
//! allocation, swap_map counts) and `mm/page_io.c` (swap_writepage / swap_read_folio).
//!
//! A [`SwapDevice`] stores page-sized slots; [`SwapSlots`] hands slots out in clusters so that a
//! batch of pages reclaimed together lands in consecutive slots (sequential device writes). Every
//! backend passes the shared conformance test in `conformance.rs`.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::sys::Mapping;

mod conformance;
pub mod faulty;
pub mod file;
pub mod ram;
mod slots;

pub use faulty::FaultySwap;
pub use file::FileSwap;
pub use ram::RamSwap;
pub use slots::{SwapSlots, SWAPFILE_CLUSTER};

/// A page-granular swap device. Slot `s` covers bytes `[s*4096, (s+1)*4096)` of the device.
///
/// Pages are named by offsets into a [`Mapping`] (the memory manager's frame pool), never by
/// slices, because that memory is managed: the caller guarantees the pages are stable for the
/// duration of the call (they are locked, under writeback, or not yet visible).
pub trait SwapDevice: Send + Sync + 'static {
    /// Short description, e.g. `file:/tmp/usermm-swap-123 (O_DIRECT)` or `ram`.
    fn name(&self) -> String;
    /// Capacity in pages.
    fn nr_pages(&self) -> u64;
    /// Writes the pages at `pool` offsets `pages[i]` to slots `slot + i` (consecutive slots).
    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()>;
    /// Reads slots `slot + i` into the pages at `pool` offsets `pages[i]`.
    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()>;
    /// The slots `[slot, slot+n)` no longer hold data; a device may release their space.
    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        let _ = (slot, n);
        Ok(())
    }
}

/// Which swap device a memory manager uses.
#[derive(Clone)]
pub enum SwapConfig {
    /// A file: `path: None` creates an unlinked temporary file (mode 0600) in $TMPDIR.
    File { path: Option<PathBuf>, size: u64 },
    /// RAM allocated on demand, freed when slots are freed (like a RAM disk).
    Ram { size: u64 },
    /// No swap: reclaim can only drop clean pages; anonymous memory beyond the budget fails.
    None,
    /// A device the caller built (for tests: a [`FaultySwap`]).
    Device(Arc<dyn SwapDevice>),
}

impl std::fmt::Debug for SwapConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwapConfig::File { path, size } => write!(f, "File {{ path: {path:?}, size: {size} }}"),
            SwapConfig::Ram { size } => write!(f, "Ram {{ size: {size} }}"),
            SwapConfig::None => write!(f, "None"),
            SwapConfig::Device(d) => write!(f, "Device({})", d.name()),
        }
    }
}

impl SwapConfig {
    /// Parses a device name as the CLI and the environment give it: `file` (an unlinked
    /// temporary file), `file:PATH`, `ram` or `none`, with the capacity `size` in bytes.
    pub fn parse(spec: &str, size: u64) -> crate::Result<SwapConfig> {
        match spec.trim() {
            "file" => Ok(SwapConfig::File { path: None, size }),
            "ram" => Ok(SwapConfig::Ram { size }),
            "none" => Ok(SwapConfig::None),
            s if s.starts_with("file:") && s.len() > 5 => Ok(SwapConfig::File {
                path: Some(s[5..].into()),
                size,
            }),
            other => Err(crate::Error::inval(format!(
                "unknown swap device {other:?}: use file, file:PATH, ram or none"
            ))),
        }
    }

    /// Opens the device this configuration names (None for [`SwapConfig::None`]).
    pub fn open(&self) -> io::Result<Option<Arc<dyn SwapDevice>>> {
        Ok(match self {
            SwapConfig::File { path, size } => {
                Some(Arc::new(FileSwap::open(path.as_deref(), *size)?))
            }
            SwapConfig::Ram { size } => Some(Arc::new(RamSwap::new(*size)?)),
            SwapConfig::None => None,
            SwapConfig::Device(d) => Some(d.clone()),
        })
    }
}
