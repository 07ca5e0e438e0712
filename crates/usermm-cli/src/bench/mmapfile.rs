//! `usermm bench mmap-file`: a shared file mapping larger than the budget, walked by `--threads`
//! threads in one of four patterns, on usermm's page cache or (`--engine kernel`) the kernel's:
//!
//! * `seqwrite`: a new, sparse file; one 8-byte store per 64 bytes in file order (each thread
//!   its own contiguous slice), then msync(MS_SYNC) inside the timed pass (bench/mmapseq.c's
//!   write pass);
//! * `seqread`: the same loads over a file written beforehand and dropped from every cache (cold);
//! * `randread` / `randwrite`: `--ops` accesses in all (split over the threads), each one 8-byte
//!   load or store at a random word of a random page of a written, cold file, until done or
//!   `--time-limit`; randwrite ends with msync(MS_SYNC). Random patterns report 4 KiB page
//!   accesses per second.
//!
//! Every word read is checked (the file holds [`word`] of each offset); after a write pass the
//! file is read back with plain `pread(2)` and every word written is checked (random writes are
//! replayed from the threads' generators). The file is written and read back with the kernel's
//! own file I/O on both engines, outside the timed pass.
//!
//! The loop runs over any [`Mapper`]: [`UsermmMapper`] (a usermm `Region` of the file, in this
//! process) or [`KernelMapper`] (mmap(2) of the file, run by the kernel engine's worker inside a
//! memory cgroup of the same budget), so both engines run the same code. `randread`
//! runs twice on each engine, with its default readahead and with MADV_RANDOM
//! ([`kernel_passes`]; usermm: `AccessPattern::Random`), and the better pass counts.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use usermm::{MapKind, Mm, MmConfig, Region};
use usermm_sys::{Advice, Mapping};

use super::usemem::{Memory, MmSampler, Sampler};
use super::XorShift;
use crate::counters::{memcg_is_state, vmstat_is_state, Counters};
use crate::output::mib;
use crate::Failure;

const PAGE: u64 = 4096;
/// Bytes between two touched words of a sequential pass (one cache line).
const STRIDE: u64 = 64;
/// Most threads a run may have.
pub const MAX_THREADS: usize = 1024;

/// An access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pattern {
    SeqWrite,
    SeqRead,
    RandRead,
    RandWrite,
}

impl Pattern {
    const ALL: [Pattern; 4] = [
        Pattern::SeqWrite,
        Pattern::SeqRead,
        Pattern::RandRead,
        Pattern::RandWrite,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::SeqWrite => "seqwrite",
            Pattern::SeqRead => "seqread",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
        }
    }

    /// Parses `seqwrite`, `seqread`, `randread`, `randwrite` or a comma-separated list of them
    /// (run in that order); the error names the value and the choices.
    pub fn parse_list(s: &str) -> Result<Vec<Pattern>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            let Some(p) = Self::ALL.into_iter().find(|p| p.name() == part) else {
                return Err(format!(
                    "unknown pattern {part:?}: use seqwrite, seqread, randread or randwrite \
                     (or a comma-separated list of them)"
                ));
            };
            if out.contains(&p) {
                return Err(format!("{part} is listed twice in {s:?}"));
            }
            out.push(p);
        }
        Ok(out)
    }

    pub fn writes(self) -> bool {
        matches!(self, Pattern::SeqWrite | Pattern::RandWrite)
    }

    pub fn random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }

    /// The unit of its throughput.
    pub fn unit(self) -> &'static str {
        if self.random() {
            "pages/s"
        } else {
            "MiB/s"
        }
    }
}

/// What to run (also the kernel worker's job).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    /// File size (a positive multiple of 4 KiB).
    pub size: u64,
    pub pattern: Pattern,
    /// Threads (1..=MAX_THREADS), all on one mapping.
    pub threads: usize,
    /// Random patterns: accesses in all.
    pub ops: u64,
    /// Random patterns: a thread stops after this long even with accesses left.
    pub time_limit: Duration,
    /// Directory of the file.
    pub dir: PathBuf,
    /// Seed of the random patterns.
    pub seed: u64,
}

impl Params {
    fn pages(&self) -> u64 {
        self.size / PAGE
    }

    /// The file this process uses.
    fn path(&self) -> PathBuf {
        self.dir
            .join(format!("usermm-mmapfile-{}", std::process::id()))
    }

