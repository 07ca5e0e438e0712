//! The frame pool: usermm's one mechanism with no kernel counterpart. Frame N's page lives in
//! slot N of one anonymous mapping (the pool), registered with the manager's userfaultfd, while it
//! is not mapped in a region's view; a mapped page's slot is empty. This module owns the slots:
//! freeing and recycling frames (a reclaimed page left in its slot, `PG_pooled`, is zeroed or
//! filled in place and moved next time instead of the kernel allocating, zeroing and copying a
//! fresh one), filling and emptying slots, checking that a slot holds what its flags promise,
//! the per-thread bounce buffer device reads land in, and runs of consecutive frames (one ioctl
//! or madvise per run). The closest kernel analogue is the buddy allocator's free lists
//! (`mm/page_alloc.c`: `free_unref_page`, `prep_new_page`) plus `clear_highpage`/`copy_highpage`.
//!
//! Never store into an empty slot from a handler thread: the pool is registered, so the store
//! would fault into the handlers themselves (the `pool_slot_lost` guard exists for that).

use std::ops::Range;

use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::uffd;
use crate::sys::{Advice, Mapping, PAGE_SIZE};
use crate::vmstat::Item;

use super::page::{pg, Pfn, Sections};
use super::zap::ZapQueue;
use super::MmInner;

/// The pool's mappings: one slot per frame, registered with the manager's userfaultfd; a
/// source of zeros to fill slots from; and the slot drops queued for the next batch.
#[derive(Debug)]
pub struct FramePool {
    /// Slot N holds frame N's page while it is not mapped in a region's view.
    pub(crate) slots: Mapping,
    /// 2 MiB of the shared zero page: copies from it read cache-hot zeros and cost no memory.
    pub(crate) zero_src: Mapping,
    /// Pool slots to empty in the next batch (`defer_zap`, the protocol in mm/zap.rs).
    pub(crate) zaps: ZapQueue,
    /// Per frame, under `anon_clean=hash`: the hash (`| 1`; 0 = none) of the contents a clean
    /// swap-cache page was mapped writable with, the contents its swap copy holds
    /// ([`set_clean_hash`], `rmap::verify_clean`).
    /// Made a section at a time, as the descriptors are.
    clean_hash: Sections<AtomicU64>,
    /// Per frame, under `clean_map=move`: the hash (`| 1`; 0 = none) of a file page's contents
    /// as a read from its file left them, recorded by the read's completer
    /// ([`set_read_hash`]) so that mapping the page later need not hash its slot again; forgotten
    /// when the page is dirtied or its frame enters the cache anew.
    read_hash: Sections<AtomicU64>,
    /// The huge pages empty slots are filled from before a device reads into them
    /// ([`fill_empty_from_huge`]): their pages not yet moved (at most [`HUGE_SOURCES`] x 2 MiB)
    /// are held outside the budget's frames, as the bounce buffers are.
    huge: Mutex<HugeSources>,
}

/// The huge pages being filled from ([`FramePool`]'s `huge`): the last one is used first;
/// `making` are being made by fillers outside the lock.
#[derive(Debug, Default)]
struct HugeSources {
    ready: Vec<HugeSource>,
    making: usize,
}

/// A transparent huge page whose 4 KiB pages are moved one run at a time into empty slots:
/// consecutive slots so filled hold physically consecutive memory, which a device read into
/// them needs to be fast (below).
#[derive(Debug)]
struct HugeSource {
    map: Mapping,
    /// Pages from here on are still in `map`.
    next: usize,
}

impl FramePool {
    pub(crate) fn new(slots: Mapping, zero_src: Mapping) -> FramePool {
        let frames = slots.len() / PAGE_SIZE;
        FramePool {
            slots,
            zero_src,
            zaps: ZapQueue::default(),
            clean_hash: Sections::new(frames),
            read_hash: Sections::new(frames),
            huge: Mutex::new(HugeSources::default()),
        }
    }
}

