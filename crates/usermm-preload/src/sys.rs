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

/// MADV_WIPEONFORK on `[addr, addr+len)` (after MADV_DOFORK undoes the core's DONTFORK): a
/// fork child has the range mapped, zero-filled, instead of having nothing there. glibc's fork
/// touches heap memory in the child before any atfork handler runs (`fresetlockfiles` writes
/// the lock of every open `FILE`, which `fopen` allocated with `malloc`); with DONTFORK that
/// was a SIGSEGV in every child of a process with an open stream. Falls back to DONTFORK
/// where the kernel refuses (a range that is not private anonymous memory).
pub fn wipeonfork(addr: usize, len: usize) {
    let a = addr as *mut c_void;
    if raw_madvise(a, len, libc::MADV_DOFORK) != 0
        || raw_madvise(a, len, libc::MADV_WIPEONFORK) != 0
    {
        dontfork(addr, len);
    }
}

/// MADV_NOHUGEPAGE (best effort): a fork child's copy of served memory is adopted page by page
/// by its manager, which manages 4 KiB pages.
pub fn nohugepage(addr: usize, len: usize) {
    raw_madvise(addr as *mut c_void, len, libc::MADV_NOHUGEPAGE);
}

/// PROT_NONE on `[addr, addr+len)`: a fork child's range whose shared pages are not named by
/// its manager yet (an access is a loud SIGSEGV, never a silent read of zeros).
pub fn protect_none(addr: usize, len: usize) {
    raw_mprotect(addr as *mut c_void, len, libc::PROT_NONE);
}

/// Read-write again (see [`protect_none`]).
pub fn protect_rw(addr: usize, len: usize) {
    raw_mprotect(addr as *mut c_void, len, libc::PROT_READ | libc::PROT_WRITE);
}

/// Reads one byte at `addr` and writes it back: a page shared copy-on-write with the parent
/// becomes this process's own.
pub fn touch_write(addr: usize) {
    // SAFETY: addr is a page of this process's memory (a fork child's kept stdio page, mapped
    // and writable); this runs on the child's only thread, so the byte cannot change between
    // the read and the write.
    unsafe {
        let b = std::ptr::read_volatile(addr as *const u8);
        std::ptr::write_volatile(addr as *mut u8, b);
    }
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

// ---------------------------------------------------------------------------------------------
// The heap allocator: mimalloc (libmimalloc-sys, linked statically into this library). Its
// memory comes from the OS through this library's exported `mmap`/`munmap`/`madvise`.

/// mimalloc option numbers (`mi_option_e` in mimalloc 3's `mimalloc.h`).
pub mod mi_opt {
    pub const ARENA_EAGER_COMMIT: i32 = 4;
    pub const PURGE_DECOMMITS: i32 = 5;
    pub const ALLOW_LARGE_OS_PAGES: i32 = 6;
    pub const RESERVE_HUGE_OS_PAGES: i32 = 7;
    pub const RESERVE_OS_MEMORY: i32 = 9;
    pub const ARENA_RESERVE: i32 = 23;
}

/// Sets a mimalloc option (before the first allocation).
pub fn mi_option_set(option: i32, value: i64) {
    // SAFETY: mi_option_set stores a value in mimalloc's option table; out-of-range option
    // numbers are ignored by mimalloc.
    unsafe { libmimalloc_sys::mi_option_set(option as _, value as _) }
}
pub fn mi_version() -> i32 {
    // SAFETY: no arguments, returns a constant.
    unsafe { libmimalloc_sys::mi_version() }
}
pub fn mi_malloc(n: usize) -> *mut c_void {
    // SAFETY: mimalloc accepts any size and sets errno on failure.
    unsafe { libmimalloc_sys::mi_malloc(n) }
}
pub fn mi_calloc(n: usize, m: usize) -> *mut c_void {
    // SAFETY: mimalloc checks the multiplication itself.
    unsafe { libmimalloc_sys::mi_calloc(n, m) }
}
pub fn mi_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: p is a live mimalloc allocation (checked with mi_owns by the caller).
    unsafe { libmimalloc_sys::mi_realloc(p, n) }
}
pub fn mi_free(p: *mut c_void) {
    // SAFETY: p is a live mimalloc allocation (checked with mi_owns by the caller).
    unsafe { libmimalloc_sys::mi_free(p) }
}
pub fn mi_malloc_aligned(align: usize, n: usize) -> *mut c_void {
    // SAFETY: align is a power of two (checked by the callers).
    unsafe { libmimalloc_sys::mi_malloc_aligned(n, align) }
}
pub fn mi_usable_size(p: *mut c_void) -> usize {
    // SAFETY: p is a live mimalloc allocation.
    unsafe { libmimalloc_sys::mi_usable_size(p) }
}
/// True when `p` points into memory mimalloc allocated (its page map; lock free).
pub fn mi_owns(p: *mut c_void) -> bool {
    // SAFETY: mi_is_in_heap_region only reads mimalloc's page map for the address.
    unsafe { libmimalloc_sys::mi_is_in_heap_region(p) }
}

