//! What the benchmarks print: usemem's per-task line, the end-of-run summary as text or as one
//! JSON object, the progress bar (only when stderr is a terminal) and the process's peak RSS.
//! The same report serves both engines (usermm's manager and the kernel's own memory in a
//! cgroup, see `kernel`), with the same JSON keys, so their numbers can be compared.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::counters::Counters;

/// The counters the text summary shows (the JSON report carries all of them).
pub const KEY_COUNTERS: &[&str] = &[
    "pgfault",
    "pgmajfault",
    "pswpin",
    "pswpout",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "allocstall",
    "zero_page_fault",
    "swap_ra",
    "swap_ra_hit",
    "pgactivate",
    "pgdeactivate",
    "workingset_refault_anon",
    "workingset_refault_file",
];

/// The memory cgroup counters the text summary shows when they are non-zero (the JSON report
/// carries all of memory.stat). v1 and v2 names.
const MEMCG_SHOWN: &[&str] = &[
    "pgfault",
    "pgmajfault",
    "pswpin",
    "pswpout",
    "pgscan",
    "pgsteal",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "pgpgin",
    "pgpgout",
    "workingset_refault_anon",
    "workingset_refault_file",
    "swap",
    "anon",
    "rss",
    "file",
    "cache",
];

/// The counters reported for the verification (read-back) phase.
const VERIFY_COUNTERS: &[&str] = &[
    "pswpin",
    "pswpout",
    "pgmajfault",
    "pgfault",
    "swap_ra",
    "swap_ra_hit",
    "swap_ra_async",
];

/// `n` bytes as MiB with one decimal, e.g. `256.0 MiB`.
pub fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
}

/// The process's peak resident set (VmHWM in /proc/self/status), 0 if unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// A progress bar counting bytes, or None when stderr is not a terminal (or there is nothing
/// to count).
pub fn progress(msg: &str, total: u64) -> Option<ProgressBar> {
    if total == 0 || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b.set_message(msg.to_string());
    Some(b)
}

/// One task's usemem result.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TaskLine {
    /// Bytes usemem counts: size/8 for the allocation plus 8 per access.
    pub bytes: u64,
    pub usecs: u64,
}

impl TaskLine {
    /// usemem's `((bytes * 1000000) >> 10) / usecs`.
    pub fn kbs(&self) -> u64 {
        (((self.bytes as u128 * 1_000_000) >> 10) / self.usecs.max(1) as u128) as u64
    }

    /// usemem's line: `N bytes / M usecs = K KB/s`.
    pub fn line(&self) -> String {
        format!(
            "{} bytes / {} usecs = {} KB/s",
            self.bytes,
            self.usecs,
            self.kbs()
        )
    }
}

/// How the verification went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Verify {
    /// Not run (--no-verify).
    Skipped,
    /// A read-only run: every word read was zero (or the first that was not).
    Reads(Result<(), String>),
    /// A write run: every touched word was read back after the last pass.
    ReadBack {
        result: Result<(), String>,
        seconds: f64,
        /// Counter deltas over the read-back.
        vmstat: Counters,
    },
}

impl Verify {
    pub fn ok(&self) -> bool {
        match self {
            Verify::Skipped => false,
            Verify::Reads(r) | Verify::ReadBack { result: r, .. } => r.is_ok(),
        }
    }
    pub fn error(&self) -> Option<&str> {
        match self {
            Verify::Skipped => None,
            Verify::Reads(r) | Verify::ReadBack { result: r, .. } => r.as_ref().err().map(|s| &**s),
        }
    }
}

/// Everything a usemem-style run reports.
#[derive(Debug, Clone)]
pub struct Report {
    pub workload: String,
    /// "usermm" or "kernel".
    pub engine: &'static str,
    pub tasks: usize,
    pub bytes_per_task: u64,
    pub readonly: bool,
    pub step: u64,
    pub random: bool,
    pub repeat: u32,
    pub budget_bytes: u64,
    pub swap_bytes: u64,
    pub swap_device: String,
    pub per_task: Vec<TaskLine>,
    pub elapsed_s: f64,
    pub verify: Verify,
    pub peak_resident_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Counters over the workload (before the read-back): usermm's vmstat, or the kernel's
    /// /proc/vmstat differences.
    pub vmstat: Counters,
    /// Kernel engine: the memory cgroup's memory.stat over the workload (events as
    /// differences, levels at the end).
    pub memcg: Option<Counters>,
    /// Engine details for the JSON report (kernel: cgroup version and path, swap device).
    pub setup: Map<String, Value>,
}

impl Report {
    /// Sum of the per-task KB/s, as LKP sums usemem's lines.
    pub fn throughput_kbs(&self) -> u64 {
        self.per_task.iter().map(TaskLine::kbs).sum()
    }

    /// Swap-out rate over the workload in MiB/s (pswpout x 4 KiB / elapsed).
    pub fn swapout_mibs(&self) -> f64 {
        self.vmstat.val("pswpout") as f64 * 4096.0 / (1 << 20) as f64 / self.elapsed_s.max(1e-9)
    }

