//! Per-region page table: one 64-bit entry per 4 KiB page saying where the page's contents are.
//! Mirrors the role of the PTE level of `mm/memory.c` (pte_none / zero-page pte / present pte /
//! swap entry / poison marker) and of the page table lock (here a lock bit in each entry).
//!
//! The table is three levels (512 x 512 x top), allocated lazily, so a 1 TiB region that is never
//! touched costs a few KiB. Leaves are never freed before the region is dropped.

use std::sync::OnceLock;

use super::page::{Pfn, PgOff, SwapEntry};
use crate::conv::Narrow;
use crate::sync::{backoff, AtomicU64, Ordering};

const FANOUT_SHIFT: u32 = 9;
const FANOUT: usize = 1 << FANOUT_SHIFT;
const LOCK: u64 = 1 << 63;
const TYPE_SHIFT: u32 = 56;
const TYPE_MASK: u64 = 0xF << TYPE_SHIFT;
const VAL_MASK: u64 = (1 << TYPE_SHIFT) - 1;

const T_NONE: u64 = 0;
const T_ZERO: u64 = 1;
const T_FRAME: u64 = 2;
const T_SWAP: u64 = 3;
const T_POISON: u64 = 4;
const T_HUGEZERO: u64 = 5;

/// Where one virtual page's contents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pte {
    /// Never written (or discarded): reads see zeros.
    None,
    /// The shared zero page is mapped read-only and write-protected.
    Zero,
    /// Resident in frame N (mapped in the view, or parked in the frame pool).
    Frame(Pfn),
    /// On the swap device at slot N.
    Swap(SwapEntry),
    /// Contents lost (swap full under overcommit, or a swap read error): accesses raise SIGBUS.
    Poison,
    /// Part of a 2 MiB unit mapped to the huge zero page (read-only, write-protected).
    HugeZero,
}

impl Pte {
    fn encode(self) -> u64 {
        match self {
            Pte::None => 0,
            Pte::Zero => T_ZERO << TYPE_SHIFT,
            Pte::Frame(f) => (T_FRAME << TYPE_SHIFT) | u64::from(f.raw()),
            Pte::Swap(s) => (T_SWAP << TYPE_SHIFT) | (s.offset() & VAL_MASK),
            Pte::Poison => T_POISON << TYPE_SHIFT,
            Pte::HugeZero => T_HUGEZERO << TYPE_SHIFT,
        }
    }
    fn decode(v: u64) -> Pte {
        let val = v & VAL_MASK;
        match (v & TYPE_MASK) >> TYPE_SHIFT {
            T_NONE => Pte::None,
            T_ZERO => Pte::Zero,
            T_FRAME => Pte::Frame(Pfn::new(val.u32())),
            T_SWAP => Pte::Swap(SwapEntry::new(val)),
            T_HUGEZERO => Pte::HugeZero,
            _ => Pte::Poison,
        }
    }
}

type Leaf = [AtomicU64; FANOUT];
type Mid = [OnceLock<Box<Leaf>>; FANOUT];

/// A lazily allocated three-level table of entries.
#[derive(Debug)]
pub struct PageTable {
    top: Box<[OnceLock<Box<Mid>>]>,
    npages: u64,
}

/// A locked entry; the lock is released (with the last value set) on drop.
#[derive(Debug)]
pub struct PteGuard<'a> {
    slot: &'a AtomicU64,
    val: Pte,
}

impl PteGuard<'_> {
    pub fn get(&self) -> Pte {
        self.val
    }
    pub fn set(&mut self, p: Pte) {
        self.val = p;
    }
}

impl Drop for PteGuard<'_> {
    fn drop(&mut self) {
        self.slot.store(self.val.encode(), Ordering::Release);
    }
}

impl PageTable {
    pub fn new(npages: u64) -> PageTable {
        let per_top = (FANOUT * FANOUT) as u64;
        let ntop = npages.div_ceil(per_top).max(1).usize();
        PageTable {
            top: (0..ntop).map(|_| OnceLock::new()).collect(),
            npages,
        }
    }

    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// Pages from `idx` (included) to the table's edge upwards, or to page 0 `down`: the
    /// longest run walked from `idx` that way.
    pub fn room(&self, idx: PgOff, down: bool) -> u64 {
        if down {
            idx.raw() + 1
        } else {
            self.npages - idx.raw()
        }
    }

    fn split(idx: u64) -> (usize, usize, usize) {
        let leaf = idx.usize() & (FANOUT - 1);
        let mid = ((idx >> FANOUT_SHIFT) as usize) & (FANOUT - 1);
        let top = (idx >> (2 * FANOUT_SHIFT)) as usize;
        (top, mid, leaf)
    }

    fn existing(&self, idx: u64) -> Option<&AtomicU64> {
        let (t, m, l) = Self::split(idx);
        let mid = self.top.get(t)?.get()?;
        let leaf = mid[m].get()?;
        Some(&leaf[l])
    }