// ---------------------------------------------------------------------------------------------
// Threads: pthread_create is interposed so that threads created by usermm itself are known as
// internal from their first instruction.

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreate =
    extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut c_void) -> c_int;

static PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

fn real_pthread_create() -> Option<PthreadCreate> {
    let mut f = PTHREAD_CREATE.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds glibc's definition.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) } as usize;
        PTHREAD_CREATE.store(f, Ordering::Release);
    }
    if f == 0 {
        return None;
    }
    // SAFETY: f is glibc's pthread_create, whose C signature PthreadCreate is.
    Some(unsafe { std::mem::transmute::<usize, PthreadCreate>(f) })
}

/// glibc's pthread_create; with `mark`, the new thread first calls `mark()` and then `start`.
pub fn pthread_create(
    t: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut c_void,
    mark: Option<fn()>,
) -> c_int {
    let Some(real) = real_pthread_create() else {
        return libc::EAGAIN;
    };
    let Some(mark) = mark else {
        return real(t, attr, start, arg);
    };
    struct Tramp {
        start: StartFn,
        arg: *mut c_void,
        mark: fn(),
    }
    extern "C" fn tramp(p: *mut c_void) -> *mut c_void {
        // SAFETY: p is the Tramp written below, handed to exactly this thread.
        let t = unsafe { (p as *mut Tramp).read() };
        libc_free(p);
        (t.mark)();
        (t.start)(t.arg)
    }
    let b = libc_malloc(std::mem::size_of::<Tramp>()) as *mut Tramp;
    if b.is_null() {
        return libc::EAGAIN;
    }
    // SAFETY: b is a fresh glibc block of the size of Tramp (16-byte aligned).
    unsafe { b.write(Tramp { start, arg, mark }) };
    let r = real(t, attr, tramp, b as *mut c_void);
    if r != 0 {
        libc_free(b as *mut c_void);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// brk/sbrk: passed to glibc (counted).

static SBRK: AtomicUsize = AtomicUsize::new(0);
static BRK: AtomicUsize = AtomicUsize::new(0);

/// glibc's definition of `name` (dlsym RTLD_NEXT), cached in `slot`; 0 if there is none.
fn next_symbol(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        slot.store(f, Ordering::Release);
    }
    f
}

pub fn libc_sbrk(incr: isize) -> *mut c_void {
    let f = next_symbol(&SBRK, c"sbrk");
    if f == 0 {
        set_errno(libc::ENOMEM);
        return usize::MAX as *mut c_void;
    }
    // SAFETY: f is glibc's sbrk (void *(*)(intptr_t)).
    let f: extern "C" fn(isize) -> *mut c_void = unsafe { std::mem::transmute(f) };
    f(incr)
}
pub fn libc_brk(addr: *mut c_void) -> c_int {
    let f = next_symbol(&BRK, c"brk");
    if f == 0 {
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: f is glibc's brk (int (*)(void *)).
    let f: extern "C" fn(*mut c_void) -> c_int = unsafe { std::mem::transmute(f) };
    f(addr)
}

// ---------------------------------------------------------------------------------------------
// fork: the parent streams the populated managed memory to the child over a socket pair.

/// A connected AF_UNIX stream pair (close-on-exec), or None.
pub fn socketpair() -> Option<(c_int, c_int)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: socketpair writes two descriptors into fds.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    (r == 0).then_some((fds[0], fds[1]))
}
pub fn close(fd: c_int) {
    // SAFETY: closes a descriptor this library opened.
    unsafe { libc::close(fd) };
}
/// Sends all of `[p, p+n)`; false if the peer is gone (no SIGPIPE).
pub fn send_all(fd: c_int, mut p: *const u8, mut n: usize) -> bool {
    while n > 0 {
        // SAFETY: [p, p+n) is readable (a bounce buffer or a header of this library).
        let r = unsafe { libc::send(fd, p as *const c_void, n, libc::MSG_NOSIGNAL) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        let r = r as usize;
        // SAFETY: r <= n bytes were sent.
        p = unsafe { p.add(r) };
        n -= r;
    }
    true
}
/// Receives exactly n bytes into `[p, p+n)`; false on EOF or error.
pub fn recv_all(fd: c_int, mut p: *mut u8, mut n: usize) -> bool {
    while n > 0 {
        // SAFETY: [p, p+n) is writable memory of this process (a header, or a range just
        // mapped by fork_child).
        let r = unsafe { libc::recv(fd, p as *mut c_void, n, libc::MSG_WAITALL) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        if r == 0 {
            return false;
        }
        let r = r as usize;
        // SAFETY: r <= n bytes were received.
        p = unsafe { p.add(r) };
        n -= r;
    }
    true
}
/// A descriptor of this library's (one end of a socket pair), handed over whole to a stream.
pub fn stream_from_fd(fd: c_int) -> std::os::unix::net::UnixStream {
    // SAFETY: fd is an open socket this library owns and gives up here.
    unsafe { <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) }
}

/// A close-on-exec duplicate of `fd` (-1 on failure).
pub fn dup_cloexec(fd: c_int) -> c_int {
    // SAFETY: fcntl F_DUPFD_CLOEXEC on a descriptor of ours; no memory is passed.
    unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// The inode of open descriptor `fd` (None if it is not open): tells a descriptor this
/// library recorded from a later one that reused its number.
pub fn fd_ino(fd: c_int) -> Option<u64> {
    // SAFETY: fstat writes into a zeroed stat buffer of ours.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}
/// The exit_group system call: ends every thread of the process, running nothing.
pub fn exit_group(code: c_int) -> ! {
    // SAFETY: exit_group does not return.
    unsafe {
        libc::syscall(libc::SYS_exit_group, code);
    }
    unreachable!("exit_group returned")
}
pub fn exit_now(code: c_int) -> ! {
    // SAFETY: _exit ends the process at once.
    unsafe { libc::_exit(code) }
}

/// glibc's `fork` (its atfork handlers run: this library's included).
pub fn fork() -> libc::pid_t {
    // SAFETY: fork has no memory arguments; the caller handles all three outcomes.
    unsafe { libc::fork() }
}

/// The rest of `daemon(3)` in the child, as glibc's `misc/daemon.c` does it: a new session,
/// `/` as the working directory unless `nochdir`, and unless `noclose` standard input, output
/// and error on `/dev/null` (which must be the null character device, or ENODEV). 0, or -1
/// with errno set.
pub fn daemon_child(nochdir: bool, noclose: bool) -> c_int {
    // SAFETY: setsid, chdir, open, fstat, dup2 and close with NUL-terminated literals and a
    // zeroed stat buffer of ours; each result is checked as glibc checks it.
    unsafe {
        if libc::setsid() == -1 {
            return -1;
        }
        if !nochdir {
            let _ = libc::chdir(c"/".as_ptr());
        }
        if !noclose {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if fd == -1 {
                return -1;
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                libc::close(fd);
                return -1;
            }
            if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != libc::makedev(1, 3) {
                libc::close(fd);
                set_errno(libc::ENODEV);
                return -1;
            }
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
    0
}

// ---------------------------------------------------------------------------------------------
// fork and stdio: glibc's fork writes the lock of every open FILE in the child before any
// atfork handler runs (`fresetlockfiles` in sysdeps/nptl/fork.h walks `_IO_list_all`).

/// Offsets in glibc's `struct _IO_FILE` (x86_64 / LP64; the layout is public ABI, spelt out in
/// `<bits/types/struct_FILE.h>` and used by the `getc_unlocked` macros): `_chain` and `_lock`.
const FILE_CHAIN: usize = 104;
const FILE_LOCK: usize = 136;
/// `sizeof(struct _IO_FILE_plus)` (the FILE and its jump-table pointer).
const FILE_PLUS_SIZE: usize = 224;
/// `sizeof(_IO_lock_t)` (int lock, int cnt, void *owner).
const FILE_LOCK_SIZE: usize = 16;
/// A bound on the list walk (a list this long or a cycle is not glibc's).
const MAX_FILES: usize = 1 << 16;

/// The byte ranges of the global locale's data that a new thread reads as it starts
/// (`__ctype_init`: the LC_CTYPE data), with the other categories' data and names: objects
/// `setlocale` allocated on the heap, which a fork child's manager threads read before the
/// child's copy of the heap is managed. Found through a duplicate of the global locale
/// (glibc's `struct __locale_struct`: 13 category data pointers, three ctype table pointers,
/// 13 name pointers; public in `<bits/types/__locale_t.h>`).
pub fn locale_objects() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // SAFETY: duplocale returns a new locale object or null; the struct's first 29 words are
    // the pointers described above, read while we own the object; it is freed before return.
    unsafe {
        // LC_GLOBAL_LOCALE is ((locale_t) -1L) in <locale.h>.
        let d = libc::duplocale(usize::MAX as libc::locale_t);
        if d.is_null() {
            return out;
        }
        let w = d as *const usize;
        for i in (0..13).chain(16..29) {
            let p = std::ptr::read(w.add(i));
            // A category's `struct __locale_data` and its values array, or a name (a short
            // string; its first page). Only the addresses are used: nothing is dereferenced.
            if p >= 1 << 16 {
                out.push((p, if i < 13 { 2 * 4096 } else { 64 }));
            }
        }
        libc::freelocale(d);
    }
    out
}

extern "C" {
    static environ: *const *const libc::c_char;
}

/// The byte ranges of the environment (the `environ` array and its strings): a fork child's
/// new manager reads its settings there (`USERMM_*`), and `setenv` puts strings on the heap.
pub fn environ_objects() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // SAFETY: environ is glibc's NULL-terminated array of NUL-terminated strings; only this
    // thread runs the fork's prepare handler, and the program's other threads must not
    // change the environment while one forks (POSIX).
    unsafe {
        let e = environ;
        if e.is_null() {
            return out;
        }
        let mut n = 0;
        while n < (1 << 16) {
            let p = std::ptr::read(e.add(n));
            if p.is_null() {
                break;
            }
            out.push((p as usize, libc::strlen(p) + 1));
            n += 1;
        }
        out.push((e as usize, (n + 1) * std::mem::size_of::<usize>()));
    }
    out
}

/// The head of the public part of glibc's `struct link_map` (<link.h>).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const libc::c_char,
    l_ld: *const c_void,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// `struct r_debug` (<link.h>): the dynamic linker's list of loaded objects.
#[repr(C)]
struct RDebug {
    r_version: c_int,
    r_map: *const LinkMap,
}

extern "C" {
    static _r_debug: RDebug;
}

/// Bytes from a `struct link_map`'s address that cover what the dynamic linker reads in it
/// (glibc's private struct is about 1.2 KiB; `l_tls_modid` is at 0x480 in 2.36).
const LINK_MAP_BYTES: usize = 4096;

/// What [`loader_objects`] found.
#[derive(Debug, Default)]
pub struct Loader {
    /// The byte ranges of the `struct link_map`s.
    pub objects: Vec<(usize, usize)>,
    /// The highest module id of an object with thread-local storage.
    pub max_tls_modid: usize,
    walked: bool,
}

extern "C" fn scan_object(info: *mut libc::dl_phdr_info, size: usize, out: *mut c_void) -> c_int {
    // SAFETY: called by dl_iterate_phdr, which holds the dynamic linker's write lock on its
    // list of objects (dlopen and dlclose change it under that lock), so the list is walked
    // whole and unchanged; `out` is the Loader passed below; `info` is valid for `size` bytes
    // (the module id is read only if the structure reaches it). Only addresses are collected.
    unsafe {
        let out = &mut *(out as *mut Loader);
        if !out.walked {
            out.walked = true;
            let mut m = _r_debug.r_map;
            while !m.is_null() && out.objects.len() < 1 << 16 {
                out.objects.push((m as usize, LINK_MAP_BYTES));
                m = (*m).l_next;
            }
        }
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_tls_data) {
            out.max_tls_modid = out.max_tls_modid.max((*info).dlpi_tls_modid);
        }
    }
    0
}

/// The dynamic linker's `struct link_map`s (one per loaded object) and the highest TLS module
/// id. The link maps of objects dlopen'ed by the program are on its heap (calloc), and glibc
/// reads them in every pthread_create (`_dl_allocate_tls_init` walks the objects with
/// thread-local storage): a fork child's new manager starts threads before it can read pages
/// shared with the parent.
pub fn loader_objects() -> Loader {
    let mut out = Loader::default();
    // SAFETY: dl_iterate_phdr calls `scan_object` with our pointer, which it only passes on.
    unsafe {
        libc::dl_iterate_phdr(Some(scan_object), &mut out as *mut Loader as *mut c_void);
    }
    out
}

/// The byte ranges glibc's fork touches in the child for every open stdio stream: each FILE
/// and the lock it points to, found by walking the list as glibc does (`_IO_list_all`,
/// `_chain`) under glibc's own list lock (`_IO_list_lock`, exported like the head).
pub fn stdio_objects() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // SAFETY: dlsym with NUL-terminated names; these are glibc's exported list head (a
    // `struct _IO_FILE_plus *` variable) and its lock functions (void (*)(void)).
    let (head, lock, unlock) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"_IO_list_all".as_ptr()) as usize,
            libc::dlsym(libc::RTLD_DEFAULT, c"_IO_list_lock".as_ptr()) as usize,
            libc::dlsym(libc::RTLD_DEFAULT, c"_IO_list_unlock".as_ptr()) as usize,
        )
    };
    if head == 0 || lock == 0 || unlock == 0 {
        return out;
    }
    // SAFETY: both are glibc's `void f(void)` list-lock functions found above.
    let (lock, unlock) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn()>(lock),
            std::mem::transmute::<usize, extern "C" fn()>(unlock),
        )
    };
    lock();
    // SAFETY: head is the address of a pointer-sized libc variable.
    let mut fp = unsafe { std::ptr::read_volatile(head as *const usize) };
    while fp != 0 && fp % 8 == 0 && out.len() < 2 * MAX_FILES {
        out.push((fp, FILE_PLUS_SIZE));
        // SAFETY: fp is an open FILE on glibc's list, which cannot change while its lock is
        // held; the fields read are pointer-sized and aligned.
        let (l, next) = unsafe {
            (
                std::ptr::read_volatile((fp + FILE_LOCK) as *const usize),
                std::ptr::read_volatile((fp + FILE_CHAIN) as *const usize),
            )
        };
        if l != 0 {
            out.push((l, FILE_LOCK_SIZE));
        }
        fp = next;
    }
    unlock();
    out
}

