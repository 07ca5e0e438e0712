//! `usermm bench dd`: seed 002's workload: "a simple dd of a large file done multiple times with
//! the file deleted on each iteration; the size of the file is 1/10th physical memory to avoid
//! dirty page balancing", async (no sync) or sync (`conv=fdatasync`), on a file system or on an
//! in-memory file (the tmpfs case). Reported per iteration and as Max / mean elapsed time and
//! MiB/s, with the counters behind seed 002: `mark_page_accessed` calls (atomic marking of a
//! visible page) against `init_page_accessed` (plain marking before insertion).

use std::time::Instant;

use serde_json::json;
use usermm::{Mm, MmConfig};

use crate::Failure;

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    pub size: u64,
    pub bs: usize,
    pub iterations: u32,
    pub sync: bool,
    pub memory: bool,
    pub dir: std::path::PathBuf,
    pub json: bool,
}

/// Times of one run.
#[derive(Debug, Clone)]
pub struct Report {
    pub elapsed: Vec<f64>,
    pub vmstat: usermm::Vmstat,
}

impl Report {
    pub fn max(&self) -> f64 {
        self.elapsed.iter().copied().fold(0.0, f64::max)
    }
    pub fn mean(&self) -> f64 {
        self.elapsed.iter().sum::<f64>() / self.elapsed.len().max(1) as f64
    }
}

/// Runs the dd loop on a usermm manager.
pub fn run(cfg: MmConfig, p: &Params) -> Result<Report, Failure> {
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    std::fs::create_dir_all(&p.dir)
        .map_err(|e| Failure::Run(format!("creating {}: {e}", p.dir.display())))?;
    let buf = vec![0u8; p.bs];
    let before = mm.vmstat();
    let mut elapsed = Vec::new();
    for it in 0..p.iterations {
        let path = p.dir.join(format!("usermm-dd-{}-{it}", std::process::id()));
        let t = Instant::now();
        {
            let f = if p.memory {
                mm.memfile("dd").map_err(Failure::run)?
            } else {
                mm.open(&path).map_err(Failure::run)?
            };
            let mut pos = 0u64;
            while pos < p.size {
                let n = (p.size - pos).min(p.bs as u64) as usize;
                f.write_at(pos, &buf[..n]).map_err(Failure::run)?;
                pos += n as u64;
            }
            if p.sync {
                f.sync().map_err(Failure::run)?;
            }
            elapsed.push(t.elapsed().as_secs_f64());
            // Closing writes back what is left (the async case's writeback happens here, out
            // of the timed part, as dd's own exit does not wait for it either).
        }
        if !p.memory {
            let _ = std::fs::remove_file(&path);
        }
        if !p.json {
            eprintln!(
                "iteration {it}: {:.4} s, {:.0} MiB/s",
                elapsed[elapsed.len() - 1],
                (p.size as f64 / (1 << 20) as f64) / elapsed[elapsed.len() - 1]
            );
        }
    }
    Ok(Report {
        elapsed,
        vmstat: mm.vmstat().delta(&before),
    })
}

/// Prints a report.
pub fn print(p: &Params, r: &Report, settings: &usermm::Settings) {
    let mib = p.size as f64 / (1 << 20) as f64;
    if p.json {
        let keys = [
            "mark_page_accessed",
            "init_page_accessed",
            "nr_dirtied",
            "nr_written",
            "balance_dirty_pages",
            "pgsteal_file",
            "tree_lock_acquire",
        ];
        let vm: serde_json::Map<String, serde_json::Value> = r
            .vmstat
            .iter()
            .filter(|(n, v)| *v > 0 || keys.contains(n))
            .map(|(n, v)| (n.to_string(), json!(v)))
            .collect();
        println!(
            "{}",
            json!({
                "workload": "dd",
                "engine": "usermm",
                "settings": settings.to_string(),
                "size": p.size, "bs": p.bs, "iterations": p.iterations,
                "sync": p.sync, "memory": p.memory,
                "elapsed_s": r.elapsed,
                "max_elapsed_s": r.max(), "mean_elapsed_s": r.mean(),
                "mib_per_s": mib / r.mean(),
                "vmstat": vm,
            })
        );
        return;
    }
    println!(
        "dd {} x {:.0} MiB ({}, {}): Max elapsed {:.4} s, mean {:.4} s, {:.0} MiB/s",
        p.iterations,
        mib,
        if p.memory { "in-memory file" } else { "file" },
        if p.sync { "sync" } else { "async" },
        r.max(),
        r.mean(),
        mib / r.mean()
    );
    println!(
        "mark_page_accessed {}, init_page_accessed {}, nr_written {}, balance_dirty_pages {}",
        r.vmstat.val("mark_page_accessed"),
        r.vmstat.val("init_page_accessed"),
        r.vmstat.val("nr_written"),
        r.vmstat.val("balance_dirty_pages")
    );
}
