//! `--engine usermm|kernel|usermm,kernel` and `--runs N`: which memory manager serves a
//! benchmark, and running several engines alternately in one invocation (usermm, kernel,
//! usermm, kernel, ...) with a summary of the ratio of their throughputs and swap-out rates
//! (`bench mmap-file`: medians per pattern).

use serde_json::{json, Value};
use usermm::MmConfig;

use crate::bench::dd::{DdParams, DdReport};
use crate::bench::mmapfile::{self, Pattern};
use crate::bench::usemem::{self, Budget, Params};
use crate::interrupt;
use crate::kernel::{self, worker};
use crate::output::Report;
use crate::report::{mean, median, stddev_pop};
use crate::Failure;

/// Which memory manager runs the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// A usermm manager in this process.
    Usermm,
    /// The kernel's own memory management, in a memory cgroup (see `kernel`).
    Kernel,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Usermm => "usermm",
            Engine::Kernel => "kernel",
        }
    }
}

/// Parses `usermm`, `kernel` or a comma-separated list of both (the order of alternation).
pub fn parse_engines(s: &str) -> Result<Vec<Engine>, Failure> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let e = match part {
            "usermm" => Engine::Usermm,
            "kernel" => Engine::Kernel,
            other => {
                return Err(Failure::Usage(format!(
                    "--engine: unknown engine {other:?}: use usermm, kernel or usermm,kernel"
                )))
            }
        };
        if out.contains(&e) {
            return Err(Failure::Usage(format!(
                "--engine: {part} is listed twice in {s:?}"
            )));
        }
        out.push(e);
    }
    Ok(out)
}

/// Checks what the engines need before anything runs (root for the kernel engine) and installs
/// the signal handlers.
pub fn prepare(engines: &[Engine]) -> Result<(), Failure> {
    if engines.contains(&Engine::Kernel) {
        kernel::require_root()?;
    }
    // Every engine: SIGINT/SIGTERM/SIGHUP stop the workload and report, promptly even when a
    // task is stuck (the interrupt watchdog, which then tears the kernel engine down).
    interrupt::set_last_resort(kernel::emergency_teardown);
    interrupt::catch_signals()
}

/// Runs a usemem workload on the kernel engine and returns its report.
pub fn usemem_kernel(setup: &kernel::Setup, p: &Params) -> Result<Report, Failure> {
    let f = kernel::run_job(setup, worker::Job::Usemem(p.clone()))?;
    match f.result {
        worker::JobResult::Usemem { outcome, peak_rss } => Ok(usemem::report(
            p,
            "kernel",
            outcome,
            Budget {
                budget_bytes: setup.budget,
                swap_bytes: f.swap_bytes,
                swap_device: f.swap_name,
                peak_resident_bytes: f.peak_bytes,
                peak_rss_bytes: peak_rss,
            },
            f.setup,
        )),
        _ => Err(Failure::Run(
            "the kernel worker answered a usemem job with another job's result".into(),
        )),
    }
}

/// `usermm bench usemem|swap-w-seq|anon-r-seq`: every engine `runs` times, alternately.
pub fn run_usemem(
    engines: &[Engine],
    runs: u32,
    cfg: &MmConfig,
    setup: &kernel::Setup,
    p: &Params,
    json_out: bool,
) -> Result<(), Failure> {
    prepare(engines)?;
    let multi = engines.len() > 1 || runs > 1;
    let mut reports: Vec<Report> = Vec::new();
    for run in 1..=runs {
        for &e in engines {
            if interrupt::interrupted() {
                return Err(Failure::Interrupted);
            }
            let r = match e {
                Engine::Usermm => usemem::run_usermm(cfg.clone(), p)?,
                Engine::Kernel => usemem_kernel(setup, p)?,
            };
            if multi && !json_out {
                println!("== run {run}/{runs}: {} ==", e.name());
            }
            if multi && json_out {
                r.print_task_lines(true);
                usemem::verify_result(&r)?;
            } else {
                usemem::print(&r, json_out)?;
            }
            reports.push(r);
        }
    }
    if multi {
        let s = Summary::of(engines, &reports);
        if json_out {
            let runs_json: Vec<Value> = reports.iter().map(Report::to_json).collect();
            let text = serde_json::to_string_pretty(&json!({
                "workload": p.workload,
                "runs": runs_json,
                "summary": s.to_json(),
            }))
            .map_err(Failure::run)?;
            println!("{text}");
        } else {
            print!("{}", s.text());
        }
    }
    Ok(())
}

/// Means and deviations per engine, and usermm's ratio to the kernel.
pub struct Summary {
    rows: Vec<(Engine, Vec<f64>, Vec<f64>)>,
}

