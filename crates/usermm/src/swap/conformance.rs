//! The shared swap device conformance suite: one function, [`conformance`], that every
//! [`SwapDevice`] backend must pass, run by one test per backend, plus the error-case tests of
//! the backends. Mirrors no kernel file; it pins down the contract `mm/page_io.c` relies on
//! (a slot read returns exactly what was last written to that slot).
#![cfg(test)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::faulty::FailMode;
use super::{FaultySwap, FileSwap, FileSwapOptions, RamSwap, SlotRun, SwapDevice};
use crate::conv::Narrow;
use crate::sys::{Mapping, PAGE_SIZE};

const P: usize = PAGE_SIZE;
/// Requested device size: not a page multiple, so every backend must round down.
const SIZE: u64 = 64 * 4096 + 1000;
const NR: u64 = 64;

// ---------------------------------------------------------------------------------------------
// Page patterns: every u64 word of a page names its slot, a seed and its own index, so a page
// that lands in the wrong slot, a stale page, or a torn page is detected.

/// Seeds with this bit give mixed pages: by slot and seed, a page is same-filled (every word
/// the same, still naming slot and seed), compressible (one random byte per word) or random.
pub(super) const MIXED: u64 = 1 << 40;

fn word(slot: u64, seed: u64, i: u64) -> u64 {
    if seed & MIXED != 0 {
        let w = mix(slot, seed, i);
        return match (slot ^ seed) % 3 {
            0 => mix(slot, seed, 0),
            1 => w & 0xff,
            _ => w,
        };
    }
    mix(slot, seed, i)
}

fn mix(slot: u64, seed: u64, i: u64) -> u64 {
    let mut x = slot.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ seed.rotate_left(32)
        ^ i.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 29)
}

fn fill(pool: &Mapping, off: usize, slot: u64, seed: u64) {
    for i in 0..(P / 8) as u64 {
        pool.write_u64(off + i.usize() * 8, word(slot, seed, i));
    }
}

fn check(pool: &Mapping, off: usize, slot: u64, seed: u64, what: &str) {
    for i in 0..(P / 8) as u64 {
        let got = pool.read_u64(off + i.usize() * 8);
        let want = word(slot, seed, i);
        assert_eq!(
            got, want,
            "{what}: pool page {off:#x} word {i} should hold slot {slot} seed {seed}"
        );
    }
}

fn pool(pages: usize) -> Mapping {
    Mapping::anon(pages * P, 0).unwrap()
}

