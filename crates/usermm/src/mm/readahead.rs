//! File readahead. Mirrors `mm/readahead.c` of the 4.x kernels: `ondemand_readahead` with
//! `get_init_ra_size` / `get_next_ra_size`, the PG_readahead marker that triggers the next
//! asynchronous window, and sequential detection from the previous read.
//!
//! The window policy sits behind [`ReadaheadPolicy`] (one file per policy would be overkill for
//! two small ones; both are here with one shared conformance test): [`Ondemand`] is Linux's,
//! [`NoReadahead`] reads only what is asked (for random workloads and A/B runs).
//!
//! The asynchronous window ([`RaQueue`]): a read or fault that hits the PG_readahead marker
//! queues the next window and goes on at once; [`RA_WORKERS`] worker threads per manager
//! (`usermm-ra`, started on first use by filemap.rs) read the queued windows, each its own, so
//! that as many windows are in flight. The kernel submits the window's bios and returns
//! (`page_cache_async_ra` -> `read_pages`); the workers are user space's equivalent, so the I/O
//! of the next windows overlaps the mapping and use of this one, and a fault waits only for its
//! own page (on its page lock, as `filemap_fault` does). The same workers read a swap-in
//! stream's windows ahead of its faults ([`RaTarget::Swap`], memory.rs's `swap_ra_async`).

use std::collections::VecDeque;
use std::thread::JoinHandle;

use crate::sync::{Arc, Condvar, Mutex};

use super::fs::AddressSpace;
use super::page::PgOff;
use super::region::RegionInner;

/// A window to read: pages `[start, start+size)`, with the marker `async_size` pages before its
/// end (none when `async_size` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RaWindow {
    pub start: u64,
    pub size: u64,
    pub async_size: u64,
}

impl RaWindow {
    /// The page that gets PG_readahead.
    pub fn mark(&self) -> Option<u64> {
        (self.async_size > 0 && self.async_size <= self.size)
            .then(|| self.start + self.size - self.async_size)
    }
}

/// A readahead window policy.
pub trait ReadaheadPolicy: Send + Sync {
    /// Name for reports (the policy conformance test).
    #[cfg(any(test, feature = "testing"))]
    fn name(&self) -> &'static str;
    /// The window for a read of `req` pages at `index` that found `index` uncached.
    fn on_miss(&self, st: &mut FileRaState, index: u64, req: u64, max: u64) -> RaWindow;
    /// The window after a read hit the PG_readahead marker at `index`.
    fn on_marker(&self, st: &mut FileRaState, index: u64, req: u64, max: u64) -> RaWindow;
}

/// `struct file_ra_state`: one open file's readahead state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRaState {
    /// The current window.
    pub win: RaWindow,
    /// The last page read (u64::MAX: none yet).
    pub prev_index: u64,
    /// Policy: true = Linux's ondemand, false = none.
    pub ondemand: bool,
}

impl Default for FileRaState {
    fn default() -> Self {
        FileRaState {
            win: RaWindow::default(),
            prev_index: u64::MAX,
            ondemand: true,
        }
    }
}

impl FileRaState {
    fn policy(&self) -> &'static dyn ReadaheadPolicy {
        if self.ondemand {
            &Ondemand
        } else {
            &NoReadahead
        }
    }
    /// The window for a miss at `index`, by this file's policy.
    pub fn on_miss(&mut self, index: u64, req: u64, max: u64) -> RaWindow {
        let p = self.policy();
        p.on_miss(self, index, req, max)
    }
    /// The window after hitting the marker at `index`.
    pub fn on_marker(&mut self, index: u64, req: u64, max: u64) -> RaWindow {
        let p = self.policy();
        p.on_marker(self, index, req, max)
    }
}

/// `ra_pages`: the largest readahead window in pages, `read_ahead_kb` but at most 1/16 of a
/// budget of `nr_frames` pages (at least one page): a window that is a large part of a small
/// budget evicts the pages read ahead of it before they are used.
pub fn ra_pages(read_ahead_kb: u32, nr_frames: u64) -> u64 {
    (read_ahead_kb as u64 / 4).min(nr_frames / 16).max(1)
}

