//! The RAM swap device: swap slots stored in a preallocated anonymous buffer, like a RAM-backed
//! PMEM or brd device. Mirrors `drivers/block/brd.c` (a RAM disk) as used through the swap path of
//! `mm/page_io.c`.
//!
//! The whole buffer is populated when the device is created, so its memory is really reserved up
//! front and swapping out never needs to allocate. Pages move by memcpy between the frame pool and
//! the buffer. Discard is a no-op: releasing the memory would undo the reservation.

use std::io;

use super::file::{check_pool_pages, check_slots, pages_for_size};
use super::SwapDevice;
use crate::sys::{Advice, Mapping, PAGE_SIZE};

/// A swap device in a preallocated RAM buffer (see the module documentation).
#[derive(Debug)]
pub struct RamSwap {
    mem: Mapping,
    nr_pages: u64,
}

impl RamSwap {
    /// Reserves a buffer of `size` bytes (rounded down to whole pages; at least one page) and
    /// populates it.
    pub fn new(size: u64) -> io::Result<Self> {
        let nr_pages = pages_for_size(size)?;
        let bytes = nr_pages as usize * PAGE_SIZE;
        let fail = |e: io::Error| {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            io::Error::new(
                e.kind(),
                format!("cannot reserve {bytes} bytes of RAM for the swap device ({text}): choose a smaller swap size"),
            )
        };
        let mem = Mapping::anon(bytes, 0).map_err(fail)?;
        match mem.advise(0, bytes, Advice::PopulateWrite) {
            Ok(()) => {}
            // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch every page instead.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                for off in (0..bytes).step_by(PAGE_SIZE) {
                    mem.write_u64(off, 0);
                }
            }
            Err(e) => return Err(fail(e)),
        }
        Ok(RamSwap { mem, nr_pages })
    }
}

impl SwapDevice for RamSwap {
    fn name(&self) -> String {
        format!("ram ({} pages)", self.nr_pages)
    }

    fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        for (i, &p) in pages.iter().enumerate() {
            self.mem
                .copy_from((slot as usize + i) * PAGE_SIZE, pool, p, PAGE_SIZE)?;
        }
        Ok(())
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        for (i, &p) in pages.iter().enumerate() {
            pool.copy_from(p, &self.mem, (slot as usize + i) * PAGE_SIZE, PAGE_SIZE)?;
        }
        Ok(())
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)
    }
}
