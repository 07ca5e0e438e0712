//! Periodic writeback and the flusher threads (issue 16 part 7): dirty file pages that nothing
//! else touches reach their files once they are older than `dirty_expire` (Linux's `wb_kupdate`),
//! not before, without a sync and below the background threshold; and there is one flusher
//! thread per backing device (Linux's `bdi_writeback`), each writing its own device's files.
//!
//! The flushers are observed from outside: their thread names (`usermm-flush-<dev>`, cut to the
//! kernel's 15 bytes of `comm`) and each thread's own write counter in
//! `/proc/self/task/<tid>/io`. The tests of this file run one at a time so that the threads seen
//! are those of one manager.

mod common;
use common::skip;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use usermm::{MapKind, Mm, MmConfig, SwapConfig};

const PAGE: usize = 4096;
const MIB: u64 = 1 << 20;

/// Serializes the tests of this binary: each counts the flusher threads of its own manager.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A manager with RAM swap, flushers waking every `period_cs` and data expiring after
/// `expire_cs` (centiseconds, as `vm.dirty_*_centisecs`).
fn manager(expire_cs: u32, period_cs: u32) -> Mm {
    manager_with(expire_cs, period_cs, usermm::Settings::default())
}

fn manager_with(expire_cs: u32, period_cs: u32, settings: usermm::Settings) -> Mm {
    let mut cfg = MmConfig::new(64 * MIB)
        .swap(SwapConfig::Ram { size: 64 * MIB })
        .settings(settings);
    cfg.dirty_expire_centisecs = expire_cs;
    cfg.dirty_writeback_centisecs = period_cs;
    Mm::new(cfg).expect("creating a memory manager")
}

fn fill(tag: u8, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = tag ^ (i as u8) ^ ((i >> 12) as u8).wrapping_mul(31) ^ 0x5a;
    }
}

/// The flusher threads of this process: thread id -> name.
fn flushers() -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task") {
        let e = e.unwrap();
        let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else {
            continue; // the thread exited meanwhile
        };
        let comm = comm.trim_end().to_string();
        if comm.starts_with("usermm-flush-") {
            out.insert(e.file_name().to_string_lossy().parse().unwrap(), comm);
        }
    }
    out
}

/// The flusher threads once their names are set (a new thread names itself as it starts):
/// polls until `want` names are there and the set stays the same for 100 ms, or 10 s pass.
fn settled_flushers(want: usize) -> BTreeMap<u32, String> {
    let t0 = Instant::now();
    let mut last = flushers();
    let mut since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = flushers();
        if now != last {
            last = now;
            since = Instant::now();
        } else if last.len() == want && since.elapsed() >= Duration::from_millis(100) {
            return last;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return last;
        }
    }
}

/// Bytes thread `tid` of this process wrote with write-family system calls (`wchar`).
fn thread_wchar(tid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/self/task/{tid}/io"))
        .unwrap_or_else(|e| panic!("reading /proc/self/task/{tid}/io: {e}"));
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no wchar line in /proc/self/task/{tid}/io:\n{io}"))
}

/// The name the flusher of device `dev` has in `comm` (15 bytes at most).
fn flusher_comm(dev: u64) -> String {
    let mut s = format!("usermm-flush-{dev:x}");
    s.truncate(15);
    s
}

fn dev_of(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .dev()
}

