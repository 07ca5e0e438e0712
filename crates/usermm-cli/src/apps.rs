//! `usermm bench apps`: real, unmodified programs (GNU sort, a numpy script, Python building a
//! dict, mawk building an associative array, perl reading and sorting lines, two Python
//! multiprocessing Pools and a `make -j2` build with gcc: process trees under one budget) on
//! both engines in
//! one command. Each case runs natively once for the reference output, then alternately under
//! `usermm run` (engine usermm) and inside a memory cgroup limited to the same budget with
//! kernel swap of the same kind and size (engine kernel, set up and torn down by `kernel::Env`,
//! as `../shared/measure/kernel-run.sh` does by hand), `--runs` times each.
//!
//! Reported per run: wall time, peak RSS of the whole process tree (the program and every
//! descendant, sampled from /proc every 20 ms, and at least the largest VmHWM of any of them;
//! the `usermm run` wrapper itself is not counted), faults as each engine counts them (usermm:
//! the managers' vmstat; kernel: the cgroup's memory.stat), swap-outs, and whether stdout is
//! byte-identical to the native run. A mismatch or a failed program is a failure: it is printed
//! loudly and the command exits 1.
//!
//! Mirrors no kernel file; it is the user-level counterpart of running a program in a memory
//! cgroup (`mm/memcontrol.c`) with swap.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::XorShift;
use crate::engine::{self, Engine};
use crate::kernel;
use crate::output::mib;
use crate::report::median;
use crate::Failure;

/// Names of the cases, in the order they run.
pub const CASES: [&str; 9] = [
    "sort", "numpy", "pydict", "awk", "perl", "mp-numpy", "mp-pool", "mp-dict", "make",
];

/// Options of one `bench apps` invocation.
#[derive(Debug, Clone)]
pub struct Params {
    pub cases: Vec<String>,
    pub budget: u64,
    /// `file`, `ram`, `zswap+file` or `zswap+ram` (`usermm run --swap`).
    pub swap: String,
    /// The kernel engine's setup (a memory cgroup of the budget, its swap).
    pub kernel: kernel::Setup,
    pub swap_size: u64,
    /// Settings passed to every `usermm run` (`--set NAME=VALUE`, checked by the caller).
    pub set: Vec<String>,
    pub runs: u32,
    pub engines: Vec<Engine>,
    pub quick: bool,
    pub json: bool,
    /// Where inputs and outputs go (a fresh directory is made inside).
    pub dir: PathBuf,
}

/// One program to run, with its deterministic input.
struct Case {
    name: &'static str,
    /// What it does, for the legend.
    about: String,
    argv: Vec<String>,
}

/// Sizes of the inputs: full (default) or `--quick`.
struct Sizes {
    sort_lines: u64,
    sort_s: &'static str,
    numpy_n: u64,
    dict_n: u64,
    awk_lines: u64,
    perl_lines: u64,
    /// The make case: C files, and statements in the one function of each.
    make_files: u64,
    make_lines: u64,
}

fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes {
            sort_lines: 400_000,
            sort_s: "64M",
            numpy_n: 4 << 20,
            dict_n: 300_000,
            awk_lines: 300_000,
            perl_lines: 200_000,
            make_files: 4,
            make_lines: 150,
        }
    } else {
        Sizes {
            sort_lines: 3_000_000,
            sort_s: "400M",
            numpy_n: 64 << 20,
            dict_n: 3_000_000,
            awk_lines: 2_000_000,
            perl_lines: 1_000_000,
            make_files: 8,
            make_lines: 1500,
        }
    }
}

/// Writes `lines` pseudo-random integers below 10^12, one per line (seeded: the same file on
/// every machine).
fn numbers_file(dir: &Path, lines: u64, seed: u64) -> Result<PathBuf, Failure> {
    let p = dir.join(format!("numbers-{lines}-{seed}.txt"));
    if p.exists() {
        return Ok(p);
    }
    let f = File::create(&p).map_err(|e| Failure::Run(format!("{}: {e}", p.display())))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut r = XorShift::new(seed);
    for _ in 0..lines {
        writeln!(w, "{}", r.next_u64() % 1_000_000_000_000)
            .map_err(|e| Failure::Run(format!("{}: {e}", p.display())))?;
    }
    w.flush()
        .map_err(|e| Failure::Run(format!("{}: {e}", p.display())))?;
    Ok(p)
}