impl Summary {
    /// From usemem reports (throughput MiB/s, swap-out MiB/s).
    pub fn of(engines: &[Engine], reports: &[Report]) -> Summary {
        Summary {
            rows: engines
                .iter()
                .map(|&e| {
                    let rs: Vec<&Report> =
                        reports.iter().filter(|r| r.engine == e.name()).collect();
                    (
                        e,
                        rs.iter()
                            .map(|r| r.throughput_kbs() as f64 / 1024.0)
                            .collect(),
                        rs.iter().map(|r| r.swapout_mibs()).collect(),
                    )
                })
                .collect(),
        }
    }

    /// From dd reports (throughput MiB/s; no swap).
    pub fn of_dd(engines: &[Engine], reports: &[DdReport]) -> Summary {
        Summary {
            rows: engines
                .iter()
                .map(|&e| {
                    let rs: Vec<&DdReport> =
                        reports.iter().filter(|r| r.engine == e.name()).collect();
                    (
                        e,
                        rs.iter().map(|r| r.throughput_mibs()).collect(),
                        Vec::new(),
                    )
                })
                .collect(),
        }
    }

    fn get(&self, e: Engine) -> Option<&(Engine, Vec<f64>, Vec<f64>)> {
        self.rows.iter().find(|r| r.0 == e)
    }

    /// usermm/kernel of the mean throughputs and swap-out rates (None without both engines or
    /// with a zero kernel value).
    pub fn ratios(&self) -> (Option<f64>, Option<f64>) {
        let (Some(u), Some(k)) = (self.get(Engine::Usermm), self.get(Engine::Kernel)) else {
            return (None, None);
        };
        let r = |a: &[f64], b: &[f64]| {
            let (x, y) = (mean(a), mean(b));
            (!a.is_empty() && !b.is_empty() && y > 0.0).then(|| x / y)
        };
        (r(&u.1, &k.1), r(&u.2, &k.2))
    }

