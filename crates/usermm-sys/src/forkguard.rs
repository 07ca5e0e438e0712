//! What a fork(2) child finds where its parent's usermm memory was: nothing (the ranges are
//! `MADV_DONTFORK`), so its first touch there is a SIGSEGV. Without this module that is a bare
//! "Segmentation fault" with no hint of the cause; with it, the child's first SIGSEGV inside such
//! a range prints one line naming the address, the range, the parent and what to do instead,
//! then the signal takes its course as before (the previous disposition: the program's own
//! handler, or the default action). Mirrors nothing in Linux (the kernel's answer is to share the
//! pages copy-on-write in `copy_page_range`, which an in-process manager cannot do; issue 12's
//! daemon is for that).
//!
//! How: [`Mapping::advise`](crate::Mapping::advise) with `DontFork` records the range in a
//! fixed table of atomics, and dropping the mapping clears it: no lock and no allocation, so
//! nothing here can deadlock with a fork taken in the middle of it (under `usermm run` the
//! allocator itself is usermm's, and its fork handlers hold its locks across fork(2)). A
//! `pthread_atfork` child handler notes the parent's pid and, if the table holds any range,
//! installs the SIGSEGV handler, keeping the previous action. The handler is async-signal-safe:
//! it reads the table, formats into a stack buffer, `write(2)`s to stderr, restores the previous
//! action and returns, so the faulting instruction faults again under the previous disposition
//! (a SIGSEGV sent with kill(2) is raised again instead, since returning would lose it). A
//! process with more than [`TABLE`] such ranges at once leaves the rest unnamed (a bare SIGSEGV
//! there, as before).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Once;

/// How many ranges the table holds.
pub const TABLE: usize = 1024;

/// `[LO[i], HI[i])`: a range a fork child does not inherit. `LO[i]` is 0 for a free slot and
/// `CLAIMED` while its writer fills `HI[i]`.
static LO: [AtomicUsize; TABLE] = [const { AtomicUsize::new(0) }; TABLE];
static HI: [AtomicUsize; TABLE] = [const { AtomicUsize::new(0) }; TABLE];
const CLAIMED: usize = 1;

/// The pid of the process this one was forked from (set in the child).
static PARENT: AtomicI32 = AtomicI32::new(0);

/// The SIGSEGV action before ours, written by the child handler before ours is installed.
struct PrevAction(UnsafeCell<Option<libc::sigaction>>);
// SAFETY: written by the fork child handler while the child has a single thread and before the
// SIGSEGV handler that reads it is installed; read-only afterwards (a later fork's child handler
// runs in another process).
unsafe impl Sync for PrevAction {}
static PREV: PrevAction = PrevAction(UnsafeCell::new(None));

static REGISTER: Once = Once::new();

/// `si_code` of a SIGSEGV at an address with no mapping (`<asm-generic/siginfo.h>`; the libc
/// crate does not export it).
const SEGV_MAPERR: libc::c_int = 1;

/// Records `[addr, addr + len)` as memory a fork child does not inherit (called by
/// `Mapping::advise(DontFork)`); registers the fork handler on first use.
pub(crate) fn remember(addr: usize, len: usize) {
    REGISTER.call_once(|| {
        // SAFETY: `child` is an `extern "C" fn()` item that lives for the whole program;
        // pthread_atfork only stores it.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(child)) };
        if rc != 0 {
            eprintln!("usermm: pthread_atfork failed ({rc}): a fork child touching usermm memory will get a bare SIGSEGV");
        }
    });
    if addr <= CLAIMED || len == 0 {
        return;
    }
    for i in 0..TABLE {
        if LO[i]
            .compare_exchange(0, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            HI[i].store(addr + len, Ordering::Relaxed);
            LO[i].store(addr, Ordering::Release);
            return;
        }
    }
}

/// Forgets every recorded range inside `[addr, addr + len)` (the mapping is gone).
pub(crate) fn forget(addr: usize, len: usize) {
    for i in 0..TABLE {
        let lo = LO[i].load(Ordering::Acquire);
        if lo > CLAIMED && lo >= addr && HI[i].load(Ordering::Relaxed) <= addr + len {
            let _ = LO[i].compare_exchange(lo, 0, Ordering::Release, Ordering::Relaxed);
        }
    }
}

/// Whether `addr` lies in a range recorded for fork children (for tests).
pub fn is_remembered(addr: usize) -> bool {
    range_of(addr).is_some()
}

