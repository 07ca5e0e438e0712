//! `usermm bench simoop`: a simoop-like latency workload (Chris Mason's simulation of hadoop's
//! VM activity, which seed 004 was measured with). Worker threads loop over: allocate a block
//! of mapped memory and touch every page ("Allocation"), read a random block of a random file
//! through the page cache ("Read"), write a random block of a random file ("Write"), touch a
//! random part of a shared working set, checksum what was read, free the block. CPU burner
//! threads compete for the CPUs. The files together are larger than the budget and the writes
//! leave dirty pages, so reclaim meets dirty page cache, which is where seed 004 acts.
//!
//! Reported per interval and at the end: p50/p95/p99/max latency in microseconds for Read,
//! Write and Allocation, the work rate (loops per second) and the alloc stall rate
//! (`allocstall` per second). The engine is a [`Backend`]: usermm's page cache and regions, or
//! the kernel's (plain files and anonymous memory).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usermm::{CachedFile, Mm, MmConfig};
use usermm_sys::Mapping;

use super::XorShift;
use crate::Failure;

/// Workload parameters.
#[derive(Debug, Clone)]
pub struct Params {
    pub threads: usize,
    pub burners: usize,
    pub files: usize,
    pub file_size: u64,
    pub read_size: usize,
    pub write_size: usize,
    pub alloc_size: usize,
    pub working_set: usize,
    pub duration: Duration,
    pub interval: Duration,
    pub dir: std::path::PathBuf,
    pub seed: u64,
    pub json: bool,
}

/// A block of mapped memory the workload allocates.
pub trait Block: Send {
    /// Stores `v` in the word at byte offset `off`.
    fn write_u64(&self, off: usize, v: u64);
    /// Loads the word at byte offset `off`.
    fn read_u64(&self, off: usize) -> u64;
}

/// What the workload runs on.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Reads `buf.len()` bytes of file `i` at `pos`.
    fn read(&self, i: usize, pos: u64, buf: &mut [u8]) -> Result<(), String>;
    /// Writes `buf` to file `i` at `pos`.
    fn write(&self, i: usize, pos: u64, buf: &[u8]) -> Result<(), String>;
    /// Maps `len` bytes of anonymous memory.
    fn alloc(&self, len: usize) -> Result<Box<dyn Block>, String>;
    /// The counters now (vmstat names).
    fn vmstat(&self) -> Vec<(String, u64)>;
}

impl Block for usermm::Region {
    fn write_u64(&self, off: usize, v: u64) {
        usermm::Region::write_u64(self, off, v)
    }
    fn read_u64(&self, off: usize) -> u64 {
        usermm::Region::read_u64(self, off)
    }
}

impl Block for Mapping {
    fn write_u64(&self, off: usize, v: u64) {
        Mapping::write_u64(self, off, v)
    }
    fn read_u64(&self, off: usize) -> u64 {
        Mapping::read_u64(self, off)
    }
}

/// usermm: files through `CachedFile`, memory from `map_anon`.
pub struct UsermmBackend {
    pub mm: Mm,
    files: Vec<CachedFile>,
}

impl UsermmBackend {
    pub fn new(cfg: MmConfig, paths: &[std::path::PathBuf]) -> Result<Self, Failure> {
        let mm = Mm::new(cfg).map_err(Failure::run)?;
        let files = paths
            .iter()
            .map(|p| mm.open(p).map_err(Failure::run))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(UsermmBackend { mm, files })
    }
}

impl Backend for UsermmBackend {
    fn name(&self) -> &'static str {
        "usermm"
    }
    fn read(&self, i: usize, pos: u64, buf: &mut [u8]) -> Result<(), String> {
        self.files[i]
            .read_at(pos, buf)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn write(&self, i: usize, pos: u64, buf: &[u8]) -> Result<(), String> {
        self.files[i]
            .write_at(pos, buf)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn alloc(&self, len: usize) -> Result<Box<dyn Block>, String> {
        self.mm
            .map_anon(len)
            .map(|r| Box::new(r) as Box<dyn Block>)
            .map_err(|e| e.to_string())
    }
    fn vmstat(&self) -> Vec<(String, u64)> {
        self.mm
            .vmstat()
            .iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect()
    }
}

/// Latency percentiles of one kind of operation (microseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lat {
    pub n: usize,
    pub p50: u64,
    pub p95: u64,
    pub p99: u64,
    pub max: u64,
}

