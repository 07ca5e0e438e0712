//! Error paths: invalid configurations and arguments (each error names the value and the
//! limit), strict commit accounting versus overcommit, and swap devices that fail writes or
//! reads. Accesses that must raise SIGBUS run in a child process (this test binary re-executed
//! for one test, selected by an environment variable).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use usermm::mm::MIN_BUDGET;
use usermm::swap::faulty::FailMode;
use usermm::swap::{FaultySwap, RamSwap, SwapDevice};
use usermm::{Error, Mm, MmConfig, SwapConfig, Watermarks};
use usermm_sys::kernel_read_u64;
use usermm_sys::uffd::OpenPolicy;

fn faulty(swap: u64, writes: FailMode, reads: FailMode) -> Arc<FaultySwap> {
    Arc::new(
        FaultySwap::new(Arc::new(RamSwap::new(swap).unwrap()))
            .fail_writes(writes)
            .fail_reads(reads),
    )
}

fn dev(f: &Arc<FaultySwap>) -> SwapConfig {
    SwapConfig::Device(f.clone() as Arc<dyn SwapDevice>)
}

#[test]
fn budget_below_minimum_is_rejected() {
    for budget in [0, 4096, MIN_BUDGET - 4096, MIN_BUDGET - 1] {
        let e = Mm::new(MmConfig::new(budget).swap(SwapConfig::Ram { size: 4 * MIB })).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::InvalidArgument(_)),
            "budget {budget}: {e:?}"
        );
        assert!(
            msg.contains(&format!("{budget} bytes")),
            "message does not name the budget {budget}: {msg}"
        );
        assert!(
            msg.contains(&MIN_BUDGET.to_string()),
            "message does not name the minimum: {msg}"
        );
    }
    let mm = Mm::new(MmConfig::new(MIN_BUDGET).swap(SwapConfig::Ram { size: 4 * MIB }))
        .expect("MIN_BUDGET itself is accepted");
    assert_eq!(mm.budget(), MIN_BUDGET);
}

/// Each concern has its own error type, so a caller can match on what was wrong and read the
/// values back instead of parsing a message.
#[test]
fn errors_are_typed_by_concern() {
    use usermm::{ConfigError, InvalidArgument, RegionError, Settings, SwapError};
    let e = MmConfig::new(4096).validate().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(InvalidArgument::Config(ConfigError::BudgetTooSmall {
                budget: 4096,
                min: MIN_BUDGET
            }))
        ),
        "{e:?}"
    );
    let mut c = MmConfig::new(4 * MIB);
    c.swappiness = 201;
    assert!(
        matches!(
            c.validate().unwrap_err(),
            Error::InvalidArgument(InvalidArgument::Config(ConfigError::OutOfRange {
                field: "swappiness",
                value: 201,
                lo: 0,
                hi: 200,
                ..
            }))
        ),
        "swappiness"
    );
    match usermm::parse_size("12Q").unwrap_err() {
        Error::InvalidArgument(InvalidArgument::Config(ConfigError::Size { value })) => {
            assert_eq!(value, "12Q")
        }
        e => panic!("{e:?}"),
    }
    match SwapConfig::parse(" tape ", 0).unwrap_err() {
        Error::InvalidArgument(InvalidArgument::Swap(SwapError::UnknownDevice { spec })) => {
            assert_eq!(spec, "tape")
        }
        e => panic!("{e:?}"),
    }
    match Settings::parse("laptop_mode=maybe").unwrap_err() {
        Error::InvalidArgument(InvalidArgument::Config(ConfigError::LaptopMode { value })) => {
            assert_eq!(value, "maybe")
        }
        e => panic!("{e:?}"),
    }
    let mm = Mm::new(MmConfig::new(4 * MIB).swap(SwapConfig::None)).unwrap();
    let r = mm.map_anon(8192).unwrap();
    match r.discard(4096, 8192).unwrap_err() {
        Error::InvalidArgument(InvalidArgument::Region(RegionError::PastEnd {
            op: "discard",
            off: 4096,
            len: 8192,
            size: 8192,
        })) => {}
        e => panic!("{e:?}"),
    }
    let mut buf = [0u8; 16];
    match r.read_bytes(8190, &mut buf).unwrap_err() {
        Error::InvalidArgument(InvalidArgument::Region(RegionError::OutOfRange {
            off: 8190,
            len: 16,
            size: 8192,
        })) => {}
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        mm.map_anon(0).unwrap_err(),
        Error::InvalidArgument(InvalidArgument::Region(RegionError::ZeroLength))
    ));
}

