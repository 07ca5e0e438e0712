//! `usermm run [OPTIONS] -- PROGRAM ARGS...`: runs an unmodified, dynamically linked program with
//! the preload library (`libusermm_preload.so`, crate usermm-preload) so that its large
//! anonymous memory is served by a usermm manager inside the process, configured through the
//! `USERMM_*` environment this command sets. At exit the library appends one JSON line per
//! process to a temporary statistics file; this command prints them (`--stats`, `--json`) and
//! exits with the program's status.
//!
//! Exit codes follow env(1)/timeout(1): the program's own status; 128+N if it was killed by
//! signal N; 125 if usermm run itself failed (preload library missing, statistics unreadable);
//! 126 if the program cannot be run under the preload library (statically linked, not
//! executable); 127 if it does not exist; 2 for a usage error (an option that does not parse).

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::Args;
use serde_json::{json, Value};

use crate::output::mib;

/// Options of `usermm run`. An option not given takes its `USERMM_*` variable when that is set
/// (a bad value is an error naming the variable), else the default.
#[derive(Args)]
pub struct RunCmd {
    /// Memory budget of the whole process tree (k, M, G, T suffixes): the program and every
    /// process it starts share it, as a memory cgroup's limit holds them [default:
    /// $USERMM_BUDGET, else 256M].
    #[arg(long)]
    budget: Option<String>,
    /// Give each process a budget of its own (the --budget each) instead of one for the tree.
    #[arg(long = "budget-per-process")]
    budget_per_process: bool,
    /// Swap device: file (unlinked temporary file in $TMPDIR), file:PATH, ram, none,
    /// zswap+file, zswap+ram or zswap:OPTIONS+DEVICE [default: $USERMM_SWAP, else file].
    #[arg(long)]
    swap: Option<String>,
    /// Swap size [default: $USERMM_SWAP_SIZE, else for a file: a sparse file of half the free
    /// space of its filesystem, at most 64 GiB (blocks are used only as pages are swapped
    /// out); for ram: 4x the budget].
    #[arg(long = "swap-size")]
    swap_size: Option<String>,
    /// Serve anonymous mappings strictly larger than this (k, M, G suffixes); the malloc heap
    /// is always served [default: $USERMM_PRELOAD_THRESHOLD, else 0: every mapping].
    #[arg(long)]
    threshold: Option<String>,
    /// Allow mapping more than budget + swap (an access that then finds swap full gets SIGBUS)
    /// [default: $USERMM_OVERCOMMIT, else off].
    #[arg(long)]
    overcommit: bool,
    /// A seed switch or setting, NAME=VALUE (repeatable, also name=value,name=value; `usermm
    /// info` lists them). Applied over $USERMM_SET.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    /// Print the program's exit status and the memory summary at exit (to stderr, or --output).
    #[arg(long)]
    stats: bool,
    /// Print the exit status and the statistics as one JSON object (to stderr, or --output).
    #[arg(long)]
    json: bool,
    /// Write the --stats / --json report to this file instead of stderr.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// The preload library [default: next to the usermm binary, its deps/ or ../lib, or
    /// $USERMM_PRELOAD_LIB].
    #[arg(long)]
    preload: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    program: Vec<OsString>,
}

/// A failure of usermm run itself, with its exit code.
struct Fail(u8, String);

fn usage(msg: String) -> Fail {
    Fail(2, msg)
}

/// Parses a size option; a value that does not parse is a usage error naming the option.
fn size(opt: &str, v: &str) -> Result<u64, Fail> {
    usermm::parse_size(v).map_err(|e| {
        let msg = match e {
            usermm::Error::InvalidArgument(m) => m.to_string(),
            other => other.to_string(),
        };
        usage(format!("{opt}: {msg}"))
    })
}

/// Runs the command; returns the exit code.
pub fn main(cmd: RunCmd) -> ExitCode {
    match run(cmd) {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, msg)) => {
            eprintln!("usermm run: error: {msg}");
            ExitCode::from(code)
        }
    }
}

/// A `USERMM_*` variable of this process's environment, if set and not empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The option's value, else its variable's (the source is named in errors), else `default`.
fn pick(opt: &Option<String>, flag: &str, var_name: &str, default: &str) -> (String, String) {
    match (opt, var(var_name)) {
        (Some(v), _) => (v.clone(), flag.to_string()),
        (None, Some(v)) => (v, var_name.to_string()),
        (None, None) => (default.to_string(), flag.to_string()),
    }
}

