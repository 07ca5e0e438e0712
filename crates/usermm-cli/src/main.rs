//! The `usermm` command: benchmarks on a usermm memory manager and a report of what the
//! running kernel's userfaultfd offers.
//!
//! This module holds the command line (clap), the translation of its options into an
//! [`MmConfig`] and the workload parameters, and error reporting: usage errors (a value that does
//! not parse, an impossible combination) exit with 2, errors from the run (usermm refused the
//! mapping, verification failed) print `error: <message>` and exit with 1.

mod bench;
mod info;
mod output;
mod run;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use usermm::{MmConfig, SwapConfig};

use bench::usemem::Params;

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
    Bench(BenchCmd),
    /// Show the userfaultfd features found at run time, watermarks and the swap device.
    Info {
        #[command(flatten)]
        mm: MmArgs,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Run an unmodified, dynamically linked program with its large anonymous memory served
    /// by usermm (a preload library); exits with the program's status.
    Run(run::RunCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// vm-scalability's usemem: TASKS threads, each with its own SIZE region in one manager,
    /// writing each touched word's index into it (or only reading, with --readonly).
    Usemem {
        /// Bytes per task (k, M, G, T suffixes).
        size: String,
        /// Tasks (threads, each with its own region mapped from the one manager).
        #[arg(
            short = 'n',
            long = "tasks",
            visible_alias = "nproc",
            default_value_t = 1
        )]
        tasks: usize,
        /// Only read (untouched memory reads the zero page).
        #[arg(short = 'o', long)]
        readonly: bool,
        /// Touch one word every STEP bytes (k, M, G suffixes; below 8 means every word).
        #[arg(short = 'j', long = "step", default_value = "8")]
        step: String,
        /// Random access order (as many accesses per pass as the sequential order).
        #[arg(short = 'R', long)]
        random: bool,
        /// Passes over the area.
        #[arg(short = 'r', long, default_value_t = 1)]
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
    /// vm-scalability case-swap-w-seq: total = 3/4 x (budget + swap size), split evenly over
    /// the tasks, sequential write, then read-back verification. Swap size defaults to 1G.
    SwapWSeq {
        /// Tasks (threads); the total is split evenly (rounded down to 4 KiB per task).
        #[arg(
            short = 'n',
            long = "tasks",
            visible_alias = "nproc",
            default_value_t = 1
        )]
        tasks: usize,
        #[command(flatten)]
        run: RunArgs,
    },
}

#[derive(Args, Clone)]
struct MmArgs {
    /// Memory budget (k, M, G, T suffixes).
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Swap device: file (unlinked temporary file in $TMPDIR), file:PATH, ram or none.
    #[arg(long, default_value = "file")]
    swap: String,
    /// Swap size [default: 4x the budget; swap-w-seq: 1G].
    #[arg(long = "swap-size")]
    swap_size: Option<String>,
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
    /// Skip the verification of written (or, with --readonly, read) words.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// One JSON object on stdout (usemem's per-task lines go to stderr).
    #[arg(long)]
    json: bool,
}

/// Why the command failed: a usage error (exit 2) or a run error (exit 1).
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Run(String),
}

impl Failure {
    /// A run error from anything printable (usermm's errors, I/O errors).
    pub fn run(e: impl std::fmt::Display) -> Failure {
        Failure::Run(e.to_string())
    }
}

/// Parses the size given to option `opt`; a value that does not parse is a usage error naming
/// the option and the value.
fn size(opt: &str, v: &str) -> Result<u64, Failure> {
    usermm::parse_size(v).map_err(|e| {
        let msg = match e {
            usermm::Error::InvalidArgument(m) => m,
            other => other.to_string(),
        };
        Failure::Usage(format!("{opt}: {msg}"))
    })
}

fn at_least_one(opt: &str, v: u64) -> Result<(), Failure> {
    if v == 0 {
        return Err(Failure::Usage(format!("{opt}: must be at least 1")));
    }
    Ok(())
}

