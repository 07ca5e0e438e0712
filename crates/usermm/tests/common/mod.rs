//! Helpers shared by the integration tests: manager construction, deterministic data patterns,
//! child-process runs for accesses that must raise SIGBUS, kernel-mode probes of managed memory,
//! process RSS and a watchdog that turns a hang into a clear failure.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use usermm::{Behaviour, Mm, MmConfig, Settings, SwapConfig, Switch};

pub const PAGE: usize = 4096;
pub const MIB: u64 = 1 << 20;

/// Environment variable that selects a child-process helper mode (its value: the test name).
pub const CHILD_ENV: &str = "USERMM_TEST_CHILD";

/// Set by CI (`.ci/run`): a test that would skip because this machine lacks a feature or
/// privilege fails instead, since CI's machine has them all.
pub const STRICT_ENV: &str = usermm_sys::TEST_STRICT_ENV;

/// Skips the rest of a test (the caller returns) with a visible reason, or fails the test when
/// [`STRICT_ENV`] is set: a skip in CI would hide a check that never ran.
pub fn skip(why: &str) {
    usermm_sys::skip_test(why);
}

pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// A manager with `budget` bytes and a RAM swap device of `swap` bytes.
pub fn mm_ram(budget: u64, swap: u64) -> Mm {
    Mm::new(MmConfig::new(budget).swap(SwapConfig::Ram { size: swap }))
        .expect("creating a memory manager")
}

/// [`mm_ram`] whose swap-ins keep their slots (`swapin_cache=keep`), with clean swap-cache
/// pages mapped write-protected (`anon_clean=wp`, `hash` false) or writable with their hash
/// recorded (`anon_clean=hash`).
pub fn mm_ram_anon_clean(budget: u64, swap: u64, hash: bool) -> Mm {
    let b = if hash { Behaviour::New } else { Behaviour::Old };
    Mm::new(
        MmConfig::new(budget)
            .swap(SwapConfig::Ram { size: swap })
            .settings(
                Settings::default()
                    .with(Switch::AnonClean, b)
                    .with(Switch::SwapinCache, Behaviour::Old),
            ),
    )
    .expect("creating a memory manager")
}

/// The replacement policies a test runs over: `lru_gen=off` (the two-list LRU) and `on`.
pub const LRU_GEN: [bool; 2] = [false, true];

/// [`mm_ram`] with the replacement policy chosen (`lru_gen=on|off`).
pub fn mm_ram_lru_gen(budget: u64, swap: u64, lru_gen: bool) -> Mm {
    mm_ram_mode(budget, swap, lru_gen, false)
}

/// The (replacement policy, fault path) pairs the stress tests run over: both policies with
/// the handler threads, and the two-list LRU with faults served on the faulting thread
/// (`fault_path=sigbus`).
pub const MODES: [(bool, bool); 3] = [(false, false), (true, false), (false, true)];

/// Both fault paths as `Switch::FaultPath` values: handler threads (old), the faulting thread
/// itself (new, `fault_path=sigbus`).
pub const FAULT_PATHS: [Behaviour; 2] = [Behaviour::Old, Behaviour::New];

/// [`mm_ram`] with the replacement policy (`lru_gen=on|off`) and the fault path
/// (`fault_path=sigbus|handler`) chosen.
pub fn mm_ram_mode(budget: u64, swap: u64, lru_gen: bool, sigbus: bool) -> Mm {
    let b = |on: bool| if on { Behaviour::New } else { Behaviour::Old };
    Mm::new(
        MmConfig::new(budget)
            .swap(SwapConfig::Ram { size: swap })
            .settings(
                Settings::default()
                    .with(Switch::LruGen, b(lru_gen))
                    .with(Switch::FaultPath, b(sigbus)),
            ),
    )
    .expect("creating a memory manager")
}

/// splitmix64: a well-mixed, deterministic 64-bit value.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The value a test stores at (`tag`, `page`, `word`): never zero, so a page that silently
/// turned into zeros is always caught.
pub fn pattern(tag: u64, page: u64, word: u64) -> u64 {
    mix(tag.wrapping_mul(0x1_0000_0001) ^ page.wrapping_mul(4099) ^ word.wrapping_mul(0x5555)) | 1
}

/// True when this process is the child started by [`run_child`] for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

