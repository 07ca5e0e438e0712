//! The compressed swap tier: a pool of compressed pages in front of any [`SwapDevice`], with
//! zswap's design. Mirrors `mm/zswap.c` (`zswap_store`, `zswap_load`, `zswap_invalidate`, the
//! LRU shrinker `shrink_memcg_cb` / `zswap_writeback_entry`, `max_pool_percent`) and the
//! same-filled page detection of `drivers/block/zram/zram_drv.c` (`page_same_filled`).
//!
//! A page written to slot `s` is stored in one of three ways:
//! - **same-filled** (every 64-bit word equal, e.g. a zero page): one word, no pool memory
//!   (`zswap_same_filled`);
//! - **compressed** (lz4 by default, zstd selectable) when the result is at most
//!   [`MAX_STORED`] bytes: kept in the pool under `s`;
//! - **incompressible** otherwise: written straight to slot `s` of the lower device
//!   (`zswap_reject_compress_poor`).
//!
//! The lower device has the same slots, so a page lives in the pool or in the lower device under
//! the same slot number, never in both. The pool is bounded (bytes, or a percentage of the
//! memory budget; Linux's default is 20%): when a store takes it past the bound, the storing
//! thread writes the oldest compressed entries back to the lower device (`zswpwb`), in slot
//! order so runs of consecutive slots become one lower write, until the pool is 1/16 below the
//! bound. A store that finds the pool more than 1/8 above its bound (writeback cannot keep up,
//! or the lower device fails) goes to the lower device directly (`zswap_pool_limit_hit`).
//!
//! Admission: when the pool is full and the entries it has been writing back were mostly never
//! read (decaying counts of entries read at least once against entries written back unread; 7
//! in 8 unread), the pool is only delaying a stream on its way down: compressing a page, then
//! decompressing it to write it back, costs two passes over it for nothing. Such stores go
//! straight to the lower device (`zswap_reject_unread`), as Linux's zswap rejects stores while
//! its pool is full (`zswap_pool_reached_full`) until the shrinker has made room; one store in 32
//! is still admitted, so a pool whose entries start being read again goes back to admitting.
//!
//! Concurrency: one mutex guards the tree (slot -> entry), the LRU (store order) and the counts;
//! compression, decompression and lower-device I/O run outside it. An entry under writeback
//! stays readable in the tree until its lower write completes; a store to a slot under
//! writeback waits for that write (Linux relies on the swap-cache folio lock for the same).
//!
//! The pool's memory is outside the manager's budget, as zswap's is outside a memcg's limit
//! unless charged: a 64 MiB budget with a 20% pool uses up to about 77 MiB plus overhead.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::Arc;

use super::file::{check_pool_pages, check_slots};
use super::{SlotRun, SwapDevice};
use crate::conv::{Narrow, Saturate};
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::{Mapping, PAGE_SIZE};

/// The largest compressed page kept in the pool: 7/8 of a page. A page that compresses worse
/// saves too little to be worth a pool entry and goes to the lower device.
pub const MAX_STORED: usize = PAGE_SIZE - PAGE_SIZE / 8;

/// Entries written back per lower-device batch at most (one readahead window's worth).
const WRITEBACK_BATCH: usize = 64;

/// The admission counts (entries read, entries written back unread) are halved when their sum
/// passes this: they describe the last few thousand entries.
const ADMIT_SPAN: u32 = 2048;
/// No verdict before this many entries were counted.
const ADMIT_MIN: u32 = 64;
/// While the pool rejects unread streams, one store in this many is admitted anyway.
const ADMIT_TRICKLE: u32 = 32;

/// The compression algorithm of a [`Zswap`] pool (`zswap.compressor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// LZ4 (block format, `lz4_flex`): fast, the default.
    Lz4,
    /// Zstandard at the given level (1-22; 3 is zstd's default): smaller, slower.
    Zstd(i32),
}

impl std::fmt::Display for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compressor::Lz4 => write!(f, "lz4"),
            Compressor::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// The bound of a [`Zswap`] pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLimit {
    /// At most this many bytes of compressed data.
    Bytes(u64),
    /// At most this percentage of the manager's memory budget (`zswap.max_pool_percent`).
    Percent(u32),
}

