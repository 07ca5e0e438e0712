//! `struct address_space` and its neighbours (include/linux/fs.h): one file's (or the swap
//! cache's) index of pages, a radix tree of frames with DIRTY/WRITEBACK/TOWRITE marks under a
//! `tree_lock` whose wait time is counted per call site (`lock_wait_ns.<site>` in vmstat), what
//! backs it (`Host`), its flags (`AS_*`), and its operations (`address_space_operations`): the
//! per-kind entry points the page cache and the flushers call without knowing the kind (a disk
//! file's in filemap.rs, an in-memory file's in shmem.rs, the swap cache's in swap_state.rs). The
//! type sits below the page cache, writeback and the region table, so all three use it and none
//! of them needs another for it.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::time::Instant;

use crate::error::Result;
use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering, RwLock};
use crate::vmstat::{Counters, Item};

use super::errseq::ErrSeq;
use super::page::{MappingId, Pfn, PgOff, RegionId, SwapEntry};
use super::radix_tree::{Mark, RadixTree};
use super::MmInner;
use crate::conv::{Narrow, Saturate};

/// Mapping flags (`AS_*`).
pub mod as_flags {
    /// Writeback start and end flip only the page flag; the tree's marks are not maintained
    /// (set on the swap cache: seed 000).
    pub const NO_WRITEBACK_TAGS: u32 = 1 << 0;
    /// Shared with the swap device (the swap cache's spaces).
    pub const SWAP: u32 = 1 << 1;
}

/// Call sites that take a mapping's tree lock, each with its own wait-time counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockSite {
    AddToPageCache,
    FindGetPage,
    DeleteFromPageCache,
    SetPageDirty,
    SetPageWriteback,
    EndPageWriteback,
    TagPagesForWriteback,
    FindGetPagesTag,
    AddToSwapCache,
    DeleteFromSwapCache,
}

impl LockSite {
    pub(crate) fn item(self) -> Item {
        match self {
            LockSite::AddToPageCache => Item::LwAddToPageCache,
            LockSite::FindGetPage => Item::LwFindGetPage,
            LockSite::DeleteFromPageCache => Item::LwDeleteFromPageCache,
            LockSite::SetPageDirty => Item::LwSetPageDirty,
            LockSite::SetPageWriteback => Item::LwSetPageWriteback,
            LockSite::EndPageWriteback => Item::LwEndPageWriteback,
            LockSite::TagPagesForWriteback => Item::LwTagPagesForWriteback,
            LockSite::FindGetPagesTag => Item::LwFindGetPagesTag,
            LockSite::AddToSwapCache => Item::LwAddToSwapCache,
            LockSite::DeleteFromSwapCache => Item::LwDeleteFromSwapCache,
        }
    }
}

/// What backs a mapping.
#[derive(Debug)]
pub enum Host {
    /// A file on a filesystem, read and written with O_DIRECT when `direct`.
    File {
        /// The open descriptor while the file has users; closed when the last one goes (its
        /// dirty pages written back first), as an inode outlives its last `struct file`. The
        /// clean pages stay cached under (`dev`, `ino`) for a reopen that finds the file as
        /// it was left (`closed`).
        file: RwLock<Option<Arc<File>>>,
        path: PathBuf,
        direct: bool,
        dev: u64,
        ino: u64,
        /// What the file looked like when its descriptor was closed (None while open).
        closed: Mutex<Option<FileStamp>>,
    },
    /// An in-memory file (tmpfs-like): no backing file; pages go to swap when evicted.
    Memory { name: String },
    /// One of the swap cache's spaces.
    Swap,
}

/// A file's size, modification and change times: equal stamps at close and at reopen mean
/// nobody wrote the file meanwhile (a write, truncation or replacement by a new inode with the
/// same number changes the change time), so its cached pages are still its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    pub(crate) fn of(md: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            len: md.len(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }
}

