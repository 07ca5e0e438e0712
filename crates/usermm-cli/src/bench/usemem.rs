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
//!
//! The access loop works over any [`Memory`]: a usermm [`Region`] (`--engine usermm`, here) or
//! a plain kernel anonymous mapping (`--engine kernel`, run by `kernel::worker` inside a memory
//! cgroup), so both engines run exactly the same code.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Map;
use usermm::{Mm, MmConfig, Region};
use usermm_sys::Mapping;

use super::XorShift;
use crate::counters::{vmstat_is_state, Counters};
use crate::output::{self, Report, TaskLine, Verify};
use crate::Failure;

/// Memory the access loop can walk: word loads and stores at byte offsets, never references
/// (the memory changes under reclaim and faults).
pub trait Memory: Sync {
    /// Start address (for error messages).
    fn addr(&self) -> usize;
    /// Volatile 64-bit load at `off` (8-byte aligned, in bounds).
    fn read_u64(&self, off: usize) -> u64;
    /// Volatile 64-bit store at `off` (8-byte aligned, in bounds).
    fn write_u64(&self, off: usize, v: u64);
}

impl Memory for Region {
    fn addr(&self) -> usize {
        self.as_ptr() as usize
    }
    fn read_u64(&self, off: usize) -> u64 {
        Region::read_u64(self, off)
    }
    fn write_u64(&self, off: usize, v: u64) {
        Region::write_u64(self, off, v)
    }
}

/// A plain private anonymous mapping: the kernel's own memory management serves it.
impl Memory for Mapping {
    fn addr(&self) -> usize {
        Mapping::addr(self)
    }
    fn read_u64(&self, off: usize) -> u64 {
        Mapping::read_u64(self, off)
    }
    fn write_u64(&self, off: usize, v: u64) {
        Mapping::write_u64(self, off, v)
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    /// Name in the report: "usemem", "swap-w-seq" or "anon-r-seq".
    pub workload: String,
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
}

/// Accesses between updates of the shared progress counter.
const PROGRESS_BATCH: u64 = 1 << 14;
/// Accesses between two looks at the interruption flag: a random access under heavy swap costs
/// up to ~100 us, so a batch of PROGRESS_BATCH would make Ctrl-C wait for seconds.
const INTERRUPT_POLL: u64 = 64;

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

/// One task: its memory and how it walks it.
struct Task<'a, M> {
    id: usize,
    region: &'a M,
    words: u64,
    /// Words between touched words.
    stride: u64,
    p: &'a Params,
}

impl<M: Memory> Task<'_, M> {
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
            address: self.region.addr() + (idx * 8) as usize,
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
            if pending.is_multiple_of(INTERRUPT_POLL) && crate::interrupt::interrupted() {
                break;
            }
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
            if pending.is_multiple_of(INTERRUPT_POLL) && crate::interrupt::interrupted() {
                return Err(None);
            }
            if pending == PROGRESS_BATCH {
                progress.fetch_add(pending * self.unit(), Ordering::Relaxed);
                pending = 0;
            }
            if v == idx {
                Ok(())
            } else {
                Err(Some(self.mismatch(idx, idx, v)))
            }
        };
        let r: Result<(), Option<Mismatch>> = (|| {
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
        })();
        // An interrupted read-back is reported by the caller, not as a mismatch.
        r.or_else(|e| e.map_or(Ok(()), Err))
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
/// Test hook: with this variable set, task 0 of every phase blocks in a userfaultfd fault that
/// nobody serves, the way a task stuck on a never-resolved fault does (issue 10), so that the
/// tests can check that SIGINT/SIGTERM still end the benchmark promptly.
pub const STUCK_FAULT_ENV: &str = "USERMM_TEST_STUCK_FAULT";

/// Touches a page registered with a userfaultfd that is never read: the thread sleeps in the
/// kernel until the process exits.
fn stuck_fault() {
    use usermm_sys::{uffd, Mapping, PAGE_SIZE};
    let (Ok(u), Ok(m)) = (
        uffd::Uffd::open(0, uffd::OpenPolicy::Auto),
        Mapping::anon(PAGE_SIZE, 0),
    ) else {
        return;
    };
    if u.register(m.addr(), m.len(), uffd::mode::MISSING).is_ok() {
        eprintln!("usermm: {STUCK_FAULT_ENV}: task 0 is now stuck in a fault");
        let _ = m.read_u64(0);
    }
}