/// Writes the 256-slot clusters starting at each of `bases` of `dev`, every slot filled as
/// [`fill`] does with `seed`.
fn write_clusters(dev: &dyn SwapDevice, bases: impl IntoIterator<Item = u64>, seed: u64) {
    let src = pool(256);
    let pages: Vec<usize> = (0..256).map(|i| i * P).collect();
    for base in bases {
        for i in 0..256 {
            fill(&src, i * P, base + i as u64, seed);
        }
        dev.write_pages(base, &src, &pages).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The suite.

/// Checks that `dev` (of `SIZE` requested bytes) behaves as a swap device must, with random
/// (incompressible) pages and again with mixed pages (same-filled, compressible, random).
fn conformance(dev: &dyn SwapDevice) {
    conformance_with(dev, 0);
    conformance_with(dev, MIXED);
}

/// The suite with seeds offset by `pat` (0: random pages; [`MIXED`]: mixed pages).
fn conformance_with(dev: &dyn SwapDevice, pat: u64) {
    let name = dev.name();
    assert!(!name.is_empty());
    assert_eq!(
        dev.nr_pages(),
        NR,
        "{name}: capacity must be the requested size in whole pages"
    );
    single_page_round_trip(dev, pat);
    scattered_batch(dev, pat);
    read_runs(dev, pat);
    bounds(dev, pat);
    overwrite(dev, pat);
    discard_then_write(dev, pat);
    concurrent(dev, pat);
}

fn single_page_round_trip(dev: &dyn SwapDevice, pat: u64) {
    let src = pool(4);
    fill(&src, P, 7, pat + 1);
    dev.write_pages(7, &src, &[P]).unwrap();
    let dst = pool(4);
    dev.read_pages(7, &dst, &[2 * P]).unwrap();
    check(&dst, 2 * P, 7, pat + 1, "single page");
    // A device that names its pages' memory holds each written slot's page there, as written
    // (swap-in copies straight from it).
    if let Some(mem) = dev.pages_in_memory() {
        assert!(mem.len() >= NR.usize() * P, "the memory covers every slot");
        check(mem, 7 * P, 7, pat + 1, "the page in the device's memory");
    }
    // Empty batches are fine.
    dev.write_pages(7, &src, &[]).unwrap();
    dev.read_pages(7, &dst, &[]).unwrap();
}

fn scattered_batch(dev: &dyn SwapDevice, pat: u64) {
    let src = pool(16);
    // Scattered pool pages, some physically adjacent (3,4,5) so merged I/O vectors are covered.
    let src_pages: Vec<usize> = [9, 2, 3, 4, 14, 0, 11].iter().map(|p| p * P).collect();
    for (i, &p) in src_pages.iter().enumerate() {
        fill(&src, p, 10 + i as u64, pat + 2);
    }
    dev.write_pages(10, &src, &src_pages).unwrap();
    let dst = pool(16);
    let dst_pages: Vec<usize> = [15, 1, 7, 8, 12, 3, 5].iter().map(|p| p * P).collect();
    dev.read_pages(10, &dst, &dst_pages).unwrap();
    for (i, &p) in dst_pages.iter().enumerate() {
        check(&dst, p, 10 + i as u64, pat + 2, "scattered batch");
    }
    // A sub-range of the batch, read on its own.
    let one = pool(2);
    dev.read_pages(13, &one, &[P, 0]).unwrap();
    check(&one, P, 13, pat + 2, "sub-range");
    check(&one, 0, 14, pat + 2, "sub-range");
}

/// Several runs read in one call (`read_runs`, a readahead window over scattered slots): each
/// run's pages as `read_pages` reads them, one result per run, a bad run (past the end, a page
/// outside the pool) failing alone.
fn read_runs(dev: &dyn SwapDevice, pat: u64) {
    let src = pool(8);
    let at = [(30u64, 0usize), (31, 1), (40, 2), (41, 3), (42, 4), (50, 5)];
    for &(slot, k) in &at {
        fill(&src, k * P, slot, pat + 5);
        dev.write_pages(slot, &src, &[k * P]).unwrap();
    }
    let dst = pool(8);
    let (a, b, c) = ([6 * P, 0], [P, 2 * P, 7 * P], [4 * P]);
    let bad = [3 * P];
    let runs = [
        SlotRun {
            slot: 40,
            pages: &b,
        },
        SlotRun {
            slot: NR,
            pages: &bad,
        },
        SlotRun {
            slot: 30,
            pages: &a,
        },
        SlotRun {
            slot: 50,
            pages: &c,
        },
        SlotRun {
            slot: 41,
            pages: &[],
        },
    ];
    let res = dev.read_runs(&runs, &dst);
    assert_eq!(res.len(), runs.len(), "one result per run");
    assert!(res[1].is_err(), "a run past the end must fail");
    for k in [0, 2, 3, 4] {
        assert!(res[k].is_ok(), "run {k}: {:?}", res[k]);
    }
    for (slot, off) in [
        (40, P),
        (41, 2 * P),
        (42, 7 * P),
        (30, 6 * P),
        (31, 0),
        (50, 4 * P),
    ] {
        check(&dst, off, slot, pat + 5, "read_runs");
    }
    // A single run, and none.
    let one = pool(1);
    let r = dev.read_runs(
        &[SlotRun {
            slot: 42,
            pages: &[0],
        }],
        &one,
    );
    assert!(r.len() == 1 && r[0].is_ok(), "{r:?}");
    check(&one, 0, 42, pat + 5, "read_runs of one run");
    assert!(dev.read_runs(&[], &one).is_empty());
}

fn bounds(dev: &dyn SwapDevice, pat: u64) {
    let last = NR - 1;
    let src = pool(2);
    fill(&src, 0, last, pat + 3);
    fill(&src, P, NR, pat + 3);
    dev.write_pages(last, &src, &[0]).unwrap();
    let dst = pool(2);
    dev.read_pages(last, &dst, &[0]).unwrap();
    check(&dst, 0, last, pat + 3, "last slot");

    // Past the end: errors, and nothing is written (the last slot keeps its content).
    fill(&src, 0, last, pat + 99);
    assert!(
        dev.write_pages(NR, &src, &[0]).is_err(),
        "write at slot == nr_pages must fail"
    );
    assert!(
        dev.write_pages(last, &src, &[0, P]).is_err(),
        "write running past the end must fail"
    );
    assert!(dev.write_pages(u64::MAX, &src, &[0, P]).is_err());
    assert!(dev.read_pages(NR, &dst, &[P]).is_err());
    assert!(dev.read_pages(last, &dst, &[0, P]).is_err());
    assert!(dev.read_pages(u64::MAX, &dst, &[0]).is_err());
    assert!(dev.discard(NR, 1).is_err());
    assert!(dev.discard(last, 2).is_err());
    assert!(dev.discard(u64::MAX, 2).is_err());
    // Bad pool offsets: outside the pool, or not page-aligned.
    assert!(dev.write_pages(last, &src, &[2 * P]).is_err());
    assert!(dev.write_pages(last, &src, &[8]).is_err());
    assert!(dev.read_pages(last, &dst, &[usize::MAX - 10]).is_err());
    let e = dev.write_pages(NR, &src, &[0]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");

    dst.fill(0, 2 * P, 0).unwrap();
    dev.read_pages(last, &dst, &[0]).unwrap();
    check(&dst, 0, last, pat + 3, "last slot after refused writes");
}

fn overwrite(dev: &dyn SwapDevice, pat: u64) {
    let src = pool(1);
    fill(&src, 0, 20, pat + 3);
    dev.write_pages(20, &src, &[0]).unwrap();
    fill(&src, 0, 20, pat + 4);
    dev.write_pages(20, &src, &[0]).unwrap();
    let dst = pool(1);
    dev.read_pages(20, &dst, &[0]).unwrap();
    check(&dst, 0, 20, pat + 4, "overwrite");
}

fn discard_then_write(dev: &dyn SwapDevice, pat: u64) {
    let src = pool(4);
    for i in 0..4 {
        fill(&src, i * P, 30 + i as u64, pat + 5);
    }
    dev.write_pages(30, &src, &[0, P, 2 * P, 3 * P]).unwrap();
    dev.discard(30, 2).unwrap();
    dev.discard(0, 0).unwrap();
    // The neighbours of a discarded range keep their data.
    let dst = pool(2);
    dev.read_pages(32, &dst, &[0, P]).unwrap();
    check(&dst, 0, 32, pat + 5, "after neighbour discard");
    check(&dst, P, 33, pat + 5, "after neighbour discard");
    // A discarded slot takes new data.
    fill(&src, 0, 30, pat + 6);
    fill(&src, P, 31, pat + 6);
    dev.write_pages(30, &src, &[P, 0]).unwrap();
    dev.read_pages(30, &dst, &[0, P]).unwrap();
    check(&dst, 0, 31, pat + 6, "rewrite after discard");
    check(&dst, P, 30, pat + 6, "rewrite after discard");
}

fn concurrent(dev: &dyn SwapDevice, pat: u64) {
    const THREADS: u64 = 4;
    const PER: u64 = 8;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let base = NR - THREADS * PER + t * PER;
                let src = pool(PER.usize());
                let dst = pool(PER.usize());
                let fwd: Vec<usize> = (0..PER.usize()).map(|i| i * P).collect();
                let rev: Vec<usize> = fwd.iter().rev().copied().collect();
                for round in 0..25u64 {
                    let seed = pat + 1000 * (t + 1) + round;
                    for i in 0..PER {
                        fill(&src, i.usize() * P, base + i, seed);
                    }
                    // Alternate one whole batch with two halves.
                    if round % 2 == 0 {
                        dev.write_pages(base, &src, &fwd).unwrap();
                    } else {
                        let h = (PER / 2) as usize;
                        dev.write_pages(base + PER / 2, &src, &fwd[h..]).unwrap();
                        dev.write_pages(base, &src, &fwd[..h]).unwrap();
                    }
                    dev.read_pages(base, &dst, &rev).unwrap();
                    for i in 0..PER {
                        check(&dst, rev[i.usize()], base + i, seed, "concurrent");
                    }
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Temporary directories (removed on drop).

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "usermm-swaptest-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// One test per backend.

#[test]
fn file_swap_unlinked() {
    let dev = FileSwap::open(None, SIZE).unwrap();
    assert!(
        dev.name().starts_with("file:(unlinked in "),
        "{}",
        dev.name()
    );
    assert!(dev.path().is_none());
    conformance(&dev);
}

#[test]
fn file_swap_unlinked_leaves_nothing_behind() {
    let dir = TempDir::new("unlinked");
    let dev = FileSwap::open_unlinked_in(dir.path(), SIZE).unwrap();
    assert!(
        dev.name().contains(&dir.path().display().to_string()),
        "{}",
        dev.name()
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the swap file must be unlinked at once"
    );
    conformance(&dev);
}

#[test]
fn file_swap_buffered() {
    let dir = TempDir::new("buffered");
    let dev = FileSwap::open_unlinked_buffered_in(dir.path(), SIZE).unwrap();
    assert!(!dev.is_direct());
    assert!(dev.name().ends_with(", buffered)"), "{}", dev.name());
    conformance(&dev);
}

#[test]
fn file_swap_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        crate::sys::skip_test("no /dev/shm (tmpfs) here: file swap on tmpfs not checked");
        return;
    }
    match FileSwap::open_unlinked_in(shm, SIZE) {
        Ok(dev) => conformance(&dev),
        Err(e) => crate::sys::skip_test(&format!("a swap file on /dev/shm (tmpfs): {e}")),
    }
}

/// Whether a `/proc/PID/fd` link target is the open swap file for `path` that has no name: one
/// whose path was unlinked at open (`{path} (deleted)`) or one made nameless in the path's
/// directory and never linked (`O_TMPFILE`: `{dir}/#{inode} (deleted)`).
pub(crate) fn is_nameless_swap_file_of(target: &str, path: &Path) -> bool {
    let dir = path.parent().unwrap_or(Path::new("."));
    target == format!("{} (deleted)", path.display())
        || (target.starts_with(&format!("{}/#", dir.display())) && target.ends_with(" (deleted)"))
}

/// The `/proc/self/fd` names of this process's open descriptors of the nameless swap file for
/// `path` (a swap file not kept never keeps its path).
fn unlinked_fds_of(path: &Path) -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|fd| {
            std::fs::read_link(fd)
                .is_ok_and(|t| is_nameless_swap_file_of(&t.to_string_lossy(), path))
        })
        .collect()
}

/// The `/proc/self/fd` name of this process's open swap file for `path`, which has no name;
/// the descriptor still reads it.
fn unlinked_fd_of(path: &Path) -> PathBuf {
    unlinked_fds_of(path).into_iter().next().unwrap_or_else(|| {
        panic!(
            "no open descriptor of the nameless swap file {}",
            path.display()
        )
    })
}

#[test]
fn file_swap_with_path() {
    let dir = TempDir::new("path");
    let path = dir.path().join("swap");
    let fd;
    {
        let dev = FileSwap::open(Some(&path), SIZE).unwrap();
        assert_eq!(dev.path(), Some(path.as_path()));
        let mode = if dev.is_direct() {
            "O_DIRECT"
        } else {
            "buffered"
        };
        assert_eq!(dev.name(), format!("file:{} ({mode})", path.display()));
        // The O_DIRECT reopen must not depend on the (already unlinked) path: where an
        // unlinked temporary file in the same directory gets O_DIRECT, so does a named one.
        let probe = FileSwap::open_unlinked_in(dir.path(), SIZE).unwrap();
        assert_eq!(
            dev.is_direct(),
            probe.is_direct(),
            "a named swap file must use O_DIRECT where the filesystem allows it"
        );
        drop(probe);
        // Process memory never outlives the process on disk, not even after SIGKILL: the file
        // never gets the path (O_TMPFILE), the descriptor holds it.
        assert!(
            !path.exists(),
            "the swap file's path must be unlinked at open"
        );
        fd = unlinked_fd_of(&path);
        let meta = std::fs::metadata(&fd).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // One header page, then the slots.
        assert_eq!(meta.len(), (NR + 1) * 4096);
        let head = std::fs::read(&fd).unwrap();
        assert_eq!(&head[..16], super::file::HEADER_MAGIC);
        assert_eq!(u32::from_le_bytes(head[16..20].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(head[24..32].try_into().unwrap()), NR);
        conformance(&dev);
        // Refused writes past the end never grow the file.
        assert_eq!(std::fs::metadata(&fd).unwrap().len(), (NR + 1) * 4096);
        // The header survives every slot write.
        assert_eq!(
            &std::fs::read(&fd).unwrap()[..16],
            super::file::HEADER_MAGIC
        );
    }
    // The device closed its descriptor: no descriptor of the process holds the file. (Not a
    // look at the old descriptor's number: a test running beside this one may have been given
    // that number for its own swap file meanwhile.)
    let left = unlinked_fds_of(&path);
    assert!(
        left.is_empty(),
        "still open after drop: {left:?} (was {fd:?})"
    );
    assert!(!path.exists());
}

/// Opens `path` with `keep` and writes slot 3, then drops the device.
fn leave_swap_file(path: &Path, encrypt: bool) {
    let opts = FileSwapOptions {
        encrypt,
        keep: true,
        sparse: false,
    };
    let dev = FileSwap::open_with(Some(path), SIZE, opts).unwrap();
    let src = pool(1);
    fill(&src, 0, 3, 42);
    dev.write_pages(3, &src, &[0]).unwrap();
}

#[test]
fn file_swap_keep_leaves_it_and_a_reuse_truncates_it() {
    let dir = TempDir::new("keep");
    let path = dir.path().join("swap");
    leave_swap_file(&path, false);
    // Kept as asked, with the page on it.
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(raw.len() as u64, (NR + 1) * 4096);
    let word0 = u64::from_le_bytes(raw[4 * P..4 * P + 8].try_into().unwrap());
    assert_eq!(word0, word(3, 42, 0), "slot 3 is at byte 4 * 4096");
    // Reused (its header is recognised): old pages are gone, the size and mode are the new
    // device's, and without keep its path is unlinked at once.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dev = FileSwap::open(Some(&path), 8 * 4096).unwrap();
    assert_eq!(dev.nr_pages(), 8);
    assert!(!path.exists());
    let fd = unlinked_fd_of(&path);
    let meta = std::fs::metadata(&fd).unwrap();
    assert_eq!(meta.len(), 9 * 4096);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let raw = std::fs::read(&fd).unwrap();
    assert!(
        raw[P..].iter().all(|&b| b == 0),
        "the earlier process's pages must not survive a reuse"
    );
    drop(dev);
    assert!(!path.exists());
}

#[test]
fn file_swap_never_overwrites_a_file_it_did_not_make() {
    let dir = TempDir::new("foreign");
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "notes.txt",
            b"precious text\n",
            "not a usermm swap file (14 bytes",
        ),
        ("empty", b"", "is empty"),
        ("almost", b"usermm swapfile", "not a usermm swap file"),
    ];
    for (name, content, why) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = FileSwap::open(Some(&path), SIZE).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{msg}");
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(why),
            "{name}: {msg}"
        );
        assert!(msg.contains("remove it or give a new path"), "{msg}");
        // Untouched: content and mode.
        assert_eq!(std::fs::read(&path).unwrap(), content, "{name}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{name}");
    }
    // A header of another version is refused too.
    let path = dir.path().join("v2");
    let mut h = vec![0u8; 4096];
    h[..16].copy_from_slice(super::file::HEADER_MAGIC);
    h[16..20].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&path, &h).unwrap();
    let msg = FileSwap::open(Some(&path), SIZE).unwrap_err().to_string();
    assert!(msg.contains("header version 2"), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), h);
    // A symbolic link is refused, and its target is not created.
    let link = dir.path().join("link");
    let target = dir.path().join("target");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let msg = FileSwap::open(Some(&link), SIZE).unwrap_err().to_string();
    assert!(msg.contains("symbolic link"), "{msg}");
    assert!(!target.exists());
}

