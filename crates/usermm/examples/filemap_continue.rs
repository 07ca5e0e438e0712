//! Batched, zero-copy mapping of file pages (issue 15): usermm's page cache (pages parked in a
//! registered anonymous pool, mapped into private anonymous views with UFFDIO_MOVE or COPY)
//! against a memfd page cache mapped with UFFDIO_CONTINUE, in runs of N = 1, 16 and 64 pages
//! over PAGES pages (default 16384 = 64 MiB) that are already in memory (no disk I/O). The
//! ioctls and madvise/fallocate calls are timed directly, without a fault round trip, except
//! the "faults" row of the two-view table, which goes through a handler thread.
//!
//! * A1 (dirty page): map = MOVE pool -> view; unmap = MOVE view -> pool (usermm).
//! * A2 (clean page): map = COPY with MODE_WP pool -> view, then the pool slots are dropped with
//!   process_madvise(MADV_DONTNEED) in batches of 32 (included in the map cost); unmap = MOVE
//!   view -> pool (usermm).
//! * A2r: as A2, but the run's slots (consecutive in the pool) are dropped with one madvise.
//! * B: a MAP_SHARED view of the memfd registered MINOR: map = CONTINUE; unmap = MADV_DONTNEED
//!   of the run (the page stays in the memfd).
//! * B-wp: the same, view registered MINOR | WP, mapped with CONTINUE_MODE_WP.
//! * B-priv: a MAP_PRIVATE view of the memfd registered MINOR: CONTINUE maps the cache page
//!   read-only and a store copies it (kernel COW; checked).
//!
//! Also measured: freeing the frames (A: MADV_DONTNEED of the pool run; B: FALLOC_FL_PUNCH_HOLE
//! of the run, unmapped or still mapped in the view), reads of never-written pages (A:
//! UFFDIO_ZEROPAGE maps the zero page; B: a read fault on a memfd hole allocates a shmem page),
//! and two views of the same file accessed alternately (A moves each page across, B maps it in
//! both views once).
//!
//! Run: `cargo run --release -p usermm --example filemap_continue -- [PAGES] [REPS] [--busy]`.
//! `--busy` keeps a second thread of the process spinning (on the other vCPU of a 2-vCPU VM), so
//! every TLB flush (MOVE, MADV_DONTNEED, PUNCH_HOLE of a mapped page) is an inter-processor
//! interrupt, as when the program using the memory is multi-threaded. Prints markdown tables:
//! ns per page, median [min-max] of REPS repetitions, candidates interleaved in each one.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use usermm_sys::uffd::{feature, mode, Msg, OpenPolicy, Uffd};
use usermm_sys::{memfd, process_rss, punch_hole, Advice, Mapping, PAGE_SIZE};

/// Run lengths measured (pages per ioctl).
const RUNS: [usize; 3] = [1, 16, 64];
/// Pool slots dropped per process_madvise call after COPY (usermm's zap batch).
const ZAP_BATCH: usize = 32;

/// The word stored at the start of page `p`, checked after every mapping.
fn word(p: usize) -> u64 {
    0x5eed_0000_0000 | p as u64
}

fn open_uffd() -> Arc<Uffd> {
    Arc::new(
        Uffd::open(
            feature::MOVE | feature::MINOR_SHMEM | feature::WP_HUGETLBFS_SHMEM,
            OpenPolicy::Auto,
        )
        .expect("userfaultfd"),
    )
}

fn anon(len: usize) -> Mapping {
    let m = Mapping::anon(len, 0).unwrap();
    m.advise(0, len, Advice::NoHugePage).unwrap();
    m
}

/// Calls `f(byte offset, byte length)` for each run of `n` pages of `pages`.
fn each_run(pages: usize, n: usize, mut f: impl FnMut(usize, usize)) {
    let mut p = 0;
    while p < pages {
        let k = n.min(pages - p);
        f(p * PAGE_SIZE, k * PAGE_SIZE);
        p += k;
    }
}

/// Nanoseconds per page of `f` over `pages` pages.
fn timed(pages: usize, f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64 / pages as f64
}