/// What usermm run will set up, validated here so that a bad value is an error of this command
/// (exit 2) rather than a surprise inside the program.
struct Plan {
    env: Vec<(&'static str, String)>,
    budget: u64,
    swap: String,
    swap_size: u64,
    swap_sparse: bool,
    threshold: u64,
}

/// The environment the preload library reads, from the options and the `USERMM_*` variables.
fn environment(cmd: &RunCmd) -> Result<Plan, Fail> {
    let (b, from) = pick(&cmd.budget, "--budget", "USERMM_BUDGET", "256M");
    let budget = size(&from, &b)?;
    if budget < usermm::MIN_BUDGET {
        return Err(usage(format!("{from}: {b} is below the minimum of 1 MiB")));
    }
    let (swap, swap_from) = pick(&cmd.swap, "--swap", "USERMM_SWAP", "file");
    let parsed =
        usermm::SwapConfig::parse(&swap, 0).map_err(|e| usage(format!("{swap_from}: {e}")))?;
    if let usermm::SwapConfig::File { path, .. } = &parsed {
        check_swap_dir(path.as_deref(), &swap_from, &swap)?;
    }
    let (swap_size, swap_sparse) = match pick(&cmd.swap_size, "--swap-size", "USERMM_SWAP_SIZE", "")
    {
        (v, from) if !v.is_empty() => (size(&from, &v)?, false),
        _ => usermm::MmConfig::default_swap_size(&parsed, budget)
            .map_err(|e| usage(format!("{swap_from}: {e}")))?,
    };
    if !matches!(parsed, usermm::SwapConfig::None) && swap_size < 4096 {
        return Err(usage(format!(
            "--swap-size: {} bytes is less than one page; give a size such as 1G, or --swap none",
            swap_size
        )));
    }
    let (t, t_from) = pick(
        &cmd.threshold,
        "--threshold",
        "USERMM_PRELOAD_THRESHOLD",
        "0",
    );
    let threshold = size(&t_from, &t)?;
    let overcommit = if cmd.overcommit {
        true
    } else {
        match var("USERMM_OVERCOMMIT").as_deref().map(str::trim) {
            None | Some("0") | Some("off") | Some("false") => false,
            Some("1") | Some("on") | Some("true") => true,
            Some(v) => {
                return Err(usage(format!(
                    "USERMM_OVERCOMMIT={v:?}: use 1 or 0 (or pass --overcommit)"
                )))
            }
        }
    };
    // USERMM_SET first, then every --set in order: the same result as bench's --set.
    let mut list: Vec<String> = Vec::new();
    if let Some(v) = var("USERMM_SET") {
        usermm::Settings::parse(&v).map_err(|e| usage(format!("USERMM_SET={v:?}: {e}")))?;
        list.push(v);
    }
    let mut settings =
        usermm::Settings::parse(&list.join(",")).map_err(|e| usage(e.to_string()))?;
    for s in &cmd.set {
        settings
            .apply(s)
            .map_err(|e| usage(format!("--set {s}: {e}")))?;
        list.push(s.clone());
    }
    if settings.is_new(usermm::Switch::FaultPath) {
        return Err(usage(
            "fault_path=sigbus is not available under `usermm run`: the program's heap is \
             managed memory, so a fault can interrupt malloc itself, and the kernel's own \
             accesses (read(2) into a buffer not resident) would fail with EFAULT; drop the \
             setting (run uses fault_path=handler)"
                .into(),
        ));
    }
    let mut env = vec![
        ("USERMM_BUDGET", budget.to_string()),
        ("USERMM_SWAP", swap.clone()),
        (
            "USERMM_OVERCOMMIT",
            if overcommit { "1" } else { "0" }.to_string(),
        ),
        ("USERMM_PRELOAD_THRESHOLD", threshold.to_string()),
        ("USERMM_SET", list.join(",")),
    ];
    // Without a size the library computes the same default (a sparse file); with one, the
    // file is preallocated.
    if !swap_sparse {
        env.push(("USERMM_SWAP_SIZE", swap_size.to_string()));
    }
    env.retain(|(_, v)| !v.is_empty());
    Ok(Plan {
        env,
        budget,
        swap,
        swap_size,
        swap_sparse,
        threshold,
    })
}

/// A swap file's directory must exist and be writable: usermm run never swaps somewhere else
/// than where it was told.
fn check_swap_dir(path: Option<&Path>, from: &str, spec: &str) -> Result<(), Fail> {
    let dir = usermm::swap::file_dir(path);
    let md = std::fs::metadata(&dir).map_err(|e| {
        usage(format!(
            "{from} {spec}: the directory {} {}: create it or choose another path{}",
            dir.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "does not exist".to_string()
            } else {
                format!("cannot be examined ({e})")
            },
            if path.is_none() { " (set TMPDIR)" } else { "" }
        ))
    })?;
    if !md.is_dir() {
        return Err(usage(format!(
            "{from} {spec}: {} is not a directory",
            dir.display()
        )));
    }
    if let Some(p) = path {
        if p.is_dir() {
            return Err(usage(format!(
                "{from} {spec}: {} is a directory; give a file path (file:{}/swap) or plain file",
                p.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// Finds PROGRAM like execvp(3): a name with a slash is a path, anything else is looked up in
/// $PATH. 127 if it does not exist, 126 if it is not an executable file.
fn resolve(program: &OsString) -> Result<PathBuf, Fail> {
    let p = Path::new(program);
    let name = p.display().to_string();
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![p.to_path_buf()]
    } else {
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).map(|d| d.join(p)).collect())
            .unwrap_or_default()
    };
    let mut found_not_exec = None;
    for c in candidates {
        if let Ok(md) = std::fs::metadata(&c) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
            found_not_exec.get_or_insert(c);
        }
    }
    match found_not_exec {
        Some(c) => Err(Fail(
            126,
            format!("{}: not an executable file", c.display()),
        )),
        None => Err(Fail(
            127,
            format!(
                "{name}: no such program (not found{})",
                if name.contains('/') { "" } else { " in $PATH" }
            ),
        )),
    }
}

/// Checks that the dynamic loader will load the preload library into `path`: a dynamically
/// linked 64-bit ELF executable (it has a PT_INTERP program header), or a `#!` script whose
/// interpreter is one.
fn check_preloadable(path: &Path, depth: u32) -> Result<(), Fail> {
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| Fail(126, format!("{}: {e}", path.display())))?;
    head.truncate(n);
    if head.starts_with(b"#!") && depth == 0 {
        let line = head[2..].split(|&b| b == b'\n').next().unwrap_or_default();
        let interp = String::from_utf8_lossy(line);
        let interp = interp
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        if interp.is_empty() {
            return Err(Fail(
                126,
                format!("{}: script without an interpreter", path.display()),
            ));
        }
        return check_preloadable(Path::new(&interp), 1);
    }
    if !head.starts_with(b"\x7fELF") {
        return Err(Fail(
            126,
            format!("{}: not an ELF executable or a #! script", path.display()),
        ));
    }
    if head.len() < 64 || head[4] != 2 || head[5] != 1 {
        return Err(Fail(
            126,
            format!(
                "{}: not a 64-bit little-endian ELF program; the preload library is 64-bit",
                path.display()
            ),
        ));
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let u64_at =
        |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes")) as usize;
    let phoff = u64_at(&head, 32);
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    let mut table = vec![0u8; phentsize * phnum];
    {
        use std::io::{Seek, SeekFrom};
        let mut f =
            std::fs::File::open(path).map_err(|e| Fail(126, format!("{}: {e}", path.display())))?;
        f.seek(SeekFrom::Start(phoff as u64))
            .and_then(|_| f.read_exact(&mut table))
            .map_err(|e| {
                Fail(
                    126,
                    format!("{}: reading program headers: {e}", path.display()),
                )
            })?;
    }
    const PT_INTERP: u32 = 3;
    let dynamic = table.chunks(phentsize.max(1)).any(|ph| {
        ph.len() >= 4 && u32::from_le_bytes(ph[0..4].try_into().expect("4 bytes")) == PT_INTERP
    });
    if !dynamic {
        return Err(Fail(
            126,
            format!(
                "{} is statically linked: the dynamic loader never runs in it, so the preload library cannot serve its memory; run a dynamically linked build",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The Redis tier of a swap spec (alone or below zswap), if it has one.
fn redis_tier(spec: &str, size: u64) -> Option<usermm::swap::RedisConfig> {
    usermm::SwapConfig::parse(spec, size)
        .ok()?
        .redis_mut()
        .cloned()
}

/// After the program exited: deletes the keys run `id`'s processes left in the Redis Cluster,
/// unless one of them still runs (a process of the budget `group` that is alive; without a
/// group, `--budget-per-process`, nothing tells, so the keys stay). Returns a note for the
/// user when keys stay or the deletion failed.
fn purge_redis_run(
    r: &usermm::swap::RedisConfig,
    id: &str,
    group: Option<&usermm::MemCgroup>,
) -> Option<String> {
    let pattern = format!("usermm:{{{id}-*");
    let Some(g) = group else {
        return Some(format!(
            "with --budget-per-process usermm run cannot tell when the program's last process \
             is gone: its Redis keys stay in the cluster (they match {pattern})"
        ));
    };
    let alive: Vec<u32> = g
        .members()
        .iter()
        .map(|m| m.pid)
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect();
    if !alive.is_empty() {
        return Some(format!(
            "processes of the program still run ({}): their Redis keys stay in the cluster \
             (they match {pattern}; delete them when those processes are gone)",
            alive
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    match usermm::swap::redis::purge_run(r, id) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "deleting the program's Redis keys failed: {e}; they match {pattern}"
        )),
    }
}

/// Finds libusermm_preload.so.
fn find_preload(given: Option<&Path>) -> Result<PathBuf, Fail> {
    const NAME: &str = "libusermm_preload.so";
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(usage(format!("--preload: {} does not exist", p.display())))
        };
    }
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("USERMM_PRELOAD_LIB") {
        tried.push(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join(NAME));
        tried.push(dir.join("deps").join(NAME));
        tried.push(dir.join("../lib").join(NAME));
    }
    tried.push(PathBuf::from("/usr/local/lib").join(NAME));
    tried.push(PathBuf::from("/usr/lib").join(NAME));
    tried
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            Fail(
                125,
                format!(
                    "{NAME} not found (looked in {}): build it with `cargo build --release -p usermm-preload`, or pass --preload PATH",
                    tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ),
            )
        })
}

/// A fresh, empty statistics file (mode 0600) in $TMPDIR.
fn stats_file() -> Result<PathBuf, Fail> {
    let dir = std::env::temp_dir();
    for i in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let p = dir.join(format!(
            "usermm-run-{}-{nanos}-{i}.jsonl",
            std::process::id()
        ));
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p);
        if let Ok(f) = r {
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o600));
            return Ok(p);
        }
    }
    Err(Fail(
        125,
        format!("cannot create a statistics file in {}", dir.display()),
    ))
}

