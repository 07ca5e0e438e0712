//! The memory node (`struct pglist_data` in include/linux/mmzone.h): the page descriptors of
//! the budget's frames, the free-frame allocator, the LRU lists, the watermarks and kswapd's
//! wait state. One node per manager; it owns no policy (reclaim is vmscan.rs, allocation
//! page_alloc.rs).

use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use crate::sys::PAGE_SIZE;

use super::page::{FrameAlloc, MemMap};
use super::replacement::ReplacementPolicy;

/// Free-frame watermarks, in pages (`zone->_watermark[WMARK_MIN/LOW/HIGH]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub min: u64,
    pub low: u64,
    pub high: u64,
}

impl Watermarks {
    /// Linux's scaling (`__setup_per_zone_wmarks`): min_free_kbytes = sqrt(16 * budget in KiB)
    /// clamped to [128 KiB, 256 MiB]; low = min + max(min/4, 0.1% of pages); high = min + 2x that.
    pub fn scaled(budget_pages: u64) -> Watermarks {
        let kb = budget_pages * (PAGE_SIZE as u64 / 1024);
        // A square root of a u64 fits a u64; the float keeps 52 bits, plenty for a page count.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let min_kb = ((kb * 16) as f64).sqrt() as u64;
        let min_kb = min_kb.clamp(128, 262_144);
        let min = (min_kb * 1024 / PAGE_SIZE as u64)
            .min(budget_pages / 8)
            .max(4);
        let tmp = (min / 4).max(budget_pages * 10 / 10_000);
        Watermarks {
            min,
            low: min + tmp,
            high: min + 2 * tmp,
        }
    }
}

/// kswapd's wakeup state (`pgdat->kswapd_wait`).
#[derive(Debug, Default)]
pub struct KswapdWait {
    pub(crate) pending: Mutex<bool>,
    pub(crate) cv: Condvar,
}

/// One memory node (`pg_data_t`).
#[derive(Debug)]
pub struct Node {
    /// The page descriptors, indexed by `Pfn` (`mem_map`).
    pub(crate) pages: MemMap,
    /// Free frames (the buddy allocator's free lists).
    pub(crate) frames: FrameAlloc,
    /// The LRU lists (`lruvec`) under the page replacement policy (`lru_gen=on|off`).
    pub(crate) lru: Box<dyn ReplacementPolicy>,
    pub(crate) wmark: Watermarks,
    pub(crate) kswapd: KswapdWait,
    /// PGDAT_DIRTY: reclaim found only dirty, unqueued file pages at the LRU tail.
    pub(crate) pgdat_dirty: AtomicBool,
    /// The most frames ever in use at once.
    pub(crate) peak_resident: AtomicU64,
}

impl Node {
    /// `lru_gen`: the multi-gen LRU, else the two-list LRU.
    pub(crate) fn new(nr_frames: u32, wmark: Watermarks, lru_gen: bool) -> Node {
        Node {
            pages: MemMap::new(nr_frames),
            frames: FrameAlloc::new(nr_frames),
            lru: new_policy(lru_gen),
            wmark,
            kswapd: KswapdWait::default(),
            pgdat_dirty: AtomicBool::new(false),
            peak_resident: AtomicU64::new(0),
        }
    }
    /// Frames in the budget (`node_present_pages`).
    pub(crate) fn nr_frames(&self) -> u64 {
        self.frames.nr() as u64
    }
    /// Frames in use.
    pub(crate) fn resident_pages(&self) -> u64 {
        self.nr_frames() - self.frames.nr_free()
    }
    /// Records the resident high-water mark.
    pub(crate) fn note_resident(&self) {
        let r = self.resident_pages();
        self.peak_resident.fetch_max(r, Ordering::Relaxed);
    }
}

/// The policy the settings select (`lru_gen=on|off`).
pub(crate) fn new_policy(lru_gen: bool) -> Box<dyn ReplacementPolicy> {
    if lru_gen {
        Box::new(super::lru_gen::LruGen::default())
    } else {
        Box::new(super::lru::Lruvec::default())
    }
}