/// `anon_clean=hash`: locked page `f`, a clean swap-cache page, is being mapped writable with
/// contents whose hash is `h`. Usermm's pte dirty bit: `rmap::verify_clean` compares when the page
/// is unmapped again.
pub(crate) fn set_clean_hash(m: &MmInner, f: Pfn, h: u64) {
    m.pool.clean_hash[f.idx()].store(h | 1, Ordering::Relaxed);
}

/// Takes frame `f`'s recorded hash (0: none), leaving none (also how a frame whose contents
/// were replaced, reread from swap or zeros, forgets it).
pub(crate) fn take_clean_hash(m: &MmInner, f: Pfn) -> u64 {
    take_hash(&m.pool.clean_hash, f)
}

/// Records `h`, the hash of file page `f`'s slot as its read left it (`clean_map=move`; the
/// page is locked and clean).
pub(crate) fn set_read_hash(m: &MmInner, f: Pfn, h: u64) {
    m.pool.read_hash[f.idx()].store(h | 1, Ordering::Relaxed);
}

/// Takes file page `f`'s recorded read hash (`| 1`; 0: none), leaving none.
pub(crate) fn take_read_hash(m: &MmInner, f: Pfn) -> u64 {
    take_hash(&m.pool.read_hash, f)
}

/// Takes frame `f`'s word of a per-frame hash table (0: none; a section never made holds none).
/// A plain load first: most words hold none (`set_page_dirty` asks for every page it dirties),
/// and the load keeps the line shared.
fn take_hash(table: &Sections<AtomicU64>, f: Pfn) -> u64 {
    table.get_made(f.idx()).map_or(0, |h| {
        if h.load(Ordering::Relaxed) == 0 {
            0
        } else {
            h.swap(0, Ordering::Relaxed)
        }
    })
}

/// The runs of `v`: maximal index ranges whose neighbours satisfy `next(prev, cur)` (consecutive
/// frames, slots or page indexes). One helper for every "split into runs" loop.
pub(crate) fn runs<'a, T: Copy>(
    v: &'a [T],
    next: impl Fn(T, T) -> bool + 'a,
) -> impl Iterator<Item = Range<usize>> + 'a {
    runs_max(v, usize::MAX, next)
}

/// [`runs`] of at most `max` elements each (one device request per run).
pub(crate) fn runs_max<'a, T: Copy>(
    v: &'a [T],
    max: usize,
    next: impl Fn(T, T) -> bool + 'a,
) -> impl Iterator<Item = Range<usize>> + 'a {
    let mut k = 0;
    std::iter::from_fn(move || {
        if k >= v.len() {
            return None;
        }
        let s = k;
        k += 1;
        while k < v.len() && k - s < max && next(v[k - 1], v[k]) {
            k += 1;
        }
        Some(s..k)
    })
}

/// Runs of consecutive pooled frames at least this long are zeroed or filled in place and moved
/// (one shootdown per run); shorter ones are copied and their slots dropped in batches.
pub const MOVE_MIN_RUN: usize = 4;

/// Queues frame `f`'s slot, which holds a page that is not (or no longer) the page's data, to
/// be emptied with the next batch. Before anything looks into the slot or moves a page into it,
/// [`settle`] empties it.
pub fn defer_zap(m: &MmInner, f: Pfn) {
    if m.pool.zaps.push(&m.node.pages, f) {
        flush_zaps(m);
    }
}

/// Empties every queued slot: one process_madvise(2) per batch (`ZapQueue::flush`).
pub fn flush_zaps(m: &MmInner) {
    let n = m.pool.zaps.flush(&m.node.pages, |frames| {
        let offs: Vec<usize> = frames.iter().map(|f| f.offset()).collect();
        m.vm.warn_on(
            m.pool.slots.dontneed_pages(&offs),
            "MADV_DONTNEED of pool slots",
        );
    });
    m.vm.add(Item::PoolZapBatched, n as u64);
}

