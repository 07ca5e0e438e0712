//! The RAM swap device: swap slots stored in an anonymous mapping that is populated on demand,
//! like a RAM disk. Mirrors `drivers/block/brd.c` (a RAM disk whose pages are allocated on first
//! write and freed on discard) as used through the swap path of `mm/page_io.c`.
//!
//! The device reserves address space only (`MAP_NORESERVE`, no transparent huge pages): a slot
//! costs memory from its first write until it is discarded, so a large `--swap-size` costs
//! nothing until pages are really swapped out. Reading a slot that was never written returns
//! zeros. Pages move by memcpy between the frame pool and the mapping.
//!
//! Discarded clusters stay warm up to [`WARM_MAX_BYTES`] (at most an eighth of the device):
//! their pages are kept, and the slot allocator hands the most recently freed cluster out first
//! ([`SwapDevice::reuse_freed_first`]), so a program that keeps swapping out and in reuses them
//! instead of faulting in and zeroing a fresh page for every slot written (a Python dict built
//! under `--swap ram`: 294k -> 242k kernel page faults, 6% less system time). Beyond that bound
//! the oldest warm clusters are given back (`MADV_DONTNEED`, as `brd_do_discard`).

use std::collections::VecDeque;
use std::io;

use super::file::{check_pool_pages, check_slots, pages_for_size};
use super::SwapDevice;
use crate::conv::Narrow;
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::{Advice, Mapping, PAGE_SIZE};

/// The most memory discarded clusters keep for reuse (see the module documentation).
pub const WARM_MAX_BYTES: u64 = 64 << 20;

/// Warm ranges remembered before those rewritten since are forgotten.
const WARM_RANGES_MAX: usize = 4096;

/// A swap device in RAM allocated on demand (see the module documentation).
#[derive(Debug)]
pub struct RamSwap {
    mem: Mapping,
    nr_pages: u64,
    /// One bit per slot: discarded, page kept (warm). Set only by `discard` (the slots are free
    /// and cannot be allocated meanwhile); cleared under `warm` by the first write and by the
    /// drop of an old warm range.
    warm_bits: Box<[AtomicU64]>,
    warm: Mutex<Warm>,
    /// Warm pages allowed.
    warm_cap: u64,
}

/// The warm ranges, oldest first (entries whose slots were written since are skipped when
/// popped), and the number of warm pages.
#[derive(Debug, Default)]
struct Warm {
    ranges: VecDeque<(u64, u64)>,
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
            warm_bits: (0..nr_pages.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            warm: Mutex::new(Warm::default()),
            warm_cap,
        })
    }

    /// The word of `warm_bits` holding slot `slot`'s bit, and the bit.
    fn warm_bit(&self, slot: u64) -> (&AtomicU64, u64) {
        (&self.warm_bits[(slot / 64).usize()], 1 << (slot % 64))
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

    /// Gives back the pages of the oldest warm ranges until at most `warm_cap` are warm
    /// (`warm` locked).
    fn shrink_warm(&self, warm: &mut Warm) -> io::Result<()> {
        while warm.pages > self.warm_cap {
            let Some((start, n)) = warm.ranges.pop_front() else {
                break;
            };
            let mut s = start;
            while s < start + n {
                // The next run of warm slots from `s`.
                if !self.is_warm(s) {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < start + n && self.is_warm(e) {
                    e += 1;
                }
                self.mem.advise(
                    s.usize() * PAGE_SIZE,
                    (e - s).usize() * PAGE_SIZE,
                    Advice::DontNeed,
                )?;
                for x in s..e {
                    let (w, bit) = self.warm_bit(x);
                    w.fetch_and(!bit, Ordering::Release);
                }
                warm.pages -= e - s;
                s = e;
            }
        }
        Ok(())
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

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)?;
        if n == 0 {
            return Ok(());
        }
        // Kept warm for reuse; the oldest warm ranges beyond the bound are given back
        // (brd_do_discard).
        let mut warm = self.warm.lock();
        for x in slot..slot + n {
            let (w, bit) = self.warm_bit(x);
            if w.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                warm.pages += 1;
            }
        }
        warm.ranges.push_back((slot, n));
        if warm.ranges.len() > WARM_RANGES_MAX {
            // Ranges rewritten since they were discarded hold nothing warm: forget them.
            warm.ranges
                .retain(|&(s, n)| (s..s + n).any(|x| self.is_warm(x)));
        }
        self.shrink_warm(&mut warm)
    }

    fn reuse_freed_first(&self) -> bool {
        true
    }
}
