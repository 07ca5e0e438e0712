//! Event and state counters with Linux's names. Mirrors `mm/vmstat.c` and
//! `include/linux/vm_event_item.h` / `mmzone.h` (NR_* state items).
//!
//! Event counters only grow; state counters (`nr_*`) go up and down. [`Vmstat`] is a snapshot
//! that reads like `/proc/vmstat`.

// Statistics, not synchronization: plain atomics even under the model checker (whose atomics
// would make every counter update a scheduling point, and each of them costs a model object).
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! items {
    ($($id:ident = $name:literal),* $(,)?) => {
        /// One counter.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Item { $($id),* }
        /// Names in `/proc/vmstat` order of declaration.
        pub const NAMES: &[&str] = &[$($name),*];
        const COUNT: usize = NAMES.len();
    };
}

items! {
    NrFree = "nr_free_pages",
    NrActiveAnon = "nr_active_anon",
    NrInactiveAnon = "nr_inactive_anon",
    NrAnonPages = "nr_anon_pages",
    NrMapped = "nr_mapped",
    NrSwapcache = "nr_swapcache",
    NrWriteback = "nr_writeback",
    NrZeroPageMapped = "nr_zero_page_mapped",
    NrSwapUsed = "nr_swap_used",
    NrSwapShared = "nr_swap_shared",
    NrIsolatedAnon = "nr_isolated_anon",
    NrIsolatedFile = "nr_isolated_file",
    NrActiveFile = "nr_active_file",
    NrInactiveFile = "nr_inactive_file",
    NrFilePages = "nr_file_pages",
    NrShmem = "nr_shmem",
    NrShmemSwapped = "nr_shmem_swapped",
    NrDirty = "nr_dirty",
    NrDirtyThreshold = "nr_dirty_threshold",
    NrDirtyBackgroundThreshold = "nr_dirty_background_threshold",
    Pgfault = "pgfault",
    Pgmajfault = "pgmajfault",
    Pgminfault = "pgminfault",
    ZeroPageFault = "zero_page_fault",
    Pgalloc = "pgalloc",
    Pgfree = "pgfree",
    Pswpin = "pswpin",
    Pswpout = "pswpout",
    Pgpgin = "pgpgin",
    Pgpgout = "pgpgout",
    SwapRa = "swap_ra",
    SwapRaHit = "swap_ra_hit",
    // Readahead pages of a swap-in stream mapped as they were read (memory.rs `map_swap_ahead`).
    SwapRaMapped = "swap_ra_mapped",
    // Pages of a swap-in stream read ahead of its faults by the readahead workers (memory.rs
    // `swap_ra_read`; switch swap_ra_async).
    SwapRaAsync = "swap_ra_async",
    Pgactivate = "pgactivate",
    Pgdeactivate = "pgdeactivate",
    WorkingsetRefaultAnon = "workingset_refault_anon",
    WorkingsetRefaultFile = "workingset_refault_file",
    WorkingsetActivateAnon = "workingset_activate_anon",
    WorkingsetActivateFile = "workingset_activate_file",
    LruGenAging = "lru_gen_aging",
    Pgrotated = "pgrotated",
    PgscanKswapd = "pgscan_kswapd",
    PgscanDirect = "pgscan_direct",
    PgstealKswapd = "pgsteal_kswapd",
    PgstealDirect = "pgsteal_direct",
    PgrefillActive = "pgrefill",
    Allocstall = "allocstall",
    PgscanDirectThrottle = "pgscan_direct_throttle",
    HandlerStandbyWake = "handler_standby_wake",
    MemcgReclaim = "memcg_reclaim",
    KswapdWake = "kswapd_wake",
    KswapdLowWmarkHitQuickly = "kswapd_low_wmark_hit_quickly",
    KswapdHighWmarkHitQuickly = "kswapd_high_wmark_hit_quickly",
    RefFault = "pgreffault",
    // Parked neighbours a reference fault mapped with its page (switch ref_around).
    RefAround = "pgreffault_around",
    PgUnmapRef = "pgunmap_ref",
    FaultAround = "fault_around_pages",
    WpFault = "wp_fault",
    PgDiscard = "pgdiscard",
    SwapSlotFree = "swap_slot_free",
    SwapWriteError = "swap_write_error",
    SwapReadError = "swap_read_error",
    OomPoison = "oom_poison",
    UffdEexist = "uffd_eexist",
    UffdEagain = "uffd_eagain",
    UffdEbusy = "uffd_ebusy",
    UffdMoveUnreported = "uffd_move_unreported",
    MmWarn = "mm_warn",
    FaultDeferred = "fault_deferred",
    FaultIoParked = "fault_io_parked",
    FaultIoServed = "fault_io_served",
    HandlerSpinHit = "handler_spin_hit",
    HandlerWakeup = "handler_wakeup",
    HandlerSpinSkipped = "handler_spin_skipped",
    CleanHashDirty = "clean_hash_dirty",
    CleanHashClean = "clean_hash_clean",
    CleanHashPredicted = "clean_hash_predicted",
    FaultSelfServed = "fault_self_served",
    NrDirtied = "nr_dirtied",
    NrWritten = "nr_written",
    NrVmscanWrite = "nr_vmscan_write",
    NrVmscanImmediate = "nr_vmscan_immediate_reclaim",
    PgscanAnon = "pgscan_anon",
    PgscanFile = "pgscan_file",
    PgstealAnon = "pgsteal_anon",
    PgstealFile = "pgsteal_file",
    PgrotatedDirty = "pgrotated_dirty",
    FileRa = "file_ra",
    FileRaHit = "file_ra_hit",
    FileRaAsync = "file_ra_async",
    FileRaRandom = "file_ra_random",
    FileReadError = "file_read_error",
    FileReadPoison = "file_read_poison",
    FileWriteError = "file_write_error",
    FileReadHole = "file_read_hole",
    FileWriteNoread = "file_write_noread",
    FileIoUring = "file_io_uring",
    FileReadAsync = "file_read_async",
    FileReadDirect = "file_read_direct",
    FileWriteRuns = "file_write_runs",
    FileMapMoved = "file_map_moved",
    FileMapStoredUnseen = "file_map_stored_unseen",
    FileMapReadHashed = "file_map_read_hashed",
    FlusherWake = "flusher_wake",
    FlusherWakeVmscan = "flusher_wake_vmscan",
    DirtyThrottle = "balance_dirty_pages",
    DirtyThrottleUs = "balance_dirty_pages_us",
    ShmemSwapout = "shmem_swapout",
    ShmemSwapin = "shmem_swapin",
    HugeZeroGet = "thp_zero_page_get",
    ThpZeroPageAlloc = "thp_zero_page_alloc",
    ThpZeroPageFree = "thp_zero_page_free",
    ThpFaultAlloc = "thp_fault_alloc",
    ThpFaultFallback = "thp_fault_fallback",
    NrThpZeroMapped = "nr_thp_zero_mapped",
    TreeLockWaitNs = "lock_wait_ns.tree_lock",
    TreeLockContended = "lock_contended.tree_lock",
    LwAddToPageCache = "lock_wait_ns.add_to_page_cache",
    LwFindGetPage = "lock_wait_ns.find_get_page",
    LwDeleteFromPageCache = "lock_wait_ns.__remove_mapping",
    LwSetPageDirty = "lock_wait_ns.__set_page_dirty",
    LwSetPageWriteback = "lock_wait_ns.__test_set_page_writeback",
    LwEndPageWriteback = "lock_wait_ns.test_clear_page_writeback",
    LwTagPagesForWriteback = "lock_wait_ns.tag_pages_for_writeback",
    LwFindGetPagesTag = "lock_wait_ns.find_get_pages_range_tag",
    LwAddToSwapCache = "lock_wait_ns.__add_to_swap_cache",
    LwDeleteFromSwapCache = "lock_wait_ns.__delete_from_swap_cache",
    TlAcquire = "tree_lock_acquire",
    MarkPageAccessed = "mark_page_accessed",
    PoolSlotLost = "pool_slot_lost",
    PoolZapBatched = "pool_zap_batched",
    PoolHugeFill = "pool_huge_fill",
    InitPageAccessed = "init_page_accessed",
    FaultStaleUnmapped = "fault_stale_unmapped",
    FaultRefaultTripwire = "fault_refault_tripwire",
    PgunmapZapped = "pgunmap_zapped",
    HandlerPanic = "handler_panic",
    FaultStuck = "fault_stuck",
    HandlerDied = "handler_died",
    FaultUnread = "fault_unread",
    Zswpout = "zswpout",
    Zswpin = "zswpin",
    Zswpwb = "zswpwb",
    ZswapStoredPages = "zswap_stored_pages",
    ZswapPoolBytes = "zswap_pool_bytes",
    ZswapSameFilled = "zswap_same_filled",
    ZswapRejectCompressPoor = "zswap_reject_compress_poor",
    ZswapRejectUnread = "zswap_reject_unread",
    ZswapPoolLimitHit = "zswap_pool_limit_hit",
    ZswapWritebackError = "zswap_writeback_error",
    RedisPagesWritten = "redis_pages_written",
    RedisPagesRead = "redis_pages_read",
    RedisRoundTrips = "redis_round_trips",
    RedisErrors = "redis_errors",
    RedisMissingKeys = "redis_missing_keys",
    RedisReadRetries = "redis_read_retries",
    ForkSwapShared = "fork_swap_shared",
    ForkCopyDirect = "fork_copy_direct",
    ForkCopyFaulted = "fork_copy_faulted",
    ForkSwapHandover = "fork_swap_handover",
    ForkSwapInherited = "fork_swap_inherited",
    ForkSwapHeld = "fork_swap_held",
    ForkSwapReads = "fork_swap_reads",
    ForkSwapReadPages = "fork_swap_read_pages",
}

