//! `usermm bench dd`: the workload of seed 002 (mm: non-atomically mark page accessed): `dd
//! if=/dev/zero of=FILE bs=1M count=N`, repeated, the file deleted after each iteration, writes
//! going through a page cache. Each iteration prints GNU dd's summary line (`N bytes (X MB, Y
//! MiB) copied, T s, R MB/s`, the line LKP's stats/vm-scalability parses); `--fdatasync` is
//! dd's `conv=fdatasync` (one fdatasync before the iteration's clock stops).
//!
//! The loop is written against [`Target`] / [`WriteAt`] ("create a file, write this buffer at
//! this offset, sync, remove"): [`KernelDir`] is a directory on the local filesystem (the
//! kernel's page cache, `--engine kernel`; `--memory` uses /dev/shm, a tmpfs), [`UsermmDir`]
//! writes through usermm's page cache (`CachedFile::write_at`; `--memory` makes in-memory
//! files). The counters behind seed 002 are `mark_page_accessed` (atomic marking of a visible
//! page) and `init_page_accessed` (a plain store before insertion).

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::usemem::Sampler;
use crate::counters::{memcg_is_state, vmstat_is_state, Counters};
use crate::output::mib;
use crate::report::fmt_g;
use crate::Failure;

/// A file being written.
pub trait WriteAt {
    /// Writes all of `buf` at byte offset `off`.
    fn write_at(&mut self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Flushes the file's data to its backing store (fdatasync).
    fn sync_data(&mut self) -> io::Result<()>;
}

/// Where the files go.
pub trait Target {
    type File: WriteAt;
    /// Creates (or truncates) file `name`.
    fn create(&self, name: &str) -> io::Result<Self::File>;
    /// Deletes file `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
}

impl WriteAt for fs::File {
    fn write_at(&mut self, buf: &[u8], off: u64) -> io::Result<()> {
        self.write_all_at(buf, off)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        fs::File::sync_data(self)
    }
}

/// A directory on a kernel filesystem: files through the kernel's page cache.
pub struct KernelDir {
    pub dir: PathBuf,
}

impl Target for KernelDir {
    type File = fs::File;
    fn create(&self, name: &str) -> io::Result<fs::File> {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join(name))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.dir.join(name))
    }
}

/// usermm's page cache: files in a directory, or in-memory files.
pub struct UsermmDir {
    pub mm: usermm::Mm,
    pub dir: PathBuf,
    pub memory: bool,
}

/// A file of usermm's page cache.
pub struct UsermmFile(usermm::CachedFile);

impl WriteAt for UsermmFile {
    fn write_at(&mut self, buf: &[u8], off: u64) -> io::Result<()> {
        self.0
            .write_at(off, buf)
            .map(|_| ())
            .map_err(|e| io::Error::other(e.to_string()))
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync().map_err(|e| io::Error::other(e.to_string()))
    }
}

impl Target for UsermmDir {
    type File = UsermmFile;
    fn create(&self, name: &str) -> io::Result<UsermmFile> {
        let f = if self.memory {
            self.mm.memfile(name)
        } else {
            self.mm.open(self.dir.join(name))
        }
        .map_err(|e| io::Error::other(e.to_string()))?;
        f.set_len(0).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(UsermmFile(f))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        if self.memory {
            // The in-memory file went with its last handle.
            return Ok(());
        }
        fs::remove_file(self.dir.join(name))
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DdParams {
    /// Block size (dd's bs).
    pub bs: u64,
    /// Blocks per file (dd's count).
    pub count: u64,
    /// Times the file is written and deleted.
    pub iterations: u32,
    /// conv=fdatasync.
    pub fdatasync: bool,
    /// Directory of the file.
    pub dir: PathBuf,
    /// In-memory files (usermm) / a tmpfs directory (kernel: /dev/shm): the tmpfs case.
    #[serde(default)]
    pub memory: bool,
}

impl DdParams {
    pub fn file_bytes(&self) -> u64 {
        self.bs * self.count
    }
}

/// One iteration.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Iteration {
    pub bytes: u64,
    pub secs: f64,
}

impl Iteration {
    /// GNU dd's summary line.
    pub fn line(&self) -> String {
        dd_line(self.bytes, self.secs)
    }
    pub fn mibs(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.secs.max(1e-9)
    }
}

/// What a dd run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DdOutcome {
    pub iterations: Vec<Iteration>,
    pub vmstat: Counters,
    pub memcg: Option<Counters>,
}

/// GNU coreutils' human-readable size (`human_autoscale | human_round_to_nearest |
/// human_space_before_unit`): three significant figures at most, one decimal below 10.
fn human(v: f64, base: f64, units: &[&str]) -> String {
    let mut x = v;
    let mut i = 0;
    while x >= base && i + 1 < units.len() {
        x /= base;
        i += 1;
    }
    if x < 10.0 && i > 0 {
        // Rounded to one decimal; 9.96 rounds up to 10 and is printed as an integer.
        let r = (x * 10.0).round() / 10.0;
        if r < 10.0 {
            return format!("{r:.1} {}", units[i]);
        }
    }
    format!("{:.0} {}", x.round(), units[i])
}