impl PoolLimit {
    /// The bound in bytes for a manager with `budget` bytes.
    pub fn bytes(&self, budget: u64) -> u64 {
        match *self {
            PoolLimit::Bytes(b) => b,
            PoolLimit::Percent(p) => (u128::from(budget) * u128::from(p) / 100).sat_u64(),
        }
    }
}

/// Settings of a compressed tier: `zswap[:OPTION,...]` in a swap spec, where an option is `lz4`,
/// `zstd`, `zstd=LEVEL`, `pool=SIZE` (bytes, suffixes K/M/G) or `pool=N%` (of the budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZswapConfig {
    pub compressor: Compressor,
    pub max_pool: PoolLimit,
}

impl Default for ZswapConfig {
    /// lz4, a pool of at most 20% of the budget (Linux's defaults).
    fn default() -> Self {
        ZswapConfig {
            compressor: Compressor::Lz4,
            max_pool: PoolLimit::Percent(20),
        }
    }
}

impl ZswapConfig {
    /// Parses the options after `zswap:` (comma separated; empty = defaults).
    pub fn parse_options(opts: &str) -> Result<ZswapConfig, String> {
        let mut c = ZswapConfig::default();
        for o in opts.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            match o {
                "lz4" => c.compressor = Compressor::Lz4,
                "zstd" => c.compressor = Compressor::Zstd(3),
                _ if o.starts_with("zstd=") => {
                    let l = o[5..].parse::<i32>().ok().filter(|l| (1..=22).contains(l));
                    c.compressor = Compressor::Zstd(l.ok_or_else(|| {
                        format!("zswap option {o:?}: the zstd level must be 1 to 22")
                    })?);
                }
                _ if o.starts_with("pool=") => {
                    let v = &o[5..];
                    c.max_pool = if let Some(p) = v.strip_suffix('%') {
                        let p = p
                            .trim()
                            .parse::<u32>()
                            .ok()
                            .filter(|p| (1..=100).contains(p));
                        PoolLimit::Percent(p.ok_or_else(|| {
                            format!("zswap option {o:?}: the pool percentage must be 1% to 100%")
                        })?)
                    } else {
                        let b =
                            crate::parse_size(v).map_err(|e| format!("zswap option {o:?}: {e}"))?;
                        if b < PAGE_SIZE as u64 {
                            return Err(format!(
                                "zswap option {o:?}: the pool must hold at least one page (4096 bytes)"
                            ));
                        }
                        PoolLimit::Bytes(b)
                    };
                }
                _ => {
                    return Err(format!(
                    "unknown zswap option {o:?}: use lz4, zstd, zstd=LEVEL, pool=SIZE or pool=N%"
                ))
                }
            }
        }
        Ok(c)
    }

    /// The options in the form [`ZswapConfig::parse_options`] reads.
    pub fn options(&self) -> String {
        let comp = match self.compressor {
            Compressor::Lz4 => "lz4".to_string(),
            Compressor::Zstd(l) => format!("zstd={l}"),
        };
        match self.max_pool {
            PoolLimit::Bytes(b) => format!("{comp},pool={b}"),
            PoolLimit::Percent(p) => format!("{comp},pool={p}%"),
        }
    }
}

#[derive(Debug, Clone)]
enum Data {
    /// Every word of the page equals this one.
    Same(u64),
    /// The compressed page.
    Compressed(Arc<[u8]>),
}

#[derive(Debug)]
struct Entry {
    /// Store order, unique: the LRU key, and how writeback recognises the entry it took.
    gen: u64,
    data: Data,
    /// Read at least once since it was stored.
    read: bool,
}

#[derive(Debug, Default)]
struct Tree {
    entries: HashMap<u64, Entry>,
    /// Compressed entries not under writeback, oldest first (gen -> slot).
    lru: BTreeMap<u64, u64>,
    /// Slots whose entry is being written to the lower device.
    writeback: HashSet<u64>,
    /// Bytes of those entries.
    writeback_bytes: u64,
    next_gen: u64,
    pool_bytes: u64,
    same_filled: u64,
    /// Compressed entries read at least once (decaying, see [`ADMIT_SPAN`]).
    admit_read: u32,
    /// Compressed entries written back without having been read (decaying).
    admit_unread: u32,
    /// Stores seen while rejecting, for the trickle.
    admit_trickle: u32,
}