    /// Accesses of thread `t` (random patterns).
    fn ops_of(&self, t: usize) -> u64 {
        let n = self.threads as u64;
        self.ops / n + u64::from((t as u64) < self.ops % n)
    }

    /// Pages `[lo, hi)` of thread `t` (sequential patterns).
    fn slice_of(&self, t: usize) -> (u64, u64) {
        let (n, pages) = (self.threads as u64, self.pages());
        (pages * t as u64 / n, pages * (t as u64 + 1) / n)
    }

    fn rng_of(&self, t: usize) -> XorShift {
        XorShift::new(self.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

/// What the file holds at byte offset `off` (8-byte aligned) once written.
pub fn word(off: u64) -> u64 {
    off ^ 0x6d6d_6170_6669_6c65
}

/// A random word's offset: a uniform page, a uniform word in it.
fn random_off(rng: &mut XorShift, pages: u64) -> u64 {
    rng.below(pages) * PAGE + rng.below(PAGE / 8) * 8
}

/// A mapped file the access loop walks.
pub trait MappedFile: Memory {
    /// msync(MS_SYNC) of the whole mapping.
    fn flush(&self) -> io::Result<()>;
}

/// Maps files read-write and shared.
pub trait Mapper {
    type Map: MappedFile;
    fn map(&self, path: &Path, len: usize) -> io::Result<Self::Map>;
}

/// usermm's page cache: a shared file region of a manager, declared random
/// (`AccessPattern::Random`, MADV_RANDOM) with `random`.
pub struct UsermmMapper<'a> {
    pub mm: &'a Mm,
    pub random: bool,
}

impl MappedFile for Region {
    fn flush(&self) -> io::Result<()> {
        Region::flush(self, 0, self.len()).map_err(|e| io::Error::other(e.to_string()))
    }
}

impl Mapper for UsermmMapper<'_> {
    type Map = Region;
    fn map(&self, path: &Path, len: usize) -> io::Result<Region> {
        let f = self
            .mm
            .open(path)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let r = f
            .map(0, len, MapKind::Shared)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if self.random {
            r.set_access_pattern(usermm::AccessPattern::Random);
        }
        Ok(r)
    }
}

/// The kernel's page cache: mmap(2) of the file, MADV_RANDOM with `random`.
pub struct KernelMapper {
    pub random: bool,
}

/// A kernel file mapping and the file it maps.
pub struct KernelMap {
    map: Mapping,
    _file: File,
}

impl Memory for KernelMap {
    fn addr(&self) -> usize {
        self.map.addr()
    }
    fn read_u64(&self, off: usize) -> u64 {
        self.map.read_u64(off)
    }
    fn write_u64(&self, off: usize, v: u64) {
        self.map.write_u64(off, v)
    }
}

impl MappedFile for KernelMap {
    fn flush(&self) -> io::Result<()> {
        Ok(self.map.sync()?)
    }
}

impl Mapper for KernelMapper {
    type Map = KernelMap;
    fn map(&self, path: &Path, len: usize) -> io::Result<KernelMap> {
        let file = fs::OpenOptions::new().read(true).write(true).open(path)?;
        let map = Mapping::shared(&file, len)?;
        if self.random {
            map.advise(0, map.len(), Advice::Random)?;
        }
        Ok(KernelMap { map, _file: file })
    }
}

/// The benchmark's file, removed on drop.
pub struct TestFile(PathBuf);

impl TestFile {
    /// Creates the file for `p`: sparse for seqwrite (as mmapseq's `ftruncate`), otherwise
    /// written with [`word`] of every offset, synced and dropped from the kernel's page cache
    /// so that the pass starts cold.
    pub fn create(p: &Params) -> Result<TestFile, Failure> {
        let path = p.path();
        let err = |what: &str, e: io::Error| {
            Failure::Run(format!("mmap-file: {what} {}: {e}", path.display()))
        };
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| err("cannot create", e))?;
        let guard = TestFile(path.clone());
        if p.pattern == Pattern::SeqWrite {
            f.set_len(p.size).map_err(|e| err("cannot size", e))?;
            return Ok(guard);
        }
        let chunk = (1u64 << 20).min(p.size);
        let mut buf = vec![0u8; chunk as usize];
        let mut off = 0;
        while off < p.size {
            let n = chunk.min(p.size - off);
            for (i, w) in buf[..n as usize].chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&word(off + 8 * i as u64).to_ne_bytes());
            }
            f.write_all_at(&buf[..n as usize], off)
                .map_err(|e| err("cannot write", e))?;
            off += n;
            if crate::interrupt::interrupted() {
                return Err(Failure::Interrupted);
            }
        }
        f.sync_data().map_err(|e| err("cannot sync", e))?;
        guard.drop_cache()?;
        Ok(guard)
    }

    /// Drops the file's clean pages from the kernel's page cache (`POSIX_FADV_DONTNEED`).
    pub fn drop_cache(&self) -> Result<(), Failure> {
        let f = File::open(&self.0)
            .map_err(|e| Failure::Run(format!("mmap-file: {}: {e}", self.0.display())))?;
        usermm_sys::fadvise_dontneed(&f, 0, 0)
            .map_err(|e| Failure::Run(format!("mmap-file: fadvise {}: {e}", self.0.display())))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// One timed pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pass {
    /// What ran: "" (the one pass), or the kernel's randread variant ("readahead",
    /// "madv_random").
    pub variant: String,
    pub secs: f64,
    /// CPU time of the benchmark's process over the pass, every thread of it: usermm's
    /// handlers, readahead workers, kswapd and flushers run there, the kernel's kswapd and
    /// kworkers do not (so it compares builds of usermm, not the two engines).
    #[serde(default)]
    pub cpu_secs: f64,
    /// Accesses done by each thread (sequential: 8-byte words; random: page accesses).
    pub per_thread: Vec<u64>,
    /// Bytes the pass covered: the file (sequential), 4 KiB per access (random).
    pub bytes: u64,
    /// Words read that did not hold what the file holds, and the first of them.
    pub bad_reads: u64,
    pub first_bad: Option<String>,
    pub vmstat: Counters,
    pub memcg: Option<Counters>,
}

