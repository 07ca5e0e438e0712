//! The userfaultfd reader threads. Mirrors the reading side of `fs/userfaultfd.c`
//! (`userfaultfd_read`, `handle_userfault` wakeups) as a pool of handler threads.
//!
//! Every handler reads the manager's (non-blocking) userfaultfd in batches, so 64 faulting
//! threads are served by all handlers at once, never through one reader. A fault whose page is
//! locked by reclaim is deferred and retried by the same handler after the others, so one stuck
//! page never blocks the rest. An idle handler spins for `handler_spin_us` before it sleeps in
//! poll(2) (at most one handler spins at a time): on this VM a sleeping handler costs a
//! cross-vCPU wakeup of 24-50 us per fault, a spinning one does not. It spins only while a CPU
//! is free for it ([`SpinGate`]): a spinner on a machine whose CPUs the program's own threads
//! and kswapd already fill takes CPU time from them (GNU sort, two threads on 2 vCPUs, ran 25%
//! longer with the handlers spinning).
//!
//! The re-fault tripwire ([`RefaultTrack`]): a thread whose fault was answered faults again at
//! once at the same address only if the answer did not map the page. [`REFAULT_TRIP`] such
//! faults in a row are logged with the page's entry and descriptor, counted
//! (`fault_refault_tripwire`) and resolved from scratch instead of being answered again.
//!
//! A fault on a page under read I/O (a readahead window a worker is reading) does not hold its
//! handler: it is parked ([`IoWaiters`]) and served by the thread that completes the read, right
//! after it unlocks the window's pages, on the CPU it already runs on. A handler that waited
//! there instead (yielding until the page lock came free) was 16% of all CPU time in a mapped
//! sequential read, and behind it the faults of the program's other threads waited too.
//!
//! No fault waits forever: a panic while serving a fault is caught, the fault served once more
//! and, if that panics too, its page poisoned (SIGBUS to the toucher), logged and counted
//! (`handler_panic`); a handler thread that dies anyway (a panic outside the guard) wakes every
//! fault it had read and not answered, so their threads fault again and a live handler serves
//! them, and starts over (`handler_died`); a watchdog thread reports faults outstanding longer
//! than a threshold (`fault_stuck`, with the page's state), and faults left unread in the
//! userfaultfd while no handler reads (every handler wedged): it reads them, logs each address
//! and serves them itself (`fault_unread`). `Mm::health` lists all of these.

use std::time::{Duration, Instant};

use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::sys::uffd::{event, EventFd, Msg};
use crate::vmstat::Item;

use super::memory::{handle_fault, poison_after_panic, resolve_from_scratch, Fault};
use super::page::Pfn;
use super::page_state::{set_may_park, take_parked};
use super::MmInner;
use crate::conv::Saturate;

/// The handler threads' shared state: shutdown, the idle spinner, the re-fault tripwire's
/// memory and the watchdog's per-thread slots.
#[derive(Debug)]
pub struct HandlerState {
    /// Set when the manager is being torn down; `shutdown_efd` wakes sleepers.
    pub(crate) shutdown: AtomicBool,
    pub(crate) shutdown_efd: EventFd,
    /// Handlers spinning now (at most one spins at a time).
    pub(crate) spinners: AtomicU32,
    /// The re-fault tripwire's memory of each thread's last faults.
    pub(crate) refaults: RefaultTrack,
    /// Per handler thread: the fault it serves and its oldest deferred one (the watchdog's view).
    pub(crate) slots: Box<[HandlerSlot]>,
    /// Start of this manager's clock for the handler slots.
    pub(crate) epoch: Instant,
    /// The watchdog's threshold (ms): faults outstanding longer are reported.
    pub(crate) stuck_after_ms: AtomicU64,
    /// Batches of messages the handlers have read (the watchdog's sign that they read at all).
    pub(crate) reads: AtomicU64,
    /// Whether an idle handler may spin now.
    pub(crate) spin_gate: SpinGate,
    /// The handler threads started with the manager (slots `0..base`); standby readers have
    /// the slots after them.
    pub(crate) base: usize,
    /// Handler threads reading the userfaultfd now: the base ones and the standby readers
    /// woken to stand in for them ([`blocking_io`]).
    pub(crate) readers: AtomicU32,
    /// Fault-serving handler threads waiting for a device read now.
    pub(crate) io_blocked: AtomicU32,
    /// Standby readers to start (0 where the base handlers are `MAX_IO_READERS` already).
    pub(crate) standby: usize,
    /// Standby readers started so far: none until a device read can wait (the first kswapd
    /// wake with a swap device whose reads wait, a file opened; [`start_standby_readers`]).
    pub(crate) standby_running: AtomicUsize,
    /// Whether [`start_standby_readers`] ran.
    pub(crate) standby_started: AtomicBool,
    /// The standby readers' threads, joined when the manager goes.
    pub(crate) standby_threads: crate::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Wake tokens for standby readers, and their waitqueue.
    pub(crate) standby_wake: crate::sync::Mutex<u32>,
    pub(crate) standby_cv: crate::sync::Condvar,
    /// Faults parked on pages under read I/O.
    pub(crate) io_waiters: IoWaiters,
}