/// A tree entry: a frame, or (in-memory files) the swap slot of an evicted page.
const SWAP_ENTRY: u64 = 1 << 63;

/// What a tree slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Page(Pfn),
    Swap(SwapEntry),
}

impl Entry {
    pub(crate) fn decode(v: u64) -> Entry {
        if v & SWAP_ENTRY != 0 {
            Entry::Swap(SwapEntry::new(v & !SWAP_ENTRY))
        } else {
            Entry::Page(Pfn::new(v.u32()))
        }
    }
    pub(crate) fn encode(self) -> u64 {
        match self {
            Entry::Page(f) => u64::from(f.raw()),
            Entry::Swap(s) => s.offset() | SWAP_ENTRY,
        }
    }
}

/// `struct address_space`.
#[derive(Debug)]
pub struct AddressSpace {
    pub(crate) id: MappingId,
    pub(crate) flags: AtomicU32,
    tree: Mutex<RadixTree<u64>>,
    /// Pages in the tree (`nrpages`).
    pub(crate) nrpages: AtomicU64,
    pub(crate) host: Host,
    /// `i_size`.
    pub(crate) size: AtomicU64,
    pub(crate) wb_err: ErrSeq,
    /// When the mapping went from clean to dirty (ms since the manager started; 0 = clean), for
    /// `dirty_expire`.
    pub(crate) dirtied_when: AtomicU64,
    /// On its flusher's dirty list.
    pub(crate) on_dirty_list: AtomicBool,
    /// Users (open `CachedFile`s and file regions); at 0 the mapping is written back and
    /// evicted (`iput` -> `evict`).
    pub(crate) users: AtomicU64,
    /// Serializes writeback of this mapping against truncation (`i_rwsem`'s role here).
    pub(crate) io_lock: Mutex<()>,
    /// The errseq cursor of `Mm::sync`.
    pub(crate) sync_cursor: AtomicU64,
    /// Regions mapping this file, shared and private (`i_mmap`): their beyond-EOF markers are
    /// cleared when the file grows, their pages past a truncation are unmapped.
    pub(crate) i_mmap: Mutex<Vec<RegionId>>,
    /// Orders i_size growth against the cut-back after a whole-page write past the end of
    /// file, so the cut never drops a page written beyond the size it read.
    pub(crate) eof_lock: Mutex<()>,
    /// What this kind of mapping does where kinds differ (`a_ops`).
    pub(crate) a_ops: &'static dyn AddressSpaceOps,
    /// Shadows of this space's evicted pages (mm/workingset.rs).
    pub(crate) shadows: Shadows,
    /// The last extent of file data `SEEK_DATA`/`SEEK_HOLE` found, `[start, end)` in bytes
    /// (empty: none): a read inside it needs no lseek (filemap.rs `data_pages`).
    pub(crate) data_extent: Mutex<(u64, u64)>,
    /// Test builds: reads of this file from its disk still to fail with EIO
    /// (`CachedFile::inject_read_errors`); 0 otherwise, one relaxed load per read.
    pub(crate) inject_read_errors: AtomicU32,
}

/// `struct address_space_operations`: the entry points where a disk file, an in-memory file and
/// the swap cache differ, so the page cache and the flushers call them without knowing the kind
/// (and without depending on the modules that implement them).
pub(crate) trait AddressSpaceOps: Sync + std::fmt::Debug {
    /// `->writepages`: writes back up to `nr_to_write` dirty pages of pages `[start, end]`
    /// (`sync`: WB_SYNC_ALL, every page tagged first) and returns how many were written. By
    /// default there is nothing to write back to (in-memory files, the swap cache).
    fn writepages(
        &self,
        _m: &MmInner,
        _mapping: &Arc<AddressSpace>,
        _start: PgOff,
        _end: PgOff,
        _sync: bool,
        _nr_to_write: i64,
    ) -> io::Result<u64> {
        Ok(0)
    }
    /// Brings back the page at `index` whose tree entry is the swap entry `slot` (shmem's
    /// `shmem_swapin_folio`). Only in-memory files keep swap entries in their trees; for any
    /// other kind one is a bug, reported as an error naming the mapping.
    fn swapin(
        &self,
        _m: &MmInner,
        mapping: &AddressSpace,
        index: PgOff,
        slot: SwapEntry,
    ) -> Result<()> {
        Err(crate::FileError::UnexpectedSwapEntry {
            index: index.raw(),
            name: mapping.name(),
            entry: slot.to_string(),
        }
        .into())
    }
}

