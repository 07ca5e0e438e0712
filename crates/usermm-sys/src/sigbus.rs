//! The faulting thread's side of a userfaultfd opened with `UFFD_FEATURE_SIGBUS`: a
//! process-wide SIGBUS handler that hands a fault in a managed range to the memory manager on
//! the faulting thread itself, and every other SIGBUS to the handler that was installed before
//! it. Mirrors the receiving end of `arch/x86/mm/fault.c` (`do_user_addr_fault` ->
//! `mm_fault_error` -> `do_sigbus`): with the feature, `handle_userfault` returns
//! `VM_FAULT_SIGBUS` instead of queueing a message, and the kernel delivers SIGBUS
//! (`BUS_ADRERR`) to the thread with the address and the page-fault error code.
//!
//! What runs in signal context: the hook (the core's fault path) with every maskable signal
//! blocked, on the thread's own stack (not the alternate stack: Rust's per-thread alternate
//! stack is a few KiB and the fault path needs more). The hook must not take a lock the
//! interrupted code can hold; the core's rule that no code touching managed memory holds a
//! lock the fault path needs (already required for the handler threads, which would deadlock
//! the same way) is what makes that true. errno is saved and restored around it.
//!
//! Chaining: a SIGBUS that is not a fault in a managed range (a real `BUS_ADRERR` beyond the
//! end of a mapped file, `BUS_MCEERR_AR` from a poisoned page, a `kill -BUS`) goes to the
//! handler that was installed before ours, called as it asked to be (`SA_SIGINFO` or not);
//! if that was the default action (or ignore, which a synchronous fault cannot honour), the
//! default is restored and the signal takes effect as it would have without usermm. A handler
//! installed after ours replaces it; [`installed`] tells whether ours is still in place.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Result, SysError, Syscall};

/// The core's fault path: `(address, write, protection)` -> whether the address was a managed
/// page it served (true: the access is retried) or not (false: the signal is chained).
/// `protection` is set when the page was present (a write-protect fault).
pub type FaultHook = fn(addr: usize, write: bool, protection: bool) -> bool;

/// The hook as an address (0: none yet).
static HOOK: AtomicUsize = AtomicUsize::new(0);
/// The disposition SIGBUS had before ours (its handler, and whether it takes siginfo), read
/// whenever ours is (re)installed: a handler that replaced ours is chained once ours is back.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_SIGINFO: AtomicBool = AtomicBool::new(false);
static INSTALL: Mutex<()> = Mutex::new(());

/// x86 page-fault error code bits (`arch/x86/include/asm/trap_pf.h`).
const X86_PF_PROT: u64 = 1 << 0;
const X86_PF_WRITE: u64 = 1 << 1;

/// Installs the process-wide SIGBUS handler that calls `hook` for `BUS_ADRERR` faults. Once
/// per process; later calls are no-ops while it is in place, and reinstall it (chaining to
/// the replacement) if a handler installed since replaced it. Only x86-64 reports whether a fault was a write; elsewhere this
/// fails (the caller keeps the handler-thread path).
pub fn install(hook: FaultHook) -> Result<()> {
    if !cfg!(target_arch = "x86_64") {
        return Err(SysError::arg(
            Syscall::Sigaction,
            "faults served on the faulting thread (fault_path=sigbus) need x86-64: the \
             page-fault error code is read from its signal context; use fault_path=handler",
        ));
    }
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    HOOK.store(hook as usize, Ordering::Release);
    if installed() {
        return Ok(());
    }
    // Not ours (checked above): the program's (or the Rust runtime's) handler. The flag is
    // stored first: a chain racing with this sees the old handler with at worst the new flag.
    let old = current()?;
    PREV_SIGINFO.store(old.sa_flags & libc::SA_SIGINFO != 0, Ordering::Release);
    PREV_HANDLER.store(old.sa_sigaction, Ordering::Release);
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset_t owned by `act`.
    unsafe { libc::sigfillset(&mut act.sa_mask) };
    // SAFETY: `act` is fully initialised; the old action is not needed (read above).
    let rc = unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(SysError::last(
            Syscall::Sigaction,
            "installing usermm's handler",
        ));
    }
    Ok(())
}

/// Whether usermm's SIGBUS handler is the one installed now.
pub fn installed() -> bool {
    current().is_ok_and(|a| a.sa_sigaction == on_sigbus as *const () as usize)
}

fn current() -> Result<libc::sigaction> {
    // SAFETY: an all-zero sigaction is a valid out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`.
    let rc = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) };
    if rc != 0 {
        return Err(SysError::last(
            Syscall::Sigaction,
            "reading the current handler",
        ));
    }
    Ok(old)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
    let code = unsafe { (*info).si_code };
    let hook = HOOK.load(Ordering::Acquire);
    let mut served = false;
    if code == libc::BUS_ADRERR && hook != 0 {
        // SAFETY: si_addr is valid for a fault-generated SIGBUS (si_code > 0).
        let addr = unsafe { (*info).si_addr() } as usize;
        let err = error_code(ctx);
        // SAFETY: HOOK only ever holds a `FaultHook` stored by `install`.
        let f: FaultHook = unsafe { std::mem::transmute::<usize, FaultHook>(hook) };
        served = f(addr, err & X86_PF_WRITE != 0, err & X86_PF_PROT != 0);
    }
    if !served {
        chain(sig, info, ctx, code);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The page-fault error code the kernel saved in the signal frame (`set_signal_archinfo`).
#[cfg(target_arch = "x86_64")]
fn error_code(ctx: *mut libc::c_void) -> u64 {
    let uc = ctx as *const libc::ucontext_t;
    // SAFETY: with SA_SIGINFO the third argument is this thread's ucontext_t.
    unsafe { (*uc).uc_mcontext.gregs[libc::REG_ERR as usize] as u64 }
}

#[cfg(not(target_arch = "x86_64"))]
fn error_code(_ctx: *mut libc::c_void) -> u64 {
    // Not reached: `install` refuses other architectures.
    X86_PF_WRITE
}

/// Hands a SIGBUS that is not ours to the disposition it had before usermm.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, code: i32) {
    let handler = PREV_HANDLER.load(Ordering::Acquire);
    let siginfo = PREV_SIGINFO.load(Ordering::Acquire);
    match handler {
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: an all-zero sigaction with SIG_DFL (0) restores the default action.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: sigaction is async-signal-safe; `dfl` is valid.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
            if code <= 0 {
                // Sent, not caused by this instruction: re-executing it would not raise it
                // again, so raise it; it is delivered (fatally) when this handler returns.
                // SAFETY: raise is async-signal-safe.
                unsafe { libc::raise(sig) };
            }
        }
        h if siginfo => {
            // SAFETY: the program installed `h` with SA_SIGINFO, so this is its signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: installed without SA_SIGINFO: a one-argument handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}