#[test]
fn invalid_tuning_is_rejected_with_the_value() {
    let base = || MmConfig::new(4 * MIB).swap(SwapConfig::Ram { size: 4 * MIB });
    let mut c = base();
    c.page_cluster = 10;
    let e = Mm::new(c).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("10"),
        "{e}"
    );
    for far in [0, 513] {
        let mut c = base();
        c.fault_around_max = far;
        let e = Mm::new(c).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains(&far.to_string()),
            "{e}"
        );
    }
    for w in [
        Watermarks {
            min: 10,
            low: 5,
            high: 20,
        },
        Watermarks {
            min: 10,
            low: 20,
            high: 600,
        },
    ] {
        let e = Mm::new(base().watermarks(w)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(
            msg.contains(&w.low.to_string()) && msg.contains(&w.high.to_string()),
            "{msg}"
        );
    }
}

#[test]
fn unwritable_swap_path_names_the_path() {
    for path in ["/proc/nope/swap", "/nonexistent-usermm-dir/swapfile"] {
        let cfg = MmConfig::new(4 * MIB).swap(SwapConfig::File {
            path: Some(PathBuf::from(path)),
            size: 8 * MIB,
        });
        let e = Mm::new(cfg).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Io { .. }), "{e:?}");
        assert!(msg.contains(path), "the error does not name {path}: {msg}");
    }
}

#[test]
fn zero_length_and_huge_maps_are_rejected() {
    let mm = mm_ram(4 * MIB, 4 * MIB);
    let e = mm.map_anon(0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("zero"), "{e}");
    let huge = 8usize << 50; // 8 PiB, above the 4 PiB maximum
    let e = Mm::new(
        MmConfig::new(4 * MIB)
            .swap(SwapConfig::Ram { size: 4 * MIB })
            .overcommit(true),
    )
    .unwrap()
    .map_anon(huge)
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains(&huge.to_string()), "{e}");
    assert_eq!(mm.commit().0, 0, "failed maps must not stay committed");
    assert_eq!(mm.nr_regions(), 0);
}

#[test]
fn commit_limit_is_enforced_and_reported() {
    let mm = mm_ram(4 * MIB, 4 * MIB);
    assert_eq!(mm.commit(), (0, 8 * MIB));
    let e = mm.map_anon(16 * MIB as usize).unwrap_err();
    let msg = e.to_string();
    match e {
        Error::CommitLimit {
            requested,
            committed,
            limit,
        } => {
            assert_eq!((requested, committed, limit), (16 * MIB, 0, 8 * MIB));
        }
        other => panic!("expected Error::CommitLimit, got {other:?}"),
    }
    assert!(msg.contains("commit limit"), "{msg}");
    assert!(
        msg.contains("16.0 MiB") && msg.contains("8.0 MiB"),
        "the message should state the numbers: {msg}"
    );

    let a = mm.map_anon(6 * MIB as usize).unwrap();
    assert_eq!(mm.commit().0, 6 * MIB);
    let e = mm.map_anon(4 * MIB as usize).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::CommitLimit { requested, committed, limit } if requested == 4 * MIB && committed == 6 * MIB && limit == 8 * MIB),
        "{e:?}"
    );
    assert!(
        msg.contains("4.0 MiB") && msg.contains("6.0 MiB") && msg.contains("8.0 MiB"),
        "{msg}"
    );
    assert_eq!(
        mm.commit().0,
        6 * MIB,
        "a rejected map must not stay committed"
    );
    // Exactly up to the limit is fine; lengths round up to pages.
    let b = mm.map_anon(2 * MIB as usize - 100).unwrap();
    assert_eq!(mm.commit(), (8 * MIB, 8 * MIB));
    assert!(matches!(
        mm.map_anon(1),
        Err(Error::CommitLimit {
            requested: 4096,
            ..
        })
    ));
    drop(a);
    drop(b);
    assert_eq!(mm.commit().0, 0);
    let c = mm.map_anon(8 * MIB as usize).unwrap();
    c.write_u64(0, 1);
    assert_eq!(c.read_u64(0), 1);
}