/// A fault parked on a page under read I/O: its address and flags, when it was first parked
/// (the watchdog's view) and when last (the idle handlers' fallback).
#[derive(Debug, Clone, Copy)]
struct Parked {
    addr: usize,
    flags: u64,
    first: Instant,
    at: Instant,
}

/// Faults parked on pages under read I/O (module doc). Whoever unlocks pages it read calls
/// [`serve_io_waiters`]; a handler with nothing else to do serves the ones parked longer than
/// [`IO_PARK_FALLBACK`], so a fault parked on a page that some other path unlocks (a buffered
/// write's new page) is served all the same.
#[derive(Debug, Default)]
pub(crate) struct IoWaiters {
    list: crate::sync::Mutex<Vec<Parked>>,
    /// `list.len()`, read without the lock.
    len: AtomicUsize,
}

impl IoWaiters {
    /// Whether any fault is parked.
    pub(crate) fn any(&self) -> bool {
        self.len.load(Ordering::Acquire) > 0
    }
}

/// A parked fault older than this is served by an idle handler (the fallback above).
pub const IO_PARK_FALLBACK: Duration = Duration::from_millis(2);

/// Whether page `f` is no longer under read I/O (a parked fault on it can be served).
fn io_done(m: &MmInner, f: Pfn) -> bool {
    let p = &m.node.pages[f];
    p.test(crate::mm::page::pg::UPTODATE) || !p.test(crate::mm::page::pg::LOCKED)
}

/// If the fault just served on this thread was parked on a page under read I/O
/// ([`take_parked`]), parks it and returns true; otherwise false (it is deferred as before).
fn parked(m: &MmInner, msg: &Msg) -> bool {
    let Some(f) = take_parked() else {
        return false;
    };
    let now = Instant::now();
    let p = Parked {
        addr: msg.fault_address(),
        flags: msg.fault_flags(),
        first: now,
        at: now,
    };
    m.vm.inc(Item::FaultIoParked);
    park_all(m, vec![(p, Some(f))]);
    true
}

/// Parks faults, each with the page it waits on if known. If a page's read completed
/// meanwhile (its completer may have looked for waiters before the fault was parked), the
/// parked faults are served here.
fn park_all(m: &MmInner, faults: Vec<(Parked, Option<Pfn>)>) {
    let w = &m.handlers.io_waiters;
    let pages: Vec<Pfn> = faults.iter().filter_map(|&(_, f)| f).collect();
    {
        let mut l = w.list.lock();
        l.extend(faults.into_iter().map(|(p, _)| p));
        w.len.store(l.len(), Ordering::Release);
    }
    // Against the completer's fence (filemap.rs): it stores the page's flags, then looks for
    // parked faults; this stored the faults, now looks at the flags. One of the two sees the
    // other.
    crate::sync::fence(Ordering::SeqCst);
    if pages.into_iter().any(|f| io_done(m, f)) {
        serve_io_waiters(m);
    }
}

/// Serves the parked faults (all of them, or with `older_than` those parked at least that
/// long). Called by whoever unlocks pages it read, right after: the faults whose page is up
/// to date now are mapped on this thread; the others are parked again.
pub(crate) fn serve_io_waiters(m: &MmInner) {
    serve_parked(m, None);
}

fn serve_parked(m: &MmInner, older_than: Option<Duration>) {
    let w = &m.handlers.io_waiters;
    if !w.any() {
        return;
    }
    let taken: Vec<Parked> = {
        let mut l = w.list.lock();
        let taken = match older_than {
            None => std::mem::take(&mut *l),
            Some(d) => {
                let (old, young): (Vec<Parked>, Vec<Parked>) =
                    l.drain(..).partition(|p| p.at.elapsed() >= d);
                *l = young;
                old
            }
        };
        w.len.store(l.len(), Ordering::Release);
        taken
    };
    if taken.is_empty() {
        return;
    }
    let was = set_may_park(true);
    let was_replaying = super::page_state::set_replaying(true);
    let mut again = Vec::new();
    for p in taken {
        match catch_retry(m, p.addr, p.flags) {
            Fault::Done => m.vm.inc(Item::FaultIoServed),
            Fault::Retry => again.push((
                Parked {
                    at: Instant::now(),
                    ..p
                },
                take_parked(),
            )),
        }
    }
    super::page_state::set_replaying(was_replaying);
    set_may_park(was);
    if !again.is_empty() {
        park_all(m, again);
    }
}

/// The most handler threads that read the userfaultfd at once counting the standby readers
/// woken while others wait for device reads: the queue depth synchronous reads can reach (this
/// disk does 7.7k 4 KiB reads a second at depth 1 and 60k at 32). 16 measured no better than 8
/// with 8 faulting threads.
pub const MAX_IO_READERS: usize = 8;

/// How long a standby reader with nothing to read keeps reading before it sleeps again.
pub const STANDBY_LINGER: Duration = Duration::from_millis(5);

thread_local! {
    /// Whether this thread is a handler thread (its device reads count in `io_blocked`).
    static IS_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A handler thread's wait for a device read ([`blocking_io`]); ends when dropped.
#[must_use]
pub(crate) struct BlockingIo<'a>(Option<&'a HandlerState>);