extern "C" fn child() {
    // SAFETY: getppid cannot fail; right after fork it is the forking process.
    PARENT.store(unsafe { libc::getppid() }, Ordering::Relaxed);
    if !LO.iter().any(|l| l.load(Ordering::Relaxed) > CLAIMED) {
        return;
    }
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigsegv as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: zeroed, then filled by sigaction(2) with the current action.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sa_mask is a valid sigset_t owned by `act`; PREV is written before the handler
    // that reads it can run (it is installed by the second sigaction call), while this child
    // has a single thread.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) != 0 {
            return;
        }
        if old.sa_sigaction == on_sigsegv as *const () as usize {
            return; // a grandchild: ours is already in place, PREV is the original
        }
        *PREV.0.get() = Some(old);
        libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut());
    }
}

/// The recorded range holding `addr`, if any.
fn range_of(addr: usize) -> Option<(usize, usize)> {
    (0..TABLE).find_map(|i| {
        let lo = LO[i].load(Ordering::Acquire);
        let hi = HI[i].load(Ordering::Relaxed);
        (lo > CLAIMED && lo <= addr && addr < hi).then_some((lo, hi))
    })
}

/// A fixed buffer that text and numbers are appended to without allocating.
struct Line {
    buf: [u8; 640],
    len: usize,
}

impl Line {
    fn byte(&mut self, b: u8) {
        if self.len < self.buf.len() {
            self.buf[self.len] = b;
            self.len += 1;
        }
    }

    fn text(&mut self, s: &str) -> &mut Self {
        s.bytes().for_each(|b| self.byte(b));
        self
    }

    fn num(&mut self, mut v: usize, hex: bool) -> &mut Self {
        let base = if hex { 16 } else { 10 };
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b"0123456789abcdef"[v % base];
            n += 1;
            v /= base;
            if v == 0 {
                break;
            }
        }
        if hex {
            self.text("0x");
        }
        digits[..n].iter().rev().for_each(|&d| self.byte(d));
        self
    }
}

/// The message for a fault at `addr` inside `[lo, hi)` (also used by the tests).
fn message(addr: usize, lo: usize, hi: usize, parent: usize) -> Line {
    let mut l = Line {
        buf: [0; 640],
        len: 0,
    };
    l.text("usermm: SIGSEGV at ")
        .num(addr, true)
        .text(": this process is a fork() child of pid ")
        .num(parent, false)
        .text(", and memory managed by usermm there (")
        .num(lo, true)
        .text("-")
        .num(hi, true)
        .text(") is not inherited across fork (MADV_DONTFORK: copy-on-write fork needs the usermm daemon, not built yet). Use that memory in the parent, exec a program, or start workers with Python multiprocessing's \"spawn\" method.\n");
    l
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a handler installed with SA_SIGINFO.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == SEGV_MAPERR {
        if let Some((lo, hi)) = range_of(addr) {
            let l = message(addr, lo, hi, PARENT.load(Ordering::Relaxed) as usize);
            // SAFETY: write(2) is async-signal-safe; the buffer is valid for `len` bytes.
            unsafe { libc::write(2, l.buf.as_ptr().cast(), l.len) };
        }
    }
    // SAFETY: PREV was written before this handler was installed and is never written again;
    // sigaction and raise are async-signal-safe.
    unsafe {
        if let Some(prev) = &*PREV.0.get() {
            libc::sigaction(sig, prev, std::ptr::null_mut());
        } else {
            libc::signal(sig, libc::SIG_DFL);
        }
        // A fault faults again on return, now under the previous action; a SIGSEGV sent by
        // kill(2) or sigqueue(3) (si_code <= 0) would be lost, so it is raised again (blocked
        // while this handler runs, it is delivered on return).
        if code <= 0 {
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_address_range_and_parent() {
        let l = message(0x7f00_0000_1000, 0x7f00_0000_0000, 0x7f00_0010_0000, 4242);
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert!(s.starts_with("usermm: SIGSEGV at 0x7f0000001000: "), "{s}");
        assert!(s.contains("fork() child of pid 4242"), "{s}");
        assert!(s.contains("(0x7f0000000000-0x7f0000100000)"), "{s}");
        assert!(s.contains("spawn") && s.ends_with(".\n"), "{s}");
        assert_eq!(l.len, s.len());
    }

    #[test]
    fn ranges_are_remembered_until_forgotten() {
        let m = crate::Mapping::anon(8 * 4096, 0).unwrap();
        assert!(!is_remembered(m.addr()));
        m.advise(0, m.len(), crate::Advice::DontFork).unwrap();
        assert!(is_remembered(m.addr()) && is_remembered(m.addr() + m.len() - 1));
        assert!(!is_remembered(m.addr() + m.len()));
        let a = m.addr();
        drop(m);
        assert!(!is_remembered(a));
    }
}
