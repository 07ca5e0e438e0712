//! The one place usermm takes its synchronization primitives from, so that a model checker can
//! replace them. Under `--cfg loom` the atomics and locks come from loom and the page state
//! machine tests in `tests/loom_page.rs` explore every interleaving; otherwise std atomics and
//! std's futex locks behind a poison-free API ([`locks`]).

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, MutexGuard};

/// loom's mutex behind the shim's API (`lock()` without poisoning).
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

/// One-time initialisation (lazily made tables: the memory map's sections). loom has none; its
/// models make such tables whole before they start (`MemMap::new`).
pub use std::sync::OnceLock;

#[cfg(not(loom))]
pub use self::locks::{Condvar, Mutex, MutexGuard, RwLock};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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

/// std's locks behind the API usermm uses (`lock()` without poisoning, `try_lock()` as an
/// Option). Not parking_lot's: parking_lot parks contended threads in one process-wide table,
/// and after fork(2) a child inherits that table with the queues of the parent's threads that
/// were parked at that moment, while glibc hands the child's new threads the dead threads'
/// cached stacks, thread-locals included. A forked child under `usermm run` (which starts its
/// own manager) hung with its kswapd and a handler parked forever on one mutex. std's locks
/// are a futex on the lock word each: nothing is shared beyond the lock itself.
#[cfg(not(loom))]
mod locks {
    use std::sync::{PoisonError, TryLockError};
    use std::time::Duration;

    pub type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    /// A mutex (`std::sync::Mutex`; a panic while holding it does not poison it for others).
    #[derive(Debug, Default)]
    pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub const fn new(t: T) -> Self {
            Mutex(std::sync::Mutex::new(t))
        }
    }

    impl<T: ?Sized> Mutex<T> {
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            }
        }
    }

    /// A reader-writer lock (`std::sync::RwLock`, without poisoning).
    #[derive(Debug, Default)]
    pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub const fn new(t: T) -> Self {
            RwLock(std::sync::RwLock::new(t))
        }
    }

    impl<T: ?Sized> RwLock<T> {
        pub fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(PoisonError::into_inner)
        }
        pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// A condition variable (`std::sync::Condvar`, without poisoning).
    #[derive(Debug, Default)]
    pub struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub const fn new() -> Self {
            Condvar(std::sync::Condvar::new())
        }
        /// Waits for a notification, releasing the guard's lock meanwhile.
        pub fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(g).unwrap_or_else(PoisonError::into_inner)
        }
        /// [`Condvar::wait`] for at most `d`.
        pub fn wait_for<'a, T>(&self, g: MutexGuard<'a, T>, d: Duration) -> MutexGuard<'a, T> {
            match self.0.wait_timeout(g, d) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            }
        }
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}
