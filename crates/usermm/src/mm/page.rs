//! Page descriptors (`struct page`) and the frame allocator. Mirrors `include/linux/page-flags.h`,
//! `include/linux/mm_types.h` (flags, refcount, mapping/index, private, lru links) and the role
//! of `mm/page_alloc.c` (free frames, watermark arithmetic lives in `vmscan.rs`).
//!
//! Frame N is a 4 KiB slot of the memory manager's frame pool and descriptor N describes the page
//! that owns it. A resident page is either mapped in its region's view (the pool slot is empty) or
//! parked in its pool slot (unmapped: being reclaimed, in the swap cache after readahead, or
//! unmapped to observe its next reference). A descriptor is 32 bytes: 0.78% of the 4 KiB it manages.

use crate::conv::Narrow;
use crate::sync::{backoff, AtomicU32, AtomicU64, Mutex, OnceLock, Ordering};

/// Page flags (`PG_*`).
pub mod pg {
    pub const LOCKED: u32 = 1 << 0;
    pub const DIRTY: u32 = 1 << 1;
    pub const WRITEBACK: u32 = 1 << 2;
    pub const REFERENCED: u32 = 1 << 3;
    pub const ACTIVE: u32 = 1 << 4;
    pub const SWAPCACHE: u32 = 1 << 5;
    pub const UPTODATE: u32 = 1 << 6;
    pub const RECLAIM: u32 = 1 << 7;
    pub const LRU: u32 = 1 << 8;
    pub const SWAPBACKED: u32 = 1 << 9;
    /// Readahead page not yet used (PG_readahead); cleared and counted as swap_ra_hit on first use.
    pub const READAHEAD: u32 = 1 << 10;
    /// Mapped in the region's view. The user-space analogue of a young pte: a page becomes mapped
    /// only by a fault, and "clearing the accessed bit" means unmapping it into its pool slot.
    pub const MAPPED: u32 = 1 << 11;
    /// Mapped write-protected: a clean page whose swap copy is valid.
    pub const WP: u32 = 1 << 12;
    pub const ERROR: u32 = 1 << 13;
    /// On a free frame: its pool slot still holds a page (left there by reclaim), so the next
    /// user can zero or fill it in place and UFFDIO_MOVE it, instead of the kernel allocating,
    /// zeroing and copying a fresh one.
    pub const POOLED: u32 = 1 << 14;
    /// The descriptor's owner is an address space (a file or in-memory file page), not a
    /// region (`!PageAnon`). Such a page lives in its pool slot, or, while PG_mapped, in the
    /// view of the file region named by `private` (shared, or private until its first store).
    pub const PAGECACHE: u32 = 1 << 15;
    /// The pool slot still holds a copy of this mapped page, queued to be dropped with the next
    /// batch (`pool::defer_zap`): placing a page with UFFDIO_COPY and dropping its slot in
    /// batches avoids the TLB shootdown a single-page MOVE or madvise costs. Only the pool's
    /// zap queue clears it (`init` and `reset_flags` keep it), under the queue's lock.
    pub const ZAPPENDING: u32 = 1 << 16;
    /// The multi-gen LRU's generation of a page on its lists, plus one (0: not on a multi-gen
    /// list), as Linux keeps it in `folio->flags` (`LRU_GEN_MASK`, `LRU_GEN_PGOFF`).
    pub const LRU_GEN_PGOFF: u32 = 17;
    pub const LRU_GEN_MASK: u32 = 0b111 << LRU_GEN_PGOFF;

    const NAMES: [&str; 17] = [
        "locked",
        "dirty",
        "writeback",
        "referenced",
        "active",
        "swapcache",
        "uptodate",
        "reclaim",
        "lru",
        "swapbacked",
        "readahead",
        "mapped",
        "wp",
        "error",
        "pooled",
        "pagecache",
        "zappending",
    ];

    /// The set flags by name (`dirty|lru|mapped`), as `%pGp` prints them.
    pub fn describe(flags: u32) -> String {
        let v: Vec<&str> = (0..NAMES.len())
            .filter(|b| flags & (1 << b) != 0)
            .map(|b| NAMES[b])
            .collect();
        if v.is_empty() {
            "0".into()
        } else {
            v.join("|")
        }
    }
    /// A fresh anonymous page mapped in its region (`do_anonymous_page`, the copy of a COW or
    /// zero-page write, an adopted page): uptodate, dirty (no swap copy), swap-backed, mapped.
    pub const ANON_MAPPED: u32 = UPTODATE | DIRTY | SWAPBACKED | MAPPED;
}

