//! The preload library of `usermm run` (`libusermm_preload.so`, loaded with LD_PRELOAD): it
//! serves an unmodified program's whole heap and every private anonymous mapping from a usermm
//! manager inside the process. Mirrors glibc's malloc interposition contract (`malloc/malloc.c`:
//! a replacement must provide malloc, free, calloc, realloc and the aligned variants) and the
//! system calls of `mm/mmap.c`, `mm/mremap.c`, `mm/mprotect.c`, `mm/madvise.c`.
//!
//! What is intercepted, and why:
//! * the malloc family: served by mimalloc (linked in, `libmimalloc-sys`), whose arenas it
//!   obtains through this library's own `mmap` — so they are usermm regions (64 MiB arenas,
//!   `MAP_NORESERVE`: charged to nothing until touched), and its purges (`MADV_DONTNEED`) free
//!   usermm pages and swap. glibc's malloc is unreachable from the program (it stays the heap
//!   of usermm itself and of anything allocated before initialisation); `free` and `realloc`
//!   tell the two apart by mimalloc's page map (`mi_is_in_heap_region`);
//! * mmap/mmap64 of MAP_PRIVATE|MAP_ANONYMOUS read-write memory above the threshold (default
//!   0: all of it), and munmap, mremap, mprotect, madvise, mlock on the ranges served
//!   (everything else is passed to the kernel with a raw system call; see
//!   `docs/c-and-run.md` for the exact list);
//! * pthread_create, to mark usermm's own threads; sbrk/brk, passed on and counted;
//! * `_exit`, `_Exit` and `daemon`: a process leaving hands its fork children the swapped
//!   pages they share with it first (below).
//!
//! Recursion: usermm's own mappings (frame pool, region views, bounce buffers, the RAM swap
//! device) are made by code inside this library through the same `mmap` symbol, and glibc's
//! internals call `malloc` while usermm runs. Such calls are recognised by a thread-local
//! depth counter (set while this library runs usermm code on an application thread) or by the
//! calling thread being one of usermm's (marked by the `pthread_create` wrapper when created
//! from usermm code; for mmap also by its `usermm-` name), and go to glibc's allocator and
//! straight to the kernel; private anonymous ones are marked MADV_DONTFORK. Rust's own heap
//! (this library's global allocator) calls glibc's `__libc_malloc` directly. So mimalloc never
//! re-enters itself, and no usermm thread ever touches memory usermm manages.
//!
//! fork: no resident page of a managed range is shared with a child (the kernel cannot move
//! pages shared copy-on-write, and the child has no fault handler): managed ranges are
//! MADV_WIPEONFORK (the child has them mapped, zero-filled, so glibc's own fork code may touch
//! the `FILE`s and other heap objects in them before any atfork handler runs) and usermm's
//! internal mappings MADV_DONTFORK. The parent's forking thread streams the resident pages of
//! every managed range to the child over a socket pair (pthread_atfork handlers), copied from
//! the view or the frame pool without faulting (`Mm::copy_for_fork`); the child maps them at
//! the same addresses, forgets the parent's manager, and its own manager adopts them
//! (`Mm::adopt_anon`) when the copy is 8 MiB or more. Swapped-out pages (of the heap's arenas
//! as of any large mapping) are not read at all: they are shared by swap slot, as Linux's fork
//! shares them (`Mm::share_swapped_for_fork`, `swap_duplicate`), except the few the child
//! reads before its manager runs (stdio, locale, environment, the dynamic linker's link maps),
//! and the child's manager reads each from the parent over the same socket when it first
//! touches it (`usermm::swap::inherit`). Until that manager runs, the shared pages are
//! PROT_NONE and a SIGSEGV handler open for that window only reads a touched one from the
//! parent (`sys::early_fetch_open`, `fork_fetched_early_pages`): whatever else the child's
//! start-up reads on its heap costs a round trip, never a crash or zeros.
//! A parent that exits (exit, `_exit`) first hands its children the pages they still share,
//! in a file; one killed outright cannot, and a child touching such a page then dies of
//! SIGBUS with a message. exec: the manager disappears with the old image (and the socket,
//! close-on-exec, with it); LD_PRELOAD is inherited, so the new program gets its own manager.
//!
//! Statistics: at exit (a `.fini_array` destructor) the library appends one JSON line about
//! this process to the file named by `USERMM_RUN_STATS` (set by `usermm run`).

// The exported functions are libc's, taking C pointers by contract; each dereference carries a
// SAFETY comment.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use usermm::{Mm, Region};
use usermm_vma::{classify_mmap, Coverage, Kind, MmapRequest, Space, PAGE};

mod sys;

use sys::{errno, set_errno};

/// std's mutex without poisoning. Not parking_lot's: its process-wide parking table would give
/// a fork(2) child the queue entries of the parent's threads parked at that moment, which the
/// child's new threads (on the dead threads' cached stacks) corrupt; a child then hangs on its
/// first contended lock.
struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    const fn new(t: T) -> Self {
        Mutex(std::sync::Mutex::new(t))
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    /// The guard if nobody holds the lock now (poisoned or not), else None.
    fn try_lock(&self) -> Option<std::sync::MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// The locks the forking thread holds across fork(2): MANAGER's guard and the address
/// space's table lock, from fork_prepare until fork_parent / fork_child, which run on that
/// same thread. (Not a thread-local: registering its destructor allocates, inside fork's
/// prepare handler, with MANAGER held.)
struct ForkHolds {
    manager: Option<std::sync::MutexGuard<'static, Option<Mm>>>,
    space: Option<usermm_vma::ForkHold>,
}

// SAFETY: the guards are taken by fork_prepare and released by fork_parent or fork_child, all
// pthread_atfork handlers of one fork(2) call, which glibc runs on the forking thread; a guard
// is never used or dropped on another thread, which is all MutexGuard's !Send protects.
unsafe impl Send for ForkHolds {}

static FORK_HOLDS: Mutex<ForkHolds> = Mutex::new(ForkHolds {
    manager: None,
    space: None,
});

/// Default threshold: every anonymous mapping is served.
pub const DEFAULT_THRESHOLD: usize = 0;

/// 0: not initialised (everything goes to glibc / the kernel), 1: active, 2: disabled (the
/// manager could not be created: everything goes to glibc / the kernel).
static STATE: AtomicU8 = AtomicU8::new(0);
static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
static SPACE: Space = Space::new();
static MANAGER: Mutex<Option<Mm>> = Mutex::new(None);
static MANAGER_ERROR: Mutex<Option<String>> = Mutex::new(None);
static FORKED: AtomicBool = AtomicBool::new(false);
static SWAP_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// Per-process counters reported at exit.
static N_HEAP_ENOMEM: AtomicU64 = AtomicU64::new(0);
static N_BRK: AtomicU64 = AtomicU64::new(0);
static N_FORK_COPY: AtomicU64 = AtomicU64::new(0);
/// Bytes of fork copies this process sent through the fork socket because
/// `process_vm_writev` into the child was refused (all of its children).
static N_FORK_STREAMED: AtomicU64 = AtomicU64::new(0);
/// Pages a fork child shared with its parent and read before its manager ran.
static N_FORK_FETCHED_EARLY: AtomicU64 = AtomicU64::new(0);
/// Bytes of the fork copy this child's manager adopted (the rest stayed kernel memory).
static N_FORK_ADOPTED: AtomicU64 = AtomicU64::new(0);
/// Bytes of swapped-out memory shared with fork children by slot instead of copied (parent).
static N_FORK_SHARED: AtomicU64 = AtomicU64::new(0);
/// Bytes of the parent's swapped-out memory this child received by slot (read when touched).
static N_FORK_INHERITED: AtomicU64 = AtomicU64::new(0);
/// Sockets between a parent and its fork children that share swap slots, with their inodes:
/// a later fork child closes its copies (a sibling or grandchild holding one would keep a
/// child waiting for a parent that is gone, or a parent holding slots for a child that is).
static FORK_SOCKETS: Mutex<Vec<(c_int, u64)>> = Mutex::new(Vec::new());
/// The link a fork child's manager is made with (set by fork_child, taken by `manager`).
static INHERIT: Mutex<Option<std::sync::Arc<usermm::swap::InheritLink>>> = Mutex::new(None);
static N_MMAP: AtomicU64 = AtomicU64::new(0);
static N_MREMAP_MOVED: AtomicU64 = AtomicU64::new(0);
static N_ENOMEM: AtomicU64 = AtomicU64::new(0);
static N_REFUSED: AtomicU64 = AtomicU64::new(0);
static MAPPED: AtomicU64 = AtomicU64::new(0);
static PEAK_MAPPED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// How deep this thread is inside this library's usermm-calling code.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// 2 once this thread is known to be one of usermm's own threads.
    static INTERNAL: Cell<u8> = const { Cell::new(0) };
}

/// Marks the calling thread as running usermm code until dropped.
struct Guard;