impl AddressSpace {
    pub(crate) fn new(
        id: MappingId,
        host: Host,
        size: u64,
        flags: u32,
        a_ops: &'static dyn AddressSpaceOps,
    ) -> AddressSpace {
        AddressSpace {
            id,
            flags: AtomicU32::new(flags),
            tree: Mutex::new(RadixTree::new()),
            nrpages: AtomicU64::new(0),
            host,
            size: AtomicU64::new(size),
            wb_err: ErrSeq::default(),
            dirtied_when: AtomicU64::new(0),
            on_dirty_list: AtomicBool::new(false),
            users: AtomicU64::new(0),
            io_lock: Mutex::new(()),
            sync_cursor: AtomicU64::new(0),
            i_mmap: Mutex::new(Vec::new()),
            eof_lock: Mutex::new(()),
            shadows: Shadows::default(),
            data_extent: Mutex::new((0, 0)),
            inject_read_errors: AtomicU32::new(0),
            a_ops,
        }
    }

    /// Takes the tree lock for `site`, counting acquisitions and the time spent waiting.
    pub(crate) fn lock_tree(
        &self,
        vm: &Counters,
        site: LockSite,
    ) -> MutexGuard<'_, RadixTree<u64>> {
        vm.inc(Item::TlAcquire);
        if let Some(g) = self.tree.try_lock() {
            return g;
        }
        let t = Instant::now();
        let g = self.tree.lock();
        let ns = t.elapsed().as_nanos().sat_u64();
        vm.add(site.item(), ns);
        vm.add(Item::TreeLockWaitNs, ns);
        vm.inc(Item::TreeLockContended);
        g
    }

    /// `mapping_use_writeback_tags`.
    pub fn use_writeback_tags(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & as_flags::NO_WRITEBACK_TAGS == 0
    }

    pub(crate) fn is_memory(&self) -> bool {
        matches!(self.host, Host::Memory { .. })
    }

    /// The file's open descriptor: None for other kinds, and for a file whose last user
    /// closed it (it has no dirty pages then; nothing of it is read or written until a reopen).
    pub(crate) fn file(&self) -> Option<Arc<File>> {
        match &self.host {
            Host::File { file, .. } => file.read().clone(),
            _ => None,
        }
    }

    /// A mapping of a file on a filesystem (open or closed).
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.host, Host::File { .. })
    }

    /// The device id of the backing file (the flusher it belongs to); 0 for memory.
    pub(crate) fn dev(&self) -> u64 {
        match &self.host {
            Host::File { dev, .. } => *dev,
            _ => 0,
        }
    }

    /// A name for messages.
    pub fn name(&self) -> String {
        match &self.host {
            Host::File { path, .. } => path.display().to_string(),
            Host::Memory { name } => format!("memory:{name}"),
            Host::Swap => "swap cache".into(),
        }
    }

    /// The entry at `index` (no reference taken).
    pub(crate) fn peek(&self, vm: &Counters, index: PgOff) -> Option<Entry> {
        self.lock_tree(vm, LockSite::FindGetPage)
            .get(index.raw())
            .map(Entry::decode)
    }

    /// Inserts a swap-cache entry (`__add_to_swap_cache`).
    pub(crate) fn add_swap_entry(&self, vm: &Counters, entry: SwapEntry, f: Pfn) {
        self.lock_tree(vm, LockSite::AddToSwapCache)
            .insert(entry.offset(), Entry::Page(f).encode());
        self.nrpages.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes a swap-cache entry (`__delete_from_swap_cache`); true if it was there.
    pub(crate) fn remove_swap_entry(&self, vm: &Counters, entry: SwapEntry) -> bool {
        let had = self
            .lock_tree(vm, LockSite::DeleteFromSwapCache)
            .remove(entry.offset())
            .is_some();
        if had {
            self.nrpages.fetch_sub(1, Ordering::Relaxed);
        }
        had
    }

    /// Whether any page carries `mark` (tests).
    pub fn tagged(&self, vm: &Counters, mark: Mark) -> bool {
        self.lock_tree(vm, LockSite::FindGetPage).tagged(mark)
    }

    /// Whether the page at `index` carries `mark` (tests).
    pub fn has_mark(&self, vm: &Counters, index: PgOff, mark: Mark) -> bool {
        self.lock_tree(vm, LockSite::FindGetPage)
            .get_mark(index.raw(), mark)
    }
}

