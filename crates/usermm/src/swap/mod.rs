//! Swap devices and swap slot allocation. Mirrors `mm/swapfile.c` (swap_info, cluster-based slot
//! allocation, swap_map counts) and `mm/page_io.c` (swap_writepage / swap_read_folio).
//!
//! A [`SwapDevice`] stores page-sized slots; [`SwapSlots`] hands slots out in clusters so that a
//! batch of pages reclaimed together lands in consecutive slots (sequential device writes). Every
//! backend passes the shared conformance test in `conformance.rs`.
//!
//! Devices stack into tiers: a [`Zswap`] pool wraps any device (`zswap+file`, `zswap+ram`), the
//! way Linux's zswap sits in front of a swap device. [`SwapDevice::lower`] walks the chain and
//! [`SwapDevice::counters`] gives each tier's counters, which the manager's vmstat reports.

// Truncating casts are spelled out (conv::Narrow, conv::Saturate, try_from) in the core.
#![warn(clippy::cast_possible_truncation)]

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::sys::Mapping;

mod conformance;
pub mod crypt;
pub mod faulty;
pub mod file;
pub mod inherit;
pub mod ram;
pub mod redis;
mod slots;
pub mod zswap;

pub use faulty::FaultySwap;
pub use file::{FileSwap, FileSwapOptions};
pub use inherit::{InheritLink, InheritedSwap};
pub use ram::RamSwap;
pub use redis::{RedisConfig, RedisSwap, RedisTls};
pub use slots::{SwapSlots, SWAPFILE_CLUSTER};
pub use zswap::{Compressor, PoolLimit, Zswap, ZswapConfig};

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
    /// Reads several runs at once (a swap-in readahead window whose slots are not consecutive):
    /// each as [`SwapDevice::read_pages`] would, one result per run. A device that can have
    /// them all in flight together does so (the swap file through io_uring: a window of four
    /// runs costs one device round trip, not four); the default reads them in turn.
    fn read_runs(&self, runs: &[SlotRun<'_>], pool: &Mapping) -> Vec<io::Result<()>> {
        read_runs_in_turn(self, runs, pool)
    }
    /// The memory holding the slots' pages, slot `s` at `s * PAGE_SIZE`, for a device that
    /// keeps its pages uncompressed in this process's memory (the RAM device): a swap-in then
    /// copies each page straight from there into its place (`UFFDIO_COPY`, a slot's copy)
    /// instead of reading it into a bounce buffer first. A slot's page stays there, unchanged,
    /// while the slot is allocated (its caller holds the entry naming it). None (the default):
    /// pages are read with [`SwapDevice::read_pages`].
    fn pages_in_memory(&self) -> Option<&Mapping> {
        None
    }
    /// The slots `[slot, slot+n)` no longer hold data; a device may release their space.
    /// Called when a whole swap cluster (`[slot, slot+n)`) is free, before it can be allocated
    /// again (`discard_swap_cluster`).
    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        let _ = (slot, n);
        Ok(())
    }
    /// Whether this is a memory device, whose slots cost memory from their first write: the
    /// allocator then fills the holes of partially used clusters first (Linux's order for
    /// devices without discard) and hands wholly free clusters out again most recently freed
    /// first (LIFO) instead of Linux's FIFO `free_clusters` order, so the device reuses memory
    /// it holds (the RAM device's warm clusters, its freed slots) instead of faulting in and
    /// zeroing fresh pages, and holds about what is swapped out rather than growing to its
    /// size (slots.rs). A stacked tier answers for the device below it.
    fn reuse_freed_first(&self) -> bool {
        self.lower().is_some_and(|l| l.reuse_freed_first())
    }
    /// Slot `slot` was freed (`swap_free` -> `zswap_invalidate`): a tier that keeps per-slot
    /// data drops it now. Cheap; called for every freed slot, with locks of the caller held.
    fn invalidate(&self, slot: u64) {
        let _ = slot;
    }
    /// Periodic upkeep, from kswapd about every 200 ms while it sleeps: a device may give back
    /// memory it keeps for reuse that has gone unused for a while (the RAM device's freed
    /// slots). A stacked tier passes it down.
    fn trim(&self) {}
    /// This tier alone, without the tiers below it (for `usermm info`); [`SwapDevice::name`]
    /// describes the whole chain.
    fn tier(&self) -> String {
        self.name()
    }
    /// The device below this one, for stacked tiers.
    fn lower(&self) -> Option<&Arc<dyn SwapDevice>> {
        None
    }
    /// The largest swap-in readahead window this device wants, in pages, when it is larger
    /// than `page_cluster`'s (a block device's `read_ahead_kb`, `bdi->ra_pages`): a device
    /// whose every request pays a network round trip reads more per fault. None: the
    /// `page_cluster` window. A stacked tier answers for the device below it.
    fn ra_pages(&self) -> Option<u32> {
        self.lower().and_then(|l| l.ra_pages())
    }
    /// Whether a read waits for a device (a disk, the network) rather than copying from memory:
    /// a fault-serving thread that waits on one hands its reading of the userfaultfd to a
    /// standby thread (mm/handler.rs, `blocking_io`). A stacked tier answers for the device
    /// below it (its misses go there).
    fn blocks_on_read(&self) -> bool {
        self.lower().is_none_or(|l| l.blocks_on_read())
    }
    /// This tier's own counters, with Linux's names where Linux has them (`zswpout`, ...).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// How long this device may fail and still be expected back (a remote tier's failover):
    /// while its writes fail, a fault that needs a frame waits this long for reclaim to
    /// write pages out before it gives up (out of memory). Zero for local devices, whose
    /// write errors do not heal by waiting; a stacked tier reports the device below it.
    fn retry_window(&self) -> std::time::Duration {
        self.lower()
            .map_or(std::time::Duration::ZERO, |l| l.retry_window())
    }
}

