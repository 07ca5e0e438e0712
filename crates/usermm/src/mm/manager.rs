//! The manager proper: `Mm`, its settings, shared state and threads (see `mm/mod.rs`).

use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{ConfigError, Error, Result, SwapError, UffdError};
use crate::settings::Settings;
use crate::swap::SwapConfig;

/// Budget used when `USERMM_BUDGET` is not set.
pub const DEFAULT_BUDGET: u64 = 256 << 20;
use crate::sync::{Arc, Mutex, Ordering};
use crate::sys::uffd::{self, EventFd, OpenPolicy, Uffd};
use crate::sys::{Advice, Mapping, PAGE_SIZE};
use crate::vmstat::{Counters, Item, Vmstat};

use super::handler::HandlerState;
use super::mmzone::{Node, Watermarks};
use super::page::{Owner, Pfn, PgOff};
use super::pool::FramePool;
use super::region::{MmStruct, Region};
use super::swap_state::SwapState;
use super::{handler, vmscan};
use crate::conv::{Narrow, Saturate};

/// Smallest budget accepted: 1 MiB (256 frames), enough for the watermarks and one fault batch.
pub const MIN_BUDGET: u64 = 1 << 20;

/// Most fault handler threads one manager starts. All of them read one userfaultfd, so more
/// only contend; each idle one spins for `handler_spin_us` before it sleeps.
pub const MAX_HANDLER_THREADS: usize = 256;

/// Settings of one memory manager.
#[derive(Debug, Clone)]
pub struct MmConfig {
    /// Memory budget in bytes: the most resident memory the manager holds (frames).
    pub budget: u64,
    /// The swap device.
    pub swap: SwapConfig,
    /// Allow mapping more than budget + swap. Accesses that then find swap full are poisoned
    /// (SIGBUS), counted as `oom_poison` and logged.
    pub overcommit: bool,
    /// Fault handler threads; 0 = one per CPU.
    pub handler_threads: usize,
    /// Watermarks in pages; None = scaled like Linux.
    pub watermarks: Option<Watermarks>,
    /// log2 of the largest swap readahead window (`vm.page-cluster`; default 8, 256 pages:
    /// Linux's 3 is for disks that seek, and on this VM's disk, RAM and Redis the larger window
    /// was faster for every real program measured, see ARCHITECTURE.md). At most an eighth of
    /// the budget's frames is read per fault.
    pub page_cluster: u32,
    /// Largest batch of fresh pages mapped by one write fault in a sequential run (pages).
    pub fault_around_max: u32,
    /// How long an idle handler spins polling before it sleeps (microseconds).
    pub handler_spin_us: u32,
    /// Which userfaultfd opening paths to try.
    pub uffd_policy: OpenPolicy,
    /// The seed switches and laptop mode.
    pub settings: Settings,
    /// `vm.dirty_background_ratio`: percent of dirtyable memory (free + file pages) above which
    /// the flushers write in the background.
    pub dirty_background_ratio: u32,
    /// `vm.dirty_ratio`: percent of dirtyable memory above which writers are throttled.
    pub dirty_ratio: u32,
    /// `vm.dirty_expire_centisecs`: dirty data older than this is written by the periodic flush.
    pub dirty_expire_centisecs: u32,
    /// `vm.dirty_writeback_centisecs`: the flushers' period.
    pub dirty_writeback_centisecs: u32,
    /// `vm.swappiness` (0-200): anon vs file scan balance.
    pub swappiness: u32,
    /// Largest file readahead window in KiB (`read_ahead_kb`), also the read-around of a file
    /// region's major fault. Default 1024: Linux's 128 KiB with a kernel fault costing 2 us
    /// becomes larger where a fault costs a handler round trip (10-20 us), and a mapped file
    /// read in sequence keeps up to eight windows in flight: 1 MiB windows read 2 GiB at
    /// 1.7-2.0 GiB/s here, 512 KiB ones at 1.4-1.7.
    pub read_ahead_kb: u32,
    /// Anonymous regions fault in 2 MiB units where aligned, and untouched units read the huge
    /// zero page (`transparent_hugepage=always`; false = `never`).
    pub thp: bool,
    /// Encrypt the pages the file and Redis swap tiers store (ChaCha20-Poly1305, a random key
    /// held only in memory): swapped-out memory is unreadable on disk and in the cluster
    /// (`--swap-encrypt`, `USERMM_SWAP_ENCRYPT=1`). zswap's pool is process memory, not at
    /// rest; the tier below it is encrypted.
    pub swap_encrypt: bool,
    /// Keep a named swap file (`file:PATH`) when the manager goes; by default it is truncated
    /// and removed, so process memory does not outlive the process on disk (`--swap-keep`,
    /// `USERMM_SWAP_KEEP=1`).
    pub swap_keep: bool,
    /// A swap file is left sparse (blocks allocated as pages are first swapped out) instead of
    /// preallocated; set by [`MmConfig::from_env`] for its default swap file.
    pub swap_sparse: bool,
    /// A budget shared with other processes: the path of a budget-group file (`usermm run`
    /// creates one per run and names it in `USERMM_GROUP`, so a whole process tree is held to
    /// one budget as a memory cgroup holds it). Every frame this manager uses is charged to the
    /// group, and it reclaims when the group nears its limit (memcontrol.rs). None: the budget
    /// is this manager's alone.
    pub group: Option<std::path::PathBuf>,
    /// A fork child's link to the parent whose swapped pages it shares (mm/fork.rs,
    /// swap/inherit.rs): the swap device is opened that many pages larger and its last
    /// slots stand for the shared ones. None: a manager of its own.
    pub inherit: Option<Arc<crate::swap::InheritLink>>,
}

impl MmConfig {
    /// A budget of `budget` bytes with the default swap device (an unlinked temporary file of
    /// 4x the budget).
    pub fn new(budget: u64) -> MmConfig {
        MmConfig {
            budget,
            swap: SwapConfig::File {
                path: None,
                size: budget.saturating_mul(4),
            },
            overcommit: false,
            handler_threads: 0,
            watermarks: None,
            page_cluster: 8,
            fault_around_max: 128,
            handler_spin_us: 50,
            uffd_policy: OpenPolicy::Auto,
            settings: Settings::default(),
            dirty_background_ratio: 10,
            dirty_ratio: 20,
            dirty_expire_centisecs: 3000,
            dirty_writeback_centisecs: 500,
            swappiness: 60,
            read_ahead_kb: 1024,
            thp: false,
            swap_encrypt: false,
            swap_keep: false,
            swap_sparse: false,
            group: None,
            inherit: None,
        }
    }

