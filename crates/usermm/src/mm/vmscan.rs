//! Page reclaim. Mirrors `mm/vmscan.c`: `scan_control`, `shrink_node`/`shrink_lruvec`,
//! `shrink_active_list`, `shrink_inactive_list`, `shrink_page_list` with `page_check_references`,
//! `add_to_swap`, `pageout` and `__remove_mapping`; kswapd (`balance_pgdat` between the low and
//! high watermarks) and direct reclaim (`try_to_free_pages`, counted as `allocstall`), which the
//! allocator (page_alloc.rs) enters from its slow path.
//!
//! User space cannot read accessed bits, so a page's "young pte" is its being mapped (PG_mapped):
//! pages become mapped only by a fault, and clearing the accessed bit means unmapping the page
//! into its pool slot with one batched UFFDIO_MOVE. The next access is a minor fault that maps it
//! back: that fault is the reference. Unmapping and I/O happen in SWAP_CLUSTER_MAX batches.

use std::time::Duration;

use crate::sync::Ordering;
use crate::vmstat::Item;

use super::filemap;
use super::lru::Lru;
use super::mmzone::{Node, PassWait};
use super::page::{pg, Owner, Pfn, PgOff, RegionId, SwapEntry};
use super::page_io;
use super::pgtable::PageTable;
use super::pool;
use super::replacement::ScanInput;
use super::rmap;
use super::swap_state::SwapState;
use super::workingset::workingset_eviction;
use super::MmInner;
use crate::conv::Narrow;
use crate::settings::Switch;

/// Pages isolated and processed per batch.
pub const SWAP_CLUSTER_MAX: usize = 32;
/// kswapd's batch: four clusters per isolation, so its device writes are 512 KiB where pages
/// are consecutive (Linux gets the same effect from block-layer plugging). Measured on this VM,
/// swap-w-seq to a file: 32 -> 780-810 MiB/s, 128 -> 830-1190 MiB/s.
pub const KSWAPD_BATCH: usize = 4 * SWAP_CLUSTER_MAX;
/// Scan priority: a pass scans lru_size >> priority pages.
pub const DEF_PRIORITY: u32 = 12;

/// `struct scan_control`.
#[derive(Debug, Clone)]
pub struct ScanControl {
    pub nr_to_reclaim: usize,
    pub nr_reclaimed: usize,
    pub nr_scanned: usize,
    pub priority: u32,
    pub may_writepage: bool,
    pub may_unmap: bool,
    pub may_swap: bool,
    pub kswapd: bool,
}

impl ScanControl {
    fn new(nr_to_reclaim: usize, kswapd: bool) -> Self {
        ScanControl {
            nr_to_reclaim,
            nr_reclaimed: 0,
            nr_scanned: 0,
            priority: DEF_PRIORITY,
            may_writepage: true,
            may_unmap: true,
            may_swap: true,
            kswapd,
        }
    }
}

/// Wakes kswapd (`wakeup_kswapd`).
pub fn wake_kswapd(node: &Node) {
    let mut p = node.kswapd.pending.lock();
    if !*p {
        *p = true;
        node.kswapd.cv.notify_one();
    }
}

/// How long a direct reclaimer waits for another reclaimer's pass before it reclaims alongside
/// it anyway: a pass takes 0.1-2 ms; waiting longer means the holder is stuck on slow I/O (a
/// remote tier failing over), and an allocation must not wait on it without bound.
const THROTTLE_MAX: Duration = Duration::from_secs(1);

/// `throttle_direct_reclaim`: one reclaim pass at a time (`Node::reclaim`). A direct reclaimer
/// that finds a pass running (kswapd's, mostly) sleeps until it ends instead of scanning
/// alongside, and returns to the allocator as soon as a pass has left the `nr` frames it needs
/// free (counted: `pgscan_direct_throttle`). Linux throttles direct reclaimers for a similar
/// reason (`reclaim_throttle`), though its unmapping batches TLB flushes; here each
/// `UFFDIO_MOVE` of a lone page takes the anon_vma rwsem and flushes, and three reclaimers at
/// once spent 12% of all CPU spinning on that rwsem. Random usemem (8 tasks, 64 MiB, RAM swap)
/// 11.1-13.3 s without this, 5.4-5.7 s with it; waiting by spinning and yielding instead of
/// sleeping was slower than no throttle at all (15 s: the waiters took the CPU kswapd needed).
/// `Enough`: allocate; `Run`: reclaim in this pass; `TimedOut`: waited [`THROTTLE_MAX`] in
/// vain, reclaim alongside.
fn throttle_direct_reclaim(m: &MmInner, nr: usize) -> PassWait<'_> {
    let enough = || m.node.nr_free() >= m.node.wmark.min + nr as u64;
    m.node.reclaim.begin_or_wait(THROTTLE_MAX, enough, || {
        m.vm.inc(Item::PgscanDirectThrottle)
    })
}