/// The shadow entries of one address space (Linux keeps them as value entries in the tree):
/// index -> the replacement policy's eviction token (mm/workingset.rs writes and reads them).
///
/// A file's space keeps them in a map split over [`SHADOW_SHARDS`] locks by index, each on its
/// own cache line. A swap-cache space, whose indexes are the slots of one fixed range
/// ([`SWAP_ADDRESS_SPACE_PAGES`](super::swap_state::SWAP_ADDRESS_SPACE_PAGES) of them), keeps
/// one word per slot instead, allocated on its first shadow and read and written without a
/// lock: every swap-in takes a shadow and every eviction leaves one, from the handlers and
/// kswapd at once, and even sharded 16 ways the shard lock's `cmpxchg` was 85% of `take`'s
/// samples (3% of all samples for the Python dict under RAM swap) as its cache line bounced
/// between the vCPUs. A slot's word lives only while the slot holds a swapped page
/// (`swap_free` forgets it), so the table needs no bound beyond its range.
#[derive(Debug)]
pub struct Shadows(ShadowStore);

#[derive(Debug)]
enum ShadowStore {
    /// Sparse indexes (a file's pages), bounded by the cap `insert` is given.
    Map(Box<[ShadowShard]>),
    /// Indexes `base..base + len` (a swap space's slots): `SLOT_SHADOW | token`, or 0.
    Slots {
        base: u64,
        len: usize,
        words: std::sync::OnceLock<Box<[AtomicU64]>>,
    },
}

/// Marks a slot's word as holding a shadow (a token may be 0).
const SLOT_SHADOW: u64 = 1 << 32;

/// Locks the shadows are split over.
pub const SHADOW_SHARDS: usize = 16;

/// Runs of `1 << SHADOW_RUN_SHIFT` consecutive indexes share a shard: a readahead window or a
/// reclaim batch of neighbours takes one lock's cache line from the other vCPU, not sixteen
/// (with index % 16, 82% of `workingset_refault`'s samples were that lock's `cmpxchg`).
const SHADOW_RUN_SHIFT: u32 = 6;

#[derive(Debug, Default)]
#[repr(align(64))]
struct ShadowShard(Mutex<ShadowMap>);

/// A shard's shadows, by runs of [`SHADOW_CHUNK`] consecutive indexes. A map of single
/// indexes (SipHash, then foldhash) cost one or two cache misses per shadow left and per
/// shadow looked up, 7-8% of a mapped 4 GiB sequential read's samples at a 256 MiB budget;
/// reclaim evicts, and readahead adds, neighbours together, so a run's shadows share one
/// entry and one miss.
#[derive(Debug, Default)]
struct ShadowMap {
    runs: std::collections::HashMap<u64, Box<ShadowRun>, foldhash::fast::RandomState>,
    /// Shadows held in `runs`.
    len: usize,
}