    /// usemem's per-task lines: stdout, or stderr when stdout carries JSON.
    pub fn print_task_lines(&self, json: bool) {
        for t in &self.per_task {
            if json {
                eprintln!("{}", t.line());
            } else {
                println!("{}", t.line());
            }
        }
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let (verify_s, verify_vmstat) = match &self.verify {
            Verify::ReadBack {
                seconds, vmstat, ..
            } => (
                *seconds,
                VERIFY_COUNTERS
                    .iter()
                    .map(|k| (k.to_string(), json!(vmstat.val(k))))
                    .collect::<Map<_, _>>()
                    .into(),
            ),
            _ => (0.0, Value::Null),
        };
        let kbs = self.throughput_kbs();
        json!({
            "workload": self.workload,
            "engine": self.engine,
            "tasks": self.tasks,
            "bytes_per_task": self.bytes_per_task,
            "readonly": self.readonly,
            "step": self.step,
            "random": self.random,
            "repeat": self.repeat,
            "budget_bytes": self.budget_bytes,
            "swap_bytes": self.swap_bytes,
            "swap_device": self.swap_device,
            "throughput_kbs": kbs,
            "throughput_mibs": kbs as f64 / 1024.0,
            "swapout_mibs": self.swapout_mibs(),
            "elapsed_s": self.elapsed_s,
            "verified": self.verify.ok(),
            "verify_skipped": matches!(self.verify, Verify::Skipped),
            "verify_error": self.verify.error(),
            "verify_s": verify_s,
            "verify_vmstat": verify_vmstat,
            "peak_resident_bytes": self.peak_resident_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "per_task": self.per_task.iter().map(|t| json!({
                "bytes": t.bytes,
                "usecs": t.usecs,
                "kbs": t.kbs(),
            })).collect::<Vec<_>>(),
            "vmstat": self.vmstat.to_json(),
            "memcg": self.memcg.as_ref().map(Counters::to_json),
            "setup": self.setup,
        })
    }

    /// The human-readable summary (stdout).
    pub fn print_text(&self) {
        let kbs = self.throughput_kbs();
        println!(
            "{}{}: {} task(s) x {}{}, budget {}, swap {} ({})",
            self.workload,
            if self.engine == "usermm" {
                String::new()
            } else {
                format!(" [{}]", self.engine)
            },
            self.tasks,
            mib(self.bytes_per_task),
            match (self.readonly, self.random) {
                (true, true) => ", read-only, random",
                (true, false) => ", read-only",
                (false, true) => ", random",
                (false, false) => "",
            },
            mib(self.budget_bytes),
            self.swap_device,
            mib(self.swap_bytes)
        );
        if !self.setup.is_empty() {
            let items: Vec<String> = self
                .setup
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k} {s}"),
                    other => format!("{k} {other}"),
                })
                .collect();
            println!("{}: {}", self.engine, items.join(", "));
        }
        println!(
            "elapsed {:.2} s, throughput {:.0} MiB/s ({kbs} KB/s), swap-out {:.0} MiB/s",
            self.elapsed_s,
            kbs as f64 / 1024.0,
            self.swapout_mibs()
        );
        match &self.verify {
            Verify::Skipped => println!("verify: skipped (--no-verify)"),
            Verify::Reads(Ok(())) => println!("verify: ok (every word read was zero)"),
            Verify::Reads(Err(e)) => println!("verify: FAILED: {e}"),
            Verify::ReadBack {
                result,
                seconds,
                vmstat,
            } => {
                let state = match result {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("FAILED: {e}"),
                };
                let swapin = vmstat.val("pswpin") as f64 * 4096.0 / (1 << 20) as f64;
                let counters: Vec<String> = VERIFY_COUNTERS
                    .iter()
                    .map(|k| format!("{k} {}", vmstat.val(k)))
                    .collect();
                println!(
                    "verify: {state} in {seconds:.2} s (read-back swap-in {:.0} MiB/s; {})",
                    swapin / seconds.max(1e-9),
                    counters.join(", ")
                );
            }
        }
        println!(
            "peak resident {} of {} budget; process peak RSS {}",
            mib(self.peak_resident_bytes),
            mib(self.budget_bytes),
            mib(self.peak_rss_bytes)
        );
        let shown: Vec<String> = KEY_COUNTERS
            .iter()
            .filter_map(|k| self.vmstat.get(k).map(|v| format!("{k} {v}")))
            .collect();
        println!("vmstat: {}", shown.join(", "));
        if let Some(m) = &self.memcg {
            let moved: Vec<String> = m
                .iter()
                .filter(|(k, v)| *v > 0 && MEMCG_SHOWN.contains(k))
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("memcg: {}", moved.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usemem_line_and_rate() {
        let t = TaskLine {
            bytes: 1 << 20,
            usecs: 1_000_000,
        };
        assert_eq!(t.kbs(), 1024);
        assert_eq!(t.line(), "1048576 bytes / 1000000 usecs = 1024 KB/s");
        // No division by zero for an instant task.
        assert_eq!(TaskLine { bytes: 8, usecs: 0 }.kbs(), 8_000_000 >> 10);
    }

    #[test]
    fn sizes_in_mib() {
        assert_eq!(mib(256 << 20), "256.0 MiB");
        assert_eq!(mib(3 << 19), "1.5 MiB");
    }
}
