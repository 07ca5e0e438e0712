//! The kernel engine (`--engine kernel`): the same workload code on plain kernel memory, inside
//! a memory cgroup whose limit is the budget, with kernel swap on zram or on a swap file the
//! harness sets up itself. The Linux side of usermm's side-by-side numbers.
//!
//! How one run goes: take the engine's lock (one kernel-engine run at a time on a machine:
//! swap areas are global), clean up after a run that was killed (its state file, and by name
//! what a run killed between creating a thing and recording it left: see [`reap_by_name`]),
//! set up swap
//! and the cgroup ([`Env`], a guard that tears both down on every path out: normal return,
//! error, panic, Ctrl-C/SIGTERM/SIGHUP via `engine`'s handler), start this binary again as a
//! hidden worker (`usermm __kernel-worker`), move it into the cgroup, then hand it the job on
//! its stdin. The worker ([`worker`]) maps plain anonymous memory (or writes a file), runs the
//! workload and prints its outcome as JSON; counters come from /proc/vmstat and the cgroup's
//! memory.stat, read by the worker around each phase.
//!
//! Root is required: creating a memory cgroup, swapon and zram all need CAP_SYS_ADMIN.

pub mod cgroup;
pub mod swap;
pub mod worker;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use usermm::{MmConfig, SwapConfig};

use crate::Failure;
use cgroup::Cgroup;
use swap::{KernelSwap, Spec};

/// What the kernel engine sets up for a run.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The cgroup's memory limit (bytes).
    pub budget: u64,
    pub swap: Spec,
}

impl Setup {
    /// The kernel setup matching a usermm configuration: the same budget, zram for `ram`, a
    /// swap file for `file` / `file:PATH` (in `$TMPDIR`, like usermm's), zswap (same
    /// compressor, default `max_pool_percent`) over a swap file for `zswap+DEVICE`, none for
    /// `none`.
    pub fn from_config(cfg: &MmConfig) -> Setup {
        Setup {
            budget: cfg.budget,
            swap: Self::spec(&cfg.swap),
        }
    }

    /// [`Setup::from_config`], or with the kernel swap device `spec` names (`ram`/`zram`,
    /// `file`, `zswap`/`zswap+file`, `none`) of the size `cfg`'s swap has: `--kernel-swap`,
    /// to put one usermm tier against another kernel one (usermm's compressed tier against
    /// zram).
    pub fn with_swap(cfg: &MmConfig, spec: Option<&str>) -> Result<Setup, String> {
        let Some(spec) = spec else {
            return Ok(Setup::from_config(cfg));
        };
        let size = cfg.swap.size().max(4096);
        let swap = match spec {
            "ram" | "zram" => SwapConfig::Ram { size },
            "file" => SwapConfig::File { path: None, size },
            "zswap" | "zswap+file" => {
                SwapConfig::parse("zswap+file", size).map_err(|e| e.to_string())?
            }
            "none" => SwapConfig::None,
            other => {
                return Err(format!(
                "{other:?} is not a kernel swap device: use ram (zram), file, zswap+file or none"
            ))
            }
        };
        Ok(Setup::from_config(&MmConfig::new(cfg.budget).swap(swap)))
    }

    /// What the kernel swaps to, in a few words (for headers).
    pub fn swap_kind(&self) -> &'static str {
        match self.swap {
            Spec::None => "no swap",
            Spec::Zram { .. } => "zram",
            Spec::File { .. } => "a swap file",
            Spec::Zswap { .. } => "zswap over a swap file",
        }
    }

    fn spec(swap: &SwapConfig) -> Spec {
        match swap {
            SwapConfig::Zswap { zswap, lower } => {
                let file = match Self::spec(lower) {
                    f @ Spec::File { .. } => f,
                    // The kernel's zswap sits in front of a swap device; use a file of the size
                    // the lower tier has.
                    _ => Spec::File {
                        path: None,
                        dir: std::env::temp_dir(),
                        size: lower.size(),
                    },
                };
                Spec::Zswap {
                    compressor: match zswap.compressor {
                        usermm::swap::Compressor::Lz4 => "lz4".into(),
                        usermm::swap::Compressor::Zstd(_) => "zstd".into(),
                    },
                    // The kernel bounds the pool by a share of all RAM only; keep its default.
                    max_pool_percent: 20,
                    file: Box::new(file),
                }
            }
            SwapConfig::Ram { size } => Spec::Zram { size: *size },
            SwapConfig::File { path, size } => match path {
                Some(p) if p.is_dir() => Spec::File {
                    path: None,
                    dir: p.clone(),
                    size: *size,
                },
                Some(p) => Spec::File {
                    path: Some(p.clone()),
                    dir: std::env::temp_dir(),
                    size: *size,
                },
                None => Spec::File {
                    path: None,
                    dir: std::env::temp_dir(),
                    size: *size,
                },
            },
            // The kernel has no remote tier: it swaps to a local file of the same size.
            SwapConfig::Redis(r) => Spec::File {
                path: None,
                dir: std::env::temp_dir(),
                size: r.size,
            },
            SwapConfig::None | SwapConfig::Device(_) => Spec::None,
        }
    }
}