impl Pass {
    pub fn ops(&self) -> u64 {
        self.per_thread.iter().sum()
    }

    /// MiB/s (sequential) or page accesses per second (random).
    pub fn rate(&self, pattern: Pattern) -> f64 {
        let secs = self.secs.max(1e-9);
        if pattern.random() {
            self.ops() as f64 / secs
        } else {
            self.bytes as f64 / (1 << 20) as f64 / secs
        }
    }
}

/// Runs one pass of `p` over the file at `path`, mapped by `mapper`.
pub fn execute<M: Mapper>(
    mapper: &M,
    path: &Path,
    p: &Params,
    variant: &str,
    sampler: &dyn Sampler,
) -> Result<Pass, Failure> {
    let vm0 = sampler.vmstat();
    let cg0 = sampler.memcg();
    let map = mapper
        .map(path, p.size as usize)
        .map_err(|e| Failure::Run(format!("mmap-file: mapping {}: {e}", path.display())))?;
    let t0 = Instant::now();
    let cpu0 = usermm_sys::process_cpu_ns();
    let deadline = t0 + p.time_limit;
    let results: Vec<(u64, u64, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.threads)
            .map(|t| {
                let map = &map;
                s.spawn(move || walk(map, p, t, deadline))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or((0, 0, Some("a thread panicked".into()))))
            .collect()
    });
    if crate::interrupt::interrupted() {
        return Err(Failure::Interrupted);
    }
    if p.pattern.writes() {
        map.flush()
            .map_err(|e| Failure::Run(format!("mmap-file: msync of {}: {e}", path.display())))?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_secs = usermm_sys::process_cpu_ns().saturating_sub(cpu0) as f64 / 1e9;
    drop(map);
    let per_thread: Vec<u64> = results.iter().map(|r| r.0).collect();
    let ops: u64 = per_thread.iter().sum();
    Ok(Pass {
        variant: variant.to_string(),
        secs,
        cpu_secs,
        bytes: if p.pattern.random() {
            ops * PAGE
        } else {
            p.size
        },
        bad_reads: results.iter().map(|r| r.1).sum(),
        first_bad: results.into_iter().find_map(|r| r.2),
        per_thread,
        vmstat: sampler.vmstat().delta(&vm0, vmstat_is_state),
        memcg: match (sampler.memcg(), cg0) {
            (Some(now), Some(before)) => Some(now.delta(&before, memcg_is_state)),
            _ => None,
        },
    })
}