impl Guard {
    fn enter() -> Guard {
        DEPTH.with(|d| d.set(d.get() + 1));
        Guard
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// True when a call comes from usermm itself (see the module documentation): two thread-local
/// reads, cheap enough for every malloc.
fn is_internal() -> bool {
    DEPTH.with(|d| d.get()) > 0 || INTERNAL.with(|i| i.get()) == 2
}

/// [`is_internal`], also recognising a usermm thread by its name (a system call; only for
/// mmap): a thread usermm created outside this library's [`Guard`] is still never served.
fn is_internal_mmap() -> bool {
    if is_internal() {
        return true;
    }
    if sys::thread_name_starts_with(b"usermm-") {
        INTERNAL.with(|i| i.set(2));
        return true;
    }
    false
}

fn active() -> bool {
    STATE.load(Ordering::Acquire) == 1
}

fn threshold() -> usize {
    THRESHOLD.load(Ordering::Relaxed)
}

fn note_mapped(delta: i64) {
    let now = if delta >= 0 {
        MAPPED.fetch_add(delta as u64, Ordering::Relaxed) + delta as u64
    } else {
        MAPPED.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed) - delta.unsigned_abs()
    };
    PEAK_MAPPED.fetch_max(now, Ordering::Relaxed);
}

fn warn(msg: &str) {
    sys::write_stderr(&format!("usermm-preload[{}]: {msg}\n", std::process::id()));
}

/// usermm's errors (a failed swap read that poisons a page, a lost page, ...) on stderr, as
/// the program's SIGBUS would otherwise come with no word; the first 32 of a process.
struct ErrorLog;

static N_LOGGED: AtomicU64 = AtomicU64::new(0);

impl log::Log for ErrorLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Error
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) && N_LOGGED.fetch_add(1, Ordering::Relaxed) < 32 {
            warn(&r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static ERROR_LOG: ErrorLog = ErrorLog;

/// The manager of this process, created on first use from the environment with full-mode
/// userfaultfd (system calls such as read(2) into managed buffers must fault pages in). If it
/// cannot be created the library disables itself: the program runs on the kernel's memory and
/// the reason is reported on stderr and in the statistics.
fn manager() -> Option<Mm> {
    let mut g = MANAGER.lock();
    if let Some(m) = g.as_ref() {
        return Some(m.clone());
    }
    if STATE.load(Ordering::Acquire) != 1 {
        return None;
    }
    let _guard = Guard::enter();
    // One way to make a process's default manager (Mm::from_env), shared with the C ABI and
    // Python: USERMM_SWAP=file:PATH reaches every process of the program (children, exec'd
    // programs); the first manager holds PATH, the others swap to a temporary file.
    let inherit = INHERIT.lock().take();
    let made = refuse_self_served()
        .and_then(|()| refuse_test_child())
        .and_then(|()| Mm::from_env_inheriting(inherit))
        .map(|e| {
            *SWAP_NOTE.lock() = e.swap_note;
            e.mm
        });
    match made {
        Ok(m) => {
            *g = Some(m.clone());
            Some(m)
        }
        Err(e) => {
            let msg = format!("cannot create the usermm manager ({e}); the program's memory stays with the kernel");
            warn(&msg);
            *MANAGER_ERROR.lock() = Some(msg);
            STATE.store(2, Ordering::Release);
            None
        }
    }
}

/// Test hooks for the fork paths a root test cannot otherwise reach (`tests/run.rs`):
/// `USERMM_TEST_FORK_NO_VM_WRITE=1` makes the parent behave as if `process_vm_writev` into the
/// child were refused (ptrace rules), so the copy streams through the socket;
/// `USERMM_TEST_FORK_CHILD_UNMANAGED=1` makes a fork child's manager fail to start, so the
/// child reads the pages it shares with the parent at once, into kernel memory.
fn test_hook(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// A fork child's manager refused by `USERMM_TEST_FORK_CHILD_UNMANAGED` ([`test_hook`]).
fn refuse_test_child() -> usermm::Result<()> {
    if FORKED.load(Ordering::Relaxed) && test_hook("USERMM_TEST_FORK_CHILD_UNMANAGED") {
        return Err(usermm::Error::from(usermm::ConfigError::Unsupported {
            what: "a manager in this fork child".into(),
            why: "USERMM_TEST_FORK_CHILD_UNMANAGED=1 (a test hook) is set".into(),
        }));
    }
    Ok(())
}

/// `fault_path=sigbus` cannot serve a program whose heap is managed: a fault may interrupt
/// malloc, and the fault path allocates. `usermm run` refuses it up front; this catches a
/// USERMM_SET given by hand.
fn refuse_self_served() -> usermm::Result<()> {
    let set = std::env::var("USERMM_SET").unwrap_or_default();
    match usermm::Settings::parse(&set) {
        Ok(s) if s.is_new(usermm::Switch::FaultPath) => {
            Err(usermm::Error::from(usermm::ConfigError::Unsupported {
                what: "USERMM_SET=fault_path=sigbus under usermm run".into(),
                why: "the program's heap is managed memory and a fault may interrupt malloc; \
                      use fault_path=handler"
                    .into(),
            }))
        }
        _ => Ok(()),
    }
}

/// Why a request was not served by usermm.
enum Refusal {
    /// usermm is not serving (not active, or the manager could not be created): use glibc or
    /// the kernel.
    Fallback,
    /// The commit limit (budget + swap) refuses it: the caller fails with ENOMEM.
    NoMemory,
}

/// Maps a managed region of at least `len` bytes; `noreserve` (MAP_NORESERVE: the heap's
/// arenas) is not charged to the commit limit.
fn map_region(len: usize, noreserve: bool) -> Result<usize, Refusal> {
    let mm = manager().ok_or(Refusal::Fallback)?;
    let _guard = Guard::enter();
    let total = usermm_vma::page_round_up(len).ok_or(Refusal::NoMemory)?;
    // A MAP_NORESERVE request bigger than an arena and than everything this manager can ever
    // hold (budget + swap) is one huge allocation that can never be used whole: refused up
    // front unless overcommit is allowed, as the kernel's heuristic mode refuses an obvious
    // overcommit (`__vm_enough_memory`, OVERCOMMIT_GUESS). mimalloc maps huge objects
    // MAP_NORESERVE, so without this `malloc(64 GiB)` would succeed and die of SIGBUS later.
    // Arena reservations and segments (at most an arena) are never refused here: mimalloc
    // needs them to run at all under a small limit.
    if noreserve && total > HEAP_ARENA && !mm.config().overcommit {
        let (_, limit) = mm.commit();
        if total as u64 > limit {
            count_refused_mapping();
            return Err(Refusal::NoMemory);
        }
    }
    let made = if noreserve {
        mm.map_anon_noreserve(total)
    } else {
        mm.map_anon(total)
    };
    let r = match made {
        Ok(r) => r,
        Err(usermm::Error::CommitLimit { .. }) => {
            count_refused_mapping();
            return Err(Refusal::NoMemory);
        }
        Err(e) => {
            warn(&format!("mapping {total} bytes failed: {e}"));
            count_refused_mapping();
            return Err(Refusal::NoMemory);
        }
    };
    sys::wipeonfork(r.as_ptr() as usize, r.len());
    let start = r.as_ptr() as usize;
    note_mapped(r.len() as i64);
    N_MMAP.fetch_add(1, Ordering::Relaxed);
    SPACE.insert(r, Kind::Mmap);
    Ok(start)
}

/// Drops regions that lost their last live page (outside the space's lock).
fn release(regions: Vec<std::sync::Arc<Region>>) {
    let _guard = Guard::enter();
    for r in regions {
        note_mapped(-(r.len() as i64));
        drop(r);
    }
}

/// Runs `f`, turning a panic into `default` (nothing unwinds into C).
fn ffi<T>(default: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            warn("internal error (panic caught at the C boundary); please report it");
            default
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The malloc family: mimalloc, whose memory is managed (see the module documentation).

/// True when this call must not use mimalloc: the library is not serving (before
/// initialisation, or the manager could not be created) or the caller is usermm itself, whose
/// own heap is glibc's (a usermm thread must never fault on memory it manages).
fn use_glibc() -> bool {
    !active() || is_internal() || IN_THREAD_CREATE.with(Cell::get)
}

thread_local! {
    /// Set while this thread is in glibc's `pthread_create` for the program: the new thread's
    /// DTV (the array `__tls_get_addr` reads on every thread-local access of a shared library,
    /// usermm's included) is allocated there with calloc, and must stay out of managed memory.
    /// Managed, it could be swapped out, and usermm code on that thread touching a
    /// thread-local while it holds a lock (a vmstat counter under the LRU lock in the
    /// program's madvise) would fault on it with nobody free to serve the fault.
    static IN_THREAD_CREATE: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread is inside mimalloc: the mappings it asks for are its own (arenas,
    /// segments, huge objects), and a refusal of one is counted once, as the program's NULL.
    static IN_HEAP: Cell<bool> = const { Cell::new(false) };
}

/// Counts a refused mapping, unless mimalloc asked for it (its NULL is counted instead).
fn count_refused_mapping() {
    if !IN_HEAP.with(Cell::get) {
        N_ENOMEM.fetch_add(1, Ordering::Relaxed);
    }
}

/// mimalloc's answer to `f`, with errno ENOMEM on NULL (mimalloc sets it too; this keeps it
/// when a nested call changed it) and counted.
fn heap_result(f: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let was = IN_HEAP.with(|h| h.replace(true));
    let p = f();
    IN_HEAP.with(|h| h.set(was));
    if p.is_null() {
        N_HEAP_ENOMEM.fetch_add(1, Ordering::Relaxed);
        set_errno(libc::ENOMEM);
    }
    p
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    if use_glibc() {
        return sys::libc_malloc(size);
    }
    heap_result(|| sys::mi_malloc(size))
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, m: usize) -> *mut c_void {
    if use_glibc() {
        return sys::libc_calloc(n, m);
    }
    if n.checked_mul(m).is_none() {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    heap_result(|| sys::mi_calloc(n, m))
}

#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // Ownership decides, not the caller: a block allocated before initialisation (or by
    // usermm itself) is glibc's wherever it is freed.
    if sys::mi_owns(p) {
        sys::mi_free(p)
    } else {
        sys::libc_free(p)
    }
}

/// Usable size of a live block of either allocator.
fn usable_size(p: *mut c_void) -> usize {
    if sys::mi_owns(p) {
        sys::mi_usable_size(p)
    } else {
        sys::libc_usable_size(p).unwrap_or(0)
    }
}

/// Moves a block to a new one from `alloc`, copying what fits; frees the old one on success.
fn move_block(p: *mut c_void, n: usize, alloc: impl FnOnce(usize) -> *mut c_void) -> *mut c_void {
    let old = usable_size(p);
    let q = alloc(n);
    if q.is_null() {
        return q;
    }
    // SAFETY: p is a live block of `old` usable bytes, q a fresh block of at least n bytes;
    // distinct live blocks never overlap.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(n)) };
    free(p);
    q
}

#[no_mangle]
pub extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(n);
    }
    if n == 0 {
        free(p);
        return std::ptr::null_mut();
    }
    match (sys::mi_owns(p), use_glibc()) {
        (true, false) => heap_result(|| sys::mi_realloc(p, n)),
        // usermm itself reallocating a block of the program's heap (never expected): keep
        // mimalloc away from internal callers.
        (true, true) => move_block(p, n, sys::libc_malloc),
        // A block from before initialisation moves to the managed heap.
        (false, false) => move_block(p, n, |n| heap_result(|| sys::mi_malloc(n))),
        (false, true) => sys::libc_realloc(p, n),
    }
}

#[no_mangle]
pub extern "C" fn reallocarray(p: *mut c_void, n: usize, m: usize) -> *mut c_void {
    match n.checked_mul(m) {
        Some(size) => realloc(p, size),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// `size` bytes aligned to `align` (a power of two).
fn aligned(align: usize, size: usize) -> *mut c_void {
    if use_glibc() {
        return sys::libc_memalign(align, size);
    }
    heap_result(|| sys::mi_malloc_aligned(align, size))
}

#[no_mangle]
pub extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let saved = errno();
    let p = aligned(align, size);
    if p.is_null() {
        set_errno(saved);
        return libc::ENOMEM;
    }
    // SAFETY: out is non-NULL and points to the caller's pointer variable.
    unsafe { out.write(p) };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size)
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(align.max(1).next_power_of_two(), size)
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE, size)
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match usermm_vma::page_round_up(size.max(1)) {
        Some(s) => aligned(PAGE, s),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    usable_size(p)
}

// ---------------------------------------------------------------------------------------------
// Threads and the program break.

/// Threads created while usermm code runs (the manager's handler and reclaim threads) are
/// marked internal from their first instruction: their own small mappings (Rust's signal
/// stack, ...) and glibc-internal allocations must stay with the kernel and glibc.
#[no_mangle]
pub extern "C" fn pthread_create(
    t: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let mark: Option<fn()> = if is_internal() {
        Some(|| INTERNAL.with(|i| i.set(2)))
    } else {
        None
    };
    // The program's thread: its DTV from glibc's heap (IN_THREAD_CREATE); only the
    // allocations change, not the mappings (its stack stays an ordinary one, forked along).
    let was = IN_THREAD_CREATE.with(|c| c.replace(true));
    let r = sys::pthread_create(t, attr, start, arg, mark);
    IN_THREAD_CREATE.with(|c| c.set(was));
    r
}

/// sbrk(2) by the program itself (glibc's malloc, which would use it, is unreachable): passed
/// to the kernel and counted, as memory usermm does not manage.
#[no_mangle]
pub extern "C" fn sbrk(incr: isize) -> *mut c_void {
    let p = sys::libc_sbrk(incr);
    if incr > 0 && p as isize != -1 && active() && !is_internal() {
        N_BRK.fetch_add(incr as u64, Ordering::Relaxed);
    }
    p
}

/// brk(2) by the program itself: passed to the kernel and counted (see [`sbrk`]).
#[no_mangle]
pub extern "C" fn brk(addr: *mut c_void) -> c_int {
    let before = sys::libc_sbrk(0) as usize;
    let r = sys::libc_brk(addr);
    if r == 0 && active() && !is_internal() && (addr as usize) > before {
        N_BRK.fetch_add((addr as usize - before) as u64, Ordering::Relaxed);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// The mmap family.

fn mmap_impl(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    let internal = is_internal_mmap();
    if !active() || internal {
        let p = sys::raw_mmap(addr, len, prot, flags, fd, off);
        if p != libc::MAP_FAILED
            && flags & libc::MAP_ANONYMOUS != 0
            && flags & 0x03 == libc::MAP_PRIVATE
            && internal
        {
            sys::dontfork(p as usize, len);
        }
        return p;
    }
    let is_fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    let a = addr as usize;
    let overlaps =
        is_fixed && SPACE.might_overlap(a, len) && SPACE.coverage(a, len) != Coverage::None;
    match classify_mmap(a, len, prot, flags, fd, off) {
        MmapRequest::Anon { len, fixed: None } if len > threshold() => {
            match ffi(Err(Refusal::NoMemory), || {
                map_region(len, flags & libc::MAP_NORESERVE != 0)
            }) {
                Ok(p) => p as *mut c_void,
                Err(Refusal::Fallback) => sys::raw_mmap(addr, len, prot, flags, fd, off),
                Err(Refusal::NoMemory) => {
                    set_errno(libc::ENOMEM);
                    libc::MAP_FAILED
                }
            }
        }
        MmapRequest::Anon {
            len,
            fixed: Some((a, noreplace)),
        } if overlaps => {
            if noreplace {
                set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            // Fresh zero-filled memory over every piece: managed pieces in place, the others
            // from the kernel.
            for s in SPACE.segments(a, len) {
                if s.managed {
                    let _guard = Guard::enter();
                    if !ffi(false, || SPACE.map_fixed(s.addr, s.len)) {
                        set_errno(libc::ENOMEM);
                        return libc::MAP_FAILED;
                    }
                } else {
                    let p = sys::raw_mmap(s.addr as *mut c_void, s.len, prot, flags, -1, 0);
                    if p == libc::MAP_FAILED {
                        return p;
                    }
                }
            }
            a as *mut c_void
        }
        _ if overlaps => {
            // MAP_FIXED of something usermm does not serve (a file, shared memory, another
            // protection) over managed memory: the kernel would replace part of a region behind
            // the manager's back. Refused.
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(if flags & libc::MAP_FIXED_NOREPLACE != 0 {
                libc::EEXIST
            } else {
                libc::EINVAL
            });
            libc::MAP_FAILED
        }
        _ => sys::raw_mmap(addr, len, prot, flags, fd, off),
    }
}

#[no_mangle]
pub extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    ffi(libc::MAP_FAILED, || {
        mmap_impl(addr, len, prot, flags, fd, off)
    })
}

#[no_mangle]
pub extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off64_t,
) -> *mut c_void {
    ffi(libc::MAP_FAILED, || {
        mmap_impl(addr, len, prot, flags, fd, off)
    })
}

fn managed_segments(addr: *mut c_void, len: usize) -> Option<Vec<usermm_vma::Segment>> {
    let a = addr as usize;
    if !active()
        || is_internal()
        || !a.is_multiple_of(PAGE)
        || len == 0
        || !SPACE.might_overlap(a, len)
    {
        return None;
    }
    let len = usermm_vma::page_round_up(len)?;
    a.checked_add(len)?;
    let segs = SPACE.segments(a, len);
    segs.iter().any(|s| s.managed).then_some(segs)
}

#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    ffi(-1, || {
        let Some(segs) = managed_segments(addr, len) else {
            return sys::raw_munmap(addr, len);
        };
        for s in segs {
            if s.managed {
                let gone = {
                    let _guard = Guard::enter();
                    SPACE.unmap(s.addr, s.len)
                };
                release(gone);
            } else if sys::raw_munmap(s.addr as *mut c_void, s.len) != 0 {
                return -1;
            }
        }
        0
    })
}

fn mremap_managed(
    v: usermm_vma::VmaInfo,
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: c_int,
) -> *mut c_void {
    let fail = |e: c_int| {
        set_errno(e);
        libc::MAP_FAILED
    };
    if flags & !(libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
        return fail(libc::EINVAL);
    }
    if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
        // Not served on managed memory (documented): usermm cannot place a region at a given
        // address, nor keep an emptied one.
        N_REFUSED.fetch_add(1, Ordering::Relaxed);
        return fail(libc::EINVAL);
    }
    if old_len == 0 || new_len == 0 {
        return fail(libc::EINVAL);
    }
    let (Some(ro), Some(rn)) = (
        usermm_vma::page_round_up(old_len),
        usermm_vma::page_round_up(new_len),
    ) else {
        return fail(libc::EINVAL);
    };
    if old + ro > v.start + v.len || !SPACE.all_live(old, ro) {
        return fail(libc::EFAULT);
    }
    if rn <= ro {
        if rn < ro {
            let gone = {
                let _guard = Guard::enter();
                SPACE.unmap(old + rn, ro - rn)
            };
            release(gone);
        }
        return old as *mut c_void;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        // A region cannot grow in place.
        return fail(libc::ENOMEM);
    }
    let new = match map_region(rn, false) {
        Ok(p) => p,
        Err(_) => return fail(libc::ENOMEM),
    };
    // SAFETY: [old, old+ro) is live managed memory of the caller's mapping and [new, new+rn) a
    // fresh region; distinct regions never overlap. Raw copy: no slices over managed memory.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, ro) };
    let gone = {
        let _guard = Guard::enter();
        SPACE.unmap(old, ro)
    };
    release(gone);
    N_MREMAP_MOVED.fetch_add(1, Ordering::Relaxed);
    new as *mut c_void
}