/// The effective user id, from /proc/self/status (`Uid: real effective saved fs`).
fn euid() -> Option<u32> {
    let s = fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("Uid:"))?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// The error for a non-root user, or Ok for root.
pub fn check_root(euid: Option<u32>) -> Result<(), Failure> {
    match euid {
        Some(0) => Ok(()),
        other => Err(Failure::Run(format!(
            "the kernel engine needs root{}: it creates a memory cgroup (writes under \
             /sys/fs/cgroup), sets up kernel swap (swapon needs CAP_SYS_ADMIN) and adds a zram \
             device; run it as root (e.g. with sudo), or use --engine usermm, which needs no \
             privileges",
            match other {
                Some(u) => format!(" (running as uid {u})"),
                None => String::new(),
            }
        ))),
    }
}

/// Fails unless this process runs as root.
pub fn require_root() -> Result<(), Failure> {
    check_root(euid())
}

/// The directory for the engine's lock and state files.
fn state_dir() -> PathBuf {
    let run = Path::new("/run");
    if run.is_dir() {
        run.join("usermm-kernel-engine")
    } else {
        std::env::temp_dir().join("usermm-kernel-engine")
    }
}

/// What one run created, written to its state file after every step, so that a run killed
/// with SIGKILL is cleaned up by the next one.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    pid: u32,
    swap: Option<KernelSwap>,
    cgroup: Option<PathBuf>,
}

/// The kernel engine's environment for one run: lock, swap, cgroup. Dropping it tears down
/// whatever was set up (errors go to stderr); [`Env::teardown`] does the same and returns them.
pub struct Env {
    _lock: fs::File,
    state_file: PathBuf,
    state: State,
    pub cgroup: Option<Cgroup>,
    pub location: Option<cgroup::Location>,
}

impl Env {
    /// Takes the lock, cleans up leftovers of killed runs, sets up swap and the cgroup.
    pub fn create(setup: &Setup) -> Result<Env, Failure> {
        require_root()?;
        let dir = state_dir();
        fs::create_dir_all(&dir)
            .map_err(|e| Failure::Run(format!("cannot create {}: {e}", dir.display())))?;
        let lock_path = dir.join("lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Failure::Run(format!("cannot open {}: {e}", lock_path.display())))?;
        let mut told = false;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) => {
                    if !told {
                        eprintln!(
                            "usermm: waiting for another kernel-engine run to finish (lock {})",
                            lock_path.display()
                        );
                        told = true;
                    }
                    if crate::interrupt::interrupted() {
                        return Err(Failure::Interrupted);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(fs::TryLockError::Error(e)) => {
                    return Err(Failure::Run(format!(
                        "cannot lock {}: {e}",
                        lock_path.display()
                    )))
                }
            }
        }
        cleanup_leftovers(&dir);
        let pid = std::process::id();
        reap_by_name(pid);
        let mut env = Env {
            _lock: lock,
            state_file: dir.join(format!("state-{pid}.json")),
            state: State {
                pid,
                ..Default::default()
            },
            cgroup: None,
            location: None,
        };
        env.save();
        if let Some(other) = swap::active_swaps().first() {
            eprintln!(
                "usermm: note: other swap areas are active ({}); the kernel engine's swap gets \
                 the highest priority, but reclaim may spill into them",
                other.display()
            );
        }
        // Swap first: the cgroup's workload needs it from its first page.
        let mut created = None;
        let state_file = env.state_file.clone();
        let r = KernelSwap::setup(&setup.swap, &mut created, &mut |s| {
            let st = State {
                pid,
                swap: Some(s.clone()),
                cgroup: None,
            };
            write_state(&state_file, &st);
        });
        env.state.swap = created;
        env.save();
        r.map_err(Failure::Run)?;
        if crate::interrupt::interrupted() {
            return Err(Failure::Interrupted);
        }
        let loc = cgroup::locate().map_err(Failure::Run)?;
        let cg = Cgroup::create(&loc, &format!("usermm-kernel-{pid}"), setup.budget)
            .map_err(Failure::Run)?;
        env.state.cgroup = Some(cg.dir.clone());
        env.save();
        env.cgroup = Some(cg);
        env.location = Some(loc);
        Ok(env)
    }