/// Before frame `f`'s slot is looked into or a page moved into it: a pending drop happens now.
pub fn settle(m: &MmInner, f: Pfn) {
    if m.node.pages[f].test(pg::ZAPPENDING) {
        flush_zaps(m);
    }
}

/// A frame being freed whose slot drop is still pending keeps the page as a recycled one
/// (PG_pooled) instead: the next user overwrites it.
pub fn settle_free(m: &MmInner, f: Pfn) {
    m.pool.zaps.settle_free(&m.node.pages, f);
}

/// Returns frames to the allocator. `zap`: drop the pages their pool slots hold first;
/// otherwise each frame's PG_pooled says whether its slot still holds a page.
pub fn free_frames(m: &MmInner, frames: &[Pfn], zap: bool) {
    release_frames(m, frames, zap);
    m.vm.add(Item::Pgfree, frames.len() as u64);
}

/// [`free_frames`] without counting them freed (`pgfree`).
fn release_frames(m: &MmInner, frames: &[Pfn], zap: bool) {
    if frames.is_empty() {
        return;
    }
    for &f in frames {
        settle_free(m, f);
    }
    if zap {
        zap_pool(m, frames);
        for &f in frames {
            m.node.pages[f].reset_flags(0);
        }
    }
    m.node.free_frames(frames);
}

/// In a budget group: empties up to `n` free frames whose pool slots still hold a recycled page,
/// so their charge goes back to the group (the others of the tree are short: kswapd drains
/// these before it reclaims pages in use, as Linux drains per-cpu free lists under pressure).
/// Returns how many.
pub fn drain_pooled(m: &MmInner, n: usize) -> usize {
    if n == 0 || m.node.pooled_free.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let mut frames = Vec::new();
    let got = m.node.take_pooled_free(n, &mut frames);
    // Counted as freed already, when recycled.
    release_frames(m, &frames, true);
    got
}

/// Frees frames whose pool slots hold reclaimed pages, keeping those pages for reuse: the next
/// allocation zeroes or fills them in user space and moves them, which is cheaper than the
/// kernel's allocate-zero-copy of UFFDIO_COPY and than MADV_DONTNEED now.
pub fn recycle_frames(m: &MmInner, frames: &[Pfn]) {
    for &f in frames {
        settle_free(m, f);
        m.node.pages[f].reset_flags(pg::POOLED);
    }
    m.node.free_frames(frames);
    m.vm.add(Item::Pgfree, frames.len() as u64);
}

/// Whether frame `f`'s pool slot really holds the page PG_pooled promises. A store into an
/// empty slot would fault into the handlers (the pool is registered) and, from a handler
/// thread, never be served; a lost slot is counted (`pool_slot_lost`) and the frame treated as
/// not pooled.
pub fn pooled_and_present(m: &MmInner, f: Pfn) -> bool {
    let p = &m.node.pages[f];
    if !p.test(pg::POOLED) {
        return false;
    }
    match m.pool.slots.resident(f.offset(), PAGE_SIZE) {
        Ok(v) if v[0] => true,
        _ => {
            m.vm.inc(Item::PoolSlotLost);
            log::warn!("frame {f} is marked pooled but its pool slot is empty");
            p.clear(pg::POOLED);
            false
        }
    }
}

/// Whether frame `f`'s pool slot holds a page (mincore), whatever its flags say.
pub fn slot_present(m: &MmInner, f: Pfn) -> bool {
    settle(m, f);
    m.pool
        .slots
        .resident(f.offset(), PAGE_SIZE)
        .is_ok_and(|v| v[0])
}

/// Whether each frame's pool slot holds a page, whatever its flags say: one mincore per run of
/// consecutive frames (a failed mincore counts as empty).
pub fn slots_present(m: &MmInner, frames: &[Pfn]) -> Vec<bool> {
    let mut out = vec![false; frames.len()];
    for run in runs(frames, |a, b| b == a.next()) {
        if let Ok(v) = m
            .pool
            .slots
            .resident(frames[run.start].offset(), run.len() * PAGE_SIZE)
        {
            out[run].copy_from_slice(&v);
        }
    }
    out
}