/// Loads and checks the first word of pages `[off, off+len)` (all mapped).
fn check(m: &Mapping, off: usize, len: usize) {
    for o in (off..off + len).step_by(PAGE_SIZE) {
        assert_eq!(m.read_u64(o), word(o / PAGE_SIZE), "page {}", o / PAGE_SIZE);
    }
}

/// Asserts that every page of `m` is mapped write-protected (PAGEMAP_SCAN: present and not
/// "written", i.e. its uffd-wp bit set), where the kernel has PAGEMAP_SCAN.
fn check_wp(m: &Mapping) {
    use usermm_sys::pagemap::{category, count_pages};
    let mask = category::PRESENT | category::WRITTEN;
    if let Ok(k) = count_pages(m.addr(), m.len(), mask, category::WRITTEN) {
        assert_eq!(
            k as usize,
            m.len() / PAGE_SIZE,
            "pages mapped write-protected"
        );
    }
}

/// A: a registered pool and `nviews` registered private anonymous views on one uffd.
struct Anon {
    uffd: Arc<Uffd>,
    pool: Arc<Mapping>,
    views: Vec<Arc<Mapping>>,
}

impl Anon {
    /// Every page is in its pool slot (filled) when `fill`.
    fn new(pages: usize, nviews: usize, fill: bool) -> Anon {
        let len = pages * PAGE_SIZE;
        let uffd = open_uffd();
        let pool = anon(len);
        if fill {
            for p in 0..pages {
                pool.write_u64(p * PAGE_SIZE, word(p));
            }
        }
        uffd.register(pool.addr(), len, mode::MISSING | mode::WP)
            .unwrap();
        let views = (0..nviews)
            .map(|_| {
                let v = anon(len);
                uffd.register(v.addr(), len, mode::MISSING | mode::WP)
                    .unwrap();
                Arc::new(v)
            })
            .collect();
        Anon {
            uffd,
            pool: Arc::new(pool),
            views,
        }
    }

    fn mv(&self, dst: usize, src: usize, len: usize) {
        assert_eq!(
            self.uffd.move_pages(dst, src, len, false, true).unwrap(),
            len
        );
    }
}

/// B: a memfd (filled when `fill`) and `nviews` views of it registered MINOR (| WP).
struct Memfd {
    uffd: Arc<Uffd>,
    file: std::fs::File,
    views: Vec<Mapping>,
}

#[derive(Clone, Copy, PartialEq)]
enum View {
    Shared,
    SharedWp,
    Private,
}

impl Memfd {
    fn new(pages: usize, nviews: usize, kind: View, fill: bool) -> Result<Memfd, String> {
        let len = pages * PAGE_SIZE;
        let uffd = open_uffd();
        let file = memfd("filemap_continue", len as u64).unwrap();
        if fill {
            // Through a temporary alias, unmapped again: the pages sit in the memfd unmapped.
            let alias = Mapping::shared(&file, len).unwrap();
            for p in 0..pages {
                alias.write_u64(p * PAGE_SIZE, word(p));
            }
        }
        let mut views = Vec::new();
        for _ in 0..nviews {
            let v = match kind {
                View::Private => Mapping::private_file(&file, len),
                _ => Mapping::shared(&file, len),
            }
            .unwrap();
            let m = if kind == View::SharedWp {
                mode::MINOR | mode::WP
            } else {
                mode::MINOR
            };
            uffd.register(v.addr(), len, m)
                .map_err(|e| format!("registering mode {m:#x}: {e}"))?;
            views.push(v);
        }
        Ok(Memfd { uffd, file, views })
    }

    fn cont(&self, v: usize, off: usize, len: usize, wp: bool) -> Result<(), String> {
        let addr = self.views[v].addr() + off;
        match self.uffd.continue_wp(addr, len, wp, true) {
            Ok(n) if n == len => Ok(()),
            Ok(n) => Err(format!("CONTINUE did {n} of {len} bytes")),
            Err(e) => Err(format!("CONTINUE (wp {wp}): {e}")),
        }
    }

