//! The faulting thread's own fault path (`fault_path=sigbus`, mm/fault.rs) end to end, in one
//! test so the order of SIGBUS handlers is fixed: the program's own handler is installed first,
//! the manager's after it; faults in managed regions are served on the faulting threads (many
//! threads, constant reclaim, every word checked), and a SIGBUS that is not usermm's (beyond
//! the end of a file the program mapped itself, or a page usermm poisoned) still reaches the
//! program's handler. Also what a kernel-mode access does under this path (EFAULT).

mod common;

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use usermm::{MapKind, Mm, MmConfig, Settings, SwapConfig, Switch};

static SEEN_ADDR: AtomicUsize = AtomicUsize::new(0);
static SEEN_CODE: AtomicI32 = AtomicI32::new(0);
static SEEN_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The program's SIGBUS handler: records the fault and maps an anonymous page over the faulting
/// page so the access can complete when the handler returns.
extern "C" fn program_handler(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler: `info` is valid; mmap is async-signal-safe.
    unsafe {
        let addr = (*info).si_addr() as usize;
        SEEN_ADDR.store(addr, Ordering::SeqCst);
        SEEN_CODE.store((*info).si_code, Ordering::SeqCst);
        SEEN_COUNT.fetch_add(1, Ordering::SeqCst);
        libc::mmap(
            (addr & !(PAGE - 1)) as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

fn install_program_handler() {
    // SAFETY: a zeroed sigaction filled in with a valid SA_SIGINFO handler.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = program_handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()), 0);
    }
}

/// Maps two pages of a one-page file with mmap(2) (not usermm) and touches the second one:
/// a real SIGBUS (BUS_ADRERR) beyond the end of the file. Returns the touched address.
fn touch_beyond_eof_of_own_mapping(dir: &std::path::Path) -> usize {
    let path = dir.join("own");
    std::fs::write(&path, [7u8; PAGE]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared read-only mapping of two pages of a valid fd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let beyond = p as usize + PAGE + 8;
    // SAFETY: inside the mapping; the program's handler maps a page over it if it faults.
    let v = unsafe { std::ptr::read_volatile(beyond as *const u64) };
    assert_eq!(v, 0, "the page mapped by the program's handler reads zeros");
    // SAFETY: the first page is file data.
    assert_eq!(unsafe { std::ptr::read_volatile(p as *const u8) }, 7);
    // SAFETY: unmapping what this function mapped.
    unsafe { libc::munmap(p, 2 * PAGE) };
    beyond
}

#[test]
fn faults_served_on_the_faulting_thread_and_other_sigbus_chained() {
    init_log();
    with_watchdog(240, "fault_path=sigbus end to end", || {
        let dir = tempfile::tempdir().unwrap();
        install_program_handler();
        // Before any manager: the program's handler sees its own SIGBUS directly.
        let a = touch_beyond_eof_of_own_mapping(dir.path());
        assert_eq!(SEEN_ADDR.load(Ordering::SeqCst), a);
        assert_eq!(SEEN_CODE.load(Ordering::SeqCst), libc::BUS_ADRERR);

        let budget = 8 * MIB;
        let mm = Mm::new(
            MmConfig::new(budget)
                .swap(SwapConfig::Ram { size: 128 * MIB })
                // Swapped-in pages kept clean in the swap cache, write-protected, so that the
                // rewrites below are write-protect faults served on the faulting threads.
                .settings(
                    Settings::default()
                        .with(Switch::FaultPath, usermm::Behaviour::New)
                        .with(Switch::AnonClean, usermm::Behaviour::Old)
                        .with(Switch::SwapinCache, usermm::Behaviour::Old),
                ),
        )
        .expect("a manager with fault_path=sigbus");
        assert!(
            mm.uffd_info().features.contains(&"SIGBUS"),
            "{:?}",
            mm.uffd_info()
        );

        // Many threads, 4x the budget, writes then two verifying passes (reads of swapped
        // pages, zero-page reads of untouched words, rewrites of clean swap-cache pages:
        // missing and write-protect faults, all served on the faulting threads).
        const T: usize = 12;
        let r = Arc::new(mm.map_anon((4 * budget) as usize).unwrap());
        let pages = r.len() / PAGE;
        for round in 0..3u64 {
            let hs: Vec<_> = (0..T)
                .map(|t| {
                    let r = r.clone();
                    std::thread::spawn(move || {
                        let start = t * pages / T;
                        for k in 0..pages {
                            let p = (start + k) % pages;
                            let off = p * PAGE + t * 8;
                            if round == 1 {
                                let got = r.read_u64(off);
                                assert_eq!(got, pattern(0, p as u64, t as u64), "page {p} t {t}");
                            } else {
                                let tag = if round == 0 { 0 } else { 2 };
                                if round == 2 {
                                    assert_eq!(r.read_u64(off), pattern(0, p as u64, t as u64));
                                }
                                r.write_u64(off, pattern(tag, p as u64, t as u64));
                            }
                            // A word no thread writes: a zero-page read or a read of a page
                            // another thread brought in.
                            assert_eq!(r.read_u64(p * PAGE + 4000), 0);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("a faulting thread panicked");
            }
        }
        for p in 0..pages {
            for t in 0..T {
                assert_eq!(r.read_u64(p * PAGE + t * 8), pattern(2, p as u64, t as u64));
            }
        }
        let vm = mm.vmstat();
        eprintln!("{vm}");
        assert!(vm.val("fault_self_served") > 0, "{vm}");
        assert!(vm.val("pswpout") > 0 && vm.val("pswpin") > 0, "{vm}");
        assert!(vm.val("wp_fault") > 0, "{vm}");
        assert_eq!(vm.val("handler_panic"), 0, "{vm}");
        assert_eq!(vm.val("oom_poison"), 0, "{vm}");
        assert!(mm.peak_resident_bytes() <= budget, "{vm}");
        assert_consistent(&mm);

        // A shared file mapping four times the budget written by four threads (write faults
        // served in place, the writers throttled in the fault above the dirty limits as
        // Linux's fault_dirty_shared_page does), flushed, then checked on disk.
        let fpath = dir.path().join("written");
        let flen = (4 * budget) as usize;
        std::fs::write(&fpath, vec![0u8; flen]).unwrap();
        let fr = Arc::new(mm.map_file(&fpath, 0, flen, MapKind::Shared).unwrap());
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let fr = fr.clone();
                std::thread::spawn(move || {
                    for p in (t..flen / PAGE).step_by(4) {
                        for w in [0, 511] {
                            fr.write_u64(p * PAGE + w * 8, pattern(7, p as u64, w as u64));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("a writer panicked");
        }
        fr.flush(0, flen).unwrap();
        drop(fr);
        let disk = std::fs::read(&fpath).unwrap();
        for p in 0..flen / PAGE {
            for w in [0usize, 511] {
                let o = p * PAGE + w * 8;
                let got = u64::from_ne_bytes(disk[o..o + 8].try_into().unwrap());
                assert_eq!(
                    got,
                    pattern(7, p as u64, w as u64),
                    "file page {p} word {w}"
                );
            }
        }
        eprintln!(
            "mapped writers: dirty_throttle {}",
            mm.vmstat().val("dirty_throttle")
        );

        // Not usermm's: a SIGBUS beyond the end of a file the program mapped itself reaches
        // the program's handler through usermm's.
        let before = SEEN_COUNT.load(Ordering::SeqCst);
        let a = touch_beyond_eof_of_own_mapping(dir.path());
        assert_eq!(SEEN_COUNT.load(Ordering::SeqCst), before + 1);
        assert_eq!(SEEN_ADDR.load(Ordering::SeqCst), a);
        assert_eq!(SEEN_CODE.load(Ordering::SeqCst), libc::BUS_ADRERR);

        // A page usermm poisons (a file region beyond the end of its file) raises SIGBUS
        // (BUS_MCEERR_AR from the poison marker with CONFIG_MEMORY_FAILURE, BUS_ADRERR
        // without), which also reaches the program's handler.
        let path = dir.path().join("managed");
        std::fs::write(&path, [5u8; PAGE]).unwrap();
        let fr = mm.map_file(&path, 0, 2 * PAGE, MapKind::Shared).unwrap();
        assert_eq!(fr.read_u64(0), u64::from_ne_bytes([5; 8]));
        let before = SEEN_COUNT.load(Ordering::SeqCst);
        let _ = fr.read_u64(PAGE + 16);
        assert_eq!(SEEN_COUNT.load(Ordering::SeqCst), before + 1);
        assert_eq!(
            SEEN_ADDR.load(Ordering::SeqCst),
            fr.as_ptr() as usize + PAGE + 16
        );
        let code = SEEN_CODE.load(Ordering::SeqCst);
        assert!(
            code == libc::BUS_MCEERR_AR || code == libc::BUS_ADRERR,
            "si_code {code}"
        );
        drop(fr);

        // A kernel-mode access to a page that is not resident fails with EFAULT under this
        // path (no signal can be delivered inside a system call); once the program has
        // touched the page, the same call works.
        let k = mm.map_anon(4 * PAGE).unwrap();
        let mut fds = [0; 2];
        // SAFETY: a fresh pipe.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: write(2) from the region's first page (not resident): the kernel reads it.
        let n = unsafe { libc::write(fds[1], k.as_ptr() as *const libc::c_void, 8) };
        assert_eq!(n, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
        k.write_u64(0, 0x1234);
        // SAFETY: as above; the page is resident now.
        let n = unsafe { libc::write(fds[1], k.as_ptr() as *const libc::c_void, 8) };
        assert_eq!(n, 8);
        let mut back = [0u8; 8];
        // SAFETY: reading the 8 bytes just written into a local buffer.
        let n = unsafe { libc::read(fds[0], back.as_mut_ptr() as *mut libc::c_void, 8) };
        assert_eq!(n, 8);
        assert_eq!(u64::from_ne_bytes(back), 0x1234);
        // SAFETY: closing the pipe's descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(mm.health().is_ok(), "{:?}", mm.health());

        // A SIGBUS handler installed after the manager replaces usermm's: health says so.
        // A new self-serving manager installs usermm's again, chaining to that one.
        install_program_handler();
        assert!(mm.health().sigbus_handler_replaced, "{:?}", mm.health());
        assert!(!mm.health().is_ok());
        let mm2 = Mm::new(
            MmConfig::new(budget)
                .swap(SwapConfig::Ram { size: 16 * MIB })
                .settings(Settings::default().with(Switch::FaultPath, usermm::Behaviour::New)),
        )
        .unwrap();
        assert!(!mm.health().sigbus_handler_replaced && mm2.health().is_ok());
        let r2 = mm2.map_anon(PAGE * 4).unwrap();
        r2.write_u64(PAGE, 9);
        assert_eq!(r2.read_u64(PAGE), 9);
        let before = SEEN_COUNT.load(Ordering::SeqCst);
        let a = touch_beyond_eof_of_own_mapping(dir.path());
        assert_eq!(SEEN_COUNT.load(Ordering::SeqCst), before + 1);
        assert_eq!(SEEN_ADDR.load(Ordering::SeqCst), a);
    });
}