    fn save(&self) {
        write_state(&self.state_file, &self.state);
    }

    /// The swap area, if any.
    pub fn swap(&self) -> Option<&KernelSwap> {
        self.state.swap.as_ref()
    }

    /// Description of the setup for the report.
    pub fn describe(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(cg) = &self.cgroup {
            m.insert("cgroup".into(), json!(cg.version.name()));
            m.insert("cgroup_path".into(), json!(cg.dir.display().to_string()));
            if let Some(l) = cg.limit() {
                m.insert("limit_bytes".into(), json!(l));
            }
            if let Some(s) = cg.swappiness() {
                m.insert("swappiness".into(), json!(s));
            }
        }
        if let Some(s) = self.swap() {
            m.insert("swap_path".into(), json!(s.dev.display().to_string()));
        }
        m.insert(
            "thp".into(),
            json!(
                fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                    .map(|t| t
                        .split_whitespace()
                        .find(|w| w.starts_with('['))
                        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
                        .unwrap_or_default())
                    .unwrap_or_default()
            ),
        );
        m.insert("kernel".into(), json!(kernel_release()));
        m
    }

    fn teardown_inner(&mut self) -> Result<(), String> {
        let mut errs = Vec::new();
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.remove() {
                errs.push(e);
            }
        }
        self.state.cgroup = None;
        if let Some(mut s) = self.state.swap.take() {
            if let Err(e) = s.teardown() {
                errs.push(e);
                // Keep the state file so a later run retries.
                self.state.swap = Some(s);
            }
        }
        if errs.is_empty() {
            let _ = fs::remove_file(&self.state_file);
            Ok(())
        } else {
            self.save();
            Err(errs.join("; "))
        }
    }

    /// Tears everything down; errors name what could not be undone.
    pub fn teardown(mut self) -> Result<(), Failure> {
        self.teardown_inner()
            .map_err(|e| Failure::Run(format!("kernel engine teardown: {e}")))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Err(e) = self.teardown_inner() {
            eprintln!("usermm: kernel engine teardown: {e}");
        }
    }
}

