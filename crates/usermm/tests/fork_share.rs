//! fork(2)'s swap sharing, both ends in one process: a "parent" manager shares the swapped
//! pages of a region by slot (`Mm::share_swapped_for_fork`, `swap_duplicate`) and serves them
//! over a socket (`Mm::serve_fork_child`); a "child" manager made with the link
//! (`MmConfig::inherit`) adopts a copy of the resident pages and names the shared ones
//! (`Mm::adopt_anon_inherited`). Each side must see the memory as it was at the fork whatever
//! the other writes after; the shared slots are freed when the child is done with them; an
//! exiting parent hands the child its pages in a file (`Mm::hand_over_fork_children`).

mod common;

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use common::*;
use usermm::swap::InheritLink;
use usermm::{Mm, MmConfig, Region, SwapConfig};

const TAG: u64 = 31;

fn word(r: &Region, p: usize) -> (u64, u64) {
    (r.read_u64(p * PAGE), r.read_u64(p * PAGE + PAGE - 8))
}

/// Parent region of `pages` pages, every page written with `tag`, mostly swapped out.
fn parent_region(mm: &Mm, pages: usize) -> Region {
    let r = mm.map_anon(pages * PAGE).unwrap();
    for p in 0..pages {
        r.write_u64(p * PAGE, pattern(TAG, p as u64, 0));
        r.write_u64(p * PAGE + PAGE - 8, pattern(TAG, p as u64, 1));
    }
    r
}

/// The child's side of a fork of `r`: a manager linked to the parent over a fresh socket,
/// and its region (the resident pages copied, the swapped ones shared by slot).
fn fork_child(parent: &Mm, r: &Region, budget: u64) -> (Mm, Region, usize) {
    let len = r.len();
    let shared = parent.share_swapped_for_fork(r, len, &[]);
    let (a, b) = UnixStream::pair().unwrap();
    parent
        .serve_fork_child(a, shared.iter().map(|&(_, s)| s).collect())
        .unwrap();
    let link = Arc::new(InheritLink::new(
        std::process::id(),
        b,
        shared.iter().map(|&(_, s)| s).collect(),
    ));
    let mut cfg = MmConfig::new(budget).swap(SwapConfig::Ram { size: 64 * MIB });
    cfg.inherit = Some(link);
    let child = Mm::new(cfg).unwrap();
    // The copy: every page not shared, as the preload's fork_send/fork_receive do.
    let raw = usermm_sys::Mapping::anon(len, 0).unwrap();
    let mut is_shared = vec![false; len / PAGE];
    for &(i, _) in &shared {
        is_shared[i as usize] = true;
    }
    let mut buf = vec![0u8; PAGE];
    for (p, s) in is_shared.iter().enumerate() {
        if !s {
            parent.copy_for_fork(r, p * PAGE, &mut buf).unwrap();
            raw.write_bytes(p * PAGE, &buf).unwrap();
        }
    }
    let addr = raw.addr();
    std::mem::forget(raw);
    let entries: Vec<(u64, u64)> = shared
        .iter()
        .enumerate()
        .map(|(k, &(i, _))| (i, k as u64))
        .collect();
    let cr = child
        .adopt_anon_inherited(addr, len, false, &entries)
        .unwrap();
    (child, cr, shared.len())
}