impl Drop for BlockingIo<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.io_blocked.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Called by a thread about to wait for a read from a device that `blocks` (a swap file, the
/// network, a mapped file's disk). On a handler thread, the wait is counted; when every reading handler is waiting
/// for a device, nobody reads the userfaultfd, so the faults of the program's other threads
/// would queue behind reads at depth 1-2: a standby reader is woken to read in its place (as
/// Go hands a blocked thread's processor to another). Random usemem on a swap file (8 tasks,
/// 64 MiB): 19.1-19.9 s with the two handlers alone, 12.3-13.5 s with standby readers (the
/// kernel: 9.9-10.7 s); eight handlers always reading did 11.1 s but would wake eight threads
/// per fault for a single-threaded program.
pub(crate) fn blocking_io(m: &MmInner, blocks: bool) -> BlockingIo<'_> {
    let h = &m.handlers;
    let standby = h.standby_running.load(Ordering::Acquire);
    if !blocks || standby == 0 || !IS_HANDLER.with(std::cell::Cell::get) {
        return BlockingIo(None);
    }
    let blocked = h.io_blocked.fetch_add(1, Ordering::AcqRel) + 1;
    if blocked >= h.readers.load(Ordering::Acquire) {
        let mut tokens = h.standby_wake.lock();
        // Standby readers reading now (every base handler counts among the readers).
        let active = (h.readers.load(Ordering::Acquire) as usize).saturating_sub(h.base);
        if active + (*tokens as usize) < standby {
            *tokens += 1;
            h.standby_cv.notify_one();
            m.vm.inc(Item::HandlerStandbyWake);
        }
    }
    BlockingIo(Some(h))
}