#[test]
fn file_swap_path_is_held_by_one_device() {
    let dir = TempDir::new("busy");
    let path = dir.path().join("swap");
    // A kept file stays at its path, locked: a second device naming it is refused.
    let keep = FileSwapOptions {
        keep: true,
        ..FileSwapOptions::default()
    };
    let a = FileSwap::open_with(Some(&path), SIZE, keep).unwrap();
    let e = FileSwap::open(Some(&path), SIZE).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy, "{e}");
    assert!(
        e.to_string().contains("in use by another usermm manager"),
        "{e}"
    );
    // The refused open changed nothing: the first device still works.
    conformance(&a);
    drop(a);
    assert!(path.exists());
    // Without keep the path is free again at once: a second device makes its own file, and
    // neither sees the other's pages.
    let b = FileSwap::open(Some(&path), SIZE).unwrap();
    let c = FileSwap::open(Some(&path), SIZE).unwrap();
    let src = pool(1);
    for (k, d) in [&b, &c].into_iter().enumerate() {
        fill(&src, 0, 5, k as u64);
        d.write_pages(5, &src, &[0]).unwrap();
    }
    let dst = pool(1);
    for (k, d) in [&b, &c].into_iter().enumerate() {
        d.read_pages(5, &dst, &[0]).unwrap();
        assert_eq!(dst.read_u64(0), word(5, k as u64, 0), "device {k}");
    }
    drop((b, c));
    assert!(!path.exists());
}

/// Where the filesystem cannot make nameless files, a new swap file is created at its path,
/// locked, and unlinked at once unless kept: the same guarantees, through the same suite.
#[test]
fn file_swap_with_path_without_o_tmpfile() {
    super::file::NO_TMPFILE.with(|c| c.set(true));
    let dir = TempDir::new("no-tmpfile");
    let path = dir.path().join("swap");
    {
        let dev = FileSwap::open(Some(&path), SIZE).unwrap();
        assert!(
            !path.exists(),
            "the swap file's path must be unlinked at open"
        );
        let fd = unlinked_fd_of(&path);
        let target = std::fs::read_link(&fd).unwrap();
        assert_eq!(
            target.to_string_lossy(),
            format!("{} (deleted)", path.display()),
            "created at its path, then unlinked"
        );
        assert_eq!(
            &std::fs::read(&fd).unwrap()[..16],
            super::file::HEADER_MAGIC
        );
        conformance(&dev);
    }
    let keep = FileSwapOptions {
        keep: true,
        ..FileSwapOptions::default()
    };
    let a = FileSwap::open_with(Some(&path), SIZE, keep).unwrap();
    assert_eq!(
        &std::fs::read(&path).unwrap()[..16],
        super::file::HEADER_MAGIC
    );
    let e = FileSwap::open_with(Some(&path), SIZE, keep).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy, "{e}");
    drop(a);
    assert!(path.exists());
    super::file::NO_TMPFILE.with(|c| c.set(false));
}

/// Managers starting at once on one path never see each other's half-made file: a new file
/// gets its path only once it is locked and holds its header (kept) or never (not kept). Eight
/// threads open and close devices on one path: without keep every open succeeds; with keep
/// each either gets the file or is told it is in use, never that it "is empty" or "not a
/// usermm swap file". (Creating at the path first failed both within a few hundred opens.)
#[test]
fn file_swap_concurrent_opens_of_one_path() {
    for keep in [false, true] {
        let dir = TempDir::new(if keep { "race-keep" } else { "race" });
        let path = dir.path().join("swap");
        let opts = FileSwapOptions {
            keep,
            sparse: true,
            ..FileSwapOptions::default()
        };
        let (mut opened, mut busy) = (0, 0);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let (mut ok, mut busy) = (0, 0);
                        for _ in 0..150 {
                            match FileSwap::open_with(Some(&path), 64 * 4096, opts) {
                                Ok(d) => {
                                    ok += 1;
                                    drop(d);
                                }
                                Err(e) if keep && e.kind() == std::io::ErrorKind::ResourceBusy => {
                                    busy += 1
                                }
                                Err(e) => panic!("keep={keep}: {e}"),
                            }
                        }
                        (ok, busy)
                    })
                })
                .collect();
            for h in hs {
                let (o, b) = h.join().unwrap();
                opened += o;
                busy += b;
            }
        });
        assert_eq!(opened + busy, 8 * 150);
        if !keep {
            assert_eq!(opened, 8 * 150);
            assert!(!path.exists(), "an unkept swap file left its path behind");
        }
        assert!(opened > 0);
    }
}

fn encrypted() -> FileSwapOptions {
    FileSwapOptions {
        encrypt: true,
        keep: false,
        sparse: true,
    }
}

#[test]
fn file_swap_encrypted_unlinked() {
    let dev = FileSwap::open_with(None, SIZE, encrypted()).unwrap();
    assert!(dev.is_encrypted());
    assert!(dev.name().ends_with(", encrypted)"), "{}", dev.name());
    conformance(&dev);
}

#[test]
fn file_swap_encrypted_path() {
    let dir = TempDir::new("encpath");
    let path = dir.path().join("swap");
    let dev = FileSwap::open_with(Some(&path), SIZE, encrypted()).unwrap();
    conformance(&dev);
    // A discarded slot reads as zeros, like an unwritten one.
    let src = pool(1);
    fill(&src, 0, 5, 9);
    dev.write_pages(5, &src, &[0]).unwrap();
    dev.discard(5, 1).unwrap();
    let dst = pool(1);
    dst.fill(0, P, 0xee).unwrap();
    dev.read_pages(5, &dst, &[0]).unwrap();
    assert!((0..P / 8).all(|i| dst.read_u64(i * 8) == 0));
}

