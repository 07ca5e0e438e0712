//! The `usermm` command: benchmarks on a usermm memory manager and a report of what the
//! running kernel's userfaultfd offers.
//!
//! This module holds the command line (clap), the translation of its options into an
//! [`MmConfig`] and the workload parameters, and error reporting: usage errors (a value that does
//! not parse, an impossible combination) exit with 2, errors from the run (usermm refused the
//! mapping, verification failed) print `error: <message>` and exit with 1.

#![forbid(unsafe_code)]

mod apps;
mod bench;
mod compare;
mod counters;
mod engine;
mod info;
mod interrupt;
mod kernel;
mod output;
mod plot;
mod report;
mod run;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use usermm::{MmConfig, SwapConfig};

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
    /// A/B comparison of a seed switch: old and new alternately, LKP or mmtests table.
    Compare(compare::CompareArgs),
    /// The kernel engine's worker (started by the harness inside its memory cgroup).
    #[command(name = "__kernel-worker", hide = true)]
    KernelWorker,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Real, unmodified programs (GNU sort, numpy, a Python dict, awk, perl, Python Pools, make
    /// with gcc) natively for the reference output, then under `usermm run` and in a memory
    /// cgroup of the same budget with kernel swap of the same kind and size, alternately: wall
    /// time, speed ratio, peak RSS of the process tree, faults, and whether stdout is identical
    /// to the native run (a mismatch fails the command).
    Apps {
        /// Cases, comma-separated: sort, numpy, pydict, awk, perl, mp-numpy (a multiprocessing Pool:
        /// the process tree under one budget), mp-pool (a Pool of forked workers over the
        /// parent's array), mp-dict (a Pool of forked workers reading a dict in the parent's
        /// heap), make (`make -j2` of a generated C project with gcc -O2: many
        /// processes, two large cc1 at a time), or all.
        #[arg(long = "case", default_value = "all")]
        case: String,
        /// Memory budget: usermm run's --budget and the cgroup's limit (k, M, G suffixes).
        #[arg(long, default_value = "64M")]
        budget: String,
        /// Swap: file (usermm: a temporary file; kernel: a swap file), ram (usermm: RAM;
        /// kernel: zram), or any other `usermm run --swap` device: zswap+file,
        /// zswap:pool=1G+ram, redis://... (kernel: zswap over a swap file for the compressed
        /// tiers, a swap file for Redis; --kernel-swap chooses another).
        #[arg(long, default_value = "file")]
        swap: String,
        /// The kernel engine's swap when it should differ from --swap's kind: ram (zram), file,
        /// zswap+file or none [default: the kind --swap names]
        #[arg(long = "kernel-swap", value_name = "SPEC")]
        kernel_swap: Option<String>,
        /// Swap size on both engines.
        #[arg(long = "swap-size", default_value = "2G")]
        swap_size: String,
        /// A seed switch or setting for every `usermm run`, NAME=VALUE (repeatable): A/B a
        /// policy on real programs, e.g. --set lru_gen=on.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Runs per engine (alternating usermm, kernel, usermm, ...).
        #[arg(long, default_value_t = 1)]
        runs: u32,
        /// Engines: usermm, kernel, or usermm,kernel (the kernel engine needs root).
        #[arg(long, default_value = "usermm,kernel")]
        engine: String,
        /// Small inputs (seconds per case; what CI runs).
        #[arg(long)]
        quick: bool,
        /// Directory for the generated inputs and the outputs [default: $TMPDIR].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// One JSON object on stdout (progress goes to stderr).
        #[arg(long)]
        json: bool,
    },
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
    /// A soak: mixed anonymous and file work over 3x the budget, every page checked; exit 1
    /// at the first mismatch, inconsistency, stuck fault, or nonzero counter of a usermm bug or
    /// an I/O error (mm_warn, pool_slot_lost, swap_read_error, oom_poison, ...).
    ///
    /// Worker threads run a random mix of random and sequential writes and reads, discards,
    /// region re-creation, shared file mappings, buffered file I/O and syncs checked on disk;
    /// every page is checked whole against a shadow version, `Mm::audit` and the manager's
    /// health run at intervals, and every page is swept once more at the end. A failure names
    /// the page, what it holds and its last operations.
    Soak {
        /// How long to run: 3m, 30m, 1h, 90s, ...
        #[arg(long, default_value = "3m")]
        duration: String,
        /// Worker threads.
        #[arg(short = 't', long, default_value_t = 4)]
        threads: usize,
        /// Seed of the operation mix.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How often the manager is audited and its health checked.
        #[arg(long = "audit-every", default_value = "5s")]
        audit_every: String,
        /// Directory for the workers' files [default: $TMPDIR].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        mm: MmArgs,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
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
    /// A simoop-like latency workload (seed 004's): worker threads allocate and touch memory,
    /// read and write random blocks of files larger than the budget through the page cache;
    /// CPU burners compete. Prints p50/p95/p99/max latency (usec) of Read, Write and
    /// Allocation per interval and at the end, the work rate and the alloc stall rate.
    Simoop {
        /// Worker threads.
        #[arg(short = 't', long, default_value_t = 4)]
        threads: usize,
        /// CPU burner threads.
        #[arg(long, default_value_t = 1)]
        burners: usize,
        /// Files.
        #[arg(long, default_value_t = 8)]
        files: usize,
        /// Size of each file.
        #[arg(long = "file-size", default_value = "128M")]
        file_size: String,
        /// Bytes per read.
        #[arg(long = "read-size", default_value = "2M")]
        read_size: String,
        /// Bytes per write.
        #[arg(long = "write-size", default_value = "1M")]
        write_size: String,
        /// Memory each loop allocates and touches.
        #[arg(long = "alloc-size", default_value = "8M")]
        alloc_size: String,
        /// Shared working set kept mapped [default: half the budget].
        #[arg(long = "working-set")]
        working_set: Option<String>,
        /// Run time (seconds).
        #[arg(long, default_value_t = 20)]
        duration: u64,
        /// Reporting interval (seconds).
        #[arg(long, default_value_t = 2)]
        interval: u64,
        /// Directory for the files [default: $TMPDIR/usermm-simoop].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        mm: MmArgs,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// A shared file mapping of SIZE walked by --threads threads: sequential write (one word
    /// per 64 bytes, then msync) of a new file, cold sequential read, or random 8-byte reads or
    /// writes of random pages of a written file; on usermm's page cache and/or the kernel's
    /// (mmap(2) in a memory cgroup of the same budget). randread runs on each engine with
    /// default readahead and with MADV_RANDOM, and the better counts. Medians per pattern and
    /// engine.
    MmapFile {
        /// File size [default: 4x the budget].
        #[arg(long)]
        size: Option<String>,
        /// Access patterns, comma-separated: seqwrite, seqread, randread, randwrite.
        #[arg(long, default_value = "seqwrite,seqread")]
        pattern: String,
        /// Threads walking the one mapping (sequential: a contiguous slice each).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Random patterns: accesses in all [default: twice the budget's pages and at least
        /// 65536, at most the file's pages: the pass reaches the steady state where every miss
        /// evicts a page].
        #[arg(long)]
        ops: Option<u64>,
        /// Random patterns: seconds after which the threads stop even with accesses left.
        #[arg(long = "time-limit", default_value_t = 30)]
        time_limit: u64,
        /// Directory for the file [default: $TMPDIR].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        mm: MmArgs,
        /// Engines: usermm, kernel (mmap(2) in a memory cgroup of --budget; root only) or
        /// usermm,kernel (alternately, run by run).
        #[arg(long, default_value = "usermm")]
        engine: String,
        /// Runs per engine and pattern.
        #[arg(long, default_value_t = 1)]
        runs: u32,
        /// One JSON object on stdout (the runs' lines go to stderr).
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
    /// vm-scalability case-anon-r-seq: read-only usemem over 256 x the budget in total
    /// (hw_vars' PTE_LIMIT with the budget as available memory), split over the tasks.
    AnonRSeq {
        /// Tasks (threads); the total is split evenly.
        #[arg(
            short = 'n',
            long = "tasks",
            visible_alias = "nproc",
            default_value_t = 1
        )]
        tasks: usize,
        /// Total bytes instead of 256 x budget (k, M, G, T suffixes).
        #[arg(long)]
        size: Option<String>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Seed 002's dd loop: dd if=/dev/zero of=FILE bs=BS count=N, repeated (file deleted each
    /// time), through the page cache (usermm's, or the kernel's with --engine kernel); GNU dd's
    /// summary line per iteration; --memory: in-memory files (the tmpfs case).
    Dd {
        /// Block size.
        #[arg(long, default_value = "1M")]
        bs: String,
        /// Blocks per file [default: a tenth of the budget].
        #[arg(long)]
        count: Option<u64>,
        /// Files written (and deleted) per run.
        #[arg(long, default_value_t = 5)]
        iterations: u32,
        /// fdatasync before each iteration's clock stops (dd conv=fdatasync).
        #[arg(long)]
        fdatasync: bool,
        /// Directory of the file (a local filesystem) [default: $TMPDIR].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Memory budget (the cgroup limit).
        #[arg(long, default_value = "256M")]
        budget: String,
        /// Swap: none, ram (zram) or file.
        #[arg(long, default_value = "none")]
        swap: String,
        /// Swap size [default: 4x the budget].
        #[arg(long = "swap-size")]
        swap_size: Option<String>,
        /// In-memory files (usermm) / /dev/shm (kernel): the tmpfs case.
        #[arg(long)]
        memory: bool,
        /// A seed switch or setting, NAME=VALUE (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Engine: usermm, kernel, or usermm,kernel (alternately, with ratios).
        #[arg(long, default_value = "usermm")]
        engine: String,
        /// Runs per engine.
        #[arg(long, default_value_t = 1)]
        runs: u32,
        /// One JSON object on stdout (dd's lines go to stderr).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Clone)]
struct MmArgs {
    /// Memory budget (k, M, G, T suffixes).
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Swap device: file (unlinked temporary file in $TMPDIR), file:PATH, ram, none, or a
    /// compressed tier in front of one: zswap+file, zswap+ram, zswap:zstd,pool=25%+file:PATH
    /// (options lz4 (default), zstd, zstd=LEVEL, pool=SIZE or pool=N% of the budget, default 20%),
    /// a Redis Cluster: redis://[USER@]HOST:PORT[,HOST:PORT...] (password from
    /// USERMM_REDIS_PASSWORD or USERMM_REDIS_PASSWORD_FILE), rediss://... over TLS (PEM files
    /// named by USERMM_REDIS_CACERT, and USERMM_REDIS_CERT + USERMM_REDIS_KEY for mutual TLS),
    /// or zswap+redis://..., zswap+rediss://...
    #[arg(long, default_value = "file")]
    swap: String,
    /// Swap size [default: 4x the budget; swap-w-seq: 1G].
    #[arg(long = "swap-size")]
    swap_size: Option<String>,
    /// Redis Cluster swap: a write counts as done only when N replicas acknowledged it (WAIT).
    #[arg(long = "swap-sync-replicas", default_value_t = 0)]
    swap_sync_replicas: u32,
    /// Allow mapping more than budget + swap (accesses that find swap full get SIGBUS).
    #[arg(long)]
    overcommit: bool,
    /// Encrypt what the file and Redis swap tiers store (ChaCha20-Poly1305, a random key held
    /// only in memory). Also USERMM_SWAP_ENCRYPT=1.
    #[arg(long = "swap-encrypt")]
    swap_encrypt: bool,
    /// Keep a --swap file:PATH file on disk (default: the file has no name while in use, so nothing outlives the process)
    #[arg(long = "swap-keep")]
    swap_keep: bool,
    /// Fault handler threads (0: one per CPU).
    #[arg(long = "handler-threads", default_value_t = 0)]
    handler_threads: usize,
    /// A seed switch or setting, NAME=VALUE (repeatable; `usermm info` lists them), e.g.
    /// --set swapcache_writeback_tags=on --set laptop_mode=on. Applied over USERMM_SET.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    /// Transparent huge pages for anonymous regions: always (2 MiB fault units, huge zero
    /// page) or never.
    #[arg(long, default_value = "never", value_parser = ["always", "never"])]
    thp: String,
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
    /// Memory manager: usermm, kernel (the kernel's own, in a memory cgroup of --budget, with
    /// kernel swap on zram or a swap file; root only) or usermm,kernel (alternately).
    #[arg(long, default_value = "usermm")]
    engine: String,
    /// Runs per engine (alternating engines when several).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// The kernel engine's swap when it should differ from --swap's kind (same size): ram
    /// (zram), file (a swap file), zswap+file (the kernel's zswap over a swap file) or none;
    /// e.g. `--swap zswap+file --kernel-swap ram` puts usermm's compressed tier against zram
    /// [default: the kind --swap names]
    #[arg(long = "kernel-swap", value_name = "SPEC")]
    kernel_swap: Option<String>,
}

/// Why the command failed: a usage error (exit 2) or a run error (exit 1).
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Run(String),
    /// SIGINT/SIGTERM/SIGHUP while the kernel engine's handler was installed (exit 130).
    Interrupted,
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
            usermm::Error::InvalidArgument(m) => m.to_string(),
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

/// Parses `--swap` (see `SwapConfig::parse`) with a size.
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
        if budget < usermm::MIN_BUDGET {
            return Err(Failure::Usage(format!(
                "--budget: {} ({budget} bytes) is below the minimum of 1M",
                self.budget
            )));
        }
        if self.handler_threads > usermm::MAX_HANDLER_THREADS {
            return Err(Failure::Usage(format!(
                "--handler-threads: {} is above the maximum of {}; use 0 (one per CPU) or fewer",
                self.handler_threads,
                usermm::MAX_HANDLER_THREADS
            )));
        }
        let swap_size = match &self.swap_size {
            Some(s) => size("--swap-size", s)?,
            None => match default_swap {
                SwapDefault::FourTimesBudget => budget.saturating_mul(4),
                SwapDefault::Fixed(n) => n,
            },
        };
        let mut swap = swap_config(&self.swap, swap_size)?;
        if swap_size < 4096 && !matches!(swap, SwapConfig::None) {
            return Err(Failure::Usage(format!(
                "--swap-size: {swap_size} bytes is below one 4 KiB page; give at least 4k (or --swap none)"
            )));
        }
        if self.swap_sync_replicas > 0 && !swap.set_sync_replicas(self.swap_sync_replicas) {
            return Err(Failure::Usage(format!(
                "--swap-sync-replicas {} needs a redis[s]:// swap device (--swap {:?} has none)",
                self.swap_sync_replicas, self.swap
            )));
        }
        let mut settings =
            usermm::Settings::from_env().map_err(|e| Failure::Usage(e.to_string()))?;
        for s in &self.set {
            settings
                .apply(s)
                .map_err(|e| Failure::Usage(format!("--set {s}: {e}")))?;
        }
        let mut cfg = MmConfig::new(budget)
            .swap(swap)
            .overcommit(self.overcommit)
            .handler_threads(self.handler_threads)
            .settings(settings);
        cfg.thp = self.thp == "always";
        cfg.swap_encrypt = self.swap_encrypt;
        cfg.swap_keep = self.swap_keep;
        cfg.validate().map_err(|e| Failure::Usage(e.to_string()))?;
        Ok(cfg)
    }
}

fn bench(b: BenchCmd) -> Result<(), Failure> {
    match b {
        BenchCmd::Apps {
            case,
            budget,
            swap,
            kernel_swap,
            swap_size,
            set,
            runs,
            engine: eng,
            quick,
            dir,
            json,
        } => {
            at_least_one("--runs", runs as u64)?;
            // Checked here, so that a bad one stops the command before any program runs.
            let mut settings = usermm::Settings::default();
            for s in &set {
                settings
                    .apply(s)
                    .map_err(|e| Failure::Usage(format!("--set {s}: {e}")))?;
            }
            let budget_b = size("--budget", &budget)?;
            if budget_b < usermm::MIN_BUDGET {
                return Err(Failure::Usage(format!(
                    "--budget: {budget} is below the minimum of 1 MiB"
                )));
            }
            let swap_b = size("--swap-size", &swap_size)?;
            at_least_one("--swap-size", swap_b)?;
            let swap_cfg = SwapConfig::parse(&swap, swap_b)
                .map_err(|e| Failure::Usage(format!("--swap: {e}")))?;
            let kernel = kernel::Setup::with_swap(
                &MmConfig::new(budget_b).swap(swap_cfg),
                kernel_swap.as_deref(),
            )
            .map_err(|e| Failure::Usage(format!("--kernel-swap: {e}")))?;
            let p = apps::Params {
                cases: apps::parse_cases(&case)?,
                budget: budget_b,
                swap,
                kernel,
                swap_size: swap_b,
                set,
                runs,
                engines: engine::parse_engines(&eng)?,
                quick,
                json,
                dir: dir.unwrap_or_else(std::env::temp_dir),
            };
            apps::run(&p)
        }
        BenchCmd::Soak {
            duration,
            threads,
            seed,
            audit_every,
            dir,
            mm,
            json,
        } => {
            at_least_one("--threads", threads as u64)?;
            if threads > 1024 {
                return Err(Failure::Usage(format!(
                    "--threads: {threads} is above the maximum of 1024"
                )));
            }
            let duration = bench::soak::parse_duration(&duration)
                .map_err(|e| Failure::Usage(format!("--duration: {e}")))?;
            let audit_every = bench::soak::parse_duration(&audit_every)
                .map_err(|e| Failure::Usage(format!("--audit-every: {e}")))?;
            let cfg = mm.config(SwapDefault::FourTimesBudget)?;
            // Three times the budget of anonymous memory and one budget of file, over the
            // threads: reclaim never rests.
            let per = |total: u64| (total / threads as u64) as usize;
            let p = bench::soak::Params {
                duration,
                threads,
                anon_bytes: per(cfg.budget.saturating_mul(3)),
                file_bytes: per(cfg.budget) / 4096 * 4096,
                seed,
                audit_every,
                dir: dir.unwrap_or_else(std::env::temp_dir),
                json,
            };
            bench::soak::run(cfg, &p)
        }
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
            let bytes = size("SIZE", &sz)?;
            let step = size("--step", &step)?;
            let params = bench::presets::usemem(
                &sz,
                bytes,
                tasks,
                readonly,
                step,
                random,
                repeat,
                !run.no_verify,
            )?;
            let cfg = run.mm.config(SwapDefault::FourTimesBudget)?;
            run_usemem(&run, &cfg, &params)
        }
        BenchCmd::Simoop {
            threads,
            burners,
            files,
            file_size,
            read_size,
            write_size,
            alloc_size,
            working_set,
            duration,
            interval,
            dir,
            mm,
            json,
        } => {
            at_least_one("--threads", threads as u64)?;
            for (opt, n) in [
                ("--threads", threads),
                ("--burners", burners),
                ("--files", files),
            ] {
                if n > bench::presets::MAX_TASKS {
                    return Err(Failure::Usage(format!(
                        "{opt}: {n} is above the maximum of {}",
                        bench::presets::MAX_TASKS
                    )));
                }
            }
            at_least_one("--files", files as u64)?;
            at_least_one("--duration", duration)?;
            at_least_one("--interval", interval)?;
            let cfg = mm.config(SwapDefault::FourTimesBudget)?;
            let nz = |opt: &str, v: &str| -> Result<usize, Failure> {
                let n = size(opt, v)? as usize;
                if n < 4096 {
                    return Err(Failure::Usage(format!(
                        "{opt}: {v} is below one 4 KiB page"
                    )));
                }
                Ok(n)
            };
            let params = bench::simoop::Params {
                threads,
                burners,
                files,
                file_size: nz("--file-size", &file_size)? as u64,
                read_size: nz("--read-size", &read_size)?,
                write_size: nz("--write-size", &write_size)?,
                alloc_size: nz("--alloc-size", &alloc_size)?,
                working_set: match working_set {
                    Some(w) => nz("--working-set", &w)?,
                    None => (cfg.budget / 2) as usize,
                },
                duration: std::time::Duration::from_secs(duration),
                interval: std::time::Duration::from_secs(interval),
                dir: dir.unwrap_or_else(|| std::env::temp_dir().join("usermm-simoop")),
                seed: 1,
                json,
            };
            if params.read_size as u64 > params.file_size
                || params.write_size as u64 > params.file_size
            {
                return Err(Failure::Usage(
                    "--read-size and --write-size must not exceed --file-size".into(),
                ));
            }
            let paths = bench::simoop::prepare_files(&params)?;
            let b = std::sync::Arc::new(bench::simoop::UsermmBackend::new(cfg, &paths)?);
            let rep = bench::simoop::run(b, &params)?;
            if json {
                println!("{}", rep.json());
            } else {
                rep.print_text();
            }
            Ok(())
        }
        BenchCmd::MmapFile {
            size: sz,
            pattern,
            threads,
            ops,
            time_limit,
            dir,
            mm,
            engine: eng,
            runs,
            json,
        } => {
            let engines = engine::parse_engines(&eng)?;
            let patterns = bench::mmapfile::Pattern::parse_list(&pattern)
                .map_err(|e| Failure::Usage(format!("--pattern: {e}")))?;
            if threads == 0 || threads > bench::mmapfile::MAX_THREADS {
                return Err(Failure::Usage(format!(
                    "--threads: {threads} is not a usable thread count; give 1 to {}",
                    bench::mmapfile::MAX_THREADS
                )));
            }
            at_least_one("--runs", runs as u64)?;
            at_least_one("--time-limit", time_limit)?;
            let cfg = mm.config(SwapDefault::FourTimesBudget)?;
            let n = match sz {
                Some(s) => size("--size", &s)?,
                None => cfg.budget * 4,
            };
            if n < 4096 || n % 4096 != 0 || usize::try_from(n).is_err() {
                return Err(Failure::Usage(format!(
                    "--size: {n} bytes is not a positive multiple of 4096"
                )));
            }
            // A pass of fewer accesses than the budget holds never reclaims: 65,536 random
            // reads of 2 GiB at 256 MiB fill 241 MiB and measure only cold misses.
            let ops = ops.unwrap_or((n / 4096).min((2 * cfg.budget / 4096).max(65536)));
            if ops == 0 {
                return Err(Failure::Usage("--ops: 0 accesses; give at least 1".into()));
            }
            let p = bench::mmapfile::Params {
                size: n,
                pattern: patterns[0],
                threads,
                ops,
                time_limit: std::time::Duration::from_secs(time_limit),
                dir: dir.unwrap_or_else(std::env::temp_dir),
                seed: 1,
            };
            engine::run_mmap_file(&engines, runs, &cfg, &patterns, &p, json)
        }
        BenchCmd::SwapWSeq { tasks, run } => {
            let cfg = run.mm.config(SwapDefault::Fixed(1 << 30))?;
            let params = bench::presets::swap_w_seq(&cfg, tasks, !run.no_verify)?;
            run_usemem(&run, &cfg, &params)
        }
        BenchCmd::AnonRSeq {
            tasks,
            size: sz,
            run,
        } => {
            // Read faults map the zero page: the address space may exceed budget + swap.
            let cfg = run
                .mm
                .config(SwapDefault::FourTimesBudget)?
                .overcommit(true);
            let total = sz.as_deref().map(|s| size("--size", s)).transpose()?;
            let params = bench::presets::anon_r_seq(&cfg, tasks, total, !run.no_verify)?;
            run_usemem(&run, &cfg, &params)
        }
        BenchCmd::Dd {
            bs,
            count,
            iterations,
            fdatasync,
            dir,
            budget,
            swap,
            swap_size,
            memory,
            set,
            engine: eng,
            runs,
            json,
        } => {
            let engines = engine::parse_engines(&eng)?;
            at_least_one("--runs", runs as u64)?;
            at_least_one("--iterations", iterations as u64)?;
            let bs = size("--bs", &bs)?;
            at_least_one("--bs", bs)?;
            let mm = MmArgs {
                budget,
                swap,
                swap_size,
                swap_sync_replicas: 0,
                overcommit: false,
                swap_encrypt: false,
                swap_keep: false,
                handler_threads: 0,
                set,
                thp: "never".into(),
            };
            let cfg = mm.config(SwapDefault::FourTimesBudget)?;
            let count = count.unwrap_or_else(|| (cfg.budget / 10 / bs).max(1));
            at_least_one("--count", count)?;
            let p = bench::dd::DdParams {
                bs,
                count,
                iterations,
                fdatasync,
                dir: dir.unwrap_or_else(std::env::temp_dir),
                memory,
            };
            engine::run_dd(
                &engines,
                runs,
                &cfg,
                &kernel::Setup::from_config(&cfg),
                &p,
                json,
            )
        }
    }
}

/// Runs a usemem-family workload on the engines `--engine` names.
fn run_usemem(
    run: &RunArgs,
    cfg: &MmConfig,
    params: &bench::usemem::Params,
) -> Result<(), Failure> {
    let engines = engine::parse_engines(&run.engine)?;
    at_least_one("--runs", run.runs as u64)?;
    let setup = kernel::Setup::with_swap(cfg, run.kernel_swap.as_deref())
        .map_err(|e| Failure::Usage(format!("--kernel-swap: {e}")))?;
    engine::run_usemem(&engines, run.runs, cfg, &setup, params, run.json)
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
        Cmd::Compare(a) => compare::run(a),
        Cmd::KernelWorker => kernel::worker::main(),
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
        Err(Failure::Interrupted) => {
            eprintln!("error: interrupted (anything the kernel engine set up was torn down)");
            ExitCode::from(130)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The modules depend one way: the workloads (bench/) and the interrupt flag know nothing of
    /// the engines that run them (engine.rs, kernel/, apps.rs, compare.rs).
    #[test]
    fn workloads_do_not_depend_on_engines() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files: Vec<_> = std::fs::read_dir(src.join("bench"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.push(src.join("interrupt.rs"));
        let mut bad = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for m in ["engine", "kernel", "apps", "compare"] {
                if text.contains(&format!("crate::{m}")) {
                    bad.push(format!("{} uses crate::{m}", f.display()));
                }
            }
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }

    /// `usermm --help` and `usermm bench --help` describe every subcommand (a doc comment left
    /// on the wrong variant once left swap-w-seq without one).
    #[test]
    fn every_subcommand_has_a_description() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for s in c.get_subcommands() {
                let name = format!("{path} {}", s.get_name());
                if s.get_about()
                    .is_none_or(|a| a.to_string().trim().is_empty())
                {
                    missing.push(name.clone());
                }
                walk(s, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "usermm", &mut missing);
        assert!(
            missing.is_empty(),
            "subcommands without a description: {missing:?}"
        );
    }
}