    /// The configuration the environment describes, as used by the C ABI's default manager,
    /// Python's `usermm.default()` and `usermm run`: `USERMM_BUDGET` (default 256M),
    /// `USERMM_SWAP` (`file`, `file:PATH`, `ram` or `none`; default `file`), `USERMM_SWAP_SIZE`
    /// (default: a sparse file of half the free space of its filesystem, at most 64 GiB; RAM: 4x
    /// the budget), `USERMM_OVERCOMMIT`, `USERMM_SWAP_ENCRYPT` and `USERMM_SWAP_KEEP`
    /// (`1`/`0`), `USERMM_SET` (seed switches), `USERMM_GROUP` (a budget group file).
    /// Errors name the variable and what it should hold.
    pub fn from_env() -> Result<MmConfig> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let size_var = |name: &str, v: &str| crate::parse_size(v).map_err(|e| e.prefixed(name));
        let budget = match var("USERMM_BUDGET") {
            Some(v) => size_var("USERMM_BUDGET", &v)?,
            None => DEFAULT_BUDGET,
        };
        let spec = var("USERMM_SWAP").unwrap_or_else(|| "file".into());
        let swap = SwapConfig::parse(&spec, 0).map_err(|e| e.prefixed("USERMM_SWAP"))?;
        let (swap_size, sparse) = match var("USERMM_SWAP_SIZE") {
            Some(v) => (size_var("USERMM_SWAP_SIZE", &v)?, false),
            None => Self::default_swap_size(&swap, budget)?,
        };
        let swap = SwapConfig::parse(&spec, swap_size).map_err(|e| e.prefixed("USERMM_SWAP"))?;
        let flag = |name: &str| match var(name).as_deref().map(str::trim) {
            None | Some("0") | Some("off") | Some("false") | Some("no") => Ok(false),
            Some("1") | Some("on") | Some("true") | Some("yes") => Ok(true),
            Some(v) => Err(Error::from(ConfigError::Flag {
                var: name.into(),
                value: v.into(),
            })),
        };
        let overcommit = flag("USERMM_OVERCOMMIT")?;
        let mut cfg = MmConfig::new(budget).swap(swap).overcommit(overcommit);
        cfg.swap_encrypt = flag("USERMM_SWAP_ENCRYPT")?;
        cfg.swap_keep = flag("USERMM_SWAP_KEEP")?;
        cfg.swap_sparse = sparse;
        cfg.settings = Settings::from_env()?;
        cfg.group = var("USERMM_GROUP").map(std::path::PathBuf::from);
        Ok(cfg)
    }

    /// Checks every field against its range; the error names the field, the value and the
    /// range. [`Mm::new`] calls it; front ends call it to report a bad value before doing any
    /// work.
    pub fn validate(&self) -> Result<()> {
        if self.budget < MIN_BUDGET {
            return Err(ConfigError::BudgetTooSmall {
                budget: self.budget,
                min: MIN_BUDGET,
            }
            .into());
        }
        let nr_frames = self.budget / PAGE_SIZE as u64;
        if nr_frames >= u32::MAX as u64 {
            return Err(ConfigError::BudgetTooLarge {
                budget: self.budget,
            }
            .into());
        }
        if self.handler_threads > MAX_HANDLER_THREADS {
            return Err(ConfigError::HandlerThreads {
                threads: self.handler_threads,
                max: MAX_HANDLER_THREADS,
            }
            .into());
        }
        let range = |field: &'static str, value: u32, lo: u32, hi: u32, unit: &'static str| {
            if value < lo || value > hi {
                return Err(Error::from(ConfigError::OutOfRange {
                    field,
                    value,
                    lo,
                    hi,
                    unit,
                }));
            }
            Ok(())
        };
        range(
            "page_cluster",
            self.page_cluster,
            0,
            9,
            " (log2 pages; 9 is 2 MiB)",
        )?;
        range("fault_around_max", self.fault_around_max, 1, 512, " pages")?;
        range(
            "handler_spin_us",
            self.handler_spin_us,
            0,
            1_000_000,
            " microseconds",
        )?;
        range(
            "dirty_background_ratio",
            self.dirty_background_ratio,
            0,
            100,
            " percent",
        )?;
        range("dirty_ratio", self.dirty_ratio, 0, 100, " percent")?;
        range("swappiness", self.swappiness, 0, 200, "")?;
        range("read_ahead_kb", self.read_ahead_kb, 0, 1 << 20, " KiB")?;
        if let Some(w) = self.watermarks {
            if !(w.min <= w.low && w.low <= w.high && w.high < nr_frames / 2) {
                return Err(ConfigError::Watermarks {
                    min: w.min,
                    low: w.low,
                    high: w.high,
                    half: nr_frames / 2,
                }
                .into());
            }
        }
        Ok(())
    }

    /// The swap size [`MmConfig::from_env`] uses when `USERMM_SWAP_SIZE` is not set, and
    /// whether the device stays sparse: a swap file is sparse and sized by the free space of
    /// its filesystem ([`crate::swap::default_file_size`]: half of it, at most 64 GiB), so
    /// that, as in a memory cgroup with swap, ordinary programs are not refused for want of
    /// commit; RAM swap (reserved up front) is 4x the budget.
    pub fn default_swap_size(swap: &SwapConfig, budget: u64) -> Result<(u64, bool)> {
        match swap {
            SwapConfig::File { path, .. } => {
                let dir = crate::swap::file_dir(path.as_deref());
                Ok((crate::swap::default_file_size(&dir)?, true))
            }
            _ => Ok((budget.saturating_mul(4), false)),
        }
    }

    /// Replaces the seed switches and laptop mode.
    pub fn settings(mut self, s: Settings) -> Self {
        self.settings = s;
        self
    }
    pub fn swap(mut self, swap: SwapConfig) -> Self {
        self.swap = swap;
        self
    }
    pub fn overcommit(mut self, on: bool) -> Self {
        self.overcommit = on;
        self
    }
    pub fn handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = n;
        self
    }
    /// Shares the budget of the group file at `path` ([`crate::MemCgroup::create`] makes one)
    /// with the other managers that join it, in this process or others.
    pub fn group(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.group = Some(path.into());
        self
    }

    pub fn watermarks(mut self, w: Watermarks) -> Self {
        self.watermarks = Some(w);
        self
    }
}

