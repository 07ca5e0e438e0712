//! What the kernel-engine tests (engines.rs, kernel_kill.rs) share: whether the engine can run
//! here, and the active swap areas.
#![allow(dead_code)]

/// Why the kernel engine cannot run here, or None when it can.
pub fn kernel_skip_reason() -> Option<String> {
    let euid = usermm_sys::geteuid();
    if euid != 0 {
        return Some(format!("not root (euid {euid})"));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if !mounts.contains(" - cgroup") {
        return Some("no cgroup filesystem mounted".into());
    }
    None
}

/// Returns from the test with a visible reason when the kernel engine cannot run here; fails
/// instead under USERMM_TEST_STRICT=1 (CI, which is root with a memory cgroup: a skip there
/// would hide a kernel-engine check that never ran).
macro_rules! need_kernel_engine {
    () => {
        if let Some(r) = kernel_common::kernel_skip_reason() {
            usermm_sys::skip_test(&format!("the kernel engine cannot run here: {r}"));
            return;
        }
    };
}

/// Active swap areas (/proc/swaps).
pub fn swaps() -> String {
    std::fs::read_to_string("/proc/swaps").unwrap()
}

/// Whether `dev` is an active swap area.
pub fn swap_active(dev: &str) -> bool {
    swaps()
        .lines()
        .any(|l| l.split_whitespace().next() == Some(dev))
}

/// Starts a kernel-engine bench that runs long (200 swap-w-seq runs of 32M + 256M of swap
/// `swap`, verification off), output: stderr piped; `tmpdir` is its `$TMPDIR` (the swap file's
/// directory) when given.
pub fn start_long_kernel_run(swap: &str, tmpdir: Option<&std::path::Path>) -> std::process::Child {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_usermm"));
    c.args([
        "bench",
        "swap-w-seq",
        "--engine",
        "kernel",
        "--runs",
        "200",
        "--budget",
        "32M",
        "--swap",
        swap,
        "--swap-size",
        "256M",
        "--no-verify",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    if let Some(t) = tmpdir {
        c.env("TMPDIR", t);
    }
    c.spawn().expect("starting usermm")
}