/// Indexes per [`ShadowRun`] (the shard's run of neighbours, `1 << SHADOW_RUN_SHIFT`).
const SHADOW_CHUNK: u64 = 1 << SHADOW_RUN_SHIFT;
const SHADOW_CHUNK_LEN: usize = 1 << SHADOW_RUN_SHIFT;

/// The shadows of one run of [`SHADOW_CHUNK`] indexes: bit `i` of `held` says `tokens[i]` is one.
#[derive(Debug)]
struct ShadowRun {
    held: u64,
    tokens: [u32; SHADOW_CHUNK_LEN],
}

impl ShadowMap {
    fn insert(&mut self, index: u64, token: u32) {
        let run = self.runs.entry(index / SHADOW_CHUNK).or_insert_with(|| {
            Box::new(ShadowRun {
                held: 0,
                tokens: [0; SHADOW_CHUNK_LEN],
            })
        });
        let bit = 1u64 << (index % SHADOW_CHUNK);
        if run.held & bit == 0 {
            run.held |= bit;
            self.len += 1;
        }
        #[allow(clippy::cast_possible_truncation)]
        let i = (index % SHADOW_CHUNK) as usize;
        run.tokens[i] = token;
    }

    fn take(&mut self, index: u64) -> Option<u32> {
        let key = index / SHADOW_CHUNK;
        let run = self.runs.get_mut(&key)?;
        let bit = 1u64 << (index % SHADOW_CHUNK);
        if run.held & bit == 0 {
            return None;
        }
        run.held &= !bit;
        self.len -= 1;
        #[allow(clippy::cast_possible_truncation)]
        let token = run.tokens[(index % SHADOW_CHUNK) as usize];
        if run.held == 0 {
            self.runs.remove(&key);
        }
        Some(token)
    }

    /// Drops the shadows of `from..to`.
    fn forget(&mut self, from: u64, to: u64) {
        let mut len = self.len;
        self.runs.retain(|&key, run| {
            let (lo, hi) = (key * SHADOW_CHUNK, (key + 1) * SHADOW_CHUNK);
            if hi <= from || lo >= to {
                return true;
            }
            let a = from.max(lo) - lo;
            let b = to.min(hi) - lo;
            let mask = if b - a == SHADOW_CHUNK {
                u64::MAX
            } else {
                ((1u64 << (b - a)) - 1) << a
            };
            len -= (run.held & mask).count_ones() as usize;
            run.held &= !mask;
            run.held != 0
        });
        self.len = len;
    }

    fn clear(&mut self) {
        self.runs.clear();
        self.len = 0;
    }
}

impl Default for Shadows {
    fn default() -> Self {
        Shadows(ShadowStore::Map(
            (0..SHADOW_SHARDS).map(|_| ShadowShard::default()).collect(),
        ))
    }
}

impl Shadows {
    /// Shadows for the indexes `base..base + len` only (a swap-cache space's slots).
    pub(crate) fn for_slots(base: u64, len: usize) -> Shadows {
        Shadows(ShadowStore::Slots {
            base,
            len,
            words: std::sync::OnceLock::new(),
        })
    }

    fn shard(shards: &[ShadowShard], index: u64) -> &Mutex<ShadowMap> {
        #[allow(clippy::cast_possible_truncation)]
        let k = (index >> SHADOW_RUN_SHIFT) as usize % SHADOW_SHARDS;
        &shards[k].0
    }

    /// The word of slot `index`, if it is in range (`alloc`: the table is made on first use).
    fn slot_word(&self, index: u64, alloc: bool) -> Option<&AtomicU64> {
        let ShadowStore::Slots { base, len, words } = &self.0 else {
            return None;
        };
        let i = usize::try_from(index.checked_sub(*base)?).ok()?;
        if i >= *len {
            return None;
        }
        let table = if alloc {
            words.get_or_init(|| (0..*len).map(|_| AtomicU64::new(0)).collect())
        } else {
            words.get()?
        };
        Some(&table[i])
    }