/// The shared state of one memory manager, made of the kernel's objects. Threads hold
/// `Arc<MmInner>`. The fault and reclaim entry points take the whole (as the kernel's reach
/// `current->mm`, the node and the swap info from a `vm_fault` or `scan_control`); the pieces'
/// own operations take only their piece.
#[derive(Debug)]
pub struct MmInner {
    pub(crate) cfg: MmConfig,
    /// The memory node: descriptors, free frames, LRU lists, watermarks, kswapd (`pglist_data`).
    pub(crate) node: Node,
    /// The frame pool's slots, the zero source and the queued slot drops (pool.rs).
    pub(crate) pool: FramePool,
    /// The address space: region table, commit accounting, userfaultfd (`mm_struct`).
    pub(crate) mm: MmStruct,
    /// The fault handler threads' shared state: shutdown, watchdog, tripwires (handler.rs).
    pub(crate) handlers: HandlerState,
    /// Swap devices, slots and the swap cache (`swap_info_struct`, swap_state.rs).
    pub(crate) swap: Option<SwapState>,
    /// The file table: address spaces of files by id and inode (page owners name them by id).
    pub(crate) files: super::file::FileTable,
    /// Flushers and dirty lists (`bdi_writeback`).
    pub(crate) wb: super::page_writeback::WbState,
    /// Asynchronous readahead windows and their worker (readahead.rs).
    pub(crate) ra: super::readahead::RaQueue,
    /// Event counters (`vm_event_states`, `/proc/vmstat`).
    pub(crate) vm: Counters,
    /// For threads started on demand (flushers).
    pub(crate) self_ref: Mutex<Option<std::sync::Weak<MmInner>>>,
}

impl MmInner {
    /// This manager as an `Arc`, for starting a thread that holds it (None while it is being
    /// torn down).
    pub(crate) fn self_arc(&self) -> Option<Arc<MmInner>> {
        self.self_ref
            .lock()
            .as_ref()
            .and_then(std::sync::Weak::upgrade)
    }

    /// Retries a resolving ioctl over `len` bytes on EAGAIN (the kernel is changing the address
    /// space), resuming after the bytes already done: `op(off)` must act on `[off, len)` of its range.
    /// The error's `done` counts every byte resolved across the tries (never re-issue a range that
    /// was partly done: its first page would fail with EEXIST and hide the pages that were moved).
    /// EEXIST means another thread resolved it: the caller wakes.
    pub(crate) fn retry_again(
        &self,
        len: usize,
        mut op: impl FnMut(usize) -> std::result::Result<usize, crate::sys::uffd::OpError>,
    ) -> std::result::Result<usize, crate::sys::uffd::OpError> {
        let mut tries = 0;
        let mut done = 0;
        loop {
            match op(done) {
                Ok(n) => return Ok(done + n),
                Err(e) if e.is_again() && tries < 1000 => {
                    done += e.done;
                    if done >= len {
                        return Ok(done);
                    }
                    self.vm.inc(Item::UffdEagain);
                    tries += 1;
                    crate::sync::yield_now();
                }
                Err(e) => {
                    return Err(crate::sys::uffd::OpError {
                        errno: e.errno,
                        done: done + e.done,
                    })
                }
            }
        }
    }
}

/// The fault path's health ([`Mm::health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Panics caught while serving faults (each fault was served again or its page poisoned).
    pub handler_panics: u64,
    /// Faults outstanding longer than the watchdog's threshold now.
    pub stuck_faults: Vec<super::handler::StuckFault>,
    /// Faults the watchdog has reported as stuck so far (`fault_stuck`).
    pub stuck_reported: u64,
    /// Handler threads that died (a panic outside the per-fault guard): each woke the faults
    /// it held and started over (`handler_died`).
    pub handler_deaths: u64,
    /// Faults the watchdog found unread in the userfaultfd while no handler read it, and
    /// served itself (`fault_unread`).
    pub unread_faults: u64,
    /// Threads that faulted at one page again and again (`fault_refault_tripwire`).
    pub refault_tripwires: u64,
    /// "Already resolved" answers that found no page mapped and resolved again
    /// (`fault_stale_unmapped`).
    pub stale_answers: u64,
    /// `fault_path=sigbus` only: usermm's SIGBUS handler is no longer the process's (a handler
    /// installed after the manager replaced it), so this manager's faults reach that handler.
    pub sigbus_handler_replaced: bool,
}

impl Health {
    /// No panic, no dead handler, no stuck or unread fault, no tripwire, usermm's SIGBUS
    /// handler in place.
    pub fn is_ok(&self) -> bool {
        self.handler_panics == 0
            && self.handler_deaths == 0
            && self.unread_faults == 0
            && self.stuck_faults.is_empty()
            && self.stuck_reported == 0
            && self.refault_tripwires == 0
            && !self.sigbus_handler_replaced
    }
}

/// Owns the threads; the last `Arc<MmHandle>` (held by `Mm` and every `Region`) stops them.
pub(crate) struct MmHandle {
    pub(crate) inner: Arc<MmInner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for MmHandle {
    fn drop(&mut self) {
        super::fault::disable(&self.inner);
        // Closed files' dirty pages reach their files before the manager goes.
        super::file::writeback_all(&self.inner);
        self.inner.handlers.shutdown.store(true, Ordering::Release);
        self.inner.handlers.shutdown_efd.signal();
        {
            let mut p = self.inner.node.kswapd.pending.lock();
            *p = true;
            self.inner.node.kswapd.cv.notify_all();
        }
        {
            let _tokens = self.inner.handlers.standby_wake.lock();
            self.inner.handlers.standby_cv.notify_all();
        }
        if let Some(g) = &self.inner.node.memcg {
            // This manager's group reclaimer may sleep on the group's futex.
            g.wake_all();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        // Started by kswapd or a file's opening, both done now.
        let standby: Vec<_> = self
            .inner
            .handlers
            .standby_threads
            .lock()
            .drain(..)
            .collect();
        for t in standby {
            let _ = t.join();
        }
        self.inner.ra.shutdown();
        // A worker may start another as it takes its last window: join until none is left.
        loop {
            let readers: Vec<_> = self.inner.ra.threads.lock().drain(..).collect();
            if readers.is_empty() {
                break;
            }
            for t in readers {
                let _ = t.join();
            }
        }
        self.inner.wb.shutdown();
        let flushers: Vec<_> = self.inner.wb.threads.lock().drain(..).collect();
        for t in flushers {
            let _ = t.join();
        }
        super::huge_memory::mm_put_huge_zero_page(&self.inner);
    }
}

/// A memory manager: a budget, a swap device, fault handler threads, kswapd and counters.
///
/// ```no_run
/// use usermm::{Mm, MmConfig, SwapConfig};
/// let mm = Mm::new(MmConfig::new(64 << 20).swap(SwapConfig::Ram { size: 256 << 20 })).unwrap();
/// let r = mm.map_anon(256 << 20).unwrap(); // 4x the budget
/// let p = r.as_ptr() as *mut u64;
/// for i in 0..(r.len() / 8) {
///     // SAFETY: p points into the region, which lives until `r` drops.
///     unsafe { p.add(i).write_volatile(i as u64) };
/// }
/// assert!(mm.vmstat().val("pswpout") > 0);
/// ```
#[derive(Clone)]
pub struct Mm {
    pub(crate) h: Arc<MmHandle>,
}

impl std::fmt::Debug for Mm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mm")
            .field("budget", &self.h.inner.cfg.budget)
            .field("swap", &self.h.inner.cfg.swap)
            .finish()
    }
}