/// MADV_KEEPONFORK on `[addr, addr+len)`: a fork child shares these pages copy-on-write.
pub fn keeponfork(addr: usize, len: usize) -> bool {
    raw_madvise(addr as *mut c_void, len, libc::MADV_KEEPONFORK) == 0
}

/// Reads one byte of `addr` (managed memory: a fault is served by the manager's threads), so
/// that the page is mapped when fork copies the page tables.
pub fn touch(addr: usize) {
    // SAFETY: addr is live managed memory of this process (checked by the caller against the
    // locked Space); a volatile one-byte read has no other effect.
    unsafe { std::ptr::read_volatile(addr as *const u8) };
}

/// How many CPUs this process may run on (sched_getaffinity(2)); 1 where it cannot say.
pub fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is a plain bit array; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `set`.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return 1;
    }
    // SAFETY: CPU_COUNT only reads the set sched_getaffinity filled.
    let n = unsafe { libc::CPU_COUNT(&set) };
    usize::try_from(n).unwrap_or(1).max(1)
}

// ---------------------------------------------------------------------------------------------
// A fork child's pages shared with its parent, read on first touch before its manager runs.

/// The pages a fork child shares with its parent, from the moment they are protected until its
/// new manager has started ([`early_fetch_open`]). Freed when the window closes, once no
/// handler is inside ([`EARLY_INSIDE`]): 16 bytes a shared page, about 4 MiB of glibc's heap
/// for a GiB swapped, which a child must not keep.
struct EarlyFetch {
    /// The socket to the parent (the wire format of `usermm::swap::inherit`).
    fd: c_int,
    /// (page address, the parent's slot), sorted by address.
    pages: Vec<(usize, u64)>,
    fetched: Vec<std::sync::atomic::AtomicBool>,
    /// One fetch at a time: the socket carries one request and its answer.
    busy: std::sync::atomic::AtomicBool,
}