    pub fn to_json(&self) -> Value {
        let per: serde_json::Map<String, Value> = self
            .rows
            .iter()
            .map(|(e, t, s)| {
                (
                    e.name().to_string(),
                    json!({
                        "runs": t.len(),
                        "throughput_mibs": t,
                        "throughput_mibs_mean": mean(t),
                        "throughput_stddev_pct": pct_sd(t),
                        "swapout_mibs": s,
                        "swapout_mibs_mean": mean(s),
                        "swapout_stddev_pct": pct_sd(s),
                    }),
                )
            })
            .collect();
        let (t, s) = self.ratios();
        json!({
            "engines": per,
            "ratio_usermm_kernel": {"throughput": t, "swapout": s},
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::from("\nsummary (mean ± stddev over runs):\n");
        for (e, t, s) in &self.rows {
            out += &format!(
                "  {:6} {} run(s): throughput {:8.1} MiB/s ± {:4.1}%",
                e.name(),
                t.len(),
                mean(t),
                pct_sd(t)
            );
            if !s.is_empty() {
                out += &format!(", swap-out {:8.1} MiB/s ± {:4.1}%", mean(s), pct_sd(s));
            }
            out += "\n";
        }
        if let (Some(t), s) = self.ratios() {
            out += &format!("  usermm/kernel: throughput {t:.2}x");
            if let Some(s) = s {
                out += &format!(", swap-out {s:.2}x");
            }
            out += "\n";
        }
        out
    }
}

fn pct_sd(v: &[f64]) -> f64 {
    let m = mean(v);
    match stddev_pop(v) {
        Some(s) if m != 0.0 => 100.0 * s / m,
        _ => 0.0,
    }
}

/// The dd loop on a fresh usermm manager (its page cache).
pub fn dd_usermm(
    cfg: usermm::MmConfig,
    p: &DdParams,
) -> Result<crate::bench::dd::DdOutcome, Failure> {
    let mm = usermm::Mm::new(cfg).map_err(Failure::run)?;
    let target = crate::bench::dd::UsermmDir {
        mm: mm.clone(),
        dir: p.dir.clone(),
        memory: p.memory,
    };
    crate::bench::dd::execute(&target, p, &crate::bench::usemem::MmSampler(&mm))
}

/// `usermm bench dd`.
pub fn run_dd(
    engines: &[Engine],
    runs: u32,
    cfg: &usermm::MmConfig,
    setup: &kernel::Setup,
    p: &DdParams,
    json_out: bool,
) -> Result<(), Failure> {
    prepare(engines)?;
    let multi = runs > 1;
    let mut reports = Vec::new();
    for run in 1..=runs {
        for &e in engines {
            if interrupt::interrupted() {
                return Err(Failure::Interrupted);
            }
            let (outcome, setup_info) = if e == Engine::Usermm {
                let r = dd_usermm(cfg.clone(), p)?;
                (r, serde_json::Map::new())
            } else {
                let mut kp = p.clone();
                if kp.memory {
                    kp.dir = std::path::PathBuf::from("/dev/shm");
                }
                let f = kernel::run_job(setup, worker::Job::Dd(kp))?;
                let outcome = match f.result {
                    worker::JobResult::Dd(o) => o,
                    _ => {
                        return Err(Failure::Run(
                            "the kernel worker answered a dd job with another job's result".into(),
                        ))
                    }
                };
                let mut setup_info = f.setup;
                setup_info.insert("peak_bytes".into(), json!(f.peak_bytes));
                (outcome, setup_info)
            };
            let r = DdReport {
                engine: e.name(),
                params: p.clone(),
                budget_bytes: setup.budget,
                outcome,
                setup: setup_info,
            };
            if multi && !json_out {
                println!("== run {run}/{runs}: {} ==", e.name());
            }
            if !(multi && json_out) {
                r.print(json_out)?;
            } else {
                for i in &r.outcome.iterations {
                    eprintln!("{}", i.line());
                }
            }
            reports.push(r);
        }
    }
    if multi {
        let s = Summary::of_dd(engines, &reports);
        if json_out {
            let text = serde_json::to_string_pretty(&json!({
                "workload": "dd",
                "runs": reports.iter().map(DdReport::to_json).collect::<Vec<_>>(),
                "summary": s.to_json(),
            }))
            .map_err(Failure::run)?;
            println!("{text}");
        } else {
            print!("{}", s.text());
        }
    }
    Ok(())
}

/// One kernel-engine run of mmap-file: the worker's passes and the cgroup's peak.
fn mmap_file_kernel(
    setup: &kernel::Setup,
    p: &mmapfile::Params,
) -> Result<mmapfile::Report, Failure> {
    let f = kernel::run_job(setup, worker::Job::MmapFile(p.clone()))?;
    let worker::JobResult::MmapFile(passes) = f.result else {
        return Err(Failure::Run(
            "the kernel worker answered an mmap-file job with another job's result".into(),
        ));
    };
    if passes.is_empty() {
        return Err(Failure::Run(
            "the kernel worker ran no mmap-file pass".into(),
        ));
    }
    Ok(mmapfile::Report {
        engine: "kernel",
        params: p.clone(),
        budget_bytes: setup.budget,
        peak_resident_bytes: f.peak_bytes,
        passes,
        setup: f.setup,
    })
}

/// `usermm bench mmap-file`: for each pattern, `runs` runs of every engine alternately, then
/// the medians per pattern and engine with usermm's ratio to the kernel.
pub fn run_mmap_file(
    engines: &[Engine],
    runs: u32,
    cfg: &MmConfig,
    patterns: &[Pattern],
    base: &mmapfile::Params,
    json_out: bool,
) -> Result<(), Failure> {
    prepare(engines)?;
    let setup = kernel::Setup::from_config(cfg);
    let mut reports: Vec<mmapfile::Report> = Vec::new();
    for &pattern in patterns {
        let p = mmapfile::Params {
            pattern,
            ..base.clone()
        };
        for run in 1..=runs {
            for &e in engines {
                if interrupt::interrupted() {
                    return Err(Failure::Interrupted);
                }
                let r = match e {
                    Engine::Usermm => mmapfile::run_usermm(cfg.clone(), &p)?,
                    Engine::Kernel => mmap_file_kernel(&setup, &p)?,
                };
                let head = format!("== {} run {run}/{runs}: {} ==", pattern.name(), e.name());
                if json_out {
                    eprintln!("{head}");
                    eprint!("{}", r.text());
                } else {
                    println!("{head}");
                    print!("{}", r.text());
                }
                reports.push(r);
            }
        }
    }
    let summary = MmapSummary::of(engines, patterns, &reports);
    if json_out {
        let text = serde_json::to_string_pretty(&json!({
            "workload": "mmap-file",
            "runs": reports.iter().map(mmapfile::Report::to_json).collect::<Vec<_>>(),
            "summary": summary.to_json(),
        }))
        .map_err(Failure::run)?;
        println!("{text}");
    } else {
        print!("{}", summary.text());
    }
    Ok(())
}

/// Medians of mmap-file runs per pattern and engine.
pub struct MmapSummary {
    /// (pattern, engine, rates, peak resident bytes of each run)
    rows: Vec<(Pattern, Engine, Vec<f64>, Vec<u64>)>,
    budget: u64,
}

impl MmapSummary {
    pub fn of(engines: &[Engine], patterns: &[Pattern], reports: &[mmapfile::Report]) -> Self {
        let mut rows = Vec::new();
        for &pat in patterns {
            for &e in engines {
                let rs: Vec<&mmapfile::Report> = reports
                    .iter()
                    .filter(|r| r.engine == e.name() && r.params.pattern == pat)
                    .collect();
                rows.push((
                    pat,
                    e,
                    rs.iter().map(|r| r.rate()).collect(),
                    rs.iter().map(|r| r.peak_resident_bytes).collect(),
                ));
            }
        }
        MmapSummary {
            rows,
            budget: reports.first().map_or(0, |r| r.budget_bytes),
        }
    }

    fn median_of(&self, pat: Pattern, e: Engine) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.0 == pat && r.1 == e && !r.2.is_empty())
            .map(|r| median(r.2.clone()))
    }

