//! Truncation and eviction of a mapping's pages. Mirrors `mm/truncate.c`
//! (`truncate_inode_pages_range`, `truncate_setsize`). Growing a file calls
//! `pagecache_isize_extended`, which lives in filemap.rs with the write path that also grows files.

use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};
use crate::sys::PAGE_SIZE;
use crate::vmstat::Item;

use super::filemap::*;
use super::fs::{AddressSpace, Entry, LockSite};
use super::page::pg;
use super::page::PgOff;
use super::MmInner;
use crate::conv::Narrow;

/// Truncates or extends `mapping` to `size` bytes: pages wholly past the new end are dropped
/// (`truncate_inode_pages_range`), the partial last page is zeroed past the end.
pub fn truncate(m: &MmInner, mapping: &Arc<AddressSpace>, size: u64) -> Result<()> {
    let _io = mapping.io_lock.lock();
    let ps = PAGE_SIZE as u64;
    let old = {
        let _eof = mapping.eof_lock.lock();
        mapping.size.swap(size, Ordering::AcqRel)
    };
    if size < old {
        // What was data past the new end is a hole (or nothing) once the file grows again.
        *mapping.data_extent.lock() = (0, 0);
        let eof = PgOff::new(size.div_ceil(ps));
        truncate_pages_only(m, mapping, eof, PgOff::new(old.div_ceil(ps)));
        // truncate_pagecache's unmap_mapping_range(even_cows): a private region's pages past
        // the new end go too, its own copies included; touching them raises SIGBUS.
        for r in i_mmap_regions(m, mapping) {
            let Some(fm) = r.file.as_ref().filter(|fm| !fm.shared) else {
                continue;
            };
            let from = PgOff::new(eof.raw().saturating_sub(fm.pgoff.raw()));
            if from < r.end() {
                super::madvise::zap_page_range(m, &r, from, r.end(), false);
            }
        }
        if !size.is_multiple_of(ps) {
            let index = PgOff::of_byte(size);
            if let Some(f) = find_lock_page(m, mapping, index)? {
                let from = (size % ps).usize();
                copy_to_page(m, mapping, f, from, &vec![0u8; PAGE_SIZE - from]);
                m.node.pages[f].unlock();
                put_page(&m.node, f);
            }
        }
    }
    if size > old {
        pagecache_isize_extended(m, mapping, old, size);
    }
    if let Some(file) = mapping.file() {
        let _eof = mapping.eof_lock.lock();
        file.set_len(mapping.size.load(Ordering::Acquire))
            .map_err(|e| Error::io(format!("truncating {} to {size} bytes", mapping.name()), e))?;
    }
    Ok(())
}

/// Drops every page of `mapping` (eviction of an unused mapping, after writeback).
pub(crate) fn evict_all(m: &MmInner, mapping: &AddressSpace) {
    let size = mapping.size.load(Ordering::Acquire);
    let _ = size;
    truncate_pages_only(m, mapping, PgOff::ZERO, PgOff::MAX);
}

fn truncate_pages_only(m: &MmInner, mapping: &AddressSpace, from: PgOff, to: PgOff) -> usize {
    mapping.shadows.forget(from, to);
    let mut n = 0;
    let mut entries: Vec<(u64, u64)> = Vec::new();
    mapping.lock_tree(&m.vm, LockSite::FindGetPage).gang_lookup(
        from.raw(),
        to.raw(),
        usize::MAX,
        &mut entries,
    );
    for (index, e) in entries {
        let index = PgOff::new(index);
        match Entry::decode(e) {
            Entry::Page(f) => {
                if lock_page_in(m, mapping, f, index, false) {
                    if m.node.pages[f].test(pg::MAPPED) {
                        super::rmap::unmap_file_page(m, f);
                    }
                    if remove_page(m, mapping, f, index, false) {
                        n += 1;
                    } else {
                        m.node.pages[f].unlock();
                    }
                }
            }
            Entry::Swap(slot) => {
                mapping
                    .lock_tree(&m.vm, LockSite::DeleteFromPageCache)
                    .remove(index.raw());
                if let Some(sw) = &m.swap {
                    sw.swap_free(slot, &m.vm);
                }
                m.vm.sub(Item::NrShmemSwapped, 1);
            }
        }
    }
    n
}
