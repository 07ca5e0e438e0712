//! The userfaultfd reader threads. Mirrors the reading side of `fs/userfaultfd.c`
//! (`userfaultfd_read`, `handle_userfault` wakeups) as a pool of handler threads.
//!
//! Every handler reads the manager's (non-blocking) userfaultfd in batches, so 64 faulting
//! threads are served by all handlers at once, never through one reader. A fault whose page is
//! locked by reclaim is deferred and retried by the same handler after the others, so one stuck
//! page never blocks the rest. An idle handler spins for `handler_spin_us` before it sleeps in
//! poll(2) (at most one handler spins at a time): on this VM a sleeping handler costs a
//! cross-vCPU wakeup of 24-50 us per fault, a spinning one does not.
//!
//! The re-fault tripwire ([`RefaultTrack`]): a thread whose fault was answered faults again at
//! once at the same address only if the answer did not map the page. [`REFAULT_TRIP`] such
//! faults in a row are logged with the page's entry and descriptor, counted
//! (`fault_refault_tripwire`) and resolved from scratch instead of being answered again.

use std::time::{Duration, Instant};

use crate::sync::{Arc, AtomicU32, Ordering};
use crate::sys::uffd::{event, Msg};
use crate::vmstat::Item;

use super::memory::{handle_fault, resolve_from_scratch, Fault};
use super::MmInner;

/// Consecutive faults of one thread at one page that trip the wire. A thread faults again at the
/// page it just faulted on only when its page was taken again before it could use it (reclaim
/// unmapping it at once, a few times at most) or when the answer did not map it.
pub const REFAULT_TRIP: u32 = 16;

const TRACK_SLOTS: usize = 64;

/// Per thread (hashed by thread id), the last faulting page and how many faults in a row hit it.
/// Approximate by design (two threads may share a slot and reset each other's count): it only
/// has to notice a thread stuck on one address, never to account exactly.
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

/// Serves one fault message, through the tripwire.
fn serve(m: &MmInner, msg: &Msg) -> Fault {
    let (addr, flags, tid) = (msg.fault_address(), msg.fault_flags(), msg.fault_tid());
    let n = m.refaults.note(tid, addr);
    if n >= REFAULT_TRIP {
        m.refaults.reset(tid);
        return resolve_from_scratch(m, addr, flags, n);
    }
    handle_fault(m, addr, flags)
}

pub fn handler_main(m: Arc<MmInner>) {
    let mut msgs = [Msg::default(); 32];
    let mut deferred: Vec<(usize, u64)> = Vec::new();
    let spin = Duration::from_micros(m.cfg.handler_spin_us as u64);
    let mut last_work = Instant::now();
    loop {
        if m.shutdown.load(Ordering::Acquire) {
            return;
        }
        let n = match m.uffd.read_msgs(&mut msgs) {
            Ok(n) => n,
            Err(e) => {
                log::error!("reading userfaultfd: {e}");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        for msg in &msgs[..n] {
            match msg.event {
                event::PAGEFAULT => {
                    if serve(&m, msg) == Fault::Retry {
                        deferred.push((msg.fault_address(), msg.fault_flags()));
                    }
                }
                other => log::debug!("userfaultfd event {other:#x} ignored"),
            }
        }
        if n > 0 {
            last_work = Instant::now();
            continue;
        }
        if !deferred.is_empty() {
            let before = deferred.len();
            deferred.retain(|&(a, f)| handle_fault(&m, a, f) == Fault::Retry);
            if deferred.len() < before {
                last_work = Instant::now();
            } else {
                // Pages still under I/O: wait a little for new messages instead of spinning.
                let _ = m.uffd.poll(Some(m.shutdown_efd.raw_fd()), 1);
            }
            continue;
        }
        if last_work.elapsed() < spin
            && m.spinners
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // Spin (as the only spinner) until a message arrives or the window closes.
            let mut hit = false;
            while last_work.elapsed() < spin {
                match m.uffd.read_msgs(&mut msgs[..1]) {
                    Ok(1) => {
                        hit = true;
                        m.vm.inc(Item::HandlerSpinHit);
                        if msgs[0].event == event::PAGEFAULT && serve(&m, &msgs[0]) == Fault::Retry
                        {
                            deferred.push((msgs[0].fault_address(), msgs[0].fault_flags()));
                        }
                        break;
                    }
                    _ => std::hint::spin_loop(),
                }
            }
            m.spinners.store(0, Ordering::Release);
            if hit {
                last_work = Instant::now();
            }
            continue;
        }
        m.vm.inc(Item::HandlerWakeup);
        let _ = m.uffd.poll(Some(m.shutdown_efd.raw_fd()), 100);
        last_work = Instant::now() - spin;
    }
}