impl Tree {
    /// Removes the entry of `slot`, if any, keeping the counts right.
    fn remove(&mut self, slot: u64) -> Option<Entry> {
        let e = self.entries.remove(&slot)?;
        match &e.data {
            Data::Same(_) => self.same_filled -= 1,
            Data::Compressed(b) => {
                self.pool_bytes -= b.len() as u64;
                self.lru.remove(&e.gen);
            }
        }
        Some(e)
    }

    fn insert(&mut self, slot: u64, data: Data) {
        self.remove(slot);
        let gen = self.next_gen;
        self.next_gen += 1;
        match &data {
            Data::Same(_) => self.same_filled += 1,
            Data::Compressed(b) => {
                self.pool_bytes += b.len() as u64;
                self.lru.insert(gen, slot);
            }
        }
        self.entries.insert(
            slot,
            Entry {
                gen,
                data,
                read: false,
            },
        );
    }

    /// Counts one compressed entry read for the first time (`read`) or written back unread.
    fn note(&mut self, read: bool) {
        if read {
            self.admit_read += 1;
        } else {
            self.admit_unread += 1;
        }
        if self.admit_read + self.admit_unread > ADMIT_SPAN {
            self.admit_read /= 2;
            self.admit_unread /= 2;
        }
    }

    /// Whether a store into a full pool should go to the lower device instead: what the pool
    /// wrote back lately was mostly never read (7 in 8), except for one store in
    /// [`ADMIT_TRICKLE`].
    fn reject_unread(&mut self) -> bool {
        let n = self.admit_read + self.admit_unread;
        if n < ADMIT_MIN || self.admit_unread * 8 < n * 7 {
            return false;
        }
        self.admit_trickle = self.admit_trickle.wrapping_add(1);
        !self.admit_trickle.is_multiple_of(ADMIT_TRICKLE)
    }
}

/// A compressed pool in front of a lower swap device (see the module documentation).
pub struct Zswap {
    lower: Arc<dyn SwapDevice>,
    compressor: Compressor,
    max_pool_bytes: u64,
    tree: Mutex<Tree>,
    zswpout: AtomicU64,
    zswpin: AtomicU64,
    zswpwb: AtomicU64,
    reject_compress_poor: AtomicU64,
    reject_unread: AtomicU64,
    pool_limit_hit: AtomicU64,
    writeback_error: AtomicU64,
    /// Writeback bounce buffers of [`WRITEBACK_BATCH`] pages, kept for the next batch: a
    /// fresh mapping per batch cost an mmap, a page fault and zeroing per page, and an munmap
    /// (a TLB shootdown) per batch.
    bounces: Mutex<Vec<Mapping>>,
}

/// Bounce buffers kept (one per thread writing back at once, commonly kswapd and a direct
/// reclaimer).
const BOUNCES_KEPT: usize = 2;

impl std::fmt::Debug for Zswap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zswap")
            .field("lower", &self.lower.name())
            .field("compressor", &self.compressor)
            .field("max_pool_bytes", &self.max_pool_bytes)
            .finish()
    }
}

/// What a page became on store.
enum Stored {
    Pool(Data),
    /// Goes to the lower device (incompressible, or the pool is over its bound).
    Lower,
}

thread_local! {
    static ZSTD: RefCell<Option<(i32, zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)>> =
        const { RefCell::new(None) };
}

/// Registers this thread's zstd context slot now (see [`crate::mm::pool::warm_thread_locals`]).
pub(crate) fn warm_thread_local() {
    ZSTD.with(|_| {});
}