#[test]
fn no_swap_commit_limit_is_the_budget() {
    let mm = Mm::new(MmConfig::new(4 * MIB).swap(SwapConfig::None)).unwrap();
    assert_eq!(mm.commit(), (0, 4 * MIB));
    assert!(matches!(
        mm.map_anon(8 * MIB as usize),
        Err(Error::CommitLimit { .. })
    ));
    let r = mm.map_anon(2 * MIB as usize).unwrap();
    for p in 0..r.len() / PAGE {
        r.write_u64(p * PAGE, pattern(3, p as u64, 0));
    }
    for p in 0..r.len() / PAGE {
        assert_eq!(r.read_u64(p * PAGE), pattern(3, p as u64, 0));
    }
}

#[test]
fn overcommit_allows_the_same_map() {
    let mm = Mm::new(
        MmConfig::new(4 * MIB)
            .swap(SwapConfig::Ram { size: 4 * MIB })
            .overcommit(true),
    )
    .unwrap();
    let r = mm.map_anon(16 * MIB as usize).unwrap();
    let r2 = mm.map_anon(16 * MIB as usize).unwrap();
    assert_eq!(
        mm.commit(),
        (32 * MIB, 8 * MIB),
        "committed may exceed the limit under overcommit"
    );
    // Within budget + swap everything works.
    for p in (0..r.len() / PAGE).step_by(4) {
        r.write_u64(p * PAGE, pattern(4, p as u64, 0));
    }
    for p in (0..r.len() / PAGE).step_by(4) {
        assert_eq!(r.read_u64(p * PAGE), pattern(4, p as u64, 0));
    }
    assert_eq!(mm.vmstat().val("oom_poison"), 0);
    drop(r2);
    drop(r);
    assert_eq!(mm.commit().0, 0);
}

#[test]
fn bad_discard_and_copy_ranges_are_invalid_arguments() {
    let mm = mm_ram(4 * MIB, 4 * MIB);
    let r = mm.map_anon(16 * PAGE).unwrap();
    r.write_u64(0, 42);
    let cases: &[(usize, usize, &str)] = &[
        (1, PAGE, "0x1+0x1000"),
        (0, 100, "0x0+0x64"),
        (PAGE + 8, 2 * PAGE, "0x1008+0x2000"),
        (15 * PAGE, 2 * PAGE, "0xf000+0x2000"),
        (17 * PAGE, PAGE, "0x11000+0x1000"),
        (PAGE, usize::MAX - 4095, "0x1000+0x"),
    ];
    for &(off, len, name) in cases {
        let e = r.discard(off, len).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)),
            "discard({off:#x}, {len:#x}): {e:?}"
        );
        assert!(
            e.to_string().contains(name),
            "discard({off:#x}, {len:#x}) error does not name the range: {e}"
        );
    }
    // Past the end names the region size too.
    let e = r.discard(15 * PAGE, 2 * PAGE).unwrap_err();
    assert!(e.to_string().contains("0x10000"), "{e}");
    // Nothing was discarded by the failed calls; an empty aligned discard is a no-op.
    assert_eq!(r.read_u64(0), 42);
    r.discard(0, 0).unwrap();
    r.discard(16 * PAGE, 0).unwrap();
    assert_eq!(r.read_u64(0), 42);
    assert_eq!(mm.vmstat().val("pgdiscard"), 0);

    let mut buf = [0u8; 16];
    let e = r.read_bytes(16 * PAGE - 8, &mut buf).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = r.write_bytes(usize::MAX - 4, &buf).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    r.read_bytes(16 * PAGE - 16, &mut buf).unwrap();
    assert_eq!(buf, [0; 16]);
}

