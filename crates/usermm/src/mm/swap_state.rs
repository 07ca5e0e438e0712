//! The swap cache and swap-in readahead. Mirrors `mm/swap_state.c` (`add_to_swap_cache`,
//! `delete_from_swap_cache`, `lookup_swap_cache`, `swapin_nr_pages`, `swapin_readahead`: the
//! window, the reads, the parked readahead pages; `do_swap_page` in memory.rs maps the faulting
//! page) and the slot half of
//! `mm/swapfile.c` (`get_swap_pages`, `swap_free`, `vm_swap_full`).
//!
//! The swap cache (address spaces of 2^14 slots, flagged AS_NO_WRITEBACK_TAGS with the new
//! behaviour of seed 000) maps a swap slot to the frame holding its page while the page is in flight
//! (added at reclaim, removed when the page is freed) and after swap-in while the swap copy is
//! still valid, so a clean page is dropped without being written again.

use std::sync::Arc;

use crate::conv::Narrow;
use crate::swap::{SwapDevice, SwapSlots};
use crate::sync::Ordering;
use crate::sys::{Mapping, PAGE_SIZE};
use crate::vmstat::{Counters, Item};

use super::fs::{as_flags, AddressSpace, AddressSpaceOps, Host, Shadows};
use super::page::{pg, MappingId, Owner, Pfn, PgOff, Sections, SwapEntry};
use super::pgtable::{Pte, PteGuard};
use super::pool;
use super::region::{AccessPattern, RegionInner};
use super::MmInner;

/// Slots per swap-cache address space (`SWAP_ADDRESS_SPACE_SHIFT` = 14: 64 MiB each, as Linux
/// splits the swap cache since 4.11 to spread its tree lock).
pub const SWAP_ADDRESS_SPACE_PAGES: u64 = 1 << 14;

/// A manager's swap: the device, its slot allocator, its cache (address spaces indexed by slot).
pub struct SwapState {
    pub dev: Arc<dyn SwapDevice>,
    pub slots: SwapSlots,
    spaces: Vec<AddressSpace>,
    /// How many users each slot has beyond the first (the counts of Linux's `swap_map` above
    /// 1): a fork child's share of its parent's swapped pages (`swap_duplicate`, mm/fork.rs).
    /// Such a slot's contents never change; `swap_free` by any user but the last only drops a
    /// count. Allocated in chunks on first use: nothing unless the process forked.
    dup: DupCounts,
}

/// Per-slot counts of users beyond the first (see `SwapState::dup`): 16-bit counts made a
/// section at a time when a slot in it is first shared ([`Sections`], as the page descriptors
/// are). Lock-free: a count changes under the pte lock of the entry naming the slot or by a
/// user dropping its share. std atomics, not the `crate::sync` shim: this module is not built
/// under the model checker (the page state machine it checks is page_state.rs), and a count is
/// one atomic word.
struct DupCounts {
    counts: Sections<std::sync::atomic::AtomicU16>,
    /// Slots whose count is above zero.
    nr: std::sync::atomic::AtomicU64,
}