fn with_zstd<R>(
    level: i32,
    f: impl FnOnce(
        &mut zstd::bulk::Compressor<'static>,
        &mut zstd::bulk::Decompressor<'static>,
    ) -> io::Result<R>,
) -> io::Result<R> {
    ZSTD.with(|z| {
        let mut z = z.borrow_mut();
        if z.as_ref().is_none_or(|(l, _, _)| *l != level) {
            *z = Some((
                level,
                zstd::bulk::Compressor::new(level)?,
                zstd::bulk::Decompressor::new()?,
            ));
        }
        let (_, c, d) = z.as_mut().expect("set above");
        f(c, d)
    })
}

/// The word every 64-bit word of `page` equals, if any (zram's `page_same_filled`).
fn same_filled(page: &[u8; PAGE_SIZE]) -> Option<u64> {
    let mut words = page
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap()));
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

impl Zswap {
    /// A compressed tier in front of `lower` whose pool holds at most `max_pool_bytes`.
    pub fn new(lower: Arc<dyn SwapDevice>, compressor: Compressor, max_pool_bytes: u64) -> Self {
        Zswap {
            lower,
            compressor,
            max_pool_bytes: max_pool_bytes.max(PAGE_SIZE as u64),
            tree: Mutex::new(Tree::default()),
            zswpout: AtomicU64::new(0),
            zswpin: AtomicU64::new(0),
            zswpwb: AtomicU64::new(0),
            reject_compress_poor: AtomicU64::new(0),
            reject_unread: AtomicU64::new(0),
            pool_limit_hit: AtomicU64::new(0),
            writeback_error: AtomicU64::new(0),
            bounces: Mutex::new(Vec::new()),
        }
    }

    /// The device below the pool.
    pub fn lower_device(&self) -> &Arc<dyn SwapDevice> {
        &self.lower
    }

    /// The pool's bound in bytes.
    pub fn max_pool_bytes(&self) -> u64 {
        self.max_pool_bytes
    }

    /// Bytes of compressed data in the pool now.
    pub fn pool_bytes(&self) -> u64 {
        self.tree.lock().pool_bytes
    }

    /// Pages held by the tier now (compressed and same-filled).
    pub fn stored_pages(&self) -> u64 {
        self.tree.lock().entries.len() as u64
    }

    fn compress(&self, page: &[u8; PAGE_SIZE]) -> Option<Arc<[u8]>> {
        // lz4_flex wants room for the worst case; zstd fails when MAX_STORED is exceeded.
        let mut out = [0u8; lz4_flex::block::get_maximum_output_size(PAGE_SIZE)];
        let n = match self.compressor {
            Compressor::Lz4 => lz4_flex::block::compress_into(page, &mut out).ok()?,
            Compressor::Zstd(l) => with_zstd(l, |c, _| {
                c.compress_to_buffer(&page[..], &mut out[..MAX_STORED])
            })
            .ok()?,
        };
        (n <= MAX_STORED).then(|| Arc::from(&out[..n]))
    }

