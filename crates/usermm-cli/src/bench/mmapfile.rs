//! `usermm bench mmap-file`: sequential write then read of a shared file mapping larger than the
//! budget, one 8-byte store (then load) per 64 bytes; the write pass ends with a flush
//! (msync(MS_SYNC)), the read pass starts cold (the pages left the cache with the last close).
//! The kernel side is `bench/mmapseq.c` under a memory cgroup (bench/run-pagecache.sh).

use std::time::Instant;

use serde_json::json;
use usermm::{MapKind, Mm, MmConfig};

use crate::Failure;

/// Runs the benchmark on a file of `size` bytes in `dir`.
pub fn run(cfg: MmConfig, size: u64, dir: &std::path::Path, as_json: bool) -> Result<(), Failure> {
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    let path = dir.join(format!("usermm-mmapfile-{}", std::process::id()));
    let len = size as usize;
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(path.clone());
    let before = mm.vmstat();
    let (w, wv) = {
        let f = mm.open(&path).map_err(Failure::run)?;
        f.set_len(size).map_err(Failure::run)?;
        let r = f.map(0, len, MapKind::Shared).map_err(Failure::run)?;
        let t = Instant::now();
        for off in (0..len).step_by(64) {
            r.write_u64(off, off as u64);
        }
        r.flush(0, len).map_err(Failure::run)?;
        (t.elapsed().as_secs_f64(), mm.vmstat().delta(&before))
    };
    let mid = mm.vmstat();
    let (rd, bad) = {
        let f = mm.open(&path).map_err(Failure::run)?;
        let r = f.map(0, len, MapKind::Shared).map_err(Failure::run)?;
        let t = Instant::now();
        let mut bad = 0u64;
        for off in (0..len).step_by(64) {
            bad += (r.read_u64(off) != off as u64) as u64;
        }
        (t.elapsed().as_secs_f64(), bad)
    };
    let rv = mm.vmstat().delta(&mid);
    if bad != 0 {
        return Err(Failure::Run(format!("{bad} words read back wrong")));
    }
    let mib = size as f64 / (1 << 20) as f64;
    let keys = [
        "pgfault",
        "pgmajfault",
        "wp_fault",
        "fault_around_pages",
        "nr_written",
        "pgsteal_file",
        "file_ra",
        "pgpgin",
        "pgpgout",
    ];
    if as_json {
        let pick = |v: &usermm::Vmstat| {
            keys.iter()
                .map(|k| (k.to_string(), json!(v.val(k))))
                .collect::<serde_json::Map<_, _>>()
        };
        println!(
            "{}",
            json!({
                "workload": "mmap-file", "engine": "usermm", "size": size,
                "budget": mm.budget(), "write_mib_s": mib / w, "read_mib_s": mib / rd,
                "peak_resident_bytes": mm.peak_resident_bytes(),
                "write_vmstat": pick(&wv), "read_vmstat": pick(&rv),
            })
        );
    } else {
        println!(
            "mmap-file {mib:.0} MiB, budget {} MiB: write {:.0} MiB/s (incl. flush), read {:.0} MiB/s; peak resident {} MiB",
            mm.budget() >> 20,
            mib / w,
            mib / rd,
            mm.peak_resident_bytes() >> 20
        );
        let line = |v: &usermm::Vmstat| {
            keys.iter()
                .map(|k| format!("{k} {}", v.val(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!("write: {}", line(&wv));
        println!("read:  {}", line(&rv));
    }
    Ok(())
}