    fn allocated(&self) -> u64 {
        self.file.metadata().unwrap().blocks() * 512
    }
}

#[derive(Default)]
struct Rec(HashMap<(&'static str, &'static str, usize), Vec<f64>>);

impl Rec {
    fn add(&mut self, table: &'static str, row: &'static str, n: usize, v: f64) {
        self.0.entry((table, row, n)).or_default().push(v);
    }

    fn cell(&self, table: &'static str, row: &'static str, n: usize) -> String {
        let Some(v) = self.0.get(&(table, row, n)) else {
            return "-".into();
        };
        let mut v = v.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (m, lo, hi) = (v[v.len() / 2], v[0], v[v.len() - 1]);
        if m >= 100.0 {
            format!("{m:.0} [{lo:.0}-{hi:.0}]")
        } else {
            format!("{m:.1} [{lo:.1}-{hi:.1}]")
        }
    }

    fn print(&self, title: &str, table: &'static str, rows: &[&'static str]) {
        println!("\n{title}\n");
        println!("| candidate | N = 1 | N = 16 | N = 64 |");
        println!("|---|---|---|---|");
        for &r in rows {
            let cells: Vec<String> = RUNS.iter().map(|&n| self.cell(table, r, n)).collect();
            if cells.iter().all(|c| c == "-") {
                continue;
            }
            println!("| {r} | {} |", cells.join(" | "));
        }
    }
}

const A1: &str = "A1: MOVE pool -> view / MOVE back (dirty page)";
const A2: &str = "A2: COPY+WP, slots dropped in 32s / MOVE back (clean page)";
const A2_DROPS: &str = "(A2's share: the slot drops, 32 per process_madvise)";
const A2R: &str = "A2r: COPY+WP, one MADV_DONTNEED of the run's slots / MOVE back";
const B: &str = "B: CONTINUE / MADV_DONTNEED (MAP_SHARED view)";
const BWP: &str = "B-wp: CONTINUE_MODE_WP / MADV_DONTNEED (MAP_SHARED view)";
const BPRIV: &str = "B-priv: CONTINUE / MADV_DONTNEED (MAP_PRIVATE view)";

/// How A maps a run from the pool.
#[derive(Clone, Copy, PartialEq)]
enum AMap {
    /// A1: UFFDIO_MOVE (a dirty page).
    Move,
    /// A2: UFFDIO_COPY write-protected, the slots dropped with process_madvise in batches of
    /// [`ZAP_BATCH`] pages, as usermm's zap queue does (a clean page).
    CopyBatched,
    /// A2r: UFFDIO_COPY write-protected, the run's slots (consecutive in the pool) dropped with
    /// one madvise.
    CopyRun,
}

/// A1, A2, A2r: map, unmap and (A1) free every page in runs of `n`.
fn measure_anon(rec: &mut Rec, pages: usize, n: usize, how: AMap) {
    let len = pages * PAGE_SIZE;
    let a = Anon::new(pages, 1, true);
    let (v, pool) = (&a.views[0], &a.pool);
    let row = match how {
        AMap::Move => A1,
        AMap::CopyBatched => A2,
        AMap::CopyRun => A2R,
    };
    let copy = |off: usize, l: usize| {
        let done = a
            .uffd
            .copy(v.addr() + off, pool.addr() + off, l, true, true)
            .unwrap();
        assert_eq!(done, l);
    };
    let map = match how {
        AMap::Move => timed(pages, || {
            each_run(pages, n, |off, l| {
                a.mv(v.addr() + off, pool.addr() + off, l)
            })
        }),
        AMap::CopyRun => timed(pages, || {
            each_run(pages, n, |off, l| {
                copy(off, l);
                pool.advise(off, l, Advice::DontNeed).unwrap();
            })
        }),
        AMap::CopyBatched => {
            let mut drops = std::time::Duration::ZERO;
            let mut drop_slots = |zaps: &mut Vec<usize>| {
                let t = Instant::now();
                pool.dontneed_pages(zaps).unwrap();
                drops += t.elapsed();
                zaps.clear();
            };
            let map = timed(pages, || {
                let mut zaps = Vec::with_capacity(ZAP_BATCH);
                each_run(pages, n, |off, l| {
                    copy(off, l);
                    for o in (off..off + l).step_by(PAGE_SIZE) {
                        zaps.push(o);
                        if zaps.len() == ZAP_BATCH {
                            drop_slots(&mut zaps);
                        }
                    }
                });
                drop_slots(&mut zaps);
            });
            rec.add("map", A2_DROPS, n, drops.as_nanos() as f64 / pages as f64);
            map
        }
    };
    check(v, 0, len);
    if how != AMap::Move {
        assert!(pool.resident(0, len).unwrap().iter().all(|&r| !r));
        check_wp(v);
    }
    rec.add("map", row, n, map);
    let unmap = timed(pages, || {
        each_run(pages, n, |off, l| {
            a.mv(pool.addr() + off, v.addr() + off, l)
        })
    });
    check(pool, 0, len);
    rec.add("unmap", row, n, unmap);
    if how == AMap::Move {
        let free = timed(pages, || {
            each_run(pages, n, |off, l| {
                pool.advise(off, l, Advice::DontNeed).unwrap()
            })
        });
        assert!(pool.resident(0, len).unwrap().iter().all(|&r| !r));
        rec.add("free", "A: MADV_DONTNEED of the pool run", n, free);
    }
}

