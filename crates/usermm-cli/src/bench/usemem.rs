//! `usermm bench usemem` and `usermm bench swap-w-seq`: vm-scalability's usemem on a usermm
//! manager.
//!
//! Semantics follow usemem.c (`do_unit` / `do_rw_once` / `do_access`):
//! - each task is a thread with its own region of `bytes_per_task`, all mapped from ONE `Mm`;
//! - a pass visits `ceil(words / (step / 8))` words: word `i * step/8` in order, or as many
//!   random words (uniform over `[0, words - 1)`, as usemem's `os_random_long(m - 1)`);
//! - a write stores the word's index (`p[idx] = idx`); `--readonly` only loads;
//! - from the second pass on, a sequential write first checks the word still holds its index
//!   ("verify last write");
//! - a task counts `size / 8` bytes for the allocation plus 8 per access, and prints
//!   `N bytes / M usecs = K KB/s` with `K = ((N * 1000000) >> 10) / M`; the run's throughput is
//!   the sum over tasks, as LKP sums usemem's lines.
//!
//! Beyond usemem, after a write run every touched word is read back (random runs replay the
//! generator), and a read-only run checks that every word read was zero; the first wrong word
//! fails the run with its offset, address, expected and found values. `--no-verify` skips both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use usermm::{Mm, MmConfig, Region};

use super::XorShift;
use crate::output::{self, Report, TaskLine, Verify};
use crate::Failure;

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    /// Name in the report: "usemem" or "swap-w-seq".
    pub workload: &'static str,
    pub tasks: usize,
    /// Region size of each task (a multiple of 8, at least 8).
    pub bytes_per_task: u64,
    pub readonly: bool,
    /// Bytes between touched words (at least 8).
    pub step: u64,
    pub random: bool,
    /// Passes (at least 1).
    pub repeat: u32,
    pub verify: bool,
    pub json: bool,
}

/// Accesses between updates of the shared progress counter.
const PROGRESS_BATCH: u64 = 1 << 14;

/// The first wrong word a task found.
#[derive(Debug, Clone)]
struct Mismatch {
    task: usize,
    offset: u64,
    address: usize,
    expected: u64,
    found: u64,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "task {}: data wrong at offset {:#x} (address {:#x}): expected {:#x}, found {:#x}",
            self.task, self.offset, self.address, self.expected, self.found
        )
    }
}

/// One task: its region and how it walks it.
struct Task<'a> {
    id: usize,
    region: &'a Region,
    words: u64,
    /// Words between touched words.
    stride: u64,
    p: &'a Params,
}

