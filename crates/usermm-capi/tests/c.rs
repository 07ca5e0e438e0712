//! Builds the C test (tests/c/capi_test.c, with tests/c/touch_ctor.c as a library it dlopens)
//! and the C example (examples/c/usermm_example.c)
//! with gcc against libusermm.so and libusermm.a as cargo just built them, runs them and
//! checks their output. Needs gcc (CI installs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// target/<profile>/deps, where `cargo test` puts libusermm.so and libusermm.a (`cargo build`
/// also copies them up to target/<profile>).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/c-<hash>
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn profile_dir() -> PathBuf {
    lib_dir().parent().expect("target/<profile>").to_path_buf()
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The flags every C file here is compiled with.
const CFLAGS: [&str; 4] = ["-O2", "-Wall", "-Wextra", "-Werror"];

fn gcc(src: &Path, out: &str, static_link: bool) -> PathBuf {
    let lib = lib_dir();
    for f in ["libusermm.so", "libusermm.a"] {
        assert!(
            lib.join(f).exists(),
            "{} missing: build the crate first",
            lib.join(f).display()
        );
    }
    let exe = lib.join(out);
    let mut cmd = Command::new("gcc");
    cmd.args(CFLAGS)
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .arg(format!("-I{}", manifest().join("include").display()));
    if static_link {
        // Libs.private of usermm.pc.
        cmd.arg(lib.join("libusermm.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
    } else {
        cmd.arg(format!("-L{}", lib.display()))
            .arg("-lusermm")
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    let o = cmd.output().expect("running gcc (install gcc)");
    assert!(
        o.status.success(),
        "gcc failed for {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

fn run(exe: &Path, arg: &str, env: &[(&str, &str)]) -> (Output, String) {
    run_args(exe, &[arg], env)
}

/// [`run`] with several arguments.
fn run_args(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let mut c = Command::new(exe);
    c.args(args);
    for v in [
        "USERMM_BUDGET",
        "USERMM_SWAP",
        "USERMM_SWAP_SIZE",
        "USERMM_OVERCOMMIT",
        "USERMM_SWAP_ENCRYPT",
        "USERMM_SWAP_KEEP",
        "USERMM_SET",
    ] {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    let o = c.output().expect("running the C program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o, text)
}

fn assert_passed(o: &Output, text: &str, min_checks: u32) {
    assert!(o.status.success(), "C test failed ({}):\n{text}", o.status);
    let line = text
        .lines()
        .find(|l| l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary line:\n{text}"));
    let passed: u32 = line.split(' ').next().unwrap().parse().unwrap();
    assert!(
        line.ends_with(" 0 failed") && passed >= min_checks,
        "{line}\n{text}"
    );
}

/// Builds the C test under a name of its own per test (tests run in parallel: one binary being
/// rewritten while another test executes it fails with ETXTBSY).
fn capi_test(name: &str, static_link: bool) -> PathBuf {
    gcc(&manifest().join("tests/c/capi_test.c"), name, static_link)
}

const SMALL: &[(&str, &str)] = &[("USERMM_BUDGET", "16M"), ("USERMM_SWAP", "ram")];

#[test]
fn c_maps_four_times_the_budget_and_reads_it_back() {
    let exe = capi_test("capi_test_big", false);
    let (o, text) = run(
        &exe,
        "big",
        &[("USERMM_BUDGET", "32M"), ("USERMM_SWAP", "ram")],
    );
    assert_passed(&o, &text, 15);
    assert!(
        text.contains("big: 128 MiB through a 32 MiB budget"),
        "{text}"
    );
}

/// The same through the default manager with `USERMM_SET=fault_path=sigbus`: every fault is
/// served on the C program's own thread (a SIGBUS handler), none by a handler thread.
#[test]
fn c_faults_served_on_the_faulting_thread() {
    let exe = capi_test("capi_test_big_sigbus", false);
    let (o, text) = run(
        &exe,
        "big",
        &[
            ("USERMM_BUDGET", "32M"),
            ("USERMM_SWAP", "ram"),
            ("USERMM_SET", "fault_path=sigbus"),
        ],
    );
    assert_passed(&o, &text, 15);
    let served: u64 = text
        .split("fault_self_served ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fault_self_served in {text}"));
    assert!(served > 0, "{text}");
}

#[test]
fn c_static_library_with_swap_file() {
    let exe = capi_test("capi_test_static", true);
    let (o, text) = run(
        &exe,
        "big",
        &[("USERMM_BUDGET", "16M"), ("USERMM_SWAP", "file")],
    );
    assert_passed(&o, &text, 15);
    assert!(
        text.contains("big: 64 MiB through a 16 MiB budget"),
        "{text}"
    );
}

#[test]
fn c_bad_input_gets_errno_and_messages() {
    let exe = capi_test("capi_test_bad", false);
    let (o, text) = run(&exe, "bad", SMALL);
    assert_passed(&o, &text, 90);
}

#[test]
fn c_handle_api() {
    let exe = capi_test("capi_test_handle", false);
    let (o, text) = run(&exe, "handle", SMALL);
    assert_passed(&o, &text, 20);
}

/// `usermm_config.swap_encrypt` and `swap_keep` reach the manager: an unencrypted named swap
/// file holds the plain pages, an encrypted one none of them; kept files outlive
/// `usermm_destroy` (and are reused), others are removed; values other than 0/1 are named.
#[test]
fn c_config_swap_encrypt_and_keep() {
    let exe = capi_test("capi_test_swapopts", false);
    let (o, text) = run(&exe, "swapopts", &[]);
    assert_passed(&o, &text, 25);
    assert!(text.contains("swapopts: plain "), "{text}");
}

/// `usermm_group_create` and `usermm_config.group`: two managers in one process share one
/// budget (together within it), bad paths are named.
#[test]
fn c_managers_share_a_budget_group() {
    let exe = capi_test("capi_test_group", false);
    let (o, text) = run(&exe, "group", &[]);
    assert_passed(&o, &text, 9);
}

/// A fork child touching usermm memory (not inherited: MADV_DONTFORK) dies of SIGSEGV after one
/// line on stderr naming the address, the range, the parent and what to do; a SIGSEGV elsewhere
/// in a child says nothing of usermm; the parent's memory is intact.
#[test]
fn c_fork_child_is_told_why_it_faults() {
    let exe = capi_test("capi_test_fork", false);
    let (o, text) = run(&exe, "fork", SMALL);
    assert_passed(&o, &text, 13);
}

/// A fault taken inside dlopen(3) (a library constructor reading swapped-out usermm memory,
/// with the dynamic loader's lock held) is served: the handler threads registered their
/// thread-local destructors, which takes that lock, when they started, not on their first
/// swap-in. It hung every time before (the C program's alarm turns a hang into a failure).
#[test]
fn c_fault_inside_dlopen_is_served() {
    let exe = capi_test("capi_test_dlopen", false);
    let lib = lib_dir().join("libusermm_touch_ctor.so");
    let o = Command::new("gcc")
        .args(CFLAGS)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(manifest().join("tests/c/touch_ctor.c"))
        .output()
        .expect("running gcc (install gcc)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, text) = run_args(&exe, &["dlopen", lib.to_str().unwrap()], SMALL);
    assert_passed(&o, &text, 8);
}

#[test]
fn c_bad_budget_in_environment_is_named() {
    let exe = capi_test("capi_test_badenv", false);
    let (o, text) = run(&exe, "badenv", &[("USERMM_BUDGET", "256Q")]);
    assert_passed(&o, &text, 3);
    assert!(
        text.contains("USERMM_BUDGET") && text.contains("\"256Q\""),
        "{text}"
    );
}

#[test]
fn c_example_runs() {
    let exe = gcc(
        &manifest().join("../../examples/c/usermm_example.c"),
        "usermm_example",
        false,
    );
    let (o, text) = run(&exe, "", SMALL);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("handle API: 256 MiB through a 64 MiB budget"),
        "{text}"
    );
    assert!(text.contains("hello from usermm_mmap"), "{text}");
    assert!(
        text.contains("MAP_SHARED: Operation not supported: usermm_mmap: MAP_SHARED"),
        "{text}"
    );
}

#[test]
fn pkg_config_file_points_at_the_build() {
    let pc = profile_dir().join("pkgconfig/usermm.pc");
    let text = std::fs::read_to_string(&pc).unwrap_or_else(|e| panic!("{}: {e}", pc.display()));
    assert!(
        text.contains(&format!("libdir={}", profile_dir().display())),
        "{text}"
    );
    assert!(text.contains("Libs: -L${libdir} -lusermm"), "{text}");
    let inc = text
        .lines()
        .find_map(|l| l.strip_prefix("includedir="))
        .expect("includedir");
    assert!(Path::new(inc).join("usermm.h").exists(), "{inc}");
}

/// One uffd-open policy for every front end: as root the C library's default manager gets full
/// mode, so read(2) into fresh and swapped-out managed memory works (as from Python and under
/// `usermm run`) instead of failing with EFAULT as user-mode-only would.
#[test]
fn c_read_into_managed_memory_faults_pages_in() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root {
        // CI runs as root (.ci/run).
        usermm_sys::skip_test("not root: full-mode userfaultfd may be refused here");
        return;
    }
    let exe = gcc(&manifest().join("tests/c/uffd_read.c"), "uffd_read", false);
    let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 7) as u8).collect();
    let file = lib_dir().join("uffd_read.data");
    std::fs::write(&file, data).unwrap();
    let (o, text) = run(
        &exe,
        file.to_str().unwrap(),
        &[
            ("USERMM_BUDGET", "16M"),
            ("USERMM_SWAP", "ram"),
            ("USERMM_SWAP_SIZE", "128M"),
        ],
    );
    assert!(o.status.success(), "{text}");
    assert!(text.contains("read ok"), "{text}");
}
