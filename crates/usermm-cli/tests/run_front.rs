//! `usermm run` as a front end: every setting applied or refused (bad `USERMM_*` values and
//! options are errors naming them, `--set` repeats, a swap file in a missing directory is an
//! error), signals forwarded to the program with the report still written and nothing left
//! behind, an unprivileged user, fork then exec, a numpy script under the default settings, and
//! the one stderr line of a refused allocation.
//!
//! Needs the preload library built (`cargo test --workspace` builds it) and python3 with numpy.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn usermm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
}

/// A fresh directory (mode 0777, so an unprivileged user may write in it) used as TMPDIR.
fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("usermm-run-front-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn report(p: &Path) -> Value {
    let t = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("bad JSON {e}: {t}"))
}

/// Environment, options, words the error must contain.
type BadCase<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a [&'a str]);

#[test]
fn bad_values_and_settings_are_errors_naming_them() {
    let cases: &[BadCase] = &[
        (
            &[("USERMM_SET", "garbage")],
            &[],
            &["USERMM_SET", "garbage"],
        ),
        (&[("USERMM_BUDGET", "12Q")], &[], &["USERMM_BUDGET", "12Q"]),
        (&[("USERMM_SWAP", "tape")], &[], &["USERMM_SWAP", "tape"]),
        (
            &[("USERMM_SWAP_SIZE", "lots")],
            &[],
            &["USERMM_SWAP_SIZE", "lots"],
        ),
        (
            &[("USERMM_OVERCOMMIT", "maybe")],
            &[],
            &["USERMM_OVERCOMMIT", "maybe"],
        ),
        (
            &[("USERMM_PRELOAD_THRESHOLD", "big")],
            &[],
            &["USERMM_PRELOAD_THRESHOLD", "big"],
        ),
        // Faults served on the faulting thread cannot serve a program whose heap is managed.
        (
            &[],
            &["--set", "fault_path=sigbus"],
            &[
                "fault_path=sigbus",
                "usermm run",
                "EFAULT",
                "fault_path=handler",
            ],
        ),
        (
            &[("USERMM_SET", "fault_path=sigbus")],
            &[],
            &["fault_path=sigbus", "usermm run"],
        ),
        (
            &[],
            &["--set", "laptop_mode=sometimes"],
            &["--set", "laptop_mode"],
        ),
        (&[], &["--set", "nonsense"], &["--set", "nonsense"]),
        (
            &[],
            &["--swap", "file:/nonexistent/dir/x"],
            &["/nonexistent/dir", "does not exist"],
        ),
        (
            &[("USERMM_SWAP", "file:/nonexistent/dir/x")],
            &[],
            &["USERMM_SWAP", "/nonexistent/dir"],
        ),
        (&[], &["--budget", "100k"], &["--budget", "1 MiB"]),
    ];
    for (env, args, want) in cases {
        let mut c = usermm();
        c.arg("run").args(*args).args(["--", "true"]);
        for (k, v) in *env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{env:?} {args:?}: {}", text(&o));
        for w in *want {
            assert!(e.contains(w), "{env:?} {args:?}: {w:?} missing from: {e}");
        }
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    }
}

#[test]
fn settings_repeat_and_apply_over_the_environment() {
    let d = fresh_dir("set");
    let rep = d.join("r.json");
    let o = usermm()
        .env("USERMM_SET", "accessed_init=old")
        .env("USERMM_BUDGET", "48M")
        .env("TMPDIR", &d)
        .args([
            "run",
            "--set",
            "laptop_mode=on",
            "--set",
            "kswapd_write_twice=old",
        ])
        .args(["--json", "-o"])
        .arg(&rep)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let r = report(&rep);
    assert_eq!(
        r["environment"]["USERMM_SET"], "accessed_init=old,laptop_mode=on,kswapd_write_twice=old",
        "{r}"
    );
    // An option not given takes its variable.
    assert_eq!(
        r["environment"]["USERMM_BUDGET"],
        (48u64 << 20).to_string(),
        "{r}"
    );
    // The default swap file: sparse, sized by the free space of TMPDIR's filesystem.
    assert_eq!(r["setup"]["swap_sparse"], true, "{r}");
    assert!(
        r["setup"]["swap_bytes"].as_u64().unwrap() <= 64 << 30,
        "{r}"
    );
    assert!(r["environment"]["USERMM_SWAP_SIZE"].is_null(), "{r}");
    // Nothing is left in TMPDIR (the statistics file is removed).
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "only the report");
    let _ = std::fs::remove_dir_all(&d);
}

