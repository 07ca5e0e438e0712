//! Every kind of bad input the `usermm` command takes, table-driven: each row is refused with
//! the right exit code (2: usage, 1: run) and a message naming the bad value; none panics,
//! prints a backtrace or Rust Debug text, or hangs. Also what `--swap file:PATH` does to the
//! file system: never overwrites a file usermm did not make, leaves nothing behind.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn usermm(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_usermm"));
    c.args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("running usermm");
    // No row may hang: 60 s is far beyond any refusal.
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("usermm {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("usermm-badinput-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn assert_clean_refusal(args: &[&str], env: &[(&str, &str)], code: i32, words: &[&str]) {
    let o = usermm(args, env);
    let err = String::from_utf8_lossy(&o.stderr);
    let row = format!("usermm {} (env {env:?})", args.join(" "));
    assert_eq!(
        o.status.code(),
        Some(code),
        "{row}: exit status; stderr:\n{err}"
    );
    for bad in [
        "panicked",
        "backtrace",
        "RUST_BACKTRACE",
        "Some(",
        " { path",
        "fatal runtime",
    ] {
        assert!(!err.contains(bad), "{row}: stderr has {bad:?}:\n{err}");
    }
    for w in words {
        assert!(err.contains(w), "{row}: stderr lacks {w:?}:\n{err}");
    }
    assert!(
        err.starts_with("error: "),
        "{row}: not an error line:\n{err}"
    );
}

/// Arguments, environment, exit code, words the error must contain.
type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a [&'a str]);

#[test]
fn every_bad_argument_is_named() {
    let text = tmp("notes.txt");
    std::fs::write(&text, "precious text\n").unwrap();
    let text_swap = format!("file:{}", text.display());
    let rows: &[Row] = &[
        // The known cases.
        (
            &[
                "bench",
                "swap-w-seq",
                "--tasks",
                "100000",
                "--budget",
                "16M",
            ],
            &[],
            2,
            &["--tasks", "100000", "4096"],
        ),
        (
            &["bench", "swap-w-seq", "--handler-threads", "100000"],
            &[],
            2,
            &["--handler-threads", "100000", "256"],
        ),
        (
            &["bench", "swap-w-seq", "--kernel-swap", "tape"],
            &[],
            2,
            &["--kernel-swap", "\"tape\"", "zswap+file"],
        ),
        (
            &["bench", "apps", "--swap", "floppy", "--engine", "usermm"],
            &[],
            2,
            &["--swap", "floppy", "zswap+file"],
        ),
        (
            &[
                "bench",
                "fault-latency",
                "--pages",
                "4096",
                "--budget",
                "8M",
            ],
            &[],
            2,
            &["--pages", "4096", "--budget"],
        ),
        // Sizes: garbage, negative, zero, overflow, below the minimum.
        (
            &["info", "--budget", "lots"],
            &[],
            2,
            &["--budget", "\"lots\""],
        ),
        (&["info", "--budget=-1"], &[], 2, &["--budget", "\"-1\""]),
        (
            &["info", "--budget", "0"],
            &[],
            2,
            &["--budget", "0", "minimum"],
        ),
        (
            &["info", "--budget", "99999999999999999999"],
            &[],
            2,
            &["--budget", "too large"],
        ),
        (
            &["info", "--budget", "20000000T"],
            &[],
            2,
            &["--budget", "too large"],
        ),
        (
            &["info", "--budget", "1e9"],
            &[],
            2,
            &["--budget", "\"1e9\""],
        ),
        (&["info", "--budget", ""], &[], 2, &["--budget", "\"\""]),
        (&["info", "--budget", "64T"], &[], 2, &["16 TiB"]),
        (
            &["info", "--budget", "8M", "--swap-size", "100"],
            &[],
            2,
            &["--swap-size", "100 bytes"],
        ),
        (
            &["info", "--budget", "8M", "--swap-size=-5M"],
            &[],
            2,
            &["--swap-size", "\"-5M\""],
        ),
        // Swap devices and paths.
        (
            &["info", "--swap", "tape"],
            &[],
            2,
            &["--swap", "\"tape\"", "file:PATH"],
        ),
        (
            &["info", "--swap", "file:"],
            &[],
            2,
            &["--swap", "\"file:\""],
        ),
        (
            &["info", "--budget", "8M", "--swap", &text_swap],
            &[],
            1,
            &[
                "notes.txt",
                "not a usermm swap file",
                "remove it or give a new path",
            ],
        ),
        (
            &["info", "--budget", "8M", "--swap", "file:/tmp"],
            &[],
            1,
            &["/tmp"],
        ),
        (
            &["info", "--budget", "8M", "--swap", "file:/proc/self/status"],
            &[],
            1,
            &["/proc/self/status"],
        ),
        (
            &[
                "info",
                "--budget",
                "8M",
                "--swap",
                "file:/nonexistent-usermm/swap",
            ],
            &[],
            1,
            &["/nonexistent-usermm/swap", "No such file"],
        ),
        // Settings: unknown name, bad value, no value, empty name; and from the environment.
        (
            &["info", "--set", "nosuch=old"],
            &[],
            2,
            &["--set", "nosuch"],
        ),
        (
            &["info", "--set", "accessed_init=maybe"],
            &[],
            2,
            &["maybe", "atomic"],
        ),
        (
            &["info", "--set", "laptop_mode"],
            &[],
            2,
            &["laptop_mode", "name=value"],
        ),
        (
            &["info", "--set", "=on"],
            &[],
            2,
            &["\"=on\"", "no name before"],
        ),
        (
            &["info"],
            &[("USERMM_SET", "laptop_mode=2")],
            2,
            &["USERMM_SET", "laptop_mode"],
        ),
        // Counts: zero, too many, negative.
        (
            &["bench", "fault-latency", "--pages", "0"],
            &[],
            2,
            &["--pages", "at least 1"],
        ),
        (
            &["bench", "usemem", "--tasks", "0", "1M"],
            &[],
            2,
            &["--tasks", "at least 1"],
        ),
        (
            &["bench", "usemem", "--tasks", "5000", "1M"],
            &[],
            2,
            &["--tasks", "5000"],
        ),
        (&["bench", "usemem", "--tasks", "-1", "1M"], &[], 2, &["-1"]),
        (
            &["bench", "usemem", "1M", "--step", "x"],
            &[],
            2,
            &["--step", "\"x\""],
        ),
        (
            &["bench", "usemem", "nothing"],
            &[],
            2,
            &["SIZE", "\"nothing\""],
        ),
        (
            &["bench", "swap-w-seq", "--runs", "0", "--budget", "8M"],
            &[],
            2,
            &["--runs"],
        ),
        (
            &["bench", "swap-w-seq", "--engine", "bsd", "--budget", "8M"],
            &[],
            2,
            &["bsd"],
        ),
        (
            &["bench", "simoop", "--threads", "100000"],
            &[],
            2,
            &["--threads", "100000"],
        ),
        (
            &[
                "bench",
                "fault-latency",
                "--pages",
                "100",
                "--budget",
                "8M",
                "--swap",
                "none",
            ],
            &[],
            2,
            &["--pages", "swap"],
        ),
        (
            &["bench", "fault-latency", "--pages", "99999999999999999999"],
            &[],
            2,
            &["--pages"],
        ),
        (
            &["bench", "mmap-file", "--pattern", "foo"],
            &[],
            2,
            &["--pattern", "\"foo\"", "seqwrite", "randwrite"],
        ),
        (
            &["bench", "mmap-file", "--pattern", "seqread,seqread"],
            &[],
            2,
            &["--pattern", "seqread", "twice"],
        ),
        (
            &["bench", "mmap-file", "--threads", "0"],
            &[],
            2,
            &["--threads", "0", "1 to 1024"],
        ),
        (
            &["bench", "mmap-file", "--threads", "5000"],
            &[],
            2,
            &["--threads", "5000"],
        ),
        (
            &["bench", "mmap-file", "--size", "10000"],
            &[],
            2,
            &["--size", "10000", "4096"],
        ),
        (
            &["bench", "mmap-file", "--ops", "0", "--pattern", "randread"],
            &[],
            2,
            &["--ops", "0"],
        ),
        (
            &["bench", "mmap-file", "--engine", "bsd"],
            &[],
            2,
            &["--engine", "bsd"],
        ),
        (&["bench", "mmap-file", "--runs", "0"], &[], 2, &["--runs"]),
    ];
    for (args, env, code, words) in rows {
        assert_clean_refusal(args, env, *code, words);
    }
    // The refused file is untouched.
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "precious text\n");
    let _ = std::fs::remove_file(text);
}

/// A named swap file leaves nothing on disk even when its process is SIGKILLed mid-run: the
/// file has no name while in use (the process's descriptor holds it).
#[test]
fn a_sigkilled_process_leaves_no_swap_file() {
    let path = tmp("swap-kill");
    let _ = std::fs::remove_file(&path);
    let spec = format!("file:{}", path.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args([
            "bench",
            "usemem",
            "--budget",
            "8M",
            "--swap",
            &spec,
            "--swap-size",
            "256M",
            "--repeat",
            "1000",
            "64M",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The file has no name while it is in use: its path unlinked at open, or never linked
    // (made with O_TMPFILE in the path's directory: `{dir}/#{inode} (deleted)`).
    let dir = path.parent().unwrap().display().to_string();
    let nameless = |t: &str| {
        t == format!("{} (deleted)", path.display())
            || (t.starts_with(&format!("{dir}/#")) && t.ends_with(" (deleted)"))
    };
    let fds = format!("/proc/{}/fd", child.id());
    let t0 = Instant::now();
    let held = loop {
        let open = std::fs::read_dir(&fds).is_ok_and(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| nameless(&t.to_string_lossy())))
        });
        if open || t0.elapsed() > Duration::from_secs(30) {
            break open;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Swapping (the file is in use) and the path already gone.
    let gone_while_running = !path.exists();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(held, "the run never held its swap file open unlinked");
    assert!(
        gone_while_running,
        "{} exists while the manager lives",
        path.display()
    );
    assert!(
        !path.exists(),
        "process memory left on disk at {}",
        path.display()
    );
}

#[test]
fn a_swap_path_is_created_and_removed() {
    let path = tmp("swap-new");
    let _ = std::fs::remove_file(&path);
    let spec = format!("file:{}", path.display());
    for extra in [&[][..], &["--swap-encrypt"][..]] {
        let mut args = vec![
            "bench",
            "usemem",
            "--budget",
            "8M",
            "--swap",
            &spec,
            "--swap-size",
            "64M",
        ];
        args.extend_from_slice(extra);
        args.push("24M");
        let o = usermm(&args, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            !path.exists(),
            "process memory left on disk at {}",
            path.display()
        );
    }
    // Kept when asked; then reused (its header is usermm's) and removed.
    let o = usermm(
        &["info", "--budget", "8M", "--swap", &spec, "--swap-keep"],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(path.exists());
    let o = usermm(&["info", "--budget", "8M", "--swap", &spec], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!path.exists());
}