/// B, B-wp, B-priv: map and unmap every page in runs of `n`; (B) punch the holes, unmapped and
/// mapped. Err when the kernel refuses the variant.
fn measure_memfd(rec: &mut Rec, pages: usize, n: usize, kind: View) -> Result<(), String> {
    let len = pages * PAGE_SIZE;
    let b = Memfd::new(pages, 1, kind, true)?;
    let v = &b.views[0];
    let wp = kind == View::SharedWp;
    let row = match kind {
        View::Shared => B,
        View::SharedWp => BWP,
        View::Private => BPRIV,
    };
    let mut err = Ok(());
    let map = timed(pages, || {
        each_run(pages, n, |off, l| {
            if err.is_ok() {
                err = b.cont(0, off, l, wp);
            }
        })
    });
    err?;
    check(v, 0, len);
    if wp {
        check_wp(v);
    }
    if kind == View::Private {
        // A store copies the page: the view sees it, the memfd does not.
        v.write_u64(8, 7);
        let mut buf = [0u8; 8];
        b.file.read_exact_at(&mut buf, 8).unwrap();
        assert_eq!((v.read_u64(8), u64::from_ne_bytes(buf)), (7, 0));
    }
    rec.add("map", row, n, map);
    let unmap = timed(pages, || {
        each_run(pages, n, |off, l| {
            v.advise(off, l, Advice::DontNeed).unwrap()
        })
    });
    assert_eq!(b.allocated(), len as u64, "the pages stay in the memfd");
    rec.add("unmap", row, n, unmap);
    if kind != View::Shared {
        return Ok(());
    }
    let punch = |pages: usize| {
        timed(pages, || {
            each_run(pages, n, |off, l| {
                punch_hole(&b.file, off as u64, l as u64).unwrap()
            })
        })
    };
    rec.add(
        "free",
        "B: PUNCH_HOLE of the run (unmapped)",
        n,
        punch(pages),
    );
    assert_eq!(b.allocated(), 0);
    // Refill, map into the view, and punch while mapped (the punch zaps the view's ptes too).
    let alias = Mapping::shared(&b.file, len).unwrap();
    for p in 0..pages {
        alias.write_u64(p * PAGE_SIZE, word(p));
    }
    drop(alias);
    each_run(pages, 64, |off, l| b.cont(0, off, l, false).unwrap());
    check(v, 0, len);
    rec.add(
        "free",
        "B: PUNCH_HOLE of the run (mapped in the view)",
        n,
        punch(pages),
    );
    assert_eq!(b.allocated(), 0);
    Ok(())
}

