//! Refault detection. Mirrors `mm/workingset.c`: `workingset_eviction` leaves a shadow where
//! an evicted page was (its address space's slot: the file's page cache, or the swap cache's
//! space for a swap slot, as Linux keeps shadow entries in both trees), and
//! `workingset_refault` finds it when the page comes back, counts the refault
//! (`workingset_refault_anon`/`_file`) and asks the replacement policy whether the page
//! refaulted soon enough to be part of the working set (`workingset_activate_anon`/`_file`:
//! it is added PG_active).
//!
//! A shadow is the policy's eviction token ([`ReplacementPolicy::eviction_token`]). Shadows
//! live beside the tree in a map per address space rather than as value entries in it, so the
//! lookups that expect pages and swap entries are unchanged; they die with their address space,
//! and truncation and `swap_free` drop theirs. Linux bounds shadow nodes with a shrinker; here
//! a file's address space (its `Shadows`, fs.rs) keeps at most [`SHADOWS_PER_FRAME`] shadows
//! per frame of the budget and forgets all of them when it reaches that (a refault further
//! away than that never activates under either policy; it is not counted either). A swap-cache
//! space keeps one word per slot, bounded by its slots: a shadow lives as long as its swapped
//! page.
//!
//! [`ReplacementPolicy::eviction_token`]: super::replacement::ReplacementPolicy::eviction_token

use crate::vmstat::Item;

use super::fs::AddressSpace;
use super::page::PgOff;
use super::MmInner;

/// Shadows an address space may hold per frame of the budget.
pub const SHADOWS_PER_FRAME: usize = 2;

/// `workingset_eviction`: page `index` of `mapping` (a file's, or the swap cache space of a
/// slot) was evicted; `file` is its type (not swap-backed).
pub fn workingset_eviction(m: &MmInner, mapping: &AddressSpace, index: PgOff, file: bool) {
    let token = m.node.lru.eviction_token(file);
    let cap = SHADOWS_PER_FRAME * m.node.frames.nr() as usize;
    mapping.shadows.insert(index.raw(), token, cap);
}

/// `workingset_refault`: a new page of type `file` (not yet on the LRU) holds page `index` of
/// `mapping` again. A shadow there makes it a refault (counted); returns whether the policy
/// says it refaulted soon enough to be added PG_active (counted as an activation), which the
/// caller sets.
pub fn workingset_refault(m: &MmInner, mapping: &AddressSpace, index: PgOff, file: bool) -> bool {
    let Some(token) = mapping.shadows.take(index.raw()) else {
        return false;
    };
    m.vm.inc(if file {
        Item::WorkingsetRefaultFile
    } else {
        Item::WorkingsetRefaultAnon
    });
    if !m.node.lru.refault_activates(token, file) {
        return false;
    }
    m.vm.inc(if file {
        Item::WorkingsetActivateFile
    } else {
        Item::WorkingsetActivateAnon
    });
    true
}