fn on_tasks<M: Memory, R: Send>(
    tasks: &[Task<'_, M>],
    msg: &str,
    total: u64,
    started: impl FnOnce(),
    f: impl Fn(&Task<'_, M>, &AtomicU64) -> R + Sync,
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
                .spawn_scoped(s, move || {
                    gate.wait().then(|| {
                        if t.id == 0 && std::env::var_os(STUCK_FAULT_ENV).is_some() {
                            stuck_fault();
                        }
                        f(t, progress)
                    })
                });
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

/// What one run of the workload produced, whichever engine served the memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub per_task: Vec<TaskLine>,
    pub elapsed_s: f64,
    pub verify: Verify,
    /// Counter differences over the workload (state items: the value at its end).
    pub vmstat: Counters,
    /// Memory cgroup counters over the workload (kernel engine).
    pub memcg: Option<Counters>,
}

/// Counter sources: `vmstat` (usermm's manager or /proc/vmstat) and, for the kernel engine,
/// the cgroup's memory.stat.
pub trait Sampler: Sync {
    fn vmstat(&self) -> Counters;
    fn memcg(&self) -> Option<Counters> {
        None
    }
}

/// Runs the workload over `mems` (one per task) and verifies it. Counter differences come from
/// `sampler`. A wrong word is reported in the outcome's `verify`, not as an error; Ctrl-C (when
/// the kernel engine's handler is installed) is [`Failure::Interrupted`].
pub fn execute<M: Memory>(
    mems: &[M],
    p: &Params,
    sampler: &dyn Sampler,
) -> Result<Outcome, Failure> {
    let words = p.bytes_per_task / 8;
    let tasks: Vec<Task<'_, M>> = mems
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
    let vm0 = sampler.vmstat();
    let cg0 = sampler.memcg();
    let mut start = Instant::now();
    let done = on_tasks(
        &tasks,
        &p.workload,
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
                if crate::interrupt::interrupted() {
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
    let vmstat = sampler.vmstat().delta(&vm0, vmstat_is_state);
    let memcg = match (sampler.memcg(), cg0) {
        (Some(now), Some(before)) => Some(now.delta(&before, crate::counters::memcg_is_state)),
        _ => None,
    };
    if crate::interrupt::interrupted() {
        return Err(Failure::Interrupted);
    }
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
            vmstat: Counters::default(),
        }
    } else {
        let before = sampler.vmstat();
        let t0 = Instant::now();
        let results = on_tasks(
            &tasks,
            "verify",
            total_work,
            || {},
            |t, progress| t.read_back(progress),
        )?;
        let seconds = t0.elapsed().as_secs_f64();
        if crate::interrupt::interrupted() {
            return Err(Failure::Interrupted);
        }
        Verify::ReadBack {
            result: results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), |m| Err(m.to_string())),
            seconds,
            vmstat: sampler.vmstat().delta(&before, vmstat_is_state),
        }
    };
    Ok(Outcome {
        per_task: done.iter().map(|d| d.line).collect(),
        elapsed_s: elapsed.as_secs_f64(),
        verify,
        vmstat,
        memcg,
    })
}

/// Bytes per task as a mapping length; too large for the address space is a usage error.
pub fn region_len(p: &Params) -> Result<usize, Failure> {
    usize::try_from(p.bytes_per_task).map_err(|_| {
        Failure::Usage(format!(
            "SIZE: {} bytes do not fit the address space",
            p.bytes_per_task
        ))
    })
}

/// Counters of a usermm manager.
pub struct MmSampler<'a>(pub &'a Mm);

impl Sampler for MmSampler<'_> {
    fn vmstat(&self) -> Counters {
        Counters::from_vmstat(&self.0.vmstat())
    }
}

/// Runs the workload on a fresh usermm manager built from `cfg` and returns its report
/// (nothing is printed).
pub fn run_usermm(cfg: MmConfig, p: &Params) -> Result<Report, Failure> {
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    let len = region_len(p)?;
    let regions: Vec<Region> = (0..p.tasks)
        .map(|_| mm.map_anon(len))
        .collect::<Result<_, _>>()
        .map_err(Failure::run)?;
    let out = execute(&regions, p, &MmSampler(&mm))?;
    drop(regions);
    Ok(report(
        p,
        "usermm",
        out,
        Budget {
            budget_bytes: mm.budget(),
            swap_bytes: mm.swap_bytes(),
            swap_device: mm.swap_name(),
            peak_resident_bytes: mm.peak_resident_bytes(),
            peak_rss_bytes: output::peak_rss_bytes(),
        },
        Map::new(),
    ))
}

/// Memory limits and peaks of one run, as the engine reports them.
pub struct Budget {
    pub budget_bytes: u64,
    pub swap_bytes: u64,
    pub swap_device: String,
    pub peak_resident_bytes: u64,
    pub peak_rss_bytes: u64,
}

/// The report of one run from its outcome.
pub fn report(
    p: &Params,
    engine: &'static str,
    out: Outcome,
    b: Budget,
    setup: Map<String, serde_json::Value>,
) -> Report {
    Report {
        workload: p.workload.clone(),
        engine,
        tasks: p.tasks,
        bytes_per_task: p.bytes_per_task,
        readonly: p.readonly,
        step: p.step,
        random: p.random,
        repeat: p.repeat,
        budget_bytes: b.budget_bytes,
        swap_bytes: b.swap_bytes,
        swap_device: b.swap_device,
        per_task: out.per_task,
        elapsed_s: out.elapsed_s,
        verify: out.verify,
        peak_resident_bytes: b.peak_resident_bytes,
        peak_rss_bytes: b.peak_rss_bytes,
        vmstat: out.vmstat,
        memcg: out.memcg,
        setup,
    }
}

/// Prints a report (usemem's lines, then text or JSON). A failed verification is a run
/// error, reported after the summary.
pub fn print(report: &Report, json: bool) -> Result<(), Failure> {
    report.print_task_lines(json);
    if json {
        let text = serde_json::to_string_pretty(&report.to_json()).map_err(Failure::run)?;
        println!("{text}");
    } else {
        report.print_text();
    }
    verify_result(report)
}

/// The run error for a failed verification, if any.
pub fn verify_result(report: &Report) -> Result<(), Failure> {
    match report.verify.error() {
        Some(e) => Err(Failure::Run(format!(
            "verification failed ({} engine): {e}",
            report.engine
        ))),
        None => Ok(()),
    }
}
