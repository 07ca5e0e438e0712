//! `usermm bench soak`: a long mixed run with every byte checked. Worker threads each own
//! anonymous regions and a file (a shared mapping of it and buffered I/O on it, through the
//! page cache) and run a random mix for `--duration`: random and sequential writes and reads,
//! discards, region drop and re-create, `msync`/`fsync` with the file checked on disk
//! afterwards. Every page has a shadow version; a page of version `v` holds 512 words derived
//! from (thread, region generation, page, v), so every read checks the whole page. The whole
//! working set is several times the budget, so reclaim never stops. A monitor thread runs
//! `Mm::audit` (the manager's own accounting), `Mm::health` (stuck faults, the livelock
//! tripwires) and the counters that only a usermm bug or an I/O error makes nonzero
//! ([`MUST_STAY_ZERO`]) at intervals. When the time is up every thread sweeps all of its pages
//! once more, and the audit, health and counters are checked again. The first mismatch,
//! inconsistency, stuck fault or such counter stops the run with the page, what it holds and
//! its last operations (or the counter and its value), and exit status 1.
//!
//! Mirrors the spirit of the kernel's long-running mm stress (LTP's `mtest`/`mmapstress`, the
//! fsx file exerciser's shadow copy) rather than any one kernel file.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use usermm::{MapKind, Mm, MmConfig, Region};

use super::XorShift;
use crate::Failure;

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
/// Operations remembered per page (shown when the page is found wrong).
const HISTORY: usize = 4;

/// What `usermm bench soak` runs.
#[derive(Debug, Clone)]
pub struct Params {
    pub duration: Duration,
    pub threads: usize,
    /// Anonymous memory per thread, in bytes (split over `REGIONS` regions).
    pub anon_bytes: usize,
    /// File size per thread, in bytes.
    pub file_bytes: usize,
    pub seed: u64,
    pub audit_every: Duration,
    pub dir: PathBuf,
    pub json: bool,
}

/// Anonymous regions per thread.
const REGIONS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    WriteRandom,
    WriteSeq,
    ReadRandom,
    ReadSeq,
    Discard,
    Recreate,
    FileMapWrite,
    FileWrite,
    FileRead,
    FileSync,
}

const OPS: [Op; 10] = [
    Op::WriteRandom,
    Op::WriteSeq,
    Op::ReadRandom,
    Op::ReadSeq,
    Op::Discard,
    Op::Recreate,
    Op::FileMapWrite,
    Op::FileWrite,
    Op::FileRead,
    Op::FileSync,
];

/// Relative weights of [`OPS`].
const WEIGHTS: [u64; 10] = [20, 10, 20, 10, 3, 1, 12, 8, 12, 2];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::WriteRandom => "anon_write_random",
            Op::WriteSeq => "anon_write_seq",
            Op::ReadRandom => "anon_read_random",
            Op::ReadSeq => "anon_read_seq",
            Op::Discard => "anon_discard",
            Op::Recreate => "anon_region_recreate",
            Op::FileMapWrite => "file_mapped_write",
            Op::FileWrite => "file_buffered_write",
            Op::FileRead => "file_read",
            Op::FileSync => "file_sync",
        }
    }
}

/// splitmix64's finaliser: the words of a page.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The contents of a page of version `v` (0: zeros).
fn page_image(key: u64, v: u32, out: &mut [u8; PAGE]) {
    if v == 0 {
        out.fill(0);
        return;
    }
    let base = mix(key ^ (u64::from(v) << 40));
    for (i, c) in out.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&mix(base.wrapping_add(i as u64)).to_le_bytes());
    }
}

/// One page's shadow: its version and its last operations.
#[derive(Clone, Copy, Default)]
struct Shadow {
    version: u32,
    /// (operation, version after it, milliseconds since the start)
    history: [(u8, u32, u32); HISTORY],
    nhist: u8,
}

impl Shadow {
    fn note(&mut self, op: Op, t0: Instant) {
        let i = self.nhist as usize % HISTORY;
        self.history[i] = (op as u8, self.version, t0.elapsed().as_millis() as u32);
        self.nhist = self.nhist.wrapping_add(1);
    }