/// Shards the counters are split over. Each thread adds to one shard (its own from its first
/// update, dealt round-robin), each shard on cache lines of its own; a read sums them. This is
/// the kernel's per-CPU `vm_stat_diff`, made per thread. With one array, the counters every
/// page passes (`nr_isolated_file`, `pgfault`, the LRU sizes) shared cache lines that bounced
/// between the vCPUs on every update: in a mapped 4 GiB read at a 256 MiB budget one
/// `lock sub` in reclaim's loop took 76% of `shrink_node`'s own samples (4% of all).
const SHARDS: usize = 8;

#[derive(Debug)]
#[repr(align(128))]
struct Shard([AtomicU64; COUNT]);

/// The live counters of one memory manager.
#[derive(Debug)]
pub struct Counters {
    shards: Box<[Shard]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            shards: (0..SHARDS)
                .map(|_| Shard(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

/// This thread's shard. A constant-initialised thread-local without a destructor: safe in the
/// SIGBUS fault path's signal handler, and nothing to register at thread start.
#[inline]
fn shard_of_thread() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SHARD: Cell<usize> = const { Cell::new(usize::MAX) });
    SHARD.with(|c| {
        let k = c.get();
        if k != usize::MAX {
            return k;
        }
        let k = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        c.set(k);
        k
    })
}

impl Counters {
    /// `WARN_ON`: an operation that fails only if usermm has a bug (an in-range copy or zap, a wake,
    /// a poison or write-protect of a registered page) failed. Logged with what it was and counted
    /// (`mm_warn`), never silently dropped; the caller carries on as the kernel does after a WARN.
    #[cfg(not(loom))]
    pub(crate) fn warn_on<T, E: std::fmt::Display>(
        &self,
        r: std::result::Result<T, E>,
        what: &str,
    ) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.inc(Item::MmWarn);
                log::error!("{what} failed: {e}");
                None
            }
        }
    }

    #[inline]
    pub fn add(&self, i: Item, n: u64) {
        self.shards[shard_of_thread()].0[i as usize].fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn inc(&self, i: Item) {
        self.add(i, 1);
    }
    #[inline]
    pub fn sub(&self, i: Item, n: u64) {
        self.shards[shard_of_thread()].0[i as usize].fetch_sub(n, Ordering::Relaxed);
    }
    /// The counter: the sum of its shards (a state counter read while another thread moves it
    /// between shards may be off by that move for a moment, never below 0).
    #[inline]
    pub fn get(&self, i: Item) -> u64 {
        self.value(i as usize)
    }
    fn value(&self, i: usize) -> u64 {
        let sum = self.shard_sum(i);
        // A decrement seen before the increment it follows (in another shard) sums below 0.
        if sum > i64::MAX as u64 {
            0
        } else {
            sum
        }
    }
    /// Counter `i`'s shards added up, wrapping (a shard alone may have gone below 0).
    fn shard_sum(&self, i: usize) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |a, s| a.wrapping_add(s.0[i].load(Ordering::Relaxed)))
    }
    /// Sets the counter to `n`, by adding the difference to this thread's shard (as racy
    /// against a concurrent update as a store always was).
    #[inline]
    pub fn set(&self, i: Item, n: u64) {
        self.set_index(i as usize, n);
    }
    fn set_index(&self, i: usize, n: u64) {
        let cur = self.shard_sum(i);
        self.shards[shard_of_thread()].0[i].fetch_add(n.wrapping_sub(cur), Ordering::Relaxed);
    }
    /// Sets the counter named `name` (a swap tier's counter); false if no counter has that name.
    pub fn set_named(&self, name: &str, n: u64) -> bool {
        match NAMES.iter().position(|x| *x == name) {
            Some(i) => {
                self.set_index(i, n);
                true
            }
            None => false,
        }
    }
    pub fn snapshot(&self) -> Vmstat {
        Vmstat {
            values: NAMES
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, self.value(i)))
                .collect(),
        }
    }
}