    fn decompress(&self, data: &[u8], page: &mut [u8; PAGE_SIZE], slot: u64) -> io::Result<()> {
        let n = match self.compressor {
            Compressor::Lz4 => lz4_flex::block::decompress_into(data, page)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            Compressor::Zstd(l) => with_zstd(l, |_, d| d.decompress_to_buffer(data, &mut page[..])),
        };
        match n {
            Ok(PAGE_SIZE) => Ok(()),
            Ok(n) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("zswap: slot {slot} decompressed to {n} bytes, not a page"),
            )),
            Err(e) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("zswap: slot {slot} does not decompress ({e})"),
            )),
        }
    }

    /// Waits until no slot of `[slot, slot+n)` is under writeback, then runs `f` on the tree.
    fn with_slots_idle<R>(&self, slot: u64, n: u64, f: impl FnOnce(&mut Tree) -> R) -> R {
        let mut spins = 0u32;
        loop {
            let mut t = self.tree.lock();
            if t.writeback.is_empty() || !(slot..slot + n).any(|s| t.writeback.contains(&s)) {
                return f(&mut t);
            }
            drop(t);
            crate::sync::backoff(&mut spins);
        }
    }

    /// Writes the oldest entries back to the lower device until the pool is 1/16 below its
    /// bound (`shrink_worker`). Stops at the first lower-device error.
    fn shrink(&self) {
        let target = self.max_pool_bytes - self.max_pool_bytes / 16;
        loop {
            let mut batch: Vec<(u64, u64, Arc<[u8]>)> = Vec::new();
            {
                let mut t = self.tree.lock();
                let mut bytes = 0u64;
                while batch.len() < WRITEBACK_BATCH
                    && t.pool_bytes.saturating_sub(t.writeback_bytes + bytes) > target
                {
                    let Some((gen, slot)) = t.lru.pop_first() else {
                        break;
                    };
                    let Some(Entry {
                        data: Data::Compressed(b),
                        ..
                    }) = t.entries.get(&slot)
                    else {
                        unreachable!("the LRU holds compressed entries only");
                    };
                    let b = b.clone();
                    bytes += b.len() as u64;
                    t.writeback.insert(slot);
                    batch.push((slot, gen, b));
                }
                t.writeback_bytes += bytes;
            }
            if batch.is_empty() {
                return;
            }
            let ok = self.write_back(&mut batch);
            if !ok {
                return;
            }
        }
    }

    /// Writes one batch back (`zswap_writeback_entry`) and drops the entries written. Returns
    /// false if the lower device failed (the failed entries stay in the pool).
    fn write_back(&self, batch: &mut [(u64, u64, Arc<[u8]>)]) -> bool {
        debug_assert!(batch.len() <= WRITEBACK_BATCH);
        batch.sort_unstable_by_key(|e| e.0);
        let bytes: u64 = batch.iter().map(|e| e.2.len() as u64).sum();
        let mut done = vec![false; batch.len()];
        let mut ok = true;
        let kept = self.bounces.lock().pop();
        match kept.map_or_else(|| Mapping::anon(WRITEBACK_BATCH * PAGE_SIZE, 0), Ok) {
            Err(e) => {
                log::error!("zswap writeback: cannot map a bounce buffer: {e}");
                ok = false;
            }
            Ok(bounce) => {
                let mut page = [0u8; PAGE_SIZE];
                let mut k = 0;
                while k < batch.len() {
                    let mut e = k + 1;
                    while e < batch.len() && batch[e].0 == batch[e - 1].0 + 1 {
                        e += 1;
                    }
                    let mut run_ok = true;
                    for (j, (slot, _, data)) in batch[k..e].iter().enumerate() {
                        let res = self
                            .decompress(data, &mut page, *slot)
                            .and_then(|()| Ok(bounce.write_bytes((k + j) * PAGE_SIZE, &page)?));
                        if let Err(err) = res {
                            log::error!("zswap writeback of slot {slot}: {err}");
                            run_ok = false;
                        }
                    }
                    let offs: Vec<usize> = (k..e).map(|j| j * PAGE_SIZE).collect();
                    if run_ok {
                        match self.lower.write_pages(batch[k].0, &bounce, &offs) {
                            Ok(()) => done[k..e].iter_mut().for_each(|d| *d = true),
                            Err(err) => {
                                log::warn!(
                                    "zswap writeback of {} pages at slot {} to {}: {err}; they stay in the pool",
                                    e - k,
                                    batch[k].0,
                                    self.lower.name()
                                );
                                ok = false;
                            }
                        }
                    } else {
                        ok = false;
                    }
                    k = e;
                }
                let mut kept = self.bounces.lock();
                if kept.len() < BOUNCES_KEPT {
                    kept.push(bounce);
                }
            }
        }
        let mut t = self.tree.lock();
        t.writeback_bytes -= bytes;
        let mut written = 0;
        for (i, (slot, gen, _)) in batch.iter().enumerate() {
            t.writeback.remove(slot);
            let current = t.entries.get(slot).is_some_and(|e| e.gen == *gen);
            if !current {
                continue; // invalidated meanwhile
            }
            if done[i] {
                if t.remove(*slot).is_some_and(|e| !e.read) {
                    t.note(false);
                }
                written += 1;
            } else {
                // Keep it, at the old end of the LRU.
                t.lru.insert(*gen, *slot);
            }
        }
        drop(t);
        self.zswpwb.fetch_add(written, Ordering::Relaxed);
        if !ok {
            self.writeback_error.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

impl SwapDevice for Zswap {
    fn name(&self) -> String {
        format!("{}+{}", self.tier(), self.lower.name())
    }

    fn tier(&self) -> String {
        format!(
            "zswap({}, pool max {} bytes)",
            self.compressor, self.max_pool_bytes
        )
    }

    fn lower(&self) -> Option<&Arc<dyn SwapDevice>> {
        Some(&self.lower)
    }

    fn nr_pages(&self) -> u64 {
        self.lower.nr_pages()
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages())?;
        check_pool_pages(pool, pages)?;
        if pages.is_empty() {
            return Ok(());
        }
        let (over, unread) = {
            let mut t = self.tree.lock();
            let over = t.pool_bytes > self.max_pool_bytes + self.max_pool_bytes / 8;
            (
                over,
                // Full: within 1/8 of the bound, where writeback keeps it (Linux's
                // `zswap_pool_reached_full` until the pool is below its accept threshold).
                !over
                    && t.pool_bytes + self.max_pool_bytes / 8 >= self.max_pool_bytes
                    && t.reject_unread(),
            )
        };
        let mut page = [0u8; PAGE_SIZE];
        let mut stored = Vec::with_capacity(pages.len());
        for &p in pages {
            pool.read_bytes(p, &mut page)?;
            stored.push(if let Some(w) = same_filled(&page) {
                Stored::Pool(Data::Same(w))
            } else if over {
                self.pool_limit_hit.fetch_add(1, Ordering::Relaxed);
                Stored::Lower
            } else if unread {
                self.reject_unread.fetch_add(1, Ordering::Relaxed);
                Stored::Lower
            } else if let Some(c) = self.compress(&page) {
                Stored::Pool(Data::Compressed(c))
            } else {
                self.reject_compress_poor.fetch_add(1, Ordering::Relaxed);
                Stored::Lower
            });
        }
        // Drop the slots' old entries and insert the new ones in one critical section, once no
        // writeback of these slots is in flight (its lower write would race with ours).
        let mut into_pool = 0;
        let pool_bytes = self.with_slots_idle(slot, pages.len() as u64, |t| {
            for (i, s) in stored.iter_mut().enumerate() {
                let sl = slot + i as u64;
                match std::mem::replace(s, Stored::Lower) {
                    Stored::Pool(d) => {
                        t.insert(sl, d);
                        into_pool += 1;
                        *s = Stored::Pool(Data::Same(0)); // marker: in the pool
                    }
                    Stored::Lower => {
                        t.remove(sl);
                    }
                }
            }
            t.pool_bytes
        });
        self.zswpout.fetch_add(into_pool, Ordering::Relaxed);
        // Incompressible pages: runs of consecutive slots, one lower write each.
        let mut k = 0;
        while k < pages.len() {
            if matches!(stored[k], Stored::Pool(_)) {
                k += 1;
                continue;
            }
            let mut e = k + 1;
            while e < pages.len() && matches!(stored[e], Stored::Lower) {
                e += 1;
            }
            self.lower
                .write_pages(slot + k as u64, pool, &pages[k..e])?;
            k = e;
        }
        if pool_bytes > self.max_pool_bytes {
            self.shrink();
        }
        Ok(())
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        self.read_runs(&[SlotRun { slot, pages }], pool)
            .pop()
            .expect("one result per run")
    }

    /// Pool hits are decompressed here; what the pool does not hold, across all the runs, is
    /// one `read_runs` batch of the device below (the swap file has it all in flight at once),
    /// not one read after another.
    fn read_runs(&self, runs: &[SlotRun<'_>], pool: &Mapping) -> Vec<io::Result<()>> {
        let mut out: Vec<io::Result<()>> = runs
            .iter()
            .map(|r| {
                check_slots(r.slot, r.pages.len() as u64, self.nr_pages())?;
                check_pool_pages(pool, r.pages)
            })
            .collect();
        let found: Vec<Vec<Option<Data>>> = {
            let mut t = self.tree.lock();
            let mut first_reads = 0;
            let found = runs
                .iter()
                .zip(&out)
                .map(|(r, ok)| {
                    if ok.is_err() {
                        return Vec::new();
                    }
                    (0..r.pages.len() as u64)
                        .map(|i| {
                            t.entries.get_mut(&(r.slot + i)).map(|e| {
                                if !e.read && matches!(e.data, Data::Compressed(_)) {
                                    e.read = true;
                                    first_reads += 1;
                                }
                                e.data.clone()
                            })
                        })
                        .collect()
                })
                .collect();
            for _ in 0..first_reads {
                t.note(true);
            }
            found
        };
        let mut page = [0u8; PAGE_SIZE];
        let mut hits = 0;
        // Sub-runs the pool does not hold, with the index of the run each belongs to.
        let mut below: Vec<(usize, SlotRun<'_>)> = Vec::new();
        for (ri, r) in runs.iter().enumerate() {
            if out[ri].is_err() {
                continue;
            }
            let found = &found[ri];
            let mut k = 0;
            while k < r.pages.len() {
                let res = match &found[k] {
                    Some(Data::Same(w)) => if *w == 0 {
                        pool.fill(r.pages[k], PAGE_SIZE, 0)
                    } else {
                        for c in page.chunks_exact_mut(8) {
                            c.copy_from_slice(&w.to_ne_bytes());
                        }
                        pool.write_bytes(r.pages[k], &page)
                    }
                    .map_err(io::Error::from),
                    Some(Data::Compressed(b)) => self
                        .decompress(b, &mut page, r.slot + k as u64)
                        .and_then(|()| Ok(pool.write_bytes(r.pages[k], &page)?)),
                    None => {
                        let mut e = k + 1;
                        while e < r.pages.len() && found[e].is_none() {
                            e += 1;
                        }
                        below.push((
                            ri,
                            SlotRun {
                                slot: r.slot + k as u64,
                                pages: &r.pages[k..e],
                            },
                        ));
                        k = e;
                        continue;
                    }
                };
                if let Err(e) = res {
                    out[ri] = Err(e);
                    break;
                }
                hits += 1;
                k += 1;
            }
        }
        if !below.is_empty() {
            let subruns: Vec<SlotRun<'_>> = below.iter().map(|(_, r)| *r).collect();
            for ((ri, _), res) in below.iter().zip(self.lower.read_runs(&subruns, pool)) {
                if let Err(e) = res {
                    if out[*ri].is_ok() {
                        out[*ri] = Err(e);
                    }
                }
            }
        }
        self.zswpin.fetch_add(hits, Ordering::Relaxed);
        out
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages())?;
        {
            let mut t = self.tree.lock();
            if n.usize() > t.entries.len() {
                let gone: Vec<u64> = t
                    .entries
                    .keys()
                    .copied()
                    .filter(|s| (slot..slot + n).contains(s))
                    .collect();
                for s in gone {
                    t.remove(s);
                }
            } else {
                for s in slot..slot + n {
                    t.remove(s);
                }
            }
        }
        self.lower.discard(slot, n)
    }

    fn invalidate(&self, slot: u64) {
        self.tree.lock().remove(slot);
        self.lower.invalidate(slot);
    }

    fn trim(&self) {
        self.lower.trim();
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let (stored, pool_bytes, same) = {
            let t = self.tree.lock();
            (t.entries.len() as u64, t.pool_bytes, t.same_filled)
        };
        vec![
            ("zswpout", self.zswpout.load(Ordering::Relaxed)),
            ("zswpin", self.zswpin.load(Ordering::Relaxed)),
            ("zswpwb", self.zswpwb.load(Ordering::Relaxed)),
            ("zswap_stored_pages", stored),
            ("zswap_pool_bytes", pool_bytes),
            ("zswap_same_filled", same),
            (
                "zswap_reject_compress_poor",
                self.reject_compress_poor.load(Ordering::Relaxed),
            ),
            (
                "zswap_reject_unread",
                self.reject_unread.load(Ordering::Relaxed),
            ),
            (
                "zswap_pool_limit_hit",
                self.pool_limit_hit.load(Ordering::Relaxed),
            ),
            (
                "zswap_writeback_error",
                self.writeback_error.load(Ordering::Relaxed),
            ),
        ]
    }
}
