//! The RAM swap device: swap slots stored in an anonymous mapping that is populated on demand,
//! like a RAM disk. Mirrors `drivers/block/brd.c` (a RAM disk whose pages are allocated on first
//! write and freed on discard) as used through the swap path of `mm/page_io.c`.
//!
//! The device reserves address space only (`MAP_NORESERVE`, no transparent huge pages): a slot
//! costs memory from its first write until it is discarded, so a large `--swap-size` costs
//! nothing until pages are really swapped out. Reading a slot that was never written returns
//! zeros. Swap-out copies pages from the frame pool into the mapping (memcpy); swap-in copies
//! them from the mapping straight to where they go, the program's view or a pool slot
//! ([`SwapDevice::pages_in_memory`]), with no read into a bounce buffer first.
//!
//! Freed slots stay warm: whole clusters discarded ([`SwapDevice::discard`]) and single slots
//! freed inside clusters still in use ([`SwapDevice::invalidate`]). Their pages are kept, and
//! the slot allocator hands out the holes of partly used clusters and then the most recently
//! freed cluster first ([`SwapDevice::reuse_freed_first`]), so a program that keeps swapping
//! out and in reuses them instead of faulting in and zeroing a fresh page for every slot
//! written (a Python dict built under `--swap ram`: 294k -> 242k kernel page faults, 6% less
//! system time). Beyond [`WARM_MAX_BYTES`] (at most an eighth of the device) the oldest warm
//! pages are given back (`MADV_DONTNEED`, as `brd_do_discard`): discarded clusters at once,
//! single slots once they have waited [`WARM_AGE`] unused (by kswapd's periodic
//! [`SwapDevice::trim`], all that are due in one process_madvise(2): one TLB shootdown). Below
//! the bound, what nobody reused for [`WARM_IDLE_AGE`] is given back too, so a program that
//! stopped swapping keeps nothing for reuse (the kernel's zram frees a slot's memory when the
//! slot is freed). A
//! program whose swap shrank so no longer keeps every page a random swap-in pattern left free
//! in clusters that still hold a live slot, while one swapping steadily keeps its holes: given
//! back as soon as they passed the bound, the Python dict ran 10% slower (200k pages given back
//! and faulted in again when their holes were reused).

use std::collections::VecDeque;
use std::io;

use super::file::{check_pool_pages, check_slots, pages_for_size};
use super::SwapDevice;
use crate::conv::{Narrow, Saturate};
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::{Advice, Mapping, PAGE_SIZE};

/// The most memory discarded clusters keep for reuse (see the module documentation).
pub const WARM_MAX_BYTES: u64 = 64 << 20;

/// Warm ranges (and single slots) remembered before those rewritten since are forgotten (the
/// single slots' queue also whenever it holds more than twice the warm pages).
const WARM_RANGES_MAX: usize = 4096;

/// How long a single freed slot's page is kept for reuse before it may be given back.
pub const WARM_AGE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a warm page (a discarded cluster's or a single freed slot's) is kept unused below
/// the bound before [`SwapDevice::trim`] gives it back: a program that swapped in a burst and
/// then stopped holds no memory for slots it no longer writes. Long enough that a program
/// swapping steadily (every page reused within seconds) never loses its warm pages to it.
pub const WARM_IDLE_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// The most single freed slots one [`SwapDevice::trim`] gives back: the warm lock is held
/// for the release (a few ms at ~1.2 us a page), and the frees and writes of the fault path
/// wait for it meanwhile; a large backlog goes over several of kswapd's 200 ms ticks.
pub const TRIM_MAX: u64 = 4096;

/// One bit per slot of a device of `nr_pages` slots, all clear.
fn slot_bitmap(nr_pages: u64) -> Box<[AtomicU64]> {
    (0..nr_pages.div_ceil(64))
        .map(|_| AtomicU64::new(0))
        .collect()
}

/// The word of `bits` (a [`slot_bitmap`]) holding slot `slot`'s bit, and the bit.
fn slot_bit(bits: &[AtomicU64], slot: u64) -> (&AtomicU64, u64) {
    (&bits[(slot / 64).usize()], 1 << (slot % 64))
}