impl Lat {
    /// Percentiles by nearest rank.
    pub fn of(samples: &mut [u64]) -> Lat {
        if samples.is_empty() {
            return Lat::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[rank - 1]
        };
        Lat {
            n: samples.len(),
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        }
    }
    fn json(&self) -> Value {
        json!({"n": self.n, "p50": self.p50, "p95": self.p95, "p99": self.p99, "max": self.max})
    }
    fn text(&self) -> String {
        format!(
            "p50 {:>8} p95 {:>8} p99 {:>8} max {:>8}",
            self.p50, self.p95, self.p99, self.max
        )
    }
}

#[derive(Default)]
struct Samples {
    read: Vec<u64>,
    write: Vec<u64>,
    alloc: Vec<u64>,
}

/// One interval's (or the whole run's) results.
#[derive(Debug, Clone)]
pub struct Interval {
    pub t: f64,
    pub read: Lat,
    pub write: Lat,
    pub alloc: Lat,
    pub work_rate: f64,
    pub alloc_stall_rate: f64,
}

impl Interval {
    pub fn json(&self) -> Value {
        json!({
            "t": self.t, "read": self.read.json(), "write": self.write.json(),
            "alloc": self.alloc.json(), "work_rate": self.work_rate,
            "alloc_stall_rate": self.alloc_stall_rate,
        })
    }
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct Report {
    pub engine: &'static str,
    pub intervals: Vec<Interval>,
    pub total: Interval,
    pub vmstat: Vec<(String, u64)>,
    pub elapsed: f64,
}

impl Report {
    pub fn json(&self) -> Value {
        json!({
            "workload": "simoop",
            "engine": self.engine,
            "elapsed_s": self.elapsed,
            "intervals": self.intervals.iter().map(Interval::json).collect::<Vec<_>>(),
            "final": self.total.json(),
            "work_rate": self.total.work_rate,
            "alloc_stall_rate": self.total.alloc_stall_rate,
            "vmstat": self.vmstat.iter().map(|(n, v)| (n.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })
    }

    pub fn print_text(&self) {
        println!("simoop on {}: {:.1} s", self.engine, self.elapsed);
        for (name, l) in [
            ("Read", &self.total.read),
            ("Write", &self.total.write),
            ("Allocation", &self.total.alloc),
        ] {
            println!("final {name:<10} latency (usec) {}", l.text());
        }
        println!(
            "work rate {:.1} loops/s, alloc stall rate {:.1}/s",
            self.total.work_rate, self.total.alloc_stall_rate
        );
        let keys = [
            "allocstall",
            "pgscan_kswapd",
            "pgscan_direct",
            "pgsteal_file",
            "pgsteal_anon",
            "nr_vmscan_write",
            "nr_vmscan_immediate_reclaim",
            "pgrotated_dirty",
            "flusher_wake_vmscan",
            "nr_written",
            "pswpout",
            "balance_dirty_pages",
        ];
        let moved: Vec<String> = keys
            .iter()
            .filter_map(|k| {
                self.vmstat
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(n, v)| format!("{n} {v}"))
            })
            .collect();
        println!("vmstat: {}", moved.join(", "));
    }
}

fn vm_get(v: &[(String, u64)], name: &str) -> u64 {
    v.iter().find(|(n, _)| n == name).map_or(0, |(_, x)| *x)
}

fn allocstalls(v: &[(String, u64)]) -> u64 {
    // Linux splits allocstall by zone (allocstall_normal, ...); usermm has one.
    v.iter()
        .filter(|(n, _)| n == "allocstall" || n.starts_with("allocstall_"))
        .map(|(_, x)| *x)
        .sum()
}

/// Creates the files (kernel writes, then dropped from the kernel's cache) and returns their
/// paths.
pub fn prepare_files(p: &Params) -> Result<Vec<std::path::PathBuf>, Failure> {
    use std::io::Write;
    std::fs::create_dir_all(&p.dir)
        .map_err(|e| Failure::Run(format!("creating {}: {e}", p.dir.display())))?;
    let mut paths = Vec::new();
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..p.files {
        let path = p.dir.join(format!("simoop-{i}"));
        let ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == p.file_size);
        if !ok {
            let mut f = std::fs::File::create(&path)
                .map_err(|e| Failure::Run(format!("creating {}: {e}", path.display())))?;
            let mut left = p.file_size;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                f.write_all(&chunk[..n])
                    .map_err(|e| Failure::Run(format!("writing {}: {e}", path.display())))?;
                left -= n as u64;
            }
            f.sync_all().map_err(Failure::run)?;
        }
        // Start cold: the kernel's copy goes (usermm reads with O_DIRECT anyway).
        if let Ok(f) = std::fs::File::open(&path) {
            let _ = usermm_sys::fadvise_dontneed(&f, 0, p.file_size);
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Runs the workload on `b`.
pub fn run(b: Arc<dyn Backend>, p: &Params) -> Result<Report, Failure> {
    let stop = Arc::new(AtomicBool::new(false));
    let loops = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let errors = Arc::new(Mutex::new(None::<String>));
    let ws = b.alloc(p.working_set.max(4096)).map_err(Failure::Run)?;
    let ws: Arc<Mutex<Box<dyn Block>>> = Arc::new(Mutex::new(ws));
    // Populate the working set.
    {
        let w = ws.lock().unwrap();
        for off in (0..p.working_set).step_by(4096) {
            w.write_u64(off, off as u64);
        }
    }
    let before = b.vmstat();
    let start = Instant::now();
    let mut workers = Vec::new();
    for t in 0..p.threads {
        let (b, stop, loops, samples, errors, ws) = (
            b.clone(),
            stop.clone(),
            loops.clone(),
            samples.clone(),
            errors.clone(),
            ws.clone(),
        );
        let p = p.clone();
        workers.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(p.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9));
            let mut rbuf = vec![0u8; p.read_size];
            let mut wbuf = vec![0u8; p.write_size];
            let mut sink = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let res: Result<(), String> = (|| {
                    let t0 = Instant::now();
                    let blk = b.alloc(p.alloc_size)?;
                    for off in (0..p.alloc_size).step_by(4096) {
                        blk.write_u64(off, off as u64);
                    }
                    let alloc_us = t0.elapsed().as_micros() as u64;
                    let fi = rng.below(p.files as u64) as usize;
                    let blocks = (p.file_size / p.read_size as u64).max(1);
                    let pos = rng.below(blocks) * p.read_size as u64;
                    let t1 = Instant::now();
                    b.read(fi, pos, &mut rbuf)?;
                    let read_us = t1.elapsed().as_micros() as u64;
                    for (k, x) in wbuf.iter_mut().enumerate().step_by(512) {
                        *x = (k as u64 ^ sink) as u8;
                    }
                    let fi = rng.below(p.files as u64) as usize;
                    let blocks = (p.file_size / p.write_size as u64).max(1);
                    let pos = rng.below(blocks) * p.write_size as u64;
                    let t2 = Instant::now();
                    b.write(fi, pos, &wbuf)?;
                    let write_us = t2.elapsed().as_micros() as u64;
                    // Use the working set and what was read (the CPU part of a loop).
                    {
                        let w = ws.lock().unwrap();
                        let chunks = (p.working_set / (2 << 20)).max(1) as u64;
                        let base = rng.below(chunks) as usize * (2 << 20);
                        for off in (base..(base + (2 << 20)).min(p.working_set)).step_by(4096) {
                            sink = sink.wrapping_add(w.read_u64(off));
                        }
                    }
                    sink = rbuf
                        .iter()
                        .step_by(64)
                        .fold(sink, |a, &x| a.rotate_left(5) ^ x as u64);
                    sink ^= blk.read_u64(0);
                    drop(blk);
                    let mut s = samples.lock().unwrap();
                    s.alloc.push(alloc_us);
                    s.read.push(read_us);
                    s.write.push(write_us);
                    Ok(())
                })();
                if let Err(e) = res {
                    errors.lock().unwrap().get_or_insert(e);
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
                loops.fetch_add(1, Ordering::Relaxed);
            }
            std::hint::black_box(sink);
        }));
    }
    let mut burners = Vec::new();
    for t in 0..p.burners {
        let stop = stop.clone();
        burners.push(std::thread::spawn(move || {
            let mut x = XorShift::new(t as u64 + 77);
            let mut acc = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    acc = acc.wrapping_add(x.next_u64());
                }
            }
            std::hint::black_box(acc);
        }));
    }
    let mut intervals = Vec::new();
    let mut all = Samples::default();
    let mut last_loops = 0u64;
    let mut last_vm = before.clone();
    let mut last_t = start;
    while start.elapsed() < p.duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(p.interval.min(p.duration.saturating_sub(start.elapsed())));
        let now = Instant::now();
        let mut s = std::mem::take(&mut *samples.lock().unwrap());
        let dt = now.duration_since(last_t).as_secs_f64().max(1e-9);
        let l = loops.load(Ordering::Relaxed);
        let vm = b.vmstat();
        let iv = Interval {
            t: now.duration_since(start).as_secs_f64(),
            read: Lat::of(&mut s.read),
            write: Lat::of(&mut s.write),
            alloc: Lat::of(&mut s.alloc),
            work_rate: (l - last_loops) as f64 / dt,
            alloc_stall_rate: allocstalls(&vm).saturating_sub(allocstalls(&last_vm)) as f64 / dt,
        };
        if !p.json {
            eprintln!(
                "[{:>6.1}s] Read {} | Write {} | Alloc {} | {:.1} loops/s, {:.1} stalls/s",
                iv.t,
                iv.read.text(),
                iv.write.text(),
                iv.alloc.text(),
                iv.work_rate,
                iv.alloc_stall_rate
            );
        }
        intervals.push(iv);
        all.read.extend(s.read);
        all.write.extend(s.write);
        all.alloc.extend(s.alloc);
        last_loops = l;
        last_vm = vm;
        last_t = now;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    for w in burners {
        let _ = w.join();
    }
    if let Some(e) = errors.lock().unwrap().take() {
        return Err(Failure::Run(format!("simoop worker failed: {e}")));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = b.vmstat();
    let mut rest = std::mem::take(&mut *samples.lock().unwrap());
    all.read.append(&mut rest.read);
    all.write.append(&mut rest.write);
    all.alloc.append(&mut rest.alloc);
    let vmstat: Vec<(String, u64)> = after
        .iter()
        .map(|(n, v)| {
            if usermm::vmstat::is_state(n) {
                (n.clone(), *v)
            } else {
                (n.clone(), v.saturating_sub(vm_get(&before, n)))
            }
        })
        .collect();
    let total = Interval {
        t: elapsed,
        read: Lat::of(&mut all.read),
        write: Lat::of(&mut all.write),
        alloc: Lat::of(&mut all.alloc),
        work_rate: loops.load(Ordering::Relaxed) as f64 / elapsed,
        alloc_stall_rate: allocstalls(&after).saturating_sub(allocstalls(&before)) as f64 / elapsed,
    };
    Ok(Report {
        engine: b.name(),
        intervals,
        total,
        vmstat,
        elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let l = Lat::of(&mut v);
        assert_eq!((l.n, l.p50, l.p95, l.p99, l.max), (100, 50, 95, 99, 100));
        assert_eq!(Lat::of(&mut []), Lat::default());
        let l = Lat::of(&mut [7]);
        assert_eq!((l.p50, l.p99, l.max), (7, 7, 7));
    }
}
