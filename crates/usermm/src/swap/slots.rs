//! Swap slot allocation: which slots of a swap device are in use, handed out cluster by cluster.
//! Mirrors the cluster allocator of `mm/swapfile.c` (`swap_cluster_info`, the free-cluster list,
//! `cluster_alloc_swap_entry`, the non-full-cluster scan and `swap_entry_range_free`).
//!
//! Slots are grouped into clusters of [`SWAPFILE_CLUSTER`] slots. Allocation continues in the
//! current cluster in slot order, so consecutive calls and the slots of one batch are consecutive
//! and the device sees sequential writes. When the current cluster is used up, a wholly free
//! cluster is taken from the free-cluster list (FIFO, like Linux's `free_clusters`); only when
//! none is left are partially used clusters scanned for holes. That is Linux's order for a
//! device that wants discards (`SWP_PAGE_DISCARD`: spread the writes). A memory device
//! ([`SwapSlots::with_order`], the RAM device: its slots cost memory from their first write)
//! gets Linux's order for the others: the holes of partially used clusters first
//! (`nonfull_clusters`, most recently holed first), then the most recently freed wholly free
//! cluster (warm), and a never-used cluster last, so the memory it holds follows the data
//! swapped out rather than growing to the device's size under random swap-ins. Unlike Linux,
//! slot 0 is usable (there is no swap header page).
//!
//! State is one bit per slot plus a use counter per cluster, all behind one mutex; the number of
//! free slots is mirrored in an atomic so [`SwapSlots::nr_free`] takes no lock.

use crate::sync::{AtomicU64, Ordering};
use std::collections::VecDeque;

use crate::conv::Narrow;
use crate::sync::Mutex;

/// Slots per cluster (Linux `SWAPFILE_CLUSTER` with 4 KiB pages: 256 slots = 1 MiB).
pub const SWAPFILE_CLUSTER: u64 = 256;

const WORDS_PER_CLUSTER: usize = (SWAPFILE_CLUSTER / 64) as usize;

/// The slot allocator of one swap device. `Send + Sync`; all methods take `&self`.
#[derive(Debug)]
pub struct SwapSlots {
    nr_pages: u64,
    /// Free slots, updated under the lock, readable without it.
    nr_free: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// One bit per slot, set while the slot is allocated.
    bitmap: Vec<u64>,
    /// Allocated slots per cluster (Linux `swap_cluster_info.count`).
    used: Vec<u16>,
    /// Whether a cluster is on `free_clusters` (so it is never queued twice).
    on_free_list: Vec<bool>,
    /// Wholly free clusters, taken from the front and returned to the back.
    free_clusters: VecDeque<u32>,
    /// The cluster allocation continues in and the next slot to try in it (Linux's per-cpu
    /// cluster `next`), or None when a new cluster must be chosen.
    current: Option<(u32, u64)>,
    /// Where the scan for partially used clusters resumes (Linux `cluster_next`).
    scan_cursor: u32,
    /// Wholly free clusters the device is discarding (`CLUSTER_FLAG_DISCARD`): allocated from
    /// by nobody until [`SwapSlots::discard_done`].
    discarding: Vec<bool>,
    /// Partially used clusters with holes, most recently holed first (Linux
    /// `nonfull_clusters`); kept for a memory device only (`lifo`). Entries whose cluster
    /// filled up or emptied since are skipped when popped.
    nonfull: VecDeque<u32>,
    /// Whether a cluster has an entry in `nonfull`.
    on_nonfull: Vec<bool>,
    /// A memory device: holes first, and a freed cluster goes to the front of `free_clusters`
    /// (reused first) instead of the back.
    lifo: bool,
}

/// What `free` found, reported after the lock is released.
enum FreeOutcome {
    Freed,
    OutOfRange,
    NotAllocated,
}

impl SwapSlots {
    /// An allocator for a device of `nr_pages` slots, all free; wholly free clusters are
    /// reused in the order they were freed (Linux's FIFO).
    pub fn new(nr_pages: u64) -> Self {
        Self::with_order(nr_pages, false)
    }