/// `struct page`, 32 bytes.
#[derive(Debug, Default)]
pub struct Page {
    flags: AtomicU32,
    refcount: AtomicU32,
    /// Owner (`page->mapping` + `page->index`): region or address-space id << 40 | page index.
    mapping: AtomicU64,
    /// Swap slot while PG_swapcache; where it is mapped for a mapped page-cache page.
    private: AtomicU64,
    /// LRU links (frame numbers), protected by the lruvec lock.
    lru_prev: AtomicU32,
    lru_next: AtomicU32,
}

const INDEX_BITS: u32 = 40;

/// A page frame number: frame N of the pool and descriptor N in the [`MemMap`] (`pfn`).
/// Frames and their descriptors are only ever named by a `Pfn`; its byte offset in the pool
/// is [`Pfn::offset`] (`pfn << PAGE_SHIFT`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(transparent)]
pub struct Pfn(u32);

impl Pfn {
    /// No frame: the end of an LRU list, a page-table slot without a frame.
    pub const NONE: Pfn = Pfn(u32::MAX);

    pub const fn new(n: u32) -> Pfn {
        Pfn(n)
    }
    /// The frame number.
    #[inline]
    pub const fn raw(self) -> u32 {
        self.0
    }
    /// The frame number as an index (into the mem_map, a bitmap).
    #[inline]
    pub const fn idx(self) -> usize {
        self.0 as usize
    }
    /// The frame's byte offset in the pool.
    #[cfg(not(loom))]
    #[inline]
    pub const fn offset(self) -> usize {
        self.0 as usize * crate::sys::PAGE_SIZE
    }
    /// The next frame: runs of consecutive frames are moved in one call.
    #[inline]
    pub const fn next(self) -> Pfn {
        Pfn(self.0 + 1)
    }
}

impl std::fmt::Display for Pfn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A page's offset in its object (`pgoff_t`): page N of a region, or of a file. Page counts
/// and byte offsets stay integers; a page is named by its `PgOff`. Arithmetic: `off + n` and
/// `off - n` move by `n` pages, `b - a` is the number of pages from `a` to `b`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(transparent)]
pub struct PgOff(u64);

impl PgOff {
    pub const ZERO: PgOff = PgOff(0);
    /// The last possible page: "to the end" of a range.
    pub const MAX: PgOff = PgOff(u64::MAX);

    pub const fn new(n: u64) -> PgOff {
        PgOff(n)
    }
    /// The page number.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }
    /// The next page.
    #[inline]
    pub const fn next(self) -> PgOff {
        PgOff(self.0 + 1)
    }
    /// The page's first byte in its mapping (a region's view): `pgoff << PAGE_SHIFT`.
    #[cfg(not(loom))]
    #[inline]
    pub fn offset(self) -> usize {
        crate::conv::Narrow::usize(self.0) * crate::sys::PAGE_SIZE
    }
    /// The page's first byte in its file.
    #[cfg(not(loom))]
    #[inline]
    pub const fn byte_offset(self) -> u64 {
        self.0 * crate::sys::PAGE_SIZE as u64
    }
    /// The page holding byte `off` of its mapping (inverse of [`PgOff::offset`]).
    #[cfg(not(loom))]
    #[inline]
    pub const fn of_offset(off: usize) -> PgOff {
        PgOff((off / crate::sys::PAGE_SIZE) as u64)
    }
    /// The page holding byte `off` of its object.
    #[cfg(not(loom))]
    #[inline]
    pub const fn of_byte(off: u64) -> PgOff {
        PgOff(off / crate::sys::PAGE_SIZE as u64)
    }
    /// This page rounded down to a multiple of `n` pages (`round_down`): the first page of its
    /// `n`-page unit.
    #[inline]
    pub const fn round_down(self, n: u64) -> PgOff {
        PgOff(self.0 - self.0 % n)
    }
    /// The page `k` pages from this one, upwards or `down` (a run walked in either direction).
    #[inline]
    pub const fn step(self, k: u64, down: bool) -> PgOff {
        if down {
            PgOff(self.0 - k)
        } else {
            PgOff(self.0 + k)
        }
    }
    /// The pages `[from, to)` in order (`Range<PgOff>` cannot iterate on stable Rust).
    pub fn range(from: PgOff, to: PgOff) -> impl DoubleEndedIterator<Item = PgOff> + Clone {
        (from.0..to.0).map(PgOff)
    }
}

