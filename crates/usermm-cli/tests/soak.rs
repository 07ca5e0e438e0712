//! `usermm bench soak`: a short soak on a small budget finishes with every page verified, the
//! manager audited and healthy; a page changed behind the soak's back is found, named with its
//! history, and fails the run; a counter that only a usermm bug makes nonzero (`mm_warn`,
//! injected through usermm's test hook, compiled into the binary these tests run) fails it,
//! named with its value; a fault left waiting (every handler wedged) stops it; bad durations
//! are usage errors. (CI also runs a 3-minute soak from
//! .ci/run.)

use std::process::Command;

use serde_json::Value;

fn soak(args: &[&str], env: &[(&str, &str)]) -> (std::process::Output, Option<Value>) {
    let o = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args([
            "bench",
            "soak",
            "--budget",
            "8M",
            "--swap-size",
            "128M",
            "--json",
        ])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running usermm bench soak");
    let v = serde_json::from_slice(&o.stdout).ok();
    (o, v)
}

#[test]
fn a_short_soak_verifies_everything_on_ram_and_zswap() {
    for swap in ["ram", "zswap+file"] {
        let (o, v) = soak(
            &["--duration", "8s", "--audit-every", "2s", "--swap", swap],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        let v = v.unwrap_or_else(|| panic!("{swap}: no JSON; stderr:\n{err}"));
        assert!(o.status.success(), "{swap}: {v}\n{err}");
        assert_eq!(v["ok"], true, "{v}");
        assert!(v["pages_verified"].as_u64().unwrap() > 1000, "{v}");
        assert!(v["audits"].as_u64().unwrap() >= 2, "{v}");
        let vm = &v["vmstat"];
        assert!(
            vm["pswpout"].as_u64().unwrap() > 0,
            "{swap}: no reclaim to swap: {v}"
        );
        assert!(vm["pswpin"].as_u64().unwrap() > 0, "{swap}: {v}");
        for k in ["fault_refault_tripwire", "oom_poison", "swap_read_error"] {
            assert_eq!(vm[k], 0, "{swap}: {k}: {v}");
        }
        for op in [
            "anon_write_random",
            "file_mapped_write",
            "file_buffered_write",
            "file_sync",
        ] {
            assert!(
                v["operations"][op].as_u64().unwrap() > 0,
                "{swap}: {op}: {v}"
            );
        }
    }
}

#[test]
fn a_page_changed_behind_its_back_fails_the_soak_with_the_page_and_its_history() {
    let (o, v) = soak(
        &["--duration", "3s", "--swap", "ram"],
        &[("USERMM_TEST_SOAK_CORRUPT", "1")],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = v.expect("JSON");
    assert_eq!(v["ok"], false, "{v}");
    let f = v["failure"].as_str().unwrap();
    for w in [
        "MISMATCH in thread 0 anon region 0",
        "expected version",
        "found unknown data",
        "1 of 512 words differ, first at byte 8",
        "history: ",
    ] {
        assert!(f.contains(w), "{w:?} missing: {f}");
    }
    assert!(
        v["seconds"].as_f64().unwrap() < 50.0,
        "the soak did not stop at the mismatch: {v}"
    );
}

/// Three UFFDIO_WAKEs of the fault path counted as failed (`mm_warn`, as a real failure is)
/// by the test hook `USERMM_TEST_INJECT_MM_WARN`: the data stays right (the wakes happen), yet
/// the first audit stops the soak, naming the counter and its value.
#[test]
fn a_counter_of_a_usermm_bug_fails_the_soak_naming_it() {
    let (o, v) = soak(
        &["--duration", "40s", "--audit-every", "1s", "--swap", "ram"],
        &[("USERMM_TEST_INJECT_MM_WARN", "3")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let v = v.unwrap_or_else(|| panic!("no JSON; stderr:\n{err}"));
    assert_eq!(o.status.code(), Some(1), "{v}\n{err}");
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["vmstat"]["mm_warn"], 3, "the hook injects 3: {v}");
    let f = v["failure"].as_str().unwrap();
    for w in ["at an audit", "stay zero in a correct run", "mm_warn=3"] {
        assert!(f.contains(w), "{w:?} missing: {f}");
    }
    assert!(
        !f.contains("MISMATCH"),
        "the injected warnings change no data: {f}"
    );
    assert!(
        err.contains("failure injected by a test"),
        "the warning is logged: {err}"
    );
    assert!(
        v["seconds"].as_f64().unwrap() < 30.0,
        "the soak did not stop at the first audit: {v}"
    );
}

/// Every fault handler wedged for 30 s by the test hook `USERMM_TEST_INJECT_HANDLER_PAUSE_MS`:
/// the workers' faults wait unread until the watchdog serves them (10 s) and reports them with
/// their addresses; the soak stops there, unhealthy, with exit 1, long before its 60 s are up.
#[test]
fn a_fault_left_waiting_stops_the_soak() {
    let (o, v) = soak(
        &["--duration", "60s", "--audit-every", "1s", "--swap", "ram"],
        &[("USERMM_TEST_INJECT_HANDLER_PAUSE_MS", "30000")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let v = v.unwrap_or_else(|| panic!("no JSON; stderr:\n{err}"));
    assert_eq!(o.status.code(), Some(1), "{v}\n{err}");
    assert_eq!(v["ok"], false, "{v}");
    let f = v["failure"].as_str().unwrap();
    assert!(f.contains("unhealthy"), "{f}");
    assert!(
        !f.contains("unread_faults: 0,"),
        "the unread faults are named: {f}"
    );
    assert!(
        err.contains("waited unread") && err.contains("0x"),
        "each waiting fault is logged with its address: {err}"
    );
    assert!(
        !f.contains("MISMATCH"),
        "the stalled faults change no data: {f}"
    );
    assert!(
        v["seconds"].as_f64().unwrap() < 40.0,
        "the soak did not stop at the stuck fault: {v}"
    );
}

#[test]
fn bad_durations_are_usage_errors() {
    for (d, want) in [
        ("3x", "unknown unit"),
        ("0", "at least 1 s"),
        ("", "empty duration"),
    ] {
        let (o, _) = soak(&["--duration", d], &[]);
        assert_eq!(o.status.code(), Some(2), "{d:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("--duration") && e.contains(want), "{d:?}: {e}");
    }
}