/// A swap device in RAM allocated on demand (see the module documentation).
#[derive(Debug)]
pub struct RamSwap {
    mem: Mapping,
    nr_pages: u64,
    /// One bit per slot: freed, page kept (warm). Set by `discard` and `invalidate`, before
    /// the slots can be allocated again; cleared under `warm` by the first write and by the
    /// drop of an old warm range.
    warm_bits: Box<[AtomicU64]>,
    warm: Mutex<Warm>,
    /// Warm pages allowed.
    warm_cap: u64,
    /// The device's clock for the warm ranges.
    epoch: std::time::Instant,
    /// How long a single freed slot stays warm at least, in ms ([`WARM_AGE`]).
    warm_age_ms: AtomicU64,
    /// How long a warm page unused stays warm below the bound, in ms ([`WARM_IDLE_AGE`]).
    idle_age_ms: AtomicU64,
    /// One bit per slot: written and not freed since (the slot holds a page).
    live_bits: Box<[AtomicU64]>,
}

/// The warm pages: discarded clusters' ranges (start, length) and single freed slots, each with
/// the time it was freed (ms since the device was made) and oldest first (entries whose slots
/// were written since are skipped when popped), and the number of warm pages.
#[derive(Debug, Default)]
struct Warm {
    ranges: VecDeque<(u64, u64, u64)>,
    singles: VecDeque<(u64, u64)>,
    pages: u64,
}

impl RamSwap {
    /// Reserves address space for `size` bytes (rounded down to whole pages; at least one page).
    /// No memory is used until slots are written.
    pub fn new(size: u64) -> io::Result<Self> {
        let nr_pages = pages_for_size(size)?;
        let bytes = nr_pages.usize() * PAGE_SIZE;
        let fail = |e: crate::sys::SysError| {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            io::Error::new(
                e.kind(),
                format!("cannot reserve {bytes} bytes of address space for the RAM swap device ({text}): choose a smaller swap size"),
            )
        };
        let mem = Mapping::anon(bytes, 0).map_err(fail)?;
        // One 4 KiB slot must cost 4 KiB, not a 2 MiB huge page.
        if let Err(e) = mem.advise(0, bytes, Advice::NoHugePage) {
            log::debug!("madvise(NOHUGEPAGE) on the RAM swap device: {e}");
        }
        let warm_cap = (WARM_MAX_BYTES / PAGE_SIZE as u64).min(nr_pages / 8);
        Ok(RamSwap {
            mem,
            nr_pages,
            warm_bits: slot_bitmap(nr_pages),
            warm: Mutex::new(Warm::default()),
            warm_cap,
            epoch: std::time::Instant::now(),
            warm_age_ms: AtomicU64::new(WARM_AGE.as_millis().sat_u64()),
            idle_age_ms: AtomicU64::new(WARM_IDLE_AGE.as_millis().sat_u64()),
            live_bits: slot_bitmap(nr_pages),
        })
    }

    /// The word of `warm_bits` holding slot `slot`'s bit, and the bit.
    fn warm_bit(&self, slot: u64) -> (&AtomicU64, u64) {
        slot_bit(&self.warm_bits, slot)
    }

    fn is_warm(&self, slot: u64) -> bool {
        let (w, bit) = self.warm_bit(slot);
        w.load(Ordering::Acquire) & bit != 0
    }

