//! `usermm bench apps --quick`: every case (GNU sort, numpy, a Python dict, awk, perl, two
//! Python multiprocessing Pools, `make -j2` with gcc) runs
//! natively, under `usermm run` and (as root) in a memory cgroup with a kernel swap file; every
//! output must be byte-identical to the native one and every program must succeed. Times are
//! reported, never asserted. Also the command's usage errors.
//!
//! Needs the preload library built (`cargo test --workspace` builds it), python3 with numpy,
//! perl, awk, make and gcc (.ci/run installs numpy, make and gcc).

use std::process::Command;

use serde_json::Value;

fn usermm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
}

fn is_root() -> bool {
    usermm_sys::geteuid() == 0
}

#[test]
fn quick_cases_give_native_output_on_both_engines() {
    let engines = if is_root() {
        "usermm,kernel"
    } else {
        usermm_sys::skip_test("not root: bench apps runs on usermm only, no kernel engine");
        "usermm"
    };
    let o = usermm()
        .args(["bench", "apps", "--quick", "--json", "--engine", engines])
        .args(["--swap-size", "1G"])
        .output()
        .expect("running usermm bench apps");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["failures"].as_array().map(Vec::len), Some(0), "{v}");
    let cases = v["cases"].as_array().expect("cases");
    let names: Vec<&str> = cases.iter().map(|c| c["case"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["sort", "numpy", "pydict", "awk", "perl", "mp-numpy", "mp-pool", "mp-dict", "make"]
    );
    let n_engines = engines.split(',').count();
    for c in cases {
        assert_eq!(c["output_identical"], Value::Bool(true), "{c}");
        let runs = c["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), n_engines, "{c}");
        for r in runs {
            assert_eq!(r["output_identical"], Value::Bool(true), "{r}");
            assert!(r["problem"].is_null(), "{r}");
            assert!(r["wall_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["peak_tree_rss_bytes"].as_u64().unwrap() > 1 << 20, "{r}");
            assert!(r["workingset_refault"].is_u64(), "{r}");
        }
        // Every run succeeded, so every run is in the medians and the speed is a number.
        for e in engines.split(',') {
            assert_eq!(c["median"][e]["ok_runs"].as_u64(), Some(1), "{c}");
        }
        if n_engines == 2 {
            assert!(c["speed_vs_kernel"].as_f64().unwrap() > 0.0, "{c}");
        }
        // The usermm run really went through usermm run's managers (a report was read).
        let u = runs
            .iter()
            .find(|r| r["engine"] == "usermm")
            .expect("usermm run");
        assert!(u["detail"]["processes"].as_u64().unwrap() >= 1, "{u}");
    }
    // The large allocation cases put pages through usermm's fault handler.
    let numpy = &cases[1]["runs"].as_array().unwrap()[0];
    assert!(numpy["pgfault"].as_u64().unwrap() > 1000, "{numpy}");
    // The multiprocessing case: the parent and both workers under one budget of 64 MiB.
    let mp = &cases[5]["runs"].as_array().unwrap()[0];
    let tree = &mp["detail"]["tree"];
    assert!(tree["processes"].as_u64().unwrap() >= 3, "{mp}");
    let peak = tree["peak_charged_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 64 << 20, "{mp}");
    assert_eq!(mp["engine_peak_bytes"].as_u64(), Some(peak), "{mp}");
    // The Pool over the parent's array: the workers got it by fork, under the same budget;
    // make -j2: the shell, make, the gcc drivers, cc1, as and ld, all under the one budget.
    for (i, min_processes) in [(6, 3), (7, 10)] {
        let r = &cases[i]["runs"].as_array().unwrap()[0];
        let tree = &r["detail"]["tree"];
        assert!(tree["processes"].as_u64().unwrap() >= min_processes, "{r}");
        assert!(
            tree["peak_charged_bytes"].as_u64().unwrap() <= 64 << 20,
            "{r}"
        );
    }
}

/// `--set` reaches every `usermm run` (its report names the setting), and each run reports
/// its refaults.
#[test]
fn settings_reach_usermm_run() {
    let o = usermm()
        .args(["bench", "apps", "--quick", "--json", "--engine", "usermm"])
        .args([
            "--case",
            "pydict",
            "--swap-size",
            "1G",
            "--set",
            "lru_gen=on",
        ])
        .output()
        .expect("running usermm bench apps");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["settings"], serde_json::json!(["lru_gen=on"]), "{v}");
    let r = &v["cases"][0]["runs"][0];
    assert_eq!(r["detail"]["settings"], "lru_gen=on", "{r}");
    assert_eq!(r["output_identical"], Value::Bool(true), "{r}");
    assert!(r["workingset_refault"].is_u64(), "{r}");
}

#[test]
fn usage_errors_name_the_value() {
    let o = usermm()
        .args(["bench", "apps", "--case", "gcc"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("gcc") && e.contains("sort, numpy, pydict, awk, perl"),
        "{e}"
    );
    let o = usermm()
        .args(["bench", "apps", "--swap", "tape"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = usermm()
        .args(["bench", "apps", "--runs", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--runs"));
    // A bad setting stops the command before any program runs.
    let o = usermm()
        .args(["bench", "apps", "--set", "lru_gen=maybe"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--set lru_gen=maybe") && e.contains("on"), "{e}");
    assert!(!e.contains("native ..."), "{e}");
}

/// A run that fails (here the kernel's: a memory cgroup of 16 MiB with no swap, which the
/// OOM killer ends) is reported as a failure and left out of the medians: no time, no speed
/// computed from a killed program's short run.
#[test]
fn failed_runs_stay_out_of_the_medians_and_the_speed() {
    if !is_root() {
        return usermm_sys::skip_test("not root: no kernel engine");
    }
    let o = usermm()
        .args(["bench", "apps", "--quick", "--json", "--case", "numpy"])
        .args([
            "--engine",
            "usermm,kernel",
            "--budget",
            "16M",
            "--kernel-swap",
            "none",
        ])
        .args(["--swap", "ram", "--swap-size", "256M"])
        .output()
        .expect("running usermm bench apps");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a failed run fails the command:\n{stderr}"
    );
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let failures = v["failures"].as_array().expect("failures");
    assert!(
        failures
            .iter()
            .any(|f| f.as_str().unwrap().contains("OOM killer")),
        "the kernel's run was OOM-killed: {v}"
    );
    let c = &v["cases"][0];
    assert_eq!(c["median"]["kernel"]["ok_runs"].as_u64(), Some(0), "{c}");
    assert!(c["median"]["kernel"]["wall_s"].is_null(), "{c}");
    assert!(c["speed_vs_kernel"].is_null(), "{c}");
    assert_eq!(c["median"]["usermm"]["ok_runs"].as_u64(), Some(1), "{c}");
    assert!(
        c["median"]["usermm"]["wall_s"].as_f64().unwrap() > 0.0,
        "{c}"
    );
}