/// One run of a [`SwapDevice::read_runs`] batch: slots `slot + i` into the pages at pool
/// offsets `pages[i]`.
#[derive(Debug, Clone, Copy)]
pub struct SlotRun<'a> {
    pub slot: u64,
    pub pages: &'a [usize],
}

/// [`SwapDevice::read_runs`] one run after another with `read_pages` (the default, and a
/// device's fallback where it cannot batch).
pub fn read_runs_in_turn<D: SwapDevice + ?Sized>(
    dev: &D,
    runs: &[SlotRun<'_>],
    pool: &Mapping,
) -> Vec<io::Result<()>> {
    runs.iter()
        .map(|r| dev.read_pages(r.slot, pool, r.pages))
        .collect()
}

/// The tiers of `dev`, top first: each tier's own description and counters.
pub fn tiers(dev: &Arc<dyn SwapDevice>) -> Vec<(String, Vec<(&'static str, u64)>)> {
    let mut out = Vec::new();
    let mut d = Some(dev);
    while let Some(t) = d {
        out.push((t.tier(), t.counters()));
        d = t.lower();
    }
    out
}

/// Which swap device a memory manager uses.
#[derive(Clone)]
pub enum SwapConfig {
    /// A file: `path: None` creates an unlinked temporary file (mode 0600) in $TMPDIR.
    File { path: Option<PathBuf>, size: u64 },
    /// RAM allocated on demand, freed when slots are freed (like a RAM disk).
    Ram { size: u64 },
    /// A compressed pool (zswap) in front of the `lower` device.
    Zswap {
        zswap: ZswapConfig,
        lower: Box<SwapConfig>,
    },
    /// A Redis Cluster (`redis://[user@]host:port[,host:port...]`; `rediss://` for TLS).
    Redis(RedisConfig),
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
            SwapConfig::Zswap { zswap, lower } => {
                write!(f, "Zswap {{ {}, lower: {lower:?} }}", zswap.options())
            }
            SwapConfig::Redis(r) => write!(f, "Redis {{ {}, size: {} }}", r.spec(), r.size),
            SwapConfig::None => write!(f, "None"),
            SwapConfig::Device(d) => write!(f, "Device({})", d.name()),
        }
    }
}

/// What `SwapConfig::parse` accepts, for error messages.
pub(crate) const SPEC_HELP: &str =
    "use file, file:PATH, ram, none, redis://[USER@]HOST:PORT[,HOST:PORT...] \
     (rediss://... for TLS), or zswap[:OPTIONS]+DEVICE (zswap+file, zswap+ram, zswap+redis://..., \
     zswap:zstd,pool=25%+file:PATH; options lz4, zstd, zstd=LEVEL, pool=SIZE, pool=N%)";

impl SwapConfig {
    /// Parses a device name as the CLI and the environment give it, with the capacity `size` in
    /// bytes: `file` (an unlinked temporary file), `file:PATH`, `ram`, `none`, or a compressed
    /// tier in front of one of those: `zswap+file` (also plain `zswap`), `zswap+ram`,
    /// `zswap:OPTIONS+DEVICE`, `redis://[USER@]HOST:PORT[,HOST:PORT...]` (a Redis Cluster;
    /// `rediss://` for TLS), with
    /// options `lz4` (default), `zstd`, `zstd=LEVEL`, `pool=SIZE`, `pool=N%` (default 20% of the
    /// budget).
    pub fn parse(spec: &str, size: u64) -> crate::Result<SwapConfig> {
        Self::parse_inner(spec.trim(), size).map_err(|e| {
            let spec = spec.trim().to_owned();
            crate::Error::from(if e.is_empty() {
                crate::SwapError::UnknownDevice { spec }
            } else {
                crate::SwapError::Spec { spec, reason: e }
            })
        })
    }

