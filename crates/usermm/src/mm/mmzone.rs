//! The memory node (`struct pglist_data` in include/linux/mmzone.h): the page descriptors of
//! the budget's frames, the free-frame allocator, the LRU lists, the watermarks and kswapd's
//! wait state. One node per manager; it owns no policy (reclaim is vmscan.rs, allocation
//! page_alloc.rs).

use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use crate::sys::PAGE_SIZE;

use super::memcontrol::MemCgroup;
use super::page::{pg, FrameAlloc, MemMap, Pfn};
use super::replacement::ReplacementPolicy;
use crate::conv::Narrow;

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

/// The node's one-reclaim-pass-at-a-time state: whether a pass runs, and the waitqueue of
/// reclaimers waiting for it to end (Linux's `pgdat->reclaim_wait`).
#[derive(Debug, Default)]
pub struct ReclaimPass {
    running: Mutex<bool>,
    done: Condvar,
}

/// A running reclaim pass; the next may start when it is dropped.
#[derive(Debug)]
pub struct PassGuard<'a>(&'a ReclaimPass);

impl Drop for PassGuard<'_> {
    fn drop(&mut self) {
        *self.0.running.lock() = false;
        self.0.done.notify_all();
    }
}

impl ReclaimPass {
    /// Starts a pass once the running one (if any) has ended.
    pub fn begin(&self) -> PassGuard<'_> {
        let mut r = self.running.lock();
        while *r {
            r = self.done.wait(r);
        }
        *r = true;
        PassGuard(self)
    }

    /// Starts a pass if none runs; otherwise waits up to `timeout` for the running one to end
    /// or for `enough()` to hold (checked whenever a pass ends, and every millisecond);
    /// `waited` is called once if it had to wait.
    pub fn begin_or_wait(
        &self,
        timeout: std::time::Duration,
        mut enough: impl FnMut() -> bool,
        waited: impl FnOnce(),
    ) -> PassWait<'_> {
        let start = std::time::Instant::now();
        let mut r = self.running.lock();
        if *r {
            waited();
        }
        while *r {
            drop(r);
            if enough() {
                return PassWait::Enough;
            }
            if start.elapsed() > timeout {
                return PassWait::TimedOut;
            }
            r = self.running.lock();
            if *r {
                r = self.done.wait_for(r, std::time::Duration::from_millis(1));
            }
        }
        *r = true;
        PassWait::Run(PassGuard(self))
    }
}

/// How [`ReclaimPass::begin_or_wait`] ended.
#[derive(Debug)]
pub enum PassWait<'a> {
    /// No other pass runs now: this one, until dropped.
    Run(PassGuard<'a>),
    /// `enough()` held while another pass ran.
    Enough,
    /// Another pass still runs after the timeout.
    TimedOut,
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
    /// Whether a reclaim pass (`shrink_node`) is running: kswapd's, a direct reclaimer's or a
    /// budget shrink's. One pass at a time, because concurrent passes only contend: every
    /// unmapping `UFFDIO_MOVE` takes the source VMA's anon_vma rwsem for writing and flushes
    /// TLBs, so three reclaimers spent 12% of all CPU spinning on that rwsem and IPIing each
    /// other (vmscan.rs, `throttle_direct_reclaim`).
    pub(crate) reclaim: ReclaimPass,
    /// PGDAT_DIRTY: reclaim found only dirty, unqueued file pages at the LRU tail.
    pub(crate) pgdat_dirty: AtomicBool,
    /// The most frames ever in use at once.
    pub(crate) peak_resident: AtomicU64,
    /// The budget this manager shares with the other processes of its tree (memcontrol.rs):
    /// every frame in use is charged to it.
    pub(crate) memcg: Option<MemCgroup>,
    /// Free frames whose pool slots still hold a page (kept charged to the group).
    pub(crate) pooled_free: AtomicU64,
}