impl Task<'_> {
    /// The task's generator; the read-back replays it from the same seed.
    fn rng(&self) -> XorShift {
        XorShift::new(
            0x2545_F491_4F6C_DD1D ^ (self.id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )
    }

    fn accesses_per_pass(&self) -> u64 {
        self.words.div_ceil(self.stride)
    }

    /// Progress bytes one access stands for (the stretch of the region it covers).
    fn unit(&self) -> u64 {
        self.stride * 8
    }

    /// usemem: `idx = os_random_long(m - 1)`, i.e. uniform in `[0, m - 1)` (0 for one word).
    fn random_index(&self, rng: &mut XorShift) -> u64 {
        rng.below(self.words - 1)
    }

    fn mismatch(&self, idx: u64, expected: u64, found: u64) -> Mismatch {
        Mismatch {
            task: self.id,
            offset: idx * 8,
            address: self.region.as_ptr() as usize + (idx * 8) as usize,
            expected,
            found,
        }
    }

    /// One pass of usemem's `do_rw_once`. Returns the bytes it counts (8 per access) and the
    /// first wrong word, which ends the pass.
    fn pass(&self, rng: &mut XorShift, rep: u32, progress: &AtomicU64) -> (u64, Option<Mismatch>) {
        let p = self.p;
        let r = self.region;
        // usemem: `if (rep && !read && !opt_randomise && p[idx] != idx)` -> "Data wrong".
        let check_last = rep > 0 && !p.readonly && !p.random && p.verify;
        let check_zero = p.readonly && p.verify;
        let mut rw = 0u64;
        let mut pending = 0u64;
        let mut i = 0u64;
        let mut bad = None;
        while i < self.words {
            let idx = if p.random { self.random_index(rng) } else { i };
            let off = (idx * 8) as usize;
            if p.readonly {
                let v = r.read_u64(off);
                if check_zero && v != 0 {
                    bad = Some(self.mismatch(idx, 0, v));
                    break;
                }
            } else {
                if check_last {
                    let v = r.read_u64(off);
                    if v != idx {
                        bad = Some(self.mismatch(idx, idx, v));
                        break;
                    }
                }
                r.write_u64(off, idx);
            }
            rw += 8;
            i += self.stride;
            pending += 1;
            if pending == PROGRESS_BATCH {
                progress.fetch_add(pending * self.unit(), Ordering::Relaxed);
                pending = 0;
            }
        }
        progress.fetch_add(pending * self.unit(), Ordering::Relaxed);
        (rw, bad)
    }

    /// Reads back every word the write passes touched: each holds its index.
    fn read_back(&self, progress: &AtomicU64) -> Result<(), Mismatch> {
        let r = self.region;
        let mut pending = 0u64;
        let mut check = |idx: u64| {
            let v = r.read_u64((idx * 8) as usize);
            pending += 1;
            if pending == PROGRESS_BATCH {
                progress.fetch_add(pending * self.unit(), Ordering::Relaxed);
                pending = 0;
            }
            if v == idx {
                Ok(())
            } else {
                Err(self.mismatch(idx, idx, v))
            }
        };
        if self.p.random {
            // Replay the generator: the same words in the same order, over all passes.
            let mut rng = self.rng();
            for _ in 0..self.p.repeat {
                for _ in 0..self.accesses_per_pass() {
                    check(self.random_index(&mut rng))?;
                }
            }
        } else {
            let mut i = 0;
            while i < self.words {
                check(i)?;
                i += self.stride;
            }
        }
        Ok(())
    }
}

/// What a task thread returns from the workload.
struct Done {
    line: TaskLine,
    end: Instant,
    bad: Option<Mismatch>,
}

/// A start line: task threads wait at it so that they begin together (usemem's `ready` pipes).
#[derive(Default)]
struct Gate {
    state: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Gate {
    /// Waits until the gate opens; true to go, false to give up.
    fn wait(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(go) = *g {
                return go;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn open(&self, go: bool) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(go);
        self.cv.notify_all();
    }
}

/// Runs `f` for every task on its own thread, behind `gate`; shows a progress bar of `total`
/// bytes while they run. `started` runs on this thread once all threads exist and the gate is
/// open. Returns the results in task order.
fn on_tasks<R: Send>(
    tasks: &[Task<'_>],
    msg: &'static str,
    total: u64,
    started: impl FnOnce(),
    f: impl Fn(&Task<'_>, &AtomicU64) -> R + Sync,
) -> Result<Vec<R>, Failure> {
    let progress = AtomicU64::new(0);
    let gate = Gate::default();
    let bar = output::progress(msg, total);
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(tasks.len());
        for t in tasks {
            let (f, gate, progress) = (&f, &gate, &progress);
            let spawned = std::thread::Builder::new()
                .name(format!("usemem-{}", t.id))
                .spawn_scoped(s, move || gate.wait().then(|| f(t, progress)));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    gate.open(false);
                    return Err(Failure::Run(format!(
                        "cannot start thread for task {} of {}: {e}; use fewer tasks",
                        t.id,
                        tasks.len()
                    )));
                }
            }
        }
        gate.open(true);
        started();
        if let Some(b) = &bar {
            while handles.iter().any(|h| !h.is_finished()) {
                b.set_position(progress.load(Ordering::Relaxed).min(total));
                std::thread::sleep(Duration::from_millis(50));
            }
            b.finish_and_clear();
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| match h.join() {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err(Failure::Run(format!("task {i} did not start"))),
                Err(_) => Err(Failure::Run(format!("task {i} panicked"))),
            })
            .collect()
    })
}