#[test]
fn file_swap_encrypted_pages_are_unreadable_and_tamper_evident() {
    let dir = TempDir::new("enc");
    let path = dir.path().join("swap");
    // What a kept (or SIGKILLed) encrypted file holds is not the page.
    leave_swap_file(&path, true);
    let raw = std::fs::read(&path).unwrap();
    let on_disk: Vec<u64> = (0..P / 8)
        .map(|i| u64::from_le_bytes(raw[4 * P + i * 8..4 * P + i * 8 + 8].try_into().unwrap()))
        .collect();
    let plain: Vec<u64> = (0..P as u64 / 8).map(|i| word(3, 42, i)).collect();
    assert_ne!(on_disk, plain);
    assert_eq!(
        on_disk.iter().zip(&plain).filter(|(a, b)| a == b).count(),
        0,
        "no plaintext word may reach the disk"
    );
    std::fs::remove_file(&path).unwrap();

    // A page changed on disk fails authentication instead of reading back wrong data.
    let dev = FileSwap::open_with(Some(&path), SIZE, encrypted()).unwrap();
    let src = pool(2);
    fill(&src, 0, 6, 1);
    fill(&src, P, 7, 1);
    dev.write_pages(6, &src, &[0, P]).unwrap();
    {
        use std::os::unix::fs::FileExt;
        // (The path is unlinked at open; the device's descriptor still names the file.)
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(unlinked_fd_of(&path))
            .unwrap();
        // Flip the bits of one ciphertext byte (writing a fixed value left it unchanged when the
        // byte already held it, one run in 256). Slot 6 starts at byte 7 * 4096.
        let mut b = [0u8];
        f.read_exact_at(&mut b, 7 * 4096 + 100).unwrap();
        f.write_at(&[!b[0]], 7 * 4096 + 100).unwrap();
        f.sync_all().unwrap();
    }
    let dst = pool(2);
    let e = dev.read_pages(6, &dst, &[0]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert!(
        e.to_string().contains("slot 6 failed authentication"),
        "{e}"
    );
    // Its neighbour is intact.
    dev.read_pages(7, &dst, &[P]).unwrap();
    check(&dst, P, 7, 1, "neighbour of a tampered slot");
}

#[test]
fn ram_swap() {
    let dev = RamSwap::new(SIZE).unwrap();
    assert!(dev.name().starts_with("ram"));
    conformance(&dev);
}

/// A fork parent for [`InheritedSwap`]'s tests: answers the wire protocol of
/// `swap/inherit.rs` from `dev`, for the slots in `held`, until the socket closes; returns the
/// slots released.
fn fake_fork_parent(
    dev: Arc<dyn SwapDevice>,
    mut s: std::os::unix::net::UnixStream,
    held: Vec<u64>,
) -> std::thread::JoinHandle<Vec<u64>> {
    use super::inherit::{recv_header, recv_slots, OP_READ, OP_RELEASE};
    use std::io::Write;
    std::thread::spawn(move || {
        let buf = pool(1);
        let mut released = Vec::new();
        while let Ok((op, n)) = recv_header(&mut s) {
            let Ok(slots) = recv_slots(&mut s, n as usize) else {
                break;
            };
            match op {
                OP_RELEASE => released.extend(slots),
                OP_READ => {
                    let mut data = vec![0u8; slots.len() * P];
                    for (i, &x) in slots.iter().enumerate() {
                        assert!(held.contains(&x), "read of a slot never shared: {x}");
                        dev.read_pages(x, &buf, &[0]).unwrap();
                        buf.read_bytes(0, &mut data[i * P..(i + 1) * P]).unwrap();
                    }
                    let mut h = [0u8; 8];
                    h[4..].copy_from_slice(&n.to_ne_bytes());
                    if s.write_all(&h).and_then(|()| s.write_all(&data)).is_err() {
                        break;
                    }
                }
                _ => panic!("unknown request {op}"),
            }
        }
        released
    })
}

#[test]
fn inherited_swap() {
    use super::{InheritLink, InheritedSwap};
    // The parent's device holds pages in slots 100..116 (seed 5); the child's device (64
    // slots) stands for them in its last 16.
    let parent = Arc::new(RamSwap::new(256 * P as u64).unwrap()) as Arc<dyn SwapDevice>;
    let src = pool(16);
    for i in 0..16 {
        fill(&src, i * P, 100 + i as u64, 5);
    }
    let offs: Vec<usize> = (0..16).map(|i| i * P).collect();
    parent.write_pages(100, &src, &offs).unwrap();
    let shared: Vec<u64> = (100..116).collect();
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let served = fake_fork_parent(Arc::clone(&parent), a, shared.clone());
    let link = Arc::new(InheritLink::new(1, b, shared));
    let own = Arc::new(RamSwap::new(SIZE).unwrap()) as Arc<dyn SwapDevice>;
    let dev = InheritedSwap::new(own, Arc::clone(&link)).unwrap();
    assert_eq!(link.base(), NR - 16);
    // An inherited slot reads the parent's page; several in one call are one request.
    let dst = pool(16);
    dev.read_pages(NR - 16, &dst, &offs).unwrap();
    for i in 0..16 {
        check(&dst, i * P, 100 + i as u64, 5, "inherited slot");
    }
    assert_eq!(dev.counters()[3], ("fork_swap_read_pages", 16));
    // Freed (or written) inherited slots are released to the parent and are the child's own.
    dev.invalidate(NR - 16);
    assert_eq!(link.nr_live(), 15);
    // The suite: every slot then behaves as a plain device's (writes make inherited slots the
    // child's own).
    conformance(&dev);
    assert_eq!(link.nr_live(), 0);
    drop(dev);
    drop(link);
    let mut released = served.join().unwrap();
    released.sort_unstable();
    assert_eq!(released, (100..116).collect::<Vec<u64>>());
}

#[test]
fn ram_swap_allocates_on_demand() {
    // 1 GiB of slots costs nothing until written.
    let dev = RamSwap::new(1 << 30).unwrap();
    assert_eq!(dev.nr_pages(), 1 << 18);
    assert_eq!(dev.resident_bytes().unwrap(), 0);
    assert!(dev.reuse_freed_first());
    let src = pool(16);
    for i in 0..16 {
        fill(&src, i * P, 1000 + i as u64, 9);
    }
    let pages: Vec<usize> = (0..16).map(|i| i * P).collect();
    dev.write_pages(1000, &src, &pages).unwrap();
    assert_eq!(dev.resident_bytes().unwrap(), 16 * P as u64);
    // Discarded slots stay warm (their memory is kept for the next write there).
    dev.discard(1000, 8).unwrap();
    assert_eq!(dev.warm_pages(), 8);
    assert_eq!(dev.resident_bytes().unwrap(), 16 * P as u64);
    let dst = pool(16);
    dev.read_pages(1008, &dst, &pages[..8]).unwrap();
    for i in 0..8 {
        check(
            &dst,
            i * P,
            1008 + i as u64,
            9,
            "kept after neighbour discard",
        );
    }
    // A warm slot written again holds the new data and is warm no more.
    fill(&src, 0, 1000, 10);
    dev.write_pages(1000, &src, &[0]).unwrap();
    assert_eq!(dev.warm_pages(), 7);
    dev.read_pages(1000, &dst, &[0]).unwrap();
    check(&dst, 0, 1000, 10, "rewritten warm slot");
}

#[test]
fn ram_swap_gives_back_the_oldest_warm_clusters_beyond_its_bound() {
    // 8 MiB: 2048 slots, at most an eighth (256) warm.
    let dev = RamSwap::new(8 << 20).unwrap();
    write_clusters(&dev, [0u64, 256, 512], 11);
    assert_eq!(dev.resident_bytes().unwrap(), 768 * P as u64);
    dev.discard(0, 256).unwrap();
    assert_eq!(dev.warm_pages(), 256);
    assert_eq!(dev.resident_bytes().unwrap(), 768 * P as u64);
    // Over the bound: the oldest warm range (slots 0..256) is given back.
    dev.discard(256, 256).unwrap();
    assert_eq!(dev.warm_pages(), 256);
    assert_eq!(dev.resident_bytes().unwrap(), 512 * P as u64);
    let dst = pool(1);
    dev.read_pages(0, &dst, &[0]).unwrap();
    assert!(
        (0..P).step_by(8).all(|o| dst.read_u64(o) == 0),
        "a given-back slot reads as zeros"
    );
    // The live range beside them kept its data throughout.
    let all = pool(256);
    let pages: Vec<usize> = (0..256).map(|i| i * P).collect();
    dev.read_pages(512, &all, &pages).unwrap();
    for i in 0..256 {
        check(
            &all,
            i * P,
            512 + i as u64,
            11,
            "live slots beside discards",
        );
    }
    // Rewriting part of the warm range un-warms just those slots.
    let src = pool(1);
    fill(&src, 0, 300, 12);
    dev.write_pages(300, &src, &[0]).unwrap();
    assert_eq!(dev.warm_pages(), 255);
    dev.read_pages(300, &dst, &[0]).unwrap();
    check(&dst, 0, 300, 12, "rewritten warm slot");
}

#[test]
fn ram_swap_gives_back_single_freed_slots_once_they_waited() {
    // 8 MiB: 2048 slots, at most 256 warm. Every other slot freed, so no cluster is ever
    // wholly free and nothing is discarded: only the frees give pages back.
    let dev = RamSwap::new(8 << 20).unwrap();
    write_clusters(&dev, (0..2048u64).step_by(256), 13);
    assert_eq!(dev.resident_bytes().unwrap(), 2048 * P as u64);
    for s in (1..2048u64).step_by(2) {
        dev.invalidate(s);
    }
    // Freshly freed: all kept for reuse, even past the bound.
    assert_eq!(dev.warm_pages(), 1024);
    dev.trim();
    assert_eq!(
        dev.warm_pages(),
        1024,
        "given back before they waited the warm age"
    );
    assert_eq!(dev.resident_bytes().unwrap(), 2048 * P as u64);
    // Once they waited: the oldest given back down to the bound, in one batch.
    dev.set_warm_age(std::time::Duration::ZERO);
    dev.trim();
    assert_eq!(dev.warm_pages(), 256);
    assert_eq!(
        dev.resident_bytes().unwrap(),
        (1024 + 256) * P as u64,
        "the device holds the live slots and the warm ones, no other freed slot"
    );
    let dst = pool(1);
    dev.read_pages(1, &dst, &[0]).unwrap();
    assert!(
        (0..P).step_by(8).all(|o| dst.read_u64(o) == 0),
        "the oldest freed slot was given back"
    );
    for s in (0..2048u64).step_by(2) {
        dev.read_pages(s, &dst, &[0]).unwrap();
        check(&dst, 0, s, 13, "live slot beside freed ones");
    }
    // A freed slot written again, given back or still warm, holds the new data.
    let src = pool(1);
    for s in [1u64, 2047] {
        fill(&src, 0, s, 14);
        dev.write_pages(s, &src, &[0]).unwrap();
        dev.read_pages(s, &dst, &[0]).unwrap();
        check(&dst, 0, s, 14, "rewritten freed slot");
    }
    assert_eq!(
        dev.warm_pages(),
        255,
        "the warm one rewritten is warm no more"
    );
}

#[test]
fn ram_swap_gives_back_what_stayed_unused_below_its_bound() {
    // 8 MiB: 2048 slots, at most 256 warm. 144 warm pages, below the bound: a discarded
    // half-cluster and 16 single freed slots.
    let dev = RamSwap::new(8 << 20).unwrap();
    write_clusters(&dev, [0u64, 256, 512], 16);
    dev.discard(0, 128).unwrap();
    for s in 300..316u64 {
        dev.invalidate(s);
    }
    assert_eq!(dev.warm_pages(), 144);
    dev.set_warm_age(std::time::Duration::ZERO);
    dev.trim();
    assert_eq!(
        dev.warm_pages(),
        144,
        "below the bound, given back before the idle age"
    );
    assert_eq!(dev.resident_bytes().unwrap(), 768 * P as u64);
    // Unused for the idle age: all given back, the range and the singles.
    dev.set_idle_age(std::time::Duration::ZERO);
    dev.trim();
    assert_eq!(dev.warm_pages(), 0);
    assert_eq!(
        dev.resident_bytes().unwrap(),
        (768 - 144) * P as u64,
        "the device holds the live slots only"
    );
    let dst = pool(1);
    for s in [0u64, 127, 300, 315] {
        dev.read_pages(s, &dst, &[0]).unwrap();
        assert!(
            (0..P).step_by(8).all(|o| dst.read_u64(o) == 0),
            "given-back slot {s} reads as zeros"
        );
    }
    for s in (128..300u64).chain(316..768) {
        dev.read_pages(s, &dst, &[0]).unwrap();
        check(&dst, 0, s, 16, "live slot beside given-back ones");
    }
    // Freed again later: kept until it too has waited.
    dev.set_idle_age(std::time::Duration::from_secs(3600));
    dev.invalidate(400);
    dev.discard(512, 128).unwrap();
    dev.trim();
    assert_eq!(dev.warm_pages(), 129);
    let src = pool(1);
    fill(&src, 0, 0, 17);
    dev.write_pages(0, &src, &[0]).unwrap();
    dev.read_pages(0, &dst, &[0]).unwrap();
    check(&dst, 0, 0, 17, "a given-back slot written again");
}

#[test]
fn ram_swap_gives_back_a_large_backlog_over_several_trims() {
    // 64 MiB: 16384 slots, at most 2048 warm; 8192 single slots freed at once.
    let dev = RamSwap::new(64 << 20).unwrap();
    write_clusters(&dev, (0..16384u64).step_by(256), 15);
    for s in (1..16384u64).step_by(2) {
        dev.invalidate(s);
    }
    dev.set_warm_age(std::time::Duration::ZERO);
    assert_eq!(dev.warm_pages(), 8192);
    let max = super::ram::TRIM_MAX;
    dev.trim();
    assert_eq!(
        dev.warm_pages(),
        8192 - max,
        "one trim gives back at most {max}"
    );
    dev.trim();
    assert_eq!(dev.warm_pages(), 2048, "the next ones reach the bound");
    assert_eq!(dev.resident_bytes().unwrap(), (8192 + 2048) * P as u64);
    let dst = pool(1);
    for s in (0..16384u64).step_by(2 * 97) {
        dev.read_pages(s, &dst, &[0]).unwrap();
        check(&dst, 0, s, 15, "live slot after the trims");
    }
}

#[test]
fn ram_swap_counts_a_slot_freed_twice_once() {
    // A slot freed, written again and freed again is queued twice (once per freeing), and a
    // discarded range rewritten and discarded again is too: both entries age together, and
    // giving them back must count the slot once.
    let dev = RamSwap::new(8 << 20).unwrap();
    write_clusters(&dev, [0u64, 256], 21);
    let src = pool(1);
    for _ in 0..3 {
        dev.invalidate(7);
        fill(&src, 0, 7, 22);
        dev.write_pages(7, &src, &[0]).unwrap();
    }
    dev.invalidate(7);
    for _ in 0..2 {
        dev.discard(256, 64).unwrap();
        write_clusters(&dev, [256u64], 23);
    }
    dev.discard(256, 64).unwrap();
    assert_eq!(dev.warm_pages(), 65);
    dev.set_idle_age(std::time::Duration::ZERO);
    dev.set_warm_age(std::time::Duration::ZERO);
    dev.trim();
    assert_eq!(dev.warm_pages(), 0);
    dev.invalidate(8);
    assert_eq!(dev.warm_pages(), 1, "the count goes on from zero");
    dev.trim();
    assert_eq!(dev.warm_pages(), 0);
}

#[test]
fn faulty_swap_without_failures() {
    let dev = FaultySwap::new(Arc::new(FileSwap::open(None, SIZE).unwrap()));
    assert!(dev.name().starts_with("faulty(file:"), "{}", dev.name());
    conformance(&dev);
    assert_eq!(dev.injected_write_failures(), 0);
    assert_eq!(dev.injected_read_failures(), 0);
}

#[test]
fn swap_config_opens_each_backend() {
    use super::SwapConfig;
    let file = SwapConfig::File {
        path: None,
        size: SIZE,
    }
    .open()
    .unwrap()
    .unwrap();
    conformance(file.as_ref());
    let ram = SwapConfig::Ram { size: SIZE }.open().unwrap().unwrap();
    assert_eq!(ram.nr_pages(), NR);
    assert!(SwapConfig::None.open().unwrap().is_none());
    let dev = SwapConfig::Device(ram.clone()).open().unwrap().unwrap();
    assert!(Arc::ptr_eq(&dev, &ram));
}

// ---------------------------------------------------------------------------------------------
// Error cases.

#[test]
fn sizes_below_one_page_are_refused() {
    for size in [0u64, 1, 4095] {
        let mut errs = vec![
            FileSwap::open(None, size).unwrap_err(),
            RamSwap::new(size).unwrap_err(),
        ];
        let dir = TempDir::new("size");
        let path = dir.path().join("swap");
        errs.push(FileSwap::open(Some(&path), size).unwrap_err());
        assert!(!path.exists(), "a refused size must not create the file");
        for e in errs {
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{size} bytes")) && msg.contains("4096"),
                "{msg}"
            );
        }
    }
    assert_eq!(FileSwap::open(None, 4096).unwrap().nr_pages(), 1);
    assert_eq!(RamSwap::new(4096 * 2 + 4095).unwrap().nr_pages(), 2);
}