/// What the kernel's userfaultfd offers this manager (learned at run time).
#[derive(Debug, Clone)]
pub struct UffdInfo {
    pub origin: uffd::Origin,
    pub features: Vec<&'static str>,
}

/// A process's default manager, made from the environment by [`Mm::from_env`].
#[derive(Debug)]
pub struct EnvManager {
    pub mm: Mm,
    /// Set when the environment names a swap file that another manager holds (a kept file,
    /// or one opened in the instant before its path was unlinked), so this one swaps to an
    /// unlinked temporary file instead; names the file. Front ends show it.
    pub swap_note: Option<String>,
}

impl Mm {
    /// The default manager of a process, made the one way every front end makes it: the C
    /// ABI's `usermm_default`, Python's `usermm.default()` and `usermm run` (the preload).
    /// [`MmConfig::from_env`] gives the configuration (errors name the variable). A swap file
    /// named by `USERMM_SWAP=file:PATH` is inherited by every process of a program (children,
    /// exec'd programs, multiprocessing workers); each manager unlinks the path as soon as it
    /// has opened its file, so the next one makes its own file there. A kept file
    /// (`USERMM_SWAP_KEEP=1`) stays at its path, held by the first manager (the device's
    /// exclusive flock), and the others never share it: they swap to an unlinked temporary file
    /// of the same size, and [`EnvManager::swap_note`] says so. (A manager configured
    /// explicitly with a path in use fails instead.)
    pub fn from_env() -> Result<EnvManager> {
        Self::from_env_inheriting(None)
    }