    /// [`SwapSlots::new`], with `lifo` for a memory device: the holes of partially used
    /// clusters are filled first, then the most recently freed cluster is reused
    /// ([`SwapDevice::reuse_freed_first`](super::SwapDevice::reuse_freed_first)).
    pub fn with_order(nr_pages: u64, lifo: bool) -> Self {
        let nr_clusters = nr_pages.div_ceil(SWAPFILE_CLUSTER);
        let nr_clusters_u32 =
            u32::try_from(nr_clusters).expect("swap device too large for the cluster index");
        let inner = Inner {
            bitmap: vec![0; nr_clusters.usize() * WORDS_PER_CLUSTER],
            used: vec![0; nr_clusters.usize()],
            on_free_list: vec![true; nr_clusters.usize()],
            free_clusters: (0..nr_clusters_u32).collect(),
            current: None,
            scan_cursor: 0,
            discarding: vec![false; nr_clusters.usize()],
            nonfull: VecDeque::new(),
            on_nonfull: vec![false; nr_clusters.usize()],
            lifo,
        };
        SwapSlots {
            nr_pages,
            nr_free: AtomicU64::new(nr_pages),
            inner: Mutex::new(inner),
        }
    }

    /// Capacity in slots.
    pub fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    /// Slots not allocated right now.
    pub fn nr_free(&self) -> u64 {
        self.nr_free.load(Ordering::Relaxed)
    }

    /// Whether `slot` is allocated (false for slots past the end).
    pub fn is_allocated(&self, slot: u64) -> bool {
        if slot >= self.nr_pages {
            return false;
        }
        let inner = self.inner.lock();
        inner.bitmap[(slot / 64) as usize] & (1 << (slot % 64)) != 0
    }

    /// Allocates up to `n` slots, appending them to `out`, and returns how many it got: fewer than
    /// `n` only when the device is full. Slots come in increasing order within the current
    /// cluster, so a batch, and consecutive batches, get consecutive slots while clusters last.
    pub fn alloc<T: From<u64>>(&self, n: usize, out: &mut Vec<T>) -> usize {
        if n == 0 {
            return 0;
        }
        let mut inner = self.inner.lock();
        let free_before = self.nr_free.load(Ordering::Relaxed);
        let want = (n as u64).min(free_before).usize();
        out.reserve(want);
        let mut got = 0usize;
        while got < want {
            let Some((cluster, next)) = inner.current else {
                match inner.pick_cluster(self.nr_pages) {
                    Some(c) => {
                        inner.current = Some((c, u64::from(c) * SWAPFILE_CLUSTER));
                        continue;
                    }
                    None => break,
                }
            };
            let end = cluster_end(cluster, self.nr_pages);
            match inner.next_free_in(next, end) {
                Some(slot) => {
                    inner.bitmap[(slot / 64) as usize] |= 1 << (slot % 64);
                    inner.used[cluster as usize] += 1;
                    inner.current = Some((cluster, slot + 1));
                    out.push(T::from(slot));
                    got += 1;
                }
                None => {
                    // The current cluster is used up from `next` on; let it go. If everything in
                    // it was freed meanwhile it is wholly free again.
                    inner.current = None;
                    if inner.used[cluster as usize] == 0 {
                        inner.push_free(cluster);
                    } else {
                        // Slots freed behind the cursor while it was current.
                        inner.push_nonfull(cluster, self.nr_pages);
                    }
                }
            }
        }
        self.nr_free
            .store(free_before - got as u64, Ordering::Relaxed);
        debug_assert!(
            got == want || inner.discarding.iter().any(|&d| d),
            "allocator found {got} of {want} free slots"
        );
        got
    }