impl std::ops::Add<u64> for PgOff {
    type Output = PgOff;
    #[inline]
    fn add(self, n: u64) -> PgOff {
        PgOff(self.0 + n)
    }
}

impl std::ops::AddAssign<u64> for PgOff {
    #[inline]
    fn add_assign(&mut self, n: u64) {
        self.0 += n;
    }
}

impl std::ops::Sub<u64> for PgOff {
    type Output = PgOff;
    #[inline]
    fn sub(self, n: u64) -> PgOff {
        PgOff(self.0 - n)
    }
}

impl std::ops::Sub for PgOff {
    type Output = u64;
    /// The number of pages from `o` to `self`.
    #[inline]
    fn sub(self, o: PgOff) -> u64 {
        self.0 - o.0
    }
}

impl std::fmt::Display for PgOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A swap entry: a slot on the manager's swap device (`swp_entry_t`). usermm has one swap
/// device per manager, so the entry is the slot's offset (`swp_offset`), which is what the
/// device's I/O takes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(transparent)]
pub struct SwapEntry(u64);

impl SwapEntry {
    pub const fn new(offset: u64) -> SwapEntry {
        SwapEntry(offset)
    }
    /// `swp_offset`: the slot on the device.
    #[inline]
    pub const fn offset(self) -> u64 {
        self.0
    }
    /// `swap_cache_index`: the entry's page index in its swap-cache address space.
    #[inline]
    pub const fn cache_index(self) -> PgOff {
        PgOff(self.0)
    }
    /// The next slot: a run of consecutive slots is one device I/O.
    #[inline]
    pub const fn next(self) -> SwapEntry {
        SwapEntry(self.0 + 1)
    }
}

impl From<u64> for SwapEntry {
    fn from(offset: u64) -> SwapEntry {
        SwapEntry(offset)
    }
}

impl std::fmt::Display for SwapEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A table of `T`, one per frame, made a section at a time on first use, as Linux's sparse
/// memory model (`CONFIG_SPARSEMEM`, `mem_section`) populates its memory map: frames are
/// handed out in ascending order, so a process that uses a little of a large budget writes
/// entries for only that little. Written eagerly, the page descriptors alone (32 bytes a frame)
/// cost every process that starts a manager 8 MiB of page faults per GiB of budget: a `gcc -E`
/// under a 2 GiB budget took 18 ms more than under 64 MiB, and `make` starts dozens of such
/// processes.
#[derive(Debug)]
pub struct Sections<T> {
    sections: Box<[OnceLock<Box<[T]>>]>,
    len: usize,
}

/// Entries per section.
const SECTION_SHIFT: u32 = 12;
const SECTION_MASK: usize = (1 << SECTION_SHIFT) - 1;

impl<T: Default> Sections<T> {
    pub fn new(len: usize) -> Sections<T> {
        let n = len.div_ceil(1 << SECTION_SHIFT);
        let t = Sections {
            sections: (0..n).map(|_| OnceLock::new()).collect(),
            len,
        };
        // loom models every atomic it sees created: make them all at once, inside the model.
        if cfg!(loom) {
            (0..n).for_each(|k| {
                t.section(k);
            });
        }
        t
    }
    /// Section `k`, made on first use (`sparse_init_one_section`).
    #[inline]
    fn section(&self, k: usize) -> &[T] {
        self.sections[k].get_or_init(|| {
            let first = k << SECTION_SHIFT;
            let n = (self.len - first).min(1 << SECTION_SHIFT);
            (0..n).map(|_| T::default()).collect()
        })
    }
    /// Entries in all.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No entries (`len` has its `is_empty`; nothing else asks yet).
    #[allow(dead_code)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Entry `i` if its section was made (an entry never made holds `T::default()`); None
    /// also beyond the end.
    #[inline]
    pub fn get_made(&self, i: usize) -> Option<&T> {
        self.sections
            .get(i >> SECTION_SHIFT)?
            .get()?
            .get(i & SECTION_MASK)
    }
    /// Every entry in order; makes every section.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.sections.len()).flat_map(move |k| self.section(k).iter())
    }
    /// Sections made so far.
    #[cfg(test)]
    fn made(&self) -> usize {
        self.sections.iter().filter(|s| s.get().is_some()).count()
    }
}