/// `get_init_ra_size`: the first window, 4x (small requests) or 2x the request, rounded up to a
/// power of two, capped at `max`.
pub fn get_init_ra_size(req: u64, max: u64) -> u64 {
    let newsize = req.max(1).next_power_of_two();
    let n = if newsize <= max / 32 {
        newsize * 4
    } else if newsize <= max / 4 {
        newsize * 2
    } else {
        max
    };
    n.min(max).max(1)
}

/// `get_next_ra_size`: the next window, 4x while small, then 2x, capped at `max`.
pub fn get_next_ra_size(cur: u64, max: u64) -> u64 {
    let n = if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    };
    n.min(max).max(1)
}

/// Linux's `ondemand_readahead`.
#[derive(Debug)]
pub struct Ondemand;

impl ReadaheadPolicy for Ondemand {
    #[cfg(any(test, feature = "testing"))]
    fn name(&self) -> &'static str {
        "ondemand"
    }

    fn on_miss(&self, st: &mut FileRaState, index: u64, req: u64, max: u64) -> RaWindow {
        let max = max.max(1);
        let w = &mut st.win;
        // Sequential: the read continues the current window or the last page read.
        let seq = (st.prev_index != u64::MAX
            && (index == st.prev_index || index == st.prev_index + 1))
            || (w.size > 0 && index == w.start + w.size);
        if seq && w.size > 0 && index == w.start + w.size {
            // Ramp up from the previous window.
            w.start = index;
            w.size = get_next_ra_size(w.size, max);
            w.async_size = w.size;
        } else if seq || index == 0 {
            // Start of file or a new sequential stream: initial window.
            w.start = index;
            w.size = get_init_ra_size(req, max);
            w.async_size = if w.size > req { w.size - req } else { w.size };
        } else {
            // Random read: just what was asked (plus nothing).
            w.start = index;
            w.size = req.min(max).max(1);
            w.async_size = 0;
        }
        *w
    }

    fn on_marker(&self, st: &mut FileRaState, index: u64, _req: u64, max: u64) -> RaWindow {
        let max = max.max(1);
        let w = &mut st.win;
        // Hit the marker of the current window: the next window starts where it ends.
        let expected = w.start + w.size - w.async_size;
        if w.size > 0 && index == expected {
            w.start += w.size;
            w.size = get_next_ra_size(w.size, max);
            w.async_size = w.size;
        } else {
            // A marker from an older window (interleaved readers): restart from here.
            w.start = index + 1;
            w.size = get_init_ra_size(1, max);
            w.async_size = w.size;
        }
        *w
    }
}

/// No readahead: read exactly what is requested.
#[derive(Debug)]
pub struct NoReadahead;

impl ReadaheadPolicy for NoReadahead {
    #[cfg(any(test, feature = "testing"))]
    fn name(&self) -> &'static str {
        "none"
    }
    fn on_miss(&self, st: &mut FileRaState, index: u64, req: u64, max: u64) -> RaWindow {
        st.win = RaWindow {
            start: index,
            size: req.clamp(1, max.max(1)),
            async_size: 0,
        };
        st.win
    }
    fn on_marker(&self, st: &mut FileRaState, index: u64, _req: u64, _max: u64) -> RaWindow {
        st.win = RaWindow {
            start: index,
            size: 0,
            async_size: 0,
        };
        st.win
    }
}

/// What a queued window reads.
#[derive(Debug, Clone)]
pub enum RaTarget {
    /// Pages of a file's page cache, PG_readahead on `mark` (`page_cache_async_ra`).
    File {
        mapping: Arc<AddressSpace>,
        mark: Option<PgOff>,
    },
    /// Swapped pages of an anonymous region that a swap-in stream is about to reach
    /// (memory.rs's `swap_ra_async`): read and mapped ahead of the faults by `read`
    /// (memory.rs's `swap_ra_read`, named here as an operation, as `address_space_operations`
    /// name a file system's `readahead`, so that the workers in filemap.rs need not know
    /// memory.rs, which knows them).
    Swap {
        region: Arc<RegionInner>,
        read: SwapRaRead,
    },
}

/// Reads and maps pages `[start, start + nr)` of a region's swap-in stream; returns the pages
/// read.
pub type SwapRaRead = fn(&super::MmInner, &Arc<RegionInner>, PgOff, u64) -> u64;