    /// Records `token` for `index`. A file's map holding its share of `cap` (rounded up) in
    /// `index`'s shard is emptied first, so at most `cap` rounded up to a multiple of
    /// [`SHADOW_SHARDS`] are held; a swap space holds one per slot at most. An index outside a
    /// swap space's range is not recorded.
    pub(crate) fn insert(&self, index: u64, token: u32, cap: usize) {
        match &self.0 {
            ShadowStore::Map(shards) => {
                let mut s = Self::shard(shards, index).lock();
                if s.len >= cap.div_ceil(SHADOW_SHARDS).max(1) {
                    s.clear();
                }
                s.insert(index, token);
            }
            ShadowStore::Slots { .. } => {
                if let Some(w) = self.slot_word(index, true) {
                    w.store(SLOT_SHADOW | u64::from(token), Ordering::Relaxed);
                }
            }
        }
    }

    pub(crate) fn take(&self, index: u64) -> Option<u32> {
        match &self.0 {
            ShadowStore::Map(shards) => {
                let mut s = Self::shard(shards, index).lock();
                if s.len == 0 {
                    return None;
                }
                s.take(index)
            }
            ShadowStore::Slots { .. } => {
                let w = self.slot_word(index, false)?;
                // A plain load first: most slots hold none, and the load keeps the line shared.
                if w.load(Ordering::Relaxed) == 0 {
                    return None;
                }
                let v = w.swap(0, Ordering::Relaxed);
                #[allow(clippy::cast_possible_truncation)]
                (v & SLOT_SHADOW != 0).then_some(v as u32)
            }
        }
    }