/// `N bytes (X MB, Y MiB) copied, T s, R MB/s` as GNU dd prints it.
pub fn dd_line(bytes: u64, secs: f64) -> String {
    let si = human(bytes as f64, 1000.0, &["B", "kB", "MB", "GB", "TB"]);
    let iec = human(bytes as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"]);
    let rate = human(
        bytes as f64 / secs.max(1e-9),
        1000.0,
        &["B/s", "kB/s", "MB/s", "GB/s", "TB/s"],
    );
    format!(
        "{bytes} bytes ({si}, {iec}) copied, {} s, {rate}",
        fmt_g(secs, 6)
    )
}

/// Runs the dd loop into `target`. Counters come from `sampler` (over all iterations).
pub fn execute<T: Target>(
    target: &T,
    p: &DdParams,
    sampler: &dyn Sampler,
) -> Result<DdOutcome, Failure> {
    let bs = usize::try_from(p.bs)
        .map_err(|_| Failure::Usage(format!("--bs: {} bytes is too large", p.bs)))?;
    let buf = vec![0u8; bs];
    let name = format!("usermm-dd-{}", std::process::id());
    let vm0 = sampler.vmstat();
    let cg0 = sampler.memcg();
    let mut its = Vec::with_capacity(p.iterations as usize);
    for _ in 0..p.iterations {
        let t0 = Instant::now();
        let mut f = target
            .create(&name)
            .map_err(|e| Failure::Run(format!("dd: cannot create {name}: {e}")))?;
        let mut off = 0;
        for _ in 0..p.count {
            f.write_at(&buf, off)
                .map_err(|e| Failure::Run(format!("dd: write at {off}: {e}")))?;
            off += p.bs;
            if crate::interrupt::interrupted() {
                let _ = target.remove(&name);
                return Err(Failure::Interrupted);
            }
        }
        if p.fdatasync {
            f.sync_data()
                .map_err(|e| Failure::Run(format!("dd: fdatasync: {e}")))?;
        }
        drop(f);
        let secs = t0.elapsed().as_secs_f64();
        target
            .remove(&name)
            .map_err(|e| Failure::Run(format!("dd: cannot remove {name}: {e}")))?;
        its.push(Iteration { bytes: off, secs });
    }
    let vmstat = sampler.vmstat().delta(&vm0, vmstat_is_state);
    let memcg = match (sampler.memcg(), cg0) {
        (Some(now), Some(before)) => Some(now.delta(&before, memcg_is_state)),
        _ => None,
    };
    Ok(DdOutcome {
        iterations: its,
        vmstat,
        memcg,
    })
}

/// The counters the text summary shows.
const DD_COUNTERS: &[&str] = &[
    "mark_page_accessed",
    "init_page_accessed",
    "nr_dirtied",
    "nr_written",
    "balance_dirty_pages",
    "pgpgout",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "allocstall",
    "pgactivate",
    "pgdeactivate",
    "pgrotated",
    "nr_dirty",
    "nr_writeback",
];

/// A dd run's report.
pub struct DdReport {
    pub engine: &'static str,
    pub params: DdParams,
    pub budget_bytes: u64,
    pub outcome: DdOutcome,
    pub setup: Map<String, Value>,
}

impl DdReport {
    pub fn total_secs(&self) -> f64 {
        self.outcome.iterations.iter().map(|i| i.secs).sum()
    }

    /// Bytes over time, all iterations (MiB/s).
    pub fn throughput_mibs(&self) -> f64 {
        let bytes: u64 = self.outcome.iterations.iter().map(|i| i.bytes).sum();
        bytes as f64 / (1 << 20) as f64 / self.total_secs().max(1e-9)
    }

    /// The longest iteration (mmtests' "Max elapsed").
    pub fn max_secs(&self) -> f64 {
        self.outcome
            .iterations
            .iter()
            .map(|i| i.secs)
            .fold(0.0, f64::max)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "workload": "dd",
            "engine": self.engine,
            "bs": self.params.bs,
            "count": self.params.count,
            "iterations": self.params.iterations,
            "fdatasync": self.params.fdatasync,
            "dir": self.params.dir.display().to_string(),
            "budget_bytes": self.budget_bytes,
            "throughput_mibs": self.throughput_mibs(),
            "elapsed_s": self.total_secs(),
            "max_elapsed_s": self.max_secs(),
            "per_iteration": self.outcome.iterations.iter().map(|i| json!({
                "bytes": i.bytes, "secs": i.secs, "mibs": i.mibs(),
            })).collect::<Vec<_>>(),
            "vmstat": self.outcome.vmstat.to_json(),
            "memcg": self.outcome.memcg.as_ref().map(Counters::to_json),
            "setup": self.setup,
        })
    }

    /// dd's lines (stdout, or stderr with JSON), then the summary or the JSON object.
    pub fn print(&self, json_out: bool) -> Result<(), Failure> {
        for i in &self.outcome.iterations {
            if json_out {
                eprintln!("{}", i.line());
            } else {
                println!("{}", i.line());
            }
        }
        if json_out {
            println!(
                "{}",
                serde_json::to_string_pretty(&self.to_json()).map_err(Failure::run)?
            );
            return Ok(());
        }
        let p = &self.params;
        println!(
            "dd [{}]: {} x {} (bs {}, count {}) in {}, fdatasync {}, budget {}",
            self.engine,
            p.iterations,
            mib(p.file_bytes()),
            mib(p.bs),
            p.count,
            p.dir.display(),
            if p.fdatasync { "on" } else { "off" },
            mib(self.budget_bytes)
        );
        if !self.setup.is_empty() {
            let items: Vec<String> = self
                .setup
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k} {s}"),
                    other => format!("{k} {other}"),
                })
                .collect();
            println!("{}: {}", self.engine, items.join(", "));
        }
        println!(
            "elapsed {:.3} s, throughput {:.0} MiB/s, max iteration {:.3} s",
            self.total_secs(),
            self.throughput_mibs(),
            self.max_secs()
        );
        let shown: Vec<String> = DD_COUNTERS
            .iter()
            .filter_map(|k| self.outcome.vmstat.get(k).map(|v| format!("{k} {v}")))
            .collect();
        println!("vmstat: {}", shown.join(", "));
        if let Some(m) = &self.outcome.memcg {
            let moved: Vec<String> = m
                .iter()
                .filter(|(k, v)| {
                    *v > 0
                        && (k.starts_with("pg") || *k == "file" || *k == "cache" || *k == "dirty")
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("memcg: {}", moved.join(", "));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    #[test]
    fn gnu_dd_lines() {
        assert_eq!(
            dd_line(104_857_600, 0.0424584),
            "104857600 bytes (105 MB, 100 MiB) copied, 0.0424584 s, 2.5 GB/s"
        );
        assert_eq!(
            dd_line(1_048_576, 0.5),
            "1048576 bytes (1.0 MB, 1.0 MiB) copied, 0.5 s, 2.1 MB/s"
        );
        assert_eq!(
            dd_line(10_485_760_000, 12.0),
            "10485760000 bytes (10 GB, 9.8 GiB) copied, 12 s, 874 MB/s"
        );
    }

    /// An in-memory target that records what was written where: the loop's contract for the
    /// usermm side.
    #[derive(Default)]
    struct Recorder {
        files: RefCell<BTreeMap<String, Vec<(u64, usize)>>>,
        syncs: RefCell<u32>,
        removed: RefCell<u32>,
    }
    struct RecFile<'a>(&'a Recorder, String);
    impl WriteAt for RecFile<'_> {
        fn write_at(&mut self, buf: &[u8], off: u64) -> io::Result<()> {
            assert!(buf.iter().all(|&b| b == 0));
            self.0
                .files
                .borrow_mut()
                .get_mut(&self.1)
                .unwrap()
                .push((off, buf.len()));
            Ok(())
        }
        fn sync_data(&mut self) -> io::Result<()> {
            *self.0.syncs.borrow_mut() += 1;
            Ok(())
        }
    }
    impl<'r> Target for &'r Recorder {
        type File = RecFile<'r>;
        fn create(&self, name: &str) -> io::Result<RecFile<'r>> {
            self.files.borrow_mut().insert(name.to_string(), Vec::new());
            Ok(RecFile(self, name.to_string()))
        }
        fn remove(&self, _name: &str) -> io::Result<()> {
            *self.removed.borrow_mut() += 1;
            Ok(())
        }
    }
    struct NoCounters;
    impl Sampler for NoCounters {
        fn vmstat(&self) -> Counters {
            Counters::default()
        }
    }

    #[test]
    fn loop_writes_sequential_blocks_syncs_and_removes() {
        let rec = Recorder::default();
        let p = DdParams {
            bs: 4096,
            count: 3,
            iterations: 2,
            fdatasync: true,
            dir: PathBuf::from("/unused"),
            memory: false,
        };
        let out = execute(&&rec, &p, &NoCounters).unwrap();
        assert_eq!(out.iterations.len(), 2);
        assert!(out.iterations.iter().all(|i| i.bytes == 3 * 4096));
        let files = rec.files.borrow();
        let writes = files.values().next().unwrap();
        assert_eq!(writes, &vec![(0, 4096), (4096, 4096), (8192, 4096)]);
        assert_eq!(*rec.syncs.borrow(), 2);
        assert_eq!(*rec.removed.borrow(), 2);
    }

    #[test]
    fn kernel_dir_writes_a_real_file_and_removes_it() {
        let dir = std::env::temp_dir().join(format!("usermm-dd-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = DdParams {
            bs: 65536,
            count: 4,
            iterations: 2,
            fdatasync: false,
            dir: dir.clone(),
            memory: false,
        };
        let out = execute(&KernelDir { dir: dir.clone() }, &p, &NoCounters).unwrap();
        assert_eq!(out.iterations[1].bytes, 4 * 65536);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "file left behind");
        fs::remove_dir(&dir).unwrap();
    }
}