/// Writes a C project for `make -j2` (seeded: the same sources on every machine): `files`
/// units, each one function of `lines` statements mixing 64 words (gcc's optimiser holds the
/// whole function: about 100 MiB per cc1 at 1500 lines), a `main` that prints what they
/// compute, and a Makefile. Returns its directory.
fn make_project(dir: &Path, files: u64, lines: u64) -> Result<PathBuf, Failure> {
    let d = dir.join(format!("make-{files}-{lines}"));
    let fail = |e: std::io::Error| Failure::Run(format!("{}: {e}", d.display()));
    std::fs::create_dir_all(&d).map_err(fail)?;
    let mut r = XorShift::new(5);
    for f in 0..files {
        let mut src = format!(
            "unsigned long f{f}(unsigned long *x) {{\n    unsigned long a = {}, b = {};\n",
            r.next_u64() % 1000,
            r.next_u64() % 1000
        );
        for i in 0..lines {
            let (k, j, c) = (
                r.next_u64() % 64,
                r.next_u64() % 64,
                1 + r.next_u64() % (1 << 20),
            );
            src.push_str(&format!(
                "    a += x[{k}] * {c}u ^ b; b = (b << 3) + x[{j}] + a; x[{}] ^= a + {i};\n",
                (k + j) % 64
            ));
        }
        src.push_str("    return a ^ b;\n}\n");
        std::fs::write(d.join(format!("u{f}.c")), src).map_err(fail)?;
    }
    let mut main = String::from("#include <stdio.h>\n");
    for f in 0..files {
        main.push_str(&format!("unsigned long f{f}(unsigned long *x);\n"));
    }
    main.push_str(
        "int main(void) {\n    unsigned long x[64], s = 0;\n    \
         for (int i = 0; i < 64; i++) x[i] = i * 2654435761u;\n",
    );
    for f in 0..files {
        main.push_str(&format!("    s ^= f{f}(x);\n"));
    }
    main.push_str("    printf(\"%lu\\n\", s);\n    return 0;\n}\n");
    std::fs::write(d.join("main.c"), main).map_err(fail)?;
    let objs: Vec<String> = (0..files)
        .map(|f| format!("u{f}.o"))
        .chain(["main.o".to_string()])
        .collect();
    std::fs::write(
        d.join("Makefile"),
        format!(
            "prog: {}\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) -O2 -c $<\nclean:\n\trm -f *.o prog\n",
            objs.join(" ")
        ),
    )
    .map_err(fail)?;
    Ok(d)
}