// ---- a swap device that fails every write ----

const FAILW_BUDGET: u64 = 4 * MIB;
/// Pages written in process: below the budget (1024 frames) minus the fault-around slack.
const FAILW_SAFE_PAGES: usize = 900;

fn failing_writes_mm(overcommit: bool, swap: u64) -> (Mm, Arc<FaultySwap>) {
    let f = faulty(swap, FailMode::All, FailMode::Never);
    let mm = Mm::new(
        MmConfig::new(FAILW_BUDGET)
            .swap(dev(&f))
            .overcommit(overcommit),
    )
    .unwrap();
    (mm, f)
}

#[test]
fn failing_swap_writes_commit_rejects_four_times_the_budget() {
    init_log();
    let (mm, f) = failing_writes_mm(false, 4 * MIB);
    let e = mm.map_anon(4 * FAILW_BUDGET as usize).unwrap_err();
    assert!(matches!(e, Error::CommitLimit { .. }), "{e:?}");
    // What commit allows within the budget keeps its data although nothing can be swapped.
    let r = mm.map_anon(FAILW_SAFE_PAGES * PAGE).unwrap();
    for p in 0..FAILW_SAFE_PAGES {
        r.write_u64(p * PAGE, pattern(5, p as u64, 0));
    }
    reclaim_all(&mm);
    for p in 0..FAILW_SAFE_PAGES {
        assert_eq!(r.read_u64(p * PAGE), pattern(5, p as u64, 0), "page {p}");
    }
    settle(&mm);
    let vm = mm.vmstat();
    assert!(vm.val("swap_write_error") > 0, "{vm}");
    assert!(f.injected_write_failures() > 0);
    assert_eq!(vm.val("pswpout"), 0, "{vm}");
    assert_eq!(r.swapped_pages(), 0);
    assert_eq!(r.resident_pages(), FAILW_SAFE_PAGES as u64, "{vm}");
}

#[test]
fn failing_swap_writes_keep_pages_resident() {
    init_log();
    let (mm, f) = failing_writes_mm(true, 16 * MIB);
    let r = mm.map_anon(4 * FAILW_BUDGET as usize).unwrap();
    for p in 0..FAILW_SAFE_PAGES {
        r.write_u64(p * PAGE + 16, pattern(6, p as u64, 2));
    }
    let reclaimed = reclaim_all(&mm);
    let vm = mm.vmstat();
    assert_eq!(
        reclaimed, 0,
        "nothing can be reclaimed when every swap write fails\n{vm}"
    );
    assert!(vm.val("swap_write_error") > 0, "{vm}");
    assert_eq!(
        vm.val("swap_write_error"),
        f.injected_write_failures(),
        "{vm}"
    );
    assert_eq!(vm.val("pswpout"), 0, "{vm}");
    assert_eq!(
        vm.val("nr_swap_used"),
        0,
        "slots of failed writes must be released\n{vm}"
    );
    assert_eq!(vm.val("oom_poison"), 0, "{vm}");
    assert_eq!(r.swapped_pages(), 0);
    assert!(r.resident_pages() >= FAILW_SAFE_PAGES as u64, "{vm}");
    assert!(mm.peak_resident_bytes() <= FAILW_BUDGET);
    for p in 0..FAILW_SAFE_PAGES {
        assert_eq!(
            r.read_u64(p * PAGE + 16),
            pattern(6, p as u64, 2),
            "page {p}"
        );
    }
}

