//! A swap device alone, without a memory manager: sequential writes and reads of runs of
//! pages from several threads, as reclaim and swap-in readahead issue them. Separates the
//! device's (and its server's) throughput from the core's.
//!
//! Run: `cargo run --release -p usermm --example swapdev -- SPEC [MIB] [RUN_PAGES] [THREADS] [ROUNDS]`
//! (each round writes, reads and discards every slot; a second round shows a server whose
//! memory is warm: a Redis node faults in and zeroes fresh pages for new data)
//! e.g. with a cluster from bench/redis-cluster.sh:
//! `USERMM_REDIS_PASSWORD=... cargo run --release -p usermm --example swapdev -- "$SWAP" 512 128 2`

use std::sync::Arc;
use std::time::Instant;

use usermm::swap::SwapConfig;
use usermm_sys::{Mapping, PAGE_SIZE};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(spec) = args.get(1) else {
        eprintln!("usage: swapdev SPEC [MIB] [RUN_PAGES] [THREADS] [ROUNDS]");
        std::process::exit(2);
    };
    let arg = |i: usize, d: usize| {
        args.get(i).map_or(d, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("argument {i} ({s:?}) is not a number");
                std::process::exit(2)
            })
        })
    };
    let (mib, run, threads, rounds) = (arg(2, 512), arg(3, 128), arg(4, 1).max(1), arg(5, 1));
    let pages = (mib << 20) / PAGE_SIZE;
    let cfg = SwapConfig::parse(spec, (pages * PAGE_SIZE) as u64).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let dev = match cfg.open() {
        Ok(Some(d)) => d,
        Ok(None) => {
            eprintln!("{spec}: no device");
            std::process::exit(2)
        }
        Err(e) => {
            eprintln!("{spec}: {e}");
            std::process::exit(1)
        }
    };
    println!(
        "{} ({mib} MiB, runs of {run} pages, {threads} thread(s))",
        dev.name()
    );
    let per = pages / threads / run * run;
    for round in 1..=rounds {
        for write in [true, false] {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let dev = Arc::clone(&dev);
                    s.spawn(move || {
                        let pool = Mapping::anon(run * PAGE_SIZE, 0).unwrap();
                        let offs: Vec<usize> = (0..run).map(|i| i * PAGE_SIZE).collect();
                        for i in 0..run {
                            pool.write_u64(i * PAGE_SIZE, (t * per + i) as u64);
                        }
                        for first in (t * per..(t + 1) * per).step_by(run) {
                            if write {
                                dev.write_pages(first as u64, &pool, &offs).unwrap();
                            } else {
                                dev.read_pages(first as u64, &pool, &offs).unwrap();
                            }
                        }
                    });
                }
            });
            let secs = t0.elapsed().as_secs_f64();
            let bytes = (per * threads * PAGE_SIZE) as f64;
            println!(
                "round {round} {}: {:.0} MiB/s ({:.2} s)",
                if write { "write" } else { "read" },
                bytes / secs / f64::from(1 << 20),
                secs
            );
        }
        let all = (per * threads) as u64;
        for first in (0..all).step_by(256) {
            dev.discard(first, 256.min(all - first)).unwrap();
        }
    }
}
