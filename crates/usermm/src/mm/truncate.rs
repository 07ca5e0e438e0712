//! Truncation and eviction of a mapping's pages. Mirrors `mm/truncate.c`
//! (`truncate_inode_pages_range`, `truncate_setsize`, `pagecache_isize_extended`: pages of shared
//! regions that faulted beyond the old end become accessible when the file grows).

use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};
use crate::sys::PAGE_SIZE;
use crate::vmstat::Item;

use super::filemap::*;
use super::page::pg;
use super::region::RegionInner;
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
        truncate_pages_only(m, mapping, size.div_ceil(ps), old.div_ceil(ps));
        if !size.is_multiple_of(ps) {
            let index = size / ps;
            if let Some(f) = find_lock_page(m, mapping, index)? {
                let from = (size % ps).usize();
                copy_to_page(m, mapping, f, from, &vec![0u8; PAGE_SIZE - from]);
                m.pages[f].unlock();
                put_page(m, f);
            }
        }
    }
    if size > old {
        file_grew(m, mapping, old, size);
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
    truncate_pages_only(m, mapping, 0, u64::MAX);
}

fn truncate_pages_only(m: &MmInner, mapping: &AddressSpace, from: u64, to: u64) -> usize {
    let mut n = 0;
    let mut entries: Vec<(u64, u64)> = Vec::new();
    mapping
        .lock_tree(&m.vm, LockSite::FindGetPage)
        .gang_lookup(from, to, usize::MAX, &mut entries);
    for (index, e) in entries {
        match Entry::decode(e) {
            Entry::Page(f) => {
                if lock_page_in(m, mapping, f, index, false) {
                    if m.pages[f].test(pg::MAPPED) {
                        super::rmap::unmap_file_page(m, f);
                    }
                    if remove_page(m, mapping, f, index, false) {
                        n += 1;
                    } else {
                        m.pages[f].unlock();
                    }
                }
            }
            Entry::Swap(slot) => {
                mapping
                    .lock_tree(&m.vm, LockSite::DeleteFromPageCache)
                    .remove(index);
                if let Some(sw) = &m.swap {
                    sw.swap_free(slot, &m.vm);
                }
                m.vm.sub(Item::NrShmemSwapped, 1);
            }
        }
    }
    n
}

/// The file grew from `old` to `new` bytes: pages of shared regions that faulted beyond the old
/// end (SIGBUS markers) become accessible again.
pub(crate) fn file_grew(m: &MmInner, mapping: &AddressSpace, old: u64, new: u64) {
    let regions: Vec<Arc<RegionInner>> = {
        let mut l = mapping.i_mmap.lock();
        l.retain(|w| w.strong_count() > 0);
        l.iter().filter_map(|w| w.upgrade()).collect()
    };
    let ps = PAGE_SIZE as u64;
    for r in regions {
        let Some(fm) = &r.file else { continue };
        let first = (old / ps).saturating_sub(fm.pgoff);
        let last = new.div_ceil(ps).saturating_sub(fm.pgoff).min(r.npages());
        let mut used = Vec::new();
        r.pt.for_each_used(first, last, |i, p| {
            if p == super::pgtable::Pte::Poison {
                used.push(i);
            }
        });
        log::debug!(
            "file_grew {old}->{new}: region {} pages {first}..{last} poisoned {:?}",
            r.id,
            used
        );
        for i in used {
            let mut g = r.pt.lock(i);
            if g.get() == super::pgtable::Pte::Poison {
                let _ = r.view.advise(
                    i.usize() * PAGE_SIZE,
                    PAGE_SIZE,
                    crate::sys::Advice::DontNeed,
                );
                g.set(super::pgtable::Pte::None);
            }
        }
    }
    let _ = m;
}