    /// Marks the free slots `[start, start+n)` allocated (a swap device that starts with data
    /// in them: the slots a fork child inherits, see `swap/inherit.rs`). Returns how many were
    /// free and are now allocated; a slot already allocated, or past the end, is left as it is.
    pub fn reserve(&self, start: u64, n: u64) -> u64 {
        let end = start.saturating_add(n).min(self.nr_pages);
        let mut inner = self.inner.lock();
        let mut got = 0;
        for slot in start..end {
            let word = (slot / 64) as usize;
            let bit = 1u64 << (slot % 64);
            if inner.bitmap[word] & bit == 0 {
                inner.bitmap[word] |= bit;
                inner.used[(slot / SWAPFILE_CLUSTER) as usize] += 1;
                got += 1;
            }
        }
        // A cluster filled up here stays queued; `pick_cluster` skips full ones.
        self.nr_free.fetch_sub(got, Ordering::Relaxed);
        got
    }

    /// Frees `slot` like [`SwapSlots::free`], except that a cluster this leaves wholly free is
    /// returned instead of queued for allocation: the caller discards it on the device and then
    /// calls [`SwapSlots::discard_done`].
    pub fn free_for_discard(&self, slot: u64) -> Option<u32> {
        self.free_inner(slot, true)
    }

    /// The slots of `cluster`: (first slot, count).
    pub fn cluster_range(&self, cluster: u32) -> (u64, u64) {
        let start = u64::from(cluster) * SWAPFILE_CLUSTER;
        (start, cluster_len(cluster, self.nr_pages))
    }

    /// The device has discarded `cluster` (from [`SwapSlots::free_for_discard`]): it may be
    /// allocated again.
    pub fn discard_done(&self, cluster: u32) {
        let mut inner = self.inner.lock();
        if std::mem::take(&mut inner.discarding[cluster as usize]) {
            inner.push_free(cluster);
        }
    }

    /// Frees `slot`. Freeing a slot that is not allocated (or past the end) is a bug in the caller:
    /// it panics in debug builds and is logged and ignored in release builds, so counts stay right.
    pub fn free(&self, slot: u64) {
        self.free_inner(slot, false);
    }

    fn free_inner(&self, slot: u64, discard: bool) -> Option<u32> {
        let mut held = None;
        let outcome = if slot >= self.nr_pages {
            FreeOutcome::OutOfRange
        } else {
            let mut inner = self.inner.lock();
            let word = (slot / 64) as usize;
            let bit = 1u64 << (slot % 64);
            if inner.bitmap[word] & bit == 0 {
                FreeOutcome::NotAllocated
            } else {
                inner.bitmap[word] &= !bit;
                let cluster = (slot / SWAPFILE_CLUSTER).u32();
                inner.used[cluster as usize] -= 1;
                if inner.used[cluster as usize] == 0
                    && inner.current.map(|(c, _)| c) != Some(cluster)
                {
                    if discard && !inner.on_free_list[cluster as usize] {
                        inner.discarding[cluster as usize] = true;
                        held = Some(cluster);
                    } else {
                        inner.push_free(cluster);
                    }
                } else if inner.current.map(|(c, _)| c) != Some(cluster) {
                    inner.push_nonfull(cluster, self.nr_pages);
                }
                self.nr_free.fetch_add(1, Ordering::Relaxed);
                FreeOutcome::Freed
            }
        };
        let msg = match outcome {
            FreeOutcome::Freed => return held,
            FreeOutcome::OutOfRange => format!(
                "swap slot {slot} freed but the device has {} slots",
                self.nr_pages
            ),
            FreeOutcome::NotAllocated => {
                format!("swap slot {slot} freed twice (or never allocated)")
            }
        };
        log::error!("{msg}");
        if cfg!(debug_assertions) {
            panic!("{msg}");
        }
        None
    }
}

/// One past the last slot of `cluster` (the last cluster may be short).
fn cluster_end(cluster: u32, nr_pages: u64) -> u64 {
    ((u64::from(cluster) + 1) * SWAPFILE_CLUSTER).min(nr_pages)
}

/// Slots in `cluster` (the last cluster may be short).
fn cluster_len(cluster: u32, nr_pages: u64) -> u64 {
    cluster_end(cluster, nr_pages) - u64::from(cluster) * SWAPFILE_CLUSTER
}

