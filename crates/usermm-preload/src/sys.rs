//! Every `unsafe` line of the preload library: glibc's own allocator entry points, raw system
//! calls for the requests passed to the kernel (so that they never come back through this
//! library's exported symbols), errno, thread names, pthread_atfork and the global allocator
//! that keeps Rust's heap on glibc.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, m: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// Rust's heap in this library: glibc's allocator directly, never the exported `malloc`.
struct LibcHeap;

// SAFETY: glibc's allocator returns blocks aligned to at least 16 bytes (memalign for larger
// alignments) that stay valid until freed; sizes and pointers are passed through unchanged.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator.
        unsafe {
            if l.align() <= 16 {
                __libc_malloc(l.size()) as *mut u8
            } else {
                __libc_memalign(l.align(), l.size()) as *mut u8
            }
        }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as alloc; memalign'd blocks are zeroed by hand.
        unsafe {
            if l.align() <= 16 {
                __libc_calloc(1, l.size()) as *mut u8
            } else {
                let p = __libc_memalign(l.align(), l.size()) as *mut u8;
                if !p.is_null() {
                    std::ptr::write_bytes(p, 0, l.size());
                }
                p
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from this allocator, i.e. from glibc.
        unsafe { __libc_free(p as *mut c_void) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: p came from glibc; larger alignments are moved by hand.
        unsafe {
            if l.align() <= 16 {
                return __libc_realloc(p as *mut c_void, new) as *mut u8;
            }
            let q = __libc_memalign(l.align(), new) as *mut u8;
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                __libc_free(p as *mut c_void);
            }
            q
        }
    }
}

#[global_allocator]
static HEAP: LibcHeap = LibcHeap;

pub fn libc_malloc(n: usize) -> *mut c_void {
    // SAFETY: glibc's malloc accepts any size.
    unsafe { __libc_malloc(n) }
}
pub fn libc_calloc(n: usize, m: usize) -> *mut c_void {
    // SAFETY: glibc's calloc checks the multiplication itself.
    unsafe { __libc_calloc(n, m) }
}
pub fn libc_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: p is NULL or a glibc allocation (managed pointers are handled before this).
    unsafe { __libc_realloc(p, n) }
}
pub fn libc_free(p: *mut c_void) {
    // SAFETY: p is NULL or a glibc allocation (managed pointers are handled before this).
    unsafe { __libc_free(p) }
}
pub fn libc_memalign(align: usize, n: usize) -> *mut c_void {
    // SAFETY: glibc's memalign validates its arguments.
    unsafe { __libc_memalign(align, n) }
}

/// glibc's malloc_usable_size, found with dlsym(RTLD_NEXT) at initialisation.
static USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

pub fn init_symbols() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition (glibc's).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    USABLE_SIZE.store(p as usize, Ordering::Release);
}

/// glibc's usable size of a glibc allocation (None before initialisation).
pub fn libc_usable_size(p: *mut c_void) -> Option<usize> {
    let f = USABLE_SIZE.load(Ordering::Acquire);
    if f == 0 {
        return None;
    }
    // SAFETY: f is glibc's malloc_usable_size (size_t (*)(void *)); p is a glibc allocation.
    let f: extern "C" fn(*mut c_void) -> usize = unsafe { std::mem::transmute(f) };
    Some(f(p))
}

pub fn raw_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the mmap system call with the caller's own arguments: whatever it maps or
    // replaces is the caller's request (requests over managed memory never get here).
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}
pub fn raw_munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: munmap of a range the caller asked for, which holds no managed memory.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}
pub fn raw_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new: *mut c_void,
) -> *mut c_void {
    // SAFETY: mremap of a range the caller owns that holds no managed memory, to a target that
    // holds none either (checked by the caller).
    unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) as *mut c_void }
}
pub fn raw_mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: mprotect of a range that holds no managed memory.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int }
}
pub fn raw_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: madvise of a range that holds no managed memory (or DONTFORK on usermm's own).
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int }
}
pub fn raw_mlock(addr: *const c_void, len: usize) -> c_int {
    // SAFETY: mlock of a range that holds no managed memory.
    unsafe { libc::syscall(libc::SYS_mlock, addr, len) as c_int }
}
pub fn raw_mlock2(addr: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    // SAFETY: mlock2 of a range that holds no managed memory.
    unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) as c_int }
}
pub fn raw_mlockall(flags: c_int) -> c_int {
    // SAFETY: plain system call.
    unsafe { libc::syscall(libc::SYS_mlockall, flags) as c_int }
}

/// MADV_DONTFORK on `[addr, addr+len)`: not inherited by fork children.
pub fn dontfork(addr: usize, len: usize) {
    let _ = raw_madvise(addr as *mut c_void, len, libc::MADV_DONTFORK);
}

pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// True when the calling thread's name starts with `prefix`.
pub fn thread_name_starts_with(prefix: &[u8]) -> bool {
    let mut buf = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL-terminated) into buf.
    let r = unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            buf.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    r == 0 && buf.starts_with(prefix)
}

pub fn write_stderr(msg: &str) {
    // SAFETY: write(2) of a valid buffer to fd 2; a short or failed write is ignored.
    unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
}

pub fn abort() -> ! {
    std::process::abort()
}

pub fn getppid() -> i32 {
    // SAFETY: getppid has no arguments and cannot fail.
    unsafe { libc::getppid() }
}

pub fn atfork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registers three functions that live as long as the process (this library is
    // never unloaded: it is preloaded).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Appends `line` with one write(2) on an O_APPEND descriptor (atomic for regular files).
pub fn append_line(path: &std::path::Path, line: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    f.write_all(line)
}
