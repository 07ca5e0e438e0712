//! `usermm compare --workload W --switch NAME`: the A/B comparison of one seed switch. Runs the
//! workload alternately with the switch old and new (old, new, old, new, ...; each run a fresh
//! manager whose `MmConfig::settings` has that switch set), collects per-run metrics
//! (throughput, swap-out rate, elapsed time, every vmstat counter, per-call-site lock waits),
//! and prints the LKP table of seed 000 or, with `--format mmtests`, the compare-kernels table
//! of seed 004 (see `report`); `--json` for either, `--plot FILE.svg` for the per-run chart.

use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};
use usermm::{Behaviour, MmConfig, Settings, Switch};

use crate::bench::presets;
use crate::bench::usemem::{self, Params};
use crate::output::Report;
use crate::report::{self, Kind, Metric, Side, LOCK_WAIT_PREFIX};
use crate::{Failure, MmArgs, SwapDefault};

#[derive(Args, Clone)]
pub struct CompareArgs {
    /// Workload: usemem (needs --size), swap-w-seq, anon-r-seq, dd, simoop.
    #[arg(long)]
    workload: String,
    /// The seed switch to compare, old against new (`usermm info` lists them).
    #[arg(long)]
    switch: String,
    /// Runs per side (alternating old, new).
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Table layout: lkp (seed 000's) or mmtests (seed 004's).
    #[arg(long, default_value = "lkp")]
    format: String,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the per-run values (and latency percentiles) into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Counter rows are shown when their means differ by more than this many percent.
    #[arg(long, default_value_t = 2.0)]
    threshold: f64,
    /// Settings for both sides, name=value (repeatable), on top of USERMM_SET, e.g.
    /// laptop_mode=on.
    #[arg(long = "set")]
    set: Vec<String>,
    /// usemem: bytes per task (required); anon-r-seq: total bytes [default: 256 x budget].
    #[arg(long)]
    size: Option<String>,
    /// Tasks.
    #[arg(short = 'n', long = "tasks", default_value_t = 1)]
    tasks: usize,
    /// usemem: only read.
    #[arg(short = 'o', long)]
    readonly: bool,
    /// usemem: touch one word every STEP bytes.
    #[arg(short = 'j', long = "step", default_value = "8")]
    step: String,
    /// usemem: random access order.
    #[arg(short = 'R', long)]
    random: bool,
    /// usemem: passes over the area.
    #[arg(short = 'r', long, default_value_t = 1)]
    repeat: u32,
    /// Skip the verification of written words.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// dd: block size.
    #[arg(long, default_value = "1M")]
    bs: String,
    /// dd: blocks per file [default: a tenth of the budget].
    #[arg(long)]
    count: Option<u64>,
    /// dd: files written (and deleted) per run.
    #[arg(long, default_value_t = 5)]
    iterations: u32,
    /// dd: fdatasync before each iteration's clock stops.
    #[arg(long)]
    fdatasync: bool,
    /// dd: in-memory files (the tmpfs case).
    #[arg(long)]
    memory: bool,
    /// dd, simoop: directory of the files [default: $TMPDIR].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// simoop: worker threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// simoop: seconds per run.
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// simoop: files, each of --file-size.
    #[arg(long, default_value_t = 8)]
    files: usize,
    /// simoop: size of each file.
    #[arg(long = "file-size", default_value = "128M")]
    file_size: String,
    #[command(flatten)]
    mm: MmArgs,
}

/// The table layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Lkp,
    Mmtests,
}

fn parse_format(s: &str) -> Result<Format, Failure> {
    match s {
        "lkp" => Ok(Format::Lkp),
        "mmtests" => Ok(Format::Mmtests),
        other => Err(Failure::Usage(format!(
            "--format: unknown layout {other:?}: use lkp or mmtests"
        ))),
    }
}

