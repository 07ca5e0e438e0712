//! `usermm run` end to end: unmodified programs (C programs built here with gcc, GNU sort,
//! Python with numpy) run with the preload library; their output is checked, and so is the
//! memory: usermm's peak resident memory within the budget and the process's peak RSS (VmHWM)
//! within the budget plus a small fixed overhead. Also exit statuses and error messages.
//!
//! Needs the preload library built (`cargo test --workspace` builds it; alone:
//! `cargo build --release -p usermm-preload`) and gcc.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn usermm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_usermm"));
    c.env("LC_ALL", "C");
    c
}

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn progs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/progs")
}

/// Compiles a C program with gcc into the test's temporary directory.
fn gcc(src: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = tmp().join(name);
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .args(extra)
        .output()
        .expect("running gcc (install gcc)");
    assert!(
        o.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `usermm run OPTS --json -o FILE -- PROGRAM...`: the program's output and the report.
fn run_json(name: &str, opts: &[&str], program: &[&str]) -> (Output, Value) {
    let report = tmp().join(format!("{name}.json"));
    let _ = std::fs::remove_file(&report);
    let o = usermm()
        .arg("run")
        .args(opts)
        .arg("--json")
        .arg("-o")
        .arg(&report)
        .arg("--")
        .args(program)
        .output()
        .expect("running usermm run");
    let r = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report {}: {e}\n{}", report.display(), text(&o)));
    let v: Value = serde_json::from_str(&r).unwrap_or_else(|e| panic!("bad JSON {e}: {r}"));
    (o, v)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Peak resident memory by usermm's accounting within the budget, and the process's peak RSS
/// within the budget plus `overhead`.
fn assert_memory(p: &Value, budget: u64, overhead: u64) {
    let m = &p["manager"];
    assert!(!m.is_null(), "no manager in {p}");
    assert_eq!(u(&m["budget_bytes"]), budget);
    let peak = u(&m["peak_resident_bytes"]);
    assert!(peak <= budget, "peak resident {peak} > budget {budget}");
    let hwm = u(&p["vm_hwm_bytes"]);
    assert!(
        hwm <= budget + overhead,
        "peak RSS {} MiB > budget {} MiB + {} MiB",
        hwm / MIB,
        budget / MIB,
        overhead / MIB
    );
    assert!(u(&m["vmstat"]["pswpout"]) > 0, "nothing swapped out: {m}");
}

#[test]
fn c_program_mallocs_four_times_the_budget() {
    let exe = gcc(&progs().join("bigmalloc.c"), "bigmalloc", &[]);
    let (o, v) = run_json(
        "bigmalloc",
        &["--budget", "32M", "--swap-size", "256M"],
        &[exe.to_str().unwrap(), "128", "32"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("verified 128 MiB"));
    assert_eq!(v["exit_code"], 0);
    let p = &v["process"];
    assert!(u(&p["managed_mallocs"]) >= 4, "{p}");
    assert!(u(&p["peak_managed_bytes"]) >= 128 * MIB, "{p}");
    assert_memory(p, 32 * MIB, 16 * MIB);
}

#[test]
fn gnu_sort_with_a_buffer_beyond_the_budget() {
    // ~13 MB of lines: 500k lines with 32-byte line structs make sort's working set ~30 MB,
    // twice the 16 MiB budget; -S 256M makes sort malloc a 256 MiB buffer.
    let input = tmp().join("sort-input.txt");
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut s = String::with_capacity(14 << 20);
    for i in 0..500_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{x:016x} {i:08}\n"));
    }
    std::fs::write(&input, s).unwrap();
    let (ko, uo) = (tmp().join("sort-kernel.txt"), tmp().join("sort-usermm.txt"));
    let k = Command::new("sort")
        .env("LC_ALL", "C")
        .args(["-S", "256M", "--parallel=2", "-o"])
        .arg(&ko)
        .arg(&input)
        .output()
        .unwrap();
    assert!(k.status.success(), "{}", text(&k));
    let (o, v) = run_json(
        "sort",
        &["--budget", "16M", "--swap-size", "512M"],
        &[
            "sort",
            "-S",
            "256M",
            "--parallel=2",
            "-o",
            uo.to_str().unwrap(),
            input.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let (a, b) = (std::fs::read(&ko).unwrap(), std::fs::read(&uo).unwrap());
    assert_eq!(a.len(), b.len());
    assert!(a == b, "usermm's sort output differs from the kernel's");
    let lines: Vec<&[u8]> = b.split(|&c| c == b'\n').filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 500_000);
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "output not sorted");
    let p = &v["process"];
    assert!(u(&p["managed_mallocs"]) >= 1, "{p}");
    assert!(u(&p["peak_managed_bytes"]) >= 256 * MIB, "{p}");
    assert_memory(p, 16 * MIB, 16 * MIB);
}

#[test]
fn usemem_single_task_and_forked_tasks() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/c/usemem.c");
    let exe = gcc(&src, "usemem", &[]);
    let (o, v) = run_json(
        "usemem1",
        &["--budget", "32M", "--swap-size", "256M"],
        &[exe.to_str().unwrap(), "--verify", "128M"],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        out.contains("134217728 bytes / ") && out.contains(" KB/s\n"),
        "{out}"
    );
    assert!(out.contains("task 0 verified 134217728 bytes"), "{out}");
    let p = &v["process"];
    assert_eq!(u(&p["managed_mmaps"]), 1, "{p}");
    assert_memory(p, 32 * MIB, 16 * MIB);

    // usemem -n 2 forks two tasks: each child gets its own manager and budget.
    let (o, v) = run_json(
        "usemem2",
        &["--budget", "16M", "--swap-size", "128M"],
        &[exe.to_str().unwrap(), "-n", "2", "--verify", "64M"],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        out.contains("task 0 verified") && out.contains("task 1 verified"),
        "{out}"
    );
    let kids: Vec<&Value> = v["other_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["forked"] == true)
        .collect();
    assert_eq!(kids.len(), 2, "{v}");
    for k in kids {
        assert_eq!(u(&k["managed_mmaps"]), 1, "{k}");
        assert_memory(k, 16 * MIB, 16 * MIB);
    }

    // A named swap file is claimed by one process; the other swaps to a temporary file.
    let swap = tmp().join("usemem-swapfile");
    let (o, v) = run_json(
        "usemem3",
        &[
            "--budget",
            "8M",
            "--swap",
            &format!("file:{}", swap.display()),
            "--swap-size",
            "64M",
        ],
        &[exe.to_str().unwrap(), "-n", "2", "--verify", "32M"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let notes: Vec<&Value> = v["other_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["forked"] == true)
        .map(|p| &p["swap_note"])
        .collect();
    assert_eq!(notes.len(), 2, "{v}");
    assert_eq!(notes.iter().filter(|n| n.is_null()).count(), 1, "{v}");
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .is_some_and(|s| s.contains("in use by another usermm manager"))),
        "{v}"
    );
    let _ = std::fs::remove_file(swap);
}

#[test]
fn python_numpy_array_four_times_the_budget() {
    let probe = Command::new("python3")
        .args(["-c", "import numpy"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "numpy must be installed in CI (.ci/run installs it)"
        );
        eprintln!("SKIPPED python_numpy_array_four_times_the_budget: python3 with numpy is not installed (pip install numpy)");
        return;
    }
    let script = "import numpy as np\n\
n = 128 * (1 << 20) // 8\n\
a = np.arange(n, dtype=np.float64)\n\
s = a.sum()\n\
assert s == n * (n - 1) / 2, (s, n)\n\
a[:] = 1.5\n\
assert a.sum() == 1.5 * n\n\
a[::4096] = np.arange(n // 4096)\n\
assert a[4096 * 1000] == 1000.0 and a[4096 * 1000 + 1] == 1.5\n\
print('numpy sum ok', n)\n";
    let (o, v) = run_json(
        "numpy",
        &["--budget", "32M", "--swap-size", "512M"],
        &["python3", "-c", script],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("numpy sum ok 16777216"));
    let p = &v["process"];
    assert!(
        u(&p["managed_mallocs"]) + u(&p["managed_mmaps"]) >= 1,
        "{p}"
    );
    assert!(u(&p["peak_managed_bytes"]) >= 128 * MIB, "{p}");
    // The interpreter and numpy's libraries are ~30 MiB of RSS by themselves.
    assert_memory(p, 32 * MIB, 48 * MIB);
}

#[test]
fn forked_children_never_see_stale_managed_memory() {
    let exe = gcc(&progs().join("forkcheck.c"), "forkcheck", &[]);
    let (o, v) = run_json(
        "forkcheck",
        &["--budget", "16M", "--swap-size", "128M"],
        &[exe.to_str().unwrap(), "32"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("forkcheck ok"),
        "{}",
        text(&o)
    );
    assert_memory(&v["process"], 16 * MIB, 16 * MIB);
}

#[test]
fn threads_allocate_concurrently() {
    let exe = gcc(&progs().join("threads.c"), "threads", &["-pthread"]);
    let (o, v) = run_json(
        "threads",
        &["--budget", "16M", "--swap-size", "256M"],
        &[exe.to_str().unwrap(), "4", "16", "3"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("threads ok"));
    let p = &v["process"];
    // Each round: a malloc of half the chunk, then realloc to the whole chunk moves it.
    assert_eq!(u(&p["managed_mallocs"]), 4 * 3 * 2, "{p}");
    assert_eq!(u(&p["manager"]["regions"]), 0, "{p}");
    assert_eq!(u(&p["manager"]["committed_bytes"]), 0, "{p}");
    assert_memory(p, 16 * MIB, 16 * MIB);
}

#[test]
fn mmap_family_semantics() {
    let exe = gcc(&progs().join("mmapcheck.c"), "mmapcheck", &[]);
    let (o, v) = run_json(
        "mmapcheck",
        &["--budget", "32M", "--swap-size", "512M"],
        &[exe.to_str().unwrap()],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains(" passed, 0 failed"), "{out}");
    let p = &v["process"];
    assert_eq!(u(&p["managed_mmaps"]), 3, "{p}");
    // file MAP_FIXED, mprotect(PROT_READ), MADV_REMOVE, mlock, MREMAP_FIXED
    assert_eq!(u(&p["refused"]), 5, "{p}");
    assert_eq!(u(&p["mremap_moved"]), 1, "{p}");
}

#[test]
fn stats_summary_and_exit_status() {
    let exe = gcc(&progs().join("bigmalloc.c"), "bigmalloc-stats", &[]);
    let o = usermm()
        .args([
            "run",
            "--budget",
            "8M",
            "--swap",
            "ram",
            "--swap-size",
            "64M",
            "--stats",
            "--",
        ])
        .arg(&exe)
        .args(["24", "8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", text(&o));
    assert!(err.contains("exited with status 0"), "{err}");
    assert!(err.contains("budget 8.0 MiB, swap ram"), "{err}");
    assert!(err.contains("peak resident"), "{err}");
    let o = usermm()
        .args(["run", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let o = usermm()
        .args(["run", "--stats", "--", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(128 + 9), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("killed by signal 9"));
}

#[test]
fn programs_the_preload_cannot_serve_are_plain_errors() {
    let o = usermm()
        .args(["run", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/no/such/program: no such program"));
    let o = usermm()
        .args(["run", "--", "no-such-program-xyz"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not found in $PATH"));

    let src = tmp().join("static.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let exe = gcc(&src, "static-prog", &["-static"]);
    let o = usermm().arg("run").arg("--").arg(&exe).output().unwrap();
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is statically linked"),
        "{}",
        text(&o)
    );

    let o = usermm()
        .args(["run", "--budget", "256Q", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--budget") && err.contains("256Q"), "{err}");
    let o = usermm()
        .args(["run", "--swap", "tape", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--swap"));
}