/// Writes the state file atomically (a temporary file renamed over it): a run killed in the
/// middle of a write leaves the previous state, never a truncated one the next run cannot read.
fn write_state(path: &Path, st: &State) {
    if let Ok(t) = serde_json::to_string(st) {
        let tmp = path.with_extension("json.tmp");
        if fs::write(&tmp, t).is_ok() && fs::rename(&tmp, path).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// Whether process `pid` exists (/proc/PID).
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name the engine gives what it creates (`usermm-kernel-PID`,
/// `usermm-kernel-swap-PID`), if `name` is one with `prefix`.
fn pid_in_name(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Kills the kernel-engine workers still in the cgroup at `dir` (a run that was killed: its
/// worker normally exits when its stdin closes), so the cgroup can go. Only processes running
/// this program's worker subcommand are signalled.
fn kill_stale_workers(dir: &Path) {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline
            .split(|&b| b == 0)
            .any(|a| a == worker::SUBCOMMAND.as_bytes())
        {
            eprintln!(
                "usermm: killing kernel-engine worker {pid} of a run that did not finish ({})",
                dir.display()
            );
            let _ = usermm_sys::kill(pid, signal_hook::consts::SIGKILL);
        }
    }
}

/// Removes a cgroup a killed run left: its workers first, then the directory.
fn reap_cgroup(dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        kill_stale_workers(dir);
    }
    cgroup::remove_dir(dir)
}

/// What a killed run left that no state file records (it was killed between creating a thing
/// and writing its state file, or the state file was lost): cgroups named `usermm-kernel-PID`
/// under this machine's memory cgroup location, active swap areas and files in the temporary
/// directory named `usermm-kernel-swap-PID`, whose PID is not `own` and no longer runs. The
/// names carry the pid so that a live run's are never touched. A zram device hot-added by a
/// run killed before its state file recorded it (the microseconds between reading hot_add and
/// the write) cannot be told from other zram devices and is left.
fn reap_by_name(own: u32) {
    let stale = |pid: u32| pid != own && !pid_alive(pid);
    for sw in swap::active_swaps() {
        let name = sw.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if pid_in_name(name, "usermm-kernel-swap-").is_some_and(stale) {
            eprintln!(
                "usermm: removing swap file {} of a kernel-engine run that did not finish",
                sw.display()
            );
            let mut ks = KernelSwap {
                dev: sw.clone(),
                file: Some(sw.clone()),
                active: true,
                ..Default::default()
            };
            if let Err(e) = ks.teardown() {
                eprintln!("usermm: {e}");
            }
        }
    }
    if let Ok(rd) = fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if pid_in_name(&name, "usermm-kernel-swap-").is_some_and(stale) {
                eprintln!(
                    "usermm: removing swap file {} of a kernel-engine run that did not finish",
                    e.path().display()
                );
                if let Err(err) = fs::remove_file(e.path()) {
                    eprintln!("usermm: cannot remove {}: {err}", e.path().display());
                }
            }
        }
    }
    let Ok(loc) = cgroup::locate() else { return };
    let Ok(rd) = fs::read_dir(&loc.parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if pid_in_name(&name, "usermm-kernel-").is_some_and(stale) && e.path().is_dir() {
            eprintln!(
                "usermm: removing cgroup {} of a kernel-engine run that did not finish",
                e.path().display()
            );
            if let Err(err) = reap_cgroup(&e.path()) {
                eprintln!("usermm: {err}");
            }
        }
    }
}

/// The kernel-engine worker process of the run in progress (0: none).
static WORKER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Undoes what killed runs left behind (called with the lock held, so no live run owns them).
fn cleanup_leftovers(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("state-") && name.ends_with(".json.tmp") {
            // A write that a kill interrupted; the state file beside it is whole.
            let _ = fs::remove_file(&p);
            continue;
        }
        let is_state = name.starts_with("state-") && name.ends_with(".json");
        if is_state {
            cleanup_state(
                &p,
                "usermm: cleaning up after kernel-engine run {} that did not finish",
            );
        }
    }
}

/// Tears down what state file `p` records (cgroup, then swap) and removes the file if all of it
/// went. `note` is printed with the run's pid.
fn cleanup_state(p: &Path, note: &str) {
    let Ok(st) = fs::read_to_string(p)
        .map_err(|_| ())
        .and_then(|t| serde_json::from_str::<State>(&t).map_err(|_| ()))
    else {
        let _ = fs::remove_file(p);
        return;
    };
    eprintln!("{}", note.replace("{}", &st.pid.to_string()));
    let mut ok = true;
    if let Some(cg) = &st.cgroup {
        if let Err(e) = reap_cgroup(cg) {
            eprintln!("usermm: {e}");
            ok = false;
        }
    }
    if let Some(mut s) = st.swap {
        if let Err(e) = s.teardown() {
            eprintln!("usermm: {e}");
            ok = false;
        }
    }
    if ok {
        let _ = fs::remove_file(p);
    }
}