/// How many slots from frame `f0` on, of at most `n` consecutive ones, hold a page before the
/// first empty one (a run is mapped only as far as its slots hold pages; a lost slot stops it
/// and its own fault finds out).
pub fn held_prefix(m: &MmInner, f0: Pfn, n: usize) -> usize {
    m.pool
        .slots
        .resident(f0.offset(), n * PAGE_SIZE)
        .unwrap_or_default()
        .iter()
        .take_while(|&&b| b)
        .count()
}

/// [`pooled_and_present`] for a batch, with one mincore per run of consecutive frames.
pub fn pooled_batch(m: &MmInner, frames: &[Pfn]) -> Vec<bool> {
    let mut out = slots_present(m, frames);
    for (j, &f) in frames.iter().enumerate() {
        let p = &m.node.pages[f];
        if !p.test(pg::POOLED) {
            out[j] = false;
        } else if !out[j] {
            m.vm.inc(Item::PoolSlotLost);
            log::warn!("frame {f} is marked pooled but its pool slot is empty");
            p.clear(pg::POOLED);
        }
    }
    out
}

/// Empties the pool slot of a freshly allocated frame that will not use the page parked there
/// (with the next batch: [`defer_zap`]).
pub fn empty_slot(m: &MmInner, f: Pfn) {
    if m.node.pages[f].test_clear(pg::POOLED) {
        defer_zap(m, f);
    }
}

/// MADV_DONTNEED over the pool slots of `frames`, one call per run of consecutive frames.
fn zap_pool(m: &MmInner, frames: &[Pfn]) {
    let mut sorted = frames.to_vec();
    sorted.sort_unstable();
    for run in runs(&sorted, |a, b| b == a.next()) {
        m.vm.warn_on(
            m.pool.slots.advise(
                sorted[run.start].offset(),
                run.len() * PAGE_SIZE,
                Advice::DontNeed,
            ),
            "MADV_DONTNEED of pool slots",
        );
    }
}

/// Puts the page at `off` of `bounce` into frame `f`'s pool slot: a plain copy into a recycled
/// page, or UFFDIO_COPY into an empty slot.
pub(crate) fn fill_slot(m: &MmInner, f: Pfn, bounce: &Mapping, off: usize) -> bool {
    settle(m, f);
    if pooled_and_present(m, f) && m.node.pages[f].test_clear(pg::POOLED) {
        m.pool
            .slots
            .copy_from(f.offset(), bounce, off, PAGE_SIZE)
            .is_ok()
    } else {
        let dst = m.pool.slots.addr() + f.offset();
        m.mm.uffd
            .copy(dst, bounce.addr() + off, PAGE_SIZE, false, true)
            .is_ok()
    }
}

/// [`fill_slot`] for a window: the page at `offs[k]` of `src` (a bounce buffer, or a memory
/// swap device's own pages) into frame `frames[k]`'s slot where `ok[k]`. One mincore per run of
/// consecutive frames says which slots hold recycled pages ([`pooled_batch`]), and each run of
/// consecutive frames of one kind whose sources are consecutive too is one copy: a plain copy
/// into recycled pages, one UFFDIO_COPY into empty slots (a run that fails part way is
/// finished page by page). Returns which pages were filled.
pub(crate) fn fill_slots(
    m: &MmInner,
    frames: &[Pfn],
    ok: &[bool],
    src: &Mapping,
    offs: &[usize],
) -> Vec<bool> {
    for &f in frames {
        settle(m, f);
    }
    let pooled = pooled_batch(m, frames);
    // Whether each page goes into a recycled slot (its PG_pooled now cleared: the page is
    // about to be overwritten) or an empty one.
    let recycled: Vec<bool> = frames
        .iter()
        .enumerate()
        .map(|(k, &f)| ok[k] && pooled[k] && m.node.pages[f].test_clear(pg::POOLED))
        .collect();
    let mut done = vec![false; frames.len()];
    let ks: Vec<usize> = (0..frames.len()).filter(|&k| ok[k]).collect();
    for run in runs(&ks, |a, b| {
        b == a + 1
            && frames[b] == frames[a].next()
            && recycled[a] == recycled[b]
            && offs[b] == offs[a] + PAGE_SIZE
    }) {
        let (k0, n) = (ks[run.start], run.len());
        let f0 = frames[k0];
        let len = n * PAGE_SIZE;
        let filled = if recycled[k0] {
            m.pool
                .slots
                .copy_from(f0.offset(), src, offs[k0], len)
                .map_or(0, |()| n)
        } else {
            let dst = m.pool.slots.addr() + f0.offset();
            match m.mm.uffd.copy(dst, src.addr() + offs[k0], len, false, true) {
                Ok(_) => n,
                Err(e) => e.done / PAGE_SIZE,
            }
        };
        done[k0..k0 + filled].fill(true);
        for k in k0 + filled..k0 + n {
            done[k] = fill_slot(m, frames[k], src, offs[k]);
        }
    }
    done
}