fn build_case(name: &str, s: &Sizes, dir: &Path) -> Result<Case, Failure> {
    let py = |code: String| vec!["python3".to_string(), "-c".to_string(), code];
    Ok(match name {
        "sort" => {
            let input = numbers_file(dir, s.sort_lines, 1)?;
            Case {
                name: "sort",
                about: format!(
                    "GNU sort -n -S {} of {} numeric lines",
                    s.sort_s, s.sort_lines
                ),
                argv: vec![
                    "sort".into(),
                    "-n".into(),
                    "-S".into(),
                    s.sort_s.into(),
                    input.display().to_string(),
                ],
            }
        }
        "numpy" => Case {
            name: "numpy",
            about: format!(
                "numpy: a[:] = np.arange(n) * 3 and sum, n = {} ({} int64 array)",
                s.numpy_n,
                mib(s.numpy_n * 8)
            ),
            argv: py(format!(
                "import numpy as np\nn = {}\na = np.empty(n, dtype=np.int64)\na[:] = np.arange(n) * 3\nprint(int(a.sum()))",
                s.numpy_n
            )),
        },
        "mp-numpy" => Case {
            name: "mp-numpy",
            about: format!(
                "Python multiprocessing: a Pool of 2 forked workers, each fills and sums its own \
                 int64 array of {} ({} each; the whole tree under one budget)",
                s.numpy_n / 2,
                mib(s.numpy_n * 4)
            ),
            argv: py(format!(
                "import multiprocessing as mp\nimport numpy as np\n\
                 def work(k):\n    n = {}\n    a = np.empty(n, dtype=np.int64)\n    \
                 a[:] = np.arange(n) * (k + 3)\n    return int(a.sum())\n\
                 if __name__ == '__main__':\n    \
                 with mp.get_context('fork').Pool(2) as p:\n        print(p.map(work, [0, 1]))",
                s.numpy_n / 2
            )),
        },
        "mp-pool" => Case {
            name: "mp-pool",
            about: format!(
                "Python multiprocessing: the parent fills an int64 array of {} ({}), then a Pool \
                 of 2 forked workers sums it in 8 slices (the array reaches them by fork)",
                s.numpy_n,
                mib(s.numpy_n * 8)
            ),
            argv: py(format!(
                "import multiprocessing as mp\nimport numpy as np\nn = {}\n\
                 a = np.arange(n, dtype=np.int64) * 3\n\
                 def work(k):\n    return int(a[k * n // 8:(k + 1) * n // 8].sum())\n\
                 if __name__ == '__main__':\n    \
                 with mp.get_context('fork').Pool(2) as p:\n        print(sum(p.map(work, range(8))))",
                s.numpy_n
            )),
        },
        "mp-dict" => Case {
            name: "mp-dict",
            about: format!(
                "Python multiprocessing: the parent builds {{i: str(i)}} for {} keys (its heap), \
                 then a Pool of 2 forked workers reads all of it in 8 slices (the dict reaches \
                 them by fork)",
                s.dict_n
            ),
            argv: py(format!(
                "import multiprocessing as mp\nn = {}\nd = {{i: str(i) for i in range(n)}}\n\
                 def work(k):\n    return sum(len(d[i]) for i in range(k, n, 8))\n\
                 if __name__ == '__main__':\n    \
                 with mp.get_context('fork').Pool(2) as p:\n        print(len(d), sum(p.map(work, range(8))))",
                s.dict_n
            )),
        },
        "pydict" => Case {
            name: "pydict",
            about: format!("Python: {{i: str(i)}} for {} keys", s.dict_n),
            argv: py(format!(
                "d = {{i: str(i) for i in range({})}}\nprint(len(d), sum(map(len, d.values())))",
                s.dict_n
            )),
        },
        "awk" => {
            let input = numbers_file(dir, s.awk_lines, 2)?;
            Case {
                name: "awk",
                about: format!(
                    "awk associative array of {} lines (many small allocations)",
                    s.awk_lines
                ),
                argv: vec![
                    "awk".into(),
                    "{ a[$1] = NR } END { n = 0; for (k in a) { n++; s += a[k] % 1000 }; print n, s }"
                        .into(),
                    input.display().to_string(),
                ],
            }
        }
        "perl" => {
            let input = numbers_file(dir, s.perl_lines, 3)?;
            Case {
                name: "perl",
                about: format!(
                    "perl: read {} lines into a list and sort them numerically (many small scalars)",
                    s.perl_lines
                ),
                argv: vec![
                    "perl".into(),
                    "-e".into(),
                    "my @a = <>; my @s = sort { $a <=> $b } @a; my $x = 0; \
                     $x = ($x * 31 + $_) % 1000000007 for @s; \
                     print scalar(@s), ' ', $s[0] + 0, ' ', $s[-1] + 0, \" $x\\n\""
                        .into(),
                    input.display().to_string(),
                ],
            }
        }
        "make" => {
            let d = make_project(dir, s.make_files, s.make_lines)?;
            Case {
                name: "make",
                about: format!(
                    "make -j2: gcc -O2 builds {} C files of one {}-statement function each (two \
                     cc1 processes at a time, the whole tree under one budget), then the program runs",
                    s.make_files, s.make_lines
                ),
                // The directory as the shell's $1: any path, spaces included.
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    r#"make -s -C "$1" clean && make -s -j2 -C "$1" && "$1/prog""#.into(),
                    "sh".into(),
                    d.display().to_string(),
                ],
            }
        }
        other => {
            return Err(Failure::Usage(format!(
                "--case: unknown case {other:?}: use {} (comma-separated, or all)",
                CASES.join(", ")
            )))
        }
    })
}

/// Parses `--case a,b` (or `all`).
pub fn parse_cases(s: &str) -> Result<Vec<String>, Failure> {
    if s.trim() == "all" {
        return Ok(CASES.iter().map(|c| c.to_string()).collect());
    }
    let mut out = Vec::new();
    for c in s.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if !CASES.contains(&c) {
            return Err(Failure::Usage(format!(
                "--case: unknown case {c:?}: use {} (comma-separated, or all)",
                CASES.join(", ")
            )));
        }
        if !out.iter().any(|o| o == c) {
            out.push(c.to_string());
        }
    }
    if out.is_empty() {
        return Err(Failure::Usage("--case: no case given".into()));
    }
    Ok(out)
}

