//! The kernel engine after a SIGKILL of the harness (issue 16 part 7): `usermm bench
//! --engine kernel` killed in the middle of a run cannot tear down its memory cgroup, its swap
//! area (zram device or swap file) or its state file; the next kernel-engine run must remove
//! them all, also when the killed run had not recorded them yet (they are found by the pid in
//! their names). Needs root and a memory cgroup controller (CI has both; USERMM_TEST_STRICT=1
//! turns a skip into a failure).
//!
//! One test in its own binary: the other kernel-engine tests (engines.rs) would otherwise run
//! alongside and clean this test's leftovers before it looked at them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[macro_use]
mod kernel_common;
use kernel_common::{start_long_kernel_run, swap_active, swaps};

const BIN: &str = env!("CARGO_BIN_EXE_usermm");

/// The kernel engine's state directory (kernel/mod.rs `state_dir`).
fn state_dir() -> PathBuf {
    if Path::new("/run").is_dir() {
        PathBuf::from("/run/usermm-kernel-engine")
    } else {
        std::env::temp_dir().join("usermm-kernel-engine")
    }
}

/// What a run recorded in its state file: (cgroup dir, swap device, zram id), once the cgroup
/// exists and holds the worker, with the swap area active.
struct Midway {
    cgroup: PathBuf,
    swap_dev: String,
    zram: Option<u64>,
    workers: Vec<u32>,
}

/// Waits (bounded) until run `child` is midway: its state file names a cgroup holding its
/// worker and an active swap area.
fn wait_midway(child: &mut Child) -> Midway {
    let state = state_dir().join(format!("state-{}.json", child.id()));
    let t0 = Instant::now();
    loop {
        if let Some(st) = std::fs::read_to_string(&state)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        {
            let cgroup = st["cgroup"].as_str().map(PathBuf::from);
            let dev = st["swap"]["dev"].as_str().map(str::to_string);
            if let (Some(cgroup), Some(dev), true) = (cgroup, dev, st["swap"]["active"] == true) {
                let workers: Vec<u32> = std::fs::read_to_string(cgroup.join("cgroup.procs"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect();
                if !workers.is_empty() && swap_active(&dev) {
                    return Midway {
                        cgroup,
                        swap_dev: dev,
                        zram: st["swap"]["zram"].as_u64(),
                        workers,
                    };
                }
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).ok();
            panic!("the run ended ({status}) before it was midway: {err}");
        }
        // Generous: another kernel-engine run on the machine holds the engine's lock meanwhile.
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "run {} never got midway (state file {})",
            child.id(),
            state.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A run this test started: if the test fails before it SIGKILLs it, dropping the guard
/// interrupts it (SIGINT: it tears down what it set up) and waits, so that a failed test does
/// not leave a long benchmark running.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = usermm_sys::kill(self.0.id(), libc::SIGINT);
            let _ = self.0.wait();
        }
    }
}

fn sigkill(child: &mut Child) {
    child.kill().expect("SIGKILL");
    let st = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9), "{st}");
}

/// A process that is gone or a zombie (its parent died; init reaps it).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Nothing of run `m` (of harness `pid`) is left: cgroup, swap area, zram device, swap file,
/// state file, worker.
fn assert_nothing_left(pid: u32, m: &Midway, what: &str) {
    assert!(
        !m.cgroup.exists(),
        "{what}: cgroup {} left behind",
        m.cgroup.display()
    );
    assert!(
        !swap_active(&m.swap_dev),
        "{what}: swap {} still active:\n{}",
        m.swap_dev,
        swaps()
    );
    if let Some(id) = m.zram {
        assert!(
            !Path::new(&format!("/sys/block/zram{id}")).exists(),
            "{what}: zram{id} not removed"
        );
    } else {
        assert!(
            !Path::new(&m.swap_dev).exists(),
            "{what}: swap file {} left behind",
            m.swap_dev
        );
    }
    let state = state_dir().join(format!("state-{pid}.json"));
    assert!(!state.exists(), "{what}: {} left behind", state.display());
    for w in &m.workers {
        assert!(gone(*w), "{what}: worker {w} still runs");
    }
}

#[test]
fn kernel_engine_sigkilled_harness_is_cleaned_up_by_the_next_run() {
    need_kernel_engine!();
    // Swap files go to $TMPDIR: a directory of this test's own, on a file system that can hold
    // a swap file (not tmpfs).
    let tmp = PathBuf::from(format!(
        "/var/tmp/usermm-kernel-kill-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&tmp).unwrap();

    // A: zram, SIGKILLed midway. Its cgroup, zram swap and state file stay behind.
    let mut a = Run(start_long_kernel_run("ram", Some(&tmp)));
    let pid_a = a.0.id();
    let ma = wait_midway(&mut a.0);
    sigkill(&mut a.0);
    assert!(
        ma.cgroup.exists() && swap_active(&ma.swap_dev),
        "a SIGKILLed run cannot tear down (nothing to clean up otherwise)"
    );

    // B: a swap file. Its start cleans up after A; SIGKILLed midway in turn, and its state
    // file removed, as if it had been killed before it recorded what it made: the next run
    // finds the cgroup and the swap file by the pid in their names.
    let mut b = Run(start_long_kernel_run("file", Some(&tmp)));
    let pid_b = b.0.id();
    let mb = wait_midway(&mut b.0);
    assert_nothing_left(pid_a, &ma, "after the run following a SIGKILLed zram run");
    sigkill(&mut b.0);
    std::fs::remove_file(state_dir().join(format!("state-{pid_b}.json"))).unwrap();
    assert!(
        mb.cgroup.exists() && swap_active(&mb.swap_dev) && Path::new(&mb.swap_dev).exists(),
        "B's cgroup and active swap file are left"
    );

    // C: a whole run. It removes B's leftovers, then tears down its own.
    let out = Command::new(BIN)
        .args([
            "bench",
            "swap-w-seq",
            "--engine",
            "kernel",
            "--budget",
            "16M",
            "--swap",
            "file",
            "--swap-size",
            "48M",
            "--json",
        ])
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run C failed ({}): {err}", out.status);
    assert_nothing_left(
        pid_b,
        &mb,
        "after the run following a SIGKILLed swap-file run",
    );
    assert!(
        err.contains(&format!("usermm-kernel-{pid_b}")),
        "run C names what it removed: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cg_c = v["setup"]["cgroup_path"].as_str().unwrap();
    assert!(!Path::new(cg_c).exists(), "run C left its cgroup {cg_c}");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "files left in {}: {left:?}", tmp.display());
    let tmp_s = tmp.display().to_string();
    assert!(!swaps().contains(&tmp_s), "swap left:\n{}", swaps());
    std::fs::remove_dir(&tmp).unwrap();
}