/// Thread `t`'s part of the pass: (accesses, wrong words read, the first of them).
fn walk<M: Memory>(map: &M, p: &Params, t: usize, deadline: Instant) -> (u64, u64, Option<String>) {
    let (mut done, mut bad, mut first) = (0u64, 0u64, None);
    let mut check = |off: u64, found: u64| {
        if found != word(off) {
            bad += 1;
            first.get_or_insert_with(|| {
                format!(
                    "thread {t}: word at offset {off:#x} holds {found:#x}, expected {:#x}",
                    word(off)
                )
            });
        }
    };
    if p.pattern.random() {
        let mut rng = p.rng_of(t);
        let pages = p.pages();
        for i in 0..p.ops_of(t) {
            if i % 64 == 0 && (Instant::now() >= deadline || crate::interrupt::interrupted()) {
                break;
            }
            let off = random_off(&mut rng, pages);
            if p.pattern.writes() {
                map.write_u64(off as usize, !word(off));
            } else {
                check(off, map.read_u64(off as usize));
            }
            done += 1;
        }
    } else {
        let (lo, hi) = p.slice_of(t);
        for page in lo..hi {
            if crate::interrupt::interrupted() {
                break;
            }
            for off in (page * PAGE..(page + 1) * PAGE).step_by(STRIDE as usize) {
                if p.pattern.writes() {
                    map.write_u64(off as usize, word(off));
                } else {
                    check(off, map.read_u64(off as usize));
                }
            }
            done += PAGE / STRIDE;
        }
    }
    (done, bad, first)
}

