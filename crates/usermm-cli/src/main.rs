//! The `usermm` command: benchmarks on a usermm memory manager and a report of what the
//! running kernel's userfaultfd offers. Argument parsing and error reporting live here; the
//! workloads live in their own modules.

mod latency;
mod usemem;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use usermm::{Mm, MmConfig};

#[derive(Parser)]
#[command(
    name = "usermm",
    version,
    about = "Linux's memory manager in user space: benchmarks and tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(Bench),
    /// Show the userfaultfd features found at run time, watermarks and the swap device.
    Info {
        #[command(flatten)]
        mm: MmArgs,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// vm-scalability's usemem: TASKS threads, each with its own SIZE region in one manager.
    Usemem {
        /// Bytes per task (k, M, G suffixes).
        size: String,
        /// Tasks (threads, each with its own region).
        #[arg(short = 'n', long = "tasks", default_value_t = 1)]
        tasks: usize,
        /// Only read (untouched memory reads the zero page).
        #[arg(long)]
        readonly: bool,
        /// Touch one word every STEP bytes (default: every word).
        #[arg(short = 'j', long = "step", default_value = "8")]
        step: String,
        /// Random access order.
        #[arg(long)]
        random: bool,
        /// Passes over the area.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Access latency: resident page, minor fault, major fault (random order).
    FaultLatency {
        /// Pages in the region.
        #[arg(long, default_value_t = 8192)]
        pages: usize,
        #[command(flatten)]
        mm: MmArgs,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// vm-scalability case-swap-w-seq: total = 3/4 x (budget + swap size), sequential write.
    SwapWSeq {
        /// Tasks (threads); the total is split evenly.
        #[arg(short = 'n', long = "tasks", default_value_t = 1)]
        tasks: usize,
        #[command(flatten)]
        run: RunArgs,
    },
}

#[derive(Args, Clone)]
struct MmArgs {
    /// Memory budget (k, M, G suffixes).
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Swap device: file (unlinked temporary file in $TMPDIR), file:PATH, ram or none.
    #[arg(long, default_value = "file")]
    swap: String,
    /// Swap size.
    #[arg(long = "swap-size", default_value = "1G")]
    swap_size: String,
    /// Allow mapping more than budget + swap (accesses that find swap full get SIGBUS).
    #[arg(long)]
    overcommit: bool,
    /// Fault handler threads (0: one per CPU).
    #[arg(long = "handler-threads", default_value_t = 0)]
    handler_threads: usize,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    mm: MmArgs,
    /// Skip the read-back verification of written words.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// One JSON object on stdout (usemem lines go to stderr).
    #[arg(long)]
    json: bool,
}

/// A usage error (exit 2) or a run error (exit 1).
enum Failure {
    Usage(String),
    Run(String),
}

fn size(opt: &str, v: &str) -> Result<u64, Failure> {
    usermm::parse_size(v).map_err(|e| Failure::Usage(format!("{opt}: {e}")))
}

impl MmArgs {
    fn config(&self) -> Result<MmConfig, Failure> {
        let budget = size("--budget", &self.budget)?;
        let swap_size = size("--swap-size", &self.swap_size)?;
        let swap = usemem::swap_config(&self.swap, swap_size).map_err(Failure::Usage)?;
        let mut cfg = MmConfig::new(budget).swap(swap).overcommit(self.overcommit);
        cfg.handler_threads = self.handler_threads;
        Ok(cfg)
    }
}

fn bench(b: Bench) -> Result<bool, Failure> {
    let (cfg, params) = match b {
        Bench::FaultLatency { pages, mm, json } => {
            if pages == 0 {
                return Err(Failure::Usage("--pages: must be at least 1".into()));
            }
            return latency::run(mm.config()?, pages, json).map_err(Failure::Run);
        }
        Bench::Usemem {
            size: sz,
            tasks,
            readonly,
            step,
            random,
            repeat,
            run,
        } => {
            if tasks == 0 {
                return Err(Failure::Usage("--tasks: must be at least 1".into()));
            }
            let step = size("--step", &step)?;
            let params = usemem::Params {
                workload: "usemem",
                tasks,
                bytes_per_task: size("SIZE", &sz)? & !7,
                readonly,
                step: step.max(8),
                random,
                repeat: repeat.max(1),
                verify: !run.no_verify,
                json: run.json,
            };
            (run.mm.config()?, params)
        }
        Bench::SwapWSeq { tasks, run } => {
            if tasks == 0 {
                return Err(Failure::Usage("--tasks: must be at least 1".into()));
            }
            let cfg = run.mm.config()?;
            let swap = match &cfg.swap {
                usermm::SwapConfig::File { size, .. } | usermm::SwapConfig::Ram { size } => *size,
                _ => 0,
            };
            let total = (cfg.budget + swap) / 4 * 3;
            let per = (total / tasks as u64) & !4095;
            let params = usemem::Params {
                workload: "swap-w-seq",
                tasks,
                bytes_per_task: per,
                readonly: false,
                step: 8,
                random: false,
                repeat: 1,
                verify: !run.no_verify,
                json: run.json,
            };
            (cfg, params)
        }
    };
    usemem::run(cfg, &params).map_err(Failure::Run)
}

fn info(mm: MmArgs, json: bool) -> Result<bool, Failure> {
    let m = Mm::new(mm.config()?).map_err(|e| Failure::Run(e.to_string()))?;
    let u = m.uffd_info();
    let w = m.watermarks();
    if json {
        let v = serde_json::json!({
            "uffd_origin": format!("{:?}", u.origin),
            "uffd_features": u.features,
            "budget_bytes": m.budget(),
            "watermarks_pages": {"min": w.min, "low": w.low, "high": w.high},
            "swap_device": m.swap_name(),
            "swap_bytes": m.swap_bytes(),
            "handler_threads": m.config().handler_threads,
        });
        println!("{v}");
    } else {
        println!("userfaultfd: {:?}", u.origin);
        println!("features: {}", u.features.join(" "));
        println!(
            "budget: {} MiB; watermarks (pages): min {} low {} high {}",
            m.budget() >> 20,
            w.min,
            w.low,
            w.high
        );
        println!("swap: {} ({} MiB)", m.swap_name(), m.swap_bytes() >> 20);
    }
    Ok(true)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Bench(b) => bench(b),
        Cmd::Info { mm, json } => info(mm, json),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(Failure::Usage(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Run(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(1)
        }
    }
}