/// Waits until no file page is dirty or under writeback, up to `limit`; when that was seen.
fn wait_clean(m: &Mm, limit: Duration) -> Option<Instant> {
    let t = Instant::now();
    loop {
        let v = m.vmstat();
        if v.val("nr_dirty") == 0 && v.val("nr_writeback") == 0 {
            return Some(Instant::now());
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pages dirtied by buffered writes and through a shared file mapping, then left alone, are
/// written to their files by the flushers once `dirty_expire` has passed, and not earlier: no
/// sync, no reclaim (the budget is far from full), far below the background threshold, and no
/// one wakes the flushers (`flusher_wake` stays 0). Fails if periodic writeback is off (nothing
/// is ever written) or ignores the expiry (written at the first period, 100 ms in).
#[test]
fn dirty_pages_are_written_back_after_dirty_expire_and_not_before() {
    let _g = serial();
    let d = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let (buffered, mapped) = (d.path().join("buffered"), d.path().join("mapped"));
    const PAGES: usize = 64;
    let expire = Duration::from_secs(3);
    let m = manager(300, 10);

    let t0 = Instant::now();
    let mut a = vec![0u8; PAGES * PAGE];
    fill(1, &mut a);
    let f = m.open(&buffered).unwrap();
    f.write_at(0, &a).unwrap();
    let mut b = vec![0u8; PAGES * PAGE];
    fill(2, &mut b);
    std::fs::File::create(&mapped)
        .unwrap()
        .set_len((PAGES * PAGE) as u64)
        .unwrap(); // a hole: the stores below are the only data
    let r = m
        .map_file(&mapped, 0, PAGES * PAGE, MapKind::Shared)
        .unwrap();
    r.write_bytes(0, &b).unwrap();

    let v = m.vmstat();
    let dirty = v.val("nr_dirty");
    assert_eq!(
        dirty,
        2 * PAGES as u64,
        "both files' pages are dirty and unwritten right after the writes: {v}"
    );
    // The background threshold is a tenth of free + file pages: at least a tenth of the free.
    let bg_floor = v.val("nr_free_pages") / 10;
    assert!(
        dirty < bg_floor,
        "{dirty} dirty pages must stay below the background threshold (>= {bg_floor}) for this \
         test to see periodic writeback alone: {v}"
    );

    // Writeback must not come before the expiry: the first time the pages are seen clean is at
    // least `expire` after t0 (taken before the first page was dirtied).
    let seen_clean = wait_clean(&m, expire + Duration::from_secs(30));
    let v = m.vmstat();
    let Some(seen_clean) = seen_clean else {
        panic!(
            "periodic writeback never came: {} pages still dirty {:?} after dirtying, with \
             dirty_expire {expire:?}: {v}",
            v.val("nr_dirty"),
            t0.elapsed()
        );
    };
    let since_t0 = seen_clean - t0;
    eprintln!("written back and seen clean {since_t0:?} after the first store");
    assert!(
        since_t0 >= expire,
        "the pages were written back {since_t0:?} after they were dirtied, before \
         dirty_expire ({expire:?}): the expiry was ignored: {v}"
    );
    assert!(
        v.val("nr_written") >= 2 * PAGES as u64,
        "every dirty page was written: {v}"
    );
    assert_eq!(
        v.val("flusher_wake"),
        0,
        "nothing woke the flushers (no sync, no reclaim, no background writeback): the periodic \
         timer wrote the pages: {v}"
    );
    assert_eq!(v.val("pgsteal_file"), 0, "no reclaim ran: {v}");
    // The files on disk (read past usermm) hold the data, while both are still open and mapped.
    assert!(
        std::fs::read(&buffered).unwrap() == a,
        "buffered file on disk"
    );
    assert!(std::fs::read(&mapped).unwrap() == b, "mapped file on disk");
    drop(r);
    drop(f);
}

/// Two files on two devices (tmpfs /dev/shm and the file system of the temporary directory) get
/// two flusher threads, one per device, each named after its device and each writing only its
/// own device's pages (the thread's own `wchar`); two files on one device share one thread.
/// Fails if flushers were per file (3 threads), global (1 thread), or wrote each other's files.
#[test]
fn one_flusher_thread_per_backing_device() {
    let _g = serial();
    let before = flushers();
    assert!(
        before.is_empty(),
        "flusher threads left by an earlier manager: {before:?}"
    );
    let disk = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let shm = match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(e) => return skip(&format!("no tmpfs at /dev/shm for a second device: {e}")),
    };
    let (dev_disk, dev_shm) = (dev_of(disk.path()), dev_of(shm.path()));
    if dev_disk == dev_shm {
        return skip(&format!(
            "{} and /dev/shm are on one device ({dev_disk:#x}): set TMPDIR to another file system",
            disk.path().display()
        ));
    }
    if flusher_comm(dev_disk) == flusher_comm(dev_shm) {
        return skip(&format!(
            "devices {dev_disk:#x} and {dev_shm:#x} give one 15-byte thread name"
        ));
    }
    // Data expires after 0.5 s; until then only the threads are looked at. Writeback goes
    // through pwritev on the flusher itself (`file_io=sync`): the bytes each flusher wrote are
    // read from its own /proc/<tid>/io, and io_uring's disk writes are charged to the kernel's
    // workers, not to the thread that submitted them.
    let m = manager_with(
        50,
        10,
        usermm::Settings::default().with(usermm::Switch::FileIo, usermm::Behaviour::Old),
    );

    // Two files on the disk's device: one flusher.
    let disk_pages = 16; // 8 per file
    let mut data = vec![0u8; 8 * PAGE];
    let mut files = Vec::new();
    for (i, name) in ["a", "b"].iter().enumerate() {
        fill(i as u8, &mut data);
        let f = m.open(disk.path().join(name)).unwrap();
        f.write_at(0, &data).unwrap();
        files.push(f);
    }
    let one = settled_flushers(1);
    let names: Vec<&String> = one.values().collect();
    assert_eq!(
        names,
        [&flusher_comm(dev_disk)],
        "two files on device {dev_disk:#x} have one flusher thread"
    );

    // A file on tmpfs: a second flusher, for that device.
    let shm_pages = 4;
    fill(9, &mut data);
    let f = m.open(shm.path().join("c")).unwrap();
    f.write_at(0, &data[..shm_pages * PAGE]).unwrap();
    files.push(f);
    let two = settled_flushers(2);
    let mut names: Vec<&String> = two.values().collect();
    names.sort();
    let mut want = [flusher_comm(dev_disk), flusher_comm(dev_shm)];
    want.sort();
    assert_eq!(
        names,
        want.iter().collect::<Vec<_>>(),
        "files on devices {dev_disk:#x} and {dev_shm:#x} have one flusher thread each"
    );

    // Each flusher writes its own device's pages, and only those.
    let clean = wait_clean(&m, Duration::from_secs(30));
    let v = m.vmstat();
    assert!(clean.is_some(), "the expired pages were never written: {v}");
    let wrote = |dev: u64| {
        let (&tid, _) = two.iter().find(|(_, n)| **n == flusher_comm(dev)).unwrap();
        thread_wchar(tid)
    };
    let (w_disk, w_shm) = (wrote(dev_disk), wrote(dev_shm));
    eprintln!("flushers {two:?}: {dev_disk:#x} wrote {w_disk} bytes, {dev_shm:#x} {w_shm}");
    let (disk_bytes, shm_bytes) = ((disk_pages * PAGE) as u64, (shm_pages * PAGE) as u64);
    assert!(
        w_disk >= disk_bytes && w_disk < disk_bytes + shm_bytes,
        "the flusher of {dev_disk:#x} wrote {w_disk} bytes; its two files hold {disk_bytes}: {v}"
    );
    assert!(
        w_shm >= shm_bytes && w_shm < disk_bytes,
        "the flusher of {dev_shm:#x} wrote {w_shm} bytes; its file holds {shm_bytes}: {v}"
    );
    assert_eq!(flushers().len(), 2, "still one flusher per device");
    drop(files);
    drop(m);
    let after = flushers();
    assert!(
        after.is_empty(),
        "the flushers end with their manager: {after:?}"
    );
}

/// A device's flusher starts when a file of it is opened or mapped, on the caller's thread, not
/// at the first dirty page: that is often a write fault, and a fault handler that starts a
/// thread can deadlock under `usermm run` (pthread_create faulting on managed memory that only
/// the other handlers could serve). After the mapping exists, write faults start no thread.
#[test]
fn flusher_starts_when_a_file_is_mapped_not_in_a_write_fault() {
    let _g = serial();
    let before = flushers();
    assert!(
        before.is_empty(),
        "flusher threads left by an earlier manager: {before:?}"
    );
    let d = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let path = d.path().join("mapped");
    const PAGES: usize = 64;
    std::fs::File::create(&path)
        .unwrap()
        .set_len((PAGES * PAGE) as u64)
        .unwrap();
    let m = manager(3000, 500);
    let r = m.map_file(&path, 0, PAGES * PAGE, MapKind::Shared).unwrap();
    let started = settled_flushers(1);
    let names: Vec<&String> = started.values().collect();
    assert_eq!(
        names,
        [&flusher_comm(dev_of(d.path()))],
        "mapping a file of device {:#x} started its flusher before any fault",
        dev_of(d.path())
    );
    let mut b = vec![0u8; PAGES * PAGE];
    fill(3, &mut b);
    r.write_bytes(0, &b).unwrap();
    let v = m.vmstat();
    assert_eq!(
        v.val("nr_dirty"),
        PAGES as u64,
        "the stores dirtied every page: {v}"
    );
    assert_eq!(
        flushers(),
        started,
        "the write faults started no flusher of their own"
    );
    let mut back = vec![0u8; PAGES * PAGE];
    r.read_bytes(0, &mut back).unwrap();
    assert!(back == b, "the mapping reads back what was stored");
}