#[test]
fn huge_sizes_are_refused() {
    let e = FileSwap::open(None, u64::MAX).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(RamSwap::new(u64::MAX).is_err());
}

#[test]
fn unwritable_path_is_named_in_the_error() {
    let e = FileSwap::open(Some(Path::new("/proc/usermm-nope/swap")), SIZE).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("/proc/usermm-nope/swap"), "{msg}");
    assert!(msg.contains("pass a writable swap path"), "{msg}");
    assert!(!msg.contains("os error"), "{msg}");

    let e = FileSwap::open_unlinked_in(Path::new("/nonexistent-usermm"), SIZE).unwrap_err();
    let msg = e.to_string();
    assert_eq!(
        msg,
        "cannot create swap file in /nonexistent-usermm (No such file or directory): \
         set TMPDIR or pass a writable swap path"
    );
}

#[test]
fn non_regular_path_is_refused() {
    let dir = TempDir::new("notfile");
    let e = FileSwap::open(Some(dir.path()), SIZE).unwrap_err();
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
}

fn faulty_ram() -> FaultySwap {
    FaultySwap::new(Arc::new(RamSwap::new(SIZE).unwrap()))
}

#[test]
fn faulty_swap_fails_all_writes() {
    let dev = faulty_ram().fail_writes(FailMode::All);
    let p = pool(2);
    fill(&p, 0, 5, 1);
    dev.inner().write_pages(5, &p, &[0]).unwrap();
    fill(&p, 0, 5, 2);
    let e = dev.write_pages(5, &p, &[0]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Other);
    assert_eq!(e.to_string(), "injected write failure at slot 5");
    assert_eq!(dev.injected_write_failures(), 1);
    // The failed write transferred nothing; reads still work.
    dev.read_pages(5, &p, &[P]).unwrap();
    check(&p, P, 5, 1, "after injected write failure");
    assert_eq!(dev.injected_read_failures(), 0);
    dev.discard(5, 1).unwrap();
}

#[test]
fn faulty_swap_fails_after_n() {
    let dev = faulty_ram().fail_reads(FailMode::AfterN(2));
    let p = pool(1);
    dev.write_pages(0, &p, &[0]).unwrap();
    dev.read_pages(0, &p, &[0]).unwrap();
    dev.read_pages(0, &p, &[0]).unwrap();
    for _ in 0..3 {
        let e = dev.read_pages(0, &p, &[0]).unwrap_err();
        assert_eq!(e.to_string(), "injected read failure at slot 0");
    }
    assert_eq!(dev.injected_read_failures(), 3);
    assert_eq!(dev.injected_write_failures(), 0);
    // Setting a mode at run time restarts the count.
    dev.set_read_mode(FailMode::AfterN(1));
    dev.read_pages(0, &p, &[0]).unwrap();
    assert!(dev.read_pages(0, &p, &[0]).is_err());
    dev.set_read_mode(FailMode::Never);
    dev.read_pages(0, &p, &[0]).unwrap();
    assert_eq!(dev.injected_read_failures(), 4);
}

#[test]
fn faulty_swap_fails_every_nth() {
    let dev = faulty_ram()
        .fail_writes(FailMode::EveryNth(3))
        .fail_reads(FailMode::EveryNth(2));
    let p = pool(1);
    let w: Vec<bool> = (0..9)
        .map(|i| dev.write_pages(i, &p, &[0]).is_ok())
        .collect();
    assert_eq!(w, [true, true, false, true, true, false, true, true, false]);
    let r: Vec<bool> = (0..4)
        .map(|i| dev.read_pages(i, &p, &[0]).is_ok())
        .collect();
    assert_eq!(r, [true, false, true, false]);
    assert_eq!(dev.injected_write_failures(), 3);
    assert_eq!(dev.injected_read_failures(), 2);
    assert_eq!(dev.write_mode(), FailMode::EveryNth(3));
}

#[test]
fn faulty_swap_fails_ops_touching_a_slot() {
    let dev = faulty_ram()
        .fail_writes(FailMode::Slot(5))
        .fail_reads(FailMode::Slot(6));
    let p = pool(4);
    let four: Vec<usize> = (0..4).map(|i| i * P).collect();
    dev.write_pages(0, &p, &four[..3]).unwrap(); // 0..3
    dev.write_pages(6, &p, &four).unwrap(); // 6..10
    let e = dev.write_pages(3, &p, &four).unwrap_err(); // 3..7 includes 5
    assert_eq!(e.to_string(), "injected write failure at slot 5");
    assert!(dev.write_pages(5, &p, &[0]).is_err());
    dev.read_pages(0, &p, &four).unwrap(); // 0..4
    let e = dev.read_pages(4, &p, &four).unwrap_err(); // 4..8 includes 6
    assert_eq!(e.to_string(), "injected read failure at slot 6");
    assert_eq!(dev.injected_write_failures(), 2);
    assert_eq!(dev.injected_read_failures(), 1);
}