impl DupCounts {
    fn new(nr_pages: u64) -> DupCounts {
        DupCounts {
            counts: Sections::new(nr_pages.usize()),
            nr: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Slot `slot`'s count, its section made when `create`; None beyond the device.
    fn slot(&self, slot: u64, create: bool) -> Option<&std::sync::atomic::AtomicU16> {
        let i = slot.usize();
        if create && i < self.counts.len() {
            Some(&self.counts[i])
        } else {
            self.counts.get_made(i)
        }
    }

    fn get(&self, slot: u64) -> u16 {
        self.slot(slot, false)
            .map_or(0, |a| a.load(std::sync::atomic::Ordering::Acquire))
    }

    /// One more user of `slot`: (it gained one, it is shared for the first time); the first
    /// is false when the count is full (the caller copies instead of sharing).
    fn bump(&self, slot: u64) -> (bool, bool) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let Some(a) = self.slot(slot, true) else {
            return (false, false);
        };
        let r = a.fetch_update(AcqRel, Acquire, |n| n.checked_add(1));
        (r.is_ok(), r == Ok(0))
    }

    /// One more user; false when the count is full (the caller copies instead of sharing).
    fn inc(&self, slot: u64) -> bool {
        let (ok, first) = self.bump(slot);
        if first {
            self.nr.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ok
    }

    /// [`DupCounts::inc`] for each slot of `slots`, the count of shared slots updated once for
    /// the batch (a fork shares a quarter of a million slots per GiB swapped).
    fn inc_many(&self, slots: impl Iterator<Item = u64>) -> Vec<bool> {
        let mut first = 0;
        let ok = slots
            .map(|slot| {
                let (ok, f) = self.bump(slot);
                first += u64::from(f);
                ok
            })
            .collect();
        if first > 0 {
            self.nr
                .fetch_add(first, std::sync::atomic::Ordering::Relaxed);
        }
        ok
    }

    /// One user less if the slot has several; true if it had.
    fn dec(&self, slot: u64) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
        let Some(a) = self.slot(slot, false) else {
            return false;
        };
        let r = a.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        if r == Ok(1) {
            self.nr.fetch_sub(1, Relaxed);
        }
        r.is_ok()
    }
}

impl std::fmt::Debug for SwapState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapState")
            .field("dev", &self.dev.name())
            .field("slots", &self.slots)
            .field("cached", &self.cache_len())
            .finish_non_exhaustive()
    }
}

/// The swap cache's `address_space_operations` (`swap_aops`): its pages are written by
/// pageout (`swap_writepage`), not by the flushers, and its tree holds only pages.
#[derive(Debug)]
pub(crate) struct SwapAops;

/// The operations of the swap cache's spaces.
pub(crate) static SWAP_AOPS: SwapAops = SwapAops;

impl AddressSpaceOps for SwapAops {}

impl SwapState {
    /// `writeback_tags`: the old behaviour of seed 000 (the swap cache maintains writeback marks);
    /// false sets AS_NO_WRITEBACK_TAGS on every swap-cache space.
    pub fn new(dev: Arc<dyn SwapDevice>, writeback_tags: bool) -> SwapState {
        let slots = SwapSlots::with_order(dev.nr_pages(), dev.reuse_freed_first());
        let n = dev.nr_pages().div_ceil(SWAP_ADDRESS_SPACE_PAGES).max(1);
        let flags = as_flags::SWAP
            | if writeback_tags {
                0
            } else {
                as_flags::NO_WRITEBACK_TAGS
            };
        let dup = DupCounts::new(slots.nr_pages());
        SwapState {
            dev,
            slots,
            dup,
            spaces: (0..n)
                .map(|i| {
                    let mut space =
                        AddressSpace::new(MappingId::SWAP, Host::Swap, 0, flags, &SWAP_AOPS);
                    space.shadows = Shadows::for_slots(
                        i * SWAP_ADDRESS_SPACE_PAGES,
                        SWAP_ADDRESS_SPACE_PAGES.usize(),
                    );
                    space
                })
                .collect(),
        }
    }

    /// The swap-cache address space of `entry` (`swap_address_space`).
    pub fn space(&self, entry: SwapEntry) -> &AddressSpace {
        &self.spaces[(entry.offset() / SWAP_ADDRESS_SPACE_PAGES) as usize]
    }

    /// `get_swap_pages`: appends up to `n` free entries (in runs of consecutive slots where
    /// the device has them) to `out`; returns how many.
    pub fn get_swap_pages(&self, n: usize, out: &mut Vec<SwapEntry>) -> usize {
        self.slots.alloc(n, out)
    }

    /// `put_swap_folio`: returns an entry that was never written (its write failed) to the
    /// free slots, without a discard.
    pub fn put_swap_page(&self, entry: SwapEntry) {
        self.slots.free(entry.offset());
    }

