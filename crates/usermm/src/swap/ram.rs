//! The RAM swap device: swap slots stored in an anonymous mapping that is populated on demand,
//! like a RAM disk. Mirrors `drivers/block/brd.c` (a RAM disk whose pages are allocated on first
//! write and freed on discard) as used through the swap path of `mm/page_io.c`.
//!
//! The device reserves address space only (`MAP_NORESERVE`, no transparent huge pages): a slot
//! costs memory from its first write until it is discarded (`MADV_DONTNEED` gives the page back),
//! so a large `--swap-size` costs nothing until pages are really swapped out. Reading a slot that
//! was never written returns zeros. Pages move by memcpy between the frame pool and the mapping.

use std::io;

use super::file::{check_pool_pages, check_slots, pages_for_size};
use super::SwapDevice;
use crate::conv::Narrow;
use crate::sys::{Advice, Mapping, PAGE_SIZE};

/// A swap device in RAM allocated on demand (see the module documentation).
#[derive(Debug)]
pub struct RamSwap {
    mem: Mapping,
    nr_pages: u64,
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
        Ok(RamSwap { mem, nr_pages })
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

    fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        for (i, &p) in pages.iter().enumerate() {
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
        // Give the pages back (brd_do_discard); the next read of these slots sees zeros.
        Ok(self.mem.advise(
            slot.usize() * PAGE_SIZE,
            n.usize() * PAGE_SIZE,
            Advice::DontNeed,
        )?)
    }
}