static EARLY: std::sync::atomic::AtomicPtr<EarlyFetch> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Handlers between their look at [`EARLY`] and their last use of what it pointed to. A
/// handler counts itself before it loads the pointer and [`early_fetch_close`] clears the
/// pointer before it reads the count (both sequentially consistent): either the handler sees
/// no window, or the close waits for it.
static EARLY_INSIDE: AtomicUsize = AtomicUsize::new(0);

/// The SIGSEGV action before [`early_fetch_open`] installed its own.
struct OldAction(std::cell::UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written by early_fetch_open before the handler is installed, read by the handler and
// by early_fetch_close after; never written while the handler can run.
unsafe impl Sync for OldAction {}
static OLD_SEGV: OldAction = OldAction(std::cell::UnsafeCell::new(std::mem::MaybeUninit::uninit()));

/// Opens the window: until [`early_fetch_close`], a SIGSEGV at one of `pages` (protected
/// PROT_NONE by the caller; (address, the parent's slot)) reads that page from the parent over
/// `fd` (`usermm::swap::inherit`'s OP_READ), writes it in and lets the access go on. Whatever
/// a fork child's start-up reads on its heap before its manager can serve shared pages (glibc's
/// thread start-up, the dynamic linker) then costs one round trip instead of a SIGSEGV.
/// Another SIGSEGV goes to the action that was there before.
pub fn early_fetch_open(fd: c_int, mut pages: Vec<(usize, u64)>) {
    use std::sync::atomic::AtomicBool;
    pages.sort_unstable_by_key(|p| p.0);
    let fetched = pages.iter().map(|_| AtomicBool::new(false)).collect();
    let net = Box::into_raw(Box::new(EarlyFetch {
        fd,
        pages,
        fetched,
        busy: AtomicBool::new(false),
    }));
    // SAFETY: a zeroed sigaction is valid; sa_sigaction is our extern "C" handler with the
    // SA_SIGINFO signature; OLD_SEGV is written before the handler can run (see OldAction).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = early_fetch_segv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        EARLY.store(net, Ordering::SeqCst);
        if libc::sigaction(libc::SIGSEGV, &sa, (*OLD_SEGV.0.get()).as_mut_ptr()) != 0 {
            // No handler was installed, so none can be inside.
            EARLY.store(std::ptr::null_mut(), Ordering::SeqCst);
            drop(Box::from_raw(net));
        }
    }
}