/// Child: writes 4x the budget with every swap write failing. The pages within the budget are
/// kept; the first access that needs a frame beyond it must be poisoned (SIGBUS), not hang and
/// not lose data silently.
#[test]
fn failing_swap_writes_poison_accesses_beyond_the_budget() {
    const NAME: &str = "failing_swap_writes_poison_accesses_beyond_the_budget";
    if is_child(NAME) {
        let (mm, _f) = failing_writes_mm(true, 16 * MIB);
        let r = mm.map_anon(4 * FAILW_BUDGET as usize).unwrap();
        for p in 0..FAILW_SAFE_PAGES {
            r.write_u64(p * PAGE, pattern(7, p as u64, 0));
        }
        for p in 0..FAILW_SAFE_PAGES {
            assert_eq!(r.read_u64(p * PAGE), pattern(7, p as u64, 0), "page {p}");
        }
        eprintln!("CHILD: within budget ok; writing beyond it");
        for p in FAILW_SAFE_PAGES..r.len() / PAGE {
            r.write_u64(p * PAGE, pattern(7, p as u64, 0));
        }
        eprintln!(
            "CHILD: wrote 4x the budget with failing swap: no SIGBUS\n{}",
            mm.vmstat()
        );
        return;
    }
    expect_child_sigbus(NAME, "CHILD: within budget ok");
}

// ---- a swap device that fails reads ----

const FAILR_PAGES: usize = 2048; // 8 MiB with a 4 MiB budget

fn swapped_out_region(
    f: &Arc<FaultySwap>,
    policy: OpenPolicy,
) -> usermm::Result<(Mm, usermm::Region)> {
    let mut cfg = MmConfig::new(4 * MIB).swap(dev(f));
    cfg.uffd_policy = policy;
    let mm = Mm::new(cfg)?;
    let r = mm.map_anon(FAILR_PAGES * PAGE)?;
    for p in 0..FAILR_PAGES {
        r.write_u64(p * PAGE, pattern(8, p as u64, 0));
        r.write_u64(p * PAGE + 4088, pattern(8, p as u64, 511));
    }
    reclaim_all(&mm);
    assert_eq!(
        r.resident_pages(),
        0,
        "reclaim_to(0) left pages resident\n{}",
        mm.vmstat()
    );
    Ok((mm, r))
}

/// Child: an access to a page whose swap read fails raises SIGBUS.
#[test]
fn failing_swap_read_raises_sigbus() {
    const NAME: &str = "failing_swap_read_raises_sigbus";
    if is_child(NAME) {
        let f = faulty(64 * MIB, FailMode::Never, FailMode::Never);
        let (_mm, r) = swapped_out_region(&f, OpenPolicy::Auto).unwrap();
        f.set_read_mode(FailMode::All);
        eprintln!("CHILD: reads now fail; touching page 7");
        let v = r.read_u64(7 * PAGE);
        eprintln!("CHILD: read {v:#x} from a page whose swap read failed: no SIGBUS");
        return;
    }
    expect_child_sigbus(NAME, "CHILD: reads now fail");
}

