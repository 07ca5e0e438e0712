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
use super::{FaultySwap, FileSwap, RamSwap, SwapDevice};
use crate::sys::{Mapping, PAGE_SIZE};

const P: usize = PAGE_SIZE;
/// Requested device size: not a page multiple, so every backend must round down.
const SIZE: u64 = 64 * 4096 + 1000;
const NR: u64 = 64;

// ---------------------------------------------------------------------------------------------
// Page patterns: every u64 word of a page names its slot, a seed and its own index, so a page
// that lands in the wrong slot, a stale page, or a torn page is detected.

fn word(slot: u64, seed: u64, i: u64) -> u64 {
    let mut x = slot.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ seed.rotate_left(32)
        ^ i.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 29)
}

fn fill(pool: &Mapping, off: usize, slot: u64, seed: u64) {
    for i in 0..(P / 8) as u64 {
        pool.write_u64(off + i as usize * 8, word(slot, seed, i));
    }
}

fn check(pool: &Mapping, off: usize, slot: u64, seed: u64, what: &str) {
    for i in 0..(P / 8) as u64 {
        let got = pool.read_u64(off + i as usize * 8);
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

// ---------------------------------------------------------------------------------------------
// The suite.

/// Checks that `dev` (of `SIZE` requested bytes) behaves as a swap device must.
fn conformance(dev: &dyn SwapDevice) {
    let name = dev.name();
    assert!(!name.is_empty());
    assert_eq!(
        dev.nr_pages(),
        NR,
        "{name}: capacity must be the requested size in whole pages"
    );
    single_page_round_trip(dev);
    scattered_batch(dev);
    bounds(dev);
    overwrite(dev);
    discard_then_write(dev);
    concurrent(dev);
}

fn single_page_round_trip(dev: &dyn SwapDevice) {
    let src = pool(4);
    fill(&src, P, 7, 1);
    dev.write_pages(7, &src, &[P]).unwrap();
    let dst = pool(4);
    dev.read_pages(7, &dst, &[2 * P]).unwrap();
    check(&dst, 2 * P, 7, 1, "single page");
    // Empty batches are fine.
    dev.write_pages(7, &src, &[]).unwrap();
    dev.read_pages(7, &dst, &[]).unwrap();
}

fn scattered_batch(dev: &dyn SwapDevice) {
    let src = pool(16);
    // Scattered pool pages, some physically adjacent (3,4,5) so merged I/O vectors are covered.
    let src_pages: Vec<usize> = [9, 2, 3, 4, 14, 0, 11].iter().map(|p| p * P).collect();
    for (i, &p) in src_pages.iter().enumerate() {
        fill(&src, p, 10 + i as u64, 2);
    }
    dev.write_pages(10, &src, &src_pages).unwrap();
    let dst = pool(16);
    let dst_pages: Vec<usize> = [15, 1, 7, 8, 12, 3, 5].iter().map(|p| p * P).collect();
    dev.read_pages(10, &dst, &dst_pages).unwrap();
    for (i, &p) in dst_pages.iter().enumerate() {
        check(&dst, p, 10 + i as u64, 2, "scattered batch");
    }
    // A sub-range of the batch, read on its own.
    let one = pool(2);
    dev.read_pages(13, &one, &[P, 0]).unwrap();
    check(&one, P, 13, 2, "sub-range");
    check(&one, 0, 14, 2, "sub-range");
}

fn bounds(dev: &dyn SwapDevice) {
    let last = NR - 1;
    let src = pool(2);
    fill(&src, 0, last, 3);
    fill(&src, P, NR, 3);
    dev.write_pages(last, &src, &[0]).unwrap();
    let dst = pool(2);
    dev.read_pages(last, &dst, &[0]).unwrap();
    check(&dst, 0, last, 3, "last slot");

    // Past the end: errors, and nothing is written (the last slot keeps its content).
    fill(&src, 0, last, 99);
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
    check(&dst, 0, last, 3, "last slot after refused writes");
}

fn overwrite(dev: &dyn SwapDevice) {
    let src = pool(1);
    fill(&src, 0, 20, 3);
    dev.write_pages(20, &src, &[0]).unwrap();
    fill(&src, 0, 20, 4);
    dev.write_pages(20, &src, &[0]).unwrap();
    let dst = pool(1);
    dev.read_pages(20, &dst, &[0]).unwrap();
    check(&dst, 0, 20, 4, "overwrite");
}

fn discard_then_write(dev: &dyn SwapDevice) {
    let src = pool(4);
    for i in 0..4 {
        fill(&src, i * P, 30 + i as u64, 5);
    }
    dev.write_pages(30, &src, &[0, P, 2 * P, 3 * P]).unwrap();
    dev.discard(30, 2).unwrap();
    dev.discard(0, 0).unwrap();
    // The neighbours of a discarded range keep their data.
    let dst = pool(2);
    dev.read_pages(32, &dst, &[0, P]).unwrap();
    check(&dst, 0, 32, 5, "after neighbour discard");
    check(&dst, P, 33, 5, "after neighbour discard");
    // A discarded slot takes new data.
    fill(&src, 0, 30, 6);
    fill(&src, P, 31, 6);
    dev.write_pages(30, &src, &[P, 0]).unwrap();
    dev.read_pages(30, &dst, &[0, P]).unwrap();
    check(&dst, 0, 31, 6, "rewrite after discard");
    check(&dst, P, 30, 6, "rewrite after discard");
}

fn concurrent(dev: &dyn SwapDevice) {
    const THREADS: u64 = 4;
    const PER: u64 = 8;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let base = NR - THREADS * PER + t * PER;
                let src = pool(PER as usize);
                let dst = pool(PER as usize);
                let fwd: Vec<usize> = (0..PER as usize).map(|i| i * P).collect();
                let rev: Vec<usize> = fwd.iter().rev().copied().collect();
                for round in 0..25u64 {
                    let seed = 1000 * (t + 1) + round;
                    for i in 0..PER {
                        fill(&src, i as usize * P, base + i, seed);
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
                        check(&dst, rev[i as usize], base + i, seed, "concurrent");
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
        return;
    }
    match FileSwap::open_unlinked_in(shm, SIZE) {
        Ok(dev) => conformance(&dev),
        Err(e) => eprintln!("skipping tmpfs swap test: {e}"),
    }
}

#[test]
fn file_swap_with_path() {
    let dir = TempDir::new("path");
    let path = dir.path().join("swap");
    {
        let dev = FileSwap::open(Some(&path), SIZE).unwrap();
        assert_eq!(dev.path(), Some(path.as_path()));
        let mode = if dev.is_direct() {
            "O_DIRECT"
        } else {
            "buffered"
        };
        assert_eq!(dev.name(), format!("file:{} ({mode})", path.display()));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), NR * 4096);
        conformance(&dev);
        // Refused writes past the end never grow the file.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), NR * 4096);
    }
    // A given path is kept; reopening resizes it and tightens its mode.
    assert!(path.exists());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dev = FileSwap::open(Some(&path), 8 * 4096).unwrap();
    assert_eq!(dev.nr_pages(), 8);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 8 * 4096);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn ram_swap() {
    let dev = RamSwap::new(SIZE).unwrap();
    assert!(dev.name().starts_with("ram"));
    conformance(&dev);
}

#[test]
fn ram_swap_allocates_on_demand() {
    // 1 GiB of slots costs nothing until written, and discarded slots give their memory back.
    let dev = RamSwap::new(1 << 30).unwrap();
    assert_eq!(dev.nr_pages(), 1 << 18);
    assert_eq!(dev.resident_bytes().unwrap(), 0);
    let src = pool(16);
    for i in 0..16 {
        fill(&src, i * P, 1000 + i as u64, 9);
    }
    let pages: Vec<usize> = (0..16).map(|i| i * P).collect();
    dev.write_pages(1000, &src, &pages).unwrap();
    assert_eq!(dev.resident_bytes().unwrap(), 16 * P as u64);
    dev.discard(1000, 8).unwrap();
    assert_eq!(dev.resident_bytes().unwrap(), 8 * P as u64);
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
    // A discarded slot reads as zeros (the read maps the shared zero page, which mincore
    // counts but which costs no memory).
    dev.read_pages(1000, &dst, &[0]).unwrap();
    assert!((0..P).step_by(8).all(|o| dst.read_u64(o) == 0));
    dev.discard(1000, 1).unwrap();
    assert_eq!(dev.resident_bytes().unwrap(), 8 * P as u64);
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