/// Closes the window: the action before [`early_fetch_open`] is back; returns the addresses of
/// the pages read in meanwhile (this process's own now, no longer shared).
pub fn early_fetch_close() -> Vec<usize> {
    let p = EARLY.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if p.is_null() {
        return Vec::new();
    }
    while EARLY_INSIDE.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    // SAFETY: OLD_SEGV was filled by early_fetch_open's successful sigaction; `p` came from
    // Box::into_raw there, and no handler holds it any more (EARLY_INSIDE) nor can load it.
    unsafe {
        libc::sigaction(
            libc::SIGSEGV,
            (*OLD_SEGV.0.get()).as_ptr(),
            std::ptr::null_mut(),
        );
        let net = Box::from_raw(p);
        net.pages
            .iter()
            .zip(&net.fetched)
            .filter(|(_, f)| f.load(Ordering::Acquire))
            .map(|(&(a, _), _)| a)
            .collect()
    }
}

/// Reads page `i` of `net` from the parent into a buffer, then makes the page accessible and
/// writes it in (never accessible before its bytes are there). Async-signal-safe: system
/// calls and a stack buffer.
fn early_fetch_one(net: &EarlyFetch, i: usize) -> bool {
    use usermm::swap::inherit::OP_READ;
    let (page, slot) = net.pages[i];
    let mut req = [0u8; 16];
    req[0..4].copy_from_slice(&OP_READ.to_ne_bytes());
    req[4..8].copy_from_slice(&1u32.to_ne_bytes());
    req[8..16].copy_from_slice(&slot.to_ne_bytes());
    let mut hdr = [0u32; 2];
    let mut buf = [0u8; 4096];
    let ok = send_all(net.fd, req.as_ptr(), req.len())
        && recv_all(net.fd, hdr.as_mut_ptr() as *mut u8, 8)
        && hdr == [0, 1]
        && recv_all(net.fd, buf.as_mut_ptr(), buf.len());
    if ok {
        protect_rw(page, 4096);
        // SAFETY: `page` is a page of this process, read-write from the line above.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), page as *mut u8, 4096) };
    }
    ok
}

