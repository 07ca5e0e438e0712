//! The preload library of `usermm run` (`libusermm_preload.so`, loaded with LD_PRELOAD): it
//! serves an unmodified program's large anonymous private memory from a usermm manager inside
//! the process. Mirrors glibc's malloc interposition contract (`malloc/malloc.c`: a replacement
//! must provide malloc, free, calloc, realloc and the aligned variants) and the system calls of
//! `mm/mmap.c`, `mm/mremap.c`, `mm/mprotect.c`, `mm/madvise.c`.
//!
//! What is intercepted, and why:
//! * the malloc family: glibc's malloc maps its large chunks with an internal, non-interposable
//!   `__mmap`, so intercepting mmap alone would never see them. Allocations above the threshold
//!   (`USERMM_PRELOAD_THRESHOLD`, default 1 MiB) become usermm regions; everything else goes to
//!   glibc's own allocator (`__libc_malloc` and friends);
//! * mmap/mmap64 of MAP_PRIVATE|MAP_ANONYMOUS read-write memory above the threshold, and munmap,
//!   mremap, mprotect, madvise, mlock on the ranges served (everything else is passed to the
//!   kernel with a raw system call; see `docs/c-and-run.md` for the exact list).
//!
//! Recursion: usermm's own mappings (frame pool, region views, bounce buffers, the RAM swap
//! device) are made by code inside this library through the same `mmap` symbol. Such calls are
//! recognised by a thread-local depth counter (set while this library runs usermm code on an
//! application thread) or by the calling thread being one of usermm's (its name starts with
//! `usermm-`), and go straight to the kernel; private anonymous ones are marked MADV_DONTFORK.
//! Rust's own heap (this library's global allocator) calls glibc's `__libc_malloc` directly.
//!
//! fork: every managed range and usermm's internal mappings are MADV_DONTFORK, so a child does
//! not share them (UFFDIO_MOVE cannot move pages shared copy-on-write, and the child has no
//! fault handler). The child forgets the parent's manager (its threads do not exist there) and
//! creates its own on its first large allocation; touching memory the parent managed raises
//! SIGSEGV in the child. exec: the manager disappears with the old image; LD_PRELOAD is
//! inherited, so the new program gets its own manager.
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

use parking_lot::Mutex;
use usermm::sys::uffd::OpenPolicy;
use usermm::{Mm, MmConfig, Region};
use usermm_vma::{classify_mmap, Coverage, Kind, MmapRequest, Space, PAGE};

mod sys;

use sys::{errno, set_errno};

/// Default threshold: requests strictly above 1 MiB are served.
pub const DEFAULT_THRESHOLD: usize = 1 << 20;

/// 0: not initialised (everything goes to glibc / the kernel), 1: active, 2: disabled (the
/// manager could not be created: everything goes to glibc / the kernel).
static STATE: AtomicU8 = AtomicU8::new(0);
static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
static SPACE: Space = Space::new();
static MANAGER: Mutex<Option<Mm>> = Mutex::new(None);
static MANAGER_ERROR: Mutex<Option<String>> = Mutex::new(None);
static FORKED: AtomicBool = AtomicBool::new(false);
static SWAP_CLAIM: Mutex<Option<usermm_vma::SwapClaim>> = Mutex::new(None);
static SWAP_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// Per-process counters reported at exit.
static N_MALLOC: AtomicU64 = AtomicU64::new(0);
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

