//! The kernel engine's worker: `usermm __kernel-worker`, started by the harness and moved into
//! the memory cgroup before it allocates anything. It reads one JSON line (the job) from stdin,
//! runs it on plain kernel memory (anonymous mappings for usemem, a file on the local
//! filesystem for dd, a shared mapping of one for mmap-file), and prints the outcome as one JSON line on stdout. It exits at once if
//! its stdin closes before it is done (the harness died), so a killed harness leaves no worker
//! behind.
//!
//! Counters: /proc/vmstat (system-wide; `allocstall` is the sum of the per-zone
//! `allocstall_*`, as usermm has one) and the cgroup's memory.stat, read around each phase.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use usermm_sys::{Advice, Mapping};

use crate::bench::dd::{self, DdOutcome, DdParams};
use crate::bench::mmapfile;
use crate::bench::usemem::{self, Outcome, Params, Sampler};
use crate::counters::Counters;
use crate::Failure;

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__kernel-worker";

/// A workload for the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Job {
    Usemem(Params),
    Dd(DdParams),
    MmapFile(mmapfile::Params),
}

/// What it produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JobResult {
    Usemem {
        outcome: Outcome,
        peak_rss: u64,
    },
    Dd(DdOutcome),
    /// One pass, or the kernel's two randread passes (default readahead, MADV_RANDOM).
    MmapFile(Vec<mmapfile::Pass>),
}

/// The job and the cgroup the worker runs in.
#[derive(Debug, Serialize, Deserialize)]
pub struct Spec {
    pub job: Job,
    pub cgroup: PathBuf,
}

/// /proc/vmstat and the worker's memory.stat.
pub struct KernelSampler {
    pub cgroup: PathBuf,
}

/// /proc/vmstat with `allocstall` added as the sum of the per-zone `allocstall_*` lines.
pub fn proc_vmstat() -> Counters {
    let mut c = Counters::parse(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default());
    let stalls: u64 = c
        .iter()
        .filter(|(k, _)| k.starts_with("allocstall_"))
        .map(|(_, v)| v)
        .sum();
    c.set("allocstall", stalls);
    c
}

impl Sampler for KernelSampler {
    fn vmstat(&self) -> Counters {
        proc_vmstat()
    }
    fn memcg(&self) -> Option<Counters> {
        Some(super::cgroup::stat_of(&self.cgroup))
    }
}

/// The worker's main: returns the process exit status.
pub fn main() -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(Failure::Usage(format!(
            "{SUBCOMMAND} is started by the kernel engine (--engine kernel), not by hand"
        )));
    }
    let mut line = String::new();
    let mut lock = stdin.lock();
    lock.read_line(&mut line)
        .map_err(|e| Failure::Run(format!("kernel worker: reading the job: {e}")))?;
    drop(lock);
    let spec: Spec = serde_json::from_str(line.trim()).map_err(|e| {
        Failure::Usage(format!(
            "{SUBCOMMAND} is started by the kernel engine, not by hand (bad job: {e})"
        ))
    })?;
    // The harness keeps our stdin open while it waits; end of file means it is gone.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut sink) {
                Ok(0) | Err(_) => {
                    eprintln!("usermm kernel worker: the harness went away; stopping");
                    std::process::exit(3);
                }
                Ok(_) => {}
            }
        }
    });
    let sampler = KernelSampler {
        cgroup: spec.cgroup.clone(),
    };
    let result = match spec.job {
        Job::Usemem(p) => {
            let len = usemem::region_len(&p)?;
            let maps: Vec<Mapping> = (0..p.tasks)
                .map(|_| {
                    let m = Mapping::anon(len, 0)?;
                    // 4 KiB pages, like usermm's regions: no transparent huge pages.
                    m.advise(0, m.len(), Advice::NoHugePage)?;
                    Ok(m)
                })
                .collect::<std::io::Result<_>>()
                .map_err(|e| Failure::Run(format!("kernel worker: mmap of {len} bytes: {e}")))?;
            let outcome = usemem::execute(&maps, &p, &sampler)?;
            drop(maps);
            JobResult::Usemem {
                outcome,
                peak_rss: crate::output::peak_rss_bytes(),
            }
        }
        Job::Dd(p) => {
            let target = dd::KernelDir { dir: p.dir.clone() };
            JobResult::Dd(dd::execute(&target, &p, &sampler)?)
        }
        Job::MmapFile(p) => JobResult::MmapFile(mmapfile::kernel_passes(&p, &sampler)?),
    };
    let text = serde_json::to_string(&result).map_err(Failure::run)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(Failure::run)?;
    out.flush().map_err(Failure::run)?;
    Ok(())
}