/// What userfaultfd this process may open (the preload library's managers open the same,
/// with the same policy): a short name, or why none can be opened.
fn uffd_mode() -> Result<&'static str, String> {
    use usermm_sys::uffd::{OpenPolicy, Origin, Uffd};
    match Uffd::open(0, OpenPolicy::Auto) {
        Ok(u) => Ok(match u.origin() {
            Origin::DevUserfaultfd => "full (/dev/userfaultfd)",
            Origin::SyscallFull => "full (userfaultfd syscall)",
            Origin::SyscallUserModeOnly => {
                "user-mode-only (read(2) into non-resident managed memory fails with EFAULT)"
            }
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether this process is in the foreground process group of a terminal: then the terminal's
/// SIGINT / SIGHUP reached the program directly and is not forwarded a second time.
fn terminal_foreground() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    // Fields after the command name (in parentheses): state ppid pgrp session tty_nr tpgid.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    match (f.get(2), f.get(5)) {
        (Some(pgrp), Some(tpgid)) => pgrp == tpgid && *tpgid != "-1",
        _ => false,
    }
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the program while it runs, so that usermm run waits
/// for it and still writes its report (and no program is left running without it).
struct Forwarder {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<Vec<i32>>>,
    alive: std::sync::Arc<std::sync::Mutex<bool>>,
}

impl Forwarder {
    fn install() -> Result<signal_hook::iterator::Signals, Fail> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| Fail(125, format!("cannot install the signal handlers: {e}")))
    }

    fn start(mut signals: signal_hook::iterator::Signals, pid: u32) -> Forwarder {
        let handle = signals.handle();
        let alive = std::sync::Arc::new(std::sync::Mutex::new(true));
        let a = alive.clone();
        let thread = std::thread::spawn(move || {
            let mut got = Vec::new();
            for sig in signals.forever() {
                let from_terminal = sig != signal_hook::consts::SIGTERM && terminal_foreground();
                let alive = a.lock().unwrap_or_else(|e| e.into_inner());
                if *alive && !from_terminal {
                    let _ = usermm_sys::kill(pid, sig);
                }
                got.push(sig);
            }
            got
        });
        Forwarder {
            handle,
            thread: Some(thread),
            alive,
        }
    }

    /// The program was reaped: stop forwarding; the signals that arrived.
    fn finish(mut self) -> Vec<i32> {
        *self.alive.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.handle.close();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

fn signal_name(s: i32) -> String {
    match s {
        1 => "SIGHUP".into(),
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

fn run(cmd: RunCmd) -> Result<u8, Fail> {
    let plan = environment(&cmd)?;
    let env = &plan.env;
    let program = cmd.program[0].clone();
    let path = resolve(&program)?;
    check_preloadable(&path, 0)?;
    let preload = find_preload(cmd.preload.as_deref())?;
    let name = program.to_string_lossy().to_string();
    let uffd = uffd_mode();
    let mut notes = Vec::new();
    if let Err(e) = &uffd {
        let n = format!(
            "usermm cannot manage {name}'s memory: {e}; it runs on the kernel's memory alone"
        );
        eprintln!("usermm run: warning: {n}");
        notes.push(n);
    }
    let stats = stats_file()?;
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _cleanup = Remove(stats.clone());
    // One budget for the tree: every process's manager charges its frames to this file.
    let group = if cmd.budget_per_process || uffd.is_err() {
        None
    } else {
        let p = stats.with_extension("budget");
        let g = usermm::MemCgroup::create(&p, plan.budget)
            .map_err(|e| Fail(125, format!("usermm run: {e}")))?;
        Some((g, Remove(p)))
    };
    let ld_preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = preload.clone().into_os_string();
            v.push(" ");
            v.push(old);
            v
        }
        _ => preload.clone().into_os_string(),
    };
    let mut c = Command::new(&path);
    c.arg0(&program)
        .args(&cmd.program[1..])
        .env("LD_PRELOAD", ld_preload)
        .env("USERMM_RUN_STATS", &stats);
    for k in [
        "USERMM_SET",
        "USERMM_SWAP_SIZE",
        "USERMM_BUDGET",
        "USERMM_SWAP",
        "USERMM_OVERCOMMIT",
        "USERMM_PRELOAD_THRESHOLD",
        "USERMM_GROUP",
    ] {
        c.env_remove(k);
    }
    if let Some((g, _)) = &group {
        c.env("USERMM_GROUP", g.path());
    }
    for (k, v) in env {
        c.env(k, v);
    }
    // A Redis tier: the run's processes name their keys after the run, so that what they
    // leave in the cluster (a process's manager lives until it exits, and a killed one
    // deletes nothing) is deleted once the program is gone (`purge_redis_run`).
    let redis_run = redis_tier(&plan.swap, plan.swap_size).map(|r| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        (
            r,
            format!("run-{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff),
        )
    });
    c.env_remove(usermm::swap::redis::RUN_ENV);
    if let Some((_, id)) = &redis_run {
        c.env(usermm::swap::redis::RUN_ENV, id);
    }
    let signals = Forwarder::install()?;
    let start = Instant::now();
    let mut child = c
        .spawn()
        .map_err(|e| Fail(126, format!("{}: {e}", path.display())))?;
    let pid = child.id();
    let forwarder = Forwarder::start(signals, pid);
    let status = child.wait();
    let received = forwarder.finish();
    let status = status.map_err(|e| Fail(125, format!("waiting for {}: {e}", path.display())))?;
    let elapsed = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&stats).map_err(|e| {
        Fail(
            125,
            format!("reading the statistics file {}: {e}", stats.display()),
        )
    })?;
    let reports: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let top = reports.iter().find(|r| r["pid"] == json!(pid)).cloned();
    let others: Vec<Value> = reports
        .iter()
        .filter(|r| r["pid"] != json!(pid))
        .cloned()
        .collect();

    let (code, signal) = (status.code(), status.signal());
    let exit = match (code, signal) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 125,
    };
    if !received.is_empty() {
        notes.push(format!(
            "usermm run received {} and passed it on to {name} (pid {pid})",
            received
                .iter()
                .map(|s| signal_name(*s))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if top.is_none() && (cmd.stats || cmd.json) {
        notes.push(match signal {
            Some(s) => format!("{name} was killed by signal {s}: no memory statistics (the preload library reports at exit)"),
            None => format!(
                "{name} did not report: it left with _exit(2) or exec'd a program the preload library cannot reach (statically linked); its statistics are missing"
            ),
        });
    }
    // The preload library printed each manager error on stderr itself (one line): they go
    // into the report and the summary only.
    let mut seen_errors = Vec::new();
    let mut quiet = Vec::new();
    for r in reports.iter() {
        if let Some(e) = r["manager_error"].as_str() {
            if uffd.is_ok() && !seen_errors.iter().any(|s: &String| s == e) {
                seen_errors.push(e.to_string());
                quiet.push(format!("pid {}: {e}", r["pid"]));
            }
        }
        if let Some(n) = r["swap_note"].as_str() {
            notes.push(format!("pid {}: {n}", r["pid"]));
        }
    }
    if let Some((r, id)) = &redis_run {
        if let Some(n) = purge_redis_run(r, id, group.as_ref().map(|(g, _)| g)) {
            notes.push(n);
        }
    }
    if let Some(line) = refused_line(&reports) {
        eprintln!("{line}");
        notes.push(line);
    }
    for n in notes.iter().skip(usize::from(uffd.is_err())) {
        if !n.starts_with("usermm run: ") {
            eprintln!("usermm run: warning: {n}");
        }
    }
    notes.extend(quiet);

    let cfg: serde_json::Map<String, Value> = env
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    let page = 4096u64;
    let tree = group.as_ref().map(|(g, _)| {
        let st = g.stat();
        json!({
            "budget_bytes": st.limit * page,
            "peak_charged_bytes": st.peak * page,
            "charged_at_exit_bytes": st.usage * page,
            "processes": st.joined,
            "uncharged_for_exited_bytes": st.reaped * page,
        })
    });
    let setup = json!({
        "budget_bytes": plan.budget,
        "budget_shared_by_tree": tree.is_some(),
        "swap": plan.swap,
        "swap_bytes": plan.swap_size,
        "swap_sparse": plan.swap_sparse,
        "threshold_bytes": plan.threshold,
        "userfaultfd": uffd.as_ref().map(|m| m.to_string()).map_err(|e| e.clone()).ok(),
        "userfaultfd_error": uffd.as_ref().err(),
    });
    let report = if cmd.json {
        Some(
            json!({
                "program": name,
                "args": cmd.program[1..].iter().map(|a| a.to_string_lossy().to_string()).collect::<Vec<_>>(),
                "exit_code": code,
                "signal": signal,
                "elapsed_s": elapsed,
                "environment": cfg,
                "setup": setup,
                "signals_forwarded": received,
                "preload": preload.display().to_string(),
                "process": top,
                "other_processes": others,
                "tree": tree,
                "warnings": notes,
            })
            .to_string()
                + "\n",
        )
    } else if cmd.stats {
        let mut s = summary(&name, code, signal, elapsed, top.as_ref(), &others);
        s.push_str(&format!(
            "  budget {}{}, swap {} {}{}, threshold {}, userfaultfd {}\n",
            mib(plan.budget),
            if tree.is_some() {
                " for the whole tree"
            } else {
                " per process"
            },
            plan.swap,
            mib(plan.swap_size),
            if plan.swap_sparse { " (sparse)" } else { "" },
            mib(plan.threshold),
            match &uffd {
                Ok(m) => m.to_string(),
                Err(_) => "unavailable: nothing was managed".into(),
            }
        ));
        if let Some(t) = &tree {
            let u = |k: &str| t[k].as_u64().unwrap_or(0);
            s.push_str(&format!(
                "  one budget for the process tree: {} managed processes, peak {} charged together\n",
                u("processes"),
                mib(u("peak_charged_bytes")),
            ));
        }
        for n in &notes {
            s.push_str(&format!("  note: {n}\n"));
        }
        Some(s)
    } else {
        None
    };
    if let Some(r) = report {
        match &cmd.output {
            Some(p) => std::fs::write(p, r)
                .map_err(|e| Fail(125, format!("--output {}: {e}", p.display())))?,
            None => eprint!("{r}"),
        }
    }
    Ok(exit)
}

/// The one line printed when the commit limit refused allocations: which limit, its numbers,
/// and the flags that change it.
fn refused_line(reports: &[Value]) -> Option<String> {
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    // Refused mappings of the program's own and NULLs from the heap (mimalloc's refused
    // mappings are counted once, as the NULL the program got).
    let refused_of = |r: &Value| u(&r["enomem"]) + u(&r["heap"]["enomem"]);
    let refused: u64 = reports.iter().map(refused_of).sum();
    if refused == 0 {
        return None;
    }
    let r = reports
        .iter()
        .filter(|r| refused_of(r) > 0)
        .find(|r| !r["manager"].is_null())?;
    let m = &r["manager"];
    Some(format!(
        "usermm run: {refused} allocation(s) refused with ENOMEM by the commit limit (budget {} + swap {} = {}; {} committed at exit, pid {}): raise it with --swap-size, or allow overcommit with --overcommit",
        mib(u(&m["budget_bytes"])),
        mib(u(&m["swap_bytes"])),
        mib(u(&m["commit_limit_bytes"])),
        mib(u(&m["committed_bytes"])),
        r["pid"],
    ))
}

/// One process's lines of the human-readable summary.
fn process_lines(r: &Value, out: &mut String) {
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let forked = if r["forked"] != json!(true) {
        String::new()
    } else if u(&r["fork_copy_bytes"]) > 0 {
        format!(
            ", forked (a {} copy of its parent's memory, {} of ranges adopted by its manager)",
            mib(u(&r["fork_copy_bytes"])),
            mib(u(&r["fork_adopted_bytes"]))
        )
    } else {
        ", forked".to_string()
    };
    out.push_str(&format!(
        "  pid {} ({}){}: {} mappings served (the malloc heap's included), peak {} mapped, {} refused (ENOMEM), peak RSS {}\n",
        r["pid"],
        r["exe"].as_str().unwrap_or("?"),
        forked,
        u(&r["managed_mmaps"]),
        mib(u(&r["peak_managed_bytes"])),
        u(&r["enomem"]),
        mib(u(&r["vm_hwm_bytes"])),
    ));
    let m = &r["manager"];
    if m.is_null() {
        match r["manager_error"].as_str() {
            Some(e) => out.push_str(&format!("    not managed: {e}\n")),
            None => out.push_str(&format!(
                "    no manager: nothing the preload library serves (threshold {}) was allocated\n",
                mib(u(&r["threshold_bytes"]))
            )),
        }
        return;
    }
    out.push_str(&format!(
        "    budget {}, swap {} ({}), peak resident {} (usermm)\n",
        mib(u(&m["budget_bytes"])),
        m["swap"].as_str().unwrap_or("?"),
        mib(u(&m["swap_bytes"])),
        mib(u(&m["peak_resident_bytes"])),
    ));
    let vm = &m["vmstat"];
    let keys = [
        "pgfault",
        "pgmajfault",
        "zero_page_fault",
        "pswpin",
        "pswpout",
        "pgscan_kswapd",
        "pgscan_direct",
        "pgsteal_kswapd",
        "pgsteal_direct",
        "allocstall",
        "swap_ra",
        "swap_ra_hit",
        "pgdiscard",
        "oom_poison",
    ];
    let parts: Vec<String> = keys.iter().map(|k| format!("{k} {}", u(&vm[*k]))).collect();
    out.push_str(&format!("    {}\n", parts.join(", ")));
}

fn summary(
    name: &str,
    code: Option<i32>,
    signal: Option<i32>,
    elapsed: f64,
    top: Option<&Value>,
    others: &[Value],
) -> String {
    let mut s = match (code, signal) {
        (Some(c), _) => format!("usermm run: {name} exited with status {c} after {elapsed:.2} s\n"),
        (None, Some(sig)) => {
            format!("usermm run: {name} was killed by signal {sig} after {elapsed:.2} s\n")
        }
        _ => format!("usermm run: {name} ended after {elapsed:.2} s\n"),
    };
    match top {
        Some(t) => process_lines(t, &mut s),
        None => s.push_str("  no statistics from the program itself\n"),
    }
    let (with, without): (Vec<&Value>, Vec<&Value>) =
        others.iter().partition(|o| !o["manager"].is_null());
    if !with.is_empty() {
        s.push_str(&format!(
            "  {} other processes (forked children, exec'd programs) with a manager:\n",
            with.len()
        ));
        for o in with {
            process_lines(o, &mut s);
        }
    }
    if !without.is_empty() {
        s.push_str(&format!(
            "  {} other processes reported no managed memory\n",
            without.len()
        ));
    }
    s
}
