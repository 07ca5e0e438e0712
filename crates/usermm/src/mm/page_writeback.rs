//! Dirty-page accounting, throttling and the flusher threads. Mirrors `mm/page-writeback.c`
//! (`global_dirty_limits`, `balance_dirty_pages_ratelimited`, `balance_dirty_pages`) and
//! `fs/fs-writeback.c` (one writeback thread per backing device: `wb_workfn` doing background
//! writeback above `dirty_background_ratio`, periodic `wb_kupdate` writeback of mappings dirty
//! for longer than `dirty_expire`, and `wakeup_flusher_threads` from reclaim).
//!
//! Writers are throttled in proportion to how far the dirty pages are past the "freerun" point
//! (halfway between the background and the hard threshold): the pause grows linearly from 0 to
//! `MAX_PAUSE` at the threshold, and above it writers wait until writeback brings it back.

use crate::vmstat::Counters;
use std::collections::HashMap;
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::{Arc, Condvar, Mutex, Ordering};
use crate::vmstat::Item;

use super::fs::AddressSpace;
use super::page::PgOff;
use super::MmInner;
use crate::conv::Saturate;

/// Longest single throttling pause (`MAX_PAUSE`, 200 ms in Linux).
pub const MAX_PAUSE: Duration = Duration::from_millis(200);
/// Pages written per mapping per round of background writeback (`MAX_WRITEBACK_PAGES`).
const WRITEBACK_CHUNK: i64 = 1024;

/// Why a flusher was woken (`enum wb_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WbReason {
    Background,
    Vmscan,
}

#[derive(Debug, Default)]
struct WbWork {
    pending: bool,
    background: bool,
    /// Pages reclaim asked to be written (`wakeup_flusher_threads(nr, WB_REASON_VMSCAN)`).
    vmscan: u64,
}

/// A backing device (`struct backing_dev_info` + its `bdi_writeback`): the mappings with dirty
/// pages on it and its flusher's work.
#[derive(Debug)]
pub struct Bdi {
    pub dev: u64,
    dirty: Mutex<Vec<Weak<AddressSpace>>>,
    work: Mutex<WbWork>,
    cv: Condvar,
}

/// The writeback state of a manager.
#[derive(Debug)]
pub struct WbState {
    bdis: Mutex<HashMap<u64, Arc<Bdi>>>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    start: Instant,
}

impl Default for WbState {
    fn default() -> Self {
        WbState {
            bdis: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            start: Instant::now(),
        }
    }
}

impl WbState {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis().sat_u64() + 1
    }
    /// Wakes every flusher so it sees shutdown.
    pub(crate) fn shutdown(&self) {
        for b in self.bdis.lock().values() {
            let mut w = b.work.lock();
            w.pending = true;
            b.cv.notify_all();
        }
    }
}

/// `global_dirty_limits`: (background threshold, threshold) in pages, as ratios of the dirtyable
/// memory (free frames plus file pages).
pub fn global_dirty_limits(m: &MmInner) -> (u64, u64) {
    // The file LRU sizes from the counters: no lru_lock on the writer's path.
    let dirtyable = m.node.nr_free()
        + m.vm.get(Item::NrInactiveFile)
        + m.vm.get(Item::NrActiveFile)
        + m.vm.get(Item::NrIsolatedFile);
    let thresh = dirtyable * m.cfg.dirty_ratio as u64 / 100;
    let mut bg = dirtyable * m.cfg.dirty_background_ratio as u64 / 100;
    if bg >= thresh {
        bg = thresh / 2;
    }
    m.vm.set(Item::NrDirtyThreshold, thresh);
    m.vm.set(Item::NrDirtyBackgroundThreshold, bg);
    (bg, thresh)
}

fn nr_dirty(vm: &Counters) -> u64 {
    vm.get(Item::NrDirty) + vm.get(Item::NrWriteback)
}

/// Starts `dev`'s flusher if it has none yet. Called when a file of the device is opened
/// ([`super::file::iget`]), so the first dirty page (often a write fault) finds it running.
pub(crate) fn bdi_start(m: &MmInner, dev: u64) {
    bdi_of(m, dev);
}