    /// usermm's median over the kernel's (None without both or with a zero kernel median).
    pub fn ratio(&self, pat: Pattern) -> Option<f64> {
        let (u, k) = (
            self.median_of(pat, Engine::Usermm)?,
            self.median_of(pat, Engine::Kernel)?,
        );
        (k > 0.0).then(|| u / k)
    }

    fn patterns(&self) -> Vec<Pattern> {
        let mut v: Vec<Pattern> = Vec::new();
        for r in &self.rows {
            if !v.contains(&r.0) {
                v.push(r.0);
            }
        }
        v
    }

    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        for pat in self.patterns() {
            let mut per = serde_json::Map::new();
            for (_, e, rates, peaks) in self.rows.iter().filter(|r| r.0 == pat) {
                per.insert(
                    e.name().into(),
                    json!({
                        "runs": rates.len(),
                        "rates": rates,
                        "median": median(rates.clone()),
                        "peak_resident_bytes_max": peaks.iter().max(),
                    }),
                );
            }
            out.insert(
                pat.name().into(),
                json!({
                    "unit": pat.unit(),
                    "engines": per,
                    "ratio_usermm_kernel": self.ratio(pat),
                }),
            );
        }
        json!({ "budget_bytes": self.budget, "patterns": out })
    }

    pub fn text(&self) -> String {
        let mut out = String::from(
            "\nsummary (median over runs [min-max]; peak resident = highest of the runs):\n",
        );
        for pat in self.patterns() {
            for (_, e, rates, peaks) in self.rows.iter().filter(|r| r.0 == pat) {
                let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = rates.iter().copied().fold(0.0, f64::max);
                let peak = peaks.iter().copied().max().unwrap_or(0);
                out += &format!(
                    "  {:9} {:6} {} run(s): {:8.0} {} [{:.0}-{:.0}], peak resident {}{}\n",
                    pat.name(),
                    e.name(),
                    rates.len(),
                    median(rates.clone()),
                    pat.unit(),
                    lo,
                    hi,
                    crate::output::mib(peak),
                    if peak > self.budget {
                        " (ABOVE the budget)"
                    } else {
                        ""
                    },
                );
            }
            if let Some(r) = self.ratio(pat) {
                out += &format!("  {:9} usermm/kernel {r:.2}x\n", pat.name());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_lists() {
        assert_eq!(parse_engines("usermm").unwrap(), vec![Engine::Usermm]);
        assert_eq!(
            parse_engines("kernel, usermm").unwrap(),
            vec![Engine::Kernel, Engine::Usermm]
        );
        let e = match parse_engines("usermm,usermm") {
            Err(Failure::Usage(m)) => m,
            _ => panic!(),
        };
        assert!(e.contains("twice"), "{e}");
        let e = match parse_engines("linux") {
            Err(Failure::Usage(m)) => m,
            _ => panic!(),
        };
        assert!(e.contains("linux") && e.contains("usermm,kernel"), "{e}");
    }

    #[test]
    fn summary_ratios() {
        let s = Summary {
            rows: vec![
                (Engine::Usermm, vec![1000.0, 1100.0], vec![900.0, 1000.0]),
                (Engine::Kernel, vec![400.0, 440.0], vec![380.0, 380.0]),
            ],
        };
        let (t, w) = s.ratios();
        assert!((t.unwrap() - 2.5).abs() < 1e-9);
        assert!((w.unwrap() - 2.5).abs() < 1e-9);
        let text = s.text();
        assert!(
            text.contains("usermm/kernel: throughput 2.50x, swap-out 2.50x"),
            "{text}"
        );
        let only = Summary {
            rows: vec![(Engine::Usermm, vec![1.0], vec![1.0])],
        };
        assert_eq!(only.ratios(), (None, None));
    }
}