    /// Before slot `slot` is written: a warm slot stops being warm. Under the lock, so that a
    /// concurrent drop of the slot's old range (which clears the bit only after its
    /// MADV_DONTNEED) has finished before the data lands.
    fn unwarm(&self, slot: u64) {
        if !self.is_warm(slot) {
            return;
        }
        let mut warm = self.warm.lock();
        let (w, bit) = self.warm_bit(slot);
        if w.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            warm.pages -= 1;
        }
    }

    /// Gives back the pages of the oldest discarded ranges until at most `warm_cap` are warm
    /// (`warm` locked), as `brd_do_discard` frees a discarded range. A slot in two queued
    /// ranges counts twice here, so this may stop short of the bound; the next discard or trim
    /// goes on.
    fn shrink_warm(&self, warm: &mut Warm) -> io::Result<()> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut released = 0;
        while warm.pages.saturating_sub(released) > self.warm_cap {
            let Some((start, n, _)) = warm.ranges.pop_front() else {
                break;
            };
            released += self.warm_runs(start, n, &mut runs);
        }
        self.release_runs(warm, &runs)
    }

    /// Appends the runs of warm slots of `[start, start + n)` to `runs`; returns their pages.
    fn warm_runs(&self, start: u64, n: u64, runs: &mut Vec<(u64, u64)>) -> u64 {
        let mut found = 0;
        let mut s = start;
        while s < start + n {
            if !self.is_warm(s) {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e < start + n && self.is_warm(e) {
                e += 1;
            }
            runs.push((s, e));
            found += e - s;
            s = e;
        }
        found
    }

    /// Gives back the warm slots of `runs` (`warm` locked), one MADV_DONTNEED per run.
    fn release_runs(&self, warm: &mut Warm, runs: &[(u64, u64)]) -> io::Result<()> {
        let res = runs.iter().try_for_each(|&(s, e)| {
            self.mem.advise(
                s.usize() * PAGE_SIZE,
                (e - s).usize() * PAGE_SIZE,
                Advice::DontNeed,
            )
        });
        self.released(warm, runs.iter().flat_map(|&(s, e)| s..e));
        res.map_err(io::Error::from)
    }

    /// Gives back the warm pages nobody reused for the idle age ([`WARM_IDLE_AGE`]), below the
    /// bound too (`warm` locked): the discarded ranges freed that long ago, then the single
    /// slots, oldest first, about [`TRIM_MAX`] pages per call (a range is taken whole).
    fn shrink_idle(&self, warm: &mut Warm) -> io::Result<()> {
        let (now, age) = (self.now_ms(), self.idle_age_ms.load(Ordering::Relaxed));
        let idle = |at: u64| now.saturating_sub(at) >= age;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut released = 0;
        while released < TRIM_MAX {
            match warm.ranges.front() {
                Some(&(start, n, at)) if idle(at) => {
                    warm.ranges.pop_front();
                    released += self.warm_runs(start, n, &mut runs);
                }
                _ => break,
            }
        }
        let res = self.release_runs(warm, &runs);
        let slots = self.aged_singles(warm, now, age, TRIM_MAX.saturating_sub(released));
        res.and(self.release_singles(warm, slots))
    }

    /// Takes from the front of the single freed slots those freed at least `age` ms before
    /// `now` (oldest first) and returns the ones still warm, at most `max` (`warm` locked).
    fn aged_singles(&self, warm: &mut Warm, now: u64, age: u64, max: u64) -> Vec<u64> {
        let mut slots: Vec<u64> = Vec::new();
        while (slots.len() as u64) < max {
            match warm.singles.front() {
                Some(&(slot, at)) if now.saturating_sub(at) >= age => {
                    warm.singles.pop_front();
                    if self.is_warm(slot) {
                        slots.push(slot);
                    }
                }
                _ => break,
            }
        }
        slots
    }

    /// Gives back the single freed slots that waited the warm age unused, oldest first, while
    /// more than `warm_cap` pages are warm, at most [`TRIM_MAX`] (`warm` locked): in one
    /// process_madvise(2) per `MAX_IOV` pages, one TLB shootdown each.
    fn shrink_singles(&self, warm: &mut Warm) -> io::Result<()> {
        let (now, age) = (self.now_ms(), self.warm_age_ms.load(Ordering::Relaxed));
        let max = TRIM_MAX.min(warm.pages.saturating_sub(self.warm_cap));
        let slots = self.aged_singles(warm, now, age, max);
        self.release_singles(warm, slots)
    }

    /// Gives back the warm single slots `slots` (`warm` locked) in one process_madvise(2) per
    /// `MAX_IOV` pages.
    fn release_singles(&self, warm: &mut Warm, slots: Vec<u64>) -> io::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let offs: Vec<usize> = slots.iter().map(|&x| x.usize() * PAGE_SIZE).collect();
        let res = self.mem.dontneed_pages(&offs);
        self.released(warm, slots.into_iter());
        res.map_err(io::Error::from)
    }

    /// After a release of warm slots (`warm` locked): they are warm no more. The bits go only
    /// now, so a write that found its slot warm waited for the lock and lands after the
    /// release; after a failed release some pages are still there, left as ordinary free
    /// slots (a later write takes the page as it is). A slot freed, rewritten and freed again
    /// is queued once per freeing and may come twice: each is counted once, by its bit.
    fn released(&self, warm: &mut Warm, slots: impl Iterator<Item = u64>) {
        for x in slots {
            let (w, bit) = self.warm_bit(x);
            if w.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
                warm.pages -= 1;
            }
        }
    }

    /// Marks slots `[slot, slot + n)` warm (`warm` locked), each counted once.
    fn mark_warm(&self, warm: &mut Warm, slot: u64, n: u64) {
        for x in slot..slot + n {
            let (w, bit) = self.warm_bit(x);
            if w.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                warm.pages += 1;
            }
        }
    }

    /// Slot `slot` was written: it holds a page.
    fn set_live(&self, slot: u64) {
        let (w, bit) = slot_bit(&self.live_bits, slot);
        w.fetch_or(bit, Ordering::AcqRel);
    }

    /// Slot `slot` is free again; whether it held a page (was written since it was last
    /// freed: a zswap tier above may have kept the page and never written it here).
    fn clear_live(&self, slot: u64) -> bool {
        let (w, bit) = slot_bit(&self.live_bits, slot);
        w.fetch_and(!bit, Ordering::AcqRel) & bit != 0
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis().sat_u64()
    }

    /// How long a single freed slot's page is kept for reuse before [`SwapDevice::trim`] may
    /// give it back ([`WARM_AGE`] by default; zero gives back at the next trim).
    pub fn set_warm_age(&self, age: std::time::Duration) {
        self.warm_age_ms
            .store(age.as_millis().sat_u64(), Ordering::Relaxed);
    }

    /// How long a warm page unused below the bound is kept before [`SwapDevice::trim`] gives it
    /// back ([`WARM_IDLE_AGE`] by default).
    pub fn set_idle_age(&self, age: std::time::Duration) {
        self.idle_age_ms
            .store(age.as_millis().sat_u64(), Ordering::Relaxed);
    }

    /// Slots discarded whose pages the device still keeps for reuse.
    pub fn warm_pages(&self) -> u64 {
        self.warm.lock().pages
    }

    /// Bytes of memory the device holds now (pages written and not discarded), by mincore(2);
    /// a read of a never-written slot maps the shared zero page, which this also counts.
    pub fn resident_bytes(&self) -> io::Result<u64> {
        let pages = self.mem.resident(0, self.mem.len())?;
        Ok(pages.iter().filter(|&&r| r).count() as u64 * PAGE_SIZE as u64)
    }
}