// ---------------------------------------------------------------------------------------------
// The compressed tier.

use super::{Compressor, SwapConfig, Zswap};

fn counter(dev: &dyn SwapDevice, name: &str) -> u64 {
    dev.counters()
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{} has no counter {name}", dev.name()))
        .1
}

#[test]
fn zswap_lz4_over_ram() {
    let dev = Zswap::new(
        Arc::new(RamSwap::new(SIZE).unwrap()),
        Compressor::Lz4,
        1 << 20,
    );
    assert!(dev.name().starts_with("zswap(lz4, "), "{}", dev.name());
    assert!(dev.name().contains("+ram"), "{}", dev.name());
    conformance(&dev);
    assert!(counter(&dev, "zswpout") > 0);
    assert!(counter(&dev, "zswpin") > 0);
    assert!(counter(&dev, "zswap_reject_compress_poor") > 0);
}

#[test]
fn zswap_zstd_over_file() {
    let lower = Arc::new(FileSwap::open(None, SIZE).unwrap());
    let dev = Zswap::new(lower, Compressor::Zstd(3), 1 << 20);
    assert!(dev.name().starts_with("zswap(zstd:3, "), "{}", dev.name());
    conformance(&dev);
    assert!(counter(&dev, "zswpin") > 0);
}

#[test]
fn zswap_with_a_tiny_pool_writes_back_during_the_suite() {
    // Room for a handful of compressed pages: every store pushes older ones to the file,
    // concurrently with reads and overwrites of the same slots.
    let lower = Arc::new(FileSwap::open(None, SIZE).unwrap());
    let dev = Zswap::new(lower, Compressor::Lz4, 3 * 4096);
    conformance(&dev);
    assert!(counter(&dev, "zswpwb") > 0);
    assert!(dev.pool_bytes() <= dev.max_pool_bytes() + dev.max_pool_bytes() / 8);
}

/// A page of real, compressible data: this crate's source text.
fn text_page(k: usize) -> [u8; P] {
    let src = include_bytes!("zswap.rs");
    let mut page = [0u8; P];
    for (i, b) in page.iter_mut().enumerate() {
        *b = src[(k * 1777 + i) % src.len()];
    }
    page
}

/// An incompressible page (xorshift).
fn random_page(k: usize) -> [u8; P] {
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut page = [0u8; P];
    for c in page.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_ne_bytes());
    }
    page
}

#[test]
fn zswap_stores_real_data_by_kind() {
    for comp in [Compressor::Lz4, Compressor::Zstd(3)] {
        let lower = Arc::new(RamSwap::new(1 << 20).unwrap());
        let dev = Zswap::new(lower.clone(), comp, 1 << 20);
        // 64 pages: 16 zero, 16 same-filled with another word, 16 text, 16 random.
        let src = pool(64);
        let mut want = Vec::new();
        for k in 0..64 {
            let page: [u8; P] = match k / 16 {
                0 => [0; P],
                1 => {
                    let mut p = [0u8; P];
                    for c in p.chunks_exact_mut(8) {
                        c.copy_from_slice(&(0xdead_beef_0000_0000u64 + k as u64).to_ne_bytes());
                    }
                    p
                }
                2 => text_page(k),
                _ => random_page(k),
            };
            src.write_bytes(k * P, &page).unwrap();
            want.push(page);
        }
        // Interleave kinds within one batch: slot order k*5 % 64 mixes them.
        let order: Vec<usize> = (0..64).map(|k| (k * 5) % 64).collect();
        let offs: Vec<usize> = order.iter().map(|k| k * P).collect();
        dev.write_pages(100, &src, &offs).unwrap();
        assert_eq!(counter(&dev, "zswap_same_filled"), 32, "{comp}");
        assert_eq!(counter(&dev, "zswap_reject_compress_poor"), 16, "{comp}");
        assert_eq!(counter(&dev, "zswap_stored_pages"), 48, "{comp}");
        assert_eq!(counter(&dev, "zswpout"), 48, "{comp}");
        let pool_bytes = counter(&dev, "zswap_pool_bytes");
        assert!(
            pool_bytes > 0 && pool_bytes < 16 * P as u64 * 3 / 4,
            "{comp}: {pool_bytes}"
        );
        // Only the random pages reached the lower device.
        assert_eq!(lower.resident_bytes().unwrap(), 16 * P as u64, "{comp}");
        let dst = pool(64);
        let back: Vec<usize> = (0..64).rev().map(|k| k * P).collect();
        dev.read_pages(100, &dst, &back).unwrap();
        for (i, &k) in order.iter().enumerate() {
            let mut got = [0u8; P];
            dst.read_bytes(back[i], &mut got).unwrap();
            assert!(
                got == want[k],
                "{comp}: page {k} (slot {}) differs",
                100 + i
            );
        }
        assert_eq!(counter(&dev, "zswpin"), 48, "{comp}");
        // Freed slots leave the pool.
        for s in 100..132 {
            dev.invalidate(s);
        }
        dev.discard(132, 32).unwrap();
        assert_eq!(counter(&dev, "zswap_stored_pages"), 0, "{comp}");
        assert_eq!(counter(&dev, "zswap_pool_bytes"), 0, "{comp}");
        assert_eq!(counter(&dev, "zswap_same_filled"), 0, "{comp}");
    }
}

#[test]
fn zswap_writes_the_oldest_back_under_pressure() {
    let lower = Arc::new(RamSwap::new(4 << 20).unwrap());
    let max = 64 << 10;
    let dev = Zswap::new(lower.clone(), Compressor::Lz4, max);
    let src = pool(1);
    let mut pages = Vec::new();
    for k in 0..512 {
        let page = text_page(k);
        src.write_bytes(0, &page).unwrap();
        dev.write_pages(k as u64, &src, &[0]).unwrap();
        // Each page is read once (the pool is useful), so it goes on admitting stores.
        dev.read_pages(k as u64, &src, &[0]).unwrap();
        pages.push(page);
        assert!(
            dev.pool_bytes() <= max,
            "pool of {} bytes past its bound of {max} after slot {k}",
            dev.pool_bytes()
        );
    }
    let wb = counter(&dev, "zswpwb");
    assert!(wb > 0);
    assert_eq!(counter(&dev, "zswap_stored_pages") + wb, 512);
    assert_eq!(lower.resident_bytes().unwrap(), wb * P as u64);
    // LRU order: the oldest slots went down, the newest are still compressed.
    let dst = pool(1);
    let mut got = [0u8; P];
    lower.read_pages(0, &dst, &[0]).unwrap();
    dst.read_bytes(0, &mut got).unwrap();
    assert!(
        got == pages[0],
        "slot 0 (the oldest) must have been written back"
    );
    lower.read_pages(511, &dst, &[0]).unwrap();
    dst.read_bytes(0, &mut got).unwrap();
    assert!(
        got == [0u8; P],
        "slot 511 (the newest) must still be in the pool"
    );
    // Every page reads back through the tier, from wherever it is.
    for (k, page) in pages.iter().enumerate() {
        dev.read_pages(k as u64, &dst, &[0]).unwrap();
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == *page, "slot {k}");
    }
}

/// A full pool that only delays a stream (its entries are written back never read) sends
/// stores straight to the device below, but for one in 32; once its entries are read again, it
/// admits every store again. Every page reads back wherever it went.
#[test]
fn zswap_full_pool_passes_unread_streams_down() {
    let lower = Arc::new(RamSwap::new(16 << 20).unwrap());
    let max = 64 << 10;
    let dev = Zswap::new(lower.clone(), Compressor::Lz4, max);
    let src = pool(1);
    let dst = pool(1);
    let mut got = [0u8; P];
    // A stream of 1024 pages never read: after the first writebacks, most stores go down.
    for k in 0..1024 {
        src.write_bytes(0, &text_page(k)).unwrap();
        dev.write_pages(k as u64, &src, &[0]).unwrap();
    }
    let rejected = counter(&dev, "zswap_reject_unread");
    let stored = counter(&dev, "zswpout");
    assert!(
        rejected > 700,
        "a stream through a full pool: {rejected} of 1024 stores went straight down"
    );
    assert!(
        stored > 1024 / 32,
        "one store in 32 is still admitted: {stored}"
    );
    assert_eq!(stored + rejected, 1024);
    for k in 0..1024 {
        dev.read_pages(k as u64, &dst, &[0]).unwrap();
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == text_page(k), "slot {k}");
    }
    // Now every stored page is read soon after it is stored: the pool is useful again, and
    // admits every store once the verdict has turned.
    for k in 0..4096usize {
        let slot = (1024 + k % 2048) as u64;
        src.write_bytes(0, &text_page(k + 5000)).unwrap();
        dev.write_pages(slot, &src, &[0]).unwrap();
        dev.read_pages(slot, &dst, &[0]).unwrap();
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == text_page(k + 5000), "slot {slot}");
    }
    let before = counter(&dev, "zswap_reject_unread");
    for k in 0..256usize {
        let slot = (1024 + k) as u64;
        src.write_bytes(0, &text_page(k + 9000)).unwrap();
        dev.write_pages(slot, &src, &[0]).unwrap();
        dev.read_pages(slot, &dst, &[0]).unwrap();
    }
    assert_eq!(
        counter(&dev, "zswap_reject_unread"),
        before,
        "a pool whose entries are read admits every store"
    );
}