/// The flusher of `dev`, started on first use.
fn bdi_of(m: &MmInner, dev: u64) -> Arc<Bdi> {
    let mut map = m.wb.bdis.lock();
    if let Some(b) = map.get(&dev) {
        return b.clone();
    }
    let b = Arc::new(Bdi {
        dev,
        dirty: Mutex::new(Vec::new()),
        work: Mutex::new(WbWork::default()),
        cv: Condvar::new(),
    });
    map.insert(dev, b.clone());
    drop(map);
    if let Some(me) = m.self_arc() {
        let bb = b.clone();
        match super::spawn_thread(format!("usermm-flush-{dev:x}"), move || wb_workfn(me, bb)) {
            Ok(t) => m.wb.threads.lock().push(t),
            Err(e) => log::error!("spawning the flusher for device {dev:#x}: {e}"),
        }
    }
    b
}

/// `__mark_inode_dirty`: the mapping has a dirty page; put it on its flusher's list.
pub(crate) fn account_mapping_dirtied(m: &MmInner, mapping: &Arc<AddressSpace>) {
    let now = m.wb.now_ms();
    let _ = mapping
        .dirtied_when
        .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
    if !mapping.on_dirty_list.swap(true, Ordering::AcqRel) {
        let b = bdi_of(m, mapping.dev());
        b.dirty.lock().push(Arc::downgrade(mapping));
    }
}

/// Wakes the flushers of every device (`wakeup_flusher_threads`).
pub fn wakeup_flusher_threads(m: &MmInner, reason: WbReason, nr_pages: u64) {
    let bdis: Vec<Arc<Bdi>> = m.wb.bdis.lock().values().cloned().collect();
    for b in bdis {
        let mut w = b.work.lock();
        w.pending = true;
        match reason {
            WbReason::Background => w.background = true,
            WbReason::Vmscan => w.vmscan += nr_pages.max(1024),
        }
        b.cv.notify_one();
    }
    m.vm.inc(Item::FlusherWake);
    if reason == WbReason::Vmscan {
        m.vm.inc(Item::FlusherWakeVmscan);
    }
}

/// `do_writepages`: writes back up to `nr_to_write` dirty pages of `mapping` through its
/// `a_ops` (a disk file's `write_cache_pages`; in-memory files and the swap cache write nothing).
pub(crate) fn do_writepages(
    m: &MmInner,
    mapping: &Arc<AddressSpace>,
    start: PgOff,
    end: PgOff,
    sync: bool,
    nr_to_write: i64,
) -> std::io::Result<u64> {
    mapping
        .a_ops
        .writepages(m, mapping, start, end, sync, nr_to_write)
}