/// A snapshot of all counters, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vmstat {
    values: Vec<(&'static str, u64)>,
}

impl Vmstat {
    /// The value of a counter by its Linux name; None for an unknown name.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
    /// The value of a counter, 0 if unknown (for terse test code).
    pub fn val(&self, name: &str) -> u64 {
        self.get(name).unwrap_or(0)
    }
    /// All counters as (name, value).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.values.iter().copied()
    }
    /// `after - before` for event counters (state counters show the later value).
    pub fn delta(&self, before: &Vmstat) -> Vmstat {
        Vmstat {
            values: self
                .values
                .iter()
                .map(|(n, v)| {
                    if is_state(n) {
                        (*n, *v)
                    } else {
                        (*n, v.saturating_sub(before.val(n)))
                    }
                })
                .collect(),
        }
    }
}

/// Events named `nr_*` in Linux (they only grow, like the other events).
const NR_EVENTS: &[&str] = &[
    "nr_dirtied",
    "nr_written",
    "nr_vmscan_write",
    "nr_vmscan_immediate_reclaim",
];

/// Levels whose names do not start with `nr_` (zswap's debugfs gauges).
const OTHER_STATES: &[&str] = &[
    "zswap_stored_pages",
    "zswap_pool_bytes",
    "zswap_same_filled",
];

/// Whether `name` is a state counter (a level, not an event count).
pub fn is_state(name: &str) -> bool {
    (name.starts_with("nr_") && !NR_EVENTS.contains(&name)) || OTHER_STATES.contains(&name)
}

impl std::fmt::Display for Vmstat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, v) in &self.values {
            writeln!(f, "{n} {v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names_and_snapshot() {
        let c = Counters::default();
        c.add(Item::Pswpout, 3);
        c.inc(Item::Pgfault);
        let s = c.snapshot();
        assert_eq!(s.get("pswpout"), Some(3));
        assert_eq!(s.get("pgfault"), Some(1));
        assert_eq!(s.get("nope"), None);
        assert!(s.to_string().contains("pswpout 3\n"));
        c.inc(Item::Pgfault);
        assert_eq!(c.snapshot().delta(&s).val("pgfault"), 1);
    }
}
