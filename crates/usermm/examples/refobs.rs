//! Reference observation candidates, measured side by side (ARCHITECTURE.md, "decisions").
//!
//! The kernel reads accessed bits; user space cannot. Both candidates unmap a page and count the
//! next fault on it as the reference:
//! (A) private anonymous view + a registered pool: unmap = UFFDIO_MOVE view -> pool,
//!     reference fault = MISSING, resolved by UFFDIO_MOVE back (what usermm does);
//! (B) MAP_SHARED memfd view registered MINOR + an unregistered alias: unmap = MADV_DONTNEED on
//!     the view (the page stays in the memfd), reference fault = MINOR, resolved by
//!     UFFDIO_CONTINUE.
//! A handler thread spins on a non-blocking uffd read (as usermm's handlers do while busy).
//! Run: `cargo run --release -p usermm --example refobs -- [PAGES] [REPS]`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use usermm_sys::uffd::{feature, mode, Msg, OpenPolicy, Uffd};
use usermm_sys::{memfd, Advice, Mapping, PAGE_SIZE};

#[derive(Clone, Copy, PartialEq)]
enum Cand {
    Move,
    Continue,
}

struct Setup {
    uffd: Arc<Uffd>,
    view: Arc<Mapping>,
    pool: Option<Mapping>,
    _alias: Option<Mapping>,
    _file: Option<std::fs::File>,
}

fn setup(c: Cand, pages: usize) -> Setup {
    let len = pages * PAGE_SIZE;
    let uffd = Arc::new(
        Uffd::open(feature::MOVE | feature::MINOR_SHMEM, OpenPolicy::Auto).expect("userfaultfd"),
    );
    match c {
        Cand::Move => {
            let view = Mapping::anon(len, 0).unwrap();
            let pool = Mapping::anon(len, 0).unwrap();
            for m in [&view, &pool] {
                m.advise(0, len, Advice::NoHugePage).unwrap();
            }
            for p in 0..pages {
                view.write_u64(p * PAGE_SIZE, p as u64);
            }
            uffd.register(view.addr(), len, mode::MISSING | mode::WP)
                .unwrap();
            uffd.register(pool.addr(), len, mode::MISSING | mode::WP)
                .unwrap();
            Setup {
                uffd,
                view: Arc::new(view),
                pool: Some(pool),
                _alias: None,
                _file: None,
            }
        }
        Cand::Continue => {
            let f = memfd("refobs", len as u64).unwrap();
            let alias = Mapping::shared(&f, len).unwrap();
            let view = Mapping::shared(&f, len).unwrap();
            for p in 0..pages {
                alias.write_u64(p * PAGE_SIZE, p as u64);
            }
            uffd.register(view.addr(), len, mode::MINOR).unwrap();
            Setup {
                uffd,
                view: Arc::new(view),
                pool: None,
                _alias: Some(alias),
                _file: Some(f),
            }
        }
    }
}

/// Unmaps every page in batches of `batch`; returns ns per page.
fn unmap(s: &Setup, c: Cand, pages: usize, batch: usize) -> f64 {
    let t = Instant::now();
    let mut p = 0;
    while p < pages {
        let n = batch.min(pages - p);
        let off = p * PAGE_SIZE;
        match c {
            Cand::Move => {
                let pool = s.pool.as_ref().unwrap();
                s.uffd
                    .move_pages(
                        pool.addr() + off,
                        s.view.addr() + off,
                        n * PAGE_SIZE,
                        false,
                        true,
                    )
                    .unwrap();
            }
            Cand::Continue => s.view.advise(off, n * PAGE_SIZE, Advice::DontNeed).unwrap(),
        }
        p += n;
    }
    t.elapsed().as_nanos() as f64 / pages as f64
}

/// Touches every page (sequentially); a spinning handler resolves each fault. Returns the
/// touch latencies in ns.
fn touch_all(s: &Setup, c: Cand, pages: usize) -> Vec<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let (u, stop2, view) = (s.uffd.clone(), stop.clone(), s.view.clone());
    let pool_addr = s.pool.as_ref().map(|p| p.addr());
    let h = std::thread::spawn(move || {
        let mut msgs = [Msg::default(); 16];
        while !stop2.load(Ordering::Relaxed) {
            let n = u.read_msgs(&mut msgs).unwrap();
            for m in &msgs[..n] {
                let addr = m.fault_address() & !(PAGE_SIZE - 1);
                let off = addr - view.addr();
                match c {
                    Cand::Move => {
                        let _ =
                            u.move_pages(addr, pool_addr.unwrap() + off, PAGE_SIZE, false, false);
                    }
                    Cand::Continue => {
                        let _ = u.continue_(addr, PAGE_SIZE, false);
                    }
                }
            }
            if n == 0 {
                std::hint::spin_loop();
            }
        }
    });
    let mut lat = Vec::with_capacity(pages);
    for p in 0..pages {
        let t = Instant::now();
        let v = s.view.read_u64(p * PAGE_SIZE);
        lat.push(t.elapsed().as_nanos() as u64);
        assert_eq!(v, p as u64, "page {p} lost its contents");
    }
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    lat
}

fn pct(v: &mut [u64], q: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q) as usize] as f64 / 1000.0
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pages: usize = args.get(1).map_or(16384, |s| s.parse().unwrap());
    let reps: usize = args.get(2).map_or(5, |s| s.parse().unwrap());
    let names = [
        "A: MOVE to pool / MOVE back",
        "B: memfd DONTNEED / CONTINUE",
    ];
    let mut rows: Vec<Vec<[f64; 5]>> = vec![vec![], vec![]];
    for _ in 0..reps {
        for (i, c) in [Cand::Move, Cand::Continue].into_iter().enumerate() {
            let s = setup(c, pages);
            if c == Cand::Continue {
                touch_all(&s, c, pages); // map everything through the view first
            }
            let u32_ = unmap(&s, c, pages, 32);
            let t0 = Instant::now();
            let mut lat = touch_all(&s, c, pages);
            let thr = pages as f64 / t0.elapsed().as_secs_f64();
            let u1 = unmap(&s, c, pages.min(4096), 1);
            rows[i].push([u32_, u1, pct(&mut lat, 0.5), pct(&mut lat, 0.99), thr]);
        }
    }
    println!("{pages} pages, {reps} reps, median [min-max]; handler spins on a non-blocking read");
    println!("| candidate | unmap, 32-page batch (ns/page) | unmap, 1 page (ns/page) | reference fault p50 (us) | p99 (us) | sequential re-touch (pages/s) |");
    println!("|---|---|---|---|---|---|");
    for (i, n) in names.iter().enumerate() {
        let col = |k: usize| {
            let (m, lo, hi) = median(rows[i].iter().map(|r| r[k]).collect());
            if k == 4 {
                format!("{:.0}k [{:.0}k-{:.0}k]", m / 1e3, lo / 1e3, hi / 1e3)
            } else if k < 2 {
                format!("{m:.0} [{lo:.0}-{hi:.0}]")
            } else {
                format!("{m:.1} [{lo:.1}-{hi:.1}]")
            }
        };
        println!(
            "| {n} | {} | {} | {} | {} | {} |",
            col(0),
            col(1),
            col(2),
            col(3),
            col(4)
        );
    }
}