    /// Pages in the swap cache.
    pub fn cache_len(&self) -> u64 {
        self.spaces
            .iter()
            .map(|s| s.nrpages.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// `vm_swap_full`: more than half the slots are in use, so swap-in should free slots rather
    /// than keep the swap copy.
    pub fn full(&self) -> bool {
        self.slots.nr_free() * 2 < self.slots.nr_pages()
    }

    /// Adds a page to the swap cache under `entry` (`__add_to_swap_cache`).
    pub fn add_to_cache(&self, entry: SwapEntry, frame: Pfn, vm: &Counters) {
        self.space(entry).add_swap_entry(vm, entry, frame);
        vm.inc(Item::NrSwapcache);
    }

    /// Removes `entry` from the swap cache (the slot itself stays allocated).
    pub fn delete_from_cache(&self, entry: SwapEntry, vm: &Counters) {
        if self.space(entry).remove_swap_entry(vm, entry) {
            vm.sub(Item::NrSwapcache, 1);
        }
    }

    /// `swap_duplicate`: one more user of the allocated slot `entry` (a fork child's share of a
    /// swapped page). The slot is freed when its last user frees it. False if `entry` is not
    /// allocated or already has the most users a count holds.
    pub fn swap_duplicate(&self, entry: SwapEntry) -> bool {
        self.slots.is_allocated(entry.offset()) && self.dup.inc(entry.offset())
    }

    /// [`SwapState::swap_duplicate`] for entries known allocated (the caller holds the pte lock
    /// of a page table entry naming each); returns, per entry, whether it gained a user.
    pub fn swap_duplicate_many(&self, entries: impl Iterator<Item = SwapEntry>) -> Vec<bool> {
        self.dup.inc_many(entries.map(|e| {
            debug_assert!(self.slots.is_allocated(e.offset()), "slot {e} is free");
            e.offset()
        }))
    }

    /// Whether slot `entry` has more than one user (its contents must not be rewritten: a
    /// dirty page that held it takes a new slot).
    pub fn swap_shared(&self, entry: SwapEntry) -> bool {
        self.dup.get(entry.offset()) > 0
    }

    /// Slots with more than one user (`swap_duplicate`), for the counters.
    pub fn nr_shared(&self) -> u64 {
        self.dup.nr.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drops one user of `entry` if it has several; true if it did (the slot stays).
    fn put_duplicate(&self, entry: SwapEntry) -> bool {
        self.dup.dec(entry.offset())
    }

    /// `swap_free`: releases an entry: removes it from the cache if present, frees its slot and
    /// lets the device drop its contents. A slot with other users (`swap_duplicate`) only
    /// loses this user (the page table's, or its cached page's): that page leaves the swap
    /// cache, the slot and its contents stay.
    pub fn swap_free(&self, entry: SwapEntry, vm: &Counters) {
        self.delete_from_cache(entry, vm);
        if self.put_duplicate(entry) {
            return;
        }
        self.free_slot(entry, vm);
    }

    /// Drops a use of `entry` taken by [`SwapState::swap_duplicate`] by a user that has no
    /// page in the swap cache (a fork child, a fork's copy): the slot is freed if this was its
    /// last use; a page of another user cached under it stays cached.
    pub fn swap_put(&self, entry: SwapEntry, vm: &Counters) {
        if !self.put_duplicate(entry) {
            self.delete_from_cache(entry, vm);
            self.free_slot(entry, vm);
        }
    }

    fn free_slot(&self, entry: SwapEntry, vm: &Counters) {
        self.space(entry)
            .shadows
            .forget(entry.cache_index(), entry.next().cache_index());
        let slot = entry.offset();
        self.dev.invalidate(slot);
        if let Some(cluster) = self.slots.free_for_discard(slot) {
            // A wholly free cluster, held off the free list until the device has released it
            // (`discard_swap_cluster`), so no new page can land in it meanwhile.
            let (start, n) = self.slots.cluster_range(cluster);
            if let Err(e) = self.dev.discard(start, n) {
                log::warn!(
                    "discarding swap slots {start}..{} on {}: {e}",
                    start + n,
                    self.dev.name()
                );
            }
            self.slots.discard_done(cluster);
        }
        vm.inc(Item::SwapSlotFree);
    }
}

/// `try_to_free_swap`: drops the swap copy of a page about to be written (a write fault), and
/// marks it dirty.
pub(crate) fn try_to_free_swap(m: &MmInner, f: Pfn) {
    let p = &m.node.pages[f];
    if p.test_clear(pg::SWAPCACHE) {
        if let Some(sw) = &m.swap {
            sw.swap_free(p.swap_entry(), &m.vm);
        }
    }
    p.set(pg::DIRTY);
}

/// Where a swap-in readahead window lies relative to the faulting page (`swap_vma_ra_win`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RaPlace {
    /// The faults walk up the region: the pages after the fault.
    Up,
    /// The faults walk down (GNU sort's line array, a reverse scan): the pages before it.
    Down,
    /// No direction: centred on the fault, `(win - 1) / 2` pages before it and the rest after.
    Around,
}

/// The swap-in readahead window of a major fault at page `idx` of `r` (`swapin_nr_pages` fed
/// with the region's readahead state: the last major fault, the readahead hits since, the last
/// window), at most `max` pages (`1 << page_cluster`), and where it lies: after the fault when
/// the faults walk up the region, before it when they walk down, centred on it otherwise, as
/// `swap_vma_ra_win` places it. (Several streams interleaved in one region, a merge pass, look
/// directionless; the centred window serves a stream going either way.)
///
/// The third value says the faults are a stream: they walk up the region and the program used
/// every page of the last window, of at least [`STREAM_MIN`] pages. do_swap_page then maps the
/// whole window at once instead of parking it.
pub(crate) fn swapin_window(r: &RegionInner, idx: PgOff, max: u32) -> (u32, RaPlace, bool) {
    let last = r.last_major.swap(idx.raw(), Ordering::Relaxed);
    let pattern = r.access_pattern();
    if pattern == AccessPattern::Random {
        // VM_RAND_READ: swap_vma_readahead reads only the faulting page.
        return (1, RaPlace::Up, false);
    }
    let prev_win = r.ra_win.load(Ordering::Relaxed);
    let prev = u64::from(prev_win);
    let (up, down) = if last == u64::MAX {
        (false, false)
    } else {
        let last = PgOff::new(last);
        (
            idx == last.next() || idx > last && idx - last <= 2 * prev,
            idx.next() == last || idx < last && last - idx <= 2 * prev,
        )
    };
    let seq = pattern == AccessPattern::Sequential || up || down;
    let hits = r.ra_hits.swap(0, Ordering::Relaxed);
    let win = swapin_nr_pages(hits, seq, prev_win, max);
    r.ra_win.store(win, Ordering::Relaxed);
    let place = if up || pattern == AccessPattern::Sequential && !down {
        RaPlace::Up
    } else if down {
        RaPlace::Down
    } else {
        RaPlace::Around
    };
    let stream = place == RaPlace::Up && prev_win >= STREAM_MIN && hits + 1 >= prev_win;
    (win, place, stream)
}

/// The smallest last window whose every page was used that makes the faults a stream
/// ([`swapin_window`]).
pub const STREAM_MIN: u32 = 32;

/// A swap-in window `do_swap_page` has read: page `k` of it is swap entry `slots[k]` (0: the
/// faulting page; page `at[k - 1]` of the region for the others, their entries locked in
/// `rest[k - 1]`), its contents at page `k` of `src` if `ok[k]`, for frame `frames[k]` (frames
/// beyond `slots` are spare).
pub(crate) struct SwapWindow<'a, 'g> {
    pub at: &'a [PgOff],
    pub slots: &'a [SwapEntry],
    pub frames: &'a [Pfn],
    pub ok: &'a [bool],
    pub rest: &'a mut [PteGuard<'g>],
    pub src: &'a SwapinSrc<'a>,
}

/// Where the pages a swap-in read are (see `page_io::swap_readpage_src`): page `k` at offset
/// `offs[k]` of `map`, the device's own memory (a device whose pages are in memory:
/// [`SwapDevice::pages_in_memory`](crate::swap::SwapDevice::pages_in_memory)) or the bounce
/// buffer they were read into. Callers copy from it into the view or the pool and hash it; they
/// never hold a slice of it.
pub(crate) struct SwapinSrc<'a> {
    pub map: &'a Mapping,
    pub offs: Vec<usize>,
    /// The pages are the device's own: a slot must not be freed before its page is copied out
    /// (a freed slot may be written again at once).
    pub in_device: bool,
}