    /// Err("") means "not a device name at all".
    fn parse_inner(s: &str, size: u64) -> Result<SwapConfig, String> {
        match s {
            "file" => return Ok(SwapConfig::File { path: None, size }),
            "ram" => return Ok(SwapConfig::Ram { size }),
            "none" => return Ok(SwapConfig::None),
            _ => {}
        }
        if s.starts_with("redis://") || s.starts_with("rediss://") {
            return RedisConfig::parse(s, size).map(SwapConfig::Redis);
        }
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                return Err("file: needs a path (or use plain file for a temporary file)".into());
            }
            return Ok(SwapConfig::File {
                path: Some(p.into()),
                size,
            });
        }
        if s == "zswap" || s.starts_with("zswap:") || s.starts_with("zswap+") {
            let rest = &s[5..];
            // `zswap` alone is zswap over a swap file, as the kernel's zswap is.
            let Some(plus) = rest.find('+') else {
                let opts = rest.strip_prefix(':').unwrap_or(rest);
                return Ok(SwapConfig::Zswap {
                    zswap: ZswapConfig::parse_options(opts)?,
                    lower: Box::new(SwapConfig::File { path: None, size }),
                });
            };
            let opts = rest[..plus].strip_prefix(':').unwrap_or(&rest[..plus]);
            if plus > 0 && !rest.starts_with(':') {
                return Err(String::new());
            }
            let zswap = ZswapConfig::parse_options(opts)?;
            let lower_spec = rest[plus + 1..].trim();
            let lower = match Self::parse_inner(lower_spec, size) {
                Ok(SwapConfig::None) => {
                    return Err("zswap needs a device below it, not none".into())
                }
                Ok(SwapConfig::Zswap { .. }) => {
                    return Err("zswap cannot sit on another zswap".into())
                }
                Ok(l) => l,
                Err(e) if e.is_empty() => {
                    return Err(format!(
                        "unknown device {lower_spec:?} below zswap: {SPEC_HELP}"
                    ))
                }
                Err(e) => return Err(e),
            };
            return Ok(SwapConfig::Zswap {
                zswap,
                lower: Box::new(lower),
            });
        }
        Err(String::new())
    }

    /// The spec [`SwapConfig::parse`] reads back into this configuration (None for a
    /// caller-built device).
    pub fn spec(&self) -> Option<String> {
        Some(match self {
            SwapConfig::File { path: None, .. } => "file".into(),
            SwapConfig::File { path: Some(p), .. } => format!("file:{}", p.display()),
            SwapConfig::Ram { .. } => "ram".into(),
            SwapConfig::Zswap { zswap, lower } => {
                format!("zswap:{}+{}", zswap.options(), lower.spec()?)
            }
            SwapConfig::Redis(r) => r.spec(),
            SwapConfig::None => "none".into(),
            SwapConfig::Device(_) => return None,
        })
    }

    /// The swap file path this configuration names, in any tier (None for a temporary file).
    pub fn file_path(&self) -> Option<&std::path::Path> {
        match self {
            SwapConfig::File { path, .. } => path.as_deref(),
            SwapConfig::Zswap { lower, .. } => lower.file_path(),
            _ => None,
        }
    }

    /// This configuration with a named swap file replaced by an unlinked temporary file of the
    /// same size (for a process that finds the named file claimed by another manager).
    pub fn without_file_path(&self) -> SwapConfig {
        match self {
            SwapConfig::File { size, .. } => SwapConfig::File {
                path: None,
                size: *size,
            },
            SwapConfig::Zswap { zswap, lower } => SwapConfig::Zswap {
                zswap: *zswap,
                lower: Box::new(lower.without_file_path()),
            },
            other => other.clone(),
        }
    }

    /// The swap capacity in bytes this configuration asks for (0 for none or a caller-built
    /// device).
    /// The same device `extra` bytes larger (a fork child's device, with room for the slots it
    /// shares with its parent: `swap/inherit.rs`). None for no swap and a prebuilt device,
    /// which cannot grow.
    pub fn grown(&self, extra: u64) -> Option<SwapConfig> {
        Some(match self {
            SwapConfig::File { path, size } => SwapConfig::File {
                path: path.clone(),
                size: size.checked_add(extra)?,
            },
            SwapConfig::Ram { size } => SwapConfig::Ram {
                size: size.checked_add(extra)?,
            },
            SwapConfig::Zswap { zswap, lower } => SwapConfig::Zswap {
                zswap: *zswap,
                lower: Box::new(lower.grown(extra)?),
            },
            SwapConfig::Redis(r) => {
                let mut r = r.clone();
                r.size = r.size.checked_add(extra)?;
                SwapConfig::Redis(r)
            }
            SwapConfig::None | SwapConfig::Device(_) => return None,
        })
    }

    pub fn size(&self) -> u64 {
        match self {
            SwapConfig::File { size, .. } | SwapConfig::Ram { size } => *size,
            SwapConfig::Zswap { lower, .. } => lower.size(),
            SwapConfig::Redis(r) => r.size,
            SwapConfig::None | SwapConfig::Device(_) => 0,
        }
    }

    /// Opens the device this configuration names (None for [`SwapConfig::None`]), sizing a
    /// zswap pool given as a percentage against the default budget of 256 MiB; the memory
    /// manager uses [`SwapConfig::open_for_budget`].
    pub fn open(&self) -> io::Result<Option<Arc<dyn SwapDevice>>> {
        self.open_for_budget(256 << 20, FileSwapOptions::default())
    }

    /// Opens the device for a manager with a budget of `budget` bytes; a swap file, alone or
    /// below zswap, gets the file options (encryption, keeping a named file, sparse).
    pub fn open_for_budget(
        &self,
        budget: u64,
        file: FileSwapOptions,
    ) -> io::Result<Option<Arc<dyn SwapDevice>>> {
        Ok(match self {
            SwapConfig::File { path, size } => {
                Some(Arc::new(FileSwap::open_with(path.as_deref(), *size, file)?))
            }
            SwapConfig::Ram { size } => Some(Arc::new(RamSwap::new(*size)?)),
            SwapConfig::Zswap { zswap, lower } => {
                let Some(lower) = lower.open_for_budget(budget, file)? else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "zswap needs a device below it, not none",
                    ));
                };
                Some(Arc::new(Zswap::new(
                    lower,
                    zswap.compressor,
                    zswap.max_pool.bytes(budget),
                )))
            }
            SwapConfig::Redis(r) => {
                // Encryption at rest covers the remote tier too.
                let mut r = r.clone();
                r.encrypt |= file.encrypt;
                Some(Arc::new(RedisSwap::open(&r)?))
            }
            SwapConfig::None => None,
            SwapConfig::Device(d) => Some(d.clone()),
        })
    }

    /// Sets the replicas a Redis tier waits for on every write (`WAIT N`); false if the
    /// configuration has no Redis tier.
    pub fn set_sync_replicas(&mut self, n: u32) -> bool {
        match self.redis_mut() {
            Some(r) => {
                r.sync_replicas = n;
                true
            }
            None => false,
        }
    }

    /// The Redis tier of the chain (alone or below zswap), if it has one.
    pub fn redis_mut(&mut self) -> Option<&mut RedisConfig> {
        match self {
            SwapConfig::Redis(r) => Some(r),
            SwapConfig::Zswap { lower, .. } => lower.redis_mut(),
            _ => None,
        }
    }
}

/// The most a default swap file holds: [`default_file_size`] never exceeds it.
pub const DEFAULT_FILE_CAP: u64 = 64 << 30;

/// The directory a swap file of `path` (None: an unlinked file in `$TMPDIR`) is created in.
pub fn file_dir(path: Option<&std::path::Path>) -> std::path::PathBuf {
    match path {
        None => std::env::temp_dir(),
        Some(p) => match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        },
    }
}

/// The size of a default (sparse) swap file in `dir`, like a memory cgroup whose swap is
/// bounded by the device rather than by a multiple of its limit: half the space available on
/// the filesystem, at most [`DEFAULT_FILE_CAP`], whole pages. An error if `dir` cannot be
/// examined (it does not exist), naming it.
pub fn default_file_size(dir: &std::path::Path) -> crate::Result<u64> {
    let avail = crate::sys::fs_available_bytes(dir).map_err(|source| {
        crate::Error::from(crate::SwapError::Directory {
            dir: dir.to_path_buf(),
            source,
        })
    })?;
    let page = crate::sys::PAGE_SIZE as u64;
    Ok((avail / 2).min(DEFAULT_FILE_CAP) / page * page)
}
