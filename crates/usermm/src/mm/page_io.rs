//! Swap I/O. Mirrors `mm/page_io.c` (`swap_writepage`, `swap_readpage`): the one place where a
//! page's bytes go to or come from the swap device. Writes go straight from the frames' pool
//! slots, one device request per run of consecutive slots; reads land in a bounce buffer,
//! because the pool is registered with userfaultfd and the kernel must not write into it,
//! except from a device whose pages are in this process's memory (the RAM device): swap-in
//! copies straight from there ([`swap_readpage_src`]).
//! Counted as Linux counts them (`pswpout`, `pgpgout` at write; reads are counted by the
//! callers, which know how many pages they used), failures as `swap_write_error` and
//! `swap_read_error`, each logged with its slots.

use std::io;

use crate::conv::Narrow;
use crate::sys::{Mapping, PAGE_SIZE};
use crate::vmstat::Item;

use super::page::{Pfn, SwapEntry};
use super::pool;
use super::swap_state::{SwapState, SwapinSrc};
use super::MmInner;

/// `swap_writepage` for a run: writes the pages of `frames` (from their pool slots) to the
/// consecutive slots starting at `first`.
pub(crate) fn swap_writepage(
    m: &MmInner,
    sw: &SwapState,
    first: SwapEntry,
    frames: impl IntoIterator<Item = Pfn>,
) -> io::Result<()> {
    let offs: Vec<usize> = frames.into_iter().map(Pfn::offset).collect();
    match sw.dev.write_pages(first.offset(), &m.pool.slots, &offs) {
        Ok(()) => {
            let n = offs.len() as u64;
            m.vm.add(Item::Pswpout, n);
            m.vm.add(Item::Pgpgout, n * (PAGE_SIZE as u64 / 1024));
            Ok(())
        }
        Err(err) => {
            log::error!(
                "swap write of {} pages at slot {first} failed: {err}; the pages stay resident and dirty",
                offs.len()
            );
            m.vm.inc(Item::SwapWriteError);
            Err(err)
        }
    }
}

/// [`swap_readpage`], but without a read where the device keeps its pages in this process's
/// memory (the RAM device): the pages are then copied straight from the device into their
/// places by the caller, one copy instead of two. Returns, per page, whether it can be used,
/// and where the pages are.
pub(crate) fn swap_readpage_src<'a>(
    m: &MmInner,
    sw: &'a SwapState,
    slots: &[SwapEntry],
    bounce: &'a Mapping,
) -> (Vec<bool>, SwapinSrc<'a>) {
    if let Some(mem) = sw.dev.pages_in_memory() {
        let offs: Vec<usize> = slots
            .iter()
            .map(|s| s.offset().usize() * PAGE_SIZE)
            .collect();
        if offs.iter().all(|&o| o + PAGE_SIZE <= mem.len()) {
            let src = SwapinSrc {
                map: mem,
                offs,
                in_device: true,
            };
            return (vec![true; slots.len()], src);
        }
    }
    let ok = swap_readpage(m, sw, slots, bounce);
    let src = SwapinSrc {
        map: bounce,
        offs: (0..slots.len()).map(|k| k * PAGE_SIZE).collect(),
        in_device: false,
    };
    (ok, src)
}

/// `swap_readpage` for a batch (the I/O of `swapin_readahead`, or one page): reads `slots` into
/// `bounce`, page k at offset k pages, the runs of consecutive slots in one device call
/// (`SwapDevice::read_runs`: all in flight at once where the device can). Returns,
/// per page, whether it was read; a failed run is logged and counted (`swap_read_error`).
pub(crate) fn swap_readpage(
    m: &MmInner,
    sw: &SwapState,
    slots: &[SwapEntry],
    bounce: &Mapping,
) -> Vec<bool> {
    let mut ok = vec![true; slots.len()];
    let runs: Vec<std::ops::Range<usize>> = pool::runs(slots, |a, b| b == a.next()).collect();
    let offs: Vec<usize> = (0..slots.len()).map(|j| j * PAGE_SIZE).collect();
    let reqs: Vec<crate::swap::SlotRun<'_>> = runs
        .iter()
        .map(|run| crate::swap::SlotRun {
            slot: slots[run.start].offset(),
            pages: &offs[run.clone()],
        })
        .collect();
    let results = {
        let _io = super::handler::blocking_io(m, sw.dev.blocks_on_read());
        sw.dev.read_runs(&reqs, bounce)
    };
    for (run, res) in runs.iter().zip(results) {
        if let Err(err) = res {
            log::error!(
                "swap read of slots {}..{} failed: {err}",
                slots[run.start],
                slots[run.end - 1].next()
            );
            m.vm.inc(Item::SwapReadError);
            ok[run.clone()].iter_mut().for_each(|o| *o = false);
        }
    }
    ok
}