/// mremap(2). glibc declares it variadic; the optional fifth argument (new_address, read only
/// with MREMAP_FIXED) arrives in the same register as a named fifth argument on x86-64 and
/// arm64 Linux, so a fixed five-argument signature is ABI-compatible.
#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    ffi(libc::MAP_FAILED, || {
        let a = old as usize;
        let fixed = flags & libc::MREMAP_FIXED != 0;
        if !active() || is_internal() {
            return sys::raw_mremap(old, old_len, new_len, flags, new_addr);
        }
        if fixed
            && SPACE.might_overlap(new_addr as usize, new_len)
            && SPACE.coverage(new_addr as usize, new_len) != Coverage::None
        {
            // The kernel would unmap managed memory at the target.
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        match SPACE.find(a) {
            Some(v) => mremap_managed(v, a, old_len, new_len, flags),
            None => sys::raw_mremap(old, old_len, new_len, flags, new_addr),
        }
    })
}

#[no_mangle]
pub extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    ffi(-1, || {
        let Some(segs) = managed_segments(addr, len) else {
            return sys::raw_mprotect(addr, len, prot);
        };
        if prot != libc::PROT_READ | libc::PROT_WRITE {
            // Managed memory stays read-write: UFFDIO_MOVE needs the region and the frame pool
            // to have the same protection (documented).
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(libc::EACCES);
            return -1;
        }
        for s in segs.iter().filter(|s| !s.managed) {
            if sys::raw_mprotect(s.addr as *mut c_void, s.len, prot) != 0 {
                return -1;
            }
        }
        0
    })
}