/// Runs the workload on a fresh manager built from `cfg` and prints the report. A failed
/// verification is a run error, reported after the summary.
pub fn run(cfg: MmConfig, p: &Params) -> Result<(), Failure> {
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    let len = usize::try_from(p.bytes_per_task).map_err(|_| {
        Failure::Usage(format!(
            "SIZE: {} bytes do not fit the address space",
            p.bytes_per_task
        ))
    })?;
    let regions: Vec<Region> = (0..p.tasks)
        .map(|_| mm.map_anon(len))
        .collect::<Result<_, _>>()
        .map_err(Failure::run)?;
    let words = p.bytes_per_task / 8;
    let tasks: Vec<Task<'_>> = regions
        .iter()
        .enumerate()
        .map(|(id, region)| Task {
            id,
            region,
            words,
            stride: p.step / 8,
            p,
        })
        .collect();
    let per_task_work = tasks[0].accesses_per_pass() * tasks[0].unit() * p.repeat as u64;
    let total_work = per_task_work.saturating_mul(p.tasks as u64);

    // The workload.
    let mut start = Instant::now();
    let done = on_tasks(
        &tasks,
        p.workload,
        total_work,
        || start = Instant::now(),
        |t, progress| {
            let t0 = Instant::now();
            let mut rng = t.rng();
            // usemem: `rw_bytes = bytes / 8` for the allocation, then 8 per access.
            let mut bytes = p.bytes_per_task / 8;
            let mut bad = None;
            for rep in 0..p.repeat {
                let (rw, b) = t.pass(&mut rng, rep, progress);
                bytes += rw;
                if b.is_some() {
                    bad = b;
                    break;
                }
            }
            let end = Instant::now();
            Done {
                line: TaskLine {
                    bytes,
                    usecs: (end - t0).as_micros().max(1) as u64,
                },
                end,
                bad,
            }
        },
    )?;
    let elapsed = done
        .iter()
        .map(|d| d.end.saturating_duration_since(start))
        .max()
        .unwrap_or_default();
    let vmstat = mm.vmstat();
    let first_bad = done
        .iter()
        .find_map(|d| d.bad.as_ref())
        .map(|m| m.to_string());

    // Verification.
    let verify = if !p.verify {
        Verify::Skipped
    } else if p.readonly {
        Verify::Reads(first_bad.map_or(Ok(()), Err))
    } else if let Some(e) = first_bad {
        Verify::ReadBack {
            result: Err(e),
            seconds: 0.0,
            vmstat: mm.vmstat().delta(&vmstat),
        }
    } else {
        let before = mm.vmstat();
        let t0 = Instant::now();
        let results = on_tasks(
            &tasks,
            "verify",
            total_work,
            || {},
            |t, progress| t.read_back(progress),
        )?;
        let seconds = t0.elapsed().as_secs_f64();
        Verify::ReadBack {
            result: results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), |m| Err(m.to_string())),
            seconds,
            vmstat: mm.vmstat().delta(&before),
        }
    };

    let report = Report {
        workload: p.workload,
        tasks: p.tasks,
        bytes_per_task: p.bytes_per_task,
        readonly: p.readonly,
        step: p.step,
        random: p.random,
        repeat: p.repeat,
        budget_bytes: mm.budget(),
        swap_bytes: mm.swap_bytes(),
        swap_device: mm.swap_name(),
        per_task: done.iter().map(|d| d.line).collect(),
        elapsed_s: elapsed.as_secs_f64(),
        verify,
        peak_resident_bytes: mm.peak_resident_bytes(),
        peak_rss_bytes: output::peak_rss_bytes(),
        vmstat,
    };
    drop(tasks);
    drop(regions);
    report.print_task_lines(p.json);
    if p.json {
        let text = serde_json::to_string_pretty(&report.to_json()).map_err(Failure::run)?;
        println!("{text}");
    } else {
        report.print_text();
    }
    match report.verify.error() {
        Some(e) => Err(Failure::Run(format!("verification failed: {e}"))),
        None => Ok(()),
    }
}