    /// Drops the shadows of `from..to` (truncation, a freed swap slot).
    pub fn forget(&self, from: PgOff, to: PgOff) {
        let (from, to) = (from.raw(), to.raw());
        match &self.0 {
            ShadowStore::Map(shards) => {
                if to.saturating_sub(from) <= 4 * SHADOW_SHARDS as u64 {
                    for i in from..to {
                        let mut s = Self::shard(shards, i).lock();
                        if s.len != 0 {
                            s.take(i);
                        }
                    }
                    return;
                }
                for shard in shards.iter() {
                    let mut s = shard.0.lock();
                    if s.len != 0 {
                        s.forget(from, to);
                    }
                }
            }
            ShadowStore::Slots { base, len, words } => {
                let Some(table) = words.get() else { return };
                let lo = from.max(*base) - base;
                let hi = to.min(base + *len as u64).saturating_sub(*base);
                for i in lo..hi {
                    let w = &table[i.usize()];
                    if w.load(Ordering::Relaxed) != 0 {
                        w.store(0, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Shadows held.
    #[cfg(test)]
    fn len(&self) -> usize {
        match &self.0 {
            ShadowStore::Map(shards) => shards.iter().map(|s| s.0.lock().len).sum(),
            ShadowStore::Slots { words, .. } => words.get().map_or(0, |t| {
                t.iter().filter(|w| w.load(Ordering::Relaxed) != 0).count()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A shard's runs of shadows hold what a plain map of indexes holds, through inserts,
        /// takes and range forgets that cross run boundaries.
        #[test]
        fn shadow_runs_hold_what_a_map_of_indexes_holds(
            ops in proptest::collection::vec((0u8..3, 0u64..300, 0u64..300, proptest::prelude::any::<u32>()), 1..300)
        ) {
            let mut runs = ShadowMap::default();
            let mut model = std::collections::BTreeMap::new();
            for (op, a, b, token) in ops {
                match op {
                    0 => {
                        runs.insert(a, token);
                        model.insert(a, token);
                    }
                    1 => proptest::prop_assert_eq!(runs.take(a), model.remove(&a)),
                    _ => {
                        let (from, to) = (a.min(b), a.max(b));
                        runs.forget(from, to);
                        model.retain(|&i, _| i < from || i >= to);
                    }
                }
                proptest::prop_assert_eq!(runs.len, model.len());
            }
            for (i, t) in model {
                proptest::prop_assert_eq!(runs.take(i), Some(t));
            }
            proptest::prop_assert!(runs.runs.is_empty());
        }
    }

    #[test]
    fn shadows_are_taken_once_forgotten_by_range_and_bounded() {
        let s = Shadows::default();
        let cap = 64 * SHADOW_SHARDS;
        s.insert(1, 7, cap);
        s.insert(2, 8, cap);
        s.insert(3, 9, cap);
        assert_eq!(s.take(2), Some(8));
        assert_eq!(s.take(2), None);
        s.forget(PgOff::new(0), PgOff::new(2));
        assert_eq!(s.take(1), None);
        assert_eq!(s.len(), 1);
        // Neighbours share a shard (one lock per readahead window); a shard over its share
        // of a tiny bound starts afresh.
        let s = Shadows::default();
        for i in 4..8 {
            s.insert(i, 1, 4);
        }
        assert_eq!(s.len(), 1, "four neighbours in one shard with a share of 1");
        let ShadowStore::Map(shards) = &s.0 else {
            unreachable!()
        };
        assert!(std::ptr::eq(
            Shadows::shard(shards, 0),
            Shadows::shard(shards, 63)
        ));
        assert!(!std::ptr::eq(
            Shadows::shard(shards, 63),
            Shadows::shard(shards, 64)
        ));
        // The bound holds per shard: indexes of one shard keep at most its share.
        let s = Shadows::default();
        let cap = 4 * SHADOW_SHARDS;
        for k in 0..10u64 {
            s.insert((k * SHADOW_SHARDS as u64) << SHADOW_RUN_SHIFT, 1, cap);
        }
        assert!(s.len() <= 4, "{}", s.len());
        // Across shards at most `cap`.
        let s = Shadows::default();
        for k in 0..1000u64 {
            s.insert(k, 1, cap);
        }
        assert!(s.len() <= cap, "{}", s.len());
        // A long range is forgotten in every shard, a short one index by index.
        let s = Shadows::default();
        for k in 0..200u64 {
            s.insert(k, 1, 1 << 20);
        }
        s.forget(PgOff::new(10), PgOff::new(190));
        assert_eq!(s.len(), 20);
        s.forget(PgOff::new(0), PgOff::new(5));
        assert_eq!(s.len(), 15);
        assert_eq!(s.take(5), Some(1));
        assert_eq!(s.take(195), Some(1));
    }

    #[test]
    fn slot_shadows_hold_one_per_slot_of_their_range() {
        let s = Shadows::for_slots(1000, 64);
        assert_eq!(s.take(1000), None, "nothing before the first shadow");
        assert_eq!(s.len(), 0);
        // A token of 0 is a shadow too; the cap of a file's map does not apply.
        s.insert(1000, 0, 1);
        s.insert(1001, 5, 1);
        s.insert(1063, u32::MAX, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s.take(1000), Some(0));
        assert_eq!(s.take(1000), None);
        assert_eq!(s.take(1063), Some(u32::MAX));
        // Outside the range: not recorded, never found.
        s.insert(999, 1, 1);
        s.insert(1064, 1, 1);
        assert_eq!(s.take(999), None);
        assert_eq!(s.take(1064), None);
        assert_eq!(s.len(), 1);
        // A later eviction of the same slot replaces the shadow; forget clears a range,
        // clipped to the space's.
        s.insert(1001, 6, 1);
        s.insert(1010, 7, 1);
        s.forget(PgOff::new(0), PgOff::new(1005));
        assert_eq!(s.take(1001), None);
        s.forget(PgOff::new(1005), PgOff::new(5000));
        assert_eq!(s.len(), 0);
    }
}