/// True when a call comes from usermm itself (see the module documentation).
fn is_internal() -> bool {
    if DEPTH.with(|d| d.get()) > 0 || INTERNAL.with(|i| i.get()) == 2 {
        return true;
    }
    // Names are set a little after a thread starts, so only a positive answer is cached.
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
    let made = MmConfig::from_env().and_then(|mut cfg| {
        cfg.uffd_policy = OpenPolicy::Full;
        // USERMM_SWAP=file:PATH reaches every process of the program (children, exec'd
        // programs): the first manager claims PATH, the others swap to a temporary file.
        match usermm_vma::claim_swap_path(&cfg.swap) {
            Ok(c) => *SWAP_CLAIM.lock() = c,
            Err(e) => {
                cfg.swap = cfg.swap.without_file_path();
                *SWAP_NOTE.lock() = Some(format!(
                    "{e}: this process swaps to an unlinked temporary file in $TMPDIR"
                ));
            }
        }
        Mm::new(cfg)
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

/// Why a request was not served by usermm.
enum Refusal {
    /// usermm is not serving (not active, or the manager could not be created): use glibc or
    /// the kernel.
    Fallback,
    /// The commit limit (budget + swap) refuses it: the caller fails with ENOMEM.
    NoMemory,
}

/// Maps a managed region of at least `len` bytes; for malloc, the returned pointer is aligned
/// to `align` inside it.
fn map_region(len: usize, align: usize, malloc: bool) -> Result<usize, Refusal> {
    let mm = manager().ok_or(Refusal::Fallback)?;
    let _guard = Guard::enter();
    let extra = align.saturating_sub(PAGE);
    let total = len
        .checked_add(extra)
        .and_then(usermm_vma::page_round_up)
        .ok_or(Refusal::NoMemory)?;
    let r = match mm.map_anon(total) {
        Ok(r) => r,
        Err(usermm::Error::CommitLimit { .. }) => {
            N_ENOMEM.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::NoMemory);
        }
        Err(e) => {
            warn(&format!("mapping {total} bytes failed: {e}"));
            N_ENOMEM.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::NoMemory);
        }
    };
    sys::dontfork(r.as_ptr() as usize, r.len());
    let start = r.as_ptr() as usize;
    let ptr = start.next_multiple_of(align.max(PAGE));
    note_mapped(r.len() as i64);
    let kind = if malloc {
        N_MALLOC.fetch_add(1, Ordering::Relaxed);
        Kind::Malloc { ptr }
    } else {
        N_MMAP.fetch_add(1, Ordering::Relaxed);
        Kind::Mmap
    };
    SPACE.insert(r, kind);
    Ok(ptr)
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
// The malloc family.

fn big_malloc(size: usize, align: usize) -> Option<*mut c_void> {
    if size <= threshold() || !active() || is_internal() {
        return None;
    }
    ffi(None, || match map_region(size, align, true) {
        Ok(p) => Some(p as *mut c_void),
        Err(Refusal::Fallback) => None,
        Err(Refusal::NoMemory) => {
            set_errno(libc::ENOMEM);
            Some(std::ptr::null_mut())
        }
    })
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    match big_malloc(size, 16) {
        Some(p) => p,
        None => sys::libc_malloc(size),
    }
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, m: usize) -> *mut c_void {
    let Some(size) = n.checked_mul(m) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // Fresh usermm memory reads as zeros.
    match big_malloc(size, 16) {
        Some(p) => p,
        None => sys::libc_calloc(n, m),
    }
}

/// Frees `p` if it is a managed allocation; true if it was usermm's.
fn free_managed(p: *mut c_void) -> bool {
    let a = p as usize;
    if !SPACE.might_overlap(a, 1) {
        return false;
    }
    ffi(true, || {
        if let Some(r) = SPACE.take_malloc(a) {
            release(vec![r]);
            return true;
        }
        if let Some(v) = SPACE.find(a) {
            // Inside managed memory but not a pointer malloc returned: glibc would abort with
            // "free(): invalid pointer"; handing it to glibc would read a chunk header from
            // managed memory. Abort the same way.
            warn(&format!(
                "free({a:#x}): invalid pointer (inside usermm memory at {:#x}, not a pointer malloc returned)",
                v.start
            ));
            sys::abort();
        }
        false
    })
}

#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if !free_managed(p) {
        sys::libc_free(p);
    }
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
    let a = p as usize;
    let managed = if SPACE.might_overlap(a, 1) {
        SPACE.malloc_lookup(a)
    } else {
        None
    };
    if let Some((_, usable)) = managed {
        if n <= usable && n > threshold() {
            return p;
        }
        // Move: to glibc below the threshold, to a larger region above it.
        let q = if n > threshold() {
            match big_malloc(n, 16) {
                Some(q) => q,
                None => sys::libc_malloc(n),
            }
        } else {
            sys::libc_malloc(n)
        };
        if q.is_null() {
            return q;
        }
        // SAFETY: p holds at least `usable` bytes and q at least n; they do not overlap. Raw
        // copies only: managed memory is never referenced as a slice.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, usable.min(n)) };
        free(p);
        return q;
    }
    if n > threshold() && active() && !is_internal() {
        if let Some(old) = sys::libc_usable_size(p) {
            if let Some(q) = big_malloc(n, 16) {
                if q.is_null() {
                    return q;
                }
                // SAFETY: p is a live glibc allocation of `old` usable bytes, q a fresh region
                // of at least n bytes.
                unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(n)) };
                sys::libc_free(p);
                return q;
            }
        }
    }
    sys::libc_realloc(p, n)
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