/// Reads of never-written pages in runs of `n`: A maps the zero page with UFFDIO_ZEROPAGE; B's
/// read fault on a memfd hole (MADV_POPULATE_READ here) allocates a shmem page.
fn measure_holes(rec: &mut Rec, alloc: &mut HashMap<&'static str, f64>, pages: usize, n: usize) {
    let len = pages * PAGE_SIZE;
    let a = Anon::new(pages, 1, false);
    let v = &a.views[0];
    let rss0 = process_rss();
    let t = timed(pages, || {
        each_run(pages, n, |off, l| {
            assert_eq!(a.uffd.zeropage(v.addr() + off, l, true).unwrap(), l)
        })
    });
    let grown = process_rss().saturating_sub(rss0);
    assert_eq!(v.read_u64(len - 8), 0);
    const AZ: &str = "A: UFFDIO_ZEROPAGE into the view";
    rec.add("hole", AZ, n, t);
    alloc.insert(AZ, grown as f64 / pages as f64);
    drop(a);
    for (kind, row) in [
        (View::Shared, "B: read fault on a memfd hole (MAP_SHARED)"),
        (
            View::Private,
            "B-priv: read fault on a memfd hole (MAP_PRIVATE)",
        ),
    ] {
        let b = Memfd::new(pages, 1, kind, false).unwrap();
        let v = &b.views[0];
        let t = timed(pages, || {
            each_run(pages, n, |off, l| {
                v.advise(off, l, Advice::PopulateRead).unwrap()
            })
        });
        assert_eq!(v.read_u64(len - 8), 0);
        rec.add("hole", row, n, t);
        alloc.insert(row, b.allocated() as f64 / pages as f64);
    }
}

const PP_POOL: &str = "A: MOVE view -> pool -> other view, per run";
const PP_DIRECT: &str = "A: MOVE view -> other view, per run (lower bound)";
const PP_FAULT: &str = "A: fault per page, handler MOVEs view -> pool -> view (usermm today)";
const PP_B: &str = "B: both views mapped once by CONTINUE (loads only)";

/// Two views of one file, each page loaded from one view then the other: ns per page per switch
/// (the ioctls plus one load per page).
fn measure_pingpong(rec: &mut Rec, pages: usize, n: usize, faults: bool) {
    for direct in [false, true] {
        let a = Anon::new(pages, 2, true);
        let pool = a.pool.addr();
        each_run(pages, 64, |off, l| {
            a.mv(a.views[0].addr() + off, pool + off, l)
        });
        let t = timed(2 * pages, || {
            for (s, d) in [(0, 1), (1, 0)] {
                let (src, dst) = (&a.views[s], &a.views[d]);
                each_run(pages, n, |off, l| {
                    if direct {
                        a.mv(dst.addr() + off, src.addr() + off, l);
                    } else {
                        a.mv(pool + off, src.addr() + off, l);
                        a.mv(dst.addr() + off, pool + off, l);
                    }
                    check(dst, off, l);
                });
            }
        });
        rec.add("pingpong", if direct { PP_DIRECT } else { PP_POOL }, n, t);
    }
    if faults && n == 1 {
        rec.add("pingpong", PP_FAULT, 1, pingpong_faults(pages));
    }
    let b = Memfd::new(pages, 2, View::Shared, true).unwrap();
    for v in 0..2 {
        each_run(pages, 64, |off, l| b.cont(v, off, l, false).unwrap());
    }
    let t = timed(2 * pages, || {
        for d in [1, 0] {
            each_run(pages, n, |off, l| check(&b.views[d], off, l));
        }
    });
    rec.add("pingpong", PP_B, n, t);
}

