//! In-memory files (`memfd`-like `CachedFile`s) that go to swap under reclaim. Mirrors
//! `mm/shmem.c` (`shmem_writepage`: a page replaced by a swap entry in its mapping's tree;
//! `shmem_swapin`: the entry replaced by a page again).

use std::io;

use crate::error::{Error, FileError, Result};
use crate::sync::Ordering;
use crate::vmstat::Item;

use super::fs::{AddressSpace, AddressSpaceOps, Entry, LockSite};
use super::page::{pg, Owner, Pfn, PgOff, SwapEntry};
use super::{page_alloc, pool, MmInner};

/// An in-memory file's `address_space_operations` (`shmem_aops`): nothing to write back (its
/// pages go to swap under reclaim instead, [`shmem_replace_with_swap`]); swap entries in its
/// tree come back through [`shmem_swapin`].
#[derive(Debug)]
pub(crate) struct ShmemAops;

/// The operations of every in-memory file's mapping.
pub(crate) static SHMEM_AOPS: ShmemAops = ShmemAops;

impl AddressSpaceOps for ShmemAops {
    fn swapin(
        &self,
        m: &MmInner,
        mapping: &AddressSpace,
        index: PgOff,
        slot: SwapEntry,
    ) -> Result<()> {
        shmem_swapin(m, mapping, index, slot)
    }
}

/// Swaps an in-memory file's page back in (`shmem_swapin`): a new frame at `index` replacing
/// the swap entry `slot`.
pub(crate) fn shmem_swapin(
    m: &MmInner,
    mapping: &AddressSpace,
    index: PgOff,
    slot: SwapEntry,
) -> Result<()> {
    let Some(sw) = &m.swap else {
        return Err(FileError::SwappedWithoutDevice.into());
    };
    let mut frames = Vec::with_capacity(1);
    if !page_alloc::alloc_pages(m, 1, &mut frames) {
        return Err(Error::io(
            format!("swapping in a page of {}", mapping.name()),
            io::Error::from_raw_os_error(libc::ENOMEM),
        ));
    }
    let f = frames[0];
    let read = pool::with_bounce(1, |bounce| {
        if !super::page_io::swap_readpage(m, sw, &[slot], bounce)[0] {
            return Err("the swap device failed the read (logged)");
        }
        if !pool::fill_slot(m, f, bounce, 0) {
            return Err("could not fill a frame");
        }
        Ok(())
    });
    match read {
        Ok(()) => {}
        Err(why) => {
            pool::free_frames(m, &[f], true);
            return Err(Error::io(
                format!("swap read of slot {slot} for {}", mapping.name()),
                io::Error::other(why),
            ));
        }
    }
    let p = &m.node.pages[f];
    p.init(
        Owner::Cache(mapping.id, index),
        pg::SWAPBACKED | pg::UPTODATE | pg::DIRTY,
    );
    {
        let mut t = mapping.lock_tree(&m.vm, LockSite::AddToPageCache);
        if t.get(index.raw()) != Some(Entry::Swap(slot).encode()) {
            // Someone else swapped it in.
            drop(t);
            p.reset_flags(pg::POOLED);
            pool::recycle_frames(m, &[f]);
            return Ok(());
        }
        t.insert(index.raw(), Entry::Page(f).encode());
    }
    // The frame's new page has no read hash (its contents come from swap).
    pool::take_read_hash(m, f);
    if super::workingset::workingset_refault(m, sw.space(slot), slot.cache_index(), false) {
        p.set(pg::ACTIVE);
    }
    sw.swap_free(slot, &m.vm);
    m.vm.sub(Item::NrShmemSwapped, 1);
    mapping.nrpages.fetch_add(1, Ordering::Relaxed);
    m.vm.inc(Item::NrFilePages);
    m.vm.inc(Item::NrShmem);
    m.vm.inc(Item::ShmemSwapin);
    m.vm.inc(Item::Pswpin);
    m.node.lru.add(&m.node.pages, &[f], &m.vm);
    Ok(())
}

/// Replaces locked, unreferenced in-memory-file page `f` by a swap entry after writing it to
/// `slot` (`shmem_writepage`). False if the page is busy (it is unlocked then).
pub(crate) fn shmem_replace_with_swap(
    m: &MmInner,
    mapping: &AddressSpace,
    f: Pfn,
    index: PgOff,
    slot: SwapEntry,
) -> bool {
    let p = &m.node.pages[f];
    {
        let mut t = mapping.lock_tree(&m.vm, LockSite::DeleteFromPageCache);
        if t.get(index.raw()) != Some(Entry::Page(f).encode()) || p.page_count() != 1 {
            return false;
        }
        t.insert(index.raw(), Entry::Swap(slot).encode());
    }
    mapping.nrpages.fetch_sub(1, Ordering::Relaxed);
    m.vm.sub(Item::NrFilePages, 1);
    m.vm.sub(Item::NrShmem, 1);
    m.vm.inc(Item::NrShmemSwapped);
    m.vm.inc(Item::ShmemSwapout);
    true
}