/// How long a child test process may run before [`run_child`] kills it and fails.
pub const CHILD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Re-runs this test binary for test `name` alone, in a child process marked by [`CHILD_ENV`].
/// A child still running after [`CHILD_TIMEOUT`] is killed and the test fails with what it
/// printed (a hang fails instead of stalling CI).
pub fn run_child(name: &str) -> Output {
    run_child_within(name, CHILD_TIMEOUT)
}

/// [`run_child`] with its own time limit.
pub fn run_child_within(name: &str, limit: std::time::Duration) -> Output {
    run_child_env(name, limit, &[])
}

/// [`run_child_within`] with extra environment variables for the child.
pub fn run_child_env(name: &str, limit: std::time::Duration, env: &[(&str, &str)]) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env("RUST_LOG", "off")
        // After RUST_LOG: a caller may turn the child's log on.
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child test process");
    // Drain both pipes on their own threads so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("child stdout")));
    let err = drain(Box::new(child.stderr.take().expect("child stderr")));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child
            .try_wait()
            .expect("waiting for the child test process")
        {
            break st;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            );
            panic!(
                "child {name} still running after {limit:?}: killed\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Runs child test `name` and asserts it was killed by SIGBUS after printing `marker` on stderr.
/// Returns the child's stderr.
pub fn expect_child_sigbus(name: &str, marker: &str) -> String {
    expect_child_sigbus_env(name, marker, &[])
}

/// [`expect_child_sigbus`] with extra environment variables for the child.
pub fn expect_child_sigbus_env(name: &str, marker: &str, env: &[(&str, &str)]) -> String {
    use std::os::unix::process::ExitStatusExt;
    let out = run_child_env(name, CHILD_TIMEOUT, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stderr.contains(marker),
        "child {name} never printed {marker:?} (status {:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child {name} should die of SIGBUS (7), status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stderr
}

/// VmRSS of this process in KiB.
pub fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Runs `f` on its own thread and fails with a clear message if it does not finish within
/// `secs` seconds (a hang fails the test instead of stalling CI). Panics of `f` propagate.
pub fn with_watchdog<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::Builder::new()
        .name(format!("watched: {what}"))
        .spawn(move || {
            let v = f();
            let _ = tx.send(());
            v
        })
        .expect("spawning the watched thread");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().expect("watched thread"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {secs} s (deadlock or livelock in the fault/reclaim path?)")
        }
    }
}

/// Waits (at most 2 s) until the manager's counters stop changing. A fault handler wakes the
/// faulting thread before it has finished its bookkeeping (page-table entry published, counters
/// bumped), so snapshots taken right after an access may lag it by a few microseconds.
pub fn settle(mm: &Mm) {
    mm.settle(Duration::from_secs(2));
}

/// Polls `f` for up to 5 s; true as soon as it holds.
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// Pushes everything reclaimable out: lets pending faults finish, then `reclaim_to(0)`.
/// Returns the pages reclaimed.
pub fn reclaim_all(mm: &Mm) -> u64 {
    settle(mm);
    let n = mm.reclaim_to(0);
    settle(mm);
    n
}

/// A barrier that fails instead of hanging when one of its threads has panicked: a thread that
/// fails calls [`AbortBarrier::abort`] (see [`AbortBarrier::guard`]) and every waiter panics.
pub struct AbortBarrier {
    n: usize,
    state: std::sync::Mutex<(usize, u64, bool)>, // (arrived, generation, aborted)
    cv: std::sync::Condvar,
}

impl AbortBarrier {
    pub fn new(n: usize) -> Self {
        AbortBarrier {
            n,
            state: std::sync::Mutex::new((0, 0, false)),
            cv: std::sync::Condvar::new(),
        }
    }
    pub fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!s.2, "another thread failed");
        let gen = s.1;
        s.0 += 1;
        if s.0 == self.n {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return;
        }
        while s.1 == gen && !s.2 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        assert!(!s.2, "another thread failed");
    }
    pub fn abort(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.2 = true;
        self.cv.notify_all();
    }
    /// Aborts the barrier if dropped while the thread is panicking.
    pub fn guard(&self) -> AbortOnPanic<'_> {
        AbortOnPanic(self)
    }
}

pub struct AbortOnPanic<'a>(&'a AbortBarrier);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort();
        }
    }
}

/// Lets pending faults finish, then checks the manager's frame/page-table accounting.
pub fn assert_consistent(mm: &Mm) {
    settle(mm);
    let bad = mm.audit();
    assert!(
        bad.is_empty(),
        "page accounting is inconsistent ({} problems):\n{}",
        bad.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}
