//! The swap cache and swap-in readahead. Mirrors `mm/swap_state.c` (`add_to_swap_cache`,
//! `delete_from_swap_cache`, `lookup_swap_cache`, `swapin_nr_pages`) and the slot half of
//! `mm/swapfile.c` (`get_swap_pages`, `swap_free`, `vm_swap_full`).
//!
//! The swap cache maps a swap slot to the frame holding its page while the page is in flight
//! (added at reclaim, removed when the page is freed) and after swap-in while the swap copy is
//! still valid, so a clean page is dropped without being written again.

use std::collections::HashMap;
use std::sync::Arc;

use crate::swap::{SwapDevice, SwapSlots};
use crate::sync::Mutex;
use crate::vmstat::{Counters, Item};

const SHARDS: usize = 16;

/// Swap slot -> frame, sharded by slot cluster.
pub struct SwapCache {
    shards: Vec<Mutex<HashMap<u64, u32>>>,
}

impl Default for SwapCache {
    fn default() -> Self {
        SwapCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl SwapCache {
    fn shard(&self, slot: u64) -> &Mutex<HashMap<u64, u32>> {
        &self.shards[((slot >> 8) as usize) % SHARDS]
    }
    pub fn insert(&self, slot: u64, frame: u32) {
        self.shard(slot).lock().insert(slot, frame);
    }
    pub fn remove(&self, slot: u64) -> Option<u32> {
        self.shard(slot).lock().remove(&slot)
    }
    pub fn lookup(&self, slot: u64) -> Option<u32> {
        self.shard(slot).lock().get(&slot).copied()
    }
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A manager's swap: the device, its slot allocator, its cache.
pub struct SwapState {
    pub dev: Arc<dyn SwapDevice>,
    pub slots: SwapSlots,
    pub cache: SwapCache,
}

impl SwapState {
    pub fn new(dev: Arc<dyn SwapDevice>) -> SwapState {
        let slots = SwapSlots::new(dev.nr_pages());
        SwapState {
            dev,
            slots,
            cache: SwapCache::default(),
        }
    }

    /// `vm_swap_full`: more than half the slots are in use, so swap-in should free slots rather
    /// than keep the swap copy.
    pub fn full(&self) -> bool {
        self.slots.nr_free() * 2 < self.slots.nr_pages()
    }

    /// Adds a page to the swap cache under `slot`.
    pub fn add_to_cache(&self, slot: u64, frame: u32, vm: &Counters) {
        self.cache.insert(slot, frame);
        vm.inc(Item::NrSwapcache);
    }

    /// Removes `slot` from the swap cache (the slot itself stays allocated).
    pub fn delete_from_cache(&self, slot: u64, vm: &Counters) {
        if self.cache.remove(slot).is_some() {
            vm.sub(Item::NrSwapcache, 1);
        }
    }

    /// Releases a slot (`swap_free`): removes it from the cache if present, frees it and lets the
    /// device drop its contents.
    pub fn free_slot(&self, slot: u64, vm: &Counters) {
        self.delete_from_cache(slot, vm);
        self.slots.free(slot);
        vm.inc(Item::SwapSlotFree);
    }
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
    fn window_grows_with_hits_and_shrinks_slowly() {
        assert_eq!(swapin_nr_pages(0, false, 0, 16), 1);
        assert_eq!(swapin_nr_pages(0, true, 0, 16), 2);
        assert_eq!(swapin_nr_pages(2, true, 2, 16), 4);
        assert_eq!(swapin_nr_pages(7, true, 4, 16), 16);
        assert_eq!(swapin_nr_pages(100, true, 16, 16), 16);
        assert_eq!(swapin_nr_pages(0, false, 16, 16), 8);
    }

    #[test]
    fn cache_insert_lookup_remove() {
        let c = SwapCache::default();
        c.insert(5, 9);
        assert_eq!(c.lookup(5), Some(9));
        assert_eq!(c.len(), 1);
        assert_eq!(c.remove(5), Some(9));
        assert!(c.is_empty());
    }
}