#[test]
fn zswap_keeps_pages_when_writeback_fails() {
    let lower = Arc::new(FaultySwap::new(Arc::new(RamSwap::new(4 << 20).unwrap())));
    lower.set_write_mode(FailMode::All);
    let max = 32 << 10;
    let dev = Zswap::new(lower.clone(), Compressor::Lz4, max);
    let src = pool(1);
    let mut stored = 0;
    for k in 0..256 {
        src.write_bytes(0, &text_page(k)).unwrap();
        match dev.write_pages(k as u64, &src, &[0]) {
            Ok(()) => stored += 1,
            // Over the hard bound the store goes to the (failing) lower device: an error the
            // manager answers by keeping the page resident.
            Err(e) => assert!(e.to_string().contains("injected write failure"), "{e}"),
        }
    }
    assert!(counter(&dev, "zswap_writeback_error") > 0);
    assert!(counter(&dev, "zswap_pool_limit_hit") > 0);
    assert_eq!(counter(&dev, "zswpwb"), 0);
    assert!(dev.pool_bytes() <= max + max / 8 + 4096);
    // Nothing stored was lost.
    let dst = pool(1);
    let mut got = [0u8; P];
    for k in 0..stored {
        dev.read_pages(k as u64, &dst, &[0]).unwrap();
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == text_page(k), "slot {k}");
    }
}