    /// [`Mm::from_env`] for a fork child that shares its parent's swapped pages through
    /// `inherit` ([`MmConfig::inherit`]).
    pub fn from_env_inheriting(
        inherit: Option<Arc<crate::swap::InheritLink>>,
    ) -> Result<EnvManager> {
        let mut cfg = MmConfig::from_env()?;
        cfg.inherit = inherit;
        let busy = |e: &Error| matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::ResourceBusy);
        match Mm::new(cfg.clone()) {
            Err(e) if busy(&e) && cfg.swap.file_path().is_some() => {
                let swap = cfg.swap.without_file_path();
                let mm = Mm::new(MmConfig { swap, ..cfg })?;
                Ok(EnvManager {
                    mm,
                    swap_note: Some(format!(
                        "{e}; this process swaps to an unlinked temporary file in $TMPDIR instead"
                    )),
                })
            }
            r => r.map(|mm| EnvManager {
                mm,
                swap_note: None,
            }),
        }
    }

    /// Creates a memory manager, opens its swap device and userfaultfd, starts its threads.
    /// The configuration is checked first ([`MmConfig::validate`]).
    pub fn new(cfg: MmConfig) -> Result<Mm> {
        cfg.validate()?;
        #[cfg(any(test, feature = "testing"))]
        {
            super::memory::inject::from_env();
            super::handler::inject::from_env();
        }
        let nr_frames = cfg.budget / PAGE_SIZE as u64;
        let wmark = cfg
            .watermarks
            .unwrap_or_else(|| Watermarks::scaled(nr_frames));
        let inherit = cfg.inherit.as_ref().filter(|l| !l.is_empty());
        let swap_cfg = match inherit {
            None => cfg.swap.clone(),
            Some(link) => cfg
                .swap
                .grown(link.len() * PAGE_SIZE as u64)
                .ok_or_else(|| {
                    Error::io(
                        "sharing the parent's swapped pages",
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!(
                                "{} pages were shared at fork, but this process's swap ({:?}) cannot hold them; give it a swap device (USERMM_SWAP)",
                                link.len(),
                                cfg.swap
                            ),
                        ),
                    )
                })?,
        };
        let dev = swap_cfg
            .open_for_budget(
                cfg.budget,
                crate::swap::FileSwapOptions {
                    encrypt: cfg.swap_encrypt,
                    keep: cfg.swap_keep,
                    sparse: cfg.swap_sparse,
                },
            )
            .map_err(|e| match e.kind() {
                // A size or path the caller gave that cannot work: the message names it.
                std::io::ErrorKind::InvalidInput => SwapError::Device { source: e }.into(),
                _ => Error::io("opening the swap device", e),
            })?;
        let writeback_tags = !cfg.settings.is_new(crate::Switch::SwapcacheWritebackTags);
        let dev = match (dev, inherit) {
            (Some(d), Some(link)) => Some(Arc::new(
                crate::swap::InheritedSwap::new(d, Arc::clone(link))
                    .map_err(|e| Error::io("sharing the parent's swapped pages", e))?,
            ) as Arc<dyn crate::swap::SwapDevice>),
            (d, _) => d,
        };
        let swap = dev.map(|d| SwapState::new(d, writeback_tags));
        if let (Some(sw), Some(link)) = (&swap, inherit) {
            sw.slots.reserve(link.base(), link.len());
        }
        let swap_pages = swap.as_ref().map_or(0, |s| s.slots.nr_pages());
        let wanted = uffd::feature::MOVE
            | uffd::feature::POISON
            | uffd::feature::PAGEFAULT_FLAG_WP
            | uffd::feature::THREAD_ID;
        let self_served = cfg.settings.is_new(crate::Switch::FaultPath);
        let wanted = if self_served {
            wanted | uffd::feature::SIGBUS
        } else {
            wanted
        };
        let uffd = Uffd::open(wanted, cfg.uffd_policy).map_err(UffdError::Open)?;
        if self_served && !uffd.has(uffd::feature::SIGBUS) {
            return Err(UffdError::NoSigbus.into());
        }
        if !uffd.has(uffd::feature::MOVE) {
            return Err(UffdError::NoMove.into());
        }
        if !uffd.has(uffd::feature::PAGEFAULT_FLAG_WP) {
            return Err(UffdError::NoWriteProtect.into());
        }
        let pool = Mapping::anon(nr_frames.usize() * PAGE_SIZE, 2 << 20).map_err(|e| {
            Error::io(
                format!("reserving the frame pool of {} bytes", cfg.budget),
                e,
            )
        })?;
        pool.advise(0, pool.len(), Advice::NoHugePage)
            .map_err(|e| Error::io("madvise(NOHUGEPAGE) on the frame pool", e))?;
        // A fork(2) child must not share the pool's parked pages: the kernel refuses to move
        // pages mapped twice (EBUSY), which would stall reclaim until the child exits.
        pool.advise(0, pool.len(), Advice::DontFork)
            .map_err(|e| Error::io("madvise(DONTFORK) on the frame pool", e))?;
        // UFFDIO_MOVE needs both ends registered with the same userfaultfd and the same modes.
        // Nothing ever faults on the pool: slots are filled only by MOVE and COPY.
        uffd.register(
            pool.addr(),
            pool.len(),
            uffd::mode::MISSING | uffd::mode::WP,
        )
        .map_err(|e| Error::io("registering the frame pool with userfaultfd", e))?;
        let zero_src = Mapping::anon(512 * PAGE_SIZE, 0)
            .map_err(|e| Error::io("mapping the zero source", e))?;
        zero_src
            .advise(0, zero_src.len(), Advice::NoHugePage)
            .map_err(|e| Error::io("madvise on the zero source", e))?;
        // Map the shared zero page everywhere: copies from it read cache-hot zeros, cost no memory.
        let _ = zero_src.advise(0, zero_src.len(), Advice::PopulateRead);
        let memcg = cfg
            .group
            .as_deref()
            .map(super::memcontrol::MemCgroup::join)
            .transpose()?;
        let vm = Counters::default();
        vm.set(Item::NrFree, nr_frames);
        let efd = EventFd::new().map_err(|e| Error::io("eventfd", e))?;
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let handlers = if cfg.handler_threads == 0 {
            cpus
        } else {
            cfg.handler_threads
        };
        // Standby readers for the faults that wait for a device: swap-ins from a disk or the
        // network, page-cache reads of mapped files (handler.rs, `blocking_io`).
        let standby = handler::MAX_IO_READERS.saturating_sub(handlers);
        let inner = Arc::new(MmInner {
            node: Node::new(
                nr_frames.u32(),
                wmark,
                cfg.settings.is_new(crate::Switch::LruGen),
                memcg,
            ),
            pool: FramePool::new(pool, zero_src),
            mm: MmStruct::new(uffd, nr_frames + swap_pages),
            handlers: HandlerState::new(efd, handlers, standby, cpus),
            vm,
            swap,
            files: Default::default(),
            wb: Default::default(),
            ra: Default::default(),
            self_ref: Mutex::new(None),
            cfg,
        });
        *inner.self_ref.lock() = Some(Arc::downgrade(&inner));
        // The handle owns the threads from the first one on: if a later spawn fails, dropping it
        // stops and joins those already started.
        let h = Arc::new(MmHandle {
            inner: inner.clone(),
            threads: Mutex::new(Vec::new()),
        });
        let spawn_failed = |what: &str, e: std::io::Error| {
            Error::io(
                format!("starting {what} (the process may be at its thread or memory-map limit; use fewer handler_threads)"),
                e,
            )
        };
        for i in 0..handlers {
            let m = inner.clone();
            let t = super::spawn_thread(format!("usermm-fault{i}"), move || {
                handler::handler_main(m, i)
            })
            .map_err(|e| spawn_failed(&format!("fault handler thread {i} of {handlers}"), e))?;
            h.threads.lock().push(t);
        }
        // The standby readers start later, where a device read may first wait
        // (`handler::start_standby_readers`).
        let m = inner.clone();
        let t = super::spawn_thread("usermm-watchdog".into(), move || handler::watchdog_main(m))
            .map_err(|e| spawn_failed("the fault watchdog", e))?;
        h.threads.lock().push(t);
        let m = inner.clone();
        let t = super::spawn_thread("usermm-kswapd".into(), move || vmscan::kswapd_main(m))
            .map_err(|e| spawn_failed("kswapd", e))?;
        h.threads.lock().push(t);
        if inner.node.memcg.is_some() {
            let m = inner.clone();
            let t = super::spawn_thread("usermm-memcg".into(), move || vmscan::memcg_reclaimd(m))
                .map_err(|e| spawn_failed("the budget group's reclaimer", e))?;
            h.threads.lock().push(t);
        }
        // The first readahead worker; the workers start the others (readahead.rs `pop`).
        inner.ra.add_worker();
        if !super::filemap::ra_start_worker(&inner) {
            log::warn!("no readahead worker: readahead windows are read synchronously");
        }
        if self_served {
            super::fault::enable(&inner)?;
        }
        drop(inner);
        Ok(Mm { h })
    }

    pub(crate) fn inner(&self) -> &MmInner {
        &self.h.inner
    }

    /// Maps `len` bytes (rounded up to 4 KiB) of anonymous memory managed by this manager.
    /// Untouched pages cost nothing; reads of them see the zero page.
    pub fn map_anon(&self, len: usize) -> Result<Region> {
        super::mmap::map_anon(self, len)
    }

    /// Whether every fault is being answered: handler panics so far, faults outstanding longer
    /// than the watchdog's threshold (10 s by default) right now, and the tripwire counters of
    /// faults answered without a mapping. A healthy manager has all of them at zero.
    pub fn health(&self) -> Health {
        let m = self.inner();
        let after = Duration::from_millis(m.handlers.stuck_after_ms.load(Ordering::Relaxed));
        Health {
            handler_panics: m.vm.get(Item::HandlerPanic),
            stuck_faults: super::handler::stuck_faults(&m.handlers, after),
            stuck_reported: m.vm.get(Item::FaultStuck),
            handler_deaths: m.vm.get(Item::HandlerDied),
            unread_faults: m.vm.get(Item::FaultUnread),
            refault_tripwires: m.vm.get(Item::FaultRefaultTripwire),
            stale_answers: m.vm.get(Item::FaultStaleUnmapped),
            sigbus_handler_replaced: m.mm.faults_self_served() && !crate::sys::sigbus::installed(),
        }
    }

    /// Sets the watchdog's threshold for reporting an outstanding fault (default
    /// [`STUCK_FAULT_AFTER`](super::handler::STUCK_FAULT_AFTER)).
    pub fn set_stuck_fault_threshold(&self, after: Duration) {
        self.inner()
            .handlers
            .stuck_after_ms
            .store(after.as_millis().max(1).sat_u64(), Ordering::Relaxed);
    }

    /// As [`map_anon`](Self::map_anon), but not charged to the commit limit, like the
    /// kernel's `MAP_NORESERVE`: if its pages later find the budget used and the swap device
    /// full, they are lost and accesses raise SIGBUS (the `oom_poison` counter), as under
    /// `overcommit`.
    pub fn map_anon_noreserve(&self, len: usize) -> Result<Region> {
        super::mmap::map_anon_noreserve(self, len)
    }

    /// Makes the existing private anonymous mapping `[addr, addr+len)` (page-aligned) a region
    /// of this manager in place, contents and all: its resident pages are charged to the budget
    /// and put on the LRU lists as if faulted in (reclaim may swap them out at once), its
    /// untouched pages fault in as zeros. The caller gives up the mapping (the region unmaps
    /// it when dropped). For a fork child taking over the copy of its parent's memory
    /// (`usermm run`).
    pub fn adopt_anon(&self, addr: usize, len: usize, noreserve: bool) -> Result<Region> {
        super::mmap::adopt_anon(self, addr, len, noreserve)
    }

    /// fork(2), parent's side: the swapped pages among the first `len` bytes of `region`
    /// (except the page indexes in `except`, sorted) are shared with a child by their slots
    /// (`swap_duplicate`; mm/fork.rs), so the fork reads none of them. Returns (page index, slot) in page order; hand the slots to
    /// [`Mm::serve_fork_child`] (which gives them back when the child is done) and the list to
    /// the child ([`MmConfig::inherit`], [`Mm::adopt_anon_inherited`]).
    pub fn share_swapped_for_fork(
        &self,
        region: &Region,
        len: usize,
        except: &[u64],
    ) -> Vec<(u64, u64)> {
        let npages = (len / PAGE_SIZE) as u64;
        super::fork::share_swapped(self.inner(), &region.r, npages, except)
            .into_iter()
            .map(|(i, s)| (i.raw(), s.offset()))
            .collect()
    }

    /// fork(2), parent's side: [`Mm::copy_for_fork`] written straight into the memory of the
    /// child `pid` at the same addresses (`process_vm_writev`), for bytes `[off, off + len)`
    /// of `region` (page-aligned). An error (the kernel's ptrace rules may refuse) leaves the
    /// range to be copied another way.
    pub fn write_to_fork_child(
        &self,
        region: &Region,
        off: usize,
        len: usize,
        pid: i32,
    ) -> Result<()> {
        whole_pages_of(region, off, len, "writing memory to a fork child")?;
        super::fork::write_for_fork(self.inner(), &region.r, off, len, pid)
            .map_err(|e| Error::io("writing memory to a fork child", e))
    }

    /// Gives back shares [`Mm::share_swapped_for_fork`] took, for a child that will not get
    /// them (the fork failed, or the range is copied instead).
    pub fn unshare_swapped_for_fork(&self, slots: impl IntoIterator<Item = u64>) {
        super::fork::put_shared(self.inner(), slots);
    }

    /// fork(2), parent's side: copies bytes `[off, off + buf.len())` of `region` (page-aligned)
    /// into `buf` for the child, from the view or the frame pool under each page's lock where
    /// the page is resident, faulting in only the rest (a swapped page not shared by slot).
    /// Returns how many pages were faulted in.
    pub fn copy_for_fork(&self, region: &Region, off: usize, buf: &mut [u8]) -> Result<u64> {
        whole_pages_of(region, off, buf.len(), "copying memory for a fork child")?;
        super::fork::copy_for_fork(self.inner(), &region.r, off, buf)
    }

    /// Serves a fork child's reads of the `shared` slots (from
    /// [`Mm::share_swapped_for_fork`]) over `stream` on a thread of its own, until the child
    /// closes it (exit, exec, SIGKILL); then every slot it still shared loses its use. The
    /// thread keeps the swap device alive as long as the child needs it.
    pub fn serve_fork_child(
        &self,
        stream: std::os::unix::net::UnixStream,
        shared: Vec<u64>,
    ) -> Result<()> {
        super::fork::serve_child(Arc::clone(&self.h.inner), stream, shared)
            .map_err(|e| Error::io("starting the thread that serves a fork child", e))
    }

    /// This process is exiting (`exit`, `_exit`): its pages' charge in its budget group is
    /// given back now, as a memory cgroup uncharges an exiting task in `exit_mmap`, not when
    /// the next member finds it dead (up to 100 ms later, meanwhile reclaimed from the others'
    /// pages). The manager keeps serving faults (a late destructor may still touch memory),
    /// charging nobody. Returns the pages given back; 0 in no group or after the first call.
    pub fn leave_budget_group(&self) -> u64 {
        self.h.inner.node.memcg.as_ref().map_or(0, |g| g.leave())
    }

    /// This process is about to exit or exec: the fork children still sharing swapped pages
    /// with any manager of it get those pages in a file of their own (written now), so they
    /// keep their memory after this process is gone. Waits at most `timeout`; returns how
    /// many children were handed their pages. A process killed outright cannot do this: its
    /// children then get SIGBUS, with a message, on the pages they had not read yet.
    pub fn hand_over_fork_children(timeout: Duration) -> usize {
        super::fork::hand_over_all(timeout)
    }

    /// [`Mm::adopt_anon`] for a fork child whose manager shares its parent's swapped pages
    /// ([`MmConfig::inherit`]): page `idx` of each `(idx, k)` of `inherited` names the `k`-th
    /// shared slot and is read from the parent when first touched.
    pub fn adopt_anon_inherited(
        &self,
        addr: usize,
        len: usize,
        noreserve: bool,
        inherited: &[(u64, u64)],
    ) -> Result<Region> {
        let v: Vec<(PgOff, u64)> = inherited.iter().map(|&(i, k)| (PgOff::new(i), k)).collect();
        super::fork::adopt_anon_inherited(self, addr, len, noreserve, &v)
    }

    /// A snapshot of the counters, named as in `/proc/vmstat`.
    pub fn vmstat(&self) -> Vmstat {
        let m = self.inner();
        m.vm.set(Item::NrFree, m.node.nr_free());
        m.vm.set(Item::UffdMoveUnreported, m.mm.uffd.move_unreported());
        if let Some(s) = &m.swap {
            m.vm.set(Item::NrSwapUsed, s.slots.nr_pages() - s.slots.nr_free());
            m.vm.set(Item::NrSwapShared, s.nr_shared());
            // The tiers' own counters (zswap's), summed where two tiers share a name.
            let mut sums: Vec<(&'static str, u64)> = Vec::new();
            for (_, counters) in crate::swap::tiers(&s.dev) {
                for (n, v) in counters {
                    match sums.iter_mut().find(|(k, _)| *k == n) {
                        Some((_, t)) => *t += v,
                        None => sums.push((n, v)),
                    }
                }
            }
            for (n, v) in sums {
                m.vm.set_named(n, v);
            }
        }
        m.vm.snapshot()
    }

    /// The swap tiers, top first: each tier's description and its own counters (empty without
    /// swap). `zswap+file` gives the zswap pool, then the file.
    pub fn swap_tiers(&self) -> Vec<(String, Vec<(&'static str, u64)>)> {
        self.inner()
            .swap
            .as_ref()
            .map_or_else(Vec::new, |s| crate::swap::tiers(&s.dev))
    }

    /// The memory budget in bytes.
    pub fn budget(&self) -> u64 {
        self.inner().cfg.budget
    }

    /// Bytes of frames in use now.
    pub fn resident_bytes(&self) -> u64 {
        self.inner().node.resident_pages() * PAGE_SIZE as u64
    }

    /// Highest `resident_bytes` seen.
    pub fn peak_resident_bytes(&self) -> u64 {
        self.inner().node.peak_resident.load(Ordering::Relaxed) * PAGE_SIZE as u64
    }

    /// Swap capacity in bytes (0 without swap).
    pub fn swap_bytes(&self) -> u64 {
        self.inner()
            .swap
            .as_ref()
            .map_or(0, |s| s.slots.nr_pages() * PAGE_SIZE as u64)
    }

    /// A description of the swap device.
    pub fn swap_name(&self) -> String {
        self.inner()
            .swap
            .as_ref()
            .map_or("none".into(), |s| s.dev.name())
    }

    /// Bytes committed by live regions, and the commit limit (budget + swap).
    pub fn commit(&self) -> (u64, u64) {
        let m = self.inner();
        (
            m.mm.committed.load(Ordering::Relaxed) * PAGE_SIZE as u64,
            m.mm.commit_limit * PAGE_SIZE as u64,
        )
    }

    /// The watermarks in force (pages).
    pub fn watermarks(&self) -> Watermarks {
        self.inner().node.wmark
    }

    /// The settings this manager runs with.
    pub fn config(&self) -> &MmConfig {
        &self.inner().cfg
    }

    /// Number of live regions.
    pub fn nr_regions(&self) -> usize {
        self.inner().mm.regions.read().len()
    }

    /// What userfaultfd offers here.
    pub fn uffd_info(&self) -> UffdInfo {
        let u = &self.inner().mm.uffd;
        UffdInfo {
            origin: u.origin(),
            features: uffd::feature::NAMES
                .iter()
                .filter(|(b, _)| u.has(*b))
                .map(|(_, n)| *n)
                .collect(),
        }
    }

    /// Checks that every allocated frame is owned by exactly one live page-table entry or, for
    /// a page-cache page, by its file's tree, and every resident entry points at an allocated
    /// frame that names it (a page-cache page names its file and offset). Returns the problems
    /// found (empty when consistent). For tests and debugging; takes no locks, so run it while
    /// the manager is quiet.
    pub fn audit(&self) -> Vec<String> {
        use super::page::pg;
        use super::pgtable::Pte;
        let m = self.inner();
        let mut bad = Vec::new();
        let mut owned = vec![false; m.node.nr_frames().usize()];
        let t = m.mm.regions.read();
        for r in t.iter() {
            r.pt.for_each_used(PgOff::ZERO, r.end(), |i, p| {
                if let Pte::Frame(f) = p {
                    let pg_ = &m.node.pages[f];
                    if m.node.frames.is_free(f) {
                        bad.push(format!("region {} page {i}: frame {f} is free", r.id));
                    }
                    // A page-cache page mapped in a file region (shared, or private before
                    // its first store) is named by its file (address space, page offset).
                    let want = match &r.file {
                        Some(fm) if pg_.test(pg::PAGECACHE) => {
                            Owner::Cache(fm.mapping.id, fm.linear_page_index(i))
                        }
                        _ => Owner::Anon(r.id, i),
                    };
                    if pg_.owner() != want {
                        bad.push(format!(
                            "region {} page {i}: frame {f} names {:?}",
                            r.id,
                            pg_.owner()
                        ));
                    }
                    if std::mem::replace(&mut owned[f.idx()], true) {
                        bad.push(format!("frame {f} owned twice (region {} page {i})", r.id));
                    }
                }
            });
        }
        // Page-cache pages need no mapping: their file's tree owns them.
        let files = m.files.all();
        let in_its_file = |f: Pfn| {
            let Owner::Cache(id, index) = m.node.pages[f].owner() else {
                return false;
            };
            files.iter().any(|a| {
                a.id == id
                    && matches!(a.peek(&m.vm, index), Some(super::fs::Entry::Page(g)) if g == f)
            })
        };
        for (f, _) in m.node.pages.iter() {
            if !m.node.frames.is_free(f) && !owned[f.idx()] {
                let p = &m.node.pages[f];
                if in_its_file(f) {
                    continue;
                }
                bad.push(format!(
                    "frame {f} allocated but unowned: owner {:?} flags {:#x}",
                    p.owner(),
                    p.flags()
                ));
            } else if m.node.frames.is_free(f) && m.node.pages[f].test(pg::LRU) {
                bad.push(format!("free frame {f} is on an LRU list"));
            }
        }
        // In a budget group: the charge is the frames in use plus the free ones whose slots keep
        // a recycled page (quiescent: nothing allocating or freeing meanwhile).
        if let Some(g) = m.node.memcg.as_ref().filter(|g| !g.has_left()) {
            let pooled = m
                .node
                .pages
                .iter()
                .filter(|&(f, p)| m.node.frames.is_free(f) && p.test(pg::POOLED))
                .count() as u64;
            let counted = m
                .node
                .pooled_free
                .load(std::sync::atomic::Ordering::Relaxed);
            if counted != pooled {
                bad.push(format!(
                    "{pooled} free frames keep a recycled page, {counted} counted"
                ));
            }
            let want = m.node.resident_pages() + pooled;
            if g.my_usage() != want {
                bad.push(format!(
                    "charged {} pages to the budget group, holding {want} ({} in use, {pooled} recycled)",
                    g.my_usage(),
                    m.node.resident_pages()
                ));
            }
        }
        bad
    }

    /// Waits (at most `max`) until no readahead window is queued or being read and the counters
    /// stop changing for 20 ms: the faults in flight, readahead, kswapd and the flushers have
    /// finished what they started (the handler's own counters excepted). For a quiet
    /// [`audit`](Self::audit) and exact counter snapshots.
    pub fn settle(&self, max: Duration) {
        let t = std::time::Instant::now();
        let mut prev = self.vmstat();
        while t.elapsed() < max {
            std::thread::sleep(Duration::from_millis(20));
            let cur = self.vmstat();
            let same = prev
                .iter()
                .zip(cur.iter())
                .all(|((n, a), (_, b))| a == b || n.starts_with("handler_"));
            if same && self.inner().ra.idle() {
                return;
            }
            prev = cur;
        }
    }

    /// Reclaims until at most `target_bytes` are resident (or nothing more can be reclaimed);
    /// returns pages reclaimed. Like writing to memory.reclaim.
    pub fn reclaim_to(&self, target_bytes: u64) -> u64 {
        vmscan::reclaim_to(self.inner(), target_bytes / PAGE_SIZE as u64)
    }
}

/// `[off, off + len)` must be whole pages inside `region`; else an error for `what` naming the
/// numbers.
fn whole_pages_of(region: &Region, off: usize, len: usize, what: &str) -> Result<()> {
    if off.is_multiple_of(PAGE_SIZE)
        && len.is_multiple_of(PAGE_SIZE)
        && off.checked_add(len).is_some_and(|end| end <= region.len())
    {
        return Ok(());
    }
    Err(Error::io(
        what,
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{len} bytes at offset {off} of a region of {}: give whole pages inside it",
                region.len()
            ),
        ),
    ))
}