impl SwapinSrc<'_> {
    /// The address of page `k`.
    pub fn addr(&self, k: usize) -> usize {
        self.map.addr() + self.offs[k]
    }

    /// Whether pages `a` and `b` (`a < b`) are `b - a` pages apart in `map`, so a run from `a`
    /// to `b` is one contiguous source.
    pub fn follows(&self, a: usize, b: usize) -> bool {
        self.offs[b] == self.offs[a] + (b - a) * PAGE_SIZE
    }

    /// The xxh3 hash of page `k`.
    pub fn hash_page(&self, k: usize) -> crate::sys::Result<u64> {
        self.map.hash_page(self.offs[k])
    }
}

/// `swapin_readahead`'s pages around the faulting one (pages 1.. of the window): each read
/// page is copied into its frame's pool slot and parked in the swap cache with PG_readahead,
/// its entry set to the frame; its next access is a minor fault. Returns the frames used and
/// those left over (read errors, spare frames).
pub(crate) fn park_readahead(
    m: &MmInner,
    sw: &SwapState,
    r: &RegionInner,
    w: SwapWindow<'_, '_>,
) -> (Vec<Pfn>, Vec<Pfn>) {
    let SwapWindow {
        at,
        slots,
        frames,
        ok,
        rest,
        src,
    } = w;
    let n = slots.len();
    let mut used = Vec::with_capacity(n);
    let mut unused: Vec<Pfn> = frames[n..].to_vec();
    let filled = if n > 1 {
        pool::fill_slots(m, &frames[1..n], &ok[1..n], src.map, &src.offs[1..n])
    } else {
        Vec::new()
    };
    for k in 1..n {
        let f = frames[k];
        if !filled[k - 1] {
            unused.push(f);
            continue;
        }
        park_page(m, sw, r, at[k - 1], slots[k], f, &mut rest[k - 1]);
        used.push(f);
    }
    (used, unused)
}

