//! `usermm bench usemem` and `usermm bench swap-w-seq`: vm-scalability's usemem run on a usermm
//! manager. Each task is a thread with its own region in one shared `Mm`; a task touches one
//! word every `step` bytes (default: every word), writing the word's index as usemem's
//! `do_access` does, and prints usemem's `N bytes / M usecs = K KB/s` line. Throughput is the sum
//! over tasks, as LKP reports it.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usermm::{Mm, MmConfig, Region, SwapConfig};

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    pub workload: &'static str,
    pub tasks: usize,
    pub bytes_per_task: u64,
    pub readonly: bool,
    pub step: u64,
    pub random: bool,
    pub repeat: u32,
    pub verify: bool,
    pub json: bool,
}

/// One task's result.
#[derive(Debug, Clone)]
pub struct TaskResult {
    pub bytes: u64,
    pub usecs: u64,
    /// When the task finished (the run's elapsed time ends at the last one).
    pub end: Instant,
}

impl TaskResult {
    fn kbs(&self) -> u64 {
        ((self.bytes as u128 * 1_000_000) >> 10) as u64 / self.usecs.max(1)
    }
}

/// A tiny xorshift generator (usemem uses drand48; any uniform source will do).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// One pass of usemem's `do_rw_once`: returns the bytes it counts (8 per access).
fn rw_once(r: &Region, words: u64, p: &Params, rng: &mut XorShift, done: &AtomicU64) -> u64 {
    let stride = (p.step / 8).max(1);
    let mut rw = 0u64;
    let mut i = 0u64;
    let mut sink = 0u64;
    while i < words {
        let idx = if p.random { rng.next() % words } else { i };
        let off = (idx * 8) as usize;
        if p.readonly {
            sink = sink.wrapping_add(r.read_u64(off));
        } else {
            r.write_u64(off, idx);
        }
        rw += 8;
        i += stride;
        if i & 0xffff == 0 {
            done.fetch_add(0x10000 / stride * 8, Ordering::Relaxed);
        }
    }
    std::hint::black_box(sink);
    rw
}

/// Checks every word a sequential write pass touched; returns the first mismatch.
fn verify(r: &Region, words: u64, step: u64) -> Result<(), String> {
    let stride = (step / 8).max(1);
    let mut i = 0;
    while i < words {
        let got = r.read_u64((i * 8) as usize);
        if got != i {
            return Err(format!(
                "data wrong at offset {:#x} (address {:#x}): expected {:#x}, got {:#x}",
                i * 8,
                r.as_ptr() as usize + (i * 8) as usize,
                i,
                got
            ));
        }
        i += stride;
    }
    Ok(())
}

fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

const SHOWN: &[&str] = &[
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
];

