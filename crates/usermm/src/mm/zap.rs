//! The pool's deferred slot drops: the protocol behind `pool::defer_zap`, apart from the pool
//! so the model checker can run it (tests/loom_page.rs). No kernel counterpart; the closest is
//! the batched TLB flush of `mm/rmap.c` (`try_to_unmap_flush`), which gathers work the same way.
//!
//! A frame whose page was placed in its view by UFFDIO_COPY still has a stale copy in its pool
//! slot. The frame gets PG_zappending and goes on the queue; [`ZapQueue::flush`] drops the
//! queued slots in one call and only then clears their flags, all under the queue's lock. A
//! frame freed meanwhile ([`ZapQueue::settle_free`]) takes the same lock to clear its flag, so
//! its slot is never refilled by a new user while a drop that covers it is still in flight.

use super::page::{pg, MemMap, Pfn};
use crate::sync::Mutex;

/// Slots dropped per batch.
pub const ZAP_BATCH: usize = 32;

/// The queue of slots to drop (see the module doc).
#[derive(Debug)]
pub struct ZapQueue {
    q: Mutex<Vec<Pfn>>,
}

impl Default for ZapQueue {
    fn default() -> Self {
        ZapQueue {
            q: Mutex::new(Vec::with_capacity(ZAP_BATCH)),
        }
    }
}

impl ZapQueue {
    /// Queues frame `f`'s slot. True when the queue holds a full batch (the caller flushes).
    pub fn push(&self, pages: &MemMap, f: Pfn) -> bool {
        let mut q = self.q.lock();
        pages[f].set(pg::ZAPPENDING);
        q.push(f);
        q.len() >= ZAP_BATCH
    }

    /// Drops every queued slot whose frame still has PG_zappending with one call of `drop`
    /// (sorted, without duplicates), then clears their flags; returns how many were dropped.
    pub fn flush(&self, pages: &MemMap, drop: impl FnOnce(&[Pfn])) -> usize {
        let mut q = self.q.lock();
        q.retain(|&f| pages[f].test(pg::ZAPPENDING));
        if q.is_empty() {
            return 0;
        }
        q.sort_unstable();
        q.dedup();
        drop(&q);
        for &f in q.iter() {
            pages[f].clear(pg::ZAPPENDING);
        }
        let n = q.len();
        q.clear();
        n
    }

    /// A frame being freed whose slot drop is still pending keeps its page as a recycled one
    /// (PG_pooled): the next user overwrites it. Returns true if it did.
    pub fn settle_free(&self, pages: &MemMap, f: Pfn) -> bool {
        let p = &pages[f];
        if !p.test(pg::ZAPPENDING) {
            return false;
        }
        let _q = self.q.lock();
        if p.test_clear(pg::ZAPPENDING) {
            p.set(pg::POOLED);
            return true;
        }
        false
    }
}