thread_local! {
    static BOUNCE: std::cell::RefCell<Option<Mapping>> = const { std::cell::RefCell::new(None) };
}

/// Called first by every thread usermm starts ([`super::spawn_thread`]): touches each thread-local of the fault and reclaim paths that has a
/// destructor, so that glibc registers the destructors now. Registering takes the dynamic
/// loader's lock (`__cxa_thread_atexit_impl`), and a program thread inside dlopen(3) holds it:
/// a library constructor, or glibc loading libgcc_s for backtrace(3), touching swapped-out
/// usermm memory waited for a handler that waited for the loader lock, for good (seen under
/// `usermm run` with numpy; capi_test's "dlopen" case reproduced it every time).
pub(crate) fn warm_thread_locals() {
    BOUNCE.with(|_| {});
    crate::swap::zswap::warm_thread_local();
    crate::sys::ring::warm_thread_local();
    // The Redis Cluster client's random node choice (a reconnect, a failover) uses rand's
    // thread-local generator, whose first use registers a destructor the same way.
    drop(rand::rng());
}

/// Pages in a thread's swap-in bounce buffer, and so the largest swap-in readahead window
/// (`swap_state::swapin_ra_max`).
pub(crate) const BOUNCE_PAGES: usize = 512;

/// Runs `f` with this thread's bounce buffer ([`BOUNCE_PAGES`], unregistered, reused so its pages stay
/// populated): device reads land there, then UFFDIO_COPY places them. Under
/// `fault_path=sigbus` every faulting thread has one (its readahead windows' worth resident,
/// outside the budget). Re-entered on the same thread (a fault served in a signal handler that
/// interrupted a holder), it uses a temporary buffer instead.
pub(crate) fn with_bounce<R>(pages: usize, f: impl FnOnce(&Mapping) -> R) -> R {
    assert!(pages <= BOUNCE_PAGES);
    BOUNCE.with(|b| match b.try_borrow_mut() {
        Ok(mut b) => f(b.get_or_insert_with(new_bounce)),
        Err(_) => f(&new_bounce()),
    })
}

/// [`with_bounce`] with one of the buffers in `shared` (the first free one, else waiting for
/// the first) instead of this thread's: for threads that read on behalf of others (the
/// readahead workers), so that their buffers' resident pages stay few.
pub(crate) fn with_shared_bounce<R>(
    shared: &[crate::sync::Mutex<Option<Mapping>>],
    pages: usize,
    f: impl FnOnce(&Mapping) -> R,
) -> R {
    assert!(pages <= BOUNCE_PAGES);
    let mut g = shared
        .iter()
        .find_map(|b| b.try_lock())
        .unwrap_or_else(|| shared[0].lock());
    f(g.get_or_insert_with(new_bounce))
}

fn new_bounce() -> Mapping {
    let m = Mapping::anon(BOUNCE_PAGES * PAGE_SIZE, 0).expect("mapping a 2 MiB bounce buffer");
    let _ = m.advise(0, m.len(), Advice::NoHugePage);
    m
}