/// A readahead page in frame `f` whose pool slot holds its data (`pool::fill_slots`): in the
/// swap cache with PG_readahead, page `idx`'s entry (locked in `g`) naming the frame.
pub(crate) fn park_page(
    m: &MmInner,
    sw: &SwapState,
    r: &RegionInner,
    idx: PgOff,
    slot: SwapEntry,
    f: Pfn,
    g: &mut PteGuard<'_>,
) {
    let p = &m.node.pages[f];
    let refault =
        super::workingset::workingset_refault(m, sw.space(slot), slot.cache_index(), false);
    let active = if refault { pg::ACTIVE } else { 0 };
    p.init(
        Owner::Anon(r.id, idx),
        pg::UPTODATE | pg::SWAPBACKED | pg::SWAPCACHE | pg::READAHEAD | active,
    );
    p.set_swap_entry(slot);
    sw.add_to_cache(slot, f, &m.vm);
    g.set(Pte::Frame(f));
}

/// The largest swap-in readahead window: `1 << page_cluster`, or the device's own when it asks
/// for more ([`crate::swap::SwapDevice::ra_pages`]), and never more than an eighth of the
/// `nr_frames` frames of the budget (a small budget must not spend itself on one fault's
/// window) nor than the bounce buffer holds ([`pool::BOUNCE_PAGES`]); page_cluster 0 turns
/// readahead off, as in Linux.
pub fn swapin_ra_max(page_cluster: u32, dev_ra: Option<u32>, nr_frames: u64) -> u32 {
    if page_cluster == 0 {
        return 1;
    }
    let cap = u32::try_from(nr_frames / 8).unwrap_or(u32::MAX).max(1);
    let bounce = u32::try_from(pool::BOUNCE_PAGES).unwrap_or(u32::MAX);
    (1u32 << page_cluster)
        .max(dev_ra.unwrap_or(0).min(bounce))
        .min(cap)
}