/// `try_to_free_pages`: direct reclaim of at least `nr` pages, raising priority until done.
/// Returns the pages reclaimed, or `nr` when the pass of another reclaimer it waited for
/// ([`throttle_direct_reclaim`]) left that many frames free.
pub fn try_to_free_pages(m: &MmInner, nr: usize) -> usize {
    let mut sc = ScanControl::new(nr, false);
    sc.may_writepage = !m.cfg.settings.laptop_mode;
    let mut woke = false;
    loop {
        match throttle_direct_reclaim(m, nr) {
            PassWait::Enough => return sc.nr_reclaimed.max(nr),
            PassWait::Run(_pass) => shrink_node(m, &mut sc),
            PassWait::TimedOut => shrink_node(m, &mut sc),
        }
        // Scanned 1.5x the target: write pages even in laptop mode. Before seed 004's series
        // this is also where direct reclaim kicked the flushers; after it, reclaim kicks them
        // when it meets dirty, unqueued pages (shrink_inactive_list).
        if !woke && sc.nr_scanned > sc.nr_to_reclaim * 3 / 2 {
            if !m.cfg.settings.is_new(Switch::ReclaimWakeFlushers) {
                super::page_writeback::wakeup_flusher_threads(
                    m,
                    super::page_writeback::WbReason::Vmscan,
                    if m.cfg.settings.laptop_mode {
                        0
                    } else {
                        sc.nr_scanned as u64
                    },
                );
            }
            sc.may_writepage = true;
            woke = true;
        }
        if sc.nr_reclaimed >= sc.nr_to_reclaim || sc.priority == 0 {
            break;
        }
        sc.priority -= 1;
    }
    sc.nr_reclaimed
}

/// kswapd: sleeps until woken below the low watermark, then reclaims until free frames reach
/// the high watermark (`balance_pgdat`). In a budget group the free frames are the fewer of
/// the node's and the group's margin (`Node::nr_free`) and it reclaims this process's share.
pub fn kswapd_main(m: std::sync::Arc<MmInner>) {
    loop {
        {
            let mut p = m.node.kswapd.pending.lock();
            while !*p && !m.handlers.shutdown.load(Ordering::Acquire) {
                p = m.node.kswapd.cv.wait_for(p, Duration::from_millis(200));
                if m.node.nr_free() < m.node.wmark.low {
                    break;
                }
                if !*p {
                    // Idle: the swap device's upkeep (a wake meanwhile is seen by the loop).
                    drop(p);
                    if let Some(sw) = &m.swap {
                        sw.dev.trim();
                    }
                    p = m.node.kswapd.pending.lock();
                }
            }
            *p = false;
        }
        if m.handlers.shutdown.load(Ordering::Acquire) {
            return;
        }
        if let Some(g) = &m.node.memcg {
            // Pages still charged to members that exited come back first.
            g.reap_dead(false);
        }
        if m.node.nr_free() >= m.node.wmark.high {
            m.vm.inc(Item::KswapdHighWmarkHitQuickly);
            continue;
        }
        m.vm.inc(Item::KswapdWake);
        // Pressure has begun: swap-outs, then swap-ins, follow. On a device whose reads wait,
        // the standby readers (handler.rs) must be there before the first swap-in.
        if m.swap.as_ref().is_some_and(|s| s.dev.blocks_on_read()) {
            super::handler::start_standby_readers(&m);
        }
        balance_pgdat(&m);
    }
}

/// The share of `want` pages a member of a budget group reclaims: in proportion to the pages
/// it holds of the group's (as `shrink_node` scans each memory cgroup's lruvec in proportion to
/// its size, `get_scan_count`), so each process of a tree gives back in proportion to what it
/// holds, not all of it from whichever allocates. All of `want` for a manager in no group.
pub(crate) fn reclaim_share(m: &MmInner, want: usize) -> usize {
    let Some(g) = &m.node.memcg else {
        return want;
    };
    let total = g.usage().max(1);
    let mine = g.my_usage().min(total);
    (want as u64 * mine).div_ceil(total).usize()
}