#[no_mangle]
pub extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    ffi(-1, || {
        let Some(segs) = managed_segments(addr, len) else {
            return sys::raw_madvise(addr, len, advice);
        };
        const MADV_COLD: c_int = 20;
        const MADV_PAGEOUT: c_int = 21;
        const MADV_POPULATE_READ: c_int = 22;
        const MADV_POPULATE_WRITE: c_int = 23;
        const MADV_COLLAPSE: c_int = 25;
        let discard = matches!(advice, libc::MADV_DONTNEED | libc::MADV_FREE);
        let hint = matches!(
            advice,
            libc::MADV_NORMAL
                | libc::MADV_RANDOM
                | libc::MADV_SEQUENTIAL
                | libc::MADV_WILLNEED
                | libc::MADV_HUGEPAGE
                | libc::MADV_NOHUGEPAGE
                | libc::MADV_DONTDUMP
                | libc::MADV_DODUMP
                | libc::MADV_MERGEABLE
                | libc::MADV_UNMERGEABLE
                | libc::MADV_DONTFORK
                | libc::MADV_DOFORK
                | libc::MADV_WIPEONFORK
                | libc::MADV_KEEPONFORK
                | MADV_COLD
                | MADV_PAGEOUT
                | MADV_POPULATE_READ
                | MADV_POPULATE_WRITE
                | MADV_COLLAPSE
        );
        if !discard && !hint {
            // MADV_REMOVE, MADV_HWPOISON, ... on managed memory.
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(libc::EINVAL);
            return -1;
        }
        for s in segs {
            if !s.managed {
                if sys::raw_madvise(s.addr as *mut c_void, s.len, advice) != 0 {
                    return -1;
                }
            } else if discard {
                let _guard = Guard::enter();
                SPACE.discard(s.addr, s.len);
            }
            // Hints on managed memory change nothing: usermm decides residency, THP stays off
            // and managed memory is never inherited by fork.
        }
        0
    })
}

/// mlock/mlock2 on managed memory fail with EAGAIN (documented): usermm decides what is
/// resident; other ranges go to the kernel.
#[no_mangle]
pub extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    ffi(-1, || {
        let a = (addr as usize) & !(PAGE - 1);
        let l = len + (addr as usize - a);
        if managed_segments(a as *mut c_void, l).is_some() {
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(libc::EAGAIN);
            return -1;
        }
        sys::raw_mlock(addr, len)
    })
}

#[no_mangle]
pub extern "C" fn mlock2(addr: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    ffi(-1, || {
        let a = (addr as usize) & !(PAGE - 1);
        let l = len + (addr as usize - a);
        if managed_segments(a as *mut c_void, l).is_some() {
            N_REFUSED.fetch_add(1, Ordering::Relaxed);
            set_errno(libc::EAGAIN);
            return -1;
        }
        sys::raw_mlock2(addr, len, flags)
    })
}

/// mlockall would lock usermm's regions and frame pool (and, with MCL_FUTURE, every later
/// mapping): refused with EAGAIN while the library is active (documented).
#[no_mangle]
pub extern "C" fn mlockall(flags: c_int) -> c_int {
    if active() && !is_internal() {
        N_REFUSED.fetch_add(1, Ordering::Relaxed);
        set_errno(libc::EAGAIN);
        return -1;
    }
    sys::raw_mlockall(flags)
}

// ---------------------------------------------------------------------------------------------
// Process life cycle: initialisation, fork, exit statistics.

/// What the parent hands a fork(2) child: the managed ranges (mapped afresh in the child) and
/// the populated parts of them, streamed over a socket pair.
struct ForkCopy {
    ranges: Vec<usermm_vma::ForkRange>,
    runs: Vec<(usize, usize)>,
    /// Pages of managed ranges holding stdio streams, shared with the child copy-on-write
    /// (sorted): glibc's fork writes their locks in the child before the child handler runs.
    kept: Vec<usize>,
    /// (parent's end, child's end)
    fds: Option<(c_int, c_int)>,
    /// The swapped pages shared with the child by slot instead of copied: per range (its
    /// start), (page index, parent's slot) in page order (`Mm::share_swapped_for_fork`).
    shared: Vec<(usize, Vec<(u64, u64)>)>,
}

static FORK: Mutex<Option<ForkCopy>> = Mutex::new(None);

/// Bytes of the bounce buffer the parent copies managed memory through.
const FORK_CHUNK: usize = 1 << 20;

/// Set in a run header's length: the parent wrote the run into the child's memory itself
/// (`Mm::write_to_fork_child`); no bytes follow.
const FORK_WRITTEN: u64 = 1 << 63;