/// Starts the standby readers, once. Called where a device read may first wait, never on a
/// fault handler (a thread started there can deadlock under `usermm run`: `RaQueue::pop`,
/// readahead.rs): by kswapd at its first wake when the swap device's reads wait (a swap-in
/// follows a swap-out, and kswapd wakes before any reclaim), and when a file is opened or
/// mapped. A process that never reads from a device that waits (most of a build's short
/// processes, every process on RAM swap) never starts them: six threads fewer to create and
/// join per process.
pub(crate) fn start_standby_readers(m: &Arc<MmInner>) {
    let h = &m.handlers;
    if h.standby == 0 || h.standby_started.swap(true, Ordering::AcqRel) {
        return;
    }
    for k in 0..h.standby {
        if h.shutdown.load(Ordering::Acquire) {
            return;
        }
        let me = m.clone();
        let slot = h.base + k;
        match super::spawn_thread(format!("usermm-io{k}"), move || standby_main(me, slot)) {
            Ok(t) => {
                h.standby_threads.lock().push(t);
                h.standby_running.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => {
                log::error!("starting standby reader {k} of {}: {e}", h.standby);
                return;
            }
        }
    }
}

/// A standby reader: sleeps until [`blocking_io`] wakes it, then reads and serves faults as a
/// handler does until the userfaultfd has none left to read, and sleeps again.
pub fn standby_main(m: Arc<MmInner>, slot: usize) {
    let h = &m.handlers;
    loop {
        {
            let mut tokens = h.standby_wake.lock();
            while *tokens == 0 {
                if h.shutdown.load(Ordering::Acquire) {
                    return;
                }
                tokens = h.standby_cv.wait_for(tokens, Duration::from_millis(100));
            }
            *tokens -= 1;
        }
        if h.shutdown.load(Ordering::Acquire) {
            return;
        }
        h.readers.fetch_add(1, Ordering::AcqRel);
        handler_run(&m, slot, true);
        h.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a CPU is free for an idle handler to spin on: `/proc/loadavg`'s fourth field counts
/// the threads runnable on the whole machine at the moment of the read (the reading handler
/// among them; at most one handler spins, and it is the one asking), the test is that count
/// against the CPUs this process may use. Reading it costs about 0.5 us, against a 50 us spin;
/// a handler asks again at most every [`SPIN_GATE_TTL`]. Where the file cannot be read, the
/// gate stays open (spinning as before).
#[derive(Debug)]
pub struct SpinGate {
    loadavg: Option<std::fs::File>,
    cpus: usize,
}

/// How long a handler trusts its last [`SpinGate`] answer.
pub const SPIN_GATE_TTL: Duration = Duration::from_millis(1);

impl SpinGate {
    /// The gate for a process that may use `cpus` CPUs.
    pub fn new(cpus: usize) -> SpinGate {
        SpinGate::reading("/proc/loadavg", cpus)
    }

    /// The gate reading its count from `path` (a `/proc/loadavg`-format file).
    pub fn reading(path: impl AsRef<std::path::Path>, cpus: usize) -> SpinGate {
        SpinGate {
            loadavg: std::fs::File::open(path).ok(),
            cpus: cpus.max(1),
        }
    }

    /// True while no more threads are runnable than there are CPUs (the asking handler counted).
    pub fn idle_cpu(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.loadavg else {
            return true;
        };
        let mut buf = [0u8; 128];
        match f.read_at(&mut buf, 0) {
            Ok(n) => runnable_threads(&buf[..n]).is_none_or(|r| r <= self.cpus),
            Err(_) => true,
        }
    }
}

/// The runnable-thread count of a `/proc/loadavg` text ("0.42 1.94 2.39 3/345 6474": 3).
pub fn runnable_threads(text: &[u8]) -> Option<usize> {
    let field = text.split(|b| b.is_ascii_whitespace()).nth(3)?;
    let running = field.split(|&b| b == b'/').next()?;
    std::str::from_utf8(running).ok()?.parse().ok()
}

impl HandlerState {
    /// `handlers` base threads, `standby` standby readers.
    pub(crate) fn new(
        shutdown_efd: EventFd,
        handlers: usize,
        standby: usize,
        cpus: usize,
    ) -> HandlerState {
        HandlerState {
            shutdown: AtomicBool::new(false),
            shutdown_efd,
            spinners: AtomicU32::new(0),
            refaults: RefaultTrack::default(),
            slots: (0..handlers + standby + SELF_SLOTS)
                .map(|_| HandlerSlot::default())
                .collect(),
            epoch: Instant::now(),
            stuck_after_ms: AtomicU64::new(STUCK_FAULT_AFTER.as_millis().sat_u64()),
            reads: AtomicU64::new(0),
            spin_gate: SpinGate::new(cpus),
            base: handlers,
            readers: AtomicU32::new(crate::conv::Narrow::u32(handlers)),
            io_blocked: AtomicU32::new(0),
            standby,
            standby_running: AtomicUsize::new(0),
            standby_started: AtomicBool::new(false),
            standby_threads: crate::sync::Mutex::new(Vec::new()),
            standby_wake: crate::sync::Mutex::new(0),
            standby_cv: crate::sync::Condvar::new(),
            io_waiters: IoWaiters::default(),
        }
    }
}

/// Consecutive faults of one thread at one page that trip the wire. A thread faults again at the
/// page it just faulted on only when its page was taken again before it could use it (reclaim
/// unmapping it at once, a few times at most) or when the answer did not map it.
pub const REFAULT_TRIP: u32 = 16;

const TRACK_SLOTS: usize = 64;

/// Per thread (hashed by thread id), the last faulting page and how many faults in a row hit it.
/// Approximate by design (two threads may share a slot and reset each other's count): it only
/// has to notice a thread stuck on one address, never to account exactly.
#[derive(Debug)]
pub struct RefaultTrack {
    /// page number << 20 | thread id's low 20 bits
    key: [crate::sync::AtomicU64; TRACK_SLOTS],
    count: [AtomicU32; TRACK_SLOTS],
}

impl Default for RefaultTrack {
    fn default() -> Self {
        RefaultTrack {
            key: std::array::from_fn(|_| crate::sync::AtomicU64::new(u64::MAX)),
            count: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl RefaultTrack {
    /// Records a fault of thread `tid` at `addr`; returns how many faults in a row this thread
    /// has taken at this page (1 for a new page).
    pub fn note(&self, tid: u32, addr: usize) -> u32 {
        let slot = tid as usize % TRACK_SLOTS;
        let key = ((addr as u64 >> 12) << 20) | (tid as u64 & 0xf_ffff);
        if self.key[slot].swap(key, Ordering::Relaxed) == key {
            self.count[slot].fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.count[slot].store(1, Ordering::Relaxed);
            1
        }
    }

    /// Forgets thread `tid`'s run (after the tripwire fired).
    pub fn reset(&self, tid: u32) {
        self.count[tid as usize % TRACK_SLOTS].store(0, Ordering::Relaxed);
    }
}

/// Serves one fault of thread `tid` at `addr` (uffd fault `flags`), through the tripwire.
fn serve(m: &MmInner, addr: usize, flags: u64, tid: u32) -> Fault {
    inject::maybe_panic(addr);
    let n = m.handlers.refaults.note(tid, addr);
    if n >= REFAULT_TRIP {
        m.handlers.refaults.reset(tid);
        return resolve_from_scratch(m, addr, flags, n);
    }
    handle_fault(m, addr, flags)
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// [`serve`] behind a panic guard: a handler that panics never leaves the faulting thread
/// asleep. The fault is served once more (the entries' locks were released by unwinding); a
/// second panic poisons the page, so the toucher gets SIGBUS instead of waiting forever. Both
/// are logged and counted (`handler_panic`), and [`Mm::health`](super::Mm::health) reports them.
pub(crate) fn serve_guarded(m: &MmInner, addr: usize, flags: u64, tid: u32) -> Fault {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let p = match catch_unwind(AssertUnwindSafe(|| serve(m, addr, flags, tid))) {
        Ok(f) => return f,
        Err(p) => p,
    };
    m.vm.inc(Item::HandlerPanic);
    log::error!(
        "fault handler panicked serving {addr:#x}: {}; serving it again",
        panic_text(&*p)
    );
    match catch_unwind(AssertUnwindSafe(|| {
        inject::maybe_panic(addr);
        handle_fault(m, addr, flags)
    })) {
        Ok(f) => f,
        Err(p) => {
            m.vm.inc(Item::HandlerPanic);
            log::error!(
                "fault handler panicked again at {addr:#x}: {}; the page is poisoned (SIGBUS)",
                panic_text(&*p)
            );
            poison_after_panic(m, addr);
            Fault::Done
        }
    }
}

/// Test hooks: make the fault handlers panic, die or stop reading (tests/health.rs).
#[doc(hidden)]
pub mod inject {
    use std::sync::atomic::{AtomicU64, Ordering};

    static PANICS: AtomicU64 = AtomicU64::new(0);

    /// The next `n` faults served by any handler panic (process-wide).
    #[cfg(any(test, feature = "testing"))]
    pub fn handler_panics(n: u64) {
        PANICS.store(n, Ordering::SeqCst);
    }

    static DEATHS: AtomicU64 = AtomicU64::new(0);
    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static PAUSE_UNTIL: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

    /// The next `n` batches of faults read by any handler kill that handler thread (a panic
    /// outside the panic guard, after reading and before answering them).
    #[cfg(any(test, feature = "testing"))]
    pub fn handler_deaths(n: u64) {
        DEATHS.store(n, Ordering::SeqCst);
    }

    /// Every handler stops reading the userfaultfd for `ms` milliseconds from its next pass
    /// (a wedged handler; 0 ends it).
    #[cfg(any(test, feature = "testing"))]
    pub fn handler_pause(ms: u64) {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        *PAUSE_UNTIL.lock().unwrap_or_else(|e| e.into_inner()) = (ms > 0).then_some(until);
        PAUSED.store(ms > 0, Ordering::SeqCst);
    }

    /// Test builds only (the `testing` feature, which the CLI's tests build it with):
    /// `USERMM_TEST_INJECT_HANDLER_PAUSE_MS=N` wedges every handler for N ms from the moment a
    /// manager is created ([`handler_pause`]), so a test can stall faults in another process
    /// (`usermm bench soak`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn from_env() {
        if let Some(ms) = std::env::var("USERMM_TEST_INJECT_HANDLER_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            log::warn!("failure injected by a test: every fault handler stops reading for {ms} ms");
            handler_pause(ms);
        }
    }

    pub(super) fn maybe_die(n: usize) {
        if take(&DEATHS) {
            panic!("injected death of a fault handler holding {n} faults");
        }
    }

    pub(super) fn maybe_pause() {
        if !PAUSED.load(Ordering::Relaxed) {
            return;
        }
        let until = *PAUSE_UNTIL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = until {
            std::thread::sleep(t.saturating_duration_since(std::time::Instant::now()));
        }
    }

    fn take(c: &AtomicU64) -> bool {
        c.load(Ordering::Relaxed) > 0
            && c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }

    pub(super) fn maybe_panic(addr: usize) {
        if take(&PANICS) {
            panic!("injected handler panic at {addr:#x}");
        }
    }
}

/// What each handler is doing, for the watchdog: the fault it is serving and the oldest fault
/// it has deferred, each with the time (ns since the manager started) it began. 0: none.
#[derive(Debug, Default)]
pub struct HandlerSlot {
    busy_since: AtomicU64,
    busy_addr: AtomicUsize,
    deferred_since: AtomicU64,
    deferred_addr: AtomicUsize,
}

/// Watchdog slots for faults served on the faulting thread (`fault_path=sigbus`, mm/fault.rs),
/// after the handler threads' slots, shared by thread id modulo their number: a thread whose
/// fault is deferred behind a locked page records it in its slot, so the watchdog sees it.
pub const SELF_SLOTS: usize = 16;

impl HandlerSlot {
    /// Records a deferred fault at `addr` (fault_path=sigbus: the faulting thread's own slot).
    pub(crate) fn defer(&self, h: &HandlerState, addr: usize) {
        self.deferred_addr.store(addr, Ordering::Relaxed);
        self.deferred_since.store(since(h), Ordering::Release);
    }

    /// The deferred fault of this slot was served.
    pub(crate) fn clear_deferred(&self) {
        self.deferred_since.store(0, Ordering::Release);
    }
}

/// Faults outstanding longer than this are reported by the watchdog (log, `fault_stuck`,
/// [`Mm::health`](super::Mm::health)).
pub const STUCK_FAULT_AFTER: Duration = Duration::from_secs(10);

/// A fault that has waited longer than the threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckFault {
    /// The faulting address.
    pub addr: usize,
    /// How long it has been outstanding.
    pub waited: Duration,
    /// Whether a handler is inside it (true) or it is deferred behind a locked page or parked
    /// on one under read I/O (false).
    pub in_handler: bool,
}

fn since(h: &HandlerState) -> u64 {
    h.epoch.elapsed().as_nanos().sat_u64().max(1)
}

/// The faults outstanding longer than `after` (handler slots and parked faults; see
/// [`watchdog_main`]).
pub fn stuck_faults(h: &HandlerState, after: Duration) -> Vec<StuckFault> {
    let now = since(h);
    let mut v = Vec::new();
    for s in h.slots.iter() {
        for (t, a, in_handler) in [
            (&s.busy_since, &s.busy_addr, true),
            (&s.deferred_since, &s.deferred_addr, false),
        ] {
            let t0 = t.load(Ordering::Acquire);
            if t0 != 0 && now.saturating_sub(t0) > after.as_nanos().sat_u64() {
                v.push(StuckFault {
                    addr: a.load(Ordering::Relaxed),
                    waited: Duration::from_nanos(now - t0),
                    in_handler,
                });
            }
        }
    }
    let waiters = h.io_waiters.list.lock();
    for p in waiters.iter() {
        let waited = p.first.elapsed();
        if waited > after {
            v.push(StuckFault {
                addr: p.addr,
                waited,
                in_handler: false,
            });
        }
    }
    v
}

/// The watchdog thread: twice a second, reports each fault outstanding longer than the
/// manager's threshold once (log line with the page's state, `fault_stuck`), and checks that
/// the handlers read the userfaultfd at all: if it has stayed readable for the threshold while
/// no handler read a message (every handler wedged or dead), the faults waiting there are
/// invisible to the handler slots, so the watchdog reads them, logs each address with its
/// page's state, and serves them itself (`fault_unread`).
pub fn watchdog_main(m: Arc<MmInner>) {
    let mut reported: Vec<usize> = Vec::new();
    let mut last_reads = u64::MAX;
    let mut unread_since: Option<Instant> = None;
    while !m.handlers.shutdown.load(Ordering::Acquire) {
        for _ in 0..5 {
            if m.handlers.shutdown.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let after = Duration::from_millis(m.handlers.stuck_after_ms.load(Ordering::Relaxed));
        let stuck = stuck_faults(&m.handlers, after);
        for s in &stuck {
            if !reported.contains(&s.addr) {
                m.vm.inc(Item::FaultStuck);
                log::error!(
                    "a fault has been outstanding for {:.1} s ({}): {}",
                    s.waited.as_secs_f64(),
                    if s.in_handler {
                        "a handler is inside it"
                    } else {
                        "deferred behind a locked page, or parked on one under read I/O"
                    },
                    super::memory::describe_page(&m, s.addr)
                );
            }
        }
        reported = stuck.iter().map(|s| s.addr).collect();

        let reads = m.handlers.reads.load(Ordering::Relaxed);
        let readable = matches!(m.mm.uffd.poll(None, 0), Ok((true, _)));
        if readable && reads == last_reads {
            let t0 = *unread_since.get_or_insert_with(Instant::now);
            if t0.elapsed() + Duration::from_millis(500) >= after {
                serve_unread(&m, t0.elapsed() + Duration::from_millis(500));
                unread_since = None;
            }
        } else {
            unread_since = None;
        }
        last_reads = reads;
    }
}

/// The watchdog's rescue of faults no handler reads: each is logged with its address and
/// page, counted (`fault_unread`) and served; one that must wait (its page locked) is woken, so
/// its thread faults again.
fn serve_unread(m: &MmInner, waited: Duration) {
    let mut msgs = [Msg::default(); 32];
    loop {
        let n = match m.mm.uffd.read_msgs(&mut msgs) {
            Ok(n) => n,
            Err(e) => {
                log::error!("watchdog reading userfaultfd: {e}");
                0
            }
        };
        if n == 0 {
            return;
        }
        for msg in &msgs[..n] {
            if msg.event != event::PAGEFAULT {
                continue;
            }
            let addr = msg.fault_address();
            m.vm.inc(Item::FaultUnread);
            log::error!(
                "a fault has waited unread for at least {:.1} s while no handler read the \
                 userfaultfd; the watchdog serves it: {}",
                waited.as_secs_f64(),
                super::memory::describe_page(m, addr)
            );
            if serve_guarded(m, addr, msg.fault_flags(), msg.fault_tid()) == Fault::Retry {
                let page = addr & !(crate::sys::PAGE_SIZE - 1);
                m.vm.warn_on(m.mm.uffd.wake(page, crate::sys::PAGE_SIZE), "UFFDIO_WAKE");
            }
        }
    }
}

/// What a handler thread has read from the userfaultfd and not answered yet: the current
/// batch from `next` on, and its deferred faults. If the thread dies they are woken.
struct Held {
    msgs: [Msg; 32],
    n: usize,
    next: usize,
    deferred: Vec<(Msg, u64)>,
    /// This thread is the one spinner (`HandlerState::spinners`).
    spinning: bool,
}

/// A handler thread: [`handler_loop`] until shutdown. A panic that escapes the per-fault guard
/// (a usermm bug outside serving a fault, or `inject::handler_deaths`) would leave every fault
/// the thread had read asleep for ever; instead they are woken (their threads fault again and
/// a live handler, or this one, serves them), the death is logged and counted
/// (`handler_died`, [`Mm::health`](super::Mm::health)), and the thread starts over.
pub fn handler_main(m: Arc<MmInner>, slot: usize) {
    handler_run(&m, slot, false);
}

/// [`handler_main`]'s body; a standby reader (`standby`) returns when it finds nothing to read.
fn handler_run(m: &Arc<MmInner>, slot: usize, standby: bool) {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    IS_HANDLER.with(|h| h.set(true));
    set_may_park(true);
    super::mpage::enable_on_this_thread();
    let mut held = Held {
        msgs: [Msg::default(); 32],
        n: 0,
        next: 0,
        deferred: Vec::new(),
        spinning: false,
    };
    loop {
        let p = match catch_unwind(AssertUnwindSafe(|| {
            handler_loop(m, slot, &mut held, standby)
        })) {
            Ok(()) => return,
            Err(p) => p,
        };
        m.vm.inc(Item::HandlerDied);
        let mut woken: Vec<usize> = held.msgs[held.next.min(held.n)..held.n]
            .iter()
            .chain(held.deferred.iter().map(|(msg, _)| msg))
            .filter(|msg| msg.event == event::PAGEFAULT)
            .map(|msg| msg.fault_address() & !(crate::sys::PAGE_SIZE - 1))
            .collect();
        woken.sort_unstable();
        woken.dedup();
        log::error!(
            "fault handler {slot} died: {}; waking the {} faults it held ({}) and starting over",
            panic_text(&*p),
            woken.len(),
            woken
                .iter()
                .map(|a| format!("{a:#x}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for &a in &woken {
            m.vm.warn_on(m.mm.uffd.wake(a, crate::sys::PAGE_SIZE), "UFFDIO_WAKE");
        }
        (held.n, held.next) = (0, 0);
        held.deferred.clear();
        if std::mem::take(&mut held.spinning) {
            m.handlers.spinners.store(0, Ordering::Release);
        }
        let me = &m.handlers.slots[slot];
        me.busy_since.store(0, Ordering::Release);
        me.deferred_since.store(0, Ordering::Release);
    }
}

fn handler_loop(m: &MmInner, slot: usize, held: &mut Held, standby: bool) {
    let me = &m.handlers.slots[slot];
    let serve_one = |msg: &Msg| -> Fault {
        me.busy_addr.store(msg.fault_address(), Ordering::Relaxed);
        me.busy_since.store(since(&m.handlers), Ordering::Release);
        let f = serve_guarded(m, msg.fault_address(), msg.fault_flags(), msg.fault_tid());
        me.busy_since.store(0, Ordering::Release);
        f
    };
    let spin = Duration::from_micros(m.cfg.handler_spin_us as u64);
    let mut last_work = Instant::now();
    // The last SpinGate answer and when it was asked.
    let mut gate: Option<(Instant, bool)> = None;
    let publish_deferred = |d: &[(Msg, u64)]| match d.iter().min_by_key(|e| e.1) {
        Some((msg, t)) => {
            me.deferred_addr
                .store(msg.fault_address(), Ordering::Relaxed);
            me.deferred_since.store(*t, Ordering::Release);
        }
        None => me.deferred_since.store(0, Ordering::Release),
    };
    loop {
        if m.handlers.shutdown.load(Ordering::Acquire) {
            // This thread's page reads in flight end (their faults served) before it goes.
            super::mpage::drain(m);
            return;
        }
        // Page reads this thread put in flight (mpage.rs) that ended: their faults served.
        if super::mpage::ready() && super::mpage::reap(m, false) > 0 {
            last_work = Instant::now();
        }
        inject::maybe_pause();
        let batch = read_batch(m, held.msgs.len());
        let n = match m.mm.uffd.read_msgs(&mut held.msgs[..batch]) {
            Ok(n) => n,
            Err(e) => {
                log::error!("reading userfaultfd: {e}");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        (held.n, held.next) = (n, 0);
        if n > 0 {
            m.handlers.reads.fetch_add(1, Ordering::Relaxed);
            inject::maybe_die(n);
        }
        while held.next < held.n {
            let msg = held.msgs[held.next];
            match msg.event {
                event::PAGEFAULT => {
                    let t = since(&m.handlers);
                    if serve_one(&msg) == Fault::Retry && !parked(m, &msg) {
                        held.deferred.push((msg, t));
                    }
                }
                other => log::debug!("userfaultfd event {other:#x} ignored"),
            }
            held.next += 1;
        }
        if n > 0 {
            publish_deferred(&held.deferred);
            last_work = Instant::now();
            continue;
        }
        // Faults parked on read I/O longer than the readers take: served here.
        serve_parked(m, Some(IO_PARK_FALLBACK));
        if !held.deferred.is_empty() {
            let before = held.deferred.len();
            held.deferred.retain(|(msg, _)| {
                let f = catch_retry(m, msg.fault_address(), msg.fault_flags());
                f == Fault::Retry && !parked(m, msg)
            });
            publish_deferred(&held.deferred);
            if held.deferred.len() < before {
                last_work = Instant::now();
            } else {
                // Pages still under I/O: wait a little for new messages instead of spinning.
                poll_uffd(m, 1);
            }
            continue;
        }
        if standby {
            // Nothing to read: linger a little (waking a standby reader costs a cross-CPU
            // wakeup), then back to standby; the base handlers spin and sleep.
            if last_work.elapsed() >= STANDBY_LINGER && super::mpage::in_flight() == 0 {
                return;
            }
            poll_uffd(m, 1);
            continue;
        }
        let may_spin = last_work.elapsed() < spin
            && match gate {
                Some((at, open)) if at.elapsed() < SPIN_GATE_TTL => open,
                _ => {
                    let open = m.handlers.spin_gate.idle_cpu();
                    gate = Some((Instant::now(), open));
                    if !open {
                        m.vm.inc(Item::HandlerSpinSkipped);
                    }
                    open
                }
            };
        if may_spin
            && m.handlers
                .spinners
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // Spin (as the only spinner) until a message arrives or the window closes.
            held.spinning = true;
            let mut hit = false;
            while last_work.elapsed() < spin {
                match m.mm.uffd.read_msgs(&mut held.msgs[..1]) {
                    Ok(1) => {
                        hit = true;
                        (held.n, held.next) = (1, 0);
                        m.handlers.reads.fetch_add(1, Ordering::Relaxed);
                        m.vm.inc(Item::HandlerSpinHit);
                        let t = since(&m.handlers);
                        let msg = held.msgs[0];
                        if msg.event == event::PAGEFAULT
                            && serve_one(&msg) == Fault::Retry
                            && !parked(m, &msg)
                        {
                            held.deferred.push((msg, t));
                            publish_deferred(&held.deferred);
                        }
                        held.next = 1;
                        break;
                    }
                    _ if super::mpage::ready() => break,
                    _ => std::hint::spin_loop(),
                }
            }
            m.handlers.spinners.store(0, Ordering::Release);
            held.spinning = false;
            if hit {
                last_work = Instant::now();
            }
            continue;
        }
        m.vm.inc(Item::HandlerWakeup);
        // With faults parked, wake for the fallback in time.
        poll_uffd(m, if m.handlers.io_waiters.any() { 2 } else { 100 });
        last_work = Instant::now() - spin;
    }
}

/// How many messages a handler takes from the userfaultfd at once: all that are there (up to
/// `max`), except where a fault may wait for a device read (the standby readers are running:
/// a file is open, or the swap device's reads wait). There it takes one: the faults a handler
/// holds are served one after another, so a batch of faults that each read from the device
/// would be read at queue depth 1 while the other readers find nothing to read. One at a time,
/// each reader that blocks on its read leaves the next fault to the next reader
/// ([`blocking_io`] wakes a standby one when all are blocked), and the reads are in flight
/// together. `bench mmap-file --pattern randread --threads 4 --size 2G --budget 256M`:
/// 25.7-26.7k -> 27.2-29.1k pages/s, CPU 6.5-6.7 -> 5.9-6.0 s; random usemem on a swap file
/// (8 tasks, 64M): 11.6-12.0 -> 11.2 s; 4-thread seqread 1462-1534 -> 1707-1863 MiB/s.
fn read_batch(m: &MmInner, max: usize) -> usize {
    if m.handlers.standby_running.load(Ordering::Relaxed) > 0 {
        1
    } else {
        max
    }
}

/// Waits up to `ms` milliseconds for the userfaultfd to have messages (or for shutdown, or
/// for the end of a page read this thread put in flight: mpage.rs).
fn poll_uffd(m: &MmInner, ms: i32) {
    let efd = m.handlers.shutdown_efd.raw_fd();
    let res = match super::mpage::poll_fd() {
        Some(ring) => m.mm.uffd.poll_with(&[efd, ring], ms).map(|_| ()),
        None => m.mm.uffd.poll(Some(efd), ms).map(|_| ()),
    };
    m.vm.warn_on(res, "poll of the userfaultfd");
}

/// A deferred fault served again (behind the same panic guard, without the tripwire: the thread
/// has not faulted again, it is still waiting for this answer).
pub(crate) fn catch_retry(m: &MmInner, addr: usize, flags: u64) -> Fault {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    match catch_unwind(AssertUnwindSafe(|| handle_fault(m, addr, flags))) {
        Ok(f) => f,
        Err(p) => {
            m.vm.inc(Item::HandlerPanic);
            log::error!(
                "fault handler panicked serving deferred {addr:#x}: {}; the page is poisoned (SIGBUS)",
                panic_text(&*p)
            );
            poison_after_panic(m, addr);
            Fault::Done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_threads_reads_the_fourth_field() {
        assert_eq!(runnable_threads(b"0.42 1.94 2.39 3/345 6474\n"), Some(3));
        assert_eq!(runnable_threads(b"0.00 0.01 0.05 12/1024 99"), Some(12));
        assert_eq!(runnable_threads(b"0.42 1.94 2.39"), None);
        assert_eq!(runnable_threads(b"0.42 1.94 2.39 x/345 6474"), None);
        assert_eq!(runnable_threads(b""), None);
    }

    #[test]
    fn spin_gate_closes_when_runnable_threads_fill_the_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let busy = dir.path().join("busy");
        std::fs::write(&busy, "1.0 1.0 1.0 3/200 77\n").unwrap();
        assert!(!SpinGate::reading(&busy, 2).idle_cpu());
        assert!(SpinGate::reading(&busy, 3).idle_cpu());
        assert!(SpinGate::reading(&busy, 4).idle_cpu());
        let garbled = dir.path().join("garbled");
        std::fs::write(&garbled, "no numbers here").unwrap();
        assert!(
            SpinGate::reading(&garbled, 1).idle_cpu(),
            "unparsable: spin as before"
        );
        assert!(SpinGate::reading(dir.path().join("missing"), 1).idle_cpu());
        // The real file: this test's own thread is runnable, so at least one thread is counted.
        let text = std::fs::read("/proc/loadavg").unwrap();
        assert!(runnable_threads(&text).is_some_and(|r| r >= 1), "{text:?}");
    }
}