/// Pages in a transparent huge page (x86-64, arm64 with 4 KiB pages).
const HUGE_PAGES: usize = 512;

/// Huge pages held or being made at once, at most: two fillers make theirs at the same time
/// (on two CPUs), a third waits for one of them. Making one is the kernel's allocation and
/// zeroing of 2 MiB, which on this VM runs at about 340 MB/s for memory the guest had handed
/// back to the host (free page reporting; 4-6.7 GB/s once warm): made under the lock, it kept
/// the other readahead workers waiting, and a cold pool's first 256 MiB took a whole CPU for
/// 0.6 s while the other idled.
const HUGE_SOURCES: usize = 2;

/// Runs of empty slots shorter than this are left to the caller's way: a short read gains
/// nothing from contiguity, and each move out of the huge page flushes the TLB (an IPI when a
/// thread of the process runs on another CPU), where the bounce buffer's UFFDIO_COPY into an
/// empty slot does not. Random reads of a mapped file, 4 threads, every fill from the huge
/// page: 18.4-19.8k pages/s against 23.9-25.2k.
const HUGE_FILL_MIN_RUN: usize = 16;

/// Makes the empty slots among `frames` (settled by the caller: no slot drop pending;
/// `present[k]` false), in runs of at least
/// [`HUGE_FILL_MIN_RUN`] consecutive frames, hold pages, moved from a
/// transparent huge page (`pool_huge_fill`), so that a device can read straight into them;
/// `present` is updated. Returns how many were filled; a slot left empty (no huge page could be
/// made, a move failed) keeps the caller's other way.
///
/// Why: an O_DIRECT read is one request of at most `max_segments` (254 here) physically
/// contiguous pieces, and each piece costs the host. Reading a 2 GiB file at 512 KiB a call
/// into scattered 4 KiB pages runs at 1066 MiB/s on this VM, into a huge page at 1929 MiB/s (2 MiB:
/// 1728 vs 2384); the kernel's page cache, made of large folios, gets the latter. A frame keeps
/// its physical page for life (UFFDIO_MOVE carries the page, reclaim parks it in the same slot),
/// so filling runs of consecutive empty slots from consecutive pages of one huge page once
/// makes every later read into those frames fast. The huge page is split by the first move out
/// of it; its pages are written non-zero first, or the split would remap them to the shared
/// zero page. It is registered with the userfaultfd like the pool (UFFDIO_MOVE needs equal
/// `vm_page_prot`), after it is populated, so nothing ever faults on it.
pub(crate) fn fill_empty_from_huge(m: &MmInner, frames: &[Pfn], present: &mut [bool]) -> usize {
    if !thp_possible() {
        return 0;
    }
    let ks: Vec<usize> = (0..frames.len()).filter(|&k| !present[k]).collect();
    let mut filled = 0;
    'runs: for run in runs(&ks, |a, b| b == a + 1 && frames[b] == frames[a].next()) {
        if run.len() < HUGE_FILL_MIN_RUN {
            continue;
        }
        let mut k = ks[run.start];
        let end = k + run.len();
        while k < end {
            let mut src = m.pool.huge.lock();
            while src.ready.last().is_some_and(|h| h.next == HUGE_PAGES) {
                src.ready.pop();
            }
            let Some(h) = src.ready.last_mut() else {
                if src.making >= HUGE_SOURCES {
                    // Both being made by other fillers: one is ready soon.
                    drop(src);
                    crate::sync::yield_now();
                    continue;
                }
                src.making += 1;
                drop(src);
                let made = new_huge_source(m);
                let mut src = m.pool.huge.lock();
                src.making -= 1;
                match made {
                    Some(h) => src.ready.push(h),
                    None => break 'runs,
                }
                continue;
            };
            let n = (end - k).min(HUGE_PAGES - h.next);
            let dst = m.pool.slots.addr() + frames[k].offset();
            let from = h.map.addr() + h.next * PAGE_SIZE;
            let moved = match m.mm.uffd.move_pages(dst, from, n * PAGE_SIZE, false, true) {
                Ok(d) => d / PAGE_SIZE,
                Err(e) => {
                    log::debug!(
                        "moving a huge page's pages into frame {}'s slot: {e}",
                        frames[k]
                    );
                    // Whatever it left is given up: the next fill makes a new huge page.
                    h.next = HUGE_PAGES;
                    e.done / PAGE_SIZE
                }
            };
            h.next = (h.next + moved).min(HUGE_PAGES);
            drop(src);
            present[k..k + moved].fill(true);
            filled += moved;
            if moved < n {
                break;
            }
            k += n;
        }
    }
    m.vm.add(Item::PoolHugeFill, filled as u64);
    filled
}