/// Parses `--swap file|file:PATH|ram|none` with a size.
fn swap_config(spec: &str, size: u64) -> Result<SwapConfig, Failure> {
    SwapConfig::parse(spec, size).map_err(|e| Failure::Usage(format!("--swap: {e}")))
}

/// Default swap size when `--swap-size` is not given.
#[derive(Clone, Copy)]
enum SwapDefault {
    /// Four times the budget (usermm's own default, like `MmConfig::new`).
    FourTimesBudget,
    /// A fixed size (swap-w-seq: 1 GiB).
    Fixed(u64),
}

impl MmArgs {
    fn config(&self, default_swap: SwapDefault) -> Result<MmConfig, Failure> {
        let budget = size("--budget", &self.budget)?;
        let swap_size = match &self.swap_size {
            Some(s) => size("--swap-size", s)?,
            None => match default_swap {
                SwapDefault::FourTimesBudget => budget.saturating_mul(4),
                SwapDefault::Fixed(n) => n,
            },
        };
        let swap = swap_config(&self.swap, swap_size)?;
        Ok(MmConfig::new(budget)
            .swap(swap)
            .overcommit(self.overcommit)
            .handler_threads(self.handler_threads))
    }
}

/// Swap capacity a configuration asks for (0 without swap).
fn configured_swap_bytes(cfg: &MmConfig) -> u64 {
    match &cfg.swap {
        SwapConfig::File { size, .. } | SwapConfig::Ram { size } => *size,
        // The command line never builds a custom device.
        SwapConfig::None | SwapConfig::Device(_) => 0,
    }
}

fn bench(b: BenchCmd) -> Result<(), Failure> {
    match b {
        BenchCmd::FaultLatency { pages, mm, json } => {
            at_least_one("--pages", pages as u64)?;
            bench::latency::run(mm.config(SwapDefault::FourTimesBudget)?, pages, json)
        }
        BenchCmd::Usemem {
            size: sz,
            tasks,
            readonly,
            step,
            random,
            repeat,
            run,
        } => {
            at_least_one("--tasks", tasks as u64)?;
            at_least_one("--repeat", repeat as u64)?;
            let bytes_per_task = size("SIZE", &sz)? & !7;
            if bytes_per_task == 0 {
                return Err(Failure::Usage(format!(
                    "SIZE: {sz:?} is less than one 8-byte word; give at least 8 bytes per task"
                )));
            }
            if bytes_per_task.checked_mul(tasks as u64).is_none() {
                return Err(Failure::Usage(format!(
                    "SIZE: {tasks} tasks x {bytes_per_task} bytes overflows 64 bits"
                )));
            }
            // usemem: `if (step < sizeof(long)) step = sizeof(long);`
            let step = size("--step", &step)?.max(8);
            let params = Params {
                workload: "usemem",
                tasks,
                bytes_per_task,
                readonly,
                step,
                random,
                repeat,
                verify: !run.no_verify,
                json: run.json,
            };
            bench::usemem::run(run.mm.config(SwapDefault::FourTimesBudget)?, &params)
        }
        BenchCmd::SwapWSeq { tasks, run } => {
            at_least_one("--tasks", tasks as u64)?;
            let cfg = run.mm.config(SwapDefault::Fixed(1 << 30))?;
            let total = cfg.budget.saturating_add(configured_swap_bytes(&cfg)) / 4 * 3;
            let per = (total / tasks as u64) & !4095;
            if per == 0 {
                return Err(Failure::Usage(format!(
                    "--tasks: {tasks} tasks leave less than one 4 KiB page each of the {total} bytes \
                     (3/4 of budget + swap); use fewer tasks or a larger budget"
                )));
            }
            let params = Params {
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
            bench::usemem::run(cfg, &params)
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(r) => return run::main(r),
        Cmd::Bench(b) => bench(b),
        Cmd::Info { mm, json } => mm
            .config(SwapDefault::FourTimesBudget)
            .and_then(|cfg| info::run(cfg, json)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
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