extern "C" fn early_fetch_segv(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    let saved = errno();
    EARLY_INSIDE.fetch_add(1, Ordering::SeqCst);
    let p = EARLY.load(Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; `p` is null or the
    // window's EarlyFetch, not freed while this handler counts in EARLY_INSIDE.
    let (addr, net) = unsafe { ((*info).si_addr() as usize, p.as_ref()) };
    let handled = net.is_some_and(|net| {
        let Ok(i) = net.pages.binary_search_by_key(&(addr & !4095), |p| p.0) else {
            return false;
        };
        while net.busy.swap(true, Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let ok = net.fetched[i].load(Ordering::Acquire) || early_fetch_one(net, i);
        if ok {
            net.fetched[i].store(true, Ordering::Release);
        }
        net.busy.store(false, Ordering::Release);
        if !ok {
            let msg = b"usermm: this fork child touched memory it shares with its parent before its manager ran, and the parent did not send it (is the parent gone?); the child cannot run\n";
            // SAFETY: write(2) of a static buffer, async-signal-safe.
            unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
        }
        ok
    });
    EARLY_INSIDE.fetch_sub(1, Ordering::SeqCst);
    if !handled {
        // Not a shared page (or the parent is gone): the action before, at the access again.
        // SAFETY: OLD_SEGV holds the action saved when the handler was installed.
        unsafe {
            libc::sigaction(
                libc::SIGSEGV,
                (*OLD_SEGV.0.get()).as_ptr(),
                std::ptr::null_mut(),
            );
        }
    }
    set_errno(saved);
}
