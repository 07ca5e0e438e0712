//! Asynchronous reads of single file pages for faults: a random reader's miss served on a
//! handler thread puts its page's read in flight through that thread's own io_uring, and the
//! fault is parked on the page (handler.rs `IoWaiters`); the handler goes on to the next fault
//! at once and, between faults and when its poll finds the ring readable, reaps the reads that
//! ended and serves the faults parked on them. Mirrors `fs/mpage.c`: `mpage_read_folio`
//! submits the bio of a locked, not up to date folio and returns, `mpage_end_io` ends it
//! (`folio_end_read`: up to date or error, unlocked, waiters woken).
//!
//! Why: a handler that read the page itself blocked for the device's latency, and every fault
//! of the program's other threads meanwhile needed a standby reader woken to read the
//! userfaultfd in its place (handler.rs `blocking_io`): about four context switches per
//! random fault against the kernel's one. Each handler's ring is its own (single issuer,
//! deferred task work): a completion is run by the thread that submitted it when it reaps,
//! never by interrupting another thread (a ring shared by the handlers and reaped by a thread
//! of its own had every completion wake the submitter to post it, then the reaper: slower
//! than the synchronous reads, measured). Only single-page reads go this way (a region
//! declared random, or whose faults mostly miss: `filemap_fault`'s `ra == 1`), on handler
//! threads, with `file_io=io_uring`; windows, holes, other threads keep the synchronous path,
//! which is also what a read that fails or comes back short is done again by (the end of a
//! file, an error: exactly the synchronous path's result).

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::atomic::Ordering;

use crate::settings::Switch;
use crate::sync::Arc;
use crate::sys::ring::{AsyncPageReads, PageReadDone};
use crate::sys::PAGE_SIZE;
use crate::vmstat::Item;

use super::filemap;
use super::fs::{AddressSpace, Host};
use super::manager::MmInner;
use super::page::{pg, Owner, Pfn, PgOff};
use super::pool;

/// A read in flight: the page (locked, in the cache at `index` of `mapping`) and whether its
/// pool slot held a page when the read was submitted.
#[derive(Debug)]
struct Pending {
    mapping: Arc<AddressSpace>,
    f: Pfn,
    index: PgOff,
    present: bool,
}

/// Reads in flight at most per handler thread (its ring's page slots; more faults than this
/// pending on one handler read synchronously).
pub const SLOTS_PER_THREAD: usize = 32;

/// A handler thread's reads in flight.
struct ThreadAio {
    reads: AsyncPageReads,
    pending: std::collections::HashMap<u64, Pending>,
    next_tag: u64,
}