#[cfg(test)]
mod env_tests {
    use super::*;

    /// The only test touching USERMM_* variables (tests run in threads of one process).
    #[test]
    fn from_env_parses_and_names_the_variable() {
        std::env::set_var("USERMM_BUDGET", "64M");
        std::env::set_var("USERMM_SWAP", "ram");
        std::env::set_var("USERMM_SET", "accessed_init=old,laptop_mode=on");
        let c = MmConfig::from_env().unwrap();
        assert_eq!(c.budget, 64 << 20);
        assert!(matches!(c.swap, SwapConfig::Ram { size } if size == 256 << 20));
        assert!(!c.settings.is_new(crate::Switch::AccessedInit));
        assert!(c.settings.laptop_mode);
        std::env::set_var("USERMM_BUDGET", "256Q");
        let e = MmConfig::from_env().unwrap_err().to_string();
        assert!(e.contains("USERMM_BUDGET") && e.contains("256Q"), "{e}");
        std::env::set_var("USERMM_BUDGET", "64M");
        std::env::set_var("USERMM_SWAP", "tape");
        let e = MmConfig::from_env().unwrap_err().to_string();
        assert!(e.contains("USERMM_SWAP") && e.contains("tape"), "{e}");
        for v in ["USERMM_BUDGET", "USERMM_SWAP", "USERMM_SET"] {
            std::env::remove_var(v);
        }
        let c = MmConfig::from_env().unwrap();
        assert_eq!(c.budget, DEFAULT_BUDGET);
        // The default swap file: sparse, sized by the free space of $TMPDIR's filesystem (which
        // other processes change meanwhile: compare loosely, within 1 GiB).
        let avail = crate::sys::fs_available_bytes(&std::env::temp_dir()).unwrap();
        let want = (avail / 2).min(crate::swap::DEFAULT_FILE_CAP);
        match c.swap {
            SwapConfig::File { path: None, size } => {
                assert!(
                    size <= crate::swap::DEFAULT_FILE_CAP && size % 4096 == 0,
                    "{size}"
                );
                assert!(size.abs_diff(want) <= 1 << 30, "{size} vs {want}");
            }
            ref other => panic!("{other:?}"),
        }
        assert!(c.swap_sparse);
        // A swap file in a directory that does not exist is an error, not a temporary file.
        std::env::set_var("USERMM_SWAP", "file:/nonexistent/dir/x");
        let e = MmConfig::from_env().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/dir"), "{e}");
        std::env::set_var("USERMM_SWAP_SIZE", "1G");
        let c = MmConfig::from_env().unwrap();
        assert!(!c.swap_sparse);
        let e = Mm::new(c).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/dir/x"), "{e}");
        std::env::set_var("USERMM_SET", "garbage");
        let e = MmConfig::from_env().unwrap_err().to_string();
        assert!(e.contains("USERMM_SET") && e.contains("garbage"), "{e}");
        std::env::set_var("USERMM_OVERCOMMIT", "maybe");
        std::env::remove_var("USERMM_SET");
        let e = MmConfig::from_env().unwrap_err().to_string();
        assert!(
            e.contains("USERMM_OVERCOMMIT") && e.contains("maybe"),
            "{e}"
        );
        std::env::remove_var("USERMM_OVERCOMMIT");
        // Mm::from_env, the default manager of every front end. A named swap file has no
        // name while in use, so a second manager makes its own file there.
        let path = std::env::temp_dir().join(format!("usermm-from-env-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        std::env::set_var("USERMM_BUDGET", "4M");
        std::env::set_var("USERMM_SWAP", format!("file:{}", path.display()));
        std::env::set_var("USERMM_SWAP_SIZE", "8M");
        let a = Mm::from_env().unwrap();
        assert!(a.swap_note.is_none());
        assert!(
            a.mm.swap_name().contains(path.to_str().unwrap()),
            "{}",
            a.mm.swap_name()
        );
        assert!(!path.exists(), "unlinked at open");
        let b = Mm::from_env().unwrap();
        assert!(b.swap_note.is_none(), "{:?}", b.swap_note);
        assert!(b.mm.swap_name().contains(path.to_str().unwrap()));
        drop((a, b));
        // A kept file stays at its path, held: the second manager is never given it; it swaps
        // to a temporary file and says so.
        std::env::set_var("USERMM_SWAP_KEEP", "1");
        let a = Mm::from_env().unwrap();
        assert!(a.swap_note.is_none());
        let b = Mm::from_env().unwrap();
        let note = b
            .swap_note
            .as_deref()
            .expect("a note for the second manager");
        assert!(
            note.contains("in use by another usermm manager")
                && note.contains(path.to_str().unwrap()),
            "{note}"
        );
        assert!(
            !b.mm.swap_name().contains(path.to_str().unwrap()),
            "{}",
            b.mm.swap_name()
        );
        // Configured explicitly, the same path is refused.
        let e = Mm::new(MmConfig::from_env().unwrap()).unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::ResourceBusy),
            "{e}"
        );
        drop((a, b));
        assert!(path.exists(), "a kept swap file stays");
        std::fs::remove_file(&path).unwrap();
        std::env::remove_var("USERMM_SWAP_KEEP");
        for v in ["USERMM_BUDGET", "USERMM_SWAP", "USERMM_SWAP_SIZE"] {
            std::env::remove_var(v);
        }
    }
}