/// In process, with a full-mode userfaultfd: kernel-mode accesses (a write(2) from the region
/// into a pipe) fault through the manager too, and a poisoned page makes them fail with EFAULT
/// instead of raising SIGBUS. So the test can see which page was lost and check the rest.
#[test]
fn failing_swap_read_poisons_only_that_page() {
    init_log();
    let f = faulty(64 * MIB, FailMode::Never, FailMode::Never);
    let (mm, r) = match swapped_out_region(&f, OpenPolicy::Full) {
        Ok(x) => x,
        Err(e @ Error::Userfaultfd(_)) => {
            skip(&format!("no full-mode userfaultfd here ({e}); covered by failing_swap_read_raises_sigbus only"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let base = r.as_ptr() as usize;
    let before = mm.vmstat();
    // A few reads succeed, then reads fail until the first page is lost.
    f.set_read_mode(FailMode::AfterN(5));
    let mut lost = None;
    for p in 0..FAILR_PAGES {
        match kernel_read_u64(base + p * PAGE) {
            Ok(v) => assert_eq!(
                v,
                pattern(8, p as u64, 0),
                "page {p} read through the kernel"
            ),
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                lost = Some(p);
                break;
            }
            Err(e) => panic!("kernel read of page {p}: {e}"),
        }
    }
    f.set_read_mode(FailMode::Never);
    settle(&mm);
    let vm = mm.vmstat();
    let d = vm.delta(&before);
    let lost = lost.unwrap_or_else(|| {
        panic!("no read failed although the device fails reads after 5 ops\n{d}")
    });
    assert!(lost > 0, "the first 5 read operations should succeed");
    assert!(d.val("swap_read_error") >= 1, "{d}");
    assert_eq!(d.val("swap_read_error"), f.injected_read_failures(), "{d}");
    // The lost page stays poisoned: it never turns into zeros or stale data.
    for _ in 0..3 {
        let e = kernel_read_u64(base + lost * PAGE + 4088).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EFAULT),
            "page {lost} after its read failed: {e}"
        );
    }
    assert_eq!(r.read_u64(0), pattern(8, 0, 0));
    // Every other page is intact (user-mode reads now; reads no longer fail).
    for p in (0..FAILR_PAGES).filter(|&p| p != lost) {
        assert_eq!(
            r.read_u64(p * PAGE),
            pattern(8, p as u64, 0),
            "page {p} (lost page {lost})"
        );
        assert_eq!(
            r.read_u64(p * PAGE + 4088),
            pattern(8, p as u64, 511),
            "page {p} (lost page {lost})"
        );
    }
    // Discarding the poisoned page makes it an ordinary zero page again.
    r.discard(lost * PAGE, PAGE).unwrap();
    assert_eq!(r.read_u64(lost * PAGE), 0);
    r.write_u64(lost * PAGE, 5);
    assert_eq!(r.read_u64(lost * PAGE), 5);
    assert_consistent(&mm);
}

#[test]
fn every_nth_swap_write_failing_loses_nothing() {
    init_log();
    let f = faulty(64 * MIB, FailMode::EveryNth(3), FailMode::Never);
    let mm = Mm::new(MmConfig::new(4 * MIB).swap(dev(&f))).unwrap();
    let r = mm.map_anon(16 * MIB as usize).unwrap();
    let pages = r.len() / PAGE;
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(9, p as u64, 0));
        r.write_u64(p * PAGE + 2048, pattern(9, p as u64, 256));
    }
    for round in 0..2 {
        for p in 0..pages {
            assert_eq!(
                r.read_u64(p * PAGE),
                pattern(9, p as u64, 0),
                "round {round} page {p}"
            );
            assert_eq!(
                r.read_u64(p * PAGE + 2048),
                pattern(9, p as u64, 256),
                "round {round} page {p}"
            );
        }
        // Dirty half of the pages again so that the next round writes to swap again.
        for p in (0..pages).step_by(2) {
            r.write_u64(p * PAGE, pattern(9, p as u64, 0));
        }
        mm.reclaim_to(0);
    }
    settle(&mm);
    let vm = mm.vmstat();
    assert!(vm.val("swap_write_error") > 0, "{vm}");
    assert_eq!(
        vm.val("swap_write_error"),
        f.injected_write_failures(),
        "{vm}"
    );
    assert!(vm.val("pswpout") > pages as u64, "{vm}");
    assert_eq!(vm.val("oom_poison"), 0, "{vm}");
    assert!(mm.peak_resident_bytes() <= 4 * MIB);
    assert_consistent(&mm);
}