fn aligned(align: usize, size: usize) -> *mut c_void {
    match big_malloc(size, align) {
        Some(p) => p,
        None => sys::libc_memalign(align, size),
    }
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
    if p.is_null() && size != 0 {
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
    let a = p as usize;
    if SPACE.might_overlap(a, 1) {
        if let Some((_, usable)) = SPACE.malloc_lookup(a) {
            return usable;
        }
    }
    sys::libc_usable_size(p).unwrap_or(0)
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
    if !active() || is_internal() {
        let p = sys::raw_mmap(addr, len, prot, flags, fd, off);
        if p != libc::MAP_FAILED
            && flags & libc::MAP_ANONYMOUS != 0
            && flags & 0x03 == libc::MAP_PRIVATE
            && is_internal()
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
            match ffi(Err(Refusal::NoMemory), || map_region(len, PAGE, false)) {
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
    let new = match map_region(rn, PAGE, false) {
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

extern "C" fn fork_prepare() {
    std::mem::forget(MANAGER.lock());
    SPACE.fork_prepare();
}

extern "C" fn fork_parent() {
    SPACE.fork_parent();
    // SAFETY: fork_prepare locked MANAGER on this thread and forgot the guard.
    unsafe { MANAGER.force_unlock() };
}

extern "C" fn fork_child() {
    // The parent's manager has no threads here and its userfaultfd belongs to the parent's
    // address space: forget it without running any of its code. Managed memory was not
    // inherited (MADV_DONTFORK).
    SPACE.fork_child_forget();
    // SAFETY: fork_prepare locked MANAGER on the forking thread, which is this child's only
    // thread, and forgot the guard.
    unsafe { MANAGER.force_unlock() };
    if let Some(m) = MANAGER.lock().take() {
        std::mem::forget(m);
    }
    // Closing the child's copy of the claim's descriptor leaves the parent's lock in place.
    drop(SWAP_CLAIM.lock().take());
    *SWAP_NOTE.lock() = None;
    FORKED.store(true, Ordering::Relaxed);
    for c in [
        &N_MALLOC,
        &N_MMAP,
        &N_MREMAP_MOVED,
        &N_ENOMEM,
        &N_REFUSED,
        &MAPPED,
        &PEAK_MAPPED,
    ] {
        c.store(0, Ordering::Relaxed);
    }
}

extern "C" fn init() {
    let _ = catch_unwind(|| {
        let _guard = Guard::enter();
        sys::init_symbols();
        let t = match std::env::var("USERMM_PRELOAD_THRESHOLD") {
            Ok(v) if !v.trim().is_empty() => match usermm::parse_size(&v) {
                Ok(t) => t as usize,
                Err(e) => {
                    warn(&format!("USERMM_PRELOAD_THRESHOLD: {e}; using 1 MiB"));
                    DEFAULT_THRESHOLD
                }
            },
            _ => DEFAULT_THRESHOLD,
        };
        THRESHOLD.store(t, Ordering::Relaxed);
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
        "managed_mallocs": N_MALLOC.load(Ordering::Relaxed),
        "managed_mmaps": N_MMAP.load(Ordering::Relaxed),
        "mremap_moved": N_MREMAP_MOVED.load(Ordering::Relaxed),
        "enomem": N_ENOMEM.load(Ordering::Relaxed),
        "refused": N_REFUSED.load(Ordering::Relaxed),
        "peak_managed_bytes": PEAK_MAPPED.load(Ordering::Relaxed),
        "vm_hwm_bytes": kib("VmHWM:"),
        "vm_rss_bytes": kib("VmRSS:"),
    })
}

extern "C" fn fini() {
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
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