/// Whether the kernel can give a `MADV_HUGEPAGE` mapping transparent huge pages: not when
/// `/sys/kernel/mm/transparent_hugepage/enabled` is `[never]` (then a fill would be 512 small
/// faults and moves for pages no more contiguous than UFFDIO_COPY's). Read once; unreadable
/// (no THP support built in) counts as no.
fn thp_possible() -> bool {
    static POSSIBLE: crate::sync::OnceLock<bool> = crate::sync::OnceLock::new();
    *POSSIBLE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
    })
}

/// A populated huge page to fill slots from (4 KiB pages where the kernel has no huge page to
/// give: still one piece per page, never worse than a fresh UFFDIO_COPY).
fn new_huge_source(m: &MmInner) -> Option<HugeSource> {
    let len = HUGE_PAGES * PAGE_SIZE;
    let map = Mapping::anon(len, len)
        .map_err(|e| log::debug!("mapping a huge page to fill pool slots from: {e}"))
        .ok()?;
    let _ = map.advise(0, len, Advice::HugePage);
    // As the pool: a fork(2) child must not share these pages (a shared page cannot be moved).
    map.advise(0, len, Advice::DontFork).ok()?;
    for i in 0..HUGE_PAGES {
        map.write_bytes(i * PAGE_SIZE, &[1]).ok()?;
    }
    m.mm.uffd
        .register(map.addr(), len, uffd::mode::MISSING | uffd::mode::WP)
        .map_err(|e| log::debug!("registering a huge page to fill pool slots from: {e}"))
        .ok()?;
    Some(HugeSource { map, next: 0 })
}

/// Makes frame `f`'s pool slot hold a page (the recycled one, or a fresh zeroed one), so its
/// bytes can be accessed. A recycled page keeps stale bytes: the caller overwrites them.
pub(crate) fn ensure_slot(m: &MmInner, f: Pfn) -> bool {
    settle(m, f);
    let p = &m.node.pages[f];
    if pooled_and_present(m, f) && p.test_clear(pg::POOLED) {
        return true;
    }
    let dst = m.pool.slots.addr() + f.offset();
    match m
        .mm
        .uffd
        .copy(dst, m.pool.zero_src.addr(), PAGE_SIZE, false, true)
    {
        Ok(_) => true,
        Err(e) if e.is_exists() => true,
        Err(e) => {
            log::error!("UFFDIO_COPY into frame {f}'s slot: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_split_at_every_gap() {
        let v = [3u32, 4, 5, 9, 10, 12];
        let r: Vec<_> = runs(&v, |a, b| b == a + 1).collect();
        assert_eq!(r, [0..3, 3..5, 5..6]);
        assert_eq!(runs(&[] as &[u32], |a, b| b == a + 1).count(), 0);
        assert_eq!(
            runs(&[7u32], |a, b| b == a + 1).collect::<Vec<_>>(),
            vec![(0..1)]
        );
        let r: Vec<_> = super::runs_max(&[1u32, 2, 3, 4, 5], 2, |a, b| b == a + 1).collect();
        assert_eq!(r, [0..2, 2..4, 4..5]);
    }
}
