//! The userfaultfd reader threads. Mirrors the reading side of `fs/userfaultfd.c`
//! (`userfaultfd_read`, `handle_userfault` wakeups) as a pool of handler threads.
//!
//! Every handler reads the manager's (non-blocking) userfaultfd in batches, so 64 faulting
//! threads are served by all handlers at once, never through one reader. A fault whose page is
//! locked by reclaim is deferred and retried by the same handler after the others, so one stuck
//! page never blocks the rest. An idle handler spins for `handler_spin_us` before it sleeps in
//! poll(2) (at most one handler spins at a time): on this VM a sleeping handler costs a
//! cross-vCPU wakeup of 24-50 us per fault, a spinning one does not.

use std::time::{Duration, Instant};

use crate::sync::{Arc, Ordering};
use crate::sys::uffd::{event, Msg};
use crate::vmstat::Item;

use super::memory::{handle_fault, Fault};
use super::MmInner;

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
                    if handle_fault(&m, msg.fault_address(), msg.fault_flags()) == Fault::Retry {
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
                        if msgs[0].event == event::PAGEFAULT
                            && handle_fault(&m, msgs[0].fault_address(), msgs[0].fault_flags())
                                == Fault::Retry
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