    fn describe(&self) -> String {
        let n = (self.nhist as usize).min(HISTORY);
        let mut s = String::new();
        for k in 0..n {
            let i = (self.nhist as usize + HISTORY - n + k) % HISTORY;
            let (op, v, ms) = self.history[i];
            let _ = write!(
                s,
                "{}{} -> v{v} at {ms} ms",
                if k > 0 { "; " } else { "" },
                OPS[op as usize].name()
            );
        }
        if s.is_empty() {
            s.push_str("never touched");
        }
        s
    }
}

struct AnonSlot {
    region: Region,
    gen: u64,
    pages: Vec<Shadow>,
}

struct Worker {
    id: u64,
    mm: Mm,
    anon: Vec<AnonSlot>,
    file: usermm::CachedFile,
    file_path: PathBuf,
    map: Region,
    fpages: Vec<Shadow>,
    rng: XorShift,
    t0: Instant,
    counts: [u64; 10],
    verified_pages: u64,
    next_gen: u64,
    /// Test hook (`USERMM_TEST_SOAK_CORRUPT=1`, thread 0 only): before the final sweep, one
    /// word of a written page is changed behind the shadow's back; the sweep must find it.
    corrupt: bool,
}

impl Worker {
    fn anon_key(&self, slot: usize, page: usize) -> u64 {
        mix(self.id << 48 ^ self.anon[slot].gen << 24 ^ page as u64)
    }

    fn file_key(&self, page: usize) -> u64 {
        mix(self.id << 48 ^ 0xF11E << 32 ^ page as u64)
    }

    fn write_anon(&mut self, slot: usize, page: usize, op: Op) -> Result<(), String> {
        let mut img = [0u8; PAGE];
        let s = &mut self.anon[slot].pages[page];
        s.version += 1;
        s.note(op, self.t0);
        let v = s.version;
        page_image(self.anon_key(slot, page), v, &mut img);
        self.anon[slot]
            .region
            .write_bytes(page * PAGE, &img)
            .map_err(|e| format!("writing anon page {page}: {e}"))
    }

    fn check_anon(&mut self, slot: usize, page: usize) -> Result<(), String> {
        let sh = self.anon[slot].pages[page];
        let key = self.anon_key(slot, page);
        let what = format!(
            "thread {} anon region {slot} (generation {})",
            self.id, self.anon[slot].gen
        );
        self.verified_pages += 1;
        check_page(&what, &self.anon[slot].region, page, key, &sh)
    }

    fn check_file(&mut self, page: usize, buffered: bool) -> Result<(), String> {
        let sh = self.fpages[page];
        let key = self.file_key(page);
        self.verified_pages += 1;
        if buffered {
            let what = format!(
                "thread {} file {} (buffered read)",
                self.id,
                self.file_path.display()
            );
            return check_image(&what, &self.map, page, key, &sh, |got| {
                self.file
                    .read_exact_at((page * PAGE) as u64, got)
                    .map_err(|e| format!("read_at of file page {page}: {e}"))
            });
        }
        let what = format!(
            "thread {} file {} (shared mapping)",
            self.id,
            self.file_path.display()
        );
        check_page(&what, &self.map, page, key, &sh)
    }