    fn slot(&self, idx: u64) -> &AtomicU64 {
        assert!(
            idx < self.npages,
            "page index {idx} beyond region of {} pages",
            self.npages
        );
        let (t, m, l) = Self::split(idx);
        let mid = self.top[t].get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())));
        let leaf = mid[m].get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        &leaf[l]
    }

    /// The entry's current value (unlocked read; may change at once).
    pub fn get(&self, idx: PgOff) -> Pte {
        match self.existing(idx.raw()) {
            Some(s) => Pte::decode(s.load(Ordering::Acquire) & !LOCK),
            None => Pte::None,
        }
    }

    /// Locks the entry, spinning while another thread holds it (holders never sleep).
    pub fn lock(&self, idx: PgOff) -> PteGuard<'_> {
        let slot = self.slot(idx.raw());
        let mut it = 0;
        loop {
            if let Some(g) = Self::try_slot(slot) {
                return g;
            }
            backoff(&mut it);
        }
    }

    /// Locks the entry if nobody holds it.
    pub fn try_lock(&self, idx: PgOff) -> Option<PteGuard<'_>> {
        Self::try_slot(self.slot(idx.raw()))
    }

    fn try_slot(slot: &AtomicU64) -> Option<PteGuard<'_>> {
        let cur = slot.load(Ordering::Relaxed);
        if cur & LOCK != 0 {
            return None;
        }
        slot.compare_exchange_weak(cur, cur | LOCK, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| PteGuard {
                slot,
                val: Pte::decode(cur),
            })
    }

    /// Calls `f(index, entry)` for every entry that is not `None` in `[from, to)`, skipping
    /// unallocated subtrees (unlocked reads).
    pub fn for_each_used(&self, from: PgOff, to: PgOff, mut f: impl FnMut(PgOff, Pte)) {
        let to = to.raw().min(self.npages);
        let mut idx = from.raw();
        while idx < to {
            let (t, m, _) = Self::split(idx);
            let Some(mid) = self.top[t].get() else {
                idx = ((t as u64) + 1) << (2 * FANOUT_SHIFT);
                continue;
            };
            let Some(leaf) = mid[m].get() else {
                idx = ((idx >> FANOUT_SHIFT) + 1) << FANOUT_SHIFT;
                continue;
            };
            let end = (((idx >> FANOUT_SHIFT) + 1) << FANOUT_SHIFT).min(to);
            while idx < end {
                let v =
                    Pte::decode(leaf[idx.usize() & (FANOUT - 1)].load(Ordering::Acquire) & !LOCK);
                if v != Pte::None {
                    f(PgOff::new(idx), v);
                }
                idx += 1;
            }
        }
    }

    /// Bytes of metadata allocated so far.
    #[cfg(any(test, loom, feature = "testing"))]
    pub fn allocated_bytes(&self) -> usize {
        let mut b = self.top.len() * std::mem::size_of::<OnceLock<Box<Mid>>>();
        for m in self.top.iter().filter_map(|m| m.get()) {
            b += std::mem::size_of::<Mid>();
            b += m.iter().filter(|l| l.get().is_some()).count() * std::mem::size_of::<Leaf>();
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_roundtrip() {
        for p in [
            Pte::None,
            Pte::Zero,
            Pte::Frame(Pfn::new(7)),
            Pte::Frame(Pfn::NONE),
            Pte::Swap(SwapEntry::new(1 << 40)),
            Pte::Poison,
        ] {
            assert_eq!(Pte::decode(p.encode()), p);
        }
    }

    #[test]
    fn sparse_terabyte() {
        let t = PageTable::new((1u64 << 40) / 4096);
        assert!(t.allocated_bytes() < 64 * 1024, "{}", t.allocated_bytes());
        assert_eq!(t.get(PgOff::new(12345678)), Pte::None);
        {
            let mut g = t.lock(PgOff::new(12345678));
            g.set(Pte::Swap(SwapEntry::new(5)));
        }
        assert_eq!(t.get(PgOff::new(12345678)), Pte::Swap(SwapEntry::new(5)));
        assert!(t.allocated_bytes() < 64 * 1024);
        let mut seen = vec![];
        t.for_each_used(PgOff::ZERO, PgOff::new(t.npages()), |i, p| {
            seen.push((i, p))
        });
        assert_eq!(
            seen,
            vec![(PgOff::new(12345678), Pte::Swap(SwapEntry::new(5)))]
        );
    }

    #[test]
    fn lock_excludes() {
        let t = PageTable::new(10);
        let g = t.lock(PgOff::new(3));
        assert!(t.try_lock(PgOff::new(3)).is_none());
        assert!(t.try_lock(PgOff::new(4)).is_some());
        drop(g);
        assert!(t.try_lock(PgOff::new(3)).is_some());
    }
}