impl Inner {
    fn push_free(&mut self, cluster: u32) {
        if !self.on_free_list[cluster as usize] {
            self.on_free_list[cluster as usize] = true;
            if self.lifo {
                self.free_clusters.push_front(cluster);
            } else {
                self.free_clusters.push_back(cluster);
            }
        }
    }

    /// Whether cluster `c` is partially used, and neither queued as free nor being
    /// discarded: a cluster whose holes `nonfull` may offer.
    fn is_nonfull(&self, c: u32, nr_pages: u64) -> bool {
        let ci = c as usize;
        self.used[ci] > 0
            && u64::from(self.used[ci]) < cluster_len(c, nr_pages)
            && !self.on_free_list[ci]
            && !self.discarding[ci]
    }

    /// A memory device's cluster `c` has a hole and is not current: queue it on `nonfull`
    /// (front: its freed slots' memory is the warmest) unless it has an entry already.
    fn push_nonfull(&mut self, c: u32, nr_pages: u64) {
        if self.lifo && !self.on_nonfull[c as usize] && self.is_nonfull(c, nr_pages) {
            self.on_nonfull[c as usize] = true;
            self.nonfull.push_front(c);
        }
    }

    /// The next cluster to allocate from: on a memory device a partially used one from
    /// `nonfull` first; then a wholly free one if any, else the next partially used one after
    /// the scan cursor. None when every cluster is full.
    fn pick_cluster(&mut self, nr_pages: u64) -> Option<u32> {
        while let Some(c) = self.nonfull.pop_front() {
            self.on_nonfull[c as usize] = false;
            // Skipped: filled up since (by the scan), or emptied (then on the free list or
            // being discarded).
            if self.is_nonfull(c, nr_pages) {
                return Some(c);
            }
        }
        while let Some(c) = self.free_clusters.pop_front() {
            self.on_free_list[c as usize] = false;
            // A queued cluster may have been reused by the partial scan since; take it only if it
            // still has room (it normally is wholly free).
            if u64::from(self.used[c as usize]) < cluster_len(c, nr_pages) {
                return Some(c);
            }
        }
        let nr_clusters = self.used.len().u32();
        for i in 0..nr_clusters {
            let c = (self.scan_cursor + i) % nr_clusters;
            if u64::from(self.used[c as usize]) < cluster_len(c, nr_pages)
                && !self.discarding[c as usize]
            {
                self.scan_cursor = (c + 1) % nr_clusters;
                return Some(c);
            }
        }
        None
    }