    /// The final sweep: every page of every region and of the file, through the mapping.
    fn verify_all(&mut self) -> Result<(), String> {
        if self.corrupt {
            // A written page of region 0; if none is (a short run, or the region was just
            // recreated), write one first, so the hook always has something to corrupt.
            let p = match self.anon[0].pages.iter().position(|s| s.version > 0) {
                Some(p) => p,
                None => {
                    self.write_anon(0, 0, Op::WriteRandom)?;
                    0
                }
            };
            let r = &self.anon[0].region;
            r.write_u64(p * PAGE + 8, !r.read_u64(p * PAGE + 8));
        }
        for slot in 0..REGIONS {
            for p in 0..self.anon[slot].pages.len() {
                self.check_anon(slot, p)?;
            }
        }
        for p in 0..self.fpages.len() {
            self.check_file(p, false)?;
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        let total: u64 = WEIGHTS.iter().sum();
        let mut x = self.rng.below(total);
        let mut k = 0;
        while x >= WEIGHTS[k] {
            x -= WEIGHTS[k];
            k += 1;
        }
        let op = OPS[k];
        self.counts[k] += 1;
        let slot = self.rng.below(REGIONS as u64) as usize;
        let npages = self.anon[slot].pages.len();
        let fpages = self.fpages.len();
        match op {
            Op::WriteRandom => {
                for _ in 0..8 {
                    let p = self.rng.below(npages as u64) as usize;
                    self.write_anon(slot, p, op)?;
                }
            }
            Op::WriteSeq => {
                let n = 16 + self.rng.below(48) as usize;
                let start = self.rng.below(npages.saturating_sub(n) as u64 + 1) as usize;
                for p in start..(start + n).min(npages) {
                    self.write_anon(slot, p, op)?;
                }
            }
            Op::ReadRandom => {
                for _ in 0..8 {
                    let p = self.rng.below(npages as u64) as usize;
                    self.check_anon(slot, p)?;
                }
            }
            Op::ReadSeq => {
                let n = 16 + self.rng.below(112) as usize;
                let start = self.rng.below(npages.saturating_sub(n) as u64 + 1) as usize;
                for p in start..(start + n).min(npages) {
                    self.check_anon(slot, p)?;
                }
            }
            Op::Discard => {
                let n = 1 + self.rng.below(32) as usize;
                let start = self.rng.below(npages.saturating_sub(n) as u64 + 1) as usize;
                let n = n.min(npages - start);
                self.anon[slot]
                    .region
                    .discard(start * PAGE, n * PAGE)
                    .map_err(|e| format!("discard: {e}"))?;
                for p in start..start + n {
                    let s = &mut self.anon[slot].pages[p];
                    s.version = 0;
                    s.note(op, self.t0);
                }
            }
            Op::Recreate => {
                let len = self.anon[slot].region.len();
                let region = self
                    .mm
                    .map_anon(len)
                    .map_err(|e| format!("re-creating a region of {len} bytes: {e}"))?;
                self.next_gen += 1;
                self.anon[slot] = AnonSlot {
                    region,
                    gen: self.next_gen,
                    pages: vec![Shadow::default(); len / PAGE],
                };
            }
            Op::FileMapWrite | Op::FileWrite => {
                let n = 1 + self.rng.below(16) as usize;
                let start = self.rng.below(fpages.saturating_sub(n) as u64 + 1) as usize;
                let mut img = [0u8; PAGE];
                for p in start..(start + n).min(fpages) {
                    let s = &mut self.fpages[p];
                    s.version += 1;
                    s.note(op, self.t0);
                    let v = s.version;
                    page_image(self.file_key(p), v, &mut img);
                    if op == Op::FileMapWrite {
                        self.map
                            .write_bytes(p * PAGE, &img)
                            .map_err(|e| format!("store to mapped file page {p}: {e}"))?;
                    } else {
                        let w = self
                            .file
                            .write_at((p * PAGE) as u64, &img)
                            .map_err(|e| format!("write_at of file page {p}: {e}"))?;
                        if w != PAGE {
                            return Err(format!("write_at of file page {p} wrote {w} bytes"));
                        }
                    }
                }
            }
            Op::FileRead => {
                let buffered = self.rng.below(2) == 0;
                let n = 1 + self.rng.below(32) as usize;
                let start = self.rng.below(fpages.saturating_sub(n) as u64 + 1) as usize;
                for p in start..(start + n).min(fpages) {
                    self.check_file(p, buffered)?;
                }
            }
            Op::FileSync => {
                if self.rng.below(2) == 0 {
                    self.map
                        .flush(0, self.map.len())
                        .map_err(|e| format!("msync of the file mapping: {e}"))?;
                } else {
                    self.file
                        .sync()
                        .map_err(|e| format!("fsync of the file: {e}"))?;
                }
                // What the sync covered is on disk: read pages back from the file itself.
                let f = std::fs::File::open(&self.file_path)
                    .map_err(|e| format!("{}: {e}", self.file_path.display()))?;
                let what = format!(
                    "thread {} file {} on disk after a sync",
                    self.id,
                    self.file_path.display()
                );
                for _ in 0..16 {
                    let p = self.rng.below(fpages as u64) as usize;
                    check_image(
                        &what,
                        &self.map,
                        p,
                        self.file_key(p),
                        &self.fpages[p],
                        |got| {
                            std::os::unix::fs::FileExt::read_exact_at(&f, got, (p * PAGE) as u64)
                                .map_err(|e| format!("{}: {e}", self.file_path.display()))
                        },
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// Reads page `page` with `read` and compares it with version `sh.version` of `key`'s image;
/// a mismatch is reported at `page` of `r` (the region the page is or would be mapped in).
fn check_image(
    what: &str,
    r: &Region,
    page: usize,
    key: u64,
    sh: &Shadow,
    read: impl FnOnce(&mut [u8; PAGE]) -> Result<(), String>,
) -> Result<(), String> {
    let (mut got, mut want) = ([0u8; PAGE], [0u8; PAGE]);
    read(&mut got)?;
    page_image(key, sh.version, &mut want);
    if got == want {
        return Ok(());
    }
    Err(mismatch(what, r, page, key, sh, &got, &want))
}

/// Reads page `page` of `r` through the region and checks it (see [`check_image`]).
fn check_page(what: &str, r: &Region, page: usize, key: u64, sh: &Shadow) -> Result<(), String> {
    check_image(what, r, page, key, sh, |got| {
        r.read_bytes(page * PAGE, got)
            .map_err(|e| format!("reading {what} page {page}: {e}"))
    })
}

/// The message for a page that does not hold what its shadow says: where, the first words
/// that differ, which earlier version (if any) it holds instead, and the page's history.
fn mismatch(
    what: &str,
    r: &Region,
    page: usize,
    key: u64,
    sh: &Shadow,
    got: &[u8; PAGE],
    want: &[u8; PAGE],
) -> String {
    let word =
        |b: &[u8; PAGE], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    let first = (0..WORDS)
        .find(|&i| word(got, i) != word(want, i))
        .unwrap_or(0);
    let differing = (0..WORDS)
        .filter(|&i| word(got, i) != word(want, i))
        .count();
    let mut holds = "unknown data".to_string();
    let mut img = [0u8; PAGE];
    for v in (0..=sh.version + 1).rev() {
        page_image(key, v, &mut img);
        if &img == got {
            holds = if v == 0 {
                "zeros".into()
            } else {
                format!("version {v}")
            };
            break;
        }
    }
    format!(
        "MISMATCH in {what}, page {page} (address {:#x}): expected version {}, found {holds}; \
         {differing} of {WORDS} words differ, first at byte {} (found {:#018x}, expected {:#018x}); \
         history: {}",
        r.as_ptr() as usize + page * PAGE,
        sh.version,
        first * 8,
        word(got, first),
        word(want, first),
        sh.describe()
    )
}

/// Counters that stay zero in a correct run, checked at every audit and at the end: any of
/// them nonzero fails the soak, named with its value. The soak injects no faults (it has no
/// fault-injecting device: every tier it runs on is a working one), so the I/O error counters
/// and `oom_poison` (its regions are charged to the commit limit, so memory never runs out
/// under it) count failures nobody asked for. The others are incremented only where usermm's
/// own bookkeeping turned out wrong:
/// * `mm_warn`: an ioctl or madvise that fails only on a usermm bug failed (`warn_on`, a wake,
///   a write-protect, a fault on an empty pool slot);
/// * `pool_slot_lost`: a frame's pool slot did not hold the page its flags promise;
/// * `pgunmap_zapped`: a page in neither its view nor its pool slot: discarded behind the
///   manager's back (the soak discards only through `Region::discard`) or moved away by a bug;
/// * `fault_stale_unmapped`: an entry said its page was mapped (or unmapped) and the view
///   disagreed. Not a benign race: every entry change and its ioctl happen under the entry's
///   lock, so only a path that lost track of a page, or a program changing its view behind the
///   manager's back (the soak never does), leaves the two apart; README.md promises zero in a
///   healthy run and the stress and livelock tests assert it;
/// * `fault_refault_tripwire`, `handler_panic`, `fault_stuck`: the fault path's own alarms
///   (also in `Mm::health`, which is checked as well).
const MUST_STAY_ZERO: [&str; 15] = [
    "mm_warn",
    "pool_slot_lost",
    "pgunmap_zapped",
    "fault_stale_unmapped",
    "fault_refault_tripwire",
    "handler_panic",
    "fault_stuck",
    "swap_read_error",
    "swap_write_error",
    "zswap_writeback_error",
    "oom_poison",
    "file_read_error",
    "file_read_poison",
    "file_write_error",
    "redis_missing_keys",
];

/// Counters reported but not failed on, as they count normal races or a kernel quirk that
/// usermm handles: `uffd_move_unreported` (Linux 6.18's UFFDIO_MOVE moving pages it does not
/// report after an internal retry; usermm recounts them, ARCHITECTURE.md), `uffd_eexist` (a
/// resolving ioctl found the page mapped by another handler first), `file_map_stored_unseen` (a
/// store landed between a clean run's move and its write-protection: the page is made dirty),
/// `uffd_ebusy` (a page the kernel still held pinned after its I/O completed: the fault was
/// retried).
const REPORTED: [&str; 4] = [
    "uffd_move_unreported",
    "uffd_eexist",
    "file_map_stored_unseen",
    "uffd_ebusy",
];

/// The [`MUST_STAY_ZERO`] counters that are not, as a failure message.
fn nonzero_bug_counters(vm: &usermm::Vmstat, when: &str) -> Option<String> {
    let bad: Vec<String> = MUST_STAY_ZERO
        .iter()
        .filter(|k| vm.val(k) > 0)
        .map(|k| format!("{k}={}", vm.val(k)))
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "{when}: counters that stay zero in a correct run (with no injected faults) are \
             not: {} (the log names each occurrence)",
            bad.join(", ")
        )
    })
}

/// Runs the soak; an error (a mismatch, an inconsistency, a stuck fault, a counter of a bug or
/// an I/O error, an unhealthy manager) is a run failure.
pub fn run(cfg: MmConfig, p: &Params) -> Result<(), Failure> {
    if p.anon_bytes / REGIONS < PAGE || p.file_bytes < PAGE {
        // Each thread needs a page per anonymous region from 3x the budget, and a page of file.
        let need = (p.threads * REGIONS * PAGE)
            .div_ceil(3)
            .max(p.threads * PAGE);
        return Err(Failure::Usage(format!(
            "--budget {} bytes is too small for --threads {}: give at least {need} bytes \
             (4k per thread for each of its {REGIONS} regions from 3x the budget) or fewer threads",
            cfg.budget, p.threads
        )));
    }
    let budget = cfg.budget;
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    let swap_name = mm.swap_name();
    std::fs::create_dir_all(&p.dir)
        .map_err(|e| Failure::Run(format!("{}: {e}", p.dir.display())))?;
    let t0 = Instant::now();
    let mut workers = Vec::new();
    let mut paths = Vec::new();
    for t in 0..p.threads {
        let path = p
            .dir
            .join(format!("usermm-soak-{}-{t}.dat", std::process::id()));
        let _ = std::fs::remove_file(&path);
        paths.push(path.clone());
        let file = mm.open(&path).map_err(Failure::run)?;
        file.set_len(p.file_bytes as u64).map_err(Failure::run)?;
        let map = file
            .map(0, p.file_bytes, MapKind::Shared)
            .map_err(Failure::run)?;
        let per = (p.anon_bytes / REGIONS) / PAGE * PAGE;
        let mut anon = Vec::new();
        for g in 0..REGIONS {
            anon.push(AnonSlot {
                region: mm.map_anon(per).map_err(Failure::run)?,
                gen: g as u64,
                pages: vec![Shadow::default(); per / PAGE],
            });
        }
        workers.push(Worker {
            id: t as u64,
            mm: mm.clone(),
            anon,
            file,
            file_path: path,
            map,
            fpages: vec![Shadow::default(); p.file_bytes / PAGE],
            rng: XorShift::new(p.seed ^ mix(t as u64 + 1)),
            t0,
            counts: [0; 10],
            verified_pages: 0,
            next_gen: REGIONS as u64,
            corrupt: t == 0 && std::env::var_os("USERMM_TEST_SOAK_CORRUPT").is_some(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let fail = |f: &Arc<Mutex<Option<String>>>, stop: &AtomicBool, msg: String| {
        let mut g = f.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert(msg);
        stop.store(true, Ordering::Relaxed);
    };
    let ops_done = Arc::new(AtomicU64::new(0));
    // Audits need a quiet manager (`Mm::audit` takes no locks): the monitor raises `pause`,
    // each worker parks between operations and counts itself in `parked`.
    let pause = Arc::new(AtomicBool::new(false));
    let parked = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            let (stop, failure, ops_done) = (stop.clone(), failure.clone(), ops_done.clone());
            let (pause, parked) = (pause.clone(), parked.clone());
            std::thread::Builder::new()
                .name(format!("soak-{}", w.id))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if pause.load(Ordering::Acquire) {
                            parked.fetch_add(1, Ordering::AcqRel);
                            while pause.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            parked.fetch_sub(1, Ordering::AcqRel);
                            continue;
                        }
                        if let Err(e) = w.step() {
                            fail(&failure, &stop, e);
                            break;
                        }
                        ops_done.fetch_add(1, Ordering::Relaxed);
                    }
                    if failure.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                        if let Err(e) = w.verify_all() {
                            fail(&failure, &stop, e);
                        }
                    }
                    (w.counts, w.verified_pages)
                })
                .expect("spawning a soak thread")
        })
        .collect();
    // The monitor: audits and health checks until the time is up or a worker failed.
    let mut audits = 0u64;
    let mut last_audit = Instant::now();
    let mut last_report = Instant::now();
    crate::interrupt::catch_signals()?;
    while t0.elapsed() < p.duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if crate::interrupt::interrupted() {
            fail(&failure, &stop, "interrupted (SIGINT/SIGTERM)".into());
            break;
        }
        if last_audit.elapsed() >= p.audit_every {
            last_audit = Instant::now();
            audits += 1;
            let h = mm.health();
            if !h.is_ok() {
                fail(&failure, &stop, format!("the manager is unhealthy: {h:?}"));
                break;
            }
            if let Some(msg) = nonzero_bug_counters(&mm.vmstat(), "at an audit") {
                fail(&failure, &stop, msg);
                break;
            }
            // Park the workers (one stuck in a fault never parks: that is a failure too),
            // let reclaim finish what it started, then audit.
            pause.store(true, Ordering::Release);
            let t = Instant::now();
            let mut checked = Instant::now();
            while parked.load(Ordering::Acquire) < p.threads as u64 && !stop.load(Ordering::Relaxed)
            {
                // A worker that does not park may be in a fault that never resolves: the
                // watchdog's report of it stops the run at once.
                if checked.elapsed() >= Duration::from_millis(100) {
                    checked = Instant::now();
                    let h = mm.health();
                    if !h.is_ok() {
                        fail(
                            &failure,
                            &stop,
                            format!(
                                "the manager is unhealthy while {} of {} workers have not \
                                 finished their operation: {h:?}",
                                p.threads as u64 - parked.load(Ordering::Acquire),
                                p.threads
                            ),
                        );
                        break;
                    }
                }
                if t.elapsed() > Duration::from_secs(60) {
                    fail(
                        &failure,
                        &stop,
                        format!(
                            "{} of {} workers did not finish their operation within 60 s \
                             (a fault that never resolves?); health: {:?}",
                            p.threads as u64 - parked.load(Ordering::Acquire),
                            p.threads,
                            mm.health()
                        ),
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            mm.settle(Duration::from_secs(2));
            let bad = mm.audit();
            pause.store(false, Ordering::Release);
            if !bad.is_empty() {
                fail(
                    &failure,
                    &stop,
                    format!(
                        "Mm::audit found {} inconsistencies: {}",
                        bad.len(),
                        bad.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
                    ),
                );
                break;
            }
        }
        if !p.json && last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            let vm = mm.vmstat();
            eprintln!(
                "soak: {:.0} s, {} operations, pswpout {} pswpin {} pgmajfault {}",
                t0.elapsed().as_secs_f64(),
                ops_done.load(Ordering::Relaxed),
                vm.val("pswpout"),
                vm.val("pswpin"),
                vm.val("pgmajfault")
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut counts = [0u64; 10];
    let mut verified = 0u64;
    for h in handles {
        match h.join() {
            Ok((c, v)) => {
                for (a, b) in counts.iter_mut().zip(c) {
                    *a += b;
                }
                verified += v;
            }
            Err(_) => fail(&failure, &stop, "a soak thread panicked".into()),
        }
    }
    // A final audit once everything is quiet.
    mm.settle(Duration::from_secs(2));
    let bad = mm.audit();
    if !bad.is_empty() {
        fail(
            &failure,
            &stop,
            format!("Mm::audit at the end: {}", bad.join("; ")),
        );
    }
    audits += 1;
    let elapsed = t0.elapsed().as_secs_f64();
    let vm = mm.vmstat();
    let h = mm.health();
    if !h.is_ok() {
        fail(
            &failure,
            &stop,
            format!("the manager is unhealthy at the end: {h:?}"),
        );
    }
    if let Some(msg) = nonzero_bug_counters(&vm, "at the end") {
        fail(&failure, &stop, msg);
    }
    for path in &paths {
        let _ = std::fs::remove_file(path);
    }
    let failure = failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let keys: Vec<&str> = [
        "pswpout",
        "pswpin",
        "pgmajfault",
        "pgsteal_kswapd",
        "pgsteal_direct",
        "allocstall",
        "nr_written",
    ]
    .into_iter()
    .chain(MUST_STAY_ZERO)
    .chain(REPORTED)
    .collect();
    if p.json {
        let ops: serde_json::Map<String, serde_json::Value> = OPS
            .iter()
            .zip(counts)
            .map(|(o, n)| (o.name().to_string(), n.into()))
            .collect();
        let v: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .map(|k| (k.to_string(), vm.val(k).into()))
            .collect();
        println!(
            "{}",
            json!({
                "benchmark": "soak",
                "ok": failure.is_none(),
                "failure": failure,
                "seconds": elapsed,
                "threads": p.threads,
                "budget_bytes": budget,
                "swap": swap_name,
                "anon_bytes_per_thread": p.anon_bytes,
                "file_bytes_per_thread": p.file_bytes,
                "seed": p.seed,
                "operations": ops,
                "pages_verified": verified,
                "audits": audits,
                "stuck_faults_reported": h.stuck_reported,
                "vmstat": v,
            })
        );
    } else {
        println!(
            "soak: {elapsed:.1} s, {} threads, budget {} MiB, swap {swap_name}",
            p.threads,
            budget >> 20
        );
        let mut line = String::new();
        for (o, n) in OPS.iter().zip(counts) {
            let _ = write!(line, " {}={n}", o.name());
        }
        println!("operations:{line}");
        println!(
            "pages verified: {verified} ({} MiB); audits: {audits}",
            (verified * PAGE as u64) >> 20
        );
        let mut line = String::new();
        for k in &keys {
            let _ = write!(line, " {k}={}", vm.val(k));
        }
        println!("vmstat:{line}");
        println!(
            "result: {}",
            failure.as_deref().map_or(
                "OK (no mismatch, no inconsistency, no stuck fault, no bug counter)".into(),
                |f| format!("FAILED: {f}")
            )
        );
    }
    match failure {
        None => Ok(()),
        Some(f) => Err(Failure::Run(f)),
    }
}

/// Parses a duration like `30m`, `90s`, `1h`, `2m30s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration; give e.g. 3m, 90s or 1h".into());
    }
    if let Ok(n) = t.parse::<u64>() {
        if n == 0 {
            return Err(format!("{s:?}: the duration must be at least 1 s"));
        }
        return Ok(Duration::from_secs(n));
    }
    let mut total = 0u64;
    let mut num = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => {
                return Err(format!(
                    "{s:?}: unknown unit '{c}'; give e.g. 3m, 90s, 1h or 2m30s"
                ))
            }
        };
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?}: a number must come before '{c}'; give e.g. 3m"))?;
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(|| format!("{s:?}: too long"))?;
        num.clear();
    }
    if !num.is_empty() {
        return Err(format!("{s:?}: a unit (h, m, s) must follow {num}"));
    }
    if total == 0 {
        return Err(format!("{s:?}: the duration must be at least 1 s"));
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_or_name_the_problem() {
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        for bad in ["", "0", "3x", "m", "5m3", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn page_images_differ_by_version_and_key() {
        let (mut a, mut b) = ([0u8; PAGE], [0u8; PAGE]);
        page_image(1, 1, &mut a);
        page_image(1, 2, &mut b);
        assert_ne!(a, b);
        page_image(2, 1, &mut b);
        assert_ne!(a, b);
        page_image(1, 0, &mut b);
        assert!(b.iter().all(|&x| x == 0));
    }
}