impl RaTarget {
    /// The same file or region.
    fn same(&self, o: &RaTarget) -> bool {
        match (self, o) {
            (RaTarget::File { mapping: a, .. }, RaTarget::File { mapping: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            (RaTarget::Swap { region: a, .. }, RaTarget::Swap { region: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            _ => false,
        }
    }
}

/// One queued asynchronous window: pages `[start, start + nr)` of `target`.
#[derive(Debug, Clone)]
pub struct RaRequest {
    pub target: RaTarget,
    pub start: PgOff,
    pub nr: u64,
}

/// Windows queued and not yet taken by the worker, at most; more are dropped (readahead is a
/// hint: the access that needs a dropped window reads it synchronously).
pub const RA_QUEUE_MAX: usize = 32;

/// Readahead worker threads per manager, started as windows are queued: windows read at once
/// (a mapped file read in sequence keeps up to eight windows ahead of its faults, memory.rs's
/// `RA_AHEAD_MAX`, so its reads keep the device at queue depth eight).
pub const RA_WORKERS: usize = 8;

#[derive(Debug, Default)]
struct RaQueueInner {
    reqs: VecDeque<RaRequest>,
    /// Worker threads started (or being started).
    workers: usize,
    /// Windows taken by a worker and not read yet.
    reading: usize,
    shutdown: bool,
}

/// What [`RaQueue::push`] did with a window.
#[derive(Debug)]
pub enum RaPush {
    /// Queued for the running workers.
    Queued,
    /// No worker runs (none could be started): nothing is queued; the window is handed back
    /// for the caller to read.
    NoWorker(RaRequest),
    /// The same window is queued already, or the queue is full: dropped.
    Dropped,
    /// The manager is going away: nothing is queued; the window is handed back.
    Shutdown(RaRequest),
}

/// The asynchronous readahead queue (module doc).
#[derive(Debug, Default)]
pub struct RaQueue {
    q: Mutex<RaQueueInner>,
    cv: Condvar,
    /// Held by a worker for the CPU work of a window (frames, page-cache insertion, filling the
    /// slots), not for its reads: the workers' I/O overlaps, their CPU work does not contend
    /// (for windows of holes, nothing but CPU work, two workers were 8% slower than one).
    pub(crate) cpu: Mutex<()>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// The bounce buffers of swap windows ([`RaTarget::Swap`]), shared by the workers: that
    /// many swap windows are read at once, and the manager's memory outside its budget grows
    /// by that many windows, not by one bounce buffer per worker (eight workers' 2 MiB each
    /// took `usermm run`'s programs 16 MiB past their budget).
    pub(crate) swap_bounce: [Mutex<Option<crate::sys::Mapping>>; SWAP_RA_BOUNCES],
}

/// Swap windows read at once by the readahead workers ([`RaQueue::swap_bounce`]).
pub const SWAP_RA_BOUNCES: usize = 2;

impl RaQueue {
    /// Queues a window (see [`RaPush`]).
    pub fn push(&self, req: RaRequest) -> RaPush {
        let mut q = self.q.lock();
        if q.shutdown {
            return RaPush::Shutdown(req);
        }
        if q.reqs.len() >= RA_QUEUE_MAX
            || q.reqs
                .iter()
                .any(|r| r.target.same(&req.target) && r.start == req.start)
        {
            return RaPush::Dropped;
        }
        if q.workers == 0 {
            return RaPush::NoWorker(req);
        }
        q.reqs.push_back(req);
        self.cv.notify_one();
        RaPush::Queued
    }

    /// A worker is being started (the manager's first, at its creation).
    pub fn add_worker(&self) {
        self.q.lock().workers += 1;
    }

    /// A worker could not be started. Returns whether another worker runs (it reads the
    /// queued windows; otherwise the caller reads them).
    pub fn worker_failed(&self) -> bool {
        let mut q = self.q.lock();
        q.workers -= 1;
        q.workers > 0
    }

    /// The next window, waiting for one; None once the queue is shut down (queued windows are
    /// dropped: their pages were never inserted).
    /// The worker calls it again when the window is read, so [`idle`](Self::idle) is exact.
    /// `done`: the worker read the window it took last.
    ///
    /// The second value asks the worker to start one more worker first: the windows queued
    /// outnumber the idle workers and fewer than [`RA_WORKERS`] run. Workers are started only
    /// by workers (and the first by the manager), never by the fault path: a handler thread in
    /// pthread_create waits for the dynamic loader's lock and reads its TLS bookkeeping, which
    /// the program's dlopen allocated in managed memory; a fault there with the other handler
    /// waiting for that lock hung a `multiprocessing` worker under `usermm run`.
    pub fn pop(&self, done: bool) -> Option<(RaRequest, bool)> {
        let mut q = self.q.lock();
        if done {
            q.reading -= 1;
        }
        loop {
            if q.shutdown {
                q.reqs.clear();
                return None;
            }
            if let Some(r) = q.reqs.pop_front() {
                q.reading += 1;
                let idle = q.workers.saturating_sub(q.reading);
                let more = q.workers < RA_WORKERS && q.reqs.len() > idle;
                if more {
                    q.workers += 1;
                }
                return Some((r, more));
            }
            q = self.cv.wait(q);
        }
    }

    /// Nothing queued and nothing being read ([`Mm::settle`](crate::Mm::settle) waits for it).
    pub fn idle(&self) -> bool {
        let q = self.q.lock();
        q.reqs.is_empty() && q.reading == 0
    }

    /// The next window if one is queued (the synchronous fallback's drain).
    pub fn try_pop(&self) -> Option<RaRequest> {
        self.q.lock().reqs.pop_front()
    }

    /// Stops the workers after the windows they are reading (the manager is being dropped).
    pub fn shutdown(&self) {
        let mut q = self.q.lock();
        q.shutdown = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy: a miss window contains the missed page, never exceeds `max` (or the
    /// request), and its marker lies inside it.
    #[test]
    fn conformance() {
        let policies: [&dyn ReadaheadPolicy; 2] = [&Ondemand, &NoReadahead];
        for p in policies {
            let mut st = FileRaState::default();
            let max = 32;
            let mut idx = 0;
            for step in 0..200u64 {
                let req = 1 + step % 5;
                let w = p.on_miss(&mut st, idx, req, max);
                assert!(
                    w.start <= idx && idx < w.start + w.size,
                    "{} {w:?} {idx}",
                    p.name()
                );
                assert!(w.size <= max.max(req), "{} {w:?}", p.name());
                if let Some(m) = w.mark() {
                    assert!(m >= w.start && m < w.start + w.size, "{} {w:?}", p.name());
                    let w2 = p.on_marker(&mut st, m, 1, max);
                    assert!(w2.size <= max, "{} {w2:?}", p.name());
                }
                st.prev_index = idx + req - 1;
                idx = if step % 7 == 6 {
                    idx * 3 + 11
                } else {
                    idx + req
                };
            }
        }
    }

    #[test]
    fn ondemand_ramps_up_sequentially() {
        let mut st = FileRaState::default();
        let w = st.on_miss(0, 1, 32);
        assert_eq!((w.start, w.size), (0, 4));
        assert_eq!(w.mark(), Some(1));
        let w = st.on_marker(1, 1, 32);
        assert_eq!((w.start, w.size), (4, 8));
        let w = st.on_marker(4, 1, 32);
        assert_eq!((w.start, w.size), (12, 16));
        let w = st.on_marker(12, 1, 32);
        assert_eq!((w.start, w.size), (28, 32));
        let w = st.on_marker(28, 1, 32);
        assert_eq!((w.start, w.size), (60, 32), "capped at max");
    }

    #[test]
    fn ondemand_random_reads_no_more_than_asked() {
        let mut st = FileRaState {
            prev_index: 10,
            ..Default::default()
        };
        let w = st.on_miss(1000, 2, 32);
        assert_eq!((w.start, w.size, w.async_size), (1000, 2, 0));
    }

    #[test]
    fn a_window_is_at_most_a_sixteenth_of_the_budget() {
        assert_eq!(ra_pages(1024, 65536), 256);
        assert_eq!(ra_pages(1024, 1024), 64, "4 MiB budget");
        assert_eq!(ra_pages(1024, 8), 1);
        assert_eq!(ra_pages(0, 65536), 1);
    }

    #[test]
    fn init_and_next_sizes_follow_linux() {
        assert_eq!(get_init_ra_size(1, 32), 4);
        assert_eq!(get_init_ra_size(4, 32), 8);
        assert_eq!(get_init_ra_size(16, 32), 32);
        assert_eq!(get_next_ra_size(1, 32), 4);
        assert_eq!(get_next_ra_size(4, 32), 8);
        assert_eq!(get_next_ra_size(16, 32), 32);
    }
}
