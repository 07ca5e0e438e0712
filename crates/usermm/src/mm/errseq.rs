//! `errseq_t`: a writeback error reported once to each waiter. Mirrors `lib/errseq.c`.

use std::sync::atomic::AtomicI32;

use crate::sync::{AtomicU64, Ordering};

/// `errseq_t`: a mapping's writeback error, reported once to each waiter that sampled it
/// before the error happened.
#[derive(Debug, Default)]
pub struct ErrSeq {
    seq: AtomicU64,
    errno: AtomicI32,
}

impl ErrSeq {
    /// Records an error.
    pub fn set(&self, errno: i32) {
        self.errno.store(errno, Ordering::Release);
        self.seq.fetch_add(1, Ordering::AcqRel);
    }
    /// The cursor a new waiter starts from (errors before now are not reported to it).
    pub fn sample(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
    /// The error recorded since `cursor`, advancing it (each waiter sees each error once).
    pub fn check_and_advance(&self, cursor: &AtomicU64) -> Option<i32> {
        let now = self.seq.load(Ordering::Acquire);
        let old = cursor.swap(now, Ordering::AcqRel);
        (now != old).then(|| self.errno.load(Ordering::Acquire))
    }
}