/// The budget group's reclaimer (thread `usermm-memcg`, one per manager in a group): kswapd
/// keeps this node's own frames above its watermarks; this keeps the group's margin, which
/// another process's allocations consume, above them (the role of memcg's `high_work`,
/// `reclaim_high`, in Linux). It sleeps on the group's shared futex until a member finds the
/// margin below its low watermark (`MemCgroup::signal_pressure`), then gives back this
/// process's share: first the recycled pages kept in free frames (charged, of no use to the
/// others), then pages reclaimed from its LRU lists, until the margin reaches the high
/// watermark. Members that exited holding pages are uncharged on the way. A manager alone in its
/// group leaves the margin to its kswapd and direct reclaim (draining its own recycled pages
/// would only cost it their reuse).
pub fn memcg_reclaimd(m: std::sync::Arc<MmInner>) {
    let Some(g) = &m.node.memcg else {
        return;
    };
    while !m.handlers.shutdown.load(Ordering::Acquire) {
        g.reap_dead(false);
        if g.margin() >= m.node.wmark.low || !g.others_short() {
            // Woken by a member short of pages, by the manager's drop, or once a second to
            // look again (a signal sent between the check and the sleep is not lost: the
            // futex word changed).
            g.wait_pressure(Duration::from_secs(1));
            continue;
        }
        if shrink_for_group(&m) == 0 {
            // Nothing to give (holding nearly nothing, or nothing reclaimable now): the others
            // reclaim; look again in a while, whatever signals arrive meanwhile.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One round of [`memcg_reclaimd`]: returns the pages given back to the group.
fn shrink_for_group(m: &MmInner) -> usize {
    let Some(g) = &m.node.memcg else {
        return 0;
    };
    let mut total = 0;
    let mut priority = DEF_PRIORITY;
    while !m.handlers.shutdown.load(Ordering::Acquire) {
        let margin = g.margin();
        if margin >= m.node.wmark.high {
            break;
        }
        let want = (m.node.wmark.high - margin).usize();
        let drained = super::pool::drain_pooled(m, want);
        total += drained;
        if drained >= want {
            continue;
        }
        let share = reclaim_share(m, want - drained);
        if share == 0 || g.my_usage() < SWAP_CLUSTER_MAX as u64 {
            break;
        }
        let reclaimed = background_shrink(m, share, priority);
        m.vm.add(Item::MemcgReclaim, reclaimed as u64);
        // What it reclaimed sits in free frames as recycled pages, still charged: given back.
        total += super::pool::drain_pooled(m, reclaimed);
        if reclaimed == 0 {
            if priority == 0 {
                break;
            }
            priority -= 1;
        }
    }
    total
}

/// One background reclaim pass (kswapd's or the group reclaimer's) for at least `nr` pages at
/// `priority`, in its turn (`Node::reclaim`); returns the pages reclaimed. In trouble (priority
/// down by three) it writes pages even in laptop mode, as `balance_pgdat` does.
fn background_shrink(m: &MmInner, nr: usize, priority: u32) -> usize {
    let mut sc = ScanControl::new(nr.max(SWAP_CLUSTER_MAX), true);
    sc.priority = priority;
    sc.may_writepage = !m.cfg.settings.laptop_mode || priority < DEF_PRIORITY - 2;
    let _pass = m.node.reclaim.begin();
    shrink_node(m, &mut sc);
    sc.nr_reclaimed
}

fn balance_pgdat(m: &MmInner) {
    let mut priority = DEF_PRIORITY;
    let mut failures = 0;
    // Balanced again: the node is no longer flagged dirty (`clear_pgdat_congested`).
    struct Clear<'a>(&'a MmInner);
    impl Drop for Clear<'_> {
        fn drop(&mut self) {
            if self.0.node.nr_free() >= self.0.node.wmark.high {
                self.0.node.pgdat_dirty.store(false, Ordering::Release);
            }
        }
    }
    let _clear = Clear(m);
    while m.node.nr_free() < m.node.wmark.high && !m.handlers.shutdown.load(Ordering::Acquire) {
        // In a budget group, this process's share; the others' reclaimers give theirs.
        let want = reclaim_share(m, (m.node.wmark.high - m.node.nr_free()).usize());
        if want == 0 {
            return;
        }
        if background_shrink(m, want, priority) == 0 {
            if priority > 0 {
                priority -= 1;
            } else {
                failures += 1;
                if failures > 16 {
                    // Nothing reclaimable (no swap space, or every page busy): back off and let
                    // direct reclaim report the shortage.
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
                priority = DEF_PRIORITY;
            }
        } else {
            failures = 0;
        }
    }
}

/// Reclaims until at most `target` pages are resident or no progress is made.
pub fn reclaim_to(m: &MmInner, target: u64) -> u64 {
    let mut total = 0u64;
    let mut idle = 0;
    while m.node.resident_pages() > target && idle < 4 {
        let want = (m.node.resident_pages() - target).usize();
        let mut sc = ScanControl::new(want, true);
        sc.priority = 0;
        {
            let _pass = m.node.reclaim.begin();
            shrink_node(m, &mut sc);
        }
        // Pages unmapped on this pass count as referenced once; a second pass reclaims them.
        if sc.nr_reclaimed == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
        total += sc.nr_reclaimed as u64;
    }
    total
}

/// `inactive_list_is_low`: whether the policy wants the active list of this type aged
/// (`shrink_active_list`); the two-list LRU's ratio test lives in lru.rs.
pub fn inactive_list_is_low(node: &Node, file: bool) -> bool {
    node.lru.inactive_is_low(file)
}

/// The anon lists' `inactive_list_is_low`.
pub fn inactive_is_low(m: &MmInner) -> bool {
    inactive_list_is_low(&m.node, false)
}

/// `get_scan_count`: pages to scan on each list this pass, as the replacement policy divides
/// them (lru.rs: SCAN_FILE with enough inactive cache, else anon : file = swappiness :
/// 200 - swappiness; lru_gen.rs: per type, by the same ratio).
fn get_scan_count(m: &MmInner, sc: &ScanControl, batch: usize) -> [usize; 4] {
    m.node.lru.get_scan_count(&ScanInput {
        priority: sc.priority,
        batch,
        can_swap: m.swap.is_some() && sc.may_swap,
        swappiness: m.cfg.swappiness,
    })
}

/// `shrink_node` / `shrink_lruvec`: scans the four lists in proportion (`get_scan_count`),
/// aging the active lists while their inactive ones are low.
pub fn shrink_node(m: &MmInner, sc: &mut ScanControl) {
    let batch = if sc.kswapd {
        KSWAPD_BATCH
    } else {
        SWAP_CLUSTER_MAX
    };
    let mut nr = get_scan_count(m, sc, batch);
    let lists = [
        Lru::InactiveAnon,
        Lru::ActiveAnon,
        Lru::InactiveFile,
        Lru::ActiveFile,
    ];
    while nr.iter().any(|&n| n > 0) && sc.nr_reclaimed < sc.nr_to_reclaim {
        for (k, &l) in lists.iter().enumerate() {
            if nr[k] == 0 {
                continue;
            }
            let b = nr[k].min(batch);
            nr[k] -= b;
            if l.active() {
                if inactive_list_is_low(&m.node, l.file()) {
                    shrink_active_list(m, l, b, sc);
                }
            } else {
                sc.nr_reclaimed += shrink_inactive_list(m, l, b, sc);
            }
        }
        if m.handlers.shutdown.load(Ordering::Relaxed) {
            return;
        }
    }
    if m.swap.is_some() && sc.may_swap && inactive_is_low(m) {
        shrink_active_list(m, Lru::ActiveAnon, SWAP_CLUSTER_MAX, sc);
    }
    if inactive_list_is_low(&m.node, true) {
        shrink_active_list(m, Lru::ActiveFile, SWAP_CLUSTER_MAX, sc);
    }
    // shrink_slab: the huge zero page shrinker.
    super::huge_memory::shrink_huge_zero_page(&m.vm);
}

/// `shrink_active_list`: ages the tail of an active list. Pages are deactivated whether
/// referenced or not (no VM_EXEC exception here); checking references clears them (unmaps
/// the page).
pub fn shrink_active_list(m: &MmInner, lru: Lru, nr: usize, sc: &mut ScanControl) {
    let mut isolated = Vec::with_capacity(nr);
    let scanned =
        m.node
            .lru
            .isolate_lru_pages(&m.node.pages, lru, nr, nr * 4, false, &mut isolated, &m.vm);
    sc.nr_scanned += scanned;
    m.vm.add(Item::PgrefillActive, scanned as u64);
    let mapped: Vec<Pfn> = isolated
        .iter()
        .copied()
        .filter(|&f| m.node.pages[f].test(pg::MAPPED))
        .collect();
    rmap::try_to_unmap(m, &mapped);
    for &f in &isolated {
        m.node.pages[f].clear(pg::ACTIVE);
    }
    m.vm.add(Item::Pgdeactivate, isolated.len() as u64);
    m.node.lru.putback(&m.node.pages, &isolated, &m.vm);
}

/// `shrink_inactive_list`: isolates a batch from the inactive tail (only clean pages in laptop
/// mode with the old behaviour of seed 004) and reclaims what it can. When every isolated page
/// is dirty and not under writeback, the node is flagged dirty (kswapd may then write) and,
/// with the new behaviour, the flushers are woken.
pub fn shrink_inactive_list(m: &MmInner, lru: Lru, nr: usize, sc: &mut ScanControl) -> usize {
    let settings = &m.cfg.settings;
    let clean_only =
        !sc.may_writepage && settings.laptop_mode && !settings.is_new(Switch::LaptopModeIsolate);
    let mut isolated = Vec::with_capacity(nr);
    let scanned = m.node.lru.isolate_lru_pages(
        &m.node.pages,
        lru,
        nr,
        nr * 4,
        clean_only,
        &mut isolated,
        &m.vm,
    );
    sc.nr_scanned += scanned;
    m.vm.add(
        if sc.kswapd {
            Item::PgscanKswapd
        } else {
            Item::PgscanDirect
        },
        scanned as u64,
    );
    m.vm.add(
        if lru.file() {
            Item::PgscanFile
        } else {
            Item::PgscanAnon
        },
        scanned as u64,
    );
    if isolated.is_empty() {
        return 0;
    }
    let nr_taken = isolated.len();
    let (cache, anon): (Vec<Pfn>, Vec<Pfn>) = isolated
        .into_iter()
        .partition(|&f| m.node.pages[f].test(pg::PAGECACHE));
    let mut reclaimed = 0;
    let mut unqueued_dirty = 0;
    if !anon.is_empty() {
        reclaimed += shrink_page_list(m, anon, sc);
    }
    if !cache.is_empty() {
        let (n, dirty) = shrink_file_list(m, cache, sc);
        reclaimed += n;
        unqueued_dirty += dirty;
    }
    if lru.file() && unqueued_dirty == nr_taken {
        m.node.pgdat_dirty.store(true, Ordering::Release);
        if settings.is_new(Switch::ReclaimWakeFlushers) {
            super::page_writeback::wakeup_flusher_threads(
                m,
                super::page_writeback::WbReason::Vmscan,
                nr_taken as u64,
            );
        }
    }
    m.vm.add(
        if sc.kswapd {
            Item::PgstealKswapd
        } else {
            Item::PgstealDirect
        },
        reclaimed as u64,
    );
    m.vm.add(
        if lru.file() {
            Item::PgstealFile
        } else {
            Item::PgstealAnon
        },
        reclaimed as u64,
    );
    reclaimed
}

// The reference check and the anonymous reclaim critical sections live in mm/page_state.rs,
// where the model checker runs them too.
use super::page_state::{keep_referenced, ReclaimEnv};
pub use super::page_state::{page_check_references, PageRef};

/// Reclaim's environment for the page state machine (mm/page_state.rs): the views and the
/// pool, the swap device and cache, the region table and the free frames of manager `m`.
struct NodeReclaimEnv<'a> {
    m: &'a MmInner,
    sw: &'a SwapState,
}

impl ReclaimEnv for NodeReclaimEnv<'_> {
    fn try_to_unmap(&self, frames: &[Pfn]) {
        rmap::try_to_unmap(self.m, frames);
    }
    fn get_swap_pages(&self, n: usize, out: &mut Vec<SwapEntry>) {
        self.sw.get_swap_pages(n, out);
    }
    fn add_to_swap_cache(&self, entry: SwapEntry, f: Pfn) {
        self.sw.add_to_cache(entry, f, &self.m.vm);
    }
    fn pageout(&self, ready: &[Pfn]) -> Vec<Pfn> {
        pageout(self.m, self.sw, ready)
    }
    fn with_page_table<T>(
        &self,
        rid: RegionId,
        idx: PgOff,
        op: impl FnOnce(Option<&PageTable>) -> T,
    ) -> T {
        match self.m.mm.region(rid) {
            Some(r) if idx < r.end() => op(Some(&r.pt)),
            _ => op(None),
        }
    }
    fn evicted(&self, entry: SwapEntry) {
        workingset_eviction(self.m, self.sw.space(entry), entry.cache_index(), false);
        self.sw.delete_from_cache(entry, &self.m.vm);
    }
    fn swap_free(&self, entry: SwapEntry) {
        self.sw.swap_free(entry, &self.m.vm);
    }
    fn swap_shared(&self, entry: SwapEntry) -> bool {
        self.sw.swap_shared(entry)
    }
    fn free_frames(&self, frames: &[Pfn]) {
        pool::recycle_frames(self.m, frames);
    }
}