/// The metrics of one usemem-style run, with LKP's names: `vm-scalability.throughput` (KB/s,
/// the sum of usemem's per-task lines), `vmstat.swap.so` (KiB/s swapped out, vmstat's `so`),
/// `vm-scalability.time.elapsed_time` (s), `proc-vmstat.<counter>` for every event counter,
/// and the lock wait counters under their own names.
pub fn usemem_metrics(r: &Report) -> Vec<Metric> {
    let mut v = vec![
        Metric::new(
            "vm-scalability.throughput",
            Kind::Throughput,
            r.throughput_kbs() as f64,
        ),
        Metric::new(
            "vmstat.swap.so",
            Kind::Throughput,
            r.swapout_mibs() * 1024.0,
        ),
        Metric::new("vm-scalability.time.elapsed_time", Kind::Time, r.elapsed_s),
    ];
    push_counters(&mut v, r.vmstat.iter());
    v
}

/// A workload compare can run.
enum Work {
    Usemem(Params),
    Dd(crate::bench::dd::DdParams),
    Simoop(crate::bench::simoop::Params, Vec<PathBuf>),
}

impl Work {
    fn describe(&self) -> String {
        match self {
            Work::Usemem(p) => format!(
                "{} {} x {} task(s)",
                p.workload,
                crate::output::mib(p.bytes_per_task),
                p.tasks
            ),
            Work::Dd(p) => format!(
                "dd {} x {}{}{}",
                p.iterations,
                crate::output::mib(p.file_bytes()),
                if p.fdatasync { ", fdatasync" } else { "" },
                if p.memory { ", in memory" } else { "" }
            ),
            Work::Simoop(p, _) => format!(
                "simoop {} threads, {} files of {}, {} s",
                p.threads,
                p.files,
                crate::output::mib(p.file_size),
                p.duration.as_secs()
            ),
        }
    }

    /// One run on a manager built from `c`: its metrics and a one-line summary.
    fn run(&self, c: MmConfig) -> Result<(Vec<Metric>, String), Failure> {
        match self {
            Work::Usemem(params) => {
                let r = usemem::run_usermm(c, params)?;
                usemem::verify_result(&r)?;
                let line = format!(
                    "{:.1} MiB/s, swap-out {:.1} MiB/s, {:.2} s",
                    r.throughput_kbs() as f64 / 1024.0,
                    r.swapout_mibs(),
                    r.elapsed_s
                );
                Ok((usemem_metrics(&r), line))
            }
            Work::Dd(p) => {
                let o = crate::engine::dd_usermm(c, p)?;
                let secs: Vec<f64> = o.iterations.iter().map(|i| i.secs).collect();
                let total: f64 = secs.iter().sum();
                let bytes: u64 = o.iterations.iter().map(|i| i.bytes).sum();
                let max = secs.iter().copied().fold(0.0, f64::max);
                let mibs = bytes as f64 / (1 << 20) as f64 / total.max(1e-9);
                let mut v = vec![
                    Metric::new("dd.throughput_mibs", Kind::Throughput, mibs),
                    Metric::new("elapsed", Kind::Time, total),
                    Metric::new("Max-elapsed", Kind::Time, max),
                ];
                push_counters(&mut v, o.vmstat.iter());
                Ok((v, format!("{mibs:.0} MiB/s, max iteration {max:.3} s")))
            }
            Work::Simoop(p, paths) => {
                let b = std::sync::Arc::new(crate::bench::simoop::UsermmBackend::new(c, paths)?);
                let rep = crate::bench::simoop::run(b, p)?;
                let mut v = Vec::new();
                for (series, l) in [
                    ("Read", &rep.total.read),
                    ("Write", &rep.total.write),
                    ("Allocation", &rep.total.alloc),
                ] {
                    for (rank, val) in [(50.0, l.p50), (95.0, l.p95), (99.0, l.p99)] {
                        let mut m =
                            Metric::new(format!("p{rank}-{series}"), Kind::Time, val as f64);
                        m.percentile = Some(report::Percentile {
                            series: series.into(),
                            label: format!("p{rank}"),
                            rank,
                        });
                        v.push(m);
                    }
                }
                v.push(Metric::new(
                    "work-rate",
                    Kind::Throughput,
                    rep.total.work_rate,
                ));
                v.push(Metric::new(
                    "alloc-stall-rate",
                    Kind::Time,
                    rep.total.alloc_stall_rate,
                ));
                push_counters(&mut v, rep.vmstat.iter().map(|(n, x)| (n.as_str(), *x)));
                let line = format!(
                    "write p95 {} us, alloc p95 {} us, {:.1} loops/s",
                    rep.total.write.p95, rep.total.alloc.p95, rep.total.work_rate
                );
                Ok((v, line))
            }
        }
    }
}

