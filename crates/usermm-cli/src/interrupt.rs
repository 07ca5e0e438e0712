//! The process's interruption flag. Once [`catch_signals`] ran, SIGINT, SIGTERM and SIGHUP
//! only set a flag: the workload loops poll [`interrupted`], the kernel engine kills its worker,
//! and its guard tears down swap and cgroup before the command exits with status 130. A
//! watchdog exits after a grace period if the workload does not stop (a task stuck in a fault),
//! calling the last resort registered by the engine in use first.
//!
//! A leaf module: the workloads (bench/), the engines and the kernel engine all use it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Once, OnceLock};
use std::time::Duration;

use crate::Failure;

/// What the watchdog runs before it exits (the kernel engine's emergency teardown).
static LAST_RESORT: OnceLock<fn()> = OnceLock::new();

/// Registers what the watchdog runs before exiting an interrupted run that did not stop.
pub fn set_last_resort(f: fn()) {
    let _ = LAST_RESORT.set(f);
}

static INTERRUPT: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));
static HANDLERS: Once = Once::new();

/// True once SIGINT/SIGTERM/SIGHUP arrived (only after [`catch_signals`]).
pub fn interrupted() -> bool {
    INTERRUPT.load(Ordering::Relaxed)
}

/// From now on, SIGINT, SIGTERM and SIGHUP set the interruption flag instead of killing the
/// process, so that the kernel engine can tear down what it set up.
pub fn catch_signals() -> Result<(), Failure> {
    let mut err = None;
    HANDLERS.call_once(|| {
        for sig in [
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ] {
            if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&INTERRUPT)) {
                err = Some(Failure::Run(format!(
                    "cannot install the signal handler: {e}"
                )));
            }
        }
        // The workload loops poll the flag; a task stuck in a fault never will. Past a grace
        // period, tear the kernel engine down from here and exit.
        let _ = std::thread::Builder::new()
            .name("interrupt-watchdog".into())
            .spawn(|| {
                while !interrupted() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::thread::sleep(INTERRUPT_GRACE);
                eprintln!(
                    "usermm: interrupted, and the workload did not stop within {} s (a task \
                     is stuck); exiting",
                    INTERRUPT_GRACE.as_secs()
                );
                if let Some(f) = LAST_RESORT.get() {
                    f();
                }
                std::process::exit(130);
            });
    });
    err.map_or(Ok(()), Err)
}

/// How long an interrupted benchmark may take to stop by itself.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