/// `shrink_page_list`: decides each isolated (locked) anonymous page's fate, unmaps, adds to
/// swap, writes dirty pages in batches of consecutive slots, and frees clean pages
/// (`__remove_mapping`); the critical sections are `page_state::shrink_page_list`, which the
/// model checker runs too. Returns pages freed.
pub fn shrink_page_list(m: &MmInner, isolated: Vec<Pfn>, sc: &mut ScanControl) -> usize {
    let Some(sw) = &m.swap else {
        m.node.lru.putback(&m.node.pages, &isolated, &m.vm);
        return 0;
    };
    let env = NodeReclaimEnv { m, sw };
    super::page_state::shrink_page_list(
        &m.node.pages,
        &*m.node.lru,
        &m.vm,
        &env,
        isolated,
        sc.may_unmap,
        sc.may_writepage,
    )
}

/// `pageout` (`swap_writepage`) of the dirty swap-cache pages among `ready`: one device write
/// per run of consecutive slots, under writeback state. A failed write leaves its pages
/// resident, dirty, PG_error and active, their slots freed; they are returned.
fn pageout(m: &MmInner, sw: &SwapState, ready: &[Pfn]) -> Vec<Pfn> {
    let mut dirty: Vec<(SwapEntry, Pfn)> = ready
        .iter()
        .filter(|&&f| m.node.pages[f].test(pg::DIRTY))
        .map(|&f| (m.node.pages[f].swap_entry(), f))
        .collect();
    dirty.sort_unstable();
    let mut failed = Vec::new();
    for run in pool::runs(&dirty, |a, b| b.0 == a.0.next()) {
        let run = &dirty[run];
        // Writeback state through the swap cache's mapping, which with the new behaviour of
        // seed 000 keeps no tags (no tree lock taken here).
        for &(slot, f) in run {
            m.node.pages[f].clear(pg::DIRTY);
            filemap::set_page_writeback(m, sw.space(slot), f, slot.cache_index());
        }
        let res = page_io::swap_writepage(m, sw, run[0].0, run.iter().map(|&(_, f)| f));
        for &(slot, f) in run {
            filemap::end_page_writeback(m, sw.space(slot), f, slot.cache_index());
        }
        if res.is_err() {
            for &(s, f) in run {
                let p = &m.node.pages[f];
                p.set(pg::ERROR | pg::DIRTY);
                p.clear(pg::SWAPCACHE);
                sw.swap_free(s, &m.vm);
                p.set(pg::ACTIVE);
                failed.push(f);
            }
        }
    }
    failed
}