/// Swap genuinely full under overcommit: stores beyond budget + swap cannot get a frame, so
/// the page is poisoned (a kernel-mode store fails with EFAULT, which lets this test look at
/// the counters; the user-mode store's SIGBUS is the next test's), counted as `oom_poison`,
/// and only once everything the budget and the swap can hold is in use. Earlier pages stay
/// intact.
#[test]
fn full_swap_under_overcommit_poisons_and_counts() {
    init_log();
    let mut cfg = MmConfig::new(4 * MIB)
        .swap(SwapConfig::Ram { size: 4 * MIB })
        .overcommit(true);
    cfg.uffd_policy = OpenPolicy::Full;
    let mm = match Mm::new(cfg) {
        Ok(mm) => mm,
        Err(e @ Error::Userfaultfd(_)) => {
            skip(&format!("no full-mode userfaultfd here ({e})"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let r = mm.map_anon(32 << 20).unwrap();
    let base = r.as_ptr() as usize;
    let pages = r.len() / PAGE;
    let mut first_lost = None;
    for p in 0..pages {
        match usermm_sys::kernel_write_u64(base + p * PAGE, pattern(12, p as u64, 0)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                first_lost = Some(p);
                break;
            }
            Err(e) => panic!("kernel write of page {p}: {e}"),
        }
    }
    let vm = mm.vmstat();
    let lost = first_lost.unwrap_or_else(|| panic!("32 MiB fit in 4 MiB + 4 MiB of swap?\n{vm}"));
    // 8 MiB of room: the first poison comes only once it is (nearly) all used.
    assert!(
        lost >= (8 * MIB as usize / PAGE) * 9 / 10,
        "poisoned at page {lost}, before budget + swap were used\n{vm}"
    );
    assert!(vm.val("oom_poison") >= 1, "{vm}");
    // The poisoned page stays poisoned.
    assert_eq!(
        usermm_sys::kernel_read_u64(base + lost * PAGE)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EFAULT)
    );
    // Memory and swap are full: bringing a swapped page back needs a frame that nothing can
    // free (Linux would call the OOM killer here). Discarding the second half makes room; the
    // first half kept its data.
    r.discard(lost / 2 * PAGE, r.len() - lost / 2 * PAGE)
        .unwrap();
    for p in (0..lost / 2).step_by(53) {
        assert_eq!(
            usermm_sys::kernel_read_u64(base + p * PAGE).unwrap(),
            pattern(12, p as u64, 0),
            "page {p}"
        );
    }
}

/// Child: the same full swap under overcommit met by ordinary user-mode stores (the default
/// userfaultfd policy, as a program runs): the first store that finds neither a frame nor a
/// swap slot dies of SIGBUS, and only once (nearly) all of budget + swap (2048 pages) holds
/// the pages stored before it.
#[test]
fn full_swap_under_overcommit_raises_sigbus_in_user_mode() {
    const NAME: &str = "full_swap_under_overcommit_raises_sigbus_in_user_mode";
    if is_child(NAME) {
        let mm = Mm::new(
            MmConfig::new(4 * MIB)
                .swap(SwapConfig::Ram { size: 4 * MIB })
                .overcommit(true),
        )
        .unwrap();
        // 10 MiB: 512 pages more than budget + swap hold.
        let r = mm.map_anon(10 << 20).unwrap();
        eprintln!("CHILD: storing");
        for p in 0..r.len() / PAGE {
            if p % 64 == 0 {
                eprintln!("CHILD: stored {p} pages");
            }
            r.write_u64(p * PAGE, pattern(17, p as u64, 0));
        }
        eprintln!(
            "CHILD: stored 10 MiB in 4 MiB + 4 MiB of swap: no SIGBUS\n{}",
            mm.vmstat()
        );
        return;
    }
    let err = expect_child_sigbus(NAME, "CHILD: storing");
    let stored = err
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("CHILD: stored ")?.strip_suffix(" pages"))
        .find_map(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    // The last progress line comes at most 64 pages before the fatal store.
    assert!(
        stored + 64 >= (8 * MIB as usize / PAGE) * 9 / 10,
        "SIGBUS after {stored}-{} pages, before budget + swap were used\n{err}",
        stored + 63
    );
    assert!(
        stored < 8 * MIB as usize / PAGE + 64,
        "{stored} pages stored in 2048 pages of budget + swap\n{err}"
    );
}

/// The child-process helper every SIGBUS test uses fails a child that hangs instead of waiting
/// for ever: a child asleep well past the limit is killed and reported with what it printed.
#[test]
fn a_hanging_child_test_fails_instead_of_hanging() {
    if common::is_child("a_hanging_child_test_fails_instead_of_hanging") {
        eprintln!("child asleep");
        std::thread::sleep(std::time::Duration::from_secs(60));
        return;
    }
    let t0 = std::time::Instant::now();
    let r = std::panic::catch_unwind(|| {
        common::run_child_within(
            "a_hanging_child_test_fails_instead_of_hanging",
            std::time::Duration::from_secs(2),
        )
    });
    let msg = match r {
        Ok(out) => panic!("the hanging child was not killed: {:?}", out.status),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        msg.contains("still running after 2s: killed") && msg.contains("child asleep"),
        "{msg}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t0.elapsed()
    );
}