/// Event counters as `proc-vmstat.<name>` rows, lock waits under their own names.
fn push_counters<'a>(v: &mut Vec<Metric>, it: impl Iterator<Item = (&'a str, u64)>) {
    for (k, val) in it {
        if k.starts_with(LOCK_WAIT_PREFIX) {
            v.push(Metric::new(k, Kind::Time, val as f64));
        } else if !crate::counters::vmstat_is_state(k) {
            v.push(Metric::new(
                format!("proc-vmstat.{k}"),
                Kind::Counter,
                val as f64,
            ));
        }
    }
}

/// The workload's parameters and configuration (swap-size default per preset).
fn workload(a: &CompareArgs) -> Result<(Work, MmConfig), Failure> {
    let verify = !a.no_verify;
    let (p, cfg) = match a.workload.as_str() {
        "dd" => {
            let cfg = a.mm.config(SwapDefault::FourTimesBudget)?;
            let bs = crate::size("--bs", &a.bs)?.max(1);
            let count = a.count.unwrap_or((cfg.budget / 10 / bs).max(1)).max(1);
            let p = crate::bench::dd::DdParams {
                bs,
                count,
                iterations: a.iterations.max(1),
                fdatasync: a.fdatasync,
                dir: a.dir.clone().unwrap_or_else(std::env::temp_dir),
                memory: a.memory,
            };
            return Ok((Work::Dd(p), cfg));
        }
        "simoop" => {
            let cfg = a.mm.config(SwapDefault::FourTimesBudget)?;
            let p = crate::bench::simoop::Params {
                threads: a.threads.max(1),
                burners: 1,
                files: a.files.max(1),
                file_size: crate::size("--file-size", &a.file_size)?.max(4 << 20),
                read_size: 2 << 20,
                write_size: 1 << 20,
                alloc_size: 8 << 20,
                working_set: (cfg.budget / 2) as usize,
                duration: std::time::Duration::from_secs(a.duration.max(1)),
                interval: std::time::Duration::from_secs(a.duration.max(1)),
                dir: a
                    .dir
                    .clone()
                    .unwrap_or_else(|| std::env::temp_dir().join("usermm-simoop")),
                seed: 1,
                json: true,
            };
            let paths = crate::bench::simoop::prepare_files(&p)?;
            return Ok((Work::Simoop(p, paths), cfg));
        }
        _ => usemem_workload(a, verify)?,
    };
    Ok((Work::Usemem(p), cfg))
}

