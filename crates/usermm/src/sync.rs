//! The one place usermm takes its synchronization primitives from, so that a model checker can
//! replace them. Under `--cfg loom` the atomics and locks come from loom and the page state
//! machine tests in `tests/loom_page.rs` explore every interleaving; otherwise std atomics and
//! parking_lot locks (small, fair enough, no poisoning).

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, MutexGuard};

/// loom's mutex behind parking_lot's API (`lock()` without poisoning).
#[cfg(loom)]
#[derive(Debug)]
pub struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub fn new(t: T) -> Self {
        Mutex(loom::sync::Mutex::new(t))
    }
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().expect("loom mutex poisoned")
    }
}
#[cfg(loom)]
pub use loom::thread::yield_now;

#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::Arc;
#[cfg(not(loom))]
pub use std::thread::yield_now;

/// Spins briefly, then yields: the wait used for bit locks whose holders never sleep while
/// holding them (pte locks) or sleep only for bounded I/O (page locks held by reclaim).
#[inline]
pub fn backoff(iter: &mut u32) {
    if *iter < 64 && !cfg!(loom) {
        std::hint::spin_loop();
    } else {
        yield_now();
    }
    *iter = iter.saturating_add(1);
}
