//! Huge (2 MiB) fault units and the huge zero page. Mirrors `mm/huge_memory.c`:
//! `get_huge_zero_page` / `put_huge_zero_page` on one global reference count, the shrinker that
//! frees the huge zero page when only its own reference is left, and seed 003's
//! `mm_get_huge_zero_page` / `mm_put_huge_zero_page` with the per-mm "used" flag
//! (`MMF_HUGE_ZERO_PAGE`).
//!
//! In a region mapped with huge pages (`MmConfig::thp`), a read of an untouched, aligned 2 MiB
//! unit maps zeros over the whole unit with one UFFDIO_ZEROPAGE (no frame charged) and takes a
//! reference on the huge zero page; a write to it (or to an untouched unit) maps 512 fresh
//! frames at once. Reclaim treats those frames as 512 small pages (Linux splits a THP before
//! swapping it in the kernels the seeds were measured on).
//!
//! With switch `huge_zero_refcount` old, every huge-zero mapping takes a reference on the
//! global counter and every unmap drops one (two atomic read-modify-writes on one shared cache
//! line per unit); new, a manager takes one reference the first time it maps the huge zero
//! page and drops it when it is torn down. `thp_zero_page_get` counts the global operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::settings::Switch;
use crate::sys::{Advice, Mapping};
use crate::vmstat::{Counters, Item};

use super::MmInner;

/// Pages per huge unit (`HPAGE_PMD_NR`).
pub const HPAGE_PMD_NR: u64 = 512;
/// Bytes per huge unit.
pub const HPAGE_PMD_SIZE: usize = 2 << 20;

/// `huge_zero_refcount`: one counter for the whole process, as the kernel has one for the
/// whole machine.
static HUGE_ZERO_REFCOUNT: AtomicU64 = AtomicU64::new(0);
/// `huge_zero_page`: a 2 MiB read-only zero mapping (populated with the shared zero page, so it
/// costs page tables, not memory).
static HUGE_ZERO_PAGE: Mutex<Option<Mapping>> = Mutex::new(None);

/// The global reference count (tests).
#[cfg(any(test, feature = "testing"))]
pub fn huge_zero_refcount() -> u64 {
    HUGE_ZERO_REFCOUNT.load(Ordering::Acquire)
}

/// Whether the huge zero page exists now (tests).
#[cfg(any(test, feature = "testing"))]
pub fn huge_zero_page_allocated() -> bool {
    HUGE_ZERO_PAGE.lock().map(|g| g.is_some()).unwrap_or(false)
}

/// `get_huge_zero_page`: a reference, allocating the page (with the shrinker's extra reference)
/// if it is not there.
pub fn get_huge_zero_page(vm: &Counters) -> bool {
    vm.inc(Item::HugeZeroGet);
    let mut c = HUGE_ZERO_REFCOUNT.load(Ordering::Acquire);
    while c != 0 {
        match HUGE_ZERO_REFCOUNT.compare_exchange_weak(
            c,
            c + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return true,
            Err(now) => c = now,
        }
    }
    let mut page = match HUGE_ZERO_PAGE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if HUGE_ZERO_REFCOUNT.load(Ordering::Acquire) != 0 {
        // Allocated meanwhile.
        HUGE_ZERO_REFCOUNT.fetch_add(1, Ordering::AcqRel);
        return true;
    }
    let Ok(m) = Mapping::anon(HPAGE_PMD_SIZE, HPAGE_PMD_SIZE) else {
        return false;
    };
    let _ = m.advise(0, HPAGE_PMD_SIZE, Advice::PopulateRead);
    *page = Some(m);
    vm.inc(Item::ThpZeroPageAlloc);
    // One for the caller, one the shrinker drops.
    HUGE_ZERO_REFCOUNT.store(2, Ordering::Release);
    true
}

/// `put_huge_zero_page`: drops a reference (never the last: that one is the shrinker's).
pub fn put_huge_zero_page(vm: &Counters) {
    vm.inc(Item::HugeZeroGet);
    let prev = HUGE_ZERO_REFCOUNT.fetch_sub(1, Ordering::AcqRel);
    debug_assert!(prev > 1, "huge zero page reference count underflow");
}

/// The huge zero page shrinker: frees it when only the shrinker's reference is left.
pub fn shrink_huge_zero_page(vm: &Counters) -> bool {
    let mut page = match HUGE_ZERO_PAGE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if HUGE_ZERO_REFCOUNT
        .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        *page = None;
        vm.inc(Item::ThpZeroPageFree);
        return true;
    }
    false
}

/// A reference for mapping one huge-zero unit in manager `m`: per mapping (old) or once per
/// manager (new: `mm_get_huge_zero_page`).
pub fn mm_get_huge_zero_page(m: &MmInner) -> bool {
    if !m.cfg.settings.is_new(Switch::HugeZeroRefcount) {
        return get_huge_zero_page(&m.vm);
    }
    if m.mm.huge_zero_used.load(Ordering::Acquire) {
        return true;
    }
    if !get_huge_zero_page(&m.vm) {
        return false;
    }
    if m.mm.huge_zero_used.swap(true, Ordering::AcqRel) {
        put_huge_zero_page(&m.vm);
    }
    true
}

/// Unmapping one huge-zero unit: drops its reference with the old behaviour; nothing with the
/// new one (the manager's reference goes at teardown).
pub fn put_huge_zero_unit(m: &MmInner) {
    if !m.cfg.settings.is_new(Switch::HugeZeroRefcount) {
        put_huge_zero_page(&m.vm);
    }
}

/// `mm_put_huge_zero_page`: at teardown, the manager's reference.
pub fn mm_put_huge_zero_page(m: &MmInner) {
    if m.mm.huge_zero_used.swap(false, Ordering::AcqRel) {
        put_huge_zero_page(&m.vm);
    }
}