fn usemem_workload(a: &CompareArgs, verify: bool) -> Result<(Params, MmConfig), Failure> {
    match a.workload.as_str() {
        "usemem" => {
            let size_arg = a.size.as_deref().ok_or_else(|| {
                Failure::Usage("--size: usemem needs the bytes per task, e.g. --size 64M".into())
            })?;
            let bytes = crate::size("--size", size_arg)?;
            let step = crate::size("--step", &a.step)?;
            let p = presets::usemem(
                size_arg, bytes, a.tasks, a.readonly, step, a.random, a.repeat, verify,
            )?;
            Ok((p, a.mm.config(SwapDefault::FourTimesBudget)?))
        }
        "swap-w-seq" => {
            let cfg = a.mm.config(SwapDefault::Fixed(1 << 30))?;
            Ok((presets::swap_w_seq(&cfg, a.tasks, verify)?, cfg))
        }
        "anon-r-seq" => {
            let cfg = a.mm.config(SwapDefault::FourTimesBudget)?.overcommit(true);
            let total = a
                .size
                .as_deref()
                .map(|s| crate::size("--size", s))
                .transpose()?;
            Ok((presets::anon_r_seq(&cfg, a.tasks, total, verify)?, cfg))
        }
        other => Err(Failure::Usage(format!(
            "--workload: unknown workload {other:?}: use usemem, swap-w-seq, anon-r-seq, dd or simoop"
        ))),
    }
}

/// `usermm compare`.
pub fn run(a: CompareArgs) -> Result<(), Failure> {
    let format = parse_format(&a.format)?;
    if a.runs == 0 {
        return Err(Failure::Usage("--runs: must be at least 1".into()));
    }
    let switch =
        Switch::from_name(&a.switch).map_err(|e| Failure::Usage(format!("--switch: {e}")))?;
    let info = switch.info();
    let mut base = Settings::from_env().map_err(|e| Failure::Usage(e.to_string()))?;
    for s in &a.set {
        base.apply(s)
            .map_err(|e| Failure::Usage(format!("--set: {e}")))?;
    }
    let (work, cfg) = workload(&a)?;
    // Column titles in mmtests' two-line form (split at the first '-'): old-on / new-off.
    let label = |b: Behaviour| match b {
        Behaviour::Old => format!("old-{}", info.old),
        Behaviour::New => format!("new-{}", info.new),
    };
    let mut sides = [
        Side {
            label: label(Behaviour::Old),
            runs: Vec::new(),
        },
        Side {
            label: label(Behaviour::New),
            runs: Vec::new(),
        },
    ];
    for run in 1..=a.runs {
        for (i, b) in [Behaviour::Old, Behaviour::New].into_iter().enumerate() {
            let c = cfg.clone().settings(base.with(switch, b));
            let (metrics, line) = work.run(c)?;
            eprintln!("run {run}/{} {}: {line}", a.runs, sides[i].label);
            sides[i].runs.push(metrics);
        }
    }
    let [old, new] = &sides;
    let rows = report::rows(old, new, a.threshold);
    let table = match format {
        Format::Lkp => report::format_lkp(&old.label, &new.label, &rows),
        Format::Mmtests => report::format_mmtests(&old.label, &new.label, &rows),
    };
    let title = format!(
        "{} (seed {}): {} old={} vs new={}, {} run(s) each; budget {}, swap {}, settings {}",
        info.name,
        info.seed,
        work.describe(),
        info.old,
        info.new,
        a.runs,
        crate::output::mib(cfg.budget),
        a.mm.swap,
        base
    );
    if let Some(path) = &a.plot {
        let svg = crate::plot::svg(&title, old, new, &rows);
        std::fs::write(path, svg)
            .map_err(|e| Failure::Run(format!("--plot: cannot write {}: {e}", path.display())))?;
    }
    if a.json {
        let mut v = report::to_json(old, new, a.threshold);
        if let Value::Object(m) = &mut v {
            m.insert("workload".into(), json!(a.workload));
            m.insert("switch".into(), json!(info.name));
            m.insert("seed".into(), json!(info.seed));
            m.insert("old".into(), json!(info.old));
            m.insert("new".into(), json!(info.new));
            m.insert("runs".into(), json!(a.runs));
            m.insert("settings".into(), json!(base.to_string()));
            m.insert("format".into(), json!(a.format));
            m.insert("table".into(), json!(table));
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(Failure::run)?
        );
    } else {
        println!("{title}\n");
        print!("{table}");
    }
    Ok(())
}