extern "C" fn fork_prepare() {
    let g = MANAGER.lock();
    let mut holds = FORK_HOLDS.lock();
    holds.manager = Some(g);
    if !active() {
        holds.space = Some(SPACE.fork_prepare());
        return;
    }
    let _guard = Guard::enter();
    let (hold, ranges) = SPACE.fork_prepare_ranges();
    holds.space = Some(hold);
    drop(holds);
    let kept = keep_stdio_for_fork(&ranges);
    let mut runs = Vec::new();
    for fr in &ranges {
        for (off, l) in fr.region.populated_ranges() {
            if off < fr.len {
                runs.push((fr.start + off, l.min(fr.len - off)));
            }
        }
    }
    let fds = if runs.is_empty() {
        None
    } else {
        sys::socketpair()
    };
    if !runs.is_empty() && fds.is_none() {
        warn("fork: no socket pair to copy managed memory to the child; its copy will read zeros");
    }
    // Swapped pages are shared by slot, not read and copied, the heap's arenas' as a large
    // array's; except the pages the child reads before its manager names the shared ones
    // (`noshare_pages`).
    let mut shared = Vec::new();
    let mut skip = kept.clone();
    if let (Some(mm), Some(_)) = (holds_manager(), fds) {
        let loader = sys::loader_objects();
        // Past glibc's first table of TLS modules, the next ones are on the heap too, where
        // this cannot find them: the heap's arenas are then copied whole, as large ranges only
        // share.
        let share_min = if loader.max_tls_modid > TLS_SLOTINFO_FIRST {
            HEAP_ARENA + 1
        } else {
            0
        };
        let noshare = noshare_pages(&ranges, &kept, loader);
        let mut runs_left = FORK_SHARE_MAX_RUNS;
        for fr in ranges.iter().filter(|r| r.len >= share_min) {
            let except: Vec<u64> = noshare
                .iter()
                .filter(|&&a| a >= fr.start && a < fr.start + fr.len)
                .map(|&a| ((a - fr.start) / PAGE) as u64)
                .collect();
            let v = mm.share_swapped_for_fork(&fr.region, fr.len, &except);
            let runs = page_runs(v.iter().map(|&(i, _)| i)).len();
            if runs > runs_left {
                // Each run is one PROT_NONE mapping in the child until its manager names
                // them: past the cap, the range is copied (its shares are given back).
                mm.unshare_swapped_for_fork(v.iter().map(|&(_, s)| s));
                continue;
            }
            runs_left -= runs;
            if !v.is_empty() {
                skip.extend(v.iter().map(|&(i, _)| fr.start + i as usize * PAGE));
                shared.push((fr.start, v));
            }
        }
    }
    skip.sort_unstable();
    skip.dedup();
    let runs = without_pages(&runs, &skip);
    *FORK.lock() = Some(ForkCopy {
        ranges,
        runs,
        kept,
        fds,
        shared,
    });
}

/// TLS modules glibc's first slot-info table holds at least (the modules at start-up plus
/// `TLS_SLOTINFO_SURPLUS`, 62, in elf/dl-tls.c); later tables are malloc'd, on the heap.
const TLS_SLOTINFO_FIRST: usize = 62;

/// The most runs of shared pages one fork protects in the child (one mapping each, until the
/// child's manager names them; `vm.max_map_count` is 65530).
const FORK_SHARE_MAX_RUNS: usize = 8192;

/// Pages of managed ranges that a fork child reads before its manager can serve pages shared
/// with the parent (sorted): the stdio streams (`kept`), the global locale's data (a new
/// thread's start-up reads it), the environment (the new manager reads its settings) and the
/// dynamic linker's objects (`pthread_create` reads those of every object with thread-local
/// storage, and dlopen'ed ones are on the heap). They are copied, never shared.
fn noshare_pages(
    ranges: &[usermm_vma::ForkRange],
    kept: &[usize],
    loader: sys::Loader,
) -> Vec<usize> {
    let mut v = managed_pages(
        ranges,
        sys::locale_objects()
            .into_iter()
            .chain(sys::environ_objects())
            .chain(loader.objects),
    );
    v.extend_from_slice(kept);
    v.sort_unstable();
    v.dedup();
    v
}