/// `shrink_page_list` for page-cache pages (file pages and in-memory file pages), isolated and
/// locked. Clean file pages leave the cache without I/O; dirty file pages are written here only
/// by kswapd under Linux's conditions (the node is flagged dirty and, with seed 004's series,
/// the page was seen before: PG_reclaim), otherwise they are marked PG_reclaim and rotated
/// (activated with the new behaviour) for the flushers; in-memory file pages go to swap.
/// Returns (pages freed, dirty pages not under writeback).
pub fn shrink_file_list(m: &MmInner, isolated: Vec<Pfn>, sc: &mut ScanControl) -> (usize, usize) {
    let settings = &m.cfg.settings;
    let mut keep = Vec::new();
    let mut to_unmap = Vec::new();
    // The files of the batch's pages, each once; the lists below name them by index.
    let mut spaces: Vec<std::sync::Arc<super::fs::AddressSpace>> = Vec::new();
    let mut clean: Vec<(usize, Pfn)> = Vec::new();
    let mut write: Vec<(usize, Pfn)> = Vec::new();
    let mut shmem: Vec<(usize, Pfn)> = Vec::new();
    let mut unqueued_dirty = 0;
    // A batch is mostly runs of one file's pages: each file is looked up in the table once
    // (its read lock and a reference on the file are atomics every other thread touching the
    // file also writes); the search from the end finds the previous page's file first.
    for f in isolated {
        let p = &m.node.pages[f];
        let Owner::Cache(id, _) = p.owner() else {
            keep.push(f);
            continue;
        };
        let a = match spaces.iter().rposition(|a| a.id == id) {
            Some(k) => k,
            None => match m.files.get(id) {
                Some(a) => {
                    spaces.push(a);
                    spaces.len() - 1
                }
                None => {
                    keep.push(f);
                    continue;
                }
            },
        };
        if p.test(pg::WRITEBACK) {
            keep.push(f);
            continue;
        }
        let swapbacked = p.test(pg::SWAPBACKED);
        let r = page_check_references(p);
        if keep_referenced(
            &m.node.pages,
            &*m.node.lru,
            &m.vm,
            f,
            r,
            &mut to_unmap,
            &mut keep,
        ) {
            continue;
        }
        let reclaim_clean = r == PageRef::ReclaimClean;
        if p.test(pg::DIRTY) {
            unqueued_dirty += 1;
            if swapbacked {
                shmem.push((a, f));
                continue;
            }
            let pgdat_dirty = m.node.pgdat_dirty.load(Ordering::Acquire);
            let seen_twice = !settings.is_new(Switch::KswapdWriteTwice) || p.test(pg::RECLAIM);
            if !sc.kswapd || !seen_twice || !pgdat_dirty {
                // Leave it to the flushers; remember we met it (PG_reclaim).
                m.vm.inc(Item::NrVmscanImmediate);
                m.vm.inc(Item::PgrotatedDirty);
                p.set(pg::RECLAIM);
                if settings.is_new(Switch::ActivateRotatedDirty) {
                    p.set(pg::ACTIVE);
                    m.vm.inc(Item::Pgactivate);
                }
                keep.push(f);
                continue;
            }
            if reclaim_clean || !sc.may_writepage {
                keep.push(f);
                continue;
            }
            write.push((a, f));
            continue;
        }
        clean.push((a, f));
    }
    rmap::try_to_unmap(m, &to_unmap);

    // pageout of dirty file pages (kswapd), one run per mapping.
    let mut k = 0;
    while k < write.len() {
        let ai = write[k].0;
        let a = &spaces[ai];
        let mut e = k;
        let mut batch = Vec::new();
        while e < write.len() && write[e].0 == ai {
            let f = write[e].1;
            if filemap::clear_page_dirty_for_io(m, a, f) {
                batch.push((m.node.pages[f].index(), f));
            }
            e += 1;
        }
        batch.sort_unstable();
        for &(i, f) in &batch {
            filemap::set_page_writeback(m, a, f, i);
        }
        let res = filemap::write_pages_locked(m, a, &batch);
        if res.is_err() {
            // Dirty again before the writeback ends (as `writeback_locked`).
            for &(_, f) in &batch {
                filemap::set_page_dirty(m, a, f);
            }
        }
        for &(i, f) in &batch {
            filemap::end_page_writeback(m, a, f, i);
        }
        match res {
            Ok(()) => {
                m.vm.add(Item::NrVmscanWrite, batch.len() as u64);
                for &(_, f) in &batch {
                    m.node.pages[f].clear(pg::RECLAIM);
                    clean.push((ai, f));
                }
            }
            Err(err) => {
                log::error!("reclaim writeback of {}: {err}; pages stay dirty", a.name());
                a.wb_err.set(err.raw_os_error().unwrap_or(libc::EIO));
                for &(_, f) in &batch {
                    m.node.pages[f].set(pg::ACTIVE);
                    keep.push(f);
                }
                // Counted once the pages are dirty again (as `writeback_locked`).
                m.vm.inc(Item::FileWriteError);
            }
        }
        k = e;
    }

    // In-memory file pages: to swap (shmem_writepage).
    let mut freed = Vec::new();
    if let Some(sw) = &m.swap {
        let mut slots = Vec::with_capacity(shmem.len());
        sw.get_swap_pages(shmem.len(), &mut slots);
        for (k, &(ai, f)) in shmem.iter().enumerate() {
            let a = &spaces[ai];
            let Some(&slot) = slots.get(k) else {
                m.node.pages[f].set(pg::ACTIVE);
                keep.push(f);
                continue;
            };
            let idx = m.node.pages[f].index();
            let ok = page_io::swap_writepage(m, sw, slot, [f]).is_ok();
            if ok && super::shmem::shmem_replace_with_swap(m, a, f, idx, slot) {
                workingset_eviction(m, sw.space(slot), slot.cache_index(), false);
                freed.push(f);
            } else {
                sw.put_swap_page(slot);
                keep.push(f);
            }
        }
    } else {
        keep.extend(shmem.iter().map(|(_, f)| *f));
    }
    let nr_shmem_freed = freed.len();
    for &f in &freed {
        let p = &m.node.pages[f];
        p.reset_flags(pg::POOLED);
        p.set_page_count(0);
    }
    vmscan_recycle(m, &freed, true);

    // __remove_mapping for clean pages, one batch per file.
    let (mut n_anon, mut n_file) = (0usize, 0usize);
    for run in pool::runs(&clean, |x, y| x.0 == y.0) {
        let a = &spaces[clean[run.start].0];
        let batch: Vec<(Pfn, PgOff)> = clean[run]
            .iter()
            .map(|&(_, f)| (f, m.node.pages[f].index()))
            .collect();
        // Read before the frames are freed.
        let file: Vec<bool> = batch
            .iter()
            .map(|&(f, _)| !m.node.pages[f].test(pg::SWAPBACKED))
            .collect();
        let removed = filemap::remove_pages_for_reclaim(m, a, &batch);
        for (j, &(f, idx)) in batch.iter().enumerate() {
            if !removed[j] {
                keep.push(f);
                continue;
            }
            workingset_eviction(m, a, idx, file[j]);
            if file[j] {
                n_file += 1;
            } else {
                n_anon += 1;
            }
        }
        m.files.forget_if_unused(a);
    }
    m.vm.sub(Item::NrIsolatedAnon, n_anon as u64);
    m.vm.sub(Item::NrIsolatedFile, n_file as u64);
    let n_clean = n_anon + n_file;
    m.node.lru.putback(&m.node.pages, &keep, &m.vm);
    (n_clean + nr_shmem_freed, unqueued_dirty)
}

