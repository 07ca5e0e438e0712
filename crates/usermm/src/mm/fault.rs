//! The faulting thread's own fault path (`fault_path=sigbus`). Mirrors `arch/x86/mm/fault.c`'s
//! `do_user_addr_fault`: the thread that touched the page finds the region and runs
//! `handle_mm_fault` (here [`handle_fault`](super::memory::handle_fault)) itself, with no
//! handler thread and no wakeup in between.
//!
//! A manager opened with `fault_path=sigbus` asks for `UFFD_FEATURE_SIGBUS`, so the kernel
//! raises SIGBUS in the faulting thread instead of queueing a message; the process-wide
//! handler (`sys::sigbus`) calls [`do_user_addr_fault`], which looks the address up in the
//! managers that serve their faults this way and serves it on the spot: the same code, the
//! same panic guard and re-fault tripwire as the handler threads. A fault that must wait for a
//! locked page (reclaim I/O) is retried in place with a growing pause, recorded in a watchdog
//! slot meanwhile. An address no such manager owns is not ours: the signal goes on to the
//! program's own handler or the default action.
//!
//! What it costs the user: a kernel-mode access (`read(2)` into a region page that is not
//! resident) fails with EFAULT instead of waiting for a handler, because the kernel cannot
//! deliver a signal in the middle of a system call; and a SIGBUS handler installed after the
//! manager must chain to the one it replaces. Hence `handler` stays the default
//! (docs/fault_path.md has the measurements).

use crate::sync::{Arc, RwLock};
use std::sync::Weak;
use std::time::Duration;

use crate::error::{Error, Result, UffdError};
use crate::sys::uffd::pf;
use crate::vmstat::Item;

use super::handler::{catch_retry, serve_guarded, SELF_SLOTS};
use super::memory::{owns, Fault};
use super::MmInner;

/// The managers whose faults arrive as SIGBUS. Read in signal context: the lock is taken for
/// writing only when a manager starts or stops, never by code that touches managed memory.
static SELF_SERVED: RwLock<Vec<Weak<MmInner>>> = RwLock::new(Vec::new());

/// Starts serving `m`'s faults on the faulting threads (its userfaultfd has
/// `UFFD_FEATURE_SIGBUS`): installs the process's SIGBUS handler if needed.
pub(crate) fn enable(m: &Arc<MmInner>) -> Result<()> {
    crate::sys::sigbus::install(do_user_addr_fault)
        .map_err(|e| Error::from(UffdError::Sigbus { source: e }))?;
    let mut t = SELF_SERVED.write();
    t.retain(|w| w.strong_count() > 0);
    t.push(Arc::downgrade(m));
    Ok(())
}

/// Stops looking up `m` (its teardown; its regions are gone by then).
pub(crate) fn disable(m: &MmInner) {
    SELF_SERVED
        .write()
        .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), m));
}

/// The SIGBUS hook: serves a fault at `addr` if a self-serving manager owns it. `write` and
/// `protection` are the page-fault error code's bits: a write to a present page is a
/// write-protect fault.
fn do_user_addr_fault(addr: usize, write: bool, protection: bool) -> bool {
    let found = {
        let t = SELF_SERVED.read();
        t.iter()
            .filter_map(Weak::upgrade)
            .find_map(|m| owns(&m, addr).map(|poisoned| (m, poisoned)))
    };
    let Some((m, poisoned)) = found else {
        return false;
    };
    if poisoned {
        // Its contents are lost (a read error, no memory, beyond the end of the file): the
        // signal is the answer. Without CONFIG_MEMORY_FAILURE the poison marker raises
        // BUS_ADRERR too, so it arrives here and goes on to the program's handler.
        return false;
    }
    let mut flags = 0;
    if write {
        flags |= pf::WRITE;
        if protection {
            flags |= pf::WP;
        }
    }
    let tid = crate::sys::gettid().unsigned_abs();
    m.vm.inc(Item::FaultSelfServed);
    if serve_guarded(&m, addr, flags, tid) == Fault::Done {
        return true;
    }
    // A page it needs is locked (under I/O): wait here, as the handler threads defer it.
    let slot = &m.handlers.slots[m.handlers.slots.len() - SELF_SLOTS + tid as usize % SELF_SLOTS];
    slot.defer(&m.handlers, addr);
    let mut i = 0u32;
    while catch_retry(&m, addr, flags) == Fault::Retry {
        if m.handlers.shutdown.load(crate::sync::Ordering::Acquire) {
            // Return and let the access fault again: either a region is still there and it
            // is served, or the signal goes on as not ours.
            break;
        }
        if i < 8 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(i.min(100)) * 10));
        }
        i += 1;
    }
    slot.clear_deferred();
    true
}