/// The process tree below a root, sampled: largest sum of VmRSS, largest single VmHWM.
#[derive(Default, Clone, Copy)]
struct TreePeak {
    sum_rss: u64,
    max_hwm: u64,
}

impl TreePeak {
    fn bytes(&self) -> u64 {
        self.sum_rss.max(self.max_hwm)
    }
}

fn status_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The pids below `root` (not `root` itself), from /proc/PID/task/TID/children.
fn descendants(root: u32, out: &mut Vec<u32>) {
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(s) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for c in s.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                if !out.contains(&c) {
                    out.push(c);
                    stack.push(c);
                }
            }
        }
    }
}

/// Samples the tree below `root` every 20 ms until `stop`; `include_root` counts the root too.
fn sample_tree(
    root: u32,
    include_root: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(TreePeak, Vec<u32>)> {
    std::thread::spawn(move || {
        let mut peak = TreePeak::default();
        let mut seen = Vec::new();
        loop {
            let done = stop.load(Ordering::Relaxed);
            let mut pids = Vec::new();
            if include_root {
                pids.push(root);
            }
            descendants(root, &mut pids);
            let mut sum = 0;
            for p in &pids {
                let Ok(st) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
                    continue;
                };
                sum += status_kib(&st, "VmRSS:");
                peak.max_hwm = peak.max_hwm.max(status_kib(&st, "VmHWM:"));
                if !seen.contains(p) {
                    seen.push(*p);
                }
            }
            peak.sum_rss = peak.sum_rss.max(sum);
            if done {
                return (peak, seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// What one run of a program produced.
struct Ran {
    wall_s: f64,
    peak: TreePeak,
    stdout: PathBuf,
    code: Option<i32>,
    stderr_tail: String,
}

/// Starts `cmd` with stdout to `out` and stderr captured, waits for it while sampling its tree;
/// on an interruption kills the whole tree.
fn run_measured(mut cmd: Command, include_root: bool, out: &Path) -> Result<Ran, Failure> {
    let f = File::create(out).map_err(|e| Failure::Run(format!("{}: {e}", out.display())))?;
    let err_path = out.with_extension("stderr");
    let ef = File::create(&err_path)
        .map_err(|e| Failure::Run(format!("{}: {e}", err_path.display())))?;
    cmd.stdin(Stdio::null()).stdout(f).stderr(ef);
    let t0 = Instant::now();
    let mut child: Child = cmd
        .spawn()
        .map_err(|e| Failure::Run(format!("cannot start {cmd:?}: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_tree(child.id(), include_root, stop.clone());
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Err(Failure::Run(format!("waiting for {cmd:?}: {e}"))),
        }
        if crate::interrupt::interrupted() {
            let mut tree = Vec::new();
            descendants(child.id(), &mut tree);
            for p in tree.iter().rev() {
                let _ = usermm_sys::kill(*p, 9);
            }
            let _ = child.kill();
            let _ = child.wait();
            stop.store(true, Ordering::Relaxed);
            let _ = sampler.join();
            return Err(Failure::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let wall_s = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (peak, _) = sampler
        .join()
        .map_err(|_| Failure::Run("the RSS sampler panicked".into()))?;
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
    Ok(Ran {
        wall_s,
        peak,
        stdout: out.to_path_buf(),
        code: status.code(),
        stderr_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

/// Compares two files byte by byte: None if identical, else where they first differ.
fn first_difference(a: &Path, b: &Path) -> Result<Option<u64>, Failure> {
    let open = |p: &Path| File::open(p).map_err(|e| Failure::Run(format!("{}: {e}", p.display())));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    let mut off = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if let Some(i) = (0..na.min(nb)).find(|&i| ba[i] != bb[i]) {
            return Ok(Some(off + i as u64));
        }
        if na != nb {
            return Ok(Some(off + na.min(nb) as u64));
        }
        if na == 0 {
            return Ok(None);
        }
        off += na as u64;
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> Result<usize, Failure> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(Failure::Run(format!("reading an output: {e}"))),
        }
    }
    Ok(n)
}

/// One engine run's measurements.
#[derive(Clone)]
struct EngineRun {
    engine: Engine,
    run: u32,
    wall_s: f64,
    peak_tree_rss: u64,
    /// usermm: the sum of the managers' peak resident; kernel: the cgroup's peak usage.
    engine_peak: u64,
    pgfault: u64,
    pgmajfault: u64,
    pswpout: u64,
    pswpin: u64,
    /// `workingset_refault_anon` + `workingset_refault_file`: usermm's managers, or the
    /// kernel's /proc/vmstat over the run.
    refaults: u64,
    identical: bool,
    problem: Option<String>,
    extra: Value,
}

impl EngineRun {
    fn json(&self) -> Value {
        json!({
            "engine": self.engine.name(),
            "run": self.run,
            "wall_s": self.wall_s,
            "peak_tree_rss_bytes": self.peak_tree_rss,
            "engine_peak_bytes": self.engine_peak,
            "pgfault": self.pgfault,
            "pgmajfault": self.pgmajfault,
            "pswpout": self.pswpout,
            "pswpin": self.pswpin,
            "workingset_refault": self.refaults,
            "output_identical": self.identical,
            "problem": self.problem,
            "detail": self.extra,
        })
    }
}

fn program_problem(case: &str, engine: &str, r: &Ran) -> Option<String> {
    match r.code {
        Some(0) => None,
        Some(c) => Some(format!(
            "{case} under {engine} exited with status {c}: {}",
            r.stderr_tail
        )),
        None => Some(format!(
            "{case} under {engine} was killed by a signal: {}",
            r.stderr_tail
        )),
    }
}

/// Runs the case under `usermm run`.
fn run_usermm(p: &Params, c: &Case, dir: &Path, run: u32) -> Result<EngineRun, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find the usermm binary: {e}")))?;
    let report = dir.join(format!("{}-usermm-{run}.json", c.name));
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .args(["--budget", &p.budget.to_string()])
        .args(["--swap", &p.swap])
        .args(["--swap-size", &p.swap_size.to_string()]);
    for s in &p.set {
        cmd.args(["--set", s]);
    }
    cmd.arg("--json")
        .arg("-o")
        .arg(&report)
        .arg("--")
        .args(&c.argv);
    env_for(&mut cmd);
    let out = dir.join(format!("{}-usermm-{run}.out", c.name));
    let r = run_measured(cmd, false, &out)?;
    let mut er = EngineRun {
        engine: Engine::Usermm,
        run,
        wall_s: r.wall_s,
        peak_tree_rss: r.peak.bytes(),
        engine_peak: 0,
        pgfault: 0,
        pgmajfault: 0,
        pswpout: 0,
        pswpin: 0,
        refaults: 0,
        identical: false,
        problem: program_problem(c.name, "usermm run", &r),
        extra: Value::Null,
    };
    let rep: Value = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut procs: Vec<&Value> = Vec::new();
    if !rep["process"].is_null() {
        procs.push(&rep["process"]);
    }
    if let Some(o) = rep["other_processes"].as_array() {
        procs.extend(o.iter());
    }
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let mut managed = 0;
    for pr in &procs {
        let m = &pr["manager"];
        if m.is_null() {
            continue;
        }
        managed += 1;
        er.engine_peak += u(&m["peak_resident_bytes"]);
        er.pgfault += u(&m["vmstat"]["pgfault"]);
        er.pgmajfault += u(&m["vmstat"]["pgmajfault"]);
        er.pswpout += u(&m["vmstat"]["pswpout"]);
        er.pswpin += u(&m["vmstat"]["pswpin"]);
        er.refaults +=
            u(&m["vmstat"]["workingset_refault_anon"]) + u(&m["vmstat"]["workingset_refault_file"]);
    }
    // One budget for the tree: its peak is what the managers held at once.
    if let Some(t) = rep["tree"]["peak_charged_bytes"].as_u64() {
        er.engine_peak = t;
    }
    er.extra = json!({
        "processes": procs.len(),
        "processes_with_manager": managed,
        "settings": rep["environment"]["USERMM_SET"],
        "tree": rep["tree"],
        "warnings": rep["warnings"],
    });
    if rep.is_null() && er.problem.is_none() {
        er.problem = Some(format!(
            "{}: usermm run wrote no report ({})",
            c.name, r.stderr_tail
        ));
    }
    Ok(er)
}

/// Runs the case in a memory cgroup with kernel swap (a fresh environment per run).
fn run_kernel(setup: &kernel::Setup, c: &Case, dir: &Path, run: u32) -> Result<EngineRun, Failure> {
    let env = kernel::Env::create(setup)?;
    let cg = env
        .cgroup
        .as_ref()
        .ok_or_else(|| Failure::Run("kernel engine: no cgroup".into()))?;
    let procs = cg.dir.join("cgroup.procs");
    // The shell joins the cgroup, then becomes the program: nothing is allocated outside.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(&procs)
        .args(&c.argv);
    env_for(&mut cmd);
    let before_vm = kernel::worker::proc_vmstat();
    let out = dir.join(format!("{}-kernel-{run}.out", c.name));
    let r = run_measured(cmd, true, &out);
    let after_vm = kernel::worker::proc_vmstat();
    let stat = kernel::cgroup::stat_of(&cg.dir);
    let peak = cg.peak().unwrap_or(0);
    let ooms = cg.oom_kills();
    let describe = env.describe();
    env.teardown()?;
    let r = r?;
    let d = |k: &str| after_vm.val(k).saturating_sub(before_vm.val(k));
    let mut problem = program_problem(c.name, "the kernel engine", &r);
    if ooms > 0 {
        problem = Some(format!(
            "{}: the kernel's OOM killer killed {ooms} process(es) in the cgroup (budget + swap too small)",
            c.name
        ));
    }
    Ok(EngineRun {
        engine: Engine::Kernel,
        run,
        wall_s: r.wall_s,
        peak_tree_rss: r.peak.bytes(),
        engine_peak: peak,
        pgfault: stat.val("pgfault").max(stat.val("total_pgfault")),
        pgmajfault: stat.val("pgmajfault").max(stat.val("total_pgmajfault")),
        pswpout: d("pswpout"),
        pswpin: d("pswpin"),
        refaults: d("workingset_refault_anon") + d("workingset_refault_file"),
        identical: false,
        problem,
        extra: json!({ "setup": describe }),
    })
}

/// The environment every run of a program gets (native and both engines alike).
fn env_for(cmd: &mut Command) {
    cmd.env("LC_ALL", "C").env("PYTHONHASHSEED", "0");
}

fn median_u(v: Vec<u64>) -> u64 {
    median(v.into_iter().map(|x| x as f64).collect()) as u64
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks that the programs the cases need are there, naming the package to install.
fn check_programs(cases: &[String]) -> Result<(), Failure> {
    let have = |prog: &str| {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
            .unwrap_or(false)
    };
    for c in cases {
        let (prog, pkg) = match c.as_str() {
            "sort" => ("sort", "coreutils"),
            "numpy" | "pydict" | "mp-numpy" | "mp-pool" | "mp-dict" => ("python3", "python3"),
            "awk" => ("awk", "mawk or gawk"),
            "perl" => ("perl", "perl-base"),
            "make" if !have("cc") => ("cc", "gcc"),
            "make" => ("make", "make"),
            _ => continue,
        };
        if !have(prog) {
            return Err(Failure::Run(format!(
                "case {c} needs {prog}, which is not in $PATH: install {pkg}, or leave the case out with --case"
            )));
        }
        if c == "numpy" || c == "mp-numpy" || c == "mp-pool" {
            let ok = Command::new("python3")
                .args(["-c", "import numpy"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                return Err(Failure::Run(format!(
                    "case {c} needs numpy for python3: install python3-numpy (or pip install numpy), or leave the case out with --case"
                )));
            }
        }
    }
    Ok(())
}

/// Runs the benchmark.
pub fn run(p: &Params) -> Result<(), Failure> {
    check_programs(&p.cases)?;
    engine::prepare(&p.engines)?;
    let dir = p
        .dir
        .join(format!("usermm-bench-apps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::Run(format!("cannot create {}: {e}", dir.display())))?;
    let _tmp = TempDir(dir.clone());
    let sz = sizes(p.quick);
    let setup = &p.kernel;
    let kernel_swap = setup.swap_kind();
    let header = format!(
        "usermm bench apps: budget {}, swap {} {} (usermm: `usermm run`; kernel: memory cgroup of the budget + {kernel_swap}), {} run(s) per engine{}",
        mib(p.budget),
        p.swap,
        mib(p.swap_size),
        p.runs,
        if p.quick { ", --quick inputs" } else { "" }
    );
    if !p.json {
        println!("{header}");
    }
    let mut results: Vec<Value> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut rows: Vec<[String; 11]> = Vec::new();
    let mut legend: Vec<String> = Vec::new();
    for name in &p.cases {
        let c = build_case(name, &sz, &dir)?;
        legend.push(format!("  {:<7} {}", c.name, c.about));
        if !p.json {
            eprintln!("[{}] native ...", c.name);
        }
        let mut ncmd = Command::new(&c.argv[0]);
        ncmd.args(&c.argv[1..]);
        env_for(&mut ncmd);
        let native_out = dir.join(format!("{}-native.out", c.name));
        let native = run_measured(ncmd, true, &native_out)?;
        if let Some(prob) = program_problem(c.name, "native", &native) {
            return Err(Failure::Run(format!(
                "{prob}\n(the native reference run failed: fix the environment first)"
            )));
        }
        let mut runs: Vec<EngineRun> = Vec::new();
        for i in 0..p.runs {
            for e in &p.engines {
                if !p.json {
                    eprintln!("[{}] {} run {} ...", c.name, e.name(), i + 1);
                }
                let mut er = match e {
                    Engine::Usermm => run_usermm(p, &c, &dir, i)?,
                    Engine::Kernel => run_kernel(setup, &c, &dir, i)?,
                };
                let out = dir.join(format!("{}-{}-{i}.out", c.name, e.name()));
                match first_difference(&native.stdout, &out)? {
                    None => er.identical = true,
                    Some(off) => {
                        er.identical = false;
                        failures.push(format!(
                            "OUTPUT MISMATCH: {} under {} (run {}) differs from the native output at byte {off}",
                            c.name,
                            e.name(),
                            i + 1
                        ));
                    }
                }
                if let Some(prob) = &er.problem {
                    failures.push(format!("FAILED: {prob}"));
                }
                let _ = std::fs::remove_file(&out);
                runs.push(er);
            }
        }
        // Medians over the runs that succeeded with the native output: a run the OOM killer
        // ended is short and its time means nothing (it is a failure above, and counted).
        let of = |e: Engine| {
            runs.iter()
                .filter(move |r| r.engine == e && r.identical && r.problem.is_none())
        };
        let n_ok = |e: Engine| of(e).count();
        let wall = |e: Engine| median(of(e).map(|r| r.wall_s).collect());
        let rss = |e: Engine| median_u(of(e).map(|r| r.peak_tree_rss).collect());
        let maj = |e: Engine| median_u(of(e).map(|r| r.pgmajfault).collect());
        let flt = |e: Engine| median_u(of(e).map(|r| r.pgfault).collect());
        let refaults = |e: Engine| median_u(of(e).map(|r| r.refaults).collect());
        // An engine counts when it ran at least one run that succeeded.
        let has = |e: Engine| p.engines.contains(&e) && n_ok(e) > 0;
        let (wu, wk) = (wall(Engine::Usermm), wall(Engine::Kernel));
        let speed = (has(Engine::Usermm) && has(Engine::Kernel) && wu > 0.0).then(|| wk / wu);
        let all_identical = runs.iter().all(|r| r.identical);
        let dash = || "-".to_string();
        let secs = |e: Engine| {
            let n = p.runs as usize;
            if has(e) && n_ok(e) < n {
                format!("{:.2} s ({} of {n} ok)", wall(e), n_ok(e))
            } else if has(e) {
                format!("{:.2} s", wall(e))
            } else if p.engines.contains(&e) {
                format!("failed {n}/{n}")
            } else {
                dash()
            }
        };
        let mb = |e: Engine| {
            if has(e) {
                format!("{:.0} MiB", rss(e) as f64 / (1 << 20) as f64)
            } else {
                dash()
            }
        };
        let faults = |e: Engine| {
            if has(e) {
                format!("{}/{}", flt(e), maj(e))
            } else {
                dash()
            }
        };
        rows.push([
            c.name.to_string(),
            format!("{:.2} s", native.wall_s),
            secs(Engine::Usermm),
            secs(Engine::Kernel),
            speed.map_or_else(dash, |s| format!("{s:.2}x")),
            mb(Engine::Usermm),
            mb(Engine::Kernel),
            faults(Engine::Usermm),
            faults(Engine::Kernel),
            [Engine::Usermm, Engine::Kernel]
                .map(|e| {
                    if has(e) {
                        refaults(e).to_string()
                    } else {
                        dash()
                    }
                })
                .join("/"),
            if all_identical {
                "identical".into()
            } else {
                "MISMATCH".into()
            },
        ]);
        let mut medians = BTreeMap::new();
        for e in &p.engines {
            if !has(*e) {
                medians.insert(e.name(), json!({ "ok_runs": 0 }));
                continue;
            }
            medians.insert(
                e.name(),
                json!({
                    "ok_runs": n_ok(*e),
                    "wall_s": wall(*e),
                    "peak_tree_rss_bytes": rss(*e),
                    "pgfault": flt(*e),
                    "pgmajfault": maj(*e),
                    "workingset_refault": refaults(*e),
                }),
            );
        }
        results.push(json!({
            "case": c.name,
            "about": c.about,
            "argv": c.argv,
            "native": { "wall_s": native.wall_s, "peak_tree_rss_bytes": native.peak.bytes() },
            "runs": runs.iter().map(EngineRun::json).collect::<Vec<_>>(),
            "median": medians,
            "speed_vs_kernel": speed,
            "output_identical": all_identical,
        }));
    }
    if p.json {
        println!(
            "{}",
            json!({
                "benchmark": "apps",
                "budget_bytes": p.budget,
                "swap": p.swap,
                "swap_bytes": p.swap_size,
                "settings": p.set,
                "runs": p.runs,
                "quick": p.quick,
                "engines": p.engines.iter().map(|e| e.name()).collect::<Vec<_>>(),
                "cases": results,
                "failures": failures,
            })
        );
    } else {
        println!("{}", table(&rows));
        println!("median of the runs that succeeded with the native output (\"k of n ok\": the others failed, listed below; \"failed\": none did, no speed); speed = kernel time / usermm time (above 1: usermm faster); peak RSS of the whole process tree; faults pgfault/pgmajfault as each engine counts them; refaults workingset_refault_anon + _file, usermm/kernel");
        if !p.set.is_empty() {
            println!("usermm run --set {}", p.set.join(" --set "));
        }
        for l in &legend {
            println!("{l}");
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        for f in &failures {
            eprintln!("usermm bench apps: {f}");
        }
        Err(Failure::Run(format!(
            "{} failure(s) above: outputs must be identical to the native run and every program must succeed",
            failures.len()
        )))
    }
}

fn table(rows: &[[String; 11]]) -> String {
    let head = [
        "case",
        "native",
        "usermm",
        "kernel",
        "speed",
        "RSS usermm",
        "RSS kernel",
        "faults usermm",
        "faults kernel",
        "refaults u/k",
        "output",
    ];
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 || i == cells.len() - 1 {
                    format!("{c:<width$}", width = w[i])
                } else {
                    format!("{c:>width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut s = line(head.to_vec());
    for r in rows {
        s.push('\n');
        s.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_and_reject_unknown_names() {
        assert_eq!(parse_cases("all").unwrap().len(), CASES.len());
        assert_eq!(
            parse_cases("sort,numpy,sort").unwrap(),
            vec!["sort", "numpy"]
        );
        match parse_cases("sort,gcc") {
            Err(Failure::Usage(m)) => assert!(m.contains("gcc") && m.contains("pydict"), "{m}"),
            _ => panic!("expected a usage error"),
        }
    }

    #[test]
    fn inputs_are_deterministic_and_outputs_compared_bytewise() {
        let d = std::env::temp_dir().join(format!("apps-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let a = numbers_file(&d, 1000, 7).unwrap();
        let first = std::fs::read(&a).unwrap();
        std::fs::remove_file(&a).unwrap();
        let a = numbers_file(&d, 1000, 7).unwrap();
        assert_eq!(first, std::fs::read(&a).unwrap());
        assert_eq!(first.iter().filter(|&&b| b == b'\n').count(), 1000);
        let b = d.join("b");
        std::fs::write(&b, &first).unwrap();
        assert_eq!(first_difference(&a, &b).unwrap(), None);
        let mut changed = first.clone();
        let at = 7_000.min(changed.len() - 1);
        changed[at] ^= 1;
        std::fs::write(&b, &changed).unwrap();
        assert!(first_difference(&a, &b).unwrap().is_some());
        std::fs::write(&b, &first[..first.len() - 1]).unwrap();
        assert_eq!(
            first_difference(&a, &b).unwrap(),
            Some(first.len() as u64 - 1)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