/// Last resort of an interrupted run whose workload does not stop (a task stuck in a fault):
/// kills the kernel-engine worker, if one runs, and tears down this process's cgroup and swap
/// from its state file, from whichever thread calls it. The caller exits right after.
pub fn emergency_teardown() {
    let pid = WORKER.swap(0, std::sync::atomic::Ordering::SeqCst);
    if pid != 0 {
        // Our own child, by pid (kill(1): no unsafe outside sys/).
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let p = state_dir().join(format!("state-{}.json", std::process::id()));
    if p.exists() {
        cleanup_state(
            &p,
            "usermm: tearing down the kernel engine of interrupted run {}",
        );
    }
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What the worker reports back: the job's outcome plus the cgroup's peak.
pub struct Finished {
    pub result: worker::JobResult,
    pub peak_bytes: u64,
    pub setup: Map<String, Value>,
    pub swap_name: String,
    pub swap_bytes: u64,
}

/// Runs `job` in a fresh kernel environment (see the module doc) and tears it down.
pub fn run_job(setup: &Setup, job: worker::Job) -> Result<Finished, Failure> {
    let env = Env::create(setup)?;
    let r = run_in(&env, job);
    WORKER.store(0, std::sync::atomic::Ordering::SeqCst);
    let describe = env.describe();
    let (swap_name, swap_bytes) = env
        .swap()
        .map(|s| (s.name.clone(), s.size))
        .unwrap_or_else(|| ("none".into(), 0));
    let torn = env.teardown();
    let (result, peak_bytes) = r?;
    torn?;
    Ok(Finished {
        result,
        peak_bytes,
        setup: describe,
        swap_name,
        swap_bytes,
    })
}

fn run_in(env: &Env, job: worker::Job) -> Result<(worker::JobResult, u64), Failure> {
    let cg = env
        .cgroup
        .as_ref()
        .ok_or_else(|| Failure::Run("kernel engine: no cgroup".into()))?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find this program to start the worker: {e}")))?;
    let mut child = Command::new(exe)
        .arg(worker::SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Failure::Run(format!("cannot start the kernel-engine worker: {e}")))?;
    // From here on the child must not outlive this function (nor this process: an
    // interrupted run whose workload is stuck kills it from `emergency_teardown`).
    WORKER.store(child.id(), std::sync::atomic::Ordering::SeqCst);
    let kill = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    if let Err(e) = cg.add(child.id()) {
        kill(&mut child);
        return Err(Failure::Run(e));
    }
    let file_backed = matches!(job, worker::Job::MmapFile(_));
    let spec = worker::Spec {
        job,
        cgroup: cg.dir.clone(),
    };
    let mut stdin = child.stdin.take().expect("piped stdin");
    let line = serde_json::to_string(&spec).map_err(Failure::run)? + "\n";
    if let Err(e) = stdin.write_all(line.as_bytes()) {
        kill(&mut child);
        return Err(Failure::Run(format!(
            "cannot hand the job to the worker: {e}"
        )));
    }
    // stdin stays open: the worker exits when it closes (this process died).
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let r = stdout.read_to_string(&mut s);
        r.map(|_| s)
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                kill(&mut child);
                return Err(Failure::Run(format!("waiting for the worker: {e}")));
            }
        }
        if crate::interrupt::interrupted() {
            kill(&mut child);
            return Err(Failure::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let out = reader
        .join()
        .map_err(|_| Failure::Run("worker output reader panicked".into()))?
        .map_err(|e| Failure::Run(format!("reading the worker's output: {e}")))?;
    let peak = cg.peak().unwrap_or(0);
    if crate::interrupt::interrupted() {
        return Err(Failure::Interrupted);
    }
    if !status.success() {
        let ooms = cg.oom_kills();
        if ooms > 0 {
            let (why, fix) = match (file_backed, cg.version) {
                (true, cgroup::Version::V1) => (
                    "a v1 memory cgroup has no dirty-page limit of its own, so dirty and \
                     readahead pages of the mapped file filled it faster than writeback freed them",
                    "give a larger --budget",
                ),
                (true, cgroup::Version::V2) => (
                    "dirty and readahead pages of the mapped file filled it faster than writeback \
                     freed them",
                    "give a larger --budget",
                ),
                (false, _) => (
                    "the workload needs more than budget + swap",
                    "give a larger --swap-size or a smaller size",
                ),
            };
            return Err(Failure::Run(format!(
                "the kernel's OOM killer killed the workload in its cgroup ({} budget): {why}; {fix}",
                crate::output::mib(env_budget(cg))
            )));
        }
        return Err(Failure::Run(format!(
            "the kernel-engine worker failed ({status}); see its message above"
        )));
    }
    let result: worker::JobResult = serde_json::from_str(out.trim()).map_err(|e| {
        Failure::Run(format!(
            "the kernel-engine worker printed no result ({e}): {}",
            out.chars().take(200).collect::<String>()
        ))
    })?;
    Ok((result, peak))
}

fn env_budget(cg: &Cgroup) -> u64 {
    cg.limit().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_root_error_says_why() {
        let e = match check_root(Some(65534)) {
            Err(Failure::Run(m)) => m,
            _ => panic!("expected a run error"),
        };
        assert!(e.contains("needs root") && e.contains("uid 65534"), "{e}");
        assert!(e.contains("cgroup") && e.contains("swapon"), "{e}");
        assert!(e.contains("--engine usermm"), "{e}");
        assert!(check_root(Some(0)).is_ok());
        assert!(check_root(None).is_err());
    }

    #[test]
    fn setup_follows_the_usermm_config() {
        let cfg = MmConfig::new(64 << 20).swap(SwapConfig::Ram { size: 128 << 20 });
        let s = Setup::from_config(&cfg);
        assert_eq!(s.budget, 64 << 20);
        assert_eq!(s.swap, Spec::Zram { size: 128 << 20 });
        let cfg = MmConfig::new(64 << 20).swap(SwapConfig::File {
            path: Some("/nonexistent/x".into()),
            size: 1 << 30,
        });
        assert_eq!(
            Setup::from_config(&cfg).swap,
            Spec::File {
                path: Some("/nonexistent/x".into()),
                dir: std::env::temp_dir(),
                size: 1 << 30
            }
        );
        let cfg = MmConfig::new(64 << 20).swap(SwapConfig::None);
        assert_eq!(Setup::from_config(&cfg).swap, Spec::None);
        // zswap tiers: the kernel's zswap over a swap file (also for zswap+ram).
        for spec in ["zswap", "zswap+file", "zswap+ram"] {
            let cfg = MmConfig::new(64 << 20).swap(SwapConfig::parse(spec, 1 << 30).unwrap());
            assert_eq!(
                Setup::from_config(&cfg).swap,
                Spec::Zswap {
                    compressor: "lz4".into(),
                    max_pool_percent: 20,
                    file: Box::new(Spec::File {
                        path: None,
                        dir: std::env::temp_dir(),
                        size: 1 << 30
                    })
                },
                "{spec}"
            );
        }
        let cfg =
            MmConfig::new(64 << 20).swap(SwapConfig::parse("zswap:zstd+file", 1 << 30).unwrap());
        assert!(
            matches!(Setup::from_config(&cfg).swap, Spec::Zswap { compressor, .. } if compressor == "zstd")
        );
    }

    #[test]
    fn kernel_swap_overrides_the_device_not_the_size() {
        let cfg = MmConfig::new(64 << 20).swap(SwapConfig::parse("zswap+file", 1 << 30).unwrap());
        let s = Setup::with_swap(&cfg, Some("ram")).unwrap();
        assert_eq!(s.swap_kind(), "zram");
        assert_eq!((s.budget, s.swap), (64 << 20, Spec::Zram { size: 1 << 30 }));
        assert_eq!(
            Setup::with_swap(&cfg, Some("zram")).unwrap().swap,
            Spec::Zram { size: 1 << 30 }
        );
        assert!(matches!(
            Setup::with_swap(&cfg, Some("file")).unwrap().swap,
            Spec::File { size, .. } if size == 1 << 30
        ));
        assert_eq!(
            Setup::with_swap(&cfg, Some("none")).unwrap().swap,
            Spec::None
        );
        assert_eq!(
            Setup::with_swap(&cfg, None).unwrap().swap,
            Setup::from_config(&cfg).swap
        );
        let e = Setup::with_swap(&cfg, Some("redis://h:1")).unwrap_err();
        assert!(
            e.contains("\"redis://h:1\"") && e.contains("zswap+file"),
            "{e}"
        );
    }
}