/// After a write pass: reads the file back with pread(2) and checks every word the pass wrote
/// (seqwrite: [`word`] of each 64-byte step; randwrite: its complement at each offset the
/// threads' generators produced for the accesses they did). Returns the words checked.
pub fn verify_writes(path: &Path, p: &Params, pass: &Pass) -> Result<u64, Failure> {
    let fail = |m: String| Failure::Run(format!("mmap-file: {m}"));
    let f = File::open(path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let (offs, expect): (Vec<u64>, fn(u64) -> u64) = match p.pattern {
        Pattern::SeqWrite => ((0..p.size).step_by(STRIDE as usize).collect(), word),
        Pattern::RandWrite => {
            let mut v = Vec::with_capacity(pass.ops() as usize);
            for (t, &n) in pass.per_thread.iter().enumerate() {
                let mut rng = p.rng_of(t);
                v.extend((0..n).map(|_| random_off(&mut rng, p.pages())));
            }
            v.sort_unstable();
            v.dedup();
            (v, |o| !word(o))
        }
        _ => return Ok(0),
    };
    let chunk = 1u64 << 20;
    let mut buf = vec![0u8; chunk as usize];
    let mut base = u64::MAX;
    for &off in &offs {
        if base == u64::MAX || off >= base + chunk {
            base = off / chunk * chunk;
            let n = chunk.min(p.size - base) as usize;
            f.read_exact_at(&mut buf[..n], base)
                .map_err(|e| fail(format!("reading back {}: {e}", path.display())))?;
        }
        let i = (off - base) as usize;
        let found = u64::from_ne_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        if found != expect(off) {
            return Err(fail(format!(
                "after the {} pass the file holds {found:#x} at offset {off:#x}, expected {:#x} \
                 (read back with pread after msync)",
                p.pattern.name(),
                expect(off)
            )));
        }
    }
    Ok(offs.len() as u64)
}

/// The reads of a pass were all right, or the error naming the first wrong one.
fn check_reads(pass: &Pass) -> Result<(), Failure> {
    match &pass.first_bad {
        Some(first) => Err(Failure::Run(format!(
            "mmap-file: {} words read wrong; first: {first}",
            pass.bad_reads.max(1)
        ))),
        None => Ok(()),
    }
}

/// What a kernel-engine job of `p` measured (run by its worker in the memory cgroup): one pass,
/// or for randread two (default readahead, then MADV_RANDOM on a cold cache again); the file is
/// checked after a write pass.
pub fn kernel_passes(p: &Params, sampler: &dyn Sampler) -> Result<Vec<Pass>, Failure> {
    let file = TestFile::create(p)?;
    let mut passes = Vec::new();
    if p.pattern == Pattern::RandRead {
        for (random, variant) in [(false, "readahead"), (true, "madv_random")] {
            file.drop_cache()?;
            let pass = execute(&KernelMapper { random }, file.path(), p, variant, sampler)?;
            check_reads(&pass)?;
            passes.push(pass);
        }
    } else {
        let pass = execute(&KernelMapper { random: false }, file.path(), p, "", sampler)?;
        check_reads(&pass)?;
        verify_writes(file.path(), p, &pass)?;
        passes.push(pass);
    }
    Ok(passes)
}

/// One run of `p` on a fresh usermm manager built from `cfg`; for randread two, as on the
/// kernel (default readahead, then the region declared random), each on a fresh manager so
/// that both start cold.
pub fn run_usermm(cfg: MmConfig, p: &Params) -> Result<Report, Failure> {
    let file = TestFile::create(p)?;
    let variants: &[(bool, &str)] = if p.pattern == Pattern::RandRead {
        &[(false, "readahead"), (true, "madv_random")]
    } else {
        &[(false, "")]
    };
    let mut passes = Vec::new();
    let (mut budget, mut peak) = (0, 0);
    for &(random, variant) in variants {
        let mm = Mm::new(cfg.clone()).map_err(Failure::run)?;
        let mapper = UsermmMapper { mm: &mm, random };
        let pass = execute(&mapper, file.path(), p, variant, &MmSampler(&mm))?;
        check_reads(&pass)?;
        verify_writes(file.path(), p, &pass)?;
        budget = mm.budget();
        peak = peak.max(mm.peak_resident_bytes());
        passes.push(pass);
    }
    Ok(Report {
        engine: "usermm",
        params: p.clone(),
        budget_bytes: budget,
        peak_resident_bytes: peak,
        passes,
        setup: Map::new(),
    })
}

/// The counters a run's text shows (those the engine has).
const SHOWN: &[&str] = &[
    "pgfault",
    "pgmajfault",
    "wp_fault",
    "fault_around_pages",
    "file_ra",
    "pgpgin",
    "pgpgout",
    "nr_written",
    "pgsteal_file",
    "workingset_refault_file",
    "fault_deferred",
    "fault_io_parked",
    "fault_io_served",
    "file_ra_async",
    "file_ra_hit",
    "file_map_moved",
    "file_map_stored_unseen",
    "file_map_read_hashed",
    "file_read_direct",
    "file_read_async",
    "handler_standby_wake",
    "handler_spin_hit",
    "handler_wakeup",
    "allocstall",
    "kswapd_wake",
];

/// One run of one engine.
pub struct Report {
    pub engine: &'static str,
    pub params: Params,
    pub budget_bytes: u64,
    /// usermm: its resident-page accounting; kernel: the cgroup's peak usage (page cache
    /// included), over the whole job.
    pub peak_resident_bytes: u64,
    pub passes: Vec<Pass>,
    pub setup: Map<String, Value>,
}

impl Report {
    /// The pass that counts: the fastest (the kernel's better randread configuration).
    pub fn best(&self) -> &Pass {
        let pat = self.params.pattern;
        self.passes
            .iter()
            .max_by(|a, b| a.rate(pat).total_cmp(&b.rate(pat)))
            .expect("a report has a pass")
    }

    /// The rate that counts (MiB/s or pages/s).
    pub fn rate(&self) -> f64 {
        self.best().rate(self.params.pattern)
    }

    pub fn to_json(&self) -> Value {
        let pat = self.params.pattern;
        json!({
            "workload": "mmap-file",
            "engine": self.engine,
            "pattern": pat.name(),
            "size": self.params.size,
            "threads": self.params.threads,
            "budget_bytes": self.budget_bytes,
            "peak_resident_bytes": self.peak_resident_bytes,
            "rate": self.rate(),
            "unit": pat.unit(),
            "counted": self.best().variant,
            "passes": self.passes.iter().map(|s| json!({
                "variant": s.variant,
                "secs": s.secs,
                "cpu_secs": s.cpu_secs,
                "ops": s.ops(),
                "bytes": s.bytes,
                "rate": s.rate(pat),
                "mibs": s.bytes as f64 / (1 << 20) as f64 / s.secs.max(1e-9),
                "vmstat": s.vmstat.to_json(),
                "memcg": s.memcg.as_ref().map(Counters::to_json),
            })).collect::<Vec<_>>(),
            "setup": self.setup,
        })
    }

    /// The run's lines of text.
    pub fn text(&self) -> String {
        let p = &self.params;
        let pat = p.pattern;
        let mut s = format!(
            "mmap-file {} [{}]: {}, {} thread(s), budget {}: {:.0} {}",
            pat.name(),
            self.engine,
            mib(p.size),
            p.threads,
            mib(self.budget_bytes),
            self.rate(),
            pat.unit()
        );
        let best = self.best();
        if pat.random() {
            s += &format!(
                " ({} accesses in {:.2} s, cpu {:.2} s",
                best.ops(),
                best.secs,
                best.cpu_secs
            );
        } else {
            s += &format!(" ({:.2} s, cpu {:.2} s", best.secs, best.cpu_secs);
        }
        if self.passes.len() > 1 {
            s += &format!(", counted: {}", best.variant);
            for o in self.passes.iter().filter(|o| o.variant != best.variant) {
                s += &format!("; {} {:.0} {}", o.variant, o.rate(pat), pat.unit());
            }
        }
        s += &format!(
            "), peak resident {}{}\n",
            mib(self.peak_resident_bytes),
            if self.peak_resident_bytes > self.budget_bytes {
                " (ABOVE the budget)"
            } else {
                ""
            }
        );
        for pass in &self.passes {
            let shown: Vec<String> = SHOWN
                .iter()
                .filter_map(|k| pass.vmstat.get(k).map(|v| format!("{k} {v}")))
                .collect();
            let label = if pass.variant.is_empty() {
                String::new()
            } else {
                format!(" ({})", pass.variant)
            };
            s += &format!("  vmstat{label}: {}\n", shown.join(", "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pattern: Pattern, threads: usize) -> Params {
        Params {
            size: 64 * PAGE,
            pattern,
            threads,
            ops: 1000,
            time_limit: Duration::from_secs(60),
            dir: std::env::temp_dir(),
            seed: 7,
        }
    }

    #[test]
    fn patterns_parse_and_bad_ones_are_named() {
        assert_eq!(
            Pattern::parse_list("seqwrite, randread").unwrap(),
            vec![Pattern::SeqWrite, Pattern::RandRead]
        );
        let e = Pattern::parse_list("seqread,foo").unwrap_err();
        assert!(e.contains("\"foo\"") && e.contains("randwrite"), "{e}");
        assert!(Pattern::parse_list("seqread,seqread")
            .unwrap_err()
            .contains("twice"));
    }

    #[test]
    fn threads_split_the_work_exactly() {
        let p = params(Pattern::SeqRead, 3);
        let slices: Vec<_> = (0..3).map(|t| p.slice_of(t)).collect();
        assert_eq!(slices[0].0, 0);
        assert_eq!(slices[2].1, 64);
        assert!(slices.windows(2).all(|w| w[0].1 == w[1].0));
        let p = params(Pattern::RandRead, 3);
        assert_eq!((0..3).map(|t| p.ops_of(t)).sum::<u64>(), 1000);
    }

    /// The whole loop on the kernel's page cache (no cgroup: plain mmap of a small file), every
    /// pattern with two threads: reads check the words, writes are read back.
    #[test]
    fn every_pattern_runs_and_checks_on_a_plain_mapping() {
        struct NoCounters;
        impl Sampler for NoCounters {
            fn vmstat(&self) -> Counters {
                Counters::default()
            }
        }
        for pat in Pattern::ALL {
            let p = params(pat, 2);
            let passes = kernel_passes(&p, &NoCounters).unwrap();
            assert_eq!(passes.len(), if pat == Pattern::RandRead { 2 } else { 1 });
            for s in &passes {
                assert_eq!(s.bad_reads, 0, "{pat:?}");
                let want = if pat.random() {
                    1000
                } else {
                    64 * PAGE / STRIDE
                };
                assert_eq!(s.ops(), want, "{pat:?}");
            }
            assert!(!p.path().exists(), "file left behind");
        }
        // A file that does not hold what a read pass expects is reported.
        let p = params(Pattern::SeqRead, 1);
        let file = TestFile::create(&p).unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap()
            .write_all_at(&[1u8; 8], 4096 + 64)
            .unwrap();
        let s = execute(
            &KernelMapper { random: false },
            file.path(),
            &p,
            "",
            &NoCounters,
        )
        .unwrap();
        assert_eq!(s.bad_reads, 1);
        let e = match check_reads(&s) {
            Err(Failure::Run(m)) => m,
            _ => panic!("a wrong word passed"),
        };
        assert!(e.contains("0x1040"), "{e}");
    }
}