/// The pages of managed ranges that the byte ranges `objects` (address, length) lie on,
/// sorted, each once.
fn managed_pages(
    ranges: &[usermm_vma::ForkRange],
    objects: impl IntoIterator<Item = (usize, usize)>,
) -> Vec<usize> {
    let managed = |a: usize| ranges.iter().any(|r| a >= r.start && a < r.start + r.len);
    let mut v = Vec::new();
    for (a, l) in objects {
        let mut p = a & !(PAGE - 1);
        while p < a + l {
            if managed(p) {
                v.push(p);
            }
            p += PAGE;
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Consecutive page indexes as (first, count) runs.
fn page_runs(idx: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in idx {
        match runs.last_mut() {
            Some((s, n)) if *s + *n == i => *n += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

/// The manager, while fork_prepare holds MANAGER (its guard is in FORK_HOLDS).
fn holds_manager() -> Option<Mm> {
    FORK_HOLDS
        .lock()
        .manager
        .as_ref()
        .and_then(|g| g.as_ref().cloned())
}

/// Sends the table of shared pages after the copy: the number of ranges, then per range its
/// start and number of runs, and each run as (first page index, first slot, pages): pages
/// swapped out together have consecutive slots, so a GiB is a few thousand runs.
fn send_shared(fd: c_int, shared: &[(usize, Vec<(u64, u64)>)]) -> bool {
    let n = [shared.len() as u64];
    if !sys::send_all(fd, n.as_ptr() as *const u8, 8) {
        return false;
    }
    for (start, v) in shared {
        let mut runs: Vec<[u64; 3]> = Vec::new();
        for &(i, s) in v {
            match runs.last_mut() {
                Some(r) if r[0] + r[2] == i && r[1] + r[2] == s => r[2] += 1,
                _ => runs.push([i, s, 1]),
            }
        }
        let hdr = [*start as u64, runs.len() as u64];
        if !sys::send_all(fd, hdr.as_ptr() as *const u8, 16)
            || !sys::send_all(fd, runs.as_ptr() as *const u8, runs.len() * 24)
        {
            return false;
        }
    }
    true
}

/// The child's side of [`send_shared`]: per range its start and (page index, inherited slot
/// k) pairs, and the parent's slot of each k.
type SharedTable = (Vec<(usize, Vec<(u64, u64)>)>, Vec<u64>);

fn recv_shared(fd: c_int) -> Option<SharedTable> {
    let mut n = [0u64; 1];
    if !sys::recv_all(fd, n.as_mut_ptr() as *mut u8, 8) {
        return None;
    }
    let mut ranges = Vec::new();
    let mut slots = Vec::new();
    for _ in 0..n[0] {
        let mut hdr = [0u64; 2];
        if !sys::recv_all(fd, hdr.as_mut_ptr() as *mut u8, 16) {
            return None;
        }
        let mut runs = vec![[0u64; 3]; hdr[1] as usize];
        if !sys::recv_all(fd, runs.as_mut_ptr() as *mut u8, runs.len() * 24) {
            return None;
        }
        let mut v = Vec::new();
        for [i, s, n] in runs {
            for x in 0..n {
                v.push((i + x, slots.len() as u64));
                slots.push(s + x);
            }
        }
        ranges.push((hdr[0] as usize, v));
    }
    Some((ranges, slots))
}

/// Remembers a socket shared with a fork child or parent (see FORK_SOCKETS).
fn note_fork_socket(fd: c_int) {
    if let Some(ino) = sys::fd_ino(fd) {
        let mut g = FORK_SOCKETS.lock();
        g.retain(|&(f, i)| sys::fd_ino(f) == Some(i));
        g.push((fd, ino));
    }
}

/// In a fork child: closes its copies of the sockets of the parent's own fork links.
fn close_fork_sockets() {
    for (fd, ino) in std::mem::take(&mut *FORK_SOCKETS.lock()) {
        if sys::fd_ino(fd) == Some(ino) {
            sys::close(fd);
        }
    }
}

/// The pages of managed ranges that hold an open stdio stream or its lock, made resident and
/// MADV_KEEPONFORK: glibc's fork walks every open FILE and resets its lock in the child before
/// any atfork handler runs, so these pages must be there, with their contents, at fork. The
/// child gets them copy-on-write as the kernel snapshots them (with glibc's lock reset kept);
/// every other managed page is copied by [`fork_send`]. [`fork_parent`] makes them
/// MADV_WIPEONFORK again.
fn keep_stdio_for_fork(ranges: &[usermm_vma::ForkRange]) -> Vec<usize> {
    let mut kept = managed_pages(ranges, sys::stdio_objects());
    kept.retain(|&p| {
        sys::touch(p);
        sys::keeponfork(p, PAGE)
    });
    kept
}

/// `runs` (sorted, disjoint byte ranges) without the pages in `kept` (sorted).
fn without_pages(runs: &[(usize, usize)], kept: &[usize]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(runs.len());
    for &(start, len) in runs {
        let mut s = start;
        let end = start + len;
        let first = kept.partition_point(|&p| p + PAGE <= start);
        for &p in kept[first..].iter().take_while(|&&p| p < end) {
            if p > s {
                out.push((s, p - s));
            }
            s = s.max(p + PAGE);
        }
        if s < end {
            out.push((s, end - s));
        }
    }
    out
}

/// Streams the populated managed memory to the child: a header (address, length) per piece
/// (a run, cut at [`FORK_WRITE_PIECE`]), then its bytes, then (0, 0). Pieces written straight
/// into the child's memory ([`write_to_child`]) have only their header sent, marked
/// [`FORK_WRITTEN`]. The others are copied from the view or the frame pool without faulting
/// (`Mm::copy_for_fork`); anything else is read through a fault served by the manager's
/// threads.
fn fork_send(
    fd: c_int,
    runs: &[(usize, usize)],
    ranges: &[usermm_vma::ForkRange],
    mut child: Option<i32>,
) -> u64 {
    // Only for the socket path, and made only when taken: a 1 MiB zeroed buffer from glibc's
    // heap is memset over pages shared copy-on-write with the child just forked, 256 page
    // copies per fork (a third of a small process's fork time).
    let mut buf: Vec<u8> = Vec::new();
    let mut sent = 0u64;
    if test_hook("USERMM_TEST_FORK_NO_VM_WRITE") {
        child = None;
    }
    let Some(mm) = holds_manager() else {
        let end = [0u64, 0u64];
        sys::send_all(fd, end.as_ptr() as *const u8, 16);
        return 0;
    };
    let mut pieces = Vec::new();
    for &(addr, len) in runs {
        let Some(fr) = ranges
            .iter()
            .find(|r| addr >= r.start && addr + len <= r.start + r.len)
        else {
            continue;
        };
        let mut off = 0;
        while off < len {
            let n = FORK_WRITE_PIECE.min(len - off);
            pieces.push((addr + off, n, fr));
            off += n;
        }
    }
    let written = match child {
        Some(pid) => write_to_child(&mm, &pieces, pid),
        None => Vec::new(),
    };
    'pieces: for (i, &(addr, len, fr)) in pieces.iter().enumerate() {
        if written.get(i) == Some(&true) {
            let hdr = [addr as u64, len as u64 | FORK_WRITTEN];
            if !sys::send_all(fd, hdr.as_ptr() as *const u8, 16) {
                break;
            }
            sent += len as u64;
            continue;
        }
        let hdr = [addr as u64, len as u64];
        if !sys::send_all(fd, hdr.as_ptr() as *const u8, 16) {
            break;
        }
        if buf.is_empty() {
            buf = vec![0u8; FORK_CHUNK];
        }
        let mut off = 0;
        while off < len {
            let n = FORK_CHUNK.min(len - off);
            let b = &mut buf[..n];
            if let Err(e) = mm.copy_for_fork(&fr.region, addr + off - fr.start, b) {
                warn(&format!("fork: {e}; the child cannot run"));
                break 'pieces;
            }
            if !sys::send_all(fd, b.as_ptr(), n) {
                break 'pieces;
            }
            off += n;
            sent += n as u64;
            N_FORK_STREAMED.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    let end = [0u64, 0u64];
    sys::send_all(fd, end.as_ptr() as *const u8, 16);
    sent
}

/// The most bytes one piece of the parent's populated memory written into a fork child has:
/// the writers take pieces in turn ([`write_to_child`]).
const FORK_WRITE_PIECE: usize = 2 << 20;

/// From this many bytes to write into a fork child, a second thread writes beside the forking
/// one where the process may run on two CPUs or more (the child waits, its CPU is idle):
/// `process_vm_writev` of 60 MiB into a fork child took 22.4-22.8 ms from one thread and
/// 12.7-18.0 ms from two on this VM. Below it, starting the thread costs more than it saves.
const FORK_WRITE_TWO: usize = 8 << 20;

/// Writes `pieces` (address, length, range) straight into the memory of the fork child `pid`
/// (`Mm::write_to_fork_child`), two writers taking pieces in turn where [`FORK_WRITE_TWO`]
/// says so. Returns per piece whether it was written; after a refusal (the kernel's ptrace
/// rules) nothing more is tried, and the caller sends the rest through the socket.
fn write_to_child(
    mm: &Mm,
    pieces: &[(usize, usize, &usermm_vma::ForkRange)],
    pid: i32,
) -> Vec<bool> {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let next = AtomicUsize::new(0);
    let refused = AtomicBool::new(false);
    let done: Vec<AtomicBool> = pieces.iter().map(|_| AtomicBool::new(false)).collect();
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= pieces.len() || refused.load(Ordering::Relaxed) {
            break;
        }
        let (addr, len, fr) = pieces[i];
        match mm.write_to_fork_child(&fr.region, addr - fr.start, len, pid) {
            Ok(()) => done[i].store(true, Ordering::Relaxed),
            Err(_) => refused.store(true, Ordering::Relaxed),
        }
    };
    let total: usize = pieces.iter().map(|p| p.1).sum();
    if total >= FORK_WRITE_TWO && sys::cpus_allowed() > 1 {
        // The helper is started on this (guarded) thread: marked internal, its allocations
        // go to glibc. If it cannot start, this thread writes everything.
        std::thread::scope(|s| {
            let helper = std::thread::Builder::new()
                .name("usermm-forkw".into())
                .spawn_scoped(s, work);
            work();
            drop(helper);
        });
    } else {
        work();
    }
    done.into_iter().map(AtomicBool::into_inner).collect()
}

extern "C" fn fork_parent() {
    // Runs after glibc released its own locks: the Rust heap (glibc's) is usable here.
    if let Some(fc) = FORK.lock().take() {
        let _guard = Guard::enter();
        if let Some((p, c)) = fc.fds {
            // With the child's end closed here, a failed fork (no child) makes the first send
            // fail at once instead of blocking.
            sys::close(c);
            // The child says who it is once its ranges are mapped (nothing if the fork failed).
            let mut pid = [0u64; 1];
            let child = (!fc.runs.is_empty() && sys::recv_all(p, pid.as_mut_ptr() as *mut u8, 8))
                .then_some(pid[0] as i32);
            let sent = fork_send(p, &fc.runs, &fc.ranges, child);
            N_FORK_COPY.fetch_add(sent, Ordering::Relaxed);
            let ok = send_shared(p, &fc.shared);
            let slots: Vec<u64> = fc
                .shared
                .iter()
                .flat_map(|(_, v)| v.iter().map(|&(_, s)| s))
                .collect();
            let mm = holds_manager();
            match mm {
                Some(mm) if !slots.is_empty() => {
                    // The socket stays open: the child reads the shared pages through it,
                    // and its closing (exit, exec, a failed fork) frees the parent's slots.
                    if ok {
                        N_FORK_SHARED
                            .fetch_add(slots.len() as u64 * PAGE as u64, Ordering::Relaxed);
                    }
                    note_fork_socket(p);
                    let stream = sys::stream_from_fd(p);
                    if let Err(e) = mm.serve_fork_child(stream, slots) {
                        warn(&format!(
                            "fork: {e}; the child cannot read the pages it shares"
                        ));
                    }
                }
                _ => sys::close(p),
            }
        }
        for &pg in &fc.kept {
            sys::wipeonfork(pg, PAGE);
        }
        drop(fc);
    }
    // fork_prepare locked the address space's table and MANAGER on this thread and left the
    // guards in FORK_HOLDS: released in that order.
    let (manager, space) = {
        let mut h = FORK_HOLDS.lock();
        (h.manager.take(), h.space.take())
    };
    if let Some(space) = space {
        SPACE.fork_parent(space);
    }
    drop(manager);
}

/// In the child: maps the parent's managed ranges afresh (kernel memory: the child has no
/// manager of them) and receives their contents; the parent's forking thread waits in
/// [`fork_parent`] until everything is sent, so the copy is what that thread saw at fork.
fn fork_receive(fc: &ForkCopy) -> u64 {
    let whole: Vec<(usize, usize)> = fc.ranges.iter().map(|r| (r.start, r.len)).collect();
    for (start, len) in without_pages(&whole, &fc.kept) {
        let p = sys::raw_mmap(
            start as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        if p != start as *mut c_void {
            warn(&format!(
                "fork: cannot map the parent's memory at {start:#x} ({len} bytes) in the child (errno {})",
                errno()
            ));
            sys::exit_now(127);
        }
        sys::nohugepage(start, len);
    }
    let Some((p, c)) = fc.fds else {
        return 0;
    };
    sys::close(p);
    if !fc.runs.is_empty() {
        let me = [sys::getpid() as u64];
        if !sys::send_all(c, me.as_ptr() as *const u8, 8) {
            warn("fork: the parent is gone before sending its memory; the child cannot run");
            sys::exit_now(127);
        }
    }
    let mut got = 0u64;
    loop {
        let mut hdr = [0u64; 2];
        if !sys::recv_all(c, hdr.as_mut_ptr() as *mut u8, 16) {
            warn("fork: the parent stopped sending its memory; the child cannot run");
            sys::exit_now(127);
        }
        if hdr[1] & FORK_WRITTEN != 0 {
            // Written into this process's memory by the parent.
            got += hdr[1] & !FORK_WRITTEN;
            continue;
        }
        let (addr, len) = (hdr[0] as usize, hdr[1] as usize);
        if len == 0 {
            break;
        }
        if !fc
            .ranges
            .iter()
            .any(|r| addr >= r.start && addr + len <= r.start + r.len)
            || !sys::recv_all(c, addr as *mut u8, len)
        {
            warn("fork: the copy of the parent's memory is incomplete; the child cannot run");
            sys::exit_now(127);
        }
        got += len as u64;
    }
    got
}

/// The smallest fork copy a child's manager adopts. Adopting means creating the manager at the
/// fork (its threads, its swap file: about 5 ms), which a child that execs or exits at once
/// never needed: a bash loop of 200 `$(echo ..)` took 0.39 s before adoption and 1.42 s with
/// every copy adopted (bash's copies are 230 KiB, CPython's 6.6 MiB). A smaller copy stays
/// kernel memory, within the fixed overhead stated for a process.
const FORK_ADOPT_MIN: u64 = 8 << 20;

/// In the child, once the copy is complete and the parent's manager forgotten: this child's
/// own manager (created now, joining the tree's budget group under `usermm run`) adopts each
/// copied range in place (`Mm::adopt_anon`), so the copy is managed memory under the budget
/// like the parent's instead of kernel memory outside it; reclaim swaps out what the budget
/// does not hold. Not before the copy is complete: the manager's new threads run glibc's
/// start-up, which reads objects in the served heap (the locale bash and Python set up), and
/// they are the threads that would serve a fault there. A range that cannot be adopted stays
/// kernel memory, with a warning.
///
/// The pages the parent shared by slot (`shared`, over the socket `link`) are named in the
/// adopted ranges' page tables and read from the parent when touched
/// (`Mm::adopt_anon_inherited`). Where that cannot be done (no manager, a range not adopted),
/// they are read from the parent now, into the kernel memory of the copy.
fn fork_adopt(
    ranges: &[(usize, usize, usermm_vma::Kind, bool)],
    kept: &[usize],
    copied: u64,
    mut shared: Vec<(usize, Vec<(u64, u64)>)>,
    link: Option<(c_int, Vec<u64>)>,
) -> u64 {
    let link = link.filter(|(_, slots)| !slots.is_empty());
    if ranges.is_empty() || !active() || (copied < FORK_ADOPT_MIN && link.is_none()) {
        early_fetch_close(&mut shared);
        if let Some((fd, slots)) = &link {
            fetch_shared(*fd, &shared, slots);
        }
        return 0;
    }
    let mut inherit = None;
    let mut link_fd = -1;
    if let Some((fd, slots)) = &link {
        let dup = sys::dup_cloexec(*fd);
        if dup >= 0 {
            let stream = sys::stream_from_fd(dup);
            let parent = sys::getppid() as u32;
            let l = std::sync::Arc::new(usermm::swap::InheritLink::new(
                parent,
                stream,
                slots.clone(),
            ));
            *INHERIT.lock() = Some(std::sync::Arc::clone(&l));
            inherit = Some(l);
            link_fd = dup;
        }
    }
    let mm = manager();
    // The manager's threads have started: the shared pages read meanwhile are this child's own.
    early_fetch_close(&mut shared);
    *INHERIT.lock() = None;
    let linked = match (&mm, &inherit) {
        (Some(mm), Some(l)) => mm
            .config()
            .inherit
            .as_ref()
            .is_some_and(|x| std::sync::Arc::ptr_eq(x, l)),
        _ => false,
    };
    if linked {
        note_fork_socket(link_fd);
    }
    drop(inherit);
    // The manager's threads have started (reading nothing shared: the locale and the
    // environment were copied); the shared runs become ordinary memory again, to be named
    // by the adoption below or read now.
    for (start, v) in &shared {
        for (i, n) in page_runs(v.iter().map(|&(i, _)| i)) {
            sys::protect_rw(start + i as usize * PAGE, n as usize * PAGE);
        }
    }
    // The stdio pages are shared copy-on-write with the parent; a write makes them this
    // child's own (reclaim cannot move a shared page).
    for &p in kept {
        sys::touch_write(p);
    }
    let Some(mm) = mm else {
        if let Some((fd, slots)) = &link {
            fetch_shared(*fd, &shared, slots);
        }
        return 0;
    };
    let _guard = Guard::enter();
    let mut adopted = 0;
    let mut left: Vec<(usize, Vec<(u64, u64)>)> = Vec::new();
    for &(start, len, kind, noreserve) in ranges {
        let mine = shared
            .iter()
            .find(|(s, _)| *s == start)
            .map(|(_, v)| v.as_slice());
        let r = match mine {
            Some(v) if linked => mm.adopt_anon_inherited(start, len, noreserve, v),
            _ => mm.adopt_anon(start, len, noreserve),
        };
        match r {
            Ok(r) => {
                sys::wipeonfork(start, r.len());
                note_mapped(r.len() as i64);
                adopted += r.len() as u64;
                SPACE.insert(r, kind);
                if let (Some(v), false) = (mine, linked) {
                    left.push((start, v.to_vec()));
                }
            }
            Err(e) => {
                warn(&format!(
                    "fork: this child's manager cannot adopt its copy of {len} bytes at {start:#x} ({e}); they stay kernel memory, outside the budget"
                ));
                if let Some(v) = mine {
                    left.push((start, v.to_vec()));
                }
            }
        }
    }
    if let Some((fd, slots)) = &link {
        // Pages of ranges not adopted are read now, before the program runs (nothing else
        // uses the socket yet); the link keeps its own descriptor.
        if left.is_empty() {
            sys::close(*fd);
        } else {
            fetch_shared(*fd, &left, slots);
        }
    }
    N_FORK_INHERITED.store(
        link.as_ref()
            .map_or(0, |(_, s)| s.len() as u64 * PAGE as u64),
        Ordering::Relaxed,
    );
    adopted
}

/// Ends a fork child's window of shared pages read on first touch (`sys::early_fetch_open`):
/// the pages read meanwhile are left out of `shared` (they are this child's own now; their
/// slots stay held until the child exits or execs) and counted.
fn early_fetch_close(shared: &mut Vec<(usize, Vec<(u64, u64)>)>) {
    let mut got = sys::early_fetch_close();
    if got.is_empty() {
        return;
    }
    got.sort_unstable();
    N_FORK_FETCHED_EARLY.fetch_add(got.len() as u64, Ordering::Relaxed);
    for (start, v) in shared.iter_mut() {
        let start = *start;
        v.retain(|&(i, _)| got.binary_search(&(start + i as usize * PAGE)).is_err());
    }
    shared.retain(|(_, v)| !v.is_empty());
}

/// Reads every page the parent shared by slot into the child's copy now (kernel memory),
/// through the socket `fd`, which it then closes: the fallback where no manager of this child
/// takes them over. A parent that stopped answering leaves the child unable to run: it exits.
fn fetch_shared(fd: c_int, shared: &[(usize, Vec<(u64, u64)>)], slots: &[u64]) {
    use usermm::swap::inherit::{MAX_REQUEST, OP_READ};
    for (start, v) in shared {
        // The whole range: its length is not needed, the pages named are inside it.
        for chunk in v.chunks(MAX_REQUEST) {
            // The wire format of usermm::swap::inherit: [op: u32, n: u32] and n slots.
            let mut req: Vec<u8> = Vec::with_capacity(8 + chunk.len() * 8);
            req.extend_from_slice(&OP_READ.to_ne_bytes());
            req.extend_from_slice(&(chunk.len() as u32).to_ne_bytes());
            for &(_, k) in chunk {
                req.extend_from_slice(&slots[k as usize].to_ne_bytes());
            }
            let mut hdr = [0u32; 2];
            let ok = sys::send_all(fd, req.as_ptr(), req.len())
                && sys::recv_all(fd, hdr.as_mut_ptr() as *mut u8, 8)
                && hdr[0] == 0
                && hdr[1] as usize == chunk.len()
                && chunk.iter().all(|&(i, _)| {
                    let a = start + i as usize * PAGE;
                    sys::protect_rw(a, PAGE);
                    sys::recv_all(fd, a as *mut u8, PAGE)
                });
            if !ok {
                warn("fork: the parent stopped sending the pages it shares with this child; the child cannot run");
                sys::exit_now(127);
            }
        }
    }
    sys::close(fd);
}

extern "C" fn fork_child() {
    // The parent's manager has no threads here and its userfaultfd belongs to the parent's
    // address space: forget it without running any of its code. Managed memory was not
    // inherited (MADV_DONTFORK): the parent sends a copy of it, and shares its swapped pages.
    close_fork_sockets();
    let mut adopt = Vec::new();
    let mut kept = Vec::new();
    let mut shared = Vec::new();
    let mut link = None;
    let got = match FORK.lock().take() {
        Some(fc) => {
            let got = fork_receive(&fc);
            if let Some((_, c)) = fc.fds {
                match recv_shared(c) {
                    Some((table, slots)) if !slots.is_empty() => {
                        // Until the manager names them, the shared pages are holes of kernel
                        // memory: no access may read them as zeros.
                        for (start, v) in &table {
                            for (i, n) in page_runs(v.iter().map(|&(i, _)| i)) {
                                sys::protect_none(start + i as usize * PAGE, n as usize * PAGE);
                            }
                        }
                        // Read on first touch meanwhile: what this child's start-up reads
                        // before its manager runs (beyond the pages the parent kept back).
                        let parent = &slots;
                        let pages = table
                            .iter()
                            .flat_map(|&(start, ref v)| {
                                v.iter().map(move |&(i, k)| {
                                    (start + i as usize * PAGE, parent[k as usize])
                                })
                            })
                            .collect();
                        sys::early_fetch_open(c, pages);
                        if test_hook("USERMM_TEST_FORK_TOUCH_SHARED") {
                            // A read of the first shared page, as glibc's start-up might.
                            if let Some(&(start, ref v)) = table.first() {
                                if let Some(&(i, _)) = v.first() {
                                    sys::touch_write(start + i as usize * PAGE);
                                }
                            }
                        }
                        shared = table;
                        link = Some((c, slots));
                    }
                    Some(_) => sys::close(c),
                    None => {
                        warn("fork: the parent stopped sending its memory; the child cannot run");
                        sys::exit_now(127);
                    }
                }
            }
            adopt = fc
                .ranges
                .iter()
                .map(|r| (r.start, r.len, r.kind, r.region.is_noreserve()))
                .collect();
            kept = fc.kept.clone();
            // The regions belong to the parent's manager: never dropped here.
            std::mem::forget(fc);
            got
        }
        None => 0,
    };
    // fork_prepare locked the table and MANAGER on the forking thread, this child's only
    // thread, and left the guards in FORK_HOLDS.
    let (manager, space) = {
        let mut h = FORK_HOLDS.lock();
        (h.manager.take(), h.space.take())
    };
    match space {
        Some(space) => {
            SPACE.fork_child_forget(space);
        }
        None => {
            SPACE.fork_child_forget(SPACE.fork_prepare());
        }
    }
    let mut g = manager.unwrap_or_else(|| MANAGER.lock());
    if let Some(m) = g.take() {
        std::mem::forget(m);
    }
    drop(g);
    *SWAP_NOTE.lock() = None;
    FORKED.store(true, Ordering::Relaxed);
    for c in [
        &N_MMAP,
        &N_MREMAP_MOVED,
        &N_ENOMEM,
        &N_REFUSED,
        &N_HEAP_ENOMEM,
        &N_BRK,
        &MAPPED,
        &PEAK_MAPPED,
    ] {
        c.store(0, Ordering::Relaxed);
    }
    N_FORK_COPY.store(got, Ordering::Relaxed);
    N_FORK_SHARED.store(0, Ordering::Relaxed);
    N_FORK_STREAMED.store(0, Ordering::Relaxed);
    N_FORK_FETCHED_EARLY.store(0, Ordering::Relaxed);
    N_FORK_ADOPTED.store(
        fork_adopt(&adopt, &kept, got, shared, link),
        Ordering::Relaxed,
    );
}

/// mimalloc's settings for memory that usermm manages: arenas committed at once (read-write
/// mappings, never PROT_NONE reservations that the kernel would serve), 64 MiB at a time
/// (each is one usermm region, charged to the commit limit whole), no huge OS pages (the
/// kernel's), purges by MADV_DONTNEED (usermm frees the pages and their swap).
fn configure_heap() {
    use sys::mi_opt::*;
    sys::mi_option_set(ARENA_EAGER_COMMIT, 1);
    sys::mi_option_set(PURGE_DECOMMITS, 1);
    sys::mi_option_set(ALLOW_LARGE_OS_PAGES, 0);
    sys::mi_option_set(RESERVE_HUGE_OS_PAGES, 0);
    sys::mi_option_set(RESERVE_OS_MEMORY, 0);
    sys::mi_option_set(ARENA_RESERVE, (HEAP_ARENA >> 10) as i64);
}

/// Size of one mimalloc arena (one usermm region).
pub const HEAP_ARENA: usize = 64 << 20;

extern "C" fn init() {
    let _ = catch_unwind(|| {
        let _guard = Guard::enter();
        sys::init_symbols();
        let t = match std::env::var("USERMM_PRELOAD_THRESHOLD") {
            Ok(v) if !v.trim().is_empty() => match usermm::parse_size(&v) {
                Ok(t) => t as usize,
                Err(e) => {
                    warn(&format!(
                        "USERMM_PRELOAD_THRESHOLD: {e}; serving every anonymous mapping"
                    ));
                    DEFAULT_THRESHOLD
                }
            },
            _ => DEFAULT_THRESHOLD,
        };
        THRESHOLD.store(t, Ordering::Relaxed);
        configure_heap();
        if log::set_logger(&ERROR_LOG).is_ok() {
            log::set_max_level(log::LevelFilter::Error);
        }
        sys::atfork(fork_prepare, fork_parent, fork_child);
        STATE.store(1, Ordering::Release);
    });
}

fn stats_json() -> serde_json::Value {
    let mm = MANAGER.lock().clone();
    let manager = mm.map(|m| {
        let (committed, limit) = m.commit();
        let vm: serde_json::Map<String, serde_json::Value> = m
            .vmstat()
            .iter()
            .map(|(n, v)| (n.to_string(), v.into()))
            .collect();
        serde_json::json!({
            "budget_bytes": m.budget(),
            "swap": m.swap_name(),
            "swap_bytes": m.swap_bytes(),
            "resident_bytes": m.resident_bytes(),
            "peak_resident_bytes": m.peak_resident_bytes(),
            "committed_bytes": committed,
            "commit_limit_bytes": limit,
            "regions": m.nr_regions(),
            "vmstat": vm,
        })
    });
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            * 1024
    };
    let mi = sys::mi_version();
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    serde_json::json!({
        "pid": std::process::id(),
        "ppid": sys::getppid(),
        "exe": exe,
        "forked": FORKED.load(Ordering::Relaxed),
        "threshold_bytes": threshold(),
        "manager": manager,
        "manager_error": MANAGER_ERROR.lock().clone(),
        "swap_note": SWAP_NOTE.lock().clone(),
        "heap": {
            "allocator": format!("mimalloc {}.{}.{}", mi / 10000, mi / 100 % 100, mi % 100),
            "arena_bytes": HEAP_ARENA,
            "enomem": N_HEAP_ENOMEM.load(Ordering::Relaxed),
        },
        "unmanaged_brk_bytes": N_BRK.load(Ordering::Relaxed),
        "fork_copy_bytes": N_FORK_COPY.load(Ordering::Relaxed),
        "fork_streamed_bytes": N_FORK_STREAMED.load(Ordering::Relaxed),
        "fork_fetched_early_pages": N_FORK_FETCHED_EARLY.load(Ordering::Relaxed),
        "fork_adopted_bytes": N_FORK_ADOPTED.load(Ordering::Relaxed),
        "fork_shared_bytes": N_FORK_SHARED.load(Ordering::Relaxed),
        "fork_inherited_bytes": N_FORK_INHERITED.load(Ordering::Relaxed),
        "managed_mmaps": N_MMAP.load(Ordering::Relaxed),
        "mremap_moved": N_MREMAP_MOVED.load(Ordering::Relaxed),
        "enomem": N_ENOMEM.load(Ordering::Relaxed),
        "refused": N_REFUSED.load(Ordering::Relaxed),
        "peak_managed_bytes": PEAK_MAPPED.load(Ordering::Relaxed),
        "vm_hwm_bytes": kib("VmHWM:"),
        "vm_rss_bytes": kib("VmRSS:"),
    })
}

/// Before this process goes: fork children still sharing its swapped pages get them in a
/// file of their own (`Mm::hand_over_fork_children`), or they would lose them.
fn hand_over_to_children() {
    if N_FORK_SHARED.load(Ordering::Relaxed) > 0 {
        let _guard = Guard::enter();
        Mm::hand_over_fork_children(std::time::Duration::from_secs(60));
    }
}

/// The process is going: its budget group gets its charge back now (`Mm::leave_budget_group`,
/// as `exit_mmap` uncharges in a memory cgroup), not when another process of the tree finds
/// it dead. Skipped if another thread holds the manager's lock (that thread may be stopped
/// for good by the exit): the group then reaps the charge as it reaps a killed process's.
fn leave_budget_group() {
    let _guard = Guard::enter();
    let mm = MANAGER.try_lock().and_then(|g| g.clone());
    if let Some(mm) = mm {
        mm.leave_budget_group();
    }
}

/// `_exit(2)` skips the destructors: the hand-over to fork children and the leaving of the
/// budget group happen here too (a Python worker's `os._exit`, a C program's `_exit`).
/// glibc's own internal calls to `_exit` do not come through here; the one that matters,
/// `daemon(3)`'s parent, is covered by [`daemon`].
#[no_mangle]
pub extern "C" fn _exit(code: c_int) -> ! {
    let _ = catch_unwind(hand_over_to_children);
    let _ = catch_unwind(leave_budget_group);
    sys::exit_group(code)
}

/// `daemon(3)`: glibc's forks, and its parent leaves through glibc's internal `_exit`, which
/// would skip the hand-over: the daemon would lose every swapped page it shares with the
/// process that started it. The same steps, with the parent leaving through [`_exit`].
#[no_mangle]
pub extern "C" fn daemon(nochdir: c_int, noclose: c_int) -> c_int {
    match sys::fork() {
        -1 => -1,
        0 => sys::daemon_child(nochdir != 0, noclose != 0),
        _ => _exit(0),
    }
}

/// `_Exit(3)`: as [`_exit`].
#[no_mangle]
pub extern "C" fn _Exit(code: c_int) -> ! {
    _exit(code)
}

extern "C" fn fini() {
    let _ = catch_unwind(hand_over_to_children);
    let _ = catch_unwind(|| {
        let _guard = Guard::enter();
        let Some(path) = std::env::var_os("USERMM_RUN_STATS") else {
            return;
        };
        let mut line = stats_json().to_string();
        line.push('\n');
        if let Err(e) = sys::append_line(std::path::Path::new(&path), line.as_bytes()) {
            warn(&format!(
                "writing statistics to {}: {e}",
                path.to_string_lossy()
            ));
        }
    });
    let _ = catch_unwind(leave_budget_group);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