/// Frees frames of reclaimed pages whose isolated count is still held.
fn vmscan_recycle(m: &MmInner, frames: &[Pfn], anon_list: bool) {
    if frames.is_empty() {
        return;
    }
    m.vm.sub(
        if anon_list {
            Item::NrIsolatedAnon
        } else {
            Item::NrIsolatedFile
        },
        frames.len() as u64,
    );
    pool::recycle_frames(m, frames);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm::page::Page;
    use crate::mm::Watermarks;

    /// Seed 004: with laptop mode on and reclaim not allowed to write, the old behaviour
    /// isolates only clean pages (dirty ones are rotated on the list, never counted); the new
    /// one isolates them and counts them as nr_vmscan_immediate_reclaim.
    #[test]
    fn laptop_mode_isolation_of_dirty_pages() {
        use crate::{Behaviour, Mm, MmConfig, Settings, SwapConfig};
        for b in [Behaviour::New, Behaviour::Old] {
            let d = tempfile::tempdir_in("/var/tmp").unwrap();
            let mut cfg = MmConfig::new(8 << 20).swap(SwapConfig::None).settings(
                Settings::parse("laptop_mode=on")
                    .unwrap()
                    .with(Switch::LaptopModeIsolate, b)
                    // Keep the flushers asleep: this checks isolation alone.
                    .with(Switch::ReclaimWakeFlushers, Behaviour::Old),
            );
            cfg.dirty_background_ratio = 80;
            cfg.dirty_ratio = 90;
            cfg.dirty_expire_centisecs = 360000;
            let m = Mm::new(cfg).unwrap();
            let f = m.open(d.path().join("f")).unwrap();
            f.write_at(0, &[1u8; 1 << 20]).unwrap();
            let inner = m.inner();
            assert_eq!(inner.node.lru.size(Lru::InactiveFile), 256);
            let mut sc = ScanControl::new(32, false);
            sc.may_writepage = false;
            let before = inner.vm.get(Item::NrVmscanImmediate);
            shrink_inactive_list(inner, Lru::InactiveFile, 32, &mut sc);
            let counted = inner.vm.get(Item::NrVmscanImmediate) - before;
            assert!(sc.nr_scanned >= 32, "{b:?}");
            match b {
                Behaviour::New => assert_eq!(counted, 32),
                Behaviour::Old => {
                    assert_eq!(counted, 0);
                    assert_eq!(
                        inner.node.lru.size(Lru::InactiveFile),
                        256,
                        "rotated, not taken"
                    );
                }
            }
            assert_eq!(inner.vm.get(Item::NrDirty), 256, "nothing written");
        }
    }

    /// A manager with 256 dirty, unreferenced, unmapped file pages on the inactive file list and
    /// the given seed-004 settings; the flushers stay asleep unless reclaim wakes them.
    fn dirty_file_pages(settings: crate::Settings) -> (crate::Mm, tempfile::TempDir) {
        use crate::{Mm, MmConfig, SwapConfig};
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut cfg = MmConfig::new(8 << 20)
            .swap(SwapConfig::None)
            .settings(settings);
        cfg.dirty_background_ratio = 80;
        cfg.dirty_ratio = 90;
        cfg.dirty_expire_centisecs = 360000;
        let m = Mm::new(cfg).unwrap();
        let f = m.open(d.path().join("f")).unwrap();
        f.write_at(0, &[1u8; 1 << 20]).unwrap();
        std::mem::forget(f); // closed files stay cached; keep the pages where they are
        let inner = m.inner();
        assert_eq!(inner.node.lru.size(Lru::InactiveFile), 256);
        for (_, p) in inner.node.pages.iter() {
            if p.test(pg::PAGECACHE) {
                p.clear(pg::REFERENCED);
            }
        }
        (m, d)
    }

    fn counter_delta(m: &crate::Mm, i: Item, f: impl FnOnce()) -> u64 {
        let before = m.inner().vm.get(i);
        f();
        m.inner().vm.get(i) - before
    }

    /// Seed 004 series, `kswapd_write_twice`: kswapd on a dirty node writes a dirty file page on
    /// its first encounter (old) or only once it has been seen twice (new: the first encounter
    /// rotates it with PG_reclaim; the second writes it).
    #[test]
    fn kswapd_write_twice_switch() {
        use crate::{Behaviour, Settings};
        for b in [Behaviour::New, Behaviour::Old] {
            let (m, _d) = dirty_file_pages(
                Settings::default()
                    .with(Switch::KswapdWriteTwice, b)
                    // Rotated pages stay on the inactive list, to be met a second time.
                    .with(Switch::ActivateRotatedDirty, Behaviour::Old)
                    .with(Switch::ReclaimWakeFlushers, Behaviour::Old),
            );
            let inner = m.inner();
            inner.node.pgdat_dirty.store(true, Ordering::Release);
            let mut sc = ScanControl::new(32, true);
            sc.may_writepage = true;
            let written = counter_delta(&m, Item::NrVmscanWrite, || {
                shrink_inactive_list(inner, Lru::InactiveFile, 32, &mut sc);
            });
            match b {
                Behaviour::New => {
                    assert_eq!(written, 0, "first encounter: rotated, not written");
                    let again = counter_delta(&m, Item::NrVmscanWrite, || {
                        for _ in 0..16 {
                            let mut sc = ScanControl::new(32, true);
                            sc.may_writepage = true;
                            shrink_inactive_list(inner, Lru::InactiveFile, 32, &mut sc);
                        }
                    });
                    assert!(again > 0, "seen twice: written");
                }
                Behaviour::Old => assert_eq!(written, 32, "written on first encounter"),
            }
        }
    }

    /// Seed 004 series, `activate_rotated_dirty`: dirty file pages that reclaim rotates are
    /// activated (new) or stay inactive (old).
    #[test]
    fn activate_rotated_dirty_switch() {
        use crate::{Behaviour, Settings};
        for b in [Behaviour::New, Behaviour::Old] {
            let (m, _d) = dirty_file_pages(
                Settings::default()
                    .with(Switch::ActivateRotatedDirty, b)
                    .with(Switch::ReclaimWakeFlushers, Behaviour::Old),
            );
            let inner = m.inner();
            let mut sc = ScanControl::new(32, false);
            let activated = counter_delta(&m, Item::Pgactivate, || {
                shrink_inactive_list(inner, Lru::InactiveFile, 32, &mut sc);
            });
            assert_eq!(inner.vm.get(Item::PgrotatedDirty), 32, "{b:?}");
            match b {
                Behaviour::New => {
                    assert_eq!(activated, 32);
                    assert_eq!(inner.node.lru.size(Lru::ActiveFile), 32);
                }
                Behaviour::Old => {
                    assert_eq!(activated, 0);
                    assert_eq!(inner.node.lru.size(Lru::ActiveFile), 0);
                }
            }
        }
    }

    /// Seed 004 series, `reclaim_wake_flushers`: a reclaim batch that found only unqueued dirty
    /// file pages wakes the flushers (new) or leaves them asleep (old).
    #[test]
    fn reclaim_wake_flushers_switch() {
        use crate::{Behaviour, Settings};
        for b in [Behaviour::New, Behaviour::Old] {
            let (m, _d) =
                dirty_file_pages(Settings::default().with(Switch::ReclaimWakeFlushers, b));
            let inner = m.inner();
            let mut sc = ScanControl::new(32, false);
            let woke = counter_delta(&m, Item::FlusherWakeVmscan, || {
                shrink_inactive_list(inner, Lru::InactiveFile, 32, &mut sc);
            });
            assert!(inner.node.pgdat_dirty.load(Ordering::Acquire), "{b:?}");
            match b {
                Behaviour::New => assert!(woke >= 1, "the flushers were not woken"),
                Behaviour::Old => assert_eq!(woke, 0),
            }
        }
    }

    #[test]
    fn references_follow_linux() {
        // (flags, decision, PG_referenced afterwards)
        let anon = pg::SWAPBACKED;
        let file = pg::PAGECACHE;
        let shmem = pg::PAGECACHE | pg::SWAPBACKED;
        let cases = [
            (anon | pg::MAPPED | pg::REFERENCED, PageRef::Activate, true),
            (anon | pg::MAPPED, PageRef::Keep, true),
            (anon | pg::REFERENCED, PageRef::Reclaim, false),
            (anon, PageRef::Reclaim, false),
            (file | pg::MAPPED | pg::REFERENCED, PageRef::Activate, true),
            (file | pg::MAPPED, PageRef::Keep, true),
            (file | pg::REFERENCED, PageRef::ReclaimClean, false),
            (file, PageRef::Reclaim, false),
            // An in-memory file page is activated on its first pte reference.
            (shmem | pg::MAPPED, PageRef::Activate, true),
            (shmem | pg::REFERENCED, PageRef::Reclaim, false),
        ];
        for (flags, want, referenced) in cases {
            let p = Page::default();
            p.reset_flags(flags);
            assert_eq!(page_check_references(&p), want, "{}", pg::describe(flags));
            assert_eq!(
                p.test(pg::REFERENCED),
                referenced,
                "{}",
                pg::describe(flags)
            );
        }
    }

    #[test]
    fn watermarks_scale_like_linux() {
        // 256 MiB: min_free_kbytes = sqrt(262144*16) = 2048 KiB = 512 pages.
        let w = Watermarks::scaled(65536);
        assert_eq!(w.min, 512);
        assert_eq!(w.low, 640);
        assert_eq!(w.high, 768);
        let w = Watermarks::scaled(256);
        assert!(w.min >= 4 && w.min < w.low && w.low < w.high && w.high < 128);
    }
}