impl Node {
    /// `lru_gen`: the multi-gen LRU, else the two-list LRU.
    pub(crate) fn new(
        nr_frames: u32,
        wmark: Watermarks,
        lru_gen: bool,
        memcg: Option<MemCgroup>,
    ) -> Node {
        Node {
            pages: MemMap::new(nr_frames),
            frames: FrameAlloc::new(nr_frames),
            lru: new_policy(lru_gen),
            wmark,
            kswapd: KswapdWait::default(),
            reclaim: ReclaimPass::default(),
            pgdat_dirty: AtomicBool::new(false),
            peak_resident: AtomicU64::new(0),
            memcg,
            pooled_free: AtomicU64::new(0),
        }
    }
    /// Free frames for every watermark decision: the node's own, or fewer when the group's
    /// shared budget has less left (the cgroup's margin, as Linux checks a memcg's limit before
    /// the zone's watermarks). Free frames whose pool slots still hold a page (PG_pooled, kept
    /// for reuse) stay charged, so this node may use them beyond the margin.
    pub(crate) fn nr_free(&self) -> u64 {
        let own = self.frames.nr_free();
        self.memcg.as_ref().map_or(own, |g| {
            own.min(g.margin() + self.pooled_free.load(Ordering::Relaxed))
        })
    }
    /// Takes up to `n` free frames into `out`; returns how many. In a group, a frame whose slot
    /// is empty is charged first (one that holds a pooled page is charged already), and those
    /// the group's limit leaves no room for go back.
    pub(crate) fn alloc_frames(&self, n: usize, out: &mut Vec<Pfn>) -> usize {
        let Some(g) = &self.memcg else {
            return self.frames.alloc(n, out);
        };
        if g.margin() == 0 && self.pooled_free.load(Ordering::Relaxed) == 0 {
            g.signal_pressure();
            return 0;
        }
        let start = out.len();
        let got = self.frames.alloc(n, out);
        let fresh = out[start..]
            .iter()
            .filter(|&&f| !self.pages[f].test(pg::POOLED))
            .count();
        self.pooled_free
            .fetch_sub((got - fresh) as u64, Ordering::Relaxed);
        let short = fresh - g.try_charge(fresh as u64).usize();
        if short > 0 || g.margin() < self.wmark.low {
            // The group nears its limit: its members' reclaimers give back their shares.
            g.signal_pressure();
        }
        if short > 0 {
            // Give back the last `short` fresh frames (keeping the others' order: runs).
            let mut back = Vec::with_capacity(short);
            let mut i = out.len();
            while back.len() < short && i > start {
                i -= 1;
                if !self.pages[out[i]].test(pg::POOLED) {
                    back.push(out.remove(i));
                }
            }
            self.frames.free(&back);
        }
        out.len() - start
    }
    /// Returns frames to the free pool; in a group, uncharges those whose slots are empty.
    pub(crate) fn free_frames(&self, frames: &[Pfn]) {
        let Some(g) = &self.memcg else {
            self.frames.free(frames);
            return;
        };
        let pooled = frames
            .iter()
            .filter(|&&f| self.pages[f].test(pg::POOLED))
            .count();
        self.pooled_free.fetch_add(pooled as u64, Ordering::Relaxed);
        self.frames.free(frames);
        g.uncharge((frames.len() - pooled) as u64);
    }
    /// Takes up to `n` free frames whose slots hold a pooled page (to empty and free them,
    /// `pool::drain_pooled`), so the group gets their charge back.
    pub(crate) fn take_pooled_free(&self, n: usize, out: &mut Vec<Pfn>) -> usize {
        let got = self
            .frames
            .take_matching(n, |f| self.pages[f].test(pg::POOLED), out);
        self.pooled_free.fetch_sub(got as u64, Ordering::Relaxed);
        got
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

#[cfg(test)]
mod tests {
    use super::{PassWait, ReclaimPass};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn one_reclaim_pass_at_a_time() {
        let rp = ReclaimPass::default();
        let inside = AtomicU32::new(0);
        let most = AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (rp, inside, most) = (&rp, &inside, &most);
                s.spawn(move || {
                    for _ in 0..200 {
                        let _pass = if t == 0 {
                            Some(rp.begin())
                        } else {
                            match rp.begin_or_wait(Duration::from_secs(10), || false, || {}) {
                                PassWait::Run(pass) => Some(pass),
                                w => panic!("a pass ends well within 10 s: {w:?}"),
                            }
                        };
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1, "two passes overlapped");
    }

    #[test]
    fn a_waiting_reclaimer_leaves_when_frames_are_free_or_gives_up() {
        let rp = ReclaimPass::default();
        let pass = rp.begin();
        // Another pass runs: the waiter counts the wait and returns once `enough` holds.
        let freed = AtomicBool::new(false);
        let mut waited = false;
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                freed.store(true, Ordering::SeqCst);
            });
            let r = rp.begin_or_wait(
                Duration::from_secs(10),
                || freed.load(Ordering::SeqCst),
                || waited = true,
            );
            assert!(
                matches!(r, PassWait::Enough),
                "frames freed: allocate, no pass of its own"
            );
        });
        assert!(waited);
        // Nothing freed and the pass never ends: it gives up after the timeout.
        let t = Instant::now();
        let r = rp.begin_or_wait(Duration::from_millis(30), || false, || {});
        assert!(matches!(r, PassWait::TimedOut));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // The pass ends: the waiter runs the next one.
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                drop(pass);
            });
            let r = rp.begin_or_wait(Duration::from_secs(10), || false, || {});
            assert!(matches!(r, PassWait::Run(_)));
        });
        // Free: starts at once without counting a wait.
        let mut waited = false;
        assert!(matches!(
            rp.begin_or_wait(Duration::ZERO, || false, || waited = true),
            PassWait::Run(_)
        ));
        assert!(!waited);
    }
}