/// `balance_dirty_pages_ratelimited`: called by writers for each page they dirty. Starts
/// background writeback above the background threshold and pauses the writer above freerun,
/// in proportion to how far past it the dirty pages are; above the threshold it waits for
/// writeback.
pub fn balance_dirty_pages_ratelimited(m: &MmInner, mapping: &AddressSpace) {
    if mapping.is_memory() {
        return;
    }
    // ratelimit_pages: look at the global state every 32 pages a thread dirties.
    thread_local! {
        static DIRTIED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let skip = DIRTIED.with(|d| {
        let n = (d.get() + 1) % 32;
        d.set(n);
        n != 0
    });
    if skip {
        return;
    }
    balance_dirty_pages(m, mapping);
}

/// `balance_dirty_pages` without the ratelimit: for a write fault on a shared file mapping
/// served on the faulting thread (`fault_dirty_shared_page`), which dirties a whole
/// fault-around window at once.
pub(crate) fn balance_dirty_pages(m: &MmInner, mapping: &AddressSpace) {
    if mapping.is_memory() {
        return;
    }
    let dirty = nr_dirty(&m.vm);
    if dirty < 64 {
        return;
    }
    let (bg, thresh) = global_dirty_limits(m);
    if dirty <= bg {
        return;
    }
    wakeup_flusher_threads(m, WbReason::Background, 0);
    let freerun = (bg + thresh) / 2;
    if dirty <= freerun {
        return;
    }
    let start = Instant::now();
    m.vm.inc(Item::DirtyThrottle);
    loop {
        let dirty = nr_dirty(&m.vm);
        let (bg, thresh) = global_dirty_limits(m);
        let freerun = (bg + thresh) / 2;
        if dirty <= freerun || m.handlers.shutdown.load(Ordering::Relaxed) {
            break;
        }
        let span = thresh.saturating_sub(freerun).max(1);
        let over = dirty - freerun;
        let pause = MAX_PAUSE
            .mul_f64((over as f64 / span as f64).min(1.0))
            .max(Duration::from_micros(200));
        std::thread::sleep(pause);
        if dirty <= thresh || start.elapsed() > Duration::from_secs(10) {
            // Below the hard limit one proportional pause is enough.
            break;
        }
        wakeup_flusher_threads(m, WbReason::Background, 0);
    }
    m.vm.add(Item::DirtyThrottleUs, start.elapsed().as_micros().sat_u64());
}

/// One device's flusher (`wb_workfn`): background writeback while over the background
/// threshold or asked by reclaim, and periodic writeback of expired mappings.
fn wb_workfn(m: Arc<MmInner>, b: Arc<Bdi>) {
    let interval = Duration::from_millis(m.cfg.dirty_writeback_centisecs.max(1) as u64 * 10);
    let expire_ms = m.cfg.dirty_expire_centisecs as u64 * 10;
    loop {
        let (background, mut vmscan) = {
            let mut w = b.work.lock();
            if !w.pending {
                w = b.cv.wait_for(w, interval);
            }
            let r = (w.background, w.vmscan);
            *w = WbWork::default();
            r
        };
        if m.handlers.shutdown.load(Ordering::Acquire) {
            return;
        }
        let list: Vec<Arc<AddressSpace>> = {
            let mut d = b.dirty.lock();
            d.retain(|w| w.strong_count() > 0);
            d.iter().filter_map(|w| w.upgrade()).collect()
        };
        // Oldest first.
        let mut list = list;
        list.sort_by_key(|a| a.dirtied_when.load(Ordering::Relaxed));
        let now = m.wb.now_ms();
        let over_bg = |m: &MmInner| nr_dirty(&m.vm) > global_dirty_limits(m).0;
        for a in &list {
            if m.handlers.shutdown.load(Ordering::Acquire) {
                return;
            }
            // A closed file that was unlinked: its dirty pages are garbage, drop them.
            if a.users.load(Ordering::Acquire) == 0
                && a.file().is_some_and(|f| {
                    use std::os::unix::fs::MetadataExt;
                    f.metadata().is_ok_and(|md| md.nlink() == 0)
                })
            {
                super::truncate::evict_all(&m, a);
                m.files.forget_if_unused(a);
                continue;
            }
            let when = a.dirtied_when.load(Ordering::Relaxed);
            let expired = when != 0 && now.saturating_sub(when) >= expire_ms;
            let wanted = expired || vmscan > 0 || (background && over_bg(&m)) || over_bg(&m);
            if !wanted {
                continue;
            }
            loop {
                let chunk = if expired { i64::MAX } else { WRITEBACK_CHUNK };
                match do_writepages(&m, a, PgOff::ZERO, PgOff::MAX, false, chunk) {
                    Ok(n) => {
                        vmscan = vmscan.saturating_sub(n);
                        if n == 0 || expired || !(vmscan > 0 || over_bg(&m)) {
                            break;
                        }
                    }
                    Err(e) => {
                        log::error!("background writeback of {}: {e}", a.name());
                        break;
                    }
                }
            }
        }
        // Clean mappings leave the list.
        let mut d = b.dirty.lock();
        d.retain(|w| match w.upgrade() {
            Some(a) if a.dirtied_when.load(Ordering::Acquire) != 0 => true,
            Some(a) => {
                a.on_dirty_list.store(false, Ordering::Release);
                // Dirtied again between the check and now: keep it listed.
                if a.dirtied_when.load(Ordering::Acquire) != 0 {
                    a.on_dirty_list.store(true, Ordering::Release);
                    true
                } else {
                    false
                }
            }
            None => false,
        });
        let _ = b.dev;
    }
}