    /// The first clear bit in `[from, end)`, which lies within one cluster.
    fn next_free_in(&self, from: u64, end: u64) -> Option<u64> {
        let mut slot = from;
        while slot < end {
            let word = self.bitmap[(slot / 64) as usize] >> (slot % 64);
            let run = u64::from(word.trailing_ones()).min(64 - slot % 64);
            if run < 64 - slot % 64 {
                let found = slot + run;
                return (found < end).then_some(found);
            }
            slot += run;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn alloc_vec(s: &SwapSlots, n: usize) -> Vec<u64> {
        let mut v = Vec::new();
        let got = s.alloc(n, &mut v);
        assert_eq!(got, v.len());
        v
    }

    #[test]
    fn clusters_freed_for_discard_wait_for_it() {
        let s = SwapSlots::new(2 * SWAPFILE_CLUSTER);
        let a = alloc_vec(&s, SWAPFILE_CLUSTER.usize() + 1); // cluster 0 full, current is 1
        for &x in &a[..SWAPFILE_CLUSTER.usize() - 1] {
            assert_eq!(s.free_for_discard(x), None);
        }
        assert_eq!(s.free_for_discard(a[SWAPFILE_CLUSTER.usize() - 1]), Some(0));
        assert_eq!(s.cluster_range(0), (0, SWAPFILE_CLUSTER));
        // Cluster 1 fills up; cluster 0 is free but being discarded: nothing to hand out.
        let b = alloc_vec(&s, 2 * SWAPFILE_CLUSTER.usize());
        assert_eq!(b.len(), SWAPFILE_CLUSTER.usize() - 1);
        assert!(b.iter().all(|&x| x >= SWAPFILE_CLUSTER));
        s.discard_done(0);
        let c = alloc_vec(&s, 3);
        assert_eq!(c, vec![0, 1, 2]);
    }

    #[test]
    fn reserved_slots_are_never_handed_out_until_freed() {
        let s = SwapSlots::new(3 * SWAPFILE_CLUSTER);
        assert_eq!(s.reserve(100, 2 * SWAPFILE_CLUSTER), 2 * SWAPFILE_CLUSTER);
        assert_eq!(
            s.reserve(100, 1),
            0,
            "an allocated slot is not reserved twice"
        );
        assert_eq!(s.nr_free(), SWAPFILE_CLUSTER);
        let got: BTreeSet<u64> = alloc_vec(&s, 3 * SWAPFILE_CLUSTER.usize())
            .into_iter()
            .collect();
        assert_eq!(got.len(), SWAPFILE_CLUSTER.usize());
        assert!(got
            .iter()
            .all(|&x| !(100..100 + 2 * SWAPFILE_CLUSTER).contains(&x)));
        s.free(150);
        assert_eq!(alloc_vec(&s, 1), vec![150]);
    }

    #[test]
    fn sequential_batches_are_consecutive() {
        let s = SwapSlots::new(4 * SWAPFILE_CLUSTER);
        let a = alloc_vec(&s, 10);
        let b = alloc_vec(&s, 7);
        let c = alloc_vec(&s, 300); // crosses into the next cluster
        let all: Vec<u64> = a.iter().chain(&b).chain(&c).copied().collect();
        assert_eq!(all, (0..317).collect::<Vec<_>>());
        assert_eq!(s.nr_free(), 4 * SWAPFILE_CLUSTER - 317);
    }

    #[test]
    fn slot_zero_is_usable() {
        let s = SwapSlots::new(1);
        assert_eq!(alloc_vec(&s, 1), vec![0]);
        assert_eq!(s.nr_free(), 0);
    }

    #[test]
    fn alloc_until_full_returns_short_counts() {
        let s = SwapSlots::new(SWAPFILE_CLUSTER + 10); // short last cluster
        let a = alloc_vec(&s, 200);
        assert_eq!(a.len(), 200);
        let b = alloc_vec(&s, 200);
        assert_eq!(b.len(), 66);
        assert_eq!(b, (200..266).collect::<Vec<_>>());
        assert_eq!(s.nr_free(), 0);
        assert_eq!(alloc_vec(&s, 5).len(), 0);
        let mut out = vec![99u64];
        assert_eq!(s.alloc(3, &mut out), 0);
        assert_eq!(out, vec![99], "alloc appends and never clears");
    }

    #[test]
    fn empty_device_and_zero_requests() {
        let s = SwapSlots::new(0);
        assert_eq!(alloc_vec(&s, 4).len(), 0);
        assert_eq!(s.nr_free(), 0);
        let s = SwapSlots::new(10);
        assert_eq!(alloc_vec(&s, 0).len(), 0);
        assert_eq!(s.nr_free(), 10);
    }

    #[test]
    fn free_then_realloc() {
        let s = SwapSlots::new(SWAPFILE_CLUSTER);
        let a = alloc_vec(&s, SWAPFILE_CLUSTER.usize());
        assert_eq!(s.nr_free(), 0);
        for &slot in &[5u64, 6, 100, 255] {
            s.free(slot);
            assert!(!s.is_allocated(slot));
        }
        assert_eq!(s.nr_free(), 4);
        let b = alloc_vec(&s, 10);
        assert_eq!(b, vec![5, 6, 100, 255]);
        assert_eq!(s.nr_free(), 0);
        assert!(a.iter().all(|&x| s.is_allocated(x)));
    }

    #[test]
    fn free_clusters_reused_before_partial_ones() {
        let s = SwapSlots::new(4 * SWAPFILE_CLUSTER);
        let all = alloc_vec(&s, 4 * SWAPFILE_CLUSTER.usize());
        assert_eq!(all.len(), 1024);
        // Holes in clusters 0 and 3, cluster 2 wholly freed.
        s.free(3);
        s.free(3 * SWAPFILE_CLUSTER + 9);
        for slot in 2 * SWAPFILE_CLUSTER..3 * SWAPFILE_CLUSTER {
            s.free(slot);
        }
        let b = alloc_vec(&s, SWAPFILE_CLUSTER.usize());
        assert_eq!(
            b,
            (2 * SWAPFILE_CLUSTER..3 * SWAPFILE_CLUSTER).collect::<Vec<_>>()
        );
        // Then the holes, found by the partial scan.
        let mut c = alloc_vec(&s, 10);
        c.sort_unstable();
        assert_eq!(c, vec![3, 3 * SWAPFILE_CLUSTER + 9]);
        assert_eq!(s.nr_free(), 0);
    }

    #[test]
    fn lifo_order_reuses_the_last_freed_cluster_first() {
        let c = SWAPFILE_CLUSTER;
        for lifo in [false, true] {
            let s = SwapSlots::with_order(4 * c, lifo);
            let a = alloc_vec(&s, 4 * c.usize());
            assert_eq!(a.len(), 4 * c.usize());
            // Cluster 0 wholly freed, then cluster 1.
            for slot in (0..c).chain(c..2 * c) {
                s.free(slot);
            }
            let b = alloc_vec(&s, 1);
            let want = if lifo { c } else { 0 };
            assert_eq!(b, vec![want], "lifo {lifo}");
        }
    }

    #[test]
    fn memory_order_fills_holes_before_free_and_never_used_clusters() {
        let c = SWAPFILE_CLUSTER;
        let s = SwapSlots::with_order(8 * c, true);
        assert_eq!(alloc_vec(&s, 4 * c.usize()).len(), 4 * c.usize());
        // Cluster 1 wholly freed (warm), holes in clusters 0 and 2 (2 holed last).
        for slot in c..2 * c {
            s.free(slot);
        }
        s.free(7);
        s.free(2 * c + 5);
        s.free(2 * c + 6);
        // The current cluster (3) is full; the holes come first, the last holed cluster first.
        assert_eq!(alloc_vec(&s, 3), vec![2 * c + 5, 2 * c + 6, 7]);
        // Then the warm cluster, not the never-used 4..8.
        assert_eq!(alloc_vec(&s, 2), vec![c, c + 1]);
        // A slot freed behind the cursor of the current cluster is found once it moves on.
        s.free(c);
        assert_eq!(alloc_vec(&s, (c - 2).usize()).last(), Some(&(2 * c - 1)));
        assert_eq!(alloc_vec(&s, 1), vec![c]);
        assert_eq!(alloc_vec(&s, 1), vec![4 * c], "then a never-used cluster");
    }

    #[test]
    fn current_cluster_freed_completely_is_reused() {
        let s = SwapSlots::new(2 * SWAPFILE_CLUSTER);
        let a = alloc_vec(&s, 10);
        for x in a {
            s.free(x);
        }
        // Allocation carries on in the current cluster after slot 9.
        assert_eq!(alloc_vec(&s, 2), vec![10, 11]);
        s.free(10);
        s.free(11);
        assert_eq!(s.nr_free(), 2 * SWAPFILE_CLUSTER);
        let rest = alloc_vec(&s, 2 * SWAPFILE_CLUSTER.usize());
        assert_eq!(rest.len(), 512);
        assert_eq!(rest.iter().copied().collect::<BTreeSet<_>>().len(), 512);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "freed twice")]
    fn double_free_panics_in_debug() {
        let s = SwapSlots::new(8);
        let a = alloc_vec(&s, 1);
        s.free(a[0]);
        s.free(a[0]);
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn double_free_is_ignored_in_release() {
        let s = SwapSlots::new(8);
        let a = alloc_vec(&s, 2);
        s.free(a[0]);
        s.free(a[0]);
        s.free(100);
        assert_eq!(s.nr_free(), 7);
        assert_eq!(alloc_vec(&s, 8).len(), 7);
    }

    #[test]
    fn concurrent_allocators_never_share_a_slot() {
        let s = SwapSlots::new(8 * SWAPFILE_CLUSTER + 3);
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let s = &s;
                    scope.spawn(move || {
                        let mut mine = Vec::new();
                        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                        for _ in 0..2000 {
                            seed = xorshift(seed);
                            match seed % 3 {
                                0 if !mine.is_empty() => {
                                    let i = (seed >> 8) as usize % mine.len();
                                    s.free(mine.swap_remove(i));
                                }
                                _ => {
                                    s.alloc((seed >> 16) as usize % 9, &mut mine);
                                }
                            }
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut seen = BTreeSet::new();
        for v in &per_thread {
            for &x in v {
                assert!(seen.insert(x), "slot {x} handed out twice");
                assert!(s.is_allocated(x));
            }
        }
        assert_eq!(s.nr_free(), s.nr_pages() - seen.len() as u64);
    }

    fn xorshift(mut x: u64) -> u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..80).prop_map(Op::Alloc),
            any::<usize>().prop_map(Op::Free)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Against a model set: no slot handed out twice, short counts only when full, counts
        /// always agree, and a batch that fits in the current cluster is consecutive.
        #[test]
        fn no_slot_handed_out_twice(nr in 1u64..1200, lifo: bool, ops in proptest::collection::vec(op(), 1..200)) {
            let s = SwapSlots::with_order(nr, lifo);
            let mut live: Vec<u64> = Vec::new();
            let mut set: BTreeSet<u64> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Alloc(n) => {
                        let mut out = Vec::new();
                        let got = s.alloc(n, &mut out);
                        prop_assert_eq!(got, out.len());
                        prop_assert_eq!(got as u64, (n as u64).min(nr - set.len() as u64));
                        for &x in &out {
                            prop_assert!(x < nr);
                            prop_assert!(set.insert(x), "slot {} handed out twice", x);
                        }
                        live.extend(out);
                    }
                    Op::Free(i) => {
                        if !live.is_empty() {
                            let x = live.swap_remove(i % live.len());
                            set.remove(&x);
                            s.free(x);
                        }
                    }
                }
                prop_assert_eq!(s.nr_free(), nr - set.len() as u64);
            }
        }

        /// A memory device's slots stay packed: a cluster never used before is taken only
        /// when every cluster used so far is full, so the clusters ever used (the memory the
        /// RAM device holds) stay within what the most slots ever live at once need, plus the
        /// current cluster. The workload is random swap-ins and swap-outs at a steady number of
        /// live slots (what a program whose working set exceeds its budget does), after a fill.
        #[test]
        fn memory_order_touches_no_more_clusters_than_the_peak_needs(
            clusters in 2u64..16,
            fill in 1u64..2000,
            rounds in proptest::collection::vec((1usize..64, any::<u64>()), 1..60),
        ) {
            let nr = clusters * 4 * SWAPFILE_CLUSTER;
            let s = SwapSlots::with_order(nr, true);
            let mut live: Vec<u64> = Vec::new();
            let mut touched: BTreeSet<u64> = BTreeSet::new();
            let fill = fill.min(nr / 2);
            s.alloc(fill.usize(), &mut live);
            touched.extend(live.iter().map(|x| x / SWAPFILE_CLUSTER));
            let peak = live.len() as u64;
            for (k, mut seed) in rounds {
                for _ in 0..k.min(live.len()) {
                    seed = xorshift(seed | 1);
                    let i = (seed % live.len() as u64).usize();
                    s.free(live.swap_remove(i));
                }
                let mut out: Vec<u64> = Vec::new();
                s.alloc(peak.usize() - live.len(), &mut out);
                touched.extend(out.iter().map(|x| x / SWAPFILE_CLUSTER));
                live.extend(out);
                prop_assert!(
                    touched.len() as u64 <= peak.div_ceil(SWAPFILE_CLUSTER) + 1,
                    "{} clusters used for {} live slots",
                    touched.len(),
                    peak
                );
            }
        }
    }
}