#[test]
fn swap_specs_parse_and_name_bad_values() {
    let c = SwapConfig::parse("zswap+file", SIZE).unwrap();
    assert_eq!(c.spec().unwrap(), "zswap:lz4,pool=20%+file");
    let c = SwapConfig::parse("zswap", SIZE).unwrap();
    assert_eq!(c.spec().unwrap(), "zswap:lz4,pool=20%+file");
    let c = SwapConfig::parse("zswap:zstd", SIZE).unwrap();
    assert_eq!(c.spec().unwrap(), "zswap:zstd=3,pool=20%+file");
    assert_eq!(c.size(), SIZE);
    let c = SwapConfig::parse("zswap:zstd=5,pool=8M+file:/tmp/x", SIZE).unwrap();
    assert_eq!(c.spec().unwrap(), "zswap:zstd=5,pool=8388608+file:/tmp/x");
    let dev = SwapConfig::parse("zswap:pool=50%+ram", SIZE)
        .unwrap()
        .open_for_budget(8 << 20, FileSwapOptions::default())
        .unwrap()
        .unwrap();
    assert!(
        dev.name().contains("pool max 4194304 bytes"),
        "{}",
        dev.name()
    );
    assert!(
        dev.name().ends_with("+ram (64 pages, on demand)"),
        "{}",
        dev.name()
    );
    let tiers = super::tiers(&dev);
    assert_eq!(tiers.len(), 2);
    assert!(tiers[0].1.iter().any(|(n, _)| *n == "zswpout"));
    conformance(dev.as_ref());
    for (bad, named) in [
        ("zswap+", "\"\""),
        ("zswap+none", "not none"),
        ("zswap+zswap+ram", "another zswap"),
        ("zswap+disk", "\"disk\""),
        ("zswap:lz5+ram", "\"lz5\""),
        ("zswap:zstd=99+ram", "\"zstd=99\""),
        ("zswap:pool=0%+ram", "\"pool=0%\""),
        ("zswap:pool=12Q+ram", "\"pool=12Q\""),
        ("zswapfile", "\"zswapfile\""),
        ("file:", "needs a path"),
        ("floppy", "\"floppy\""),
    ] {
        let e = SwapConfig::parse(bad, SIZE).unwrap_err().to_string();
        assert!(e.contains(named), "{bad}: {e}");
        assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster: a live 3-primary/3-replica cluster on loopback (tests/redis_fixture).

#[path = "../../tests/redis_fixture/mod.rs"]
mod redis_fixture;

use super::{RedisConfig, RedisSwap, RedisTls};

fn redis_cfg(c: &redis_fixture::Cluster, user: bool) -> RedisConfig {
    let mut r = RedisConfig::parse(&c.spec(user), SIZE).unwrap();
    r.password = Some(redis_fixture::PASSWORD.into());
    r
}

/// The device of `r` with WAIT 1 passes the suite, and a run inside one hash tag is one round
/// trip each way.
fn redis_wait_one_round_trip(mut r: RedisConfig) -> RedisSwap {
    r.sync_replicas = 1;
    let dev = RedisSwap::open(&r).unwrap();
    assert!(dev.name().contains("WAIT 1"), "{}", dev.name());
    conformance(&dev);
    let before = counter(&dev, "redis_round_trips");
    let src = pool(32);
    let offs: Vec<usize> = (0..32).map(|i| i * P).collect();
    dev.write_pages(0, &src, &offs).unwrap();
    dev.read_pages(0, &src, &offs).unwrap();
    assert_eq!(counter(&dev, "redis_round_trips") - before, 2);
    dev
}

#[test]
fn redis_cluster_conformance_auth_and_dead_nodes() {
    if !redis_fixture::available() {
        crate::sys::skip_test("redis-server/redis-cli not installed (.ci/run installs them)");
        return;
    }
    let mut c = redis_fixture::Cluster::start();
    // The ACL user, and the default user with WAIT 1.
    let dev = RedisSwap::open(&redis_cfg(&c, true)).unwrap();
    assert!(
        dev.name().starts_with("redis://swapper@127.0.0.1:"),
        "{}",
        dev.name()
    );
    conformance(&dev);
    redis_wait_one_round_trip(redis_cfg(&c, false));
    // zswap in front of Redis.
    let z = Zswap::new(
        Arc::new(RedisSwap::open(&redis_cfg(&c, true)).unwrap()),
        Compressor::Lz4,
        1 << 20,
    );
    conformance(&z);
    assert!(counter(&z, "zswap_reject_compress_poor") > 0);
    let cfg = SwapConfig::parse(&format!("zswap+{}", c.spec(true)), SIZE).unwrap();
    assert!(
        matches!(&cfg, SwapConfig::Zswap { lower, .. } if matches!(**lower, SwapConfig::Redis(_)))
    );

    // Encrypted at rest: the suite passes, the store holds ciphertext, and a value altered in
    // the store fails the read instead of returning someone else's bytes.
    let mut ec = redis_cfg(&c, true);
    ec.encrypt = true;
    let enc = RedisSwap::open(&ec).unwrap();
    assert!(enc.name().ends_with(", encrypted)"), "{}", enc.name());
    conformance(&enc);
    let p1 = pool(1);
    fill(&p1, 0, 9, 77);
    enc.write_pages(9, &p1, &[0]).unwrap();
    let mut plain = vec![0u8; P];
    p1.read_bytes(0, &mut plain).unwrap();
    let client = redis::cluster::ClusterClientBuilder::new(
        ec.nodes
            .iter()
            .map(|n| format!("redis://{n}"))
            .collect::<Vec<_>>(),
    )
    .username(ec.user.clone().unwrap())
    .password(redis_fixture::PASSWORD.to_string())
    .build()
    .unwrap();
    let mut conn = client.get_connection().unwrap();
    let at = RedisSwap::offset(9);
    let stored: Vec<u8> = redis::cmd("GETRANGE")
        .arg(enc.key(9))
        .arg(at)
        .arg(at + P - 1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(stored.len(), P);
    assert_ne!(stored, plain, "the page reached the cluster in the clear");
    let _: i64 = redis::cmd("SETRANGE")
        .arg(enc.key(9))
        .arg(at + 100)
        .arg(&[stored[100] ^ 1][..])
        .query(&mut conn)
        .unwrap();
    let e = enc.read_pages(9, &p1, &[0]).unwrap_err();
    assert!(e.to_string().contains("failed authentication"), "{e}");

    // A group lost, then written again (SETRANGE zero-fills what lies before the range it
    // writes): its other slots read as lost, never as zeros. A deleted group reads as lost.
    let mut big = redis_cfg(&c, true);
    big.size = 256 * P as u64;
    let dev = RedisSwap::open(&big).unwrap();
    let p3 = pool(3);
    for i in 0..3 {
        fill(&p3, i * P, 70 + i as u64, 5);
    }
    dev.write_pages(70, &p3, &[0, P, 2 * P]).unwrap();
    let _: i64 = redis::cmd("DEL").arg(dev.key(70)).query(&mut conn).unwrap();
    let e = dev.read_pages(71, &p3, &[0]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("ends before slot 71"), "{e}");
    dev.write_pages(72, &p3, &[2 * P]).unwrap();
    let e = dev.read_pages(70, &p3, &[0]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string()
            .contains("holds zeros where slot 70 was written"),
        "{e}"
    );
    dev.read_pages(72, &p3, &[P]).unwrap();
    check(&p3, P, 72, 5, "written again beside lost slots");
    assert_eq!(counter(&dev, "redis_missing_keys"), 2);
    // A run across three groups, and a window of three runs in two groups: one round trip
    // each, every node's commands in one pipeline.
    let src = pool(130);
    let offs: Vec<usize> = (0..130).map(|i| i * P).collect();
    for i in 0..130 {
        fill(&src, i * P, 60 + i as u64, 6);
    }
    let before = counter(&dev, "redis_round_trips");
    dev.write_pages(60, &src, &offs).unwrap();
    assert_eq!(counter(&dev, "redis_round_trips") - before, 1);
    let dst = pool(31);
    let runs = [
        SlotRun {
            slot: 60,
            pages: &offs[..10],
        },
        SlotRun {
            slot: 150,
            pages: &offs[10..30],
        },
        SlotRun {
            slot: 100,
            pages: &offs[30..31],
        },
    ];
    for r in dev.read_runs(&runs, &dst) {
        r.unwrap();
    }
    assert_eq!(counter(&dev, "redis_round_trips") - before, 2);
    for r in &runs {
        for (j, &off) in r.pages.iter().enumerate() {
            check(&dst, off, r.slot + j as u64, 6, "read_runs");
        }
    }
    // Dropped, the device deletes every group it wrote and did not discard.
    let keys = [dev.key(0), dev.key(64), dev.key(128)];
    for k in &keys {
        let n: i64 = redis::cmd("EXISTS").arg(k).query(&mut conn).unwrap();
        assert_eq!(n, 1, "{k} was written");
    }
    drop(dev);
    for k in &keys {
        let n: i64 = redis::cmd("EXISTS").arg(k).query(&mut conn).unwrap();
        assert_eq!(
            n, 0,
            "{k} is left in the cluster after the device was dropped"
        );
    }
    // A run's keys (`USERMM_REDIS_RUN`, set by `usermm run`): two devices of the run leave
    // theirs (never dropped, as processes killed with SIGKILL), a device of no run keeps its
    // own; purge_run deletes exactly the run's.
    let rc = redis_cfg(&c, true);
    let of_run = |v: &str| {
        if v == super::redis::RUN_ENV {
            Some("t-purge".into())
        } else {
            std::env::var_os(v)
        }
    };
    let a = RedisSwap::open_with_env(&rc, &of_run).unwrap();
    let b = RedisSwap::open_with_env(&rc, &of_run).unwrap();
    let other = RedisSwap::open(&rc).unwrap();
    let p1 = pool(1);
    fill(&p1, 0, 3, 9);
    for d in [&a, &b, &other] {
        d.write_pages(3, &p1, &[0]).unwrap();
    }
    let (ka, kb, ko) = (a.key(3), b.key(3), other.key(3));
    assert!(ka.starts_with("usermm:{t-purge-"), "{ka}");
    std::mem::forget(a);
    std::mem::forget(b);
    assert_eq!(super::redis::purge_run(&rc, "t-purge").unwrap(), 2);
    let mut exists = |k: &str| -> i64 { redis::cmd("EXISTS").arg(k).query(&mut conn).unwrap() };
    assert_eq!((exists(&ka), exists(&kb), exists(&ko)), (0, 0, 1));
    assert_eq!(super::redis::purge_run(&rc, "t-purge").unwrap(), 0);
    other.read_pages(3, &p1, &[0]).unwrap();
    check(&p1, 0, 3, 9, "a device of no run after a purge");
    // A run name that cannot be part of a key is refused, naming the variable.
    let bad = |v: &str| (v == super::redis::RUN_ENV).then(|| "a b*".into());
    let e = RedisSwap::open_with_env(&rc, &bad).unwrap_err().to_string();
    assert!(e.contains("USERMM_REDIS_RUN=\"a b*\""), "{e}");
    assert!(super::redis::purge_run(&rc, "*").is_err());

    // Wrong password, at open and at Mm::new.
    let mut bad = redis_cfg(&c, true);
    bad.password = Some("wrong".into());
    let e = RedisSwap::open(&bad).unwrap_err().to_string();
    assert!(
        e.contains("authentication as user \"swapper\" failed")
            && e.contains("USERMM_REDIS_PASSWORD"),
        "{e}"
    );
    let e = crate::Mm::new(crate::MmConfig::new(8 << 20).swap(SwapConfig::Redis(bad)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("authentication as user \"swapper\" failed"),
        "{e}"
    );
    // rediss:// to nodes that speak plain TCP: a clear error, in bounded time.
    let mut tls = redis_cfg(&c, true);
    tls.tls = Some(RedisTls::default());
    let t0 = std::time::Instant::now();
    let e = RedisSwap::open(&tls).unwrap_err().to_string();
    eprintln!("{e} ({:?})", t0.elapsed());
    assert!(
        e.contains("cannot connect to redis cluster rediss://swapper@")
            && e.contains("no TLS answer: are these the nodes' tls-ports?"),
        "{e}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t0.elapsed()
    );
    // A password in the spec is refused.
    let e = SwapConfig::parse("redis://u:pw@127.0.0.1:1", SIZE)
        .unwrap_err()
        .to_string();
    assert!(e.contains("password in the swap spec is refused"), "{e}");

    // Every node down: writes and reads fail with clear errors, within bounded time.
    let mut r = redis_cfg(&c, true);
    r.read_retry = std::time::Duration::from_secs(2);
    let dev = RedisSwap::open(&r).unwrap();
    let p1 = pool(1);
    fill(&p1, 0, 3, 1);
    dev.write_pages(3, &p1, &[0]).unwrap();
    c.kill_all();
    let t0 = std::time::Instant::now();
    let e = dev.write_pages(4, &p1, &[0]).unwrap_err();
    assert!(
        e.to_string()
            .contains("redis SETRANGE of 1 pages at usermm:{"),
        "{e}"
    );
    // The failed write dropped its connection: the read fails connecting (or in MGET).
    let e = dev.read_pages(3, &p1, &[0]).unwrap_err();
    assert!(
        e.to_string()
            .contains("redis GETRANGE of 1 range(s) from usermm:{")
            || e.to_string()
                .contains("connecting to redis://swapper@127.0.0.1:"),
        "{e}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t0.elapsed()
    );
    assert!(counter(&dev, "redis_errors") >= 2);
}

/// A device configuration for the TLS cluster `c`: its CA and the client certificate.
fn redis_tls_cfg(c: &redis_fixture::Cluster) -> RedisConfig {
    let t = c.tls.as_ref().expect("a TLS cluster");
    let mut r = redis_cfg(c, true);
    r.tls = Some(RedisTls {
        ca_cert: Some(t.ca.clone()),
        cert: Some(t.client_cert.clone()),
        key: Some(t.client_key.clone()),
    });
    r
}

/// The same cluster speaking only TLS (`--port 0 --tls-port`, TLS on the cluster bus and for
/// replication, client certificates required): the suite over `rediss://` with and without
/// WAIT and below zswap, one round trip per run, and every certificate mistake a clear error
/// at open naming the file and what to do.
#[test]
fn redis_tls_cluster_conformance_and_certificate_errors() {
    if !redis_fixture::available() {
        crate::sys::skip_test("redis-server/redis-cli not installed (.ci/run installs them)");
        return;
    }
    if !redis_fixture::openssl_available() {
        crate::sys::skip_test("openssl not installed (.ci/run installs it)");
        return;
    }
    let c = redis_fixture::Cluster::start_tls();
    let certs = c.tls.as_ref().unwrap();
    let dev = RedisSwap::open(&redis_tls_cfg(&c)).unwrap();
    assert!(
        dev.name().starts_with("rediss://swapper@127.0.0.1:"),
        "{}",
        dev.name()
    );
    conformance(&dev);
    // WAIT 1: replication runs over TLS too.
    let dev = redis_wait_one_round_trip(redis_tls_cfg(&c));
    // zswap in front, from the spec.
    let cfg = SwapConfig::parse(&format!("zswap+{}", c.spec(true)), SIZE).unwrap();
    let SwapConfig::Zswap { lower, .. } = &cfg else {
        panic!("{cfg:?}")
    };
    assert!(
        matches!(&**lower, SwapConfig::Redis(r) if r.tls == Some(RedisTls::default())),
        "{cfg:?}"
    );
    let z = Zswap::new(Arc::new(dev), Compressor::Lz4, 1 << 20);
    conformance(&z);

    // Each error printed: what a user reads (shown with --nocapture).
    let open_err = |r: &RedisConfig| {
        let e = RedisSwap::open(r).unwrap_err().to_string();
        eprintln!("{e}");
        e
    };
    // A CA that did not sign the nodes' certificate.
    let mut r = redis_tls_cfg(&c);
    r.tls.as_mut().unwrap().ca_cert = Some(certs.other_ca.clone());
    let e = open_err(&r);
    assert!(
        e.contains("not signed by the CA in ")
            && e.contains("other-ca.crt")
            && e.contains("USERMM_REDIS_CACERT"),
        "{e}"
    );
    // No CA given: the system's roots do not know the throwaway CA either.
    r.tls.as_mut().unwrap().ca_cert = None;
    if std::env::var_os("USERMM_REDIS_CACERT").is_none() {
        let e = open_err(&r);
        assert!(e.contains("the system's roots"), "{e}");
    }
    // A CA file that is missing, or holds no certificate.
    let missing = c.dir.join("no-such-ca.crt");
    r.tls.as_mut().unwrap().ca_cert = Some(missing.clone());
    let e = open_err(&r);
    assert!(
        e.contains(&format!(
            "cannot read RedisTls::ca_cert {}",
            missing.display()
        )),
        "{e}"
    );
    r.tls.as_mut().unwrap().ca_cert = Some(certs.client_key.clone());
    let e = open_err(&r);
    assert!(e.contains("holds no certificate"), "{e}");
    // The nodes require a client certificate.
    let mut r = redis_tls_cfg(&c);
    let t = r.tls.as_mut().unwrap();
    (t.cert, t.key) = (None, None);
    let e = open_err(&r);
    assert!(
        e.contains("refused the TLS handshake") && e.contains("USERMM_REDIS_CERT"),
        "{e}"
    );
    // A key that is not the certificate's.
    let mut r = redis_tls_cfg(&c);
    r.tls.as_mut().unwrap().key = Some(certs.server_key.clone());
    let e = open_err(&r);
    assert!(e.contains("do not go together"), "{e}");
    // redis:// to the TLS ports.
    let mut r = redis_tls_cfg(&c);
    r.tls = None;
    let t0 = std::time::Instant::now();
    let e = RedisSwap::open_with_env(&r, &|_| None)
        .unwrap_err()
        .to_string();
    eprintln!("{e} ({:?})", t0.elapsed());
    assert!(e.contains("use rediss://"), "{e}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t0.elapsed()
    );
    // At Mm::new, the same words.
    let mut r = redis_tls_cfg(&c);
    r.tls.as_mut().unwrap().ca_cert = Some(certs.other_ca.clone());
    let e = crate::Mm::new(crate::MmConfig::new(8 << 20).swap(SwapConfig::Redis(r)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not signed by the CA in "), "{e}");
}