/// Starts `usermm run -- python3 -c CODE` (CODE prints its pid and "ready" once its handlers
/// are installed), sends `sig` to usermm run, and returns its output and report.
fn signal_run(name: &str, sig: i32, code: &str) -> (Output, Value, u32, PathBuf) {
    let d = fresh_dir(name);
    let rep = d.join("r.json");
    let mut child = usermm()
        .env("TMPDIR", &d)
        .args(["run", "--json", "-o"])
        .arg(&rep)
        .args(["--", "python3", "-c", code])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pypid: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("pid line: {line:?}"));
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    usermm_sys::kill(child.id(), sig).unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "usermm run did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let o = Output {
        stdout: rest.into_bytes(),
        ..o
    };
    (o, report(&rep), pypid, d)
}

#[test]
fn signals_are_forwarded_and_the_report_is_written() {
    let handler = "import os, signal, sys, time\n\
        def h(s, f):\n    print('got', s, flush=True)\n    sys.exit(7)\n\
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n    signal.signal(s, h)\n\
        print(os.getpid(), flush=True)\nprint('ready', flush=True)\ntime.sleep(60)\n";
    for (sig, name) in [(15, "term"), (1, "hup"), (2, "int")] {
        let (o, r, pypid, d) = signal_run(name, sig, handler);
        assert_eq!(o.status.code(), Some(7), "{}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            format!("got {sig}")
        );
        assert_eq!(r["exit_code"], 7, "{r}");
        assert_eq!(r["signals_forwarded"], serde_json::json!([sig]), "{r}");
        assert!(
            !Path::new(&format!("/proc/{pypid}")).exists(),
            "program left running"
        );
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "stray files in TMPDIR"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
    // A program that does not handle the signal dies of it; usermm run reports 128 + N.
    let plain = "import os, time\nprint(os.getpid(), flush=True)\nprint('ready', flush=True)\ntime.sleep(60)\n";
    let (o, r, pypid, d) = signal_run("plain", 15, plain);
    assert_eq!(o.status.code(), Some(143), "{}", text(&o));
    assert_eq!(r["signal"], 15, "{r}");
    assert!(!Path::new(&format!("/proc/{pypid}")).exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn fork_then_exec_is_managed_in_the_exec_d_program() {
    let d = fresh_dir("exec");
    let rep = d.join("r.json");
    let o = usermm()
        .env("TMPDIR", &d)
        .args(["run", "--budget", "16M", "--swap-size", "256M", "--json", "-o"])
        .arg(&rep)
        .args([
            "--",
            "sh",
            "-c",
            "python3 -c 'x = bytearray(64 << 20); x[::4096] = b\"a\" * (16 << 10); print(x.count(b\"a\"))'; echo done",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "16384\ndone\n");
    let r = report(&rep);
    let managed: Vec<&Value> = r["other_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !p["manager"].is_null())
        .collect();
    assert!(!managed.is_empty(), "the exec'd python had no manager: {r}");
    let p = managed
        .iter()
        // The exec'd python: the process whose manager swapped (sh is managed too now that
        // the whole heap is, but holds a few pages).
        .find(|p| p["manager"]["vmstat"]["pswpout"].as_u64().unwrap_or(0) > 0)
        .unwrap_or_else(|| panic!("no managed process swapped 64 MiB through 16 MiB: {r}"));
    let m = &p["manager"];
    assert!(
        m["vmstat"]["pswpout"].as_u64().unwrap() > 0,
        "64 MiB through 16 MiB: {m}"
    );
    assert!(
        m["peak_resident_bytes"].as_u64().unwrap() <= 16 << 20,
        "{m}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn numpy_512_mib_at_128m_under_the_default_settings() {
    let o = usermm()
        .args(["run", "--budget", "128M", "--json", "-o"])
        .arg(fresh_dir("numpy").join("r.json"))
        .args([
            "--",
            "python3",
            "-c",
            "import numpy as np\nn = 64 << 20\na = np.empty(n, dtype=np.int64)\na[:] = np.arange(n) * 3\nprint(int(a.sum()))",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let n: u128 = 64 << 20;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (3 * n * (n - 1) / 2).to_string()
    );
    let r = report(&fresh_dir_path("numpy").join("r.json"));
    let m = &r["process"]["manager"];
    assert!(
        m["peak_resident_bytes"].as_u64().unwrap() <= 128 << 20,
        "{m}"
    );
    assert!(m["vmstat"]["pswpout"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(r["process"]["enomem"], 0, "{r}");
    let _ = std::fs::remove_dir_all(fresh_dir_path("numpy"));
}

fn fresh_dir_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("usermm-run-front-{name}-{}", std::process::id()))
}

// A single allocation bigger than budget + swap: mimalloc maps it MAP_NORESERVE, and the
// preload refuses such a mapping up front (the kernel's obvious-overcommit check) so Python
// gets NULL and raises MemoryError; the refusal is counted once and reported in one line.
#[test]
fn a_refused_allocation_is_one_line_naming_the_limit_and_the_flag() {
    let o = usermm()
        .args(["run", "--budget", "16M", "--swap-size", "16M", "--"])
        .args(["python3", "-c", "x = bytearray(64 << 20)"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("MemoryError"), "{e}");
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("usermm run:")).collect();
    assert_eq!(lines.len(), 1, "{e}");
    let l = lines[0];
    for w in [
        "refused with ENOMEM",
        "commit limit",
        "16.0 MiB",
        "32.0 MiB",
        "--swap-size",
        "--overcommit",
    ] {
        assert!(l.contains(w), "{w:?} missing: {l}");
    }
}

#[test]
fn read_into_managed_memory_works_under_usermm_run() {
    // One userfaultfd policy: as root the preload's managers get full mode, so read(2) into a
    // fresh (non-resident) managed buffer faults it in rather than failing with EFAULT.
    let d = fresh_dir("read");
    let f = d.join("data");
    std::fs::write(&f, vec![7u8; 8 << 20]).unwrap();
    let o = usermm()
        .args(["run", "--budget", "4M", "--swap-size", "64M", "--"])
        .args(["python3", "-c"])
        .arg(format!(
            "b = bytearray(8 << 20)\nwith open({:?}, 'rb', buffering=0) as f:\n    n = f.readinto(b)\nprint(n, b.count(7))",
            f.display().to_string()
        ))
        .output()
        .unwrap();
    if is_root() {
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "8388608 8388608");
    } else {
        usermm_sys::skip_test("not root: read(2) into managed memory needs full-mode userfaultfd");
    }
    let _ = std::fs::remove_dir_all(&d);
}

fn is_root() -> bool {
    usermm_sys::geteuid() == 0
}

#[test]
fn an_unprivileged_user_gets_a_truthful_run() {
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        usermm_sys::skip_test(
            "needs root and setpriv (util-linux) to switch to an unprivileged user",
        );
        return;
    }
    let d = fresh_dir("unpriv");
    let rep = d.join("r.json");
    // /usr/bin/python3: a user's own interpreter (pyenv under /root) may not be reachable.
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_usermm"))
        .env("TMPDIR", &d)
        .args([
            "run",
            "--budget",
            "16M",
            "--swap-size",
            "256M",
            "--json",
            "-o",
        ])
        .arg(&rep)
        .args(["--", python, "-c"])
        .arg("x = bytearray(64 << 20); x[::4096] = b'a' * (16 << 10); print(x.count(b'a'))")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "16384");
    let r = report(&rep);
    let e = String::from_utf8_lossy(&o.stderr);
    let p = &r["process"];
    let unprivileged_uffd = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    let mode = r["setup"]["userfaultfd"].as_str().unwrap_or("");
    if !unprivileged_uffd {
        // Only UFFD_USER_MODE_ONLY is open to this user (unless /dev/userfaultfd is).
        assert!(
            mode.starts_with("user-mode-only") || mode.contains("/dev/userfaultfd"),
            "{r}"
        );
    }
    if p["manager"].is_null() {
        // Not managed: said in one warning line and in the report, never as "nothing above
        // the threshold was allocated".
        let why = p["manager_error"]
            .as_str()
            .unwrap_or_else(|| panic!("no reason: {r}"));
        assert!(e.contains(why), "{e}");
        assert!(!e.contains("nothing above the threshold"), "{e}");
    } else {
        let m = &p["manager"];
        assert!(m["vmstat"]["pswpout"].as_u64().unwrap() > 0, "{m}");
        assert!(
            m["peak_resident_bytes"].as_u64().unwrap() <= 16 << 20,
            "{m}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