/// A with the fault round trip: a load from the view that does not hold the page faults (MISSING);
/// a spinning handler thread moves the page out of the other view into its pool slot and from
/// there into the faulting view, one page at a time (usermm's fault-around stops at a page
/// mapped in another view). Returns ns per page per switch.
fn pingpong_faults(pages: usize) -> f64 {
    let a = Anon::new(pages, 2, true);
    let pool = a.pool.addr();
    each_run(pages, 64, |off, l| {
        a.mv(a.views[0].addr() + off, pool + off, l)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (u, stop2) = (a.uffd.clone(), stop.clone());
    let (v0, v1) = (a.views[0].addr(), a.views[1].addr());
    let h = std::thread::spawn(move || {
        let mut msgs = [Msg::default(); 16];
        while !stop2.load(Ordering::Relaxed) {
            let k = u.read_msgs(&mut msgs).unwrap();
            for m in &msgs[..k] {
                let addr = m.fault_address() & !(PAGE_SIZE - 1);
                let (here, other) = if addr >= v1 && addr < v1 + pages * PAGE_SIZE {
                    (v1, v0)
                } else {
                    (v0, v1)
                };
                let off = addr - here;
                u.move_pages(pool + off, other + off, PAGE_SIZE, false, true)
                    .unwrap();
                u.move_pages(addr, pool + off, PAGE_SIZE, false, false)
                    .unwrap();
            }
            if k == 0 {
                std::hint::spin_loop();
            }
        }
    });
    let t = timed(2 * pages, || {
        for d in [1, 0] {
            check(&a.views[d], 0, pages * PAGE_SIZE);
        }
    });
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    t
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let busy = args.iter().any(|a| a == "--busy");
    let nums: Vec<usize> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse().expect("PAGES and REPS are numbers"))
        .collect();
    let pages = nums.first().copied().unwrap_or(16384);
    let reps = nums.get(1).copied().unwrap_or(5);
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = busy.then(|| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    });
    let u = open_uffd();
    println!(
        "{pages} pages ({} MiB), {reps} reps, median [min-max] ns per page; uffd WP_HUGETLBFS_SHMEM {}; busy thread {busy}",
        (pages * PAGE_SIZE) >> 20,
        u.has(feature::WP_HUGETLBFS_SHMEM),
    );
    drop(u);
    let mut rec = Rec::default();
    let mut alloc = HashMap::new();
    let mut refused: HashMap<&'static str, String> = HashMap::new();
    for _ in 0..reps {
        for n in RUNS {
            measure_anon(&mut rec, pages, n, AMap::Move);
            measure_memfd(&mut rec, pages, n, View::Shared).unwrap();
            measure_anon(&mut rec, pages, n, AMap::CopyBatched);
            for (kind, row) in [(View::SharedWp, BWP), (View::Private, BPRIV)] {
                if refused.contains_key(row) {
                    continue;
                }
                if let Err(e) = measure_memfd(&mut rec, pages, n, kind) {
                    refused.insert(row, e);
                }
            }
            measure_anon(&mut rec, pages, n, AMap::CopyRun);
            measure_holes(&mut rec, &mut alloc, pages, n);
            measure_pingpong(&mut rec, pages, n, !busy);
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = spinner {
        s.join().unwrap();
    }
    let rows = [A1, A2, A2_DROPS, A2R, B, BWP, BPRIV];
    rec.print("Map a run of N pages (ns/page)", "map", &rows);
    rec.print("Unmap a run of N pages (ns/page)", "unmap", &rows);
    rec.print(
        "Free the frames of a run of N pages (ns/page)",
        "free",
        &[
            "A: MADV_DONTNEED of the pool run",
            "B: PUNCH_HOLE of the run (unmapped)",
            "B: PUNCH_HOLE of the run (mapped in the view)",
        ],
    );
    let hole_rows = [
        "A: UFFDIO_ZEROPAGE into the view",
        "B: read fault on a memfd hole (MAP_SHARED)",
        "B-priv: read fault on a memfd hole (MAP_PRIVATE)",
    ];
    rec.print(
        "Read never-written pages, a run of N pages (ns/page)",
        "hole",
        &hole_rows,
    );
    println!();
    for r in hole_rows {
        println!(
            "memory allocated per page read, {r}: {:.0} bytes",
            alloc.get(r).copied().unwrap_or(f64::NAN)
        );
    }
    rec.print(
        "Two views of one file, alternate loads (ns/page per switch, incl. one load per page)",
        "pingpong",
        &[PP_POOL, PP_DIRECT, PP_FAULT, PP_B],
    );
    for (row, e) in &refused {
        println!("\n{row}: refused by this kernel: {e}");
    }
}