impl<T: Default> std::ops::Index<usize> for Sections<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.section(i >> SECTION_SHIFT)[i & SECTION_MASK]
    }
}

/// The page descriptors, one per frame (`mem_map`), indexed by [`Pfn`] (`pfn_to_page`), made
/// a section at a time ([`Sections`]).
#[derive(Debug)]
pub struct MemMap(Sections<Page>);

impl MemMap {
    pub fn new(nr: u32) -> MemMap {
        MemMap(Sections::new(nr as usize))
    }
    /// Every frame with its descriptor (`for_each_valid_pfn`).
    pub fn iter(&self) -> impl Iterator<Item = (Pfn, &Page)> {
        self.0.iter().enumerate().map(|(i, p)| (Pfn(i.u32()), p))
    }
}

impl std::ops::Index<Pfn> for MemMap {
    type Output = Page;
    #[inline]
    fn index(&self, f: Pfn) -> &Page {
        &self.0[f.idx()]
    }
}

impl Page {
    #[inline]
    pub fn flags(&self) -> u32 {
        self.flags.load(Ordering::Acquire)
    }
    #[inline]
    pub fn test(&self, f: u32) -> bool {
        self.flags() & f != 0
    }
    #[inline]
    pub fn set(&self, f: u32) {
        self.flags.fetch_or(f, Ordering::AcqRel);
    }
    #[inline]
    pub fn clear(&self, f: u32) {
        self.flags.fetch_and(!f, Ordering::AcqRel);
    }
    /// Atomic test-and-clear (`TestClearPageReferenced`).
    #[inline]
    pub fn test_clear(&self, f: u32) -> bool {
        self.flags.fetch_and(!f, Ordering::AcqRel) & f != 0
    }
    /// Atomic test-and-set.
    #[inline]
    pub fn test_set(&self, f: u32) -> bool {
        self.flags.fetch_or(f, Ordering::AcqRel) & f != 0
    }
    /// `trylock_page`.
    #[inline]
    pub fn trylock(&self) -> bool {
        !self.test_set(pg::LOCKED)
    }
    /// `lock_page`: waits for holders, which only hold it across bounded work (one I/O batch).
    pub fn lock(&self) {
        let mut it = 0;
        while !self.trylock() {
            backoff(&mut it);
        }
    }
    /// `lock_page` for at most `timeout`: true if locked. For waiters that must not sit behind a
    /// holder that could itself be waiting for them.
    pub fn lock_for(&self, timeout: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        let mut it = 0;
        while !self.trylock() {
            if t0.elapsed() > timeout {
                return false;
            }
            backoff(&mut it);
        }
        true
    }
    /// `unlock_page`.
    #[inline]
    pub fn unlock(&self) {
        self.clear(pg::LOCKED);
    }
    /// Replaces every flag at once: a descriptor being freed (0) or parked free with its pool
    /// page kept (`pg::POOLED`). Only for a page nobody else can reach.
    pub fn reset_flags(&self, flags: u32) {
        self.store_flags_keeping_zap(flags);
    }
    /// Who owns the page and at which index (`page->mapping`, `page->index`): a region for an
    /// anonymous page, an address space for a page-cache page (PG_pagecache says which).
    pub fn owner(&self) -> Owner {
        let (id, index) = unpack(self.mapping.load(Ordering::Acquire));
        if self.test(pg::PAGECACHE) {
            Owner::Cache(MappingId(id), index)
        } else {
            Owner::Anon(RegionId(id), index)
        }
    }
    /// `page->index`: the page's index in its region or file.
    pub fn index(&self) -> PgOff {
        unpack(self.mapping.load(Ordering::Acquire)).1
    }
    /// The swap slot of a swap-cache page (`page_private()` holding the swap entry).
    pub fn swap_entry(&self) -> SwapEntry {
        SwapEntry(self.private.load(Ordering::Acquire))
    }
    pub fn set_swap_entry(&self, entry: SwapEntry) {
        self.private.store(entry.0, Ordering::Release);
    }
    /// Where a page-cache page is mapped: the file region and the page index in it
    /// (usermm maps a cache page in at most one view). Kept in the private word.
    pub fn mapped_at(&self) -> (RegionId, PgOff) {
        let (id, index) = unpack(self.private.load(Ordering::Acquire));
        (RegionId(id), index)
    }
    pub fn set_mapped_at(&self, region: RegionId, index: PgOff) {
        self.private.store(pack(region.0, index), Ordering::Release);
    }
    /// The raw private word (for descriptions in logs).
    pub fn private_word(&self) -> u64 {
        self.private.load(Ordering::Relaxed)
    }
    /// `get_page`: takes a reference.
    pub fn get_page(&self) {
        self.refcount.fetch_add(1, Ordering::AcqRel);
    }
    /// `put_page`: drops a reference.
    pub fn put_page(&self) {
        self.refcount.fetch_sub(1, Ordering::AcqRel);
    }
    /// `page_count`: the references held.
    pub fn page_count(&self) -> u32 {
        self.refcount.load(Ordering::Acquire)
    }
    /// `set_page_count`.
    pub fn set_page_count(&self, n: u32) {
        self.refcount.store(n, Ordering::Release);
    }
    /// The LRU neighbours (`page->lru`), owned by lru.rs under the lruvec lock.
    pub(super) fn lru_links(&self) -> (Pfn, Pfn) {
        (
            Pfn(self.lru_prev.load(Ordering::Relaxed)),
            Pfn(self.lru_next.load(Ordering::Relaxed)),
        )
    }
    pub(super) fn set_lru_prev(&self, f: Pfn) {
        self.lru_prev.store(f.0, Ordering::Relaxed);
    }
    pub(super) fn set_lru_next(&self, f: Pfn) {
        self.lru_next.store(f.0, Ordering::Relaxed);
    }
    /// Resets a freshly allocated descriptor for `owner` with the given flags; a page-cache
    /// owner sets PG_pagecache.
    pub fn init(&self, owner: Owner, flags: u32) {
        let (id, index, flags) = match owner {
            Owner::Anon(r, i) => {
                debug_assert!(
                    flags & pg::PAGECACHE == 0,
                    "an anonymous page in the page cache"
                );
                (r.0, i, flags)
            }
            Owner::Cache(a, i) => (a.0, i, flags | pg::PAGECACHE),
        };
        self.mapping.store(pack(id, index), Ordering::Release);
        self.private.store(0, Ordering::Relaxed);
        self.refcount.store(1, Ordering::Relaxed);
        self.store_flags_keeping_zap(flags);
    }
    /// Replaces the flags except PG_zappending, which only the pool's zap queue clears.
    fn store_flags_keeping_zap(&self, flags: u32) {
        let mut old = self.flags.load(Ordering::Relaxed);
        loop {
            let new = (flags & !pg::ZAPPENDING) | (old & pg::ZAPPENDING);
            match self
                .flags
                .compare_exchange_weak(old, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(o) => old = o,
            }
        }
    }
}

