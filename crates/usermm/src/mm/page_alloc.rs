//! The frame allocator's policy side. Mirrors `mm/page_alloc.c`: `__alloc_pages` with its fast
//! path against the watermarks and its slow path into direct reclaim (vmscan.rs). The free-frame
//! bitmap itself is `FrameAlloc` (page.rs).

use std::time::{Duration, Instant};

use crate::vmstat::Item;

use super::page::Pfn;
use super::vmscan;
use super::MmInner;
use crate::conv::Narrow;

/// More frames for a batch that has some already (a readahead window gathering its frames so
/// that it is one read): up to `want` of those free above the min watermark, else of what one
/// direct reclaim pass frees. Never retries or dips into the reserve as [`alloc_pages`] does
/// (the batch goes ahead with what it has); none in a budget group. Returns how many it added.
pub fn alloc_more_pages(m: &MmInner, want: usize, out: &mut Vec<Pfn>) -> usize {
    let got = take_free(m, want, out, false);
    if got > 0 || want == 0 || m.node.memcg.is_some() {
        return got;
    }
    vmscan::wake_kswapd(&m.node);
    m.vm.inc(Item::Allocstall);
    if vmscan::try_to_free_pages(m, vmscan::SWAP_CLUSTER_MAX.max(want)) == 0 {
        return 0;
    }
    take_free(m, want, out, false)
}

/// The allocators' fast path: up to `want` free frames above the min watermark (all free ones
/// with `reserve`) into `out`, waking kswapd when that leaves fewer than low. Returns how many.
fn take_free(m: &MmInner, want: usize, out: &mut Vec<Pfn>, reserve: bool) -> usize {
    let free = m.node.nr_free();
    let can = if reserve {
        free
    } else {
        free.saturating_sub(m.node.wmark.min)
    }
    .usize();
    if can == 0 {
        return 0;
    }
    let got = m.node.alloc_frames(want.min(can), out);
    if got > 0 {
        if m.node.nr_free() < m.node.wmark.low {
            vmscan::wake_kswapd(&m.node);
        }
        m.node.note_resident();
    }
    got
}

/// `__alloc_pages`: allocates up to `want` frames into `out` (at least one). The fast path takes
/// free frames above the min watermark and wakes kswapd below low; the slow path reclaims
/// directly (`allocstall`), then dips into the reserve below min. Returns false when nothing can
/// be freed (out of memory: no swap slot left, or a device that keeps failing writes past its
/// retry window).
pub fn alloc_pages(m: &MmInner, want: usize, out: &mut Vec<Pfn>) -> bool {
    let want = want.max(1);
    let start = Instant::now();
    let mut stalled = false;
    let mut fails = 0u32;
    let write_errors = m.vm.get(Item::SwapWriteError);
    loop {
        // Once direct reclaim has run and failed, dip into the reserve below min.
        if take_free(m, want, out, fails > 2) > 0 {
            return true;
        }
        vmscan::wake_kswapd(&m.node);
        if let Some(g) = &m.node.memcg {
            // Short because the group is: its other members' reclaimers give back their shares.
            g.signal_pressure();
        }
        if !stalled {
            m.vm.inc(Item::Allocstall);
            stalled = true;
        }
        // In a budget group, this process reclaims its share and the others' reclaimers
        // (signalled when the charge failed) theirs; when that has not been enough a few times
        // (another member stopped, SIGSTOP, or with nothing it can reclaim) all of it.
        let full = vmscan::SWAP_CLUSTER_MAX.max(want);
        let nr = if fails > 4 {
            full
        } else {
            vmscan::reclaim_share(m, full)
        };
        let got = if nr > 0 {
            vmscan::try_to_free_pages(m, nr)
        } else {
            0
        };
        if got == 0 {
            fails += 1;
            if let Some(g) = &m.node.memcg {
                // Short in a budget group: the pages of a member killed before it could leave
                // are given back; the others' kswapds reclaim their shares meanwhile.
                g.reap_dead(false);
            }
            // Out of memory: no slot to swap to, or the device keeps failing writes.
            let swap_exhausted = m.swap.as_ref().is_none_or(|s| s.slots.nr_free() == 0)
                || m.vm.get(Item::SwapWriteError) > write_errors;
            let elapsed = start.elapsed();
            // A device whose writes heal by waiting (a remote tier's failover) is waited for.
            let window = m
                .swap
                .as_ref()
                .map_or(Duration::ZERO, |s| s.dev.retry_window());
            if (swap_exhausted && fails > 64 && elapsed > window.max(Duration::from_millis(50)))
                || elapsed > window.max(Duration::from_secs(10))
            {
                return false;
            }
            if fails > 8 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                crate::sync::yield_now();
            }
        }
    }
}