/// Runs the workload on a fresh manager built from `cfg`; prints the report; returns whether
/// verification passed.
pub fn run(cfg: MmConfig, p: &Params) -> Result<bool, String> {
    let mm = Mm::new(cfg).map_err(|e| e.to_string())?;
    let words = p.bytes_per_task / 8;
    if words == 0 {
        return Err(format!(
            "size per task {} is below one word (8 bytes)",
            p.bytes_per_task
        ));
    }
    let regions: Vec<Region> = (0..p.tasks)
        .map(|_| mm.map_anon(p.bytes_per_task as usize))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicU64::new(0));
    let total_work = p.tasks as u64 * p.bytes_per_task / p.step.max(8) * 8 * p.repeat as u64;
    let bar = if std::io::stderr().is_terminal() && total_work > 0 {
        let b = indicatif::ProgressBar::new(total_work);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(p.workload);
        Some(b)
    } else {
        None
    };
    let start = Instant::now();
    let results: Vec<TaskResult> = std::thread::scope(|s| {
        let handles: Vec<_> = regions
            .iter()
            .enumerate()
            .map(|(t, r)| {
                let done = done.clone();
                s.spawn(move || {
                    let mut rng = XorShift(
                        0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D),
                    );
                    let t0 = Instant::now();
                    // usemem counts bytes/8 for the allocation itself, then 8 per access.
                    let mut bytes = p.bytes_per_task / 8;
                    for _ in 0..p.repeat {
                        bytes += rw_once(r, words, p, &mut rng, &done);
                    }
                    TaskResult {
                        bytes,
                        usecs: t0.elapsed().as_micros().max(1) as u64,
                        end: Instant::now(),
                    }
                })
            })
            .collect();
        while handles.iter().any(|h| !h.is_finished()) {
            if let Some(b) = &bar {
                b.set_position(done.load(Ordering::Relaxed).min(total_work));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("usemem task panicked"))
            .collect()
    });
    let elapsed = results
        .iter()
        .map(|r| r.end.duration_since(start))
        .max()
        .unwrap_or_default();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let vm_after_run = mm.vmstat();
    let peak_resident = mm.peak_resident_bytes();
    for r in &results {
        let line = format!("{} bytes / {} usecs = {} KB/s", r.bytes, r.usecs, r.kbs());
        if p.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    let throughput_kbs: u64 = results.iter().map(|r| r.kbs()).sum();
    // Verify every touched word after a sequential write pass.
    let mut verified = None;
    let mut verify_error = None;
    let mut verify_s = 0.0;
    let before_verify = mm.vmstat();
    if !p.readonly && !p.random && p.verify {
        let vt = Instant::now();
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = regions
                .iter()
                .map(|r| s.spawn(move || verify(r, words, p.step)))
                .collect();
            hs.into_iter()
                .filter_map(|h| h.join().expect("verify panicked").err())
                .collect()
        });
        verify_s = vt.elapsed().as_secs_f64();
        verified = Some(errs.is_empty());
        verify_error = errs.into_iter().next();
        if !p.json {
            println!(
                "verify: {} in {:.2} s",
                if verify_error.is_none() {
                    "ok"
                } else {
                    "FAILED"
                },
                vt.elapsed().as_secs_f64()
            );
        }
    }
    let vm = vm_after_run;
    let dv = mm.vmstat().delta(&before_verify);
    let verify_counters = json!({
        "pswpin": dv.val("pswpin"),
        "pswpout": dv.val("pswpout"),
        "pgmajfault": dv.val("pgmajfault"),
        "pgfault": dv.val("pgfault"),
        "swap_ra": dv.val("swap_ra"),
        "swap_ra_hit": dv.val("swap_ra_hit"),
    });
    let mibs = throughput_kbs as f64 / 1024.0;
    let swapout_mibs = vm.val("pswpout") as f64 * 4096.0 / (1 << 20) as f64 / elapsed.as_secs_f64();
    if p.json {
        let vmstat: serde_json::Map<String, Value> =
            vm.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let out = json!({
            "workload": p.workload,
            "engine": "usermm",
            "tasks": p.tasks,
            "bytes_per_task": p.bytes_per_task,
            "readonly": p.readonly,
            "step": p.step,
            "random": p.random,
            "repeat": p.repeat,
            "budget_bytes": mm.budget(),
            "swap_bytes": mm.swap_bytes(),
            "swap_device": mm.swap_name(),
            "throughput_kbs": throughput_kbs,
            "throughput_mibs": mibs,
            "swapout_mibs": swapout_mibs,
            "elapsed_s": elapsed.as_secs_f64(),
            "verified": verified,
            "verify_error": verify_error,
            "verify_s": verify_s,
            "verify_vmstat": verify_counters,
            "peak_resident_bytes": peak_resident,
            "peak_rss_bytes": peak_rss(),
            "per_task": results.iter().map(|r| json!({"bytes": r.bytes, "usecs": r.usecs, "kbs": r.kbs()})).collect::<Vec<_>>(),
            "vmstat": vmstat,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "{}: {} task(s) x {} MiB, budget {} MiB, swap {} ({} MiB)",
            p.workload,
            p.tasks,
            p.bytes_per_task >> 20,
            mm.budget() >> 20,
            mm.swap_name(),
            mm.swap_bytes() >> 20
        );
        println!(
            "elapsed {:.2} s, throughput {:.0} MiB/s ({} KB/s), swap-out {:.0} MiB/s",
            elapsed.as_secs_f64(),
            mibs,
            throughput_kbs,
            swapout_mibs
        );
        println!(
            "peak resident {:.1} MiB of {} MiB budget; process peak RSS {:.1} MiB",
            peak_resident as f64 / (1 << 20) as f64,
            mm.budget() >> 20,
            peak_rss() as f64 / (1 << 20) as f64
        );
        let moved: Vec<String> = SHOWN.iter().map(|k| format!("{k} {}", vm.val(k))).collect();
        println!("vmstat: {}", moved.join(", "));
        if verified.is_some() {
            let read_mib = dv.val("pswpin") as f64 * 4096.0 / (1 << 20) as f64;
            println!(
                "verify read-back: {verify_s:.2} s, swap-in {:.0} MiB/s, {verify_counters}",
                read_mib / verify_s.max(1e-9)
            );
        }
        if let Some(e) = &verify_error {
            eprintln!("error: verification failed: {e}");
        }
    }
    drop(regions);
    Ok(verify_error.is_none())
}

/// Parses `--swap file|file:PATH|ram|none` with a size.
pub fn swap_config(spec: &str, size: u64) -> Result<SwapConfig, String> {
    match spec {
        "file" => Ok(SwapConfig::File { path: None, size }),
        "ram" => Ok(SwapConfig::Ram { size }),
        "none" => Ok(SwapConfig::None),
        s if s.starts_with("file:") && s.len() > 5 => Ok(SwapConfig::File {
            path: Some(s[5..].into()),
            size,
        }),
        other => Err(format!(
            "--swap: unknown swap device {other:?}: use file, file:PATH, ram or none"
        )),
    }
}
