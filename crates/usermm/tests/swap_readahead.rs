//! Swap-in readahead and the swap cache: sequential read-back is served mostly by readahead,
//! random access earns no readahead window, and clean pages (read back, not written) are
//! dropped again without a second write, while written ones are written exactly once more.

mod common;

use common::*;

const BUDGET: u64 = 4 * MIB;

/// A 16 MiB region, every page written, then everything pushed out to swap.
fn swapped_out(tag: u64) -> (usermm::Mm, usermm::Region) {
    let mm = mm_ram(BUDGET, 64 * MIB);
    let r = mm.map_anon(16 * MIB as usize).unwrap();
    for p in 0..r.len() / PAGE {
        r.write_u64(p * PAGE, pattern(tag, p as u64, 0));
        r.write_u64(p * PAGE + 4000, pattern(tag, p as u64, 500));
    }
    reclaim_all(&mm);
    let vm = mm.vmstat();
    assert_eq!(
        mm.resident_bytes(),
        0,
        "reclaim_to(0) left pages resident\n{vm}"
    );
    assert_eq!(r.resident_pages(), 0, "{vm}");
    assert_eq!(r.swapped_pages(), (r.len() / PAGE) as u64, "{vm}");
    (mm, r)
}

#[test]
fn sequential_read_back_uses_readahead() {
    init_log();
    let (mm, r) = swapped_out(20);
    let pages = r.len() / PAGE;
    let before = mm.vmstat();
    for p in 0..pages {
        assert_eq!(r.read_u64(p * PAGE), pattern(20, p as u64, 0), "page {p}");
        assert_eq!(
            r.read_u64(p * PAGE + 4000),
            pattern(20, p as u64, 500),
            "page {p}"
        );
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    eprintln!(
        "sequential: {pages} pages, pgfault {} pgmajfault {} swap_ra {} swap_ra_hit {} \
         swap_ra_mapped {} swap_ra_async {}",
        d.val("pgfault"),
        d.val("pgmajfault"),
        d.val("swap_ra"),
        d.val("swap_ra_hit"),
        d.val("swap_ra_mapped"),
        d.val("swap_ra_async")
    );
    // Once the faults are a stream (every page of the last window used), each window is
    // mapped as it is read, not parked for a minor fault each (or a fault-around's share).
    assert!(
        d.val("swap_ra_mapped") * 3 > pages as u64,
        "a sequential read-back of {pages} pages mapped {} readahead pages as read: the \
         stream's windows were parked\n{d}",
        d.val("swap_ra_mapped")
    );
    assert!(d.val("swap_ra") > 0, "{d}");
    assert!(d.val("swap_ra_hit") > 0, "{d}");
    // RAM swap: a read waits for no device, so no window is read ahead by the workers
    // (swap_ra_async; stress.rs covers a swap file's streams).
    assert_eq!(d.val("swap_ra_async"), 0, "{d}");
    assert!(
        d.val("swap_ra_hit") <= d.val("swap_ra"),
        "more readahead hits than readahead pages\n{d}"
    );
    assert!(
        d.val("pgmajfault") * 4 < pages as u64,
        "{} major faults for {pages} sequential pages: readahead did not work\n{d}",
        d.val("pgmajfault")
    );
    assert!(
        d.val("swap_ra_hit") * 2 > pages as u64,
        "most pages should come from readahead\n{d}"
    );
    assert!(d.val("pswpin") >= pages as u64, "{d}");
    assert!(mm.peak_resident_bytes() <= BUDGET);
    assert_consistent(&mm);
}

/// A stream walking down the region (GNU sort's line array, a reverse scan) gets its
/// readahead window below the fault, and the pages read ahead are mapped by fault-around in
/// that direction too.
#[test]
fn descending_read_back_uses_readahead_below_the_fault() {
    init_log();
    let (mm, r) = swapped_out(27);
    let pages = r.len() / PAGE;
    let before = mm.vmstat();
    for p in (0..pages).rev() {
        assert_eq!(r.read_u64(p * PAGE), pattern(27, p as u64, 0), "page {p}");
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    eprintln!(
        "descending: {pages} pages, pgfault {} pgmajfault {} swap_ra {} swap_ra_hit {}",
        d.val("pgfault"),
        d.val("pgmajfault"),
        d.val("swap_ra"),
        d.val("swap_ra_hit")
    );
    assert!(
        d.val("swap_ra_hit") * 2 > pages as u64,
        "most pages should come from readahead\n{d}"
    );
    assert!(
        d.val("pgmajfault") * 4 < pages as u64,
        "a descending pass took a major fault on most pages\n{d}"
    );
    assert!(
        d.val("pgfault") * 4 < pages as u64,
        "readahead pages below the fault were not mapped by fault-around\n{d}"
    );
    assert_consistent(&mm);
}

#[test]
fn interleaved_descending_streams_get_readahead_around_the_fault() {
    // GNU sort's merge pass: several runs read from their ends down, two pages of each in
    // turn. A major fault in one stream mostly follows one in another, so the window has no
    // direction; centred on the fault (swap_vma_ra_win), its lower half is what the stream
    // reads next, and its upper half (pages the stream already has) is skipped, not read.
    init_log();
    let (mm, r) = swapped_out(33);
    let pages = r.len() / PAGE;
    let streams = 3;
    let len = pages / streams;
    let before = mm.vmstat();
    for k in (0..len / 2).rev() {
        for s in 0..streams {
            for p in [s * len + 2 * k + 1, s * len + 2 * k] {
                assert_eq!(r.read_u64(p * PAGE), pattern(33, p as u64, 0), "page {p}");
            }
        }
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    let read = (len / 2 * 2 * streams) as u64;
    eprintln!(
        "interleaved: {read} pages, pgmajfault {} swap_ra {} swap_ra_hit {} pswpin {}",
        d.val("pgmajfault"),
        d.val("swap_ra"),
        d.val("swap_ra_hit"),
        d.val("pswpin")
    );
    // Every other page at most (the window of a stream grows to four pages, one of them below
    // the fault); an upward window reads nothing the streams use: three major faults in four.
    assert!(
        d.val("pgmajfault") * 5 < read * 3,
        "the interleaved streams took {} major faults for {read} pages\n{d}",
        d.val("pgmajfault")
    );
    assert!(
        d.val("swap_ra_hit") * 10 >= d.val("swap_ra") * 9,
        "readahead read pages the streams did not use\n{d}"
    );
    assert_consistent(&mm);
}

#[test]
fn random_read_back_gets_little_readahead() {
    init_log();
    let (mm, r) = swapped_out(21);
    let pages = r.len() / PAGE;
    // A fixed pseudo-random permutation of the pages.
    let mut order: Vec<usize> = (0..pages).collect();
    for i in (1..pages).rev() {
        let j = (mix(i as u64 ^ 0x5eed) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let before = mm.vmstat();
    for &p in &order {
        assert_eq!(
            r.read_u64(p * PAGE + 4000),
            pattern(21, p as u64, 500),
            "page {p}"
        );
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    eprintln!(
        "random: {pages} pages, pgmajfault {} swap_ra {} swap_ra_hit {}",
        d.val("pgmajfault"),
        d.val("swap_ra"),
        d.val("swap_ra_hit")
    );
    assert!(
        d.val("swap_ra_hit") * 10 < pages as u64,
        "{} readahead hits for random access over {pages} pages\n{d}",
        d.val("swap_ra_hit")
    );
    assert!(
        d.val("pgmajfault") * 10 > pages as u64 * 8,
        "random access should mostly be major faults\n{d}"
    );
    for &p in order.iter().step_by(5) {
        assert_eq!(r.read_u64(p * PAGE), pattern(21, p as u64, 0), "page {p}");
    }
    assert_consistent(&mm);
}

#[test]
fn clean_pages_are_not_written_twice() {
    init_log();
    for hash in [false, true] {
        clean_pages_are_not_written_twice_with(hash);
    }
}

fn clean_pages_are_not_written_twice_with(hash: bool) {
    let mm = mm_ram_anon_clean(8 * MIB, 64 * MIB, hash);
    let n = 512;
    let r = mm.map_anon(n * PAGE).unwrap();
    for p in 0..n {
        r.write_u64(p * PAGE + 64, pattern(22, p as u64, 8));
    }
    settle(&mm);
    let s0 = mm.vmstat();
    reclaim_all(&mm);
    let s1 = mm.vmstat();
    let d1 = s1.delta(&s0);
    assert_eq!(r.resident_pages(), 0, "{d1}");
    assert_eq!(
        d1.val("pswpout"),
        n as u64,
        "first eviction writes every page once\n{d1}"
    );

    // Read everything back: the pages are clean copies of their swap slots.
    for p in 0..n {
        assert_eq!(
            r.read_u64(p * PAGE + 64),
            pattern(22, p as u64, 8),
            "page {p}"
        );
    }
    settle(&mm);
    let s2 = mm.vmstat();
    assert_eq!(r.resident_pages(), n as u64, "{}", s2.delta(&s1));
    assert!(
        s2.val("nr_swapcache") > 0,
        "read-back pages should stay in the swap cache\n{s2}"
    );

    reclaim_all(&mm);
    let s3 = mm.vmstat();
    let d3 = s3.delta(&s2);
    assert_eq!(r.resident_pages(), 0, "{d3}");
    let steal = |d: &usermm::Vmstat| d.val("pgsteal_kswapd") + d.val("pgsteal_direct");
    assert!(
        steal(&d3) >= n as u64,
        "the second eviction must reclaim the pages\n{d3}"
    );
    assert_eq!(
        d3.val("pswpout"),
        0,
        "clean pages were written to swap again (anon_clean hash: {hash})\n{d3}"
    );
    if hash {
        assert_eq!(d3.val("clean_hash_dirty"), 0, "{d3}");
        assert!(d3.val("clean_hash_clean") >= n as u64, "{d3}");
    }
    for p in 0..n {
        assert_eq!(
            r.read_u64(p * PAGE + 64),
            pattern(22, p as u64, 8),
            "page {p} after the second eviction"
        );
    }
    assert_consistent(&mm);
}

/// `swapin_cache=skip` (the default) on the RAM device: a page swapped back in keeps nothing
/// of its swap copy, as Linux's do_swap_page skips the swap cache on zram: its slot is free
/// once the page is read (faulting pages, their readahead neighbours, a stream's mapped
/// windows), the page is dirty, and the next eviction writes every page again, with its data.
/// Pages read ahead but never used stay clean and cost no write.
#[test]
fn swap_ins_from_ram_free_their_slots() {
    init_log();
    let mm = mm_ram(8 * MIB, 64 * MIB);
    let n = 1024;
    let r = mm.map_anon(n * PAGE).unwrap();
    for p in 0..n {
        r.write_u64(p * PAGE + 64, pattern(23, p as u64, 8));
    }
    settle(&mm);
    reclaim_all(&mm);
    assert_eq!(r.resident_pages(), 0);
    let s1 = mm.vmstat();
    let check = |p: usize, when: &str| {
        assert_eq!(
            r.read_u64(p * PAGE + 64),
            pattern(23, p as u64, 8),
            "page {p} {when}"
        );
    };
    // Up the region (a stream: mapped windows), then every other page of a second pass down
    // (parked readahead pages, half of them used).
    for p in 0..n / 2 {
        check(p, "read back up");
    }
    for p in (n / 2..n).rev().step_by(2) {
        check(p, "read back down");
    }
    settle(&mm);
    let s2 = mm.vmstat();
    let d2 = s2.delta(&s1);
    let used = (n / 2 + n / 4) as u64;
    assert!(d2.val("pswpin") >= used, "{d2}");
    // Only unused readahead pages may still hold a slot (clean, in the swap cache).
    let unused = d2.val("pswpin") - used;
    assert!(
        s2.val("nr_swapcache") <= unused,
        "{} pages in the swap cache, {unused} read ahead and unused\n{d2}",
        s2.val("nr_swapcache")
    );
    assert_eq!(d2.val("clean_hash_clean") + d2.val("wp_fault"), 0, "{d2}");

    reclaim_all(&mm);
    let s3 = mm.vmstat();
    let d3 = s3.delta(&s2);
    assert_eq!(r.resident_pages(), 0, "{d3}");
    assert!(
        d3.val("pswpout") >= used,
        "every page used after its swap-in is written again\n{d3}"
    );
    for p in 0..n {
        check(p, "after the second eviction");
    }
    assert_consistent(&mm);
}

/// Under both ways of seeing the store (`anon_clean=wp`: a write-protect fault per page;
/// `hash`: no fault, the changed hash found when reclaim unmaps the page).
#[test]
fn written_pages_after_swap_in_are_written_again_and_keep_the_new_data() {
    init_log();
    for hash in [false, true] {
        written_pages_after_swap_in_with(hash);
    }
}

fn written_pages_after_swap_in_with(hash: bool) {
    let mm = mm_ram_anon_clean(8 * MIB, 64 * MIB, hash);
    let n = 512;
    let r = mm.map_anon(n * PAGE).unwrap();
    for p in 0..n {
        r.write_u64(p * PAGE, pattern(23, p as u64, 0));
    }
    reclaim_all(&mm);
    assert_eq!(mm.resident_bytes(), 0);
    for p in 0..n {
        assert_eq!(r.read_u64(p * PAGE), pattern(23, p as u64, 0), "page {p}");
    }
    // Re-dirty every third page (after it came back clean from swap).
    let dirtied: Vec<usize> = (0..n).step_by(3).collect();
    let before = mm.vmstat();
    for &p in &dirtied {
        r.write_u64(p * PAGE, pattern(24, p as u64, 0));
    }
    settle(&mm);
    let dw = mm.vmstat().delta(&before);
    let before = mm.vmstat();
    reclaim_all(&mm);
    let dr = mm.vmstat().delta(&before);
    let resident = r.resident_pages();
    // Data first: a write to a page that came back clean from swap must never be lost.
    for p in 0..n {
        let want = if p % 3 == 0 {
            pattern(24, p as u64, 0)
        } else {
            pattern(23, p as u64, 0)
        };
        assert_eq!(
            r.read_u64(p * PAGE),
            want,
            "page {p} (re-dirtied after swap-in: {})",
            p % 3 == 0
        );
    }
    assert_eq!(resident, 0, "{dr}");
    if hash {
        assert_eq!(
            dw.val("wp_fault"),
            0,
            "stores to writable pages fault\n{dw}"
        );
        assert_eq!(
            dr.val("clean_hash_dirty"),
            dirtied.len() as u64,
            "each re-dirtied page is found changed when unmapped\n{dr}"
        );
        assert_eq!(
            dr.val("clean_hash_clean"),
            (n - dirtied.len()) as u64,
            "every other page is found unchanged\n{dr}"
        );
    } else {
        assert_eq!(
            dw.val("wp_fault"),
            dirtied.len() as u64,
            "each write to a clean swap-cache page is one wp fault\n{dw}"
        );
    }
    assert_eq!(
        dr.val("pswpout"),
        dirtied.len() as u64,
        "exactly the re-dirtied pages are written\n{dr}"
    );
    assert_consistent(&mm);
}

/// Minimal form of the lost-write case: a page comes back from swap clean (its swap copy kept),
/// the program writes it, and the next eviction must write it out again. Repeated over several
/// pages and rounds so that recycled frames are used.
#[test]
fn write_after_swap_in_is_never_lost() {
    init_log();
    let mm = mm_ram(4 * MIB, 64 * MIB);
    let r = mm.map_anon(64 * PAGE).unwrap();
    for p in 0..64 {
        r.write_u64(p * PAGE, pattern(25, p as u64, 0));
    }
    for round in 1..=8u64 {
        reclaim_all(&mm);
        for p in 0..64 {
            let old = pattern(25 + round - 1, p as u64, 0);
            // Read first (swap-in, clean), then write the new value.
            assert_eq!(
                r.read_u64(p * PAGE),
                old,
                "round {round} page {p}: value before rewrite"
            );
            r.write_u64(p * PAGE, pattern(25 + round, p as u64, 0));
        }
    }
    reclaim_all(&mm);
    for p in 0..64 {
        assert_eq!(
            r.read_u64(p * PAGE),
            pattern(33, p as u64, 0),
            "page {p} after the last round"
        );
    }
    assert_consistent(&mm);
}

/// A read-modify-write pass over swapped-out pages (numpy's in-place `a *= 3`, a sort's merge
/// buffer): each page is read (a swap-in, clean) and then written. The writes continue a
/// sequential run, so the pages are mapped writable in runs (write fault-around over clean
/// swap-cache pages, and swap-ins where the run expects its next write) instead of one
/// write-protect fault per page; every page is still written to swap exactly once more and no
/// write is lost.
#[test]
fn read_modify_write_pass_maps_runs_writable() {
    init_log();
    let (mm, r) = swapped_out(26);
    let pages = r.len() / PAGE;
    let before = mm.vmstat();
    for p in 0..pages {
        let v = r.read_u64(p * PAGE + 4000);
        assert_eq!(v, pattern(26, p as u64, 500), "page {p} before the rewrite");
        r.write_u64(p * PAGE + 4000, v ^ 0x5a5a);
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    eprintln!(
        "read-modify-write: {pages} pages, pgfault {} wp_fault {} pgmajfault {}",
        d.val("pgfault"),
        d.val("wp_fault"),
        d.val("pgmajfault")
    );
    assert!(
        d.val("wp_fault") * 8 < pages as u64,
        "one write-protect fault per page or close: the writes did not take runs\n{d}"
    );
    assert!(
        d.val("pgfault") * 4 < pages as u64,
        "a sequential read-modify-write pass faulted on most pages\n{d}"
    );
    let before = mm.vmstat();
    reclaim_all(&mm);
    let dr = mm.vmstat().delta(&before);
    assert_eq!(r.resident_pages(), 0, "{dr}");
    // Pages of the pass may have been evicted (and written) while it ran, under the 4 MiB
    // budget; between the pass and the final eviction every page is written exactly once.
    assert_eq!(
        d.val("pswpout") + dr.val("pswpout"),
        pages as u64,
        "every rewritten page is written to swap once\npass: {d}\neviction: {dr}"
    );
    for p in 0..pages {
        assert_eq!(
            r.read_u64(p * PAGE + 4000),
            pattern(26, p as u64, 500) ^ 0x5a5a,
            "page {p} after the rewrite was evicted"
        );
        assert_eq!(r.read_u64(p * PAGE), pattern(26, p as u64, 0), "page {p}");
    }
    assert_consistent(&mm);
}

/// A region declared random (`AccessPattern::Random`, MADV_RANDOM) reads back only the pages
/// it faults on, even sequentially; declared sequential, scattered faults still read ahead.
#[test]
fn declared_access_pattern_decides_swap_readahead() {
    init_log();
    let (mm, r) = swapped_out(21);
    let pages = r.len() / PAGE;
    r.set_access_pattern(usermm::AccessPattern::Random);
    let before = mm.vmstat();
    for p in 0..pages / 2 {
        assert_eq!(r.read_u64(p * PAGE), pattern(21, p as u64, 0), "page {p}");
    }
    let d = mm.vmstat().delta(&before);
    assert_eq!(d.val("swap_ra"), 0, "a random region read ahead\n{d}");
    assert_eq!(d.val("pgmajfault"), (pages / 2) as u64, "{d}");

    r.set_access_pattern(usermm::AccessPattern::Sequential);
    let before = mm.vmstat();
    for p in (pages / 2..pages).step_by(37) {
        assert_eq!(r.read_u64(p * PAGE), pattern(21, p as u64, 0), "page {p}");
    }
    let d = mm.vmstat().delta(&before);
    assert!(
        d.val("swap_ra") > 0,
        "a sequential region read nothing ahead\n{d}"
    );
}

/// `anon_clean=hash`: a region whose pages come back written after every swap-in (a
/// read-modify-write in random order: no sequential write run to detect) is soon mapped
/// writable and dirty at swap-in (`clean_hash_predicted`), while a read-only pass over another
/// region keeps every swap copy (no prediction there, no second write). No write is lost.
#[test]
fn regions_whose_pages_come_back_written_skip_the_hash() {
    init_log();
    let mm = mm_ram_anon_clean(4 * MIB, 128 * MIB, true);
    let n = 4096usize;
    let w = mm.map_anon(n * PAGE).unwrap();
    let ro = mm.map_anon(n * PAGE).unwrap();
    for p in 0..n {
        w.write_u64(p * PAGE, pattern(40, p as u64, 0));
        ro.write_u64(p * PAGE, pattern(41, p as u64, 0));
    }
    reclaim_all(&mm);
    // A permutation of the pages (odd multiplier modulo a power of two).
    let order: Vec<usize> = (0..n).map(|k| k.wrapping_mul(2_654_435_761) % n).collect();
    let before = mm.vmstat();
    for round in 1..=2u64 {
        for &p in &order {
            let v = w.read_u64(p * PAGE);
            assert_eq!(
                v,
                pattern(40 + round - 1, p as u64, 0),
                "round {round} page {p}"
            );
            w.write_u64(p * PAGE, pattern(40 + round, p as u64, 0));
        }
    }
    reclaim_all(&mm);
    let d = mm.vmstat().delta(&before);
    eprintln!(
        "random read-modify-write: clean_hash_dirty {} clean_hash_clean {} clean_hash_predicted {} wp_fault {}",
        d.val("clean_hash_dirty"),
        d.val("clean_hash_clean"),
        d.val("clean_hash_predicted"),
        d.val("wp_fault")
    );
    assert!(
        d.val("clean_hash_predicted") > n as u64 / 2,
        "a region whose pages all come back written should stop hashing them\n{d}"
    );
    assert_eq!(d.val("wp_fault"), 0, "{d}");

    let before = mm.vmstat();
    for &p in &order {
        assert_eq!(ro.read_u64(p * PAGE), pattern(41, p as u64, 0), "page {p}");
    }
    reclaim_all(&mm);
    let d = mm.vmstat().delta(&before);
    assert_eq!(
        d.val("clean_hash_predicted"),
        0,
        "a read-only region's pages are not predicted written\n{d}"
    );
    assert_eq!(d.val("clean_hash_dirty"), 0, "{d}");
    assert_eq!(d.val("pswpout"), 0, "clean pages were written again\n{d}");
    for p in 0..n {
        assert_eq!(w.read_u64(p * PAGE), pattern(42, p as u64, 0), "page {p}");
        assert_eq!(ro.read_u64(p * PAGE), pattern(41, p as u64, 0), "page {p}");
    }
    assert_consistent(&mm);
}

/// The smallest budget (1 MiB, 256 frames) reads back a stream correctly under the default
/// 256-page window, which is capped at an eighth of the frames there (32 pages: a fault never
/// asks for the whole budget), and nothing is poisoned.
#[test]
fn the_smallest_budget_caps_the_readahead_window() {
    init_log();
    let mm = mm_ram(MIB, 32 * MIB);
    let r = mm.map_anon(8 * MIB as usize).unwrap();
    let pages = r.len() / PAGE;
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(31, p as u64, 0));
    }
    let before = mm.vmstat();
    for p in 0..pages {
        assert_eq!(r.read_u64(p * PAGE), pattern(31, p as u64, 0), "page {p}");
    }
    settle(&mm);
    let d = mm.vmstat().delta(&before);
    assert_eq!(d.val("oom_poison"), 0, "{d}");
    // The faults' own windows (the readahead workers read the stream's next ones, each of the
    // faults' window size, and count them in swap_ra_async).
    assert!(
        d.val("swap_ra") - d.val("swap_ra_async") <= 32 * d.val("pgmajfault"),
        "a window of more than 32 pages (an eighth of 256 frames)\n{d}"
    );
    assert!(
        d.val("pgmajfault") * 4 < pages as u64,
        "{} major faults for {pages} pages: readahead did not work\n{d}",
        d.val("pgmajfault")
    );
    assert!(mm.peak_resident_bytes() <= MIB, "{d}");
    assert_consistent(&mm);
}

/// A RAM swap device whose reads wait `delay` as a disk's would (`blocks_on_read`), counting
/// how many are in flight at once.
#[derive(Debug)]
struct SlowReads {
    inner: usermm::swap::RamSwap,
    delay: std::time::Duration,
    in_flight: std::sync::atomic::AtomicU64,
    most: std::sync::atomic::AtomicU64,
}

impl usermm::swap::SwapDevice for SlowReads {
    fn name(&self) -> String {
        format!("slow reads over {}", self.inner.name())
    }
    fn nr_pages(&self) -> u64 {
        self.inner.nr_pages()
    }
    fn write_pages(
        &self,
        slot: u64,
        pool: &usermm_sys::Mapping,
        pages: &[usize],
    ) -> std::io::Result<()> {
        self.inner.write_pages(slot, pool, pages)
    }
    fn read_pages(
        &self,
        slot: u64,
        pool: &usermm_sys::Mapping,
        pages: &[usize],
    ) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(self.delay);
        self.in_flight.fetch_sub(1, SeqCst);
        self.inner.read_pages(slot, pool, pages)
    }
    fn blocks_on_read(&self) -> bool {
        true
    }
}

#[test]
fn faults_of_several_threads_read_from_a_waiting_device_together() {
    use std::sync::{Arc, Barrier};
    init_log();
    let dev = Arc::new(SlowReads {
        inner: usermm::swap::RamSwap::new(64 * MIB).unwrap(),
        delay: std::time::Duration::from_millis(300),
        in_flight: Default::default(),
        most: Default::default(),
    });
    let mm = usermm::Mm::new(
        usermm::MmConfig::new(BUDGET).swap(usermm::SwapConfig::Device(dev.clone())),
    )
    .unwrap();
    let r = Arc::new(mm.map_anon(16 * MIB as usize).unwrap());
    let pages = r.len() / PAGE;
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(41, p as u64, 0));
    }
    reclaim_all(&mm);
    assert_eq!(r.resident_pages(), 0, "{}", mm.vmstat());
    // Four threads fault at once on four swapped pages far apart: a handler holding several
    // of those faults would read them one after another (at most one or two in flight).
    let threads = 4;
    let go = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (r, go) = (r.clone(), go.clone());
            std::thread::spawn(move || {
                let p = t * pages / threads + 7;
                go.wait();
                assert_eq!(r.read_u64(p * PAGE), pattern(41, p as u64, 0), "page {p}");
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let most = dev.most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        most,
        threads as u64,
        "at most {most} of {threads} faults' device reads were in flight together\n{}",
        mm.vmstat()
    );
    assert_consistent(&mm);
}