/// A region's number in the manager's region table: the owner of its anonymous pages, the
/// rmap's way back from a page to where it is mapped (`anon_vma`, by number).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RegionId(u32);

/// An address space's number in the manager's file table (`page->mapping` of a page-cache
/// page: a cached file or an in-memory file).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MappingId(u32);

macro_rules! table_id {
    ($t:ident) => {
        impl $t {
            pub const fn new(n: u32) -> $t {
                $t(n)
            }
            /// The slot in its table.
            pub const fn idx(self) -> usize {
                self.0 as usize
            }
        }
        impl From<u32> for $t {
            fn from(n: u32) -> $t {
                $t(n)
            }
        }
        impl From<$t> for usize {
            fn from(id: $t) -> usize {
                id.0 as usize
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}
table_id!(RegionId);
table_id!(MappingId);

impl MappingId {
    /// The swap cache's address spaces: not in the file table, never a page's owner
    /// (a swap-cache page stays owned by its region).
    pub const SWAP: MappingId = MappingId(u32::MAX);
}

/// A table of owners by id, reusing freed ids (the region table, the file table).
#[cfg(not(loom))]
#[derive(Debug)]
pub struct IdTable<I, T> {
    slots: Vec<Option<std::sync::Arc<T>>>,
    free: Vec<I>,
}

#[cfg(not(loom))]
impl<I, T> Default for IdTable<I, T> {
    fn default() -> Self {
        IdTable {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

#[cfg(not(loom))]
impl<I: Copy + From<u32> + Into<usize>, T> IdTable<I, T> {
    /// Stores the owner `make` builds for a free id; returns it.
    pub fn insert(&mut self, make: impl FnOnce(I) -> std::sync::Arc<T>) -> std::sync::Arc<T> {
        let id = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            I::from((self.slots.len() - 1).u32())
        });
        let v = make(id);
        self.slots[id.into()] = Some(v.clone());
        v
    }
    pub fn get(&self, id: I) -> Option<&std::sync::Arc<T>> {
        self.slots.get(id.into()).and_then(|v| v.as_ref())
    }
    /// Frees `id` for reuse; returns what it held.
    pub fn remove(&mut self, id: I) -> Option<std::sync::Arc<T>> {
        let v = self.slots.get_mut(id.into())?.take();
        if v.is_some() {
            self.free.push(id);
        }
        v
    }
    /// The live owners.
    pub fn iter(&self) -> impl Iterator<Item = &std::sync::Arc<T>> {
        self.slots.iter().flatten()
    }
}

/// Who owns a page, and the page's index there (`page->mapping` + `page->index`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Owner {
    /// An anonymous page of a region (`PageAnon`), possibly in the swap cache.
    Anon(RegionId, PgOff),
    /// A page-cache page of an address space.
    Cache(MappingId, PgOff),
}

/// The largest page index a region may have (2^40 pages = 4 PiB).
pub const MAX_REGION_PAGES: u64 = 1 << INDEX_BITS;

/// One word for (region or address-space id, page index): the id above `INDEX_BITS`.
fn pack(id: u32, index: PgOff) -> u64 {
    debug_assert!(index.0 < MAX_REGION_PAGES);
    ((id as u64) << INDEX_BITS) | index.0
}

fn unpack(v: u64) -> (u32, PgOff) {
    ((v >> INDEX_BITS) as u32, PgOff(v & (MAX_REGION_PAGES - 1)))
}

/// Free frames: a bitmap (1 = free) scanned from a rotating cursor, so that frames freed in a
/// batch are handed out again as one ascending run (batched MOVEs into and out of the pool).
#[derive(Debug)]
pub struct FrameAlloc {
    inner: Mutex<Bitmap>,
    nr_free: AtomicU64,
    nr: u32,
}

#[derive(Debug)]
struct Bitmap {
    words: Vec<u64>,
    cursor: usize,
}

impl FrameAlloc {
    pub fn new(nr: u32) -> FrameAlloc {
        let nwords = (nr as usize).div_ceil(64);
        let mut words = vec![u64::MAX; nwords];
        let tail = nr as usize % 64;
        if tail != 0 {
            words[nwords - 1] = (1u64 << tail) - 1;
        }
        FrameAlloc {
            inner: Mutex::new(Bitmap { words, cursor: 0 }),
            nr_free: AtomicU64::new(nr as u64),
            nr,
        }
    }

    pub fn nr(&self) -> u32 {
        self.nr
    }

    pub fn nr_free(&self) -> u64 {
        self.nr_free.load(Ordering::Relaxed)
    }

    /// Appends up to `n` free frames (ascending from the cursor) to `out`; returns how many.
    pub fn alloc(&self, n: usize, out: &mut Vec<Pfn>) -> usize {
        if n == 0 || self.nr_free() == 0 {
            return 0;
        }
        let mut b = self.inner.lock();
        let nwords = b.words.len();
        let mut got = 0;
        let start = b.cursor;
        let mut w = start;
        for _ in 0..=nwords {
            let mut word = b.words[w];
            while word != 0 && got < n {
                let bit = word.trailing_zeros() as usize;
                word &= word - 1;
                out.push(Pfn((w * 64 + bit).u32()));
                got += 1;
            }
            b.words[w] = word;
            if got == n {
                break;
            }
            w = (w + 1) % nwords;
        }
        b.cursor = w;
        // Under the lock, like the bitmap: a free's add landing after this sub would otherwise
        // let the count dip below zero (wrapping) and the resident count above the budget.
        self.nr_free.fetch_sub(got as u64, Ordering::Relaxed);
        drop(b);
        got
    }

    /// Whether frame `f` is free.
    pub fn is_free(&self, f: Pfn) -> bool {
        let b = self.inner.lock();
        b.words[f.idx() / 64] & (1 << (f.0 % 64)) != 0
    }

    /// Takes up to `n` free frames for which `pred` holds into `out` (a walk of the whole
    /// bitmap: for draining, not for allocation); returns how many.
    pub fn take_matching(&self, n: usize, pred: impl Fn(Pfn) -> bool, out: &mut Vec<Pfn>) -> usize {
        let mut b = self.inner.lock();
        let mut got = 0;
        for w in 0..b.words.len() {
            let mut word = b.words[w];
            while word != 0 && got < n {
                let bit = word.trailing_zeros() as usize;
                word &= word - 1;
                let f = Pfn((w * 64 + bit).u32());
                if pred(f) {
                    b.words[w] &= !(1u64 << bit);
                    out.push(f);
                    got += 1;
                }
            }
        }
        self.nr_free.fetch_sub(got as u64, Ordering::Relaxed);
        drop(b);
        got
    }

    /// Returns frames to the free pool.
    pub fn free(&self, frames: &[Pfn]) {
        if frames.is_empty() {
            return;
        }
        let mut b = self.inner.lock();
        for &f in frames {
            let (w, bit) = (f.idx() / 64, f.0 % 64);
            debug_assert!(b.words[w] & (1 << bit) == 0, "double free of frame {f}");
            b.words[w] |= 1 << bit;
        }
        self.nr_free
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        drop(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_map_is_made_a_section_at_a_time() {
        let n = 3 << SECTION_SHIFT | 5;
        let m = MemMap::new(n);
        assert_eq!(m.0.made(), 0);
        assert!(m.0.get_made(7).is_none());
        m[Pfn(7)].set(pg::DIRTY);
        assert_eq!(m.0.made(), 1);
        assert!(m.0.get_made(7).is_some_and(|p| p.test(pg::DIRTY)));
        let last = Pfn(n - 1);
        assert_eq!(m[last].flags(), 0);
        assert_eq!(m.0.made(), 2);
        // Every frame, once, in order; the one written keeps its flag.
        let all: Vec<Pfn> = m.iter().map(|(f, _)| f).collect();
        assert_eq!(all, (0..n).map(Pfn).collect::<Vec<_>>());
        assert_eq!(m.0.made(), 4);
        assert!(m[Pfn(7)].test(pg::DIRTY));
        assert_eq!(m.iter().filter(|(_, p)| p.flags() != 0).count(), 1);
    }

    #[test]
    fn descriptor_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Page>(), 32);
        assert!(std::mem::size_of::<Page>() * 100 <= 4096);
    }

    #[test]
    fn alloc_free_runs() {
        let a = FrameAlloc::new(130);
        let mut v = vec![];
        assert_eq!(a.alloc(100, &mut v), 100);
        assert_eq!(v, (0..100).map(Pfn).collect::<Vec<_>>());
        assert_eq!(a.nr_free(), 30);
        let mut w = vec![];
        assert_eq!(a.alloc(100, &mut w), 30);
        assert_eq!(a.alloc(1, &mut w), 0);
        a.free(&v[10..42]);
        let mut x = vec![];
        assert_eq!(a.alloc(32, &mut x), 32);
        assert_eq!(x, (10..42).map(Pfn).collect::<Vec<_>>());
    }

    #[test]
    fn flags_and_lock() {
        let p = Page::default();
        p.init(Owner::Anon(RegionId(3), PgOff(99)), pg::UPTODATE);
        assert_eq!(p.owner(), Owner::Anon(RegionId(3), PgOff(99)));
        assert_eq!(p.index(), PgOff(99));
        p.init(Owner::Cache(MappingId(3), PgOff(7)), pg::UPTODATE);
        assert!(p.test(pg::PAGECACHE), "a cache owner sets PG_pagecache");
        assert_eq!(p.owner(), Owner::Cache(MappingId(3), PgOff(7)));
        assert!(p.trylock());
        assert!(!p.trylock());
        p.unlock();
        p.set(pg::REFERENCED);
        assert!(p.test_clear(pg::REFERENCED));
        assert!(!p.test(pg::REFERENCED));
    }
}