impl SwapDevice for RamSwap {
    fn name(&self) -> String {
        format!("ram ({} pages, on demand)", self.nr_pages)
    }

    fn blocks_on_read(&self) -> bool {
        false
    }

    fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        for (i, &p) in pages.iter().enumerate() {
            self.unwarm(slot + i as u64);
            self.mem
                .copy_from((slot.usize() + i) * PAGE_SIZE, pool, p, PAGE_SIZE)?;
            self.set_live(slot + i as u64);
        }
        Ok(())
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        for (i, &p) in pages.iter().enumerate() {
            pool.copy_from(p, &self.mem, (slot.usize() + i) * PAGE_SIZE, PAGE_SIZE)?;
        }
        Ok(())
    }

    fn pages_in_memory(&self) -> Option<&Mapping> {
        // An allocated slot is neither warm nor given back (trim and shrink touch freed slots
        // only), and is written only after it is freed and allocated again.
        Some(&self.mem)
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)?;
        if n == 0 {
            return Ok(());
        }
        // Kept warm for reuse; the oldest warm ranges beyond the bound are given back
        // (brd_do_discard).
        for x in slot..slot + n {
            self.clear_live(x);
        }
        let now = self.now_ms();
        let mut warm = self.warm.lock();
        self.mark_warm(&mut warm, slot, n);
        warm.ranges.push_back((slot, n, now));
        if warm.ranges.len() > WARM_RANGES_MAX {
            // Ranges rewritten since they were discarded hold nothing warm: forget them.
            warm.ranges
                .retain(|&(s, n, _)| (s..s + n).any(|x| self.is_warm(x)));
        }
        self.shrink_warm(&mut warm)
    }

    /// A slot freed inside a cluster still in use: its page is kept warm for the next write
    /// there (the allocator fills such holes first); [`SwapDevice::trim`] gives it back once it
    /// has waited the warm age beyond the bound.
    fn invalidate(&self, slot: u64) {
        if slot >= self.nr_pages || !self.clear_live(slot) || self.is_warm(slot) {
            return;
        }
        let mut warm = self.warm.lock();
        self.mark_warm(&mut warm, slot, 1);
        let now = self.now_ms();
        warm.singles.push_back((slot, now));
        if warm.singles.len() > WARM_RANGES_MAX.max(2 * warm.pages.usize()) {
            // Slots written again since they were freed hold nothing warm: forget them.
            warm.singles.retain(|&(x, _)| self.is_warm(x));
        }
    }

    fn trim(&self) {
        let mut warm = self.warm.lock();
        if warm.pages > self.warm_cap {
            if let Err(e) = self.shrink_singles(&mut warm) {
                log::warn!("giving back freed pages of the RAM swap device: {e}");
            }
        }
        if warm.pages > 0 {
            if let Err(e) = self.shrink_idle(&mut warm) {
                log::warn!("giving back idle freed pages of the RAM swap device: {e}");
            }
        }
    }

    fn reuse_freed_first(&self) -> bool {
        true
    }
}
