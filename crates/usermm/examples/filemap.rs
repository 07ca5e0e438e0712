//! Page-cache measurements behind ARCHITECTURE.md and the page-cache issue's note:
//! 1. buffered sequential write and read of a file 4x the budget through `CachedFile`
//!    (MiB/s, with the counters that show readahead, flusher writeback and reclaim);
//! 2. the same file through a shared file region (sequential stores, then a flush);
//! 3. the dirty-tracking cost of a shared region: the first store to a clean mapped page is a
//!    write-protect fault (p50/p99), a second store to it is a plain store.
//!
//! Run: `cargo run --release -p usermm --example filemap -- [BUDGET_MIB] [DIR]`.

use std::time::Instant;

use usermm::{MapKind, Mm, MmConfig, SwapConfig};

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((q * v.len() as f64) as usize).min(v.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let budget_mib: u64 = args.get(1).map_or(256, |s| s.parse().expect("BUDGET_MIB"));
    let dir = std::path::PathBuf::from(args.get(2).map_or("/var/tmp", |s| s.as_str()));
    let budget = budget_mib << 20;
    let total = 4 * budget;
    let mm = Mm::new(MmConfig::new(budget).swap(SwapConfig::Ram { size: budget })).unwrap();
    let path = dir.join(format!("usermm-filemap-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);

    // 1. Buffered write + sync, then a cold sequential read.
    let f = mm.open(&path).unwrap();
    let buf = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    for off in (0..total).step_by(buf.len()) {
        f.write_at(off, &buf).unwrap();
    }
    let w_s = t.elapsed().as_secs_f64();
    f.sync().unwrap();
    let ws_s = t.elapsed().as_secs_f64();
    let v = mm.vmstat();
    println!(
        "buffered write {} MiB: {:.0} MiB/s ({:.0} MiB/s incl. sync); throttled {} times {:.0} ms, flusher wrote {} pages, reclaim stole {} file pages, written by kswapd {}",
        total >> 20,
        (total >> 20) as f64 / w_s,
        (total >> 20) as f64 / ws_s,
        v.val("balance_dirty_pages"),
        v.val("balance_dirty_pages_us") as f64 / 1000.0,
        v.val("nr_written"),
        v.val("pgsteal_file"),
        v.val("nr_vmscan_write"),
    );
    let before = mm.vmstat();
    let mut rbuf = vec![0u8; 1 << 20];
    let t = Instant::now();
    for off in (0..total).step_by(rbuf.len()) {
        f.read_at(off, &mut rbuf).unwrap();
        assert_eq!(rbuf[4095], 0x5a);
    }
    let r_s = t.elapsed().as_secs_f64();
    let v = mm.vmstat().delta(&before);
    println!(
        "buffered read {} MiB: {:.0} MiB/s; readahead pages {}, marker hits {}, pgpgin {} KiB",
        total >> 20,
        (total >> 20) as f64 / r_s,
        v.val("file_ra"),
        v.val("file_ra_hit"),
        v.val("pgpgin")
    );
    drop(f);

    // 2. Shared mapping: sequential stores over the whole file, then flush.
    let r = mm
        .map_file(&path, 0, total as usize, MapKind::Shared)
        .unwrap();
    let before = mm.vmstat();
    let t = Instant::now();
    for off in (0..total as usize).step_by(4096) {
        r.write_u64(off, off as u64);
    }
    let m_s = t.elapsed().as_secs_f64();
    r.flush(0, r.len()).unwrap();
    let mf_s = t.elapsed().as_secs_f64();
    let v = mm.vmstat().delta(&before);
    println!(
        "shared mapping, one store per page over {} MiB: {:.0} MiB/s ({:.0} incl. flush); faults {}, major {}, wp {}",
        total >> 20,
        (total >> 20) as f64 / m_s,
        (total >> 20) as f64 / mf_s,
        v.val("pgfault"),
        v.val("pgmajfault"),
        v.val("wp_fault")
    );
    drop(r);

    // 3. Dirty tracking: first store to a clean mapped page vs a second store.
    let n = 4096usize;
    let r = mm.map_file(&path, 0, n * 4096, MapKind::Shared).unwrap();
    for i in 0..n {
        let _ = r.read_u64(i * 4096);
    }
    r.flush(0, r.len()).unwrap();
    // Reading maps clean pages write-protected.
    for i in 0..n {
        let _ = r.read_u64(i * 4096);
    }
    let mut first = Vec::with_capacity(n);
    let mut second = Vec::with_capacity(n);
    let wp0 = mm.vmstat().val("wp_fault");
    for i in 0..n {
        let t = Instant::now();
        r.write_u64(i * 4096, 1);
        first.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        r.write_u64(i * 4096 + 8, 2);
        second.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let wps = mm.vmstat().val("wp_fault") - wp0;
    println!(
        "dirty tracking: first store to a clean mapped page p50 {:.1} us p99 {:.1} us ({wps} wp faults for {n} pages); second store p50 {:.3} us",
        pct(&mut first, 0.5),
        pct(&mut first, 0.99),
        pct(&mut second, 0.5)
    );
    drop(r);
    let _ = std::fs::remove_file(&path);
}