/// `swapin_nr_pages`: the readahead window for a major fault, from the hits since the last one.
/// `hits`: readahead pages used since the last window; `seq`: this fault continues the last one.
pub fn swapin_nr_pages(hits: u32, seq: bool, last: u32, max: u32) -> u32 {
    let mut pages = hits + 2;
    if pages == 2 {
        // No hits: only a sequential pattern earns a window (two pages).
        if !seq {
            pages = 1;
        }
    } else {
        pages = pages.next_power_of_two();
    }
    pages = pages.min(max);
    // Do not shrink the window too fast.
    if pages < last / 2 {
        pages = last / 2;
    }
    pages.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_may_ask_for_a_larger_window() {
        let big = 1 << 20;
        assert_eq!(swapin_ra_max(5, None, big), 32);
        assert_eq!(swapin_ra_max(5, Some(256), big), 256);
        assert_eq!(swapin_ra_max(9, Some(256), big), 512);
        assert_eq!(swapin_ra_max(8, Some(8), big), 256);
        assert_eq!(swapin_ra_max(5, Some(4096), big), 512);
        assert_eq!(
            swapin_ra_max(0, Some(256), big),
            1,
            "page_cluster 0: no readahead"
        );
        // A 1 MiB budget (256 frames) reads at most 32 pages per fault.
        assert_eq!(swapin_ra_max(8, Some(256), 256), 32);
        assert_eq!(swapin_ra_max(8, None, 4), 1);
    }

    #[test]
    fn window_grows_with_hits_and_shrinks_slowly() {
        assert_eq!(swapin_nr_pages(0, false, 0, 16), 1);
        assert_eq!(swapin_nr_pages(0, true, 0, 16), 2);
        assert_eq!(swapin_nr_pages(2, true, 2, 16), 4);
        assert_eq!(swapin_nr_pages(7, true, 4, 16), 16);
        assert_eq!(swapin_nr_pages(100, true, 16, 16), 16);
        assert_eq!(swapin_nr_pages(0, false, 16, 16), 8);
    }

    #[test]
    fn cache_add_remove_and_tag_flag() {
        let dev: Arc<dyn SwapDevice> = Arc::new(crate::swap::RamSwap::new(8 << 20).unwrap());
        let vm = Counters::default();
        let s = SwapState::new(dev.clone(), false);
        assert!(!s.space(SwapEntry::new(0)).use_writeback_tags());
        s.add_to_cache(SwapEntry::new(5), Pfn::new(9), &vm);
        assert_eq!(s.cache_len(), 1);
        assert_eq!(vm.get(Item::NrSwapcache), 1);
        s.delete_from_cache(SwapEntry::new(5), &vm);
        assert_eq!(s.cache_len(), 0);
        assert_eq!(vm.get(Item::NrSwapcache), 0);
        assert!(SwapState::new(dev, true)
            .space(SwapEntry::new(0))
            .use_writeback_tags());
    }
}