thread_local! {
    /// This thread's ring, made at its first asynchronous read.
    static AIO: RefCell<Option<ThreadAio>> = const { RefCell::new(None) };
    /// This thread reads asynchronously (a handler thread; [`enable_on_this_thread`]); false
    /// again if its ring could not be made.
    static AIO_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Lets this thread (a fault handler, which reaps: handler.rs) read asynchronously; registers
/// the thread-local's destructor now (pool.rs `warm_thread_locals` says why).
pub(crate) fn enable_on_this_thread() {
    AIO.with(|_| {});
    AIO_THREAD.with(|t| t.set(true));
}

/// Reads in flight on this thread.
pub(crate) fn in_flight() -> usize {
    AIO.with(|a| {
        a.try_borrow()
            .ok()
            .and_then(|a| a.as_ref().map(|t| t.reads.in_flight()))
            .unwrap_or(0)
    })
}

/// Whether a read of this thread may have ended (no system call).
pub(crate) fn ready() -> bool {
    AIO.with(|a| {
        a.try_borrow_mut()
            .ok()
            .is_some_and(|mut a| a.as_mut().is_some_and(|t| t.reads.ready()))
    })
}

/// This thread's ring descriptor while a read is in flight (for its poll).
pub(crate) fn poll_fd() -> Option<std::os::fd::RawFd> {
    AIO.with(|a| {
        a.try_borrow().ok().and_then(|a| {
            a.as_ref()
                .filter(|t| t.reads.in_flight() > 0)
                .map(|t| t.reads.fd())
        })
    })
}

/// `mpage_read_folio` for a fault's miss of page `index` of `mapping`: if the read can go
/// asynchronously, a new page is put in the cache locked, its read put in flight, and true
/// returned at once (the caller finds the page locked and not up to date, and parks its
/// fault on it); true also if another thread put the page there meanwhile. False: nothing
/// done, the caller reads synchronously (not a handler thread, `file_io=sync`, no io_uring, a
/// hole, a test's failing device, no frame now).
pub(crate) fn read_page_async(m: &MmInner, mapping: &Arc<AddressSpace>, index: PgOff) -> bool {
    if !AIO_THREAD.with(Cell::get)
        || !super::page_state::may_park()
        || !m.cfg.settings.is_new(Switch::FileIo)
        || m.handlers.shutdown.load(Ordering::Acquire)
        || mapping.inject_read_errors.load(Ordering::Relaxed) > 0
    {
        return false;
    }
    let Some(file) = mapping.file() else {
        return false;
    };
    let eof = mapping
        .size
        .load(Ordering::Acquire)
        .div_ceil(PAGE_SIZE as u64);
    if index.raw() >= eof || !filemap::data_pages(mapping, &file, index, 1)[0] {
        // Beyond the end or in a hole: the synchronous path zero-fills it without I/O.
        return false;
    }
    let ok = AIO.with(|cell| {
        let Ok(mut t) = cell.try_borrow_mut() else {
            return false;
        };
        if t.is_none() {
            match AsyncPageReads::new(SLOTS_PER_THREAD) {
                Ok(reads) => {
                    *t = Some(ThreadAio {
                        reads,
                        pending: Default::default(),
                        next_tag: 0,
                    })
                }
                Err(e) => {
                    log::debug!(
                        "no asynchronous page reads ({e}): this thread reads synchronously"
                    );
                    AIO_THREAD.with(|t| t.set(false));
                    return false;
                }
            }
        }
        t.as_ref()
            .is_some_and(|t| t.reads.in_flight() < SLOTS_PER_THREAD)
    });
    if !ok {
        return false;
    }
    let mut frames = Vec::with_capacity(1);
    if !super::page_alloc::alloc_pages(m, 1, &mut frames) || frames.is_empty() {
        return false;
    }
    let f = frames[0];
    let p = &m.node.pages[f];
    let pooled = p.test(pg::POOLED);
    p.init(
        Owner::Cache(mapping.id, index),
        pg::LOCKED | pg::PAGECACHE | if pooled { pg::POOLED } else { 0 },
    );
    if !filemap::add_to_page_cache_lru(m, mapping, f, index) {
        // Another thread's page is there now: the caller finds it.
        p.reset_flags(0);
        pool::free_frames(m, &[f], true);
        return true;
    }
    pool::settle(m, f);
    p.clear(pg::POOLED);
    let present = pool::slots_present(m, &[f])[0];
    // The allocation above may have reclaimed, and reclaim may have served parked faults:
    // borrowed again only now.
    let submitted = AIO.with(|cell| {
        let Ok(mut t) = cell.try_borrow_mut() else {
            return false;
        };
        let Some(t) = t.as_mut() else { return false };
        let tag = t.next_tag;
        if t.reads.submit(&file, index.byte_offset(), tag).is_none() {
            return false;
        }
        t.next_tag += 1;
        t.pending.insert(
            tag,
            Pending {
                mapping: mapping.clone(),
                f,
                index,
                present,
            },
        );
        true
    });
    if submitted {
        m.vm.inc(Item::FileReadAsync);
    } else {
        // Every slot in flight, or the queue full: this page is read here, as before.
        let res = filemap::read_into(m, mapping, index, &[f]);
        filemap::folio_end_read(m, mapping, f, index, res);
    }
    true
}

/// Ends this thread's reads that completed (with `wait`, waits for one first if any is in
/// flight): each page is copied from its read's slot into its pool slot, marked up to date,
/// unlocked, and the faults parked on it served. Returns how many ended.
pub(crate) fn reap(m: &MmInner, wait: bool) -> usize {
    let ended: Vec<(Pending, io::Result<bool>)> = AIO.with(|cell| {
        let Ok(mut t) = cell.try_borrow_mut() else {
            return Vec::new();
        };
        let Some(t) = t.as_mut() else {
            return Vec::new();
        };
        let mut done = Vec::new();
        t.reads.reap(wait, &mut done);
        let mut ended = Vec::with_capacity(done.len());
        for d in done {
            match t.pending.remove(&d.tag) {
                Some(p) => {
                    let res = copy_out(m, &t.reads, &p, d);
                    ended.push((p, res));
                }
                None => {
                    log::error!("page read {} ended with nobody waiting for it", d.tag);
                    m.vm.inc(Item::MmWarn);
                }
            }
            t.reads.release(d.slot);
        }
        ended
    });
    let n = ended.len();
    for (p, res) in ended {
        let res = match res {
            Ok(true) => Ok(()),
            // Short (the file on disk ends inside the page, or shrank) or failed: the
            // synchronous read gives exactly its answer (zeros past the end, or the error).
            Ok(false) => filemap::read_into(m, &p.mapping, p.index, &[p.f]),
            Err(e) => Err(e),
        };
        filemap::folio_end_read(m, &p.mapping, p.f, p.index, res);
    }
    n
}

/// Ends every read in flight on this thread (a handler about to exit).
pub(crate) fn drain(m: &MmInner) {
    while in_flight() > 0 {
        reap(m, true);
    }
}

/// `mpage_end_io` for one completed read: a whole page read is copied from the read's slot
/// into the page's pool slot (true); a read that failed or came back short is false (done
/// again synchronously by the caller).
fn copy_out(m: &MmInner, reads: &AsyncPageReads, p: &Pending, d: PageReadDone) -> io::Result<bool> {
    if d.result != Ok(PAGE_SIZE) {
        return Ok(false);
    }
    let src = Some((reads.buffer(), reads.slot_offset(d.slot)));
    if let Err(e) = filemap::fill_frames(m, &[p.f], &[p.present], 0, 1, src) {
        pool::ensure_slot(m, p.f);
        return Err(e);
    }
    m.vm.inc(Item::FileIoUring);
    m.vm.add(Item::Pgpgin, PAGE_SIZE as u64 / 1024);
    if !matches!(p.mapping.host, Host::File { direct: true, .. }) {
        if let Some(file) = p.mapping.file() {
            m.vm.warn_on(
                crate::sys::fadvise_dontneed(&file, p.index.byte_offset(), PAGE_SIZE as u64),
                "dropping a read page from the kernel's page cache",
            );
        }
    }
    filemap::record_read_hashes(m, &p.mapping, &[p.f], &[true]);
    Ok(true)
}