#[test]
fn a_fork_child_shares_swapped_pages_and_each_side_keeps_its_own() {
    init_log();
    let budget = 8 * MIB;
    let parent = mm_ram(budget, 256 * MIB);
    let pages = (64 * MIB) as usize / PAGE;
    let r = parent_region(&parent, pages);
    let (child, cr, nshared) = fork_child(&parent, &r, budget);
    // Most of the parent's 64 MiB is swapped out at the fork: shared, not copied.
    assert!(nshared > pages / 2, "{nshared} of {pages} pages shared");
    assert_eq!(
        parent.vmstat().val("nr_swap_shared"),
        nshared as u64,
        "{}",
        parent.vmstat()
    );
    // After the fork, the parent rewrites the odd pages and the child the even ones, under
    // constant reclaim (8 MiB budgets each).
    for p in (1..pages).step_by(2) {
        r.write_u64(p * PAGE, pattern(TAG + 1, p as u64, 0));
    }
    for p in (0..pages).step_by(2) {
        cr.write_u64(p * PAGE, pattern(TAG + 2, p as u64, 0));
    }
    for p in 0..pages {
        let q = p as u64;
        let (pw, cw) = if p % 2 == 1 {
            (pattern(TAG + 1, q, 0), pattern(TAG, q, 0))
        } else {
            (pattern(TAG, q, 0), pattern(TAG + 2, q, 0))
        };
        assert_eq!(word(&r, p), (pw, pattern(TAG, q, 1)), "parent page {p}");
        assert_eq!(word(&cr, p), (cw, pattern(TAG, q, 1)), "child page {p}");
    }
    let reads = child.vmstat().val("fork_swap_read_pages");
    assert!(reads > 0, "{}", child.vmstat());
    assert!(child.peak_resident_bytes() <= budget);
    // The child's region goes: every slot it still shared is freed in the parent.
    drop(cr);
    drop(child);
    assert!(
        eventually(|| parent.vmstat().val("nr_swap_shared") == 0),
        "{}",
        parent.vmstat()
    );
    // Every slot the parent holds is its own region's: dropping it frees them all.
    drop(r);
    assert!(
        eventually(|| parent.vmstat().val("nr_swap_used") == 0),
        "{}",
        parent.vmstat()
    );
    parent.settle(std::time::Duration::from_secs(5));
    assert_eq!(parent.audit(), Vec::<String>::new());
}

#[test]
fn an_exiting_parent_hands_its_child_the_shared_pages() {
    init_log();
    let budget = 8 * MIB;
    let parent = mm_ram(budget, 256 * MIB);
    let pages = (48 * MIB) as usize / PAGE;
    let r = parent_region(&parent, pages);
    let (child, cr, nshared) = fork_child(&parent, &r, budget);
    assert!(nshared > pages / 2);
    // The child reads a quarter before the parent "exits".
    for p in 0..pages / 4 {
        assert_eq!(
            word(&cr, p),
            (pattern(TAG, p as u64, 0), pattern(TAG, p as u64, 1))
        );
    }
    // (Other tests' children in this process are handed over too.)
    assert!(Mm::hand_over_fork_children(std::time::Duration::from_secs(60)) >= 1);
    // The parent's pages change and its region goes: the child's do not.
    for p in 0..pages {
        r.write_u64(p * PAGE, 0);
    }
    drop(r);
    for p in 0..pages {
        assert_eq!(
            word(&cr, p),
            (pattern(TAG, p as u64, 0), pattern(TAG, p as u64, 1)),
            "page {p}"
        );
    }
    drop(cr);
    drop(child);
    assert!(
        eventually(|| parent.vmstat().val("nr_swap_used") == 0),
        "{}",
        parent.vmstat()
    );
}

#[test]
fn a_child_reads_nothing_it_was_not_given() {
    init_log();
    // A read of a slot the parent did not share with this child is refused (EPERM), not
    // answered with some other page.
    let parent = mm_ram(8 * MIB, 256 * MIB);
    let r = parent_region(&parent, (32 * MIB) as usize / PAGE);
    let shared: Vec<u64> = parent
        .share_swapped_for_fork(&r, r.len(), &[])
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    assert!(!shared.is_empty());
    let other = shared.iter().max().unwrap() + 1000;
    let (a, mut b) = UnixStream::pair().unwrap();
    parent.serve_fork_child(a, shared.clone()).unwrap();
    use std::io::{Read, Write};
    let mut req = Vec::new();
    req.extend_from_slice(&usermm::swap::inherit::OP_READ.to_ne_bytes());
    req.extend_from_slice(&2u32.to_ne_bytes());
    req.extend_from_slice(&shared[0].to_ne_bytes());
    req.extend_from_slice(&other.to_ne_bytes());
    b.write_all(&req).unwrap();
    let mut h = [0u8; 8];
    b.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_ne_bytes([h[0], h[1], h[2], h[3]]),
        libc::EPERM as u32
    );
    // A request too large to be one is the end of the connection; the slots go back.
    let mut req = Vec::new();
    req.extend_from_slice(&usermm::swap::inherit::OP_READ.to_ne_bytes());
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    b.write_all(&req).unwrap();
    assert_eq!(
        b.read(&mut h).unwrap(),
        0,
        "the parent closes the connection"
    );
    assert!(
        eventually(|| parent.vmstat().val("nr_swap_shared") == 0),
        "{}",
        parent.vmstat()
    );
    drop(r);
    assert!(eventually(|| parent.vmstat().val("nr_swap_used") == 0));
}
