//! Fault handling. Mirrors `mm/memory.c`: `handle_pte_fault` dispatching to `do_anonymous_page`
//! (zero page on read, fresh zeroed page on write, with fault-around batching for sequential
//! writers), `do_wp_page` (write to the zero page or to a clean swap-cache page), `do_swap_page`
//! (major fault with readahead) and the minor fault of a resident page that is not mapped.
//!
//! Lock order everywhere: page lock (PG_locked) before pte lock. The fault path only *tries* page
//! locks; a page locked by reclaim (mid-I/O) makes the fault "deferred": the handler retries it
//! later instead of blocking, so one stuck page never stalls other faults.

use crate::sync::Ordering;
use crate::sys::uffd::{pf, OpError};
use crate::sys::{Advice, PAGE_SIZE};
use crate::vmstat::Item;

use super::filemap;
use super::fs::AddressSpace;
use super::lru::mark_page_accessed;
use super::page::{pg, Owner, Pfn, PgOff, SwapEntry};
use super::page_alloc;
use super::page_state;
use super::pgtable::{Pte, PteGuard};
use super::pool;
use super::region::{AccessPattern, FileMap, RegionInner};
use super::rmap::unmap_file_page;
use super::swap_state;
use super::MmInner;
use crate::conv::Narrow;
use crate::sync::Arc;

pub use super::page_state::Fault;

/// A fault on an empty slot of the frame pool (registered, so the kernel reports it here):
/// nothing is meant to touch one (reads into slots check first that they hold pages), but a
/// wake alone would let the access fault again forever. The slot gets a zeroed page, so the
/// access (a read into the slot, which overwrites it) completes; counted as a lost slot and
/// logged. False: `addr` is not in the pool.
fn pool_fault(m: &MmInner, addr: usize) -> bool {
    let base = m.pool.slots.addr();
    if addr < base || addr >= base + m.pool.slots.len() {
        return false;
    }
    let page = (addr - base) & !(PAGE_SIZE - 1);
    m.vm.inc(Item::PoolSlotLost);
    m.vm.inc(Item::MmWarn);
    log::error!("an access faulted on empty pool slot {page:#x}: filled with zeros");
    if let Err(e) =
        m.mm.uffd
            .copy(base + page, m.pool.zero_src.addr(), PAGE_SIZE, false, false)
    {
        // EEXIST: filled meanwhile; wake the access either way.
        log::debug!("zero-filling pool slot {page:#x}: {e}");
        m.vm.warn_on(m.mm.uffd.wake(base + page, PAGE_SIZE), "UFFDIO_WAKE");
    }
    true
}

/// Largest zero-page fault-around run (pages).
const ZERO_AROUND: u64 = 16;

/// Handles one userfaultfd page fault at `addr` with uffd fault `flags`.
pub fn handle_fault(m: &MmInner, addr: usize, flags: u64) -> Fault {
    let r = {
        let t = m.mm.regions.read();
        match t.find(addr) {
            Some(r) => r.clone(),
            None if pool_fault(m, addr) => return Fault::Done,
            None => {
                // Not ours any more (region dropped while a thread touched it): wake it; it will
                // fault again on an unregistered range or see the kernel's own page.
                m.vm.warn_on(
                    m.mm.uffd.wake(addr & !(PAGE_SIZE - 1), PAGE_SIZE),
                    "UFFDIO_WAKE",
                );
                return Fault::Done;
            }
        }
    };
    let idx = PgOff::of_offset(addr - r.view.addr());
    let write = flags & (pf::WRITE | pf::WP) != 0;
    let wp = flags & pf::WP != 0;
    loop {
        if r.dead.load(Ordering::Acquire) {
            wake(m, &r, idx);
            return Fault::Done;
        }
        let res = match (r.pt.get(idx), &r.file) {
            (_, Some(fm)) if fm.shared => {
                let f = do_shared_fault(m, &r, fm, idx, write, wp);
                if write && f == Some(Fault::Done) && m.mm.faults_self_served() {
                    // fault_dirty_shared_page: the thread that dirtied the pages waits for
                    // writeback if it took the node past the dirty limits, as Linux's writer
                    // does; a handler thread serving many faults cannot.
                    super::page_writeback::balance_dirty_pages(m, &fm.mapping);
                }
                f
            }
            // A private file region: reads map the page-cache page itself, write-protected,
            // so later writes to the file show until the page is first written (as Linux's
            // do_read_fault); the first write copies it (do_cow_fault / do_wp_page).
            (Pte::None, Some(fm)) if write => do_cow_fault(m, &r, fm, idx),
            (Pte::None, Some(fm)) => do_file_map_fault(m, &r, fm, idx, false),
            (Pte::Frame(f), Some(fm)) if m.node.pages[f].test(pg::PAGECACHE) => {
                do_file_frame_fault(m, &r, fm, idx, f, wp)
            }
            (pte, _) => handle_pte_fault(m, &r, idx, pte, write, wp),
        };
        if let Some(f) = res {
            return f;
        }
        // The entry changed under us: look again.
    }
}

/// Whether `addr` is in one of `m`'s regions (`Some`), and if so whether its page is poisoned
/// (true: the access must raise SIGBUS, not be served; fault_path=sigbus, mm/fault.rs).
pub(crate) fn owns(m: &MmInner, addr: usize) -> Option<bool> {
    let t = m.mm.regions.read();
    let r = t.find(addr)?;
    Some(r.pt.get(PgOff::of_offset(addr - r.view.addr())) == Pte::Poison)
}

fn handle_pte_fault(
    m: &MmInner,
    r: &Arc<RegionInner>,
    idx: PgOff,
    pte: Pte,
    write: bool,
    wp: bool,
) -> Option<Fault> {
    match pte {
        Pte::None if wp && view_present(r, idx) => {
            // A write-protect fault on a mapped page the entry knows nothing of: a zero page
            // mapped behind the entry's back. Record it as the zero page it is and serve the
            // write as a write to the zero page. (Without a page there, a write-protect fault
            // that raced with a discard is an ordinary write fault.)
            let mut g = r.pt.lock(idx);
            if g.get() == Pte::None {
                note_stale(m, r, idx, Pte::None);
                g.set(Pte::Zero);
                m.vm.inc(Item::NrZeroPageMapped);
            }
            None
        }
        Pte::None if r.huge && huge_unit(r, idx).is_some() => {
            match do_huge_pmd_anonymous_page(m, r, idx, write) {
                Some(f) => Some(f),
                None if write => do_anonymous_page(m, r, idx),
                None => do_anonymous_zero_page(m, r, idx),
            }
        }
        Pte::None if !write => do_anonymous_zero_page(m, r, idx),
        Pte::None => do_anonymous_page(m, r, idx),
        Pte::Zero if wp => do_wp_page(m, r, idx),
        Pte::HugeZero if wp => do_huge_pmd_wp_page(m, r, idx),
        Pte::Frame(f) => frame_fault(m, r, idx, f, write, wp),
        Pte::Swap(s) => do_swap_page(m, r, idx, s, write),
        Pte::Zero | Pte::HugeZero => stale_zero_fault(m, r, idx, pte),
        Pte::Poison => repoison(m, r, idx),
    }
}

/// The state of the page at `addr` for a log line: its entry, its descriptor, and whether the
/// view and (for a frame) its pool slot hold a page.
pub(crate) fn describe_page(m: &MmInner, addr: usize) -> String {
    let r = {
        let t = m.mm.regions.read();
        match t.find(addr) {
            Some(r) => r.clone(),
            None => return format!("{addr:#x}: in no region"),
        }
    };
    let idx = PgOff::of_offset(addr - r.view.addr());
    let pte = r.pt.get(idx);
    let mut s = format!(
        "{addr:#x}: region {} page {idx}: entry {pte:?}, view page present: {}",
        r.id,
        view_present(&r, idx)
    );
    if let Pte::Frame(f) = pte {
        let p = &m.node.pages[f];
        s += &format!(
            ", descriptor {{ flags: {}, owner: {:?}, private: {} }}, pool slot present: {}",
            pg::describe(p.flags()),
            p.owner(),
            p.private_word(),
            pool::slot_present(m, f)
        );
    }
    s
}

/// The tripwire's answer to a thread that faults again and again at one address (issue 10):
/// logs the page's entry and descriptor, then serves the fault on the checked paths (every
/// "already resolved" branch verifies the view before it wakes and re-resolves otherwise).
pub fn resolve_from_scratch(m: &MmInner, addr: usize, flags: u64, times: u32) -> Fault {
    m.vm.inc(Item::FaultRefaultTripwire);
    log::error!(
        "tripwire: the same thread faulted {times} times in a row at {}; resolving from scratch",
        describe_page(m, addr)
    );
    handle_fault(m, addr, flags)
}

/// The answer to a fault whose handling panicked twice: the page is poisoned (SIGBUS to the
/// toucher) so the thread is never left waiting. Its entry becomes `Poison`; a frame it held
/// stays allocated (its state is unknown after the panic) and is reported.
pub(crate) fn poison_after_panic(m: &MmInner, addr: usize) {
    let r = {
        let t = m.mm.regions.read();
        t.find(addr).cloned()
    };
    let page = addr & !(PAGE_SIZE - 1);
    if let Some(r) = r {
        let idx = PgOff::of_offset(page - r.view.addr());
        if let Some(mut g) = r.pt.try_lock(idx) {
            if let Pte::Frame(f) = g.get() {
                log::error!("frame {f} of the poisoned page at {page:#x} is left allocated");
            }
            g.set(Pte::Poison);
        }
        m.vm.warn_on(
            r.view.advise(idx.offset(), PAGE_SIZE, Advice::DontNeed),
            "MADV_DONTNEED of view pages",
        );
    }
    if let Err(e) = m.mm.uffd.poison(page, PAGE_SIZE, false) {
        log::error!("UFFDIO_POISON at {page:#x} after a handler panic: {e}");
        m.vm.warn_on(m.mm.uffd.wake(page, PAGE_SIZE), "UFFDIO_WAKE");
    }
}

/// Whether page `idx` of `r`'s view has a page mapped (mincore; a zero-page pte counts). The
/// "already resolved" answers check this before they wake: a wake without a mapping makes the
/// thread fault again at once, forever (issue 10).
pub(crate) fn view_present(r: &RegionInner, idx: PgOff) -> bool {
    match r.view.resident(idx.offset(), PAGE_SIZE) {
        Ok(v) => v[0],
        Err(e) => {
            log::error!("mincore on {:#x}: {e}", r.page_addr(idx));
            false
        }
    }
}

/// Logs and counts an entry that claims its page is mapped while the view has none.
fn note_stale(m: &MmInner, r: &RegionInner, idx: PgOff, pte: Pte) {
    m.vm.inc(Item::FaultStaleUnmapped);
    log::warn!(
        "fault at {:#x}: entry {pte:?} says the page is mapped but the view has no page; \
         resolving it again",
        r.page_addr(idx)
    );
}

/// A fault on a zero-page entry that is not write-protect: another handler mapped it (wake), or
/// the view lost the zero page (zapped over a run that included it): the entry goes back to
/// None and the fault is served afresh.
fn stale_zero_fault(m: &MmInner, r: &RegionInner, idx: PgOff, pte: Pte) -> Option<Fault> {
    if pte == Pte::HugeZero {
        if view_present(r, idx) {
            wake(m, r, idx);
            return Some(Fault::Done);
        }
        // Split the unit into small zero pages, then handle this page as one of them.
        split_huge_zero(m, r, idx.round_down(HPAGE_PMD_NR));
        return None;
    }
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::Zero {
        return None;
    }
    if view_present(r, idx) {
        drop(g);
        wake(m, r, idx);
        return Some(Fault::Done);
    }
    note_stale(m, r, idx, Pte::Zero);
    g.set(Pte::None);
    m.vm.sub(Item::NrZeroPageMapped, 1);
    None
}

/// A fault on a poisoned entry: the poison marker should have raised SIGBUS without a fault, so
/// it is missing; poison the page again (which wakes the thread into its SIGBUS).
fn repoison(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    let g = r.pt.lock(idx);
    if g.get() != Pte::Poison {
        return None;
    }
    let addr = r.page_addr(idx);
    match m.mm.uffd.poison(addr, PAGE_SIZE, false) {
        Ok(_) => {}
        Err(e) if e.is_exists() => wake(m, r, idx),
        Err(e) => {
            log::error!("UFFDIO_POISON at {addr:#x}: {e}");
            wake(m, r, idx);
        }
    }
    drop(g);
    Some(Fault::Done)
}

fn wake(m: &MmInner, r: &RegionInner, idx: PgOff) {
    wake_pages(m, r, idx, 1);
}

/// UFFDIO_WAKE over `n` pages of `r` from page `idx`. It fails only on a usermm bug: logged with
/// the address and counted (`mm_warn`), as `warn_on` does.
fn wake_pages(m: &MmInner, r: &RegionInner, idx: PgOff, n: u64) {
    if m.mm.faults_self_served() {
        return;
    }
    let res = m.mm.uffd.wake(r.page_addr(idx), n.usize() * PAGE_SIZE);
    if let Err(e) = res {
        m.vm.inc(Item::MmWarn);
        log::error!("UFFDIO_WAKE at {:#x}: {e}", r.page_addr(idx));
    } else if inject::wake_warn() {
        m.vm.inc(Item::MmWarn);
        log::error!(
            "UFFDIO_WAKE at {:#x}: failure injected by a test",
            r.page_addr(idx)
        );
    }
}

/// Locks the entries after `idx` while they match `want`, up to `max` in all (including `idx`,
/// already held in `first`).
fn lock_run<'a>(
    r: &'a RegionInner,
    idx: PgOff,
    max: u64,
    want: impl Fn(Pte) -> bool,
) -> Vec<PteGuard<'a>> {
    lock_run_dir(r, idx, max, false, want)
}

/// [`lock_run`] upwards, or `down` from `idx` (the entries before it, nearest first).
fn lock_run_dir<'a>(
    r: &'a RegionInner,
    idx: PgOff,
    max: u64,
    down: bool,
    want: impl Fn(Pte) -> bool,
) -> Vec<PteGuard<'a>> {
    let mut v = Vec::new();
    for k in 1..max.min(r.pt.room(idx, down)) {
        match r.pt.try_lock(idx.step(k, down)) {
            Some(g) if want(g.get()) => v.push(g),
            _ => break,
        }
    }
    v
}

/// The swap entries of the readahead window of a major fault at page `idx` of `r` (`win`
/// pages with the fault, placed by `place`), locked, with their pages: those after the fault
/// first, nearest first, then those before it from the lowest up, so that consecutive slots
/// stay runs in the read. As in `swap_vma_readahead`, the window's other entries are skipped,
/// not an end: a resident page, a page never written or an entry another fault holds leaves a
/// gap the window reads past.
fn lock_swap_window<'a>(
    r: &'a RegionInner,
    idx: PgOff,
    win: u64,
    place: swap_state::RaPlace,
) -> (Vec<PgOff>, Vec<PteGuard<'a>>) {
    let below = match place {
        swap_state::RaPlace::Up => 0,
        swap_state::RaPlace::Down => win - 1,
        swap_state::RaPlace::Around => (win - 1) / 2,
    }
    .min(r.pt.room(idx, true) - 1);
    let above = (win - 1 - below).min(r.pt.room(idx, false) - 1);
    let mut at = Vec::new();
    let mut guards = Vec::new();
    let pages = (1..=above)
        .map(|k| idx + k)
        .chain((1..=below).rev().map(|k| idx - k));
    for i in pages {
        if let Some(g) = r.pt.try_lock(i) {
            if matches!(g.get(), Pte::Swap(_)) {
                at.push(i);
                guards.push(g);
            }
        }
    }
    (at, guards)
}

/// Read of a never-written page: the shared zero page, write-protected so that a later write
/// comes to us (do_anonymous_page's read branch). Costs no frame.
fn do_anonymous_zero_page(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::None {
        return None;
    }
    // Fault-around: neighbours that are also untouched get the zero page too, within an
    // aligned window of ZERO_AROUND pages.
    let win_end = idx.round_down(ZERO_AROUND) + ZERO_AROUND;
    let mut rest = lock_run(r, idx, win_end - idx, |p| p == Pte::None);
    let n = 1 + rest.len() as u64;
    let addr = r.page_addr(idx);
    let len = n.usize() * PAGE_SIZE;
    let done = match m.retry_again(len, |o| m.mm.uffd.zeropage(addr + o, len - o, true)) {
        Ok(d) => d,
        Err(e) if e.is_exists() => {
            m.vm.inc(Item::UffdEexist);
            e.done
        }
        Err(e) => {
            log::error!("UFFDIO_ZEROPAGE at {addr:#x}: {e}");
            e.done
        }
    };
    let mapped = (done / PAGE_SIZE) as u64;
    if mapped > 0 {
        if let Err(e) =
            m.mm.uffd
                .writeprotect(addr, mapped as usize * PAGE_SIZE, true, true)
        {
            log::error!("UFFDIO_WRITEPROTECT at {addr:#x}: {e}");
        }
    }
    if mapped >= 1 {
        g.set(Pte::Zero);
    }
    for (k, gr) in rest.iter_mut().enumerate() {
        if (k as u64 + 1) < mapped {
            gr.set(Pte::Zero);
        }
    }
    m.vm.add(Item::NrZeroPageMapped, mapped);
    drop(rest);
    drop(g);
    m.vm.inc(Item::Pgfault);
    m.vm.inc(Item::ZeroPageFault);
    wake(m, r, idx);
    Some(Fault::Done)
}

/// The write fault-around window for a write fault at `idx`: doubled (up to
/// `fault_around_max`) when the fault continues one of the region's sequential write runs,
/// else 1 ([`WriteStreams`](super::region::WriteStreams)).
fn write_window(m: &MmInner, r: &RegionInner, idx: PgOff) -> u32 {
    r.writes.window(idx, m.cfg.fault_around_max)
}

/// Write of a never-written page: fresh zeroed frames. A sequential run of write faults grows a
/// window (up to `fault_around_max`) of pages mapped by one UFFDIO_COPY from the zero source.
fn do_anonymous_page(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    do_anonymous_page_win(m, r, idx, None)
}

/// [`do_anonymous_page`] with a forced window (a huge unit: 512 pages).
fn do_anonymous_page_win(
    m: &MmInner,
    r: &RegionInner,
    idx: PgOff,
    force: Option<usize>,
) -> Option<Fault> {
    let (win, down) = match force {
        Some(w) => (w, false),
        None => {
            let (w, down) = r.writes.window_dir(idx, m.cfg.fault_around_max, true);
            (w as usize, down)
        }
    };
    let want = win;
    let mut frames = Vec::with_capacity(win);
    if !page_alloc::alloc_pages(m, win, &mut frames) {
        return oom(m, r, idx);
    }
    let g = r.pt.lock(idx);
    if g.get() != Pte::None {
        drop(g);
        pool::free_frames(m, &frames, false);
        return None;
    }
    // The window: pages idx.. upwards, or ..=idx downwards for a writer walking down; the
    // entries locked in page order (`lo` first).
    let mut run = lock_run_dir(r, idx, frames.len() as u64, down, |p| p == Pte::None);
    let n = 1 + run.len();
    let lo = if down { idx - run.len() as u64 } else { idx };
    if down {
        run.reverse();
        run.push(g);
    } else {
        run.insert(0, g);
    }
    let addr = r.page_addr(lo);
    // Runs of at least MOVE_MIN_RUN consecutive recycled frames are zeroed in place and moved
    // (one TLB shootdown per run); the other pages are copied from the zero source and their
    // recycled slots dropped in batches. One ioctl per run.
    let mut pooled = pool::pooled_batch(m, &frames[..n]);
    let ks: Vec<usize> = (0..n).collect();
    let short: Vec<_> = pool::runs(&ks, |a, b| {
        pooled[a] && pooled[b] && frames[b] == frames[a].next()
    })
    .filter(|run| pooled[run.start] && run.len() < pool::MOVE_MIN_RUN)
    .collect();
    for k in short.into_iter().flatten() {
        pooled[k] = false;
        pool::empty_slot(m, frames[k]);
    }
    for (k, &f) in frames[..n].iter().enumerate() {
        if pooled[k] {
            m.vm.warn_on(
                m.pool.slots.fill(f.offset(), PAGE_SIZE, 0),
                "zero-filling a pool slot",
            );
        }
    }
    let mut done = 0;
    let mut k = 0;
    while k < n {
        let mut e = k + 1;
        let res = if pooled[k] {
            while e < n && pooled[e] && frames[e] == frames[e - 1].next() {
                e += 1;
            }
            let src = m.pool.slots.addr() + frames[k].offset();
            let len = (e - k) * PAGE_SIZE;
            let dst = addr + k * PAGE_SIZE;
            m.retry_again(len, |o| {
                m.mm.uffd.move_pages(dst + o, src + o, len - o, false, true)
            })
        } else {
            while e < n && !pooled[e] {
                e += 1;
            }
            let len = (e - k) * PAGE_SIZE;
            let dst = addr + k * PAGE_SIZE;
            m.retry_again(len, |o| {
                m.mm.uffd
                    .copy(dst + o, m.pool.zero_src.addr() + o, len - o, false, true)
            })
        };
        match res {
            Ok(_) => done = e,
            Err(err) => {
                if err.is_exists() {
                    m.vm.inc(Item::UffdEexist);
                } else {
                    log::error!(
                        "mapping {} fresh pages at {:#x}: {err}",
                        e - k,
                        addr + k * PAGE_SIZE
                    );
                }
                done = k + err.done / PAGE_SIZE;
                break;
            }
        }
        k = e;
    }
    // Before the thread is woken: its next fault may reach another handler at once. A
    // stream walking down goes on below its window (which a short map leaves where it was).
    let next = if !down {
        idx + done.max(1) as u64
    } else if done == n && lo.raw() > 0 {
        lo - 1
    } else {
        idx
    };
    r.writes.advance(idx, next);
    let flags = pg::ANON_MAPPED;
    for k in 0..done {
        let f = frames[k];
        m.node.pages[f].init(Owner::Anon(r.id, lo + k as u64), flags);
        run[k].set(Pte::Frame(f));
    }
    m.node.lru.add(&m.node.pages, &frames[..done], &m.vm);
    drop(run);
    pool::free_frames(m, &frames[done..], false);
    m.vm.inc(Item::Pgfault);
    m.vm.add(Item::Pgalloc, done as u64);
    m.vm.add(Item::NrAnonPages, done as u64);
    m.vm.add(Item::NrMapped, done as u64);
    m.vm.add(Item::FaultAround, done.saturating_sub(1) as u64);
    if force.is_some() {
        m.vm.inc(if done == want {
            Item::ThpFaultAlloc
        } else {
            Item::ThpFaultFallback
        });
    }
    m.node.note_resident();
    // Wake only now: the thread may discard or drop the region at once, and must find the
    // entries, the frames and the counters complete.
    wake(m, r, idx);
    Some(Fault::Done)
}

/// Write to the write-protected zero page: charge a frame and let the kernel copy-on-write it
/// when the thread retries (do_wp_page on the zero pfn).
fn do_wp_page(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    let mut frames = Vec::with_capacity(1);
    if !page_alloc::alloc_pages(m, 1, &mut frames) {
        return oom(m, r, idx);
    }
    let f = frames[0];
    pool::empty_slot(m, f);
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::Zero {
        drop(g);
        pool::free_frames(m, &frames, false);
        return None;
    }
    m.node.pages[f].init(Owner::Anon(r.id, idx), pg::ANON_MAPPED);
    g.set(Pte::Frame(f));
    m.node.lru.add(&m.node.pages, &frames, &m.vm);
    // Clearing write protection wakes the thread; its retry copies the zero page into a fresh
    // page of its own.
    if let Err(e) =
        m.mm.uffd
            .writeprotect(r.page_addr(idx), PAGE_SIZE, false, true)
    {
        log::error!("UFFDIO_WRITEPROTECT clear at {:#x}: {e}", r.page_addr(idx));
    }
    drop(g);
    m.vm.sub(Item::NrZeroPageMapped, 1);
    m.vm.inc(Item::Pgfault);
    m.vm.inc(Item::WpFault);
    m.vm.inc(Item::Pgalloc);
    m.vm.inc(Item::NrAnonPages);
    m.vm.inc(Item::NrMapped);
    m.node.note_resident();
    wake(m, r, idx);
    Some(Fault::Done)
}

/// Maps a run of clean page-cache pages (consecutive frames, locked, their view ptes locked
/// and empty) into shared file region `r` at `dst` with one UFFDIO_MOVE, then write-protects
/// them with one UFFDIO_WRITEPROTECT, so that their first store is seen (`clean_map=move`).
/// Returns the pages mapped (a prefix of the run; None: not one, the caller stops).
///
/// Between the two calls the pages are mapped writable: another thread of the program may
/// store into one unseen (the faulting thread is not woken yet). Each page's contents before
/// the move are known by their hash (recorded by the read that brought the page in,
/// `filemap::record_read_hashes`, else taken of its slot now) and hashed again in the view
/// once protected (no store can land then): a page whose hash changed was written, and is
/// marked dirty and left writable. A protection that fails
/// leaves every page of the run dirty and writable: nothing written is ever taken for clean.
fn map_clean_run(
    m: &MmInner,
    r: &RegionInner,
    a: &Arc<AddressSpace>,
    run: &[(PgOff, Pfn)],
    dst: usize,
) -> Option<usize> {
    let f0 = run[0].1;
    let have = pool::held_prefix(m, f0, run.len());
    if have == 0 {
        return None;
    }
    // The hashes the pages' read recorded (`| 1`); a page without one has its slot hashed now.
    let mut before: Vec<u64> = run[..have]
        .iter()
        .map(|&(_, f)| pool::take_read_hash(m, f))
        .collect();
    let recorded = before.iter().filter(|&&h| h != 0).count();
    for (k, h) in before.iter_mut().enumerate().filter(|(_, h)| **h == 0) {
        match m.pool.slots.hash_page(f0.offset() + k * PAGE_SIZE) {
            Ok(x) => *h = x | 1,
            Err(e) => {
                log::error!("hashing the pool slot of frame {}: {e}", run[k].1);
                return None;
            }
        }
    }
    m.vm.add(Item::FileMapReadHashed, recorded as u64);
    let len = have * PAGE_SIZE;
    let src = m.pool.slots.addr() + f0.offset();
    let done = match m.retry_again(len, |d| {
        m.mm.uffd.move_pages(dst + d, src + d, len - d, false, true)
    }) {
        Ok(b) => b,
        Err(e) => {
            log::debug!("moving {have} clean pages of {} to {dst:#x}: {e}", a.name());
            e.done
        }
    } / PAGE_SIZE;
    if done == 0 {
        return None;
    }
    m.vm.add(Item::FileMapMoved, done as u64);
    let view_off = dst - r.view.addr();
    let protected = m.mm.uffd.writeprotect(dst, done * PAGE_SIZE, true, true);
    let after = match &protected {
        Ok(()) => r.view.hash_pages(view_off, done).ok(),
        Err(e) => {
            m.vm.inc(Item::MmWarn);
            log::error!("UFFDIO_WRITEPROTECT of {done} moved clean pages at {dst:#x}: {e}");
            None
        }
    };
    for (k, &(_, f)) in run[..done].iter().enumerate() {
        let p = &m.node.pages[f];
        let unchanged = after.as_ref().is_some_and(|h| h[k] | 1 == before[k]);
        if unchanged {
            p.set(pg::WP);
            continue;
        }
        if after.is_some() {
            // Stored into between the move and the protection: dirty, and writable again.
            m.vm.inc(Item::FileMapStoredUnseen);
            let addr = dst + k * PAGE_SIZE;
            if let Err(e) = m.mm.uffd.writeprotect(addr, PAGE_SIZE, false, true) {
                // Still protected: its next store faults and finds the page dirty already.
                log::debug!("unprotecting a page stored into at {addr:#x}: {e}");
                p.set(pg::WP);
            }
        }
        filemap::set_page_dirty(m, a, f);
    }
    Some(done)
}

/// Places the page parked in frame `f`'s pool slot at view address `dst` with one UFFDIO_COPY
/// (write-protected if `wp`: a clean page, so its first store is seen) and queues the slot's copy
/// to be dropped with the next batch (`pool::defer_zap`). A single-page UFFDIO_MOVE or a
/// madvise of the slot costs a TLB shootdown each: 11-15 us while another thread of the process
/// runs on the other vCPU, against 2-3 us for the copy and 1.2-1.7 us per page for the batched
/// drop (bench/ipi.md). With the other vCPU idle the MOVE is cheaper (1.0 us): `move_writable`
/// keeps it for a writable page where that is the common case (a shared file mapping's dirty
/// pages, mapped many per fault by one thread: the COPY cut single-threaded `bench mmap-file`
/// writes from 509-553 to 383-422 MiB/s).
///
/// An empty slot is reported as ENOENT (as a MOVE from it would be) without trying the copy: the
/// kernel's read of the empty, registered slot would fault into the handlers themselves.
fn place_from_slot(
    m: &MmInner,
    f: Pfn,
    dst: usize,
    wp: bool,
    move_writable: bool,
) -> Result<usize, OpError> {
    let src = m.pool.slots.addr() + f.offset();
    if move_writable && !wp {
        return m.retry_again(PAGE_SIZE, |_| {
            m.mm.uffd.move_pages(dst, src, PAGE_SIZE, false, true)
        });
    }
    if !pool::slot_present(m, f) {
        return Err(OpError {
            errno: libc::ENOENT,
            done: 0,
        });
    }
    copy_from_slot(m, f, dst, wp)
}

/// UFFDIO_COPY of frame `f`'s slot, known to hold its page, to `dst` (write-protected if `wp`);
/// the slot's copy is queued to be dropped with the next batch.
fn copy_from_slot(m: &MmInner, f: Pfn, dst: usize, wp: bool) -> Result<usize, OpError> {
    let src = m.pool.slots.addr() + f.offset();
    m.retry_again(PAGE_SIZE, |_| m.mm.uffd.copy(dst, src, PAGE_SIZE, wp, true))
        .inspect(|_| pool::defer_zap(m, f))
}

/// The fault path's environment for the page state machine (mm/page_state.rs): region `r`'s
/// view, the frame pool and the swap cache of manager `m`.
struct RegionFaultEnv<'a> {
    m: &'a MmInner,
    r: &'a Arc<RegionInner>,
}

impl page_state::FaultEnv for RegionFaultEnv<'_> {
    fn view_present(&self, idx: PgOff) -> bool {
        view_present(self.r, idx)
    }
    fn note_stale(&self, idx: PgOff, pte: Pte) {
        note_stale(self.m, self.r, idx, pte);
    }
    fn ensure_parked(&self, f: Pfn) -> bool {
        if pool::slot_present(self.m, f) {
            // Back in its slot from a view where it may have been written.
            super::rmap::verify_clean(self.m, self.r, f);
            return true;
        }
        super::rmap::refill_lost_slot(self.m, f)
    }
    fn try_to_free_swap(&self, f: Pfn) {
        swap_state::try_to_free_swap(self.m, f);
    }
    fn unprotect(&self, idx: PgOff, n: u64) {
        let addr = self.r.page_addr(idx);
        let len = n.usize() * PAGE_SIZE;
        if let Err(e) = self.m.mm.uffd.writeprotect(addr, len, false, true) {
            self.m.vm.inc(Item::MmWarn);
            log::error!("UFFDIO_WRITEPROTECT clear of {n} pages at {addr:#x}: {e}");
        }
    }
    fn write_window(&self, idx: PgOff) -> u64 {
        write_window(self.m, self.r, idx) as u64
    }
    fn ref_around(&self) -> u64 {
        if self
            .m
            .cfg
            .settings
            .is_new(crate::settings::Switch::RefAround)
        {
            page_state::REF_AROUND
        } else {
            1
        }
    }
    fn write_expected(&self, idx: PgOff) -> bool {
        self.r.writes.expects(idx)
    }
    fn writes_advance(&self, idx: PgOff, next: PgOff) {
        self.r.writes.advance(idx, next);
    }
    fn place(&self, idx: PgOff, f: Pfn, wp: bool) -> bool {
        place_parked(self.m, self.r, idx, f, wp)
    }
    fn place_run(&self, items: &[(PgOff, Pfn)], clean: &[bool]) -> usize {
        place_parked_run(self.m, self.r, items, clean)
    }
    fn ra_hit(&self) {
        self.r.ra_hits.fetch_add(1, Ordering::Relaxed);
    }
    fn ra_marker(&self, idx: PgOff) {
        swap_ra_marker(self.m, self.r, idx);
    }
    fn wake(&self, idx: PgOff, n: u64) {
        wake_pages(self.m, self.r, idx, n);
    }
}

/// Whether a swap-in keeps nothing of the device's copy (switch `swapin_cache=skip`, on a device
/// whose pages are uncompressed in this process's memory): the slot is freed once the page is
/// copied out and the page is dirty, as Linux's `do_swap_page` skips the swap cache on a
/// `SWP_SYNCHRONOUS_IO` device. Readahead pages stay parked clean in the swap cache until used
/// (an unused one is dropped without a write); their slots go when they are mapped.
fn skips_swap_cache(m: &MmInner) -> bool {
    m.cfg.settings.is_new(crate::settings::Switch::SwapinCache)
        && m.swap
            .as_ref()
            .is_some_and(|sw| sw.dev.pages_in_memory().is_some())
}

/// Whether clean swap-cache pages are mapped writable with their hash recorded
/// (`anon_clean=hash`) rather than write-protected.
fn hashes_clean(m: &MmInner) -> bool {
    m.cfg.settings.is_new(crate::settings::Switch::AnonClean)
}

/// anon_clean=hash in a region whose clean swap-cache pages nearly all come back written
/// ([`DirtyVerdicts`](super::region::DirtyVerdicts)): the clean page at `idx` is to be mapped
/// writable and dirty, its swap copy dropped, as the write it is expecting would leave it
/// (counted: `clean_hash_predicted`).
fn write_predicted(m: &MmInner, r: &RegionInner, idx: PgOff) -> bool {
    let predicted = hashes_clean(m) && r.verdicts.skip_hash(idx);
    if predicted {
        m.vm.inc(Item::CleanHashPredicted);
    }
    predicted
}

/// Records the hash of locked, parked frame `f`'s slot for `rmap::verify_clean`; false if the
/// slot is empty or could not be read (the page is then mapped write-protected as before).
fn record_slot_hash(m: &MmInner, f: Pfn, present: Option<bool>) -> bool {
    if !present.unwrap_or_else(|| pool::slot_present(m, f)) {
        return false;
    }
    match m.pool.slots.hash_page(f.offset()) {
        Ok(h) => {
            pool::set_clean_hash(m, f, h);
            true
        }
        Err(e) => {
            log::debug!("hashing pool slot {f}: {e}; mapping it write-protected");
            false
        }
    }
}

/// Places locked frame `f`, parked in its pool slot, at page `idx` with UFFDIO_COPY
/// (`place_from_slot`). A clean page whose swap copy stays valid (`wp`) is mapped writable with
/// its hash recorded under `anon_clean=hash` ([`rmap::verify_clean`](super::rmap::verify_clean) compares at unmap), else
/// write-protected: MOVE always installs a writable pte, and write-protecting after a move would
/// leave a window in which another thread's store lands unseen and the page is later dropped
/// as clean. A
/// stray page in the view is replaced; an empty slot (the page was zapped behind our back)
/// maps zeros. False if the page could not be mapped (it stays parked).
fn place_parked(m: &MmInner, r: &RegionInner, idx: PgOff, f: Pfn, wp: bool) -> bool {
    let (wp, hashed) = clean_mapping(m, r, idx, f, wp, None);
    place_decided(m, r, idx, f, wp, hashed)
}

/// How a parked page is mapped (`wp`: it is clean and its swap copy stays valid): writable and
/// dirty, its swap copy dropped, under `swapin_cache=skip` ([`skips_swap_cache`]) or, under
/// `anon_clean=hash`, in a region whose such pages come back written; else writable with its
/// contents' hash recorded under `anon_clean=hash`; otherwise write-protected. Returns
/// (write-protect it, hash recorded). `present`: the slot is already known to hold the page
/// (one mincore for a run), or None to ask.
fn clean_mapping(
    m: &MmInner,
    r: &RegionInner,
    idx: PgOff,
    f: Pfn,
    wp: bool,
    present: Option<bool>,
) -> (bool, bool) {
    let predicted = wp && (skips_swap_cache(m) || write_predicted(m, r, idx));
    if predicted {
        swap_state::try_to_free_swap(m, f);
    }
    let hashed = wp && !predicted && hashes_clean(m) && record_slot_hash(m, f, present);
    (wp && !predicted && !hashed, hashed)
}

/// Maps parked frame `f` at `idx` as [`clean_mapping`] decided (`hashed`: the slot is known to
/// hold the page, the copy does not ask mincore again). A stray page in the view is replaced;
/// an empty slot (the page was zapped behind our back) maps zeros. False if the page could not
/// be mapped (it stays parked).
fn place_decided(m: &MmInner, r: &RegionInner, idx: PgOff, f: Pfn, wp: bool, hashed: bool) -> bool {
    let dst = r.page_addr(idx);
    let place = || {
        if hashed {
            copy_from_slot(m, f, dst, false)
        } else {
            place_from_slot(m, f, dst, wp, false)
        }
    };
    let mut res = place();
    if matches!(res, Err(e) if e.is_exists()) {
        // The view holds a page although the entry says this one is parked: a stray left by a
        // path that lost track of it. The parked page is the page's data: drop the stray.
        m.vm.inc(Item::UffdEexist);
        m.vm.inc(Item::FaultStaleUnmapped);
        log::warn!(
            "frame {f}: a stray page is mapped at {dst:#x} where the parked page belongs; replaced"
        );
        m.vm.warn_on(
            r.view.advise(idx.offset(), PAGE_SIZE, Advice::DontNeed),
            "MADV_DONTNEED of view pages",
        );
        res = place();
    }
    match res {
        Ok(_) => true,
        Err(e) if e.errno == libc::ENOENT => {
            // The pool slot is empty (the page was zapped behind our back): its contents are
            // zeros.
            if let Err(e) = m.retry_again(PAGE_SIZE, |_| {
                m.mm.uffd
                    .copy(dst, m.pool.zero_src.addr(), PAGE_SIZE, false, true)
            }) {
                log::error!("UFFDIO_COPY of zeros to {dst:#x}: {e}");
                return false;
            }
            swap_state::try_to_free_swap(m, f);
            true
        }
        Err(e) => {
            if e.is_exists() {
                m.vm.inc(Item::UffdEexist);
            }
            log::error!("mapping frame {f} at {dst:#x}: {e}");
            false
        }
    }
}

/// [`place_parked`] for the readahead pages a fault maps around itself (`items`: consecutive
/// pages of the view, each locked with its entry, and whether each is clean): one mincore per
/// run of consecutive frames, and one UFFDIO_COPY per run of consecutive frames mapped the same
/// way, instead of a mincore and a copy per page (16-page runs cost 1.4 us a page against 2.0,
/// bench/processes.md). Pages whose slot is not known to hold them, and the rest of a run whose
/// copy failed part way, go page by page. Returns how many pages from the first were mapped.
fn place_parked_run(m: &MmInner, r: &RegionInner, items: &[(PgOff, Pfn)], clean: &[bool]) -> usize {
    let frames: Vec<Pfn> = items.iter().map(|&(_, f)| f).collect();
    for &f in &frames {
        pool::settle(m, f);
    }
    let present = pool::slots_present(m, &frames);
    // Decided for the pages whose slots hold them, up to the first that does not.
    let nd = present.iter().take_while(|&&p| p).count();
    let modes: Vec<(bool, bool)> = items[..nd]
        .iter()
        .zip(clean)
        .map(|(&(idx, f), &c)| clean_mapping(m, r, idx, f, c, Some(true)))
        .collect();
    let mut placed = 0;
    let adjacent = |a: usize, b: usize| {
        items[b].0 == items[a].0.next() && frames[b] == frames[a].next() && modes[a].0 == modes[b].0
    };
    let ks: Vec<usize> = (0..nd).collect();
    for run in pool::runs(&ks, adjacent) {
        let (k0, n) = (run.start, run.len());
        let len = n * PAGE_SIZE;
        let src = m.pool.slots.addr() + frames[k0].offset();
        let dst = r.page_addr(items[k0].0);
        let wp = modes[k0].0;
        let copied = match m.retry_again(len, |off| {
            m.mm.uffd.copy(dst + off, src + off, len - off, wp, true)
        }) {
            Ok(_) => n,
            Err(e) => e.done / PAGE_SIZE,
        };
        for &f in &frames[k0..k0 + copied] {
            pool::defer_zap(m, f);
        }
        placed += copied;
        if copied < n {
            // The rest of this run page by page (a stray page in the view, a lost slot).
            for k in k0 + copied..k0 + n {
                let (idx, f) = items[k];
                if !place_decided(m, r, idx, f, modes[k].0, modes[k].1) {
                    return placed;
                }
                placed += 1;
            }
        }
    }
    for k in nd..items.len() {
        let (idx, f) = items[k];
        if !place_parked(m, r, idx, f, clean[k]) {
            break;
        }
        placed += 1;
    }
    placed
}

/// A resident page: mapped already (stale fault, or a write to a write-protected clean page), or
/// parked in the pool (minor fault: the analogue of the hardware setting the accessed bit). The
/// locked critical section is `page_state::frame_fault`, which the model checker runs too.
fn frame_fault(
    m: &MmInner,
    r: &Arc<RegionInner>,
    idx: PgOff,
    f: Pfn,
    write: bool,
    wp: bool,
) -> Option<Fault> {
    let env = RegionFaultEnv { m, r };
    page_state::frame_fault(&m.node.pages, &r.pt, &m.vm, &env, idx, f, write, wp)
}

/// The swap-in's environment for the page state machine (mm/page_state.rs): the swap cache and
/// where the faulting page is (page 0 of `src`: the bounce buffer it was read into, or the
/// device's own memory), placed in region `r`'s view.
struct SwapinFromSrc<'a> {
    m: &'a MmInner,
    r: &'a RegionInner,
    sw: &'a super::swap_state::SwapState,
    src: &'a super::swap_state::SwapinSrc<'a>,
    /// A slot whose page is the device's own, freed only once the page is copied out: a freed
    /// slot may be allocated and written again by another thread at once.
    free_after_place: std::cell::Cell<Option<SwapEntry>>,
}

impl Drop for SwapinFromSrc<'_> {
    /// A slot whose free waited for a copy that never came (no path skips `place_read` after
    /// `swap_free` today) is freed all the same, never leaked.
    fn drop(&mut self) {
        if let Some(slot) = self.free_after_place.take() {
            self.sw.swap_free(slot, &self.m.vm);
        }
    }
}

impl page_state::SwapinEnv for SwapinFromSrc<'_> {
    fn add_to_swap_cache(&self, entry: SwapEntry, f: Pfn) {
        self.sw.add_to_cache(entry, f, &self.m.vm);
    }
    fn swap_free(&self, entry: SwapEntry) {
        if self.src.in_device {
            self.free_after_place.set(Some(entry));
        } else {
            self.sw.swap_free(entry, &self.m.vm);
        }
    }
    fn place_read(&self, idx: PgOff, f: Pfn, wp: bool) {
        let (m, r) = (self.m, self.r);
        let dst = r.page_addr(idx);
        // Copied from where it was read (write-protected while the swap copy stays valid, or
        // writable with its hash recorded under anon_clean=hash); a recycled frame's slot is
        // dropped with the next batch (see place_from_slot for why not fill + MOVE).
        pool::empty_slot(m, f);
        let wp = wp
            && !(hashes_clean(m)
                && self.src.hash_page(0).is_ok_and(|h| {
                    pool::set_clean_hash(m, f, h);
                    true
                }));
        let place = || {
            m.retry_again(PAGE_SIZE, |_| {
                m.mm.uffd.copy(dst, self.src.addr(0), PAGE_SIZE, wp, true)
            })
        };
        let mut placed = place();
        if matches!(placed, Err(e) if e.is_exists()) {
            // A stray page sits where the swapped-out page belongs (seen once with the partial
            // results mishandled): the swap copy is the page's data; replace the stray.
            drop_stray_page(m, r, idx);
            placed = place();
        }
        if let Err(e) = placed {
            log::error!("placing a swapped-in page at {dst:#x}: {e}");
        }
        if let Some(slot) = self.free_after_place.take() {
            self.sw.swap_free(slot, &m.vm);
        }
    }
}

/// Drops a stray page mapped in the view at page `idx`, whose entry says the page is on swap:
/// the swap copy is the page's data, and the stray would hide it from the page's faults.
/// Counted (`fault_stale_unmapped`) and logged.
fn drop_stray_page(m: &MmInner, r: &RegionInner, idx: PgOff) {
    m.vm.inc(Item::FaultStaleUnmapped);
    log::warn!(
        "a stray page is mapped at {:#x} whose entry is a swap entry; dropped",
        r.page_addr(idx)
    );
    m.vm.warn_on(
        r.view.advise(idx.offset(), PAGE_SIZE, Advice::DontNeed),
        "MADV_DONTNEED of view pages",
    );
}

/// The readahead pages of a stream's window (`swapin_window`: the faults walk up the region
/// and the program used every page of the last window), pages 1.. of `w`, mapped at once, one
/// UFFDIO_COPY per run of consecutive pages, as clean swap-cache pages keeping their swap
/// copies (write-protected, or writable with their hash recorded under anon_clean=hash), as a
/// minor fault maps a parked one; or dirty, their slots freed once copied, under
/// `swapin_cache=skip`. Parked instead, each would cost a copy into its pool slot, a
/// share of a minor fault's fault-around, a copy out and the slot's zap. A page that was not
/// read or not placed stays swapped (its own fault reads it). Returns the frames used and
/// those left over.
fn map_swap_ahead(
    m: &MmInner,
    sw: &swap_state::SwapState,
    r: &RegionInner,
    w: swap_state::SwapWindow<'_, '_>,
) -> (Vec<Pfn>, Vec<Pfn>) {
    let (at, slots, frames, ok, src) = (w.at, w.slots, w.frames, w.ok, w.src);
    let n = slots.len();
    let free = skips_swap_cache(m);
    let hash = hashes_clean(m) && !free;
    // Write-protected while the swap copy stays valid, unless a hash tells a store instead.
    let wp = !hash && !free;
    let mut used = Vec::with_capacity(n);
    let mut unused: Vec<Pfn> = frames[n..].to_vec();
    unused.extend((1..n).filter(|&k| !ok[k]).map(|k| frames[k]));
    let ks: Vec<usize> = (1..n).filter(|&k| ok[k]).collect();
    for run in pool::runs(&ks, |a, b| {
        at[b - 1] == at[a - 1].next() && src.follows(a, b)
    }) {
        let run = &ks[run];
        let k0 = run[0];
        let hashes: Vec<u64> = if hash {
            match run.iter().map(|&k| src.hash_page(k)).collect() {
                Ok(h) => h,
                // No hash to tell a later store by: these stay swapped.
                Err(_) => {
                    unused.extend(run.iter().map(|&k| frames[k]));
                    continue;
                }
            }
        } else {
            Vec::new()
        };
        let dst = r.page_addr(at[k0 - 1]);
        let len = run.len() * PAGE_SIZE;
        let placed = match m.retry_again(len, |done| {
            m.mm.uffd
                .copy(dst + done, src.addr(k0) + done, len - done, wp, true)
        }) {
            Ok(d) => d / PAGE_SIZE,
            Err(e) => {
                // The pages from the one that failed on stay swapped; their own faults read
                // them. A stray page in the way (EEXIST) would hide its swapped page from
                // those faults: it goes, as in `place_read`.
                let at_err = e.done / PAGE_SIZE;
                if let (true, Some(&k)) = (e.is_exists(), run.get(at_err)) {
                    drop_stray_page(m, r, at[k - 1]);
                } else {
                    log::warn!("mapping swap readahead at {dst:#x}: {e}");
                }
                at_err
            }
        };
        for (j, &k) in run.iter().enumerate() {
            let f = frames[k];
            if j >= placed {
                unused.push(f);
                continue;
            }
            pool::empty_slot(m, f);
            if hash {
                pool::set_clean_hash(m, f, hashes[j]);
            }
            let refault = super::workingset::workingset_refault(
                m,
                sw.space(slots[k]),
                slots[k].cache_index(),
                false,
            );
            let p = &m.node.pages[f];
            // Dirty with its slot freed (swapin_cache=skip), or clean in the swap cache.
            let state = if free { pg::DIRTY } else { pg::SWAPCACHE };
            p.init(
                Owner::Anon(r.id, at[k - 1]),
                pg::UPTODATE
                    | pg::SWAPBACKED
                    | state
                    | pg::MAPPED
                    | if wp { pg::WP } else { 0 }
                    | if refault { pg::ACTIVE } else { 0 },
            );
            p.set_swap_entry(slots[k]);
            if free {
                sw.swap_free(slots[k], &m.vm);
            } else {
                sw.add_to_cache(slots[k], f, &m.vm);
            }
            w.rest[k - 1].set(Pte::Frame(f));
            used.push(f);
        }
    }
    (used, unused)
}

/// `do_swap_page`: a page on the swap device. Allocates frames for the readahead window
/// (`swap_state::swapin_window`), reads the page and its virtual neighbours that are also
/// swapped (`swap_state::swap_read`, swap_vma_readahead's choice of pages), parks the
/// neighbours in the swap cache (`swap_state::park_readahead`) and maps the faulting page.
fn do_swap_page(
    m: &MmInner,
    r: &Arc<RegionInner>,
    idx: PgOff,
    slot: SwapEntry,
    write: bool,
) -> Option<Fault> {
    let Some(sw) = &m.swap else {
        return oom(m, r, idx);
    };
    let ra_max =
        swap_state::swapin_ra_max(m.cfg.page_cluster, sw.dev.ra_pages(), m.node.nr_frames());
    let (win, place, stream) = swap_state::swapin_window(r, idx, ra_max);
    let mut frames = Vec::with_capacity(win as usize);
    if !page_alloc::alloc_pages(m, win as usize, &mut frames) {
        return oom(m, r, idx);
    }
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::Swap(slot) {
        drop(g);
        pool::free_frames(m, &frames, false);
        return None;
    }
    let (at, mut rest) = lock_swap_window(r, idx, frames.len() as u64, place);
    let n = 1 + rest.len();
    let slots: Vec<SwapEntry> = std::iter::once(slot)
        .chain(rest.iter().map(|g| match g.get() {
            Pte::Swap(s) => s,
            _ => unreachable!(),
        }))
        .collect();
    pool::with_bounce(n, |bounce| {
        let (ok, src) = super::page_io::swap_readpage_src(m, sw, &slots, bounce);
        if !ok[0] {
            // The faulting page's contents are lost: poison it (SIGBUS on access), never hand
            // out zeros in its place.
            sw.swap_free(slot, &m.vm);
            g.set(Pte::Poison);
            m.vm.warn_on(
                m.mm.uffd.poison(r.page_addr(idx), PAGE_SIZE, false),
                "UFFDIO_POISON",
            );
            drop(rest);
            drop(g);
            pool::free_frames(m, &frames, false);
            return;
        }
        // A read where a sequential writer expects its next write (a read-modify-write pass)
        // maps the page writable and drops its swap copy, as the write would.
        let rmw = !write && r.writes.expects(idx);
        // Or the device's copy is in memory and a second write of the page only a copy
        // (swapin_cache=skip).
        let skip = skips_swap_cache(m);
        // Or the region's pages mapped clean nearly all come back written (anon_clean=hash).
        let predicted = !write && !rmw && !skip && write_predicted(m, r, idx);
        let keep = !sw.full() && !write && !rmw && !predicted && !skip;
        // A stream's window is mapped now (it will all be used); any other is parked, each
        // page mapped by its own minor fault (with its fault-around), when it comes.
        let w = swap_state::SwapWindow {
            at: &at,
            slots: &slots,
            frames: &frames,
            ok: &ok,
            rest: &mut rest,
            src: &src,
        };
        let (used, unused, mapped) = if stream && !write && !rmw {
            let (used, unused) = map_swap_ahead(m, sw, r, w);
            let n = used.len() as u64;
            (used, unused, n)
        } else {
            let (used, unused) = swap_state::park_readahead(m, sw, r, w);
            (used, unused, 0)
        };
        // The faulting page: copied straight into the view, write-protected while its swap copy
        // stays valid (a later write is a wp fault that drops the copy).
        let active =
            super::workingset::workingset_refault(m, sw.space(slot), slot.cache_index(), false);
        let env = SwapinFromSrc {
            m,
            r,
            sw,
            src: &src,
            free_after_place: std::cell::Cell::new(None),
        };
        let used_len = used.len() + 1;
        page_state::swapin_install(
            &m.node.pages,
            &*m.node.lru,
            &m.vm,
            &env,
            &mut g,
            Owner::Anon(r.id, idx),
            idx,
            slot,
            frames[0],
            keep,
            active,
            used,
        );
        if rmw {
            r.writes.advance(idx, idx + 1);
        }
        drop(rest);
        drop(g);
        pool::free_frames(m, &unused, false);
        let read = used_len as u64;
        m.vm.inc(Item::Pgfault);
        m.vm.inc(Item::Pgmajfault);
        m.vm.inc(Item::NrMapped);
        m.vm.add(Item::Pswpin, read);
        m.vm.add(Item::Pgpgin, read * (PAGE_SIZE as u64 / 1024));
        m.vm.add(Item::SwapRa, read - 1);
        if mapped > 0 {
            // Used as soon as read: hits, as a minor fault on each would count them.
            m.vm.add(Item::SwapRaHit, mapped);
            m.vm.add(Item::SwapRaMapped, mapped);
            m.vm.add(Item::FaultAround, mapped);
            m.vm.add(Item::NrMapped, mapped);
            r.ra_hits
                .fetch_add(u32::try_from(mapped).unwrap_or(u32::MAX), Ordering::Relaxed);
        }
        m.vm.add(Item::NrAnonPages, read);
        m.node.note_resident();
        wake(m, r, idx);
        // Only where a read waits for a device (a disk, the network): for memory (RAM, a
        // zswap pool over RAM) there is no wait to hide, only the copy to move to another
        // CPU, and numpy at 128M on RAM swap took 3.67-3.82 s against 2.89-3.56 with it.
        if mapped > 0 && swap_ra_async_on(m) {
            swap_ra_async(m, r, idx, win);
        }
    });
    Some(Fault::Done)
}

/// Whether swap-in streams are read ahead by the workers: switch `swap_ra_async`, on a swap
/// device whose reads wait (`SwapDevice::blocks_on_read`).
fn swap_ra_async_on(m: &MmInner) -> bool {
    m.swap.as_ref().is_some_and(|sw| sw.dev.blocks_on_read())
        && m.cfg.settings.is_new(crate::settings::Switch::SwapRaAsync)
}

/// A swap-in stream's major fault at page `idx`, its window of `win` pages mapped: the
/// windows after it (of `win` pages, at most 1/64 of the budget) are queued for the readahead
/// workers ([`swap_ra_read`] reads and maps them), as many as a mapped file keeps ahead of its
/// faults ([`ra_ahead`]), unless the fault is inside windows queued already (`SwapStream`).
fn swap_ra_async(m: &MmInner, r: &Arc<RegionInner>, idx: PgOff, win: u32) {
    // At most 1/64 of the budget a window: the workers read through bounce buffers outside
    // the budget (readahead.rs `SWAP_RA_BOUNCES`), which a small budget must not double.
    let end = (idx + u64::from(win)).min(r.end());
    let win = u64::from(win).min((m.node.nr_frames() / 64).max(1));
    let queue =
        r.swap_stream
            .lock()
            .on_fault(idx.raw(), end.raw(), win, ra_ahead(m, win), r.npages());
    for (start, nr) in queue {
        swap_ra_queue(m, r, start, nr);
    }
}

/// A readahead page used at page `idx` of `r` (a minor fault): if it is the marker of a
/// window [`swap_ra_async`] queued, one more window is queued.
fn swap_ra_marker(m: &MmInner, r: &Arc<RegionInner>, idx: PgOff) {
    // No stream is read ahead here: the readahead hits of memory tiers take no lock.
    if !swap_ra_async_on(m) {
        return;
    }
    let next = r.swap_stream.lock().on_marker(idx.raw(), r.npages());
    if let Some((start, nr)) = next {
        // The stream's faults are minor ones now: its last "major" fault is here, so a major
        // fault after the windows still reads as the stream walking up.
        r.last_major.store(idx.raw(), Ordering::Relaxed);
        swap_ra_queue(m, r, start, nr);
    }
}

fn swap_ra_queue(m: &MmInner, r: &Arc<RegionInner>, start: u64, nr: u64) {
    use super::readahead::{RaRequest, RaTarget};
    filemap::ra_queue(
        m,
        RaRequest {
            target: RaTarget::Swap {
                region: r.clone(),
                read: swap_ra_read,
            },
            start: PgOff::new(start),
            nr,
        },
    );
}

/// A readahead worker's read of window `[start, start + nr)` of a swap-in stream's region
/// (queued by [`swap_ra_async`] or [`swap_ra_marker`]): its swapped pages are read in one batch
/// (`swap_readpage`, every run in flight at once where the device can) and mapped as a
/// stream's own window is mapped (`map_swap_ahead`: clean swap-cache pages, one UFFDIO_COPY per
/// run), except the first, which is parked as a readahead page, the marker whose use queues
/// the next window. Pages that are not swapped (resident, never written, held by a fault) are
/// skipped; a page not read stays swapped for its own fault. Returns the pages read.
fn swap_ra_read(m: &MmInner, r: &Arc<RegionInner>, start: PgOff, nr: u64) -> u64 {
    let Some(sw) = &m.swap else {
        return 0;
    };
    let end = (start + nr).min(r.end());
    if r.dead.load(Ordering::Acquire) || start >= end {
        return 0;
    }
    // Frames for the pages swapped now (a look without locks; the locks below decide).
    let want = (start.raw()..end.raw())
        .filter(|&i| matches!(r.pt.get(PgOff::new(i)), Pte::Swap(_)))
        .count()
        .min(pool::BOUNCE_PAGES);
    if want == 0 {
        return 0;
    }
    // The buffer first: waiting for one holds no entry locks.
    pool::with_shared_bounce(&m.ra.swap_bounce, want, |bounce| {
        swap_ra_window(m, sw, r, start, end, want, bounce)
    })
}

/// [`swap_ra_read`] of the `want` swapped pages of `[start, end)` through `bounce`.
fn swap_ra_window(
    m: &MmInner,
    sw: &swap_state::SwapState,
    r: &Arc<RegionInner>,
    start: PgOff,
    end: PgOff,
    want: usize,
    bounce: &crate::sys::Mapping,
) -> u64 {
    let mut frames = Vec::with_capacity(want);
    if !page_alloc::alloc_pages(m, want, &mut frames) {
        return 0;
    }
    // Fewer when the allocator had fewer at hand.
    let want = frames.len();
    let mut at = Vec::with_capacity(want);
    let mut guards = Vec::with_capacity(want);
    for i in start.raw()..end.raw() {
        if guards.len() == want {
            break;
        }
        if let Some(g) = r.pt.try_lock(PgOff::new(i)) {
            if matches!(g.get(), Pte::Swap(_)) {
                at.push(PgOff::new(i));
                guards.push(g);
            }
        }
    }
    if guards.is_empty() {
        pool::free_frames(m, &frames, false);
        return 0;
    }
    let slots: Vec<SwapEntry> = guards
        .iter()
        .map(|g| match g.get() {
            Pte::Swap(s) => s,
            _ => unreachable!(),
        })
        .collect();
    let (ok, src) = super::page_io::swap_readpage_src(m, sw, &slots, bounce);
    let read = ok.iter().filter(|&&o| o).count() as u64;
    let (first, rest) = guards.split_at_mut(1);
    let w = swap_state::SwapWindow {
        at: &at[1..],
        slots: &slots,
        frames: &frames,
        ok: &ok,
        rest,
        src: &src,
    };
    let (mut used, mut unused) = map_swap_ahead(m, sw, r, w);
    let mapped = used.len() as u64;
    // The marker: parked, its use a minor fault (swap_ra_marker).
    if ok[0] && pool::fill_slots(m, &frames[..1], &ok[..1], src.map, &src.offs[..1])[0] {
        swap_state::park_page(m, sw, r, at[0], slots[0], frames[0], &mut first[0]);
        used.push(frames[0]);
    } else {
        unused.push(frames[0]);
    }
    m.node.lru.add(&m.node.pages, &used, &m.vm);
    drop(guards);
    pool::free_frames(m, &unused, false);
    m.vm.add(Item::Pswpin, read);
    m.vm.add(Item::Pgpgin, read * (PAGE_SIZE as u64 / 1024));
    m.vm.add(Item::SwapRa, read);
    m.vm.add(Item::SwapRaAsync, read);
    m.vm.add(Item::SwapRaHit, mapped);
    m.vm.add(Item::SwapRaMapped, mapped);
    m.vm.add(Item::NrMapped, mapped);
    m.vm.add(Item::NrAnonPages, used.len() as u64);
    r.ra_hits
        .fetch_add(u32::try_from(mapped).unwrap_or(u32::MAX), Ordering::Relaxed);
    m.node.note_resident();
    read
}

/// No frame can be had (swap full under overcommit, or persistent swap write errors): poison the
/// page so the access raises SIGBUS instead of hanging.
/// None: the entry was resolved meanwhile; the caller looks at it again (never a bare wake).
fn oom(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    let mut g = r.pt.lock(idx);
    match g.get() {
        Pte::Frame(_) | Pte::Zero | Pte::HugeZero => return None,
        Pte::Swap(s) => {
            if let Some(sw) = &m.swap {
                sw.swap_free(s, &m.vm);
            }
        }
        _ => {}
    }
    g.set(Pte::Poison);
    // Counted before the toucher is woken: whoever sees its SIGBUS/EFAULT sees the count.
    m.vm.inc(Item::OomPoison);
    let addr = r.page_addr(idx);
    log::error!(
        "out of memory: no frame for the page at {addr:#x} (budget {} bytes, swap {}); the page is poisoned and its access raises SIGBUS",
        m.cfg.budget,
        m.swap.as_ref().map_or("none".to_string(), |s| format!("{} of {} slots free", s.slots.nr_free(), s.slots.nr_pages()))
    );
    if let Err(e) = m.mm.uffd.poison(addr, PAGE_SIZE, false) {
        log::error!("UFFDIO_POISON at {addr:#x}: {e}");
        wake(m, r, idx);
    }
    drop(g);
    Some(Fault::Done)
}

/// Fault-around of a read fault in a file region (pages): Linux's `fault_around_bytes` (64 KiB)
/// is 16 pages; a user-space fault costs a handler round trip, and each fault-around's move and
/// write protection flush the TLB of every CPU the program runs on, so a whole readahead
/// window (`read_ahead_kb`, bounded by the budget as readahead is), at least 128 pages
/// (512 KiB, the window before `read_ahead_kb` became 1024).
fn file_fault_around(m: &MmInner) -> u64 {
    super::readahead::ra_pages(m.cfg.read_ahead_kb, m.node.nr_frames()).max(128)
}

/// Longest wait of a fault for a page under read I/O before it is deferred instead.
const READ_IO_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// `MMAP_LOTSAMISS`: a file region whose read faults miss the page cache this much more often
/// than they find pages there is read at random; its faults stop reading around.
const MMAP_LOTSAMISS: u32 = 100;

/// A page-cache lookup for a fault that failed (no frame or pool slot obtainable now):
/// counted (`file_read_error`) and logged; the fault is retried. (Mapped files are disk files:
/// their reads fail inside `filemap_fault`, which raises SIGBUS for them.)
fn filemap_fault_error(m: &MmInner, fm: &FileMap, index: PgOff, e: crate::Error) -> Fault {
    m.vm.inc(Item::FileReadError);
    log::warn!(
        "fault on page {index} of {}: {e}; retrying",
        fm.mapping.name()
    );
    Fault::Retry
}

/// Windows a sequentially faulting file region keeps queued or in flight ahead of its faults,
/// at most: the marker on a window's first page queues the window that many on, so the
/// readahead workers (readahead.rs, one window each) read that many at once while the faults
/// map the current one. 8 windows of 1 MiB: the 8 MiB this VM's disk reads ahead
/// (`read_ahead_kb` 8192), in flight as 8 requests. With two windows ahead the device saw
/// queue depth 1.5 and seqread ran at 1.3-1.4 GiB/s; with eight, 4.5 and 1.7-2.0 GiB/s.
const RA_AHEAD_MAX: u64 = 8;

/// Windows ahead for `window`-page windows: [`RA_AHEAD_MAX`], fewer where that would hold more
/// than 1/32 of the budget per stream (a small budget would evict what it read ahead before
/// the faults reach it), at least one.
fn ra_ahead(m: &MmInner, window: u64) -> u64 {
    (m.node.nr_frames() / 32 / window.max(1)).clamp(1, RA_AHEAD_MAX)
}

/// The page-cache page for file page `index` of a file region, read (with read-around) if
/// absent, returned locked and up to date with a reference; None: retry the fault.
///
/// Sequential faults are read ahead asynchronously, as Linux's `do_sync_mmap_readahead` /
/// `do_async_mmap_readahead` do: a miss reads its window synchronously and queues the next
/// [`ra_ahead`] ones, each with PG_readahead on its first page; fault-around stops before such
/// a page, so the fault on it queues the window that many on (`page_cache_async_ra`) and finds its
/// own pages read meanwhile. A page still under a readahead worker's I/O is waited for (its
/// page lock, at most READ_IO_WAIT) instead of being deferred.
fn filemap_fault(
    m: &MmInner,
    r: &RegionInner,
    fm: &FileMap,
    idx: PgOff,
    index: PgOff,
) -> std::result::Result<Pfn, Fault> {
    let a = &fm.mapping;
    let window = super::readahead::ra_pages(m.cfg.read_ahead_kb, m.node.nr_frames())
        .clamp(1, 512)
        .next_power_of_two();
    let mut locked = false;
    let f = match filemap::find_get_page(m, a, index) {
        Ok(Some(f)) => {
            // do_async_mmap_readahead: a hit makes the region look less random (not a parked
            // fault served again: it counted as the miss it was).
            if !super::page_state::replaying() {
                mmap_miss_sub(fm, 1);
            }
            f
        }
        Ok(None) => {
            // do_sync_mmap_readahead: read around the fault (ra_pages, aligned), unless the
            // region's faults mostly miss (random access) or it is declared random: then only
            // the page itself. A sequential miss (the region is declared sequential, or the
            // miss is where the last read ended, or right after a cached page: one of several
            // threads each reading its own part) reads the window from there and queues the
            // next one.
            let miss = fm.mmap_miss.load(Ordering::Relaxed);
            let pattern = r.access_pattern();
            let sequential = pattern == AccessPattern::Sequential
                || fm.ra_next.load(Ordering::Relaxed) == index.raw()
                || (miss <= MMAP_LOTSAMISS
                    && index.raw() > 0
                    && matches!(a.peek(&m.vm, index - 1), Some(super::fs::Entry::Page(_))));
            let ra = if pattern == AccessPattern::Random {
                // VM_RAND_READ: only the page itself.
                1
            } else if sequential {
                mmap_miss_sub(fm, 1);
                window
            } else {
                if miss < MMAP_LOTSAMISS * 10 {
                    fm.mmap_miss.store(miss + 1, Ordering::Relaxed);
                }
                if miss + 1 > MMAP_LOTSAMISS {
                    m.vm.inc(Item::FileRaRandom);
                    1
                } else {
                    window
                }
            };
            let start = if sequential || ra == 1 {
                index
            } else {
                index.round_down(ra)
            };
            fm.ra_next.store((start + ra).raw(), Ordering::Relaxed);
            // A single page goes asynchronously where it can (mpage.rs): the fault is parked
            // on it below and this thread serves the next one meanwhile.
            if ra > 1 || !super::mpage::read_page_async(m, a, index) {
                filemap::do_page_cache_readahead(m, a, start, ra, None);
            }
            if sequential && ra > 1 {
                // The next windows, each with its marker on its first page.
                for k in 1..=ra_ahead(m, ra) {
                    let next = start + k * ra;
                    fm.ra_next.store((next + ra).raw(), Ordering::Relaxed);
                    filemap::page_cache_async_ra(m, a, next, ra, Some(next));
                }
            }
            m.vm.inc(Item::Pgmajfault);
            match filemap::find_get_page(m, a, index) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    // The window's read failed (its pages were dropped) or found no frame:
                    // this page alone, read below (`page_not_uptodate`: one more try).
                    match filemap::pagecache_get_page(
                        m,
                        a,
                        index,
                        filemap::Fgp::LOCK | filemap::Fgp::CREAT,
                    ) {
                        Ok(Some(f)) => {
                            locked = true;
                            f
                        }
                        // No frame now either (memory is short): retried, as before.
                        Ok(None) | Err(_) => return Err(Fault::Retry),
                    }
                }
                Err(e) => return Err(filemap_fault_error(m, fm, index, e)),
            }
        }
        Err(e) => return Err(filemap_fault_error(m, fm, index, e)),
    };
    let p = &m.node.pages[f];
    // A page not up to date is under read I/O (the readahead worker holds it for one window):
    // wait, as `filemap_fault`'s `lock_folio_maybe_drop_mmap` does, for at most READ_IO_WAIT;
    // a page held longer (a writer copying into it from a buffer that is itself faulting), or
    // locked while up to date, is deferred.
    // On a handler thread the fault is parked instead, and served by whoever completes the
    // read (handler.rs `IoWaiters`).
    if !locked && !p.trylock() {
        let under_io = !p.test(pg::UPTODATE);
        if under_io && super::page_state::park_on_io(f) {
            filemap::put_page(&m.node, f);
            return Err(Fault::Retry);
        }
        if !under_io || !p.lock_for(READ_IO_WAIT) {
            filemap::put_page(&m.node, f);
            m.vm.inc(Item::FaultDeferred);
            return Err(Fault::Retry);
        }
    }
    if p.owner() != Owner::Cache(a.id, index) {
        p.unlock();
        filemap::put_page(&m.node, f);
        return Err(Fault::Retry);
    }
    if !p.test(pg::UPTODATE) {
        // Its readahead failed (the worker drops such pages, but not one locked here
        // meanwhile), or it is new (above): read it here, as `filemap_fault`'s
        // page_not_uptodate does. A page whose read fails again is not handed out: the
        // access raises SIGBUS (VM_FAULT_SIGBUS), never waits for ever nor sees zeros.
        if let Err(e) = filemap::filemap_read_folio(m, a, f, index) {
            return Err(file_read_sigbus(m, r, fm, idx, index, &e));
        }
    }
    if p.test_clear(pg::READAHEAD) {
        m.vm.inc(Item::FileRaHit);
        // do_async_mmap_readahead: the marker starts a window of its own; the next window,
        // in the background.
        // Not for a region whose faults mostly miss (random access) or declared random.
        if fm.mmap_miss.load(Ordering::Relaxed) <= MMAP_LOTSAMISS
            && r.access_pattern() != AccessPattern::Random
        {
            let next = index + ra_ahead(m, window) * window;
            fm.ra_next.store((next + window).raw(), Ordering::Relaxed);
            filemap::page_cache_async_ra(m, a, next, window, Some(next));
        }
    }
    Ok(f)
}

/// A fault that found its page cached makes a file region look less random (`mmap_miss` falls,
/// as `do_async_mmap_readahead` lowers it).
fn mmap_miss_sub(fm: &FileMap, n: u32) {
    let miss = fm.mmap_miss.load(Ordering::Relaxed);
    if miss > 0 {
        fm.mmap_miss
            .store(miss.saturating_sub(n), Ordering::Relaxed);
    }
}

/// A file page that could not be read (its readahead's read and the fault's own both failed):
/// the access raises SIGBUS, as Linux's `filemap_fault` answers `VM_FAULT_SIGBUS`; logged with
/// the file, page and error, counted (`file_read_poison`). The entry keeps the marker, so later
/// accesses through this region raise SIGBUS too without I/O, until MADV_DONTNEED of the page
/// (or an unmap) lets the next access read again; other regions and `read_at` read again.
fn file_read_sigbus(
    m: &MmInner,
    r: &RegionInner,
    fm: &FileMap,
    idx: PgOff,
    index: PgOff,
    e: &std::io::Error,
) -> Fault {
    // Counted before the toucher is woken: whoever sees its SIGBUS/EFAULT sees the count.
    m.vm.inc(Item::FileReadPoison);
    log::error!(
        "page {index} of {} could not be read ({e}): the access at {:#x} raises SIGBUS",
        fm.mapping.name(),
        r.page_addr(idx)
    );
    poison_file_page(m, r, idx, "after a read error");
    Fault::Done
}

/// Marks page `idx` of file region `r` poisoned (its entry, if empty, and the view's pte) and
/// wakes its thread, whose access then raises SIGBUS. The entry records it, so a later growth
/// of the file or a discard clears the marker; the thread is woken only once it is stored.
fn poison_file_page(m: &MmInner, r: &RegionInner, idx: PgOff, why: &str) {
    let mut g = r.pt.lock(idx);
    if g.get() == Pte::None {
        g.set(Pte::Poison);
    }
    if let Err(e) = m.mm.uffd.poison(r.page_addr(idx), PAGE_SIZE, true) {
        if !e.is_exists() {
            log::error!("UFFDIO_POISON {why} at {:#x}: {e}", r.page_addr(idx));
        }
    }
    drop(g);
    wake(m, r, idx);
}

/// An access beyond the end of the file: SIGBUS, as Linux raises it.
fn beyond_eof(m: &MmInner, r: &RegionInner, fm: &FileMap, idx: PgOff) -> bool {
    let size = fm.mapping.size.load(Ordering::Acquire);
    if fm.linear_page_index(idx).byte_offset() >= size.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64
    {
        poison_file_page(m, r, idx, "beyond end of file");
        return true;
    }
    false
}

/// A fault in a shared file region (`filemap_fault` + `do_shared_fault` + `do_page_mkwrite`):
/// the page-cache page is moved into the view (mapped at most in one view at a time); a clean
/// page is mapped write-protected so its first store is seen and dirties it.
fn do_shared_fault(
    m: &MmInner,
    r: &Arc<RegionInner>,
    fm: &FileMap,
    idx: PgOff,
    write: bool,
    wp: bool,
) -> Option<Fault> {
    match r.pt.get(idx) {
        Pte::Frame(f) => do_file_frame_fault(m, r, fm, idx, f, wp),
        Pte::Poison => repoison(m, r, idx),
        _ => do_file_map_fault(m, r, fm, idx, write),
    }
}

/// A fault on page `idx` of a file region whose entry names page-cache page `f`: the page was
/// mapped meanwhile (wake), lost from the view (poisoned if it has no other copy), unmapped
/// meanwhile (look again), or, for a write-protect fault, its first store: a shared region
/// dirties it (`do_page_mkwrite`), a private one copies it (`do_wp_page` breaking COW).
fn do_file_frame_fault(
    m: &MmInner,
    r: &Arc<RegionInner>,
    fm: &FileMap,
    idx: PgOff,
    f: Pfn,
    wp: bool,
) -> Option<Fault> {
    let a = &fm.mapping;
    let index = fm.linear_page_index(idx);
    let p = &m.node.pages[f];
    if !p.trylock() {
        m.vm.inc(Item::FaultDeferred);
        return Some(Fault::Retry);
    }
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::Frame(f) || !p.test(pg::PAGECACHE) {
        drop(g);
        p.unlock();
        return None;
    }
    if p.test(pg::MAPPED) && !wp && !view_present(r, idx) {
        note_stale(m, r, idx, Pte::Frame(f));
        if !pool::slot_present(m, f) {
            // The only copy of the page is gone: never hand out zeros or stale data
            // for a file page; the access raises SIGBUS.
            log::error!(
                "file page {} of {} lost from its mapping at {:#x}: poisoned",
                index,
                a.name(),
                r.page_addr(idx)
            );
            if !pool::ensure_slot(m, f) {
                // Logged by ensure_slot; a slot that cannot be refilled is a WARN_ON.
                m.vm.inc(Item::MmWarn);
            }
            g.set(Pte::Poison);
            m.vm.warn_on(
                m.mm.uffd.poison(r.page_addr(idx), PAGE_SIZE, false),
                "UFFDIO_POISON",
            );
        }
        p.clear(pg::MAPPED | pg::WP);
        m.vm.sub(Item::NrMapped, 1);
    }
    if !p.test(pg::MAPPED) {
        if g.get() == Pte::Frame(f) {
            g.set(Pte::None);
        }
        drop(g);
        p.unlock();
        return None;
    }
    if wp && !fm.shared {
        // The first store to a page-cache page mapped in a private region: take the page back
        // to the cache and give the region its own copy (do_cow_fault, which finds the page
        // again; a racing read fault that maps it meanwhile only sends this write round again).
        super::rmap::unmap_file_page_at(m, r, idx, f);
        g.set(Pte::None);
        drop(g);
        p.unlock();
        return do_cow_fault(m, r, fm, idx);
    }
    if wp {
        if p.test(pg::WP) {
            // page_mkwrite: the first store to a clean page dirties it.
            filemap::set_page_dirty(m, a, f);
            p.clear(pg::WP);
            m.vm.inc(Item::WpFault);
            m.vm.inc(Item::Pgfault);
        }
        if let Err(e) =
            m.mm.uffd
                .writeprotect(r.page_addr(idx), PAGE_SIZE, false, true)
        {
            log::error!("UFFDIO_WRITEPROTECT clear at {:#x}: {e}", r.page_addr(idx));
        }
    }
    drop(g);
    p.unlock();
    wake(m, r, idx);
    Some(Fault::Done)
}

/// A fault on an unmapped page of a file region (`do_read_fault` / `do_shared_fault`): the
/// page-cache page is found or read (`filemap_fault`), taken from any other view that maps it,
/// and mapped here, followed by the cached pages after it (fault-around). In a shared region a
/// clean page is mapped write-protected so its first store is seen and dirties it, and a write
/// dirties its page; in a private region (reads only: writes copy) every page is mapped
/// write-protected, so its first store copies it.
fn do_file_map_fault(
    m: &MmInner,
    r: &Arc<RegionInner>,
    fm: &FileMap,
    idx: PgOff,
    write: bool,
) -> Option<Fault> {
    let a = &fm.mapping;
    let index = fm.linear_page_index(idx);
    debug_assert!(fm.shared || !write, "a private region's writes copy");
    if beyond_eof(m, r, fm, idx) {
        return Some(Fault::Done);
    }
    let f = match filemap_fault(m, r, fm, idx, index) {
        Ok(f) => f,
        Err(fault) => return Some(fault),
    };
    let p = &m.node.pages[f];
    // Mapped in another view: take it from there first (before our pte lock: lock order).
    if p.test(pg::MAPPED) {
        unmap_file_page(m, f);
    }
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::None {
        drop(g);
        p.unlock();
        filemap::put_page(&m.node, f);
        return None;
    }
    if !map_file_page(m, r, a, idx, f, write, !fm.shared) {
        drop(g);
        p.unlock();
        filemap::put_page(&m.node, f);
        return Some(Fault::Retry);
    }
    m.vm.inc(Item::Pgfault);
    g.set(Pte::Frame(f));
    drop(g);
    p.unlock();
    filemap::put_page(&m.node, f);
    // Fault-around (filemap_map_pages): map the cached pages that follow. A sequential writer
    // gets a growing window of pages mapped writable and dirty (one fault per window instead
    // of one wp fault per page); a reader gets up to a readahead window of clean pages mapped
    // write-protected.
    let win = if write {
        write_window(m, r, idx) as u64
    } else {
        file_fault_around(m)
    };
    let last = filemap_map_pages(m, r, fm, idx, win, write);
    if write {
        r.writes.advance(idx, last.next());
    }
    wake_pages(m, r, idx, last - idx + 1);
    Some(Fault::Done)
}

/// Maps locked page-cache page `f` at page `idx` of file region `r` (its pte locked and None
/// by the caller): dirtied and moved in when `dirty_it` or already dirty, else copied in
/// write-protected so its first store is seen; always write-protected with `private` (a
/// private region's first store copies the page). False if it could not be mapped.
fn map_file_page(
    m: &MmInner,
    r: &RegionInner,
    a: &Arc<super::fs::AddressSpace>,
    idx: PgOff,
    f: Pfn,
    dirty_it: bool,
    private: bool,
) -> bool {
    let p = &m.node.pages[f];
    if dirty_it {
        filemap::set_page_dirty(m, a, f);
    }
    let dst = r.page_addr(idx);
    let wp = private || !p.test(pg::DIRTY);
    let res = place_from_slot(m, f, dst, wp, true);
    if let Err(e) = res {
        if e.errno == libc::EBUSY {
            // UFFDIO_MOVE refuses a page that is still pinned: a direct I/O into or out of its
            // slot (a readahead read, a writeback) that usermm has seen complete but whose
            // pages the kernel has not released yet (seen in soaks: the page neither locked
            // for reading nor under writeback). Transient: the fault is retried.
            m.vm.inc(Item::UffdEbusy);
            log::debug!(
                "file page {f} of {} is pinned by I/O; fault retried",
                a.name()
            );
        } else {
            log::error!("mapping file page {f} of {} at {dst:#x}: {e}", a.name());
        }
        return false;
    }
    if wp {
        p.set(pg::WP);
    }
    p.set_mapped_at(r.id, idx);
    p.set(pg::MAPPED);
    m.vm.inc(Item::NrMapped);
    true
}

/// `filemap_map_pages` (fault-around): maps the cached pages after page `idx` of file region
/// `r`, fewer than `win` of them, and returns the last page mapped (`idx` if none). It stops at
/// the first page that is beyond the end of the file, already has an entry, is not cached and
/// up to date, is locked, is mapped in another view, or carries PG_readahead (its own fault
/// queues the next window, as Linux's `filemap_map_pages` leaves such pages to fault). Never
/// waits. With `write` the pages are dirtied first (a sequential writer's window).
///
/// One ioctl per run of pages consecutive in the pool (the view side is consecutive by
/// construction): UFFDIO_COPY write-protected for clean pages and for every page of a private
/// region (their first store is seen: it dirties them, or copies them in a private region;
/// their slots are dropped in the next zap batch), UFFDIO_MOVE for dirty ones.
fn filemap_map_pages(
    m: &MmInner,
    r: &RegionInner,
    fm: &FileMap,
    idx: PgOff,
    win: u64,
    write: bool,
) -> PgOff {
    let a = &fm.mapping;
    let eof = a.size.load(Ordering::Acquire).div_ceil(PAGE_SIZE as u64);
    let mut pages: Vec<(PgOff, Pfn)> = Vec::new();
    let mut guards: Vec<PteGuard<'_>> = Vec::new();
    let mut j = idx + 1;
    while j < r.end() && j - idx < win {
        let index = fm.linear_page_index(j);
        if index.raw() >= eof || r.pt.get(j) != Pte::None {
            break;
        }
        let Ok(Some(f)) = filemap::find_get_page(m, a, index) else {
            break;
        };
        let p = &m.node.pages[f];
        if !p.trylock() {
            filemap::put_page(&m.node, f);
            break;
        }
        let usable = p.owner() == Owner::Cache(a.id, index)
            && p.test(pg::UPTODATE)
            && !p.test(pg::MAPPED | pg::READAHEAD);
        let g = if usable {
            r.pt.try_lock(j).filter(|g| g.get() == Pte::None)
        } else {
            None
        };
        let Some(g) = g else {
            p.unlock();
            filemap::put_page(&m.node, f);
            break;
        };
        pages.push((j, f));
        guards.push(g);
        j += 1;
    }
    if write {
        for &(_, f) in &pages {
            filemap::set_page_dirty(m, a, f);
        }
    }
    // A private region maps every page write-protected (its first store copies the page).
    let clean = |f: Pfn| !fm.shared || !m.node.pages[f].test(pg::DIRTY);
    let mut mapped = 0;
    for run in pool::runs(&pages, |x, y| y.1 == x.1.next() && clean(x.1) == clean(y.1)) {
        let run = &pages[run];
        let (n, f0) = (run.len(), run[0].1);
        let wp = clean(f0);
        let dst = r.page_addr(run[0].0);
        let src = m.pool.slots.addr() + f0.offset();
        for &(_, f) in run {
            pool::settle(m, f);
        }
        // A clean run of a shared region is moved, then write-protected (clean_map=move).
        let moved_clean =
            wp && fm.shared && m.cfg.settings.is_new(crate::settings::Switch::CleanMap);
        let res = if moved_clean {
            match map_clean_run(m, r, a, run, dst) {
                Some(done) => Ok(done * PAGE_SIZE),
                None => break,
            }
        } else if wp {
            let have = pool::held_prefix(m, f0, n);
            if have == 0 {
                break;
            }
            let len = have * PAGE_SIZE;
            m.retry_again(len, |d| {
                m.mm.uffd.copy(dst + d, src + d, len - d, true, true)
            })
        } else {
            let len = n * PAGE_SIZE;
            m.retry_again(len, |d| {
                m.mm.uffd.move_pages(dst + d, src + d, len - d, false, true)
            })
        };
        let done = match res {
            Ok(b) => b,
            Err(e) => {
                log::debug!(
                    "fault-around of {n} pages of {} at {dst:#x}: {e}; stopped",
                    a.name()
                );
                e.done
            }
        } / PAGE_SIZE;
        let done = done.min(n);
        for &(i, f) in &run[..done] {
            let p = &m.node.pages[f];
            // (A moved clean run: map_clean_run set WP itself, its slots are empty.)
            if wp && !moved_clean {
                p.set(pg::WP);
                pool::defer_zap(m, f);
            }
            p.set_mapped_at(r.id, i);
            p.set(pg::MAPPED);
        }
        m.vm.add(Item::NrMapped, done as u64);
        mapped += done;
        if done < n {
            break;
        }
    }
    m.vm.add(Item::FaultAround, mapped as u64);
    let last = if mapped == 0 {
        idx
    } else {
        pages[mapped - 1].0
    };
    for (k, (&(_, f), mut g)) in pages.iter().zip(guards).enumerate() {
        if k < mapped {
            g.set(Pte::Frame(f));
        }
        drop(g);
        m.node.pages[f].unlock();
        filemap::put_page(&m.node, f);
    }
    last
}

/// The first write to a page of a private file region (`do_cow_fault`): a private anonymous copy
/// of the file's page, mapped writable; from then on it is an ordinary anonymous page, and later
/// writes to the file no longer show there.
fn do_cow_fault(m: &MmInner, r: &Arc<RegionInner>, fm: &FileMap, idx: PgOff) -> Option<Fault> {
    if beyond_eof(m, r, fm, idx) {
        return Some(Fault::Done);
    }
    let index = fm.linear_page_index(idx);
    let f = match filemap_fault(m, r, fm, idx, index) {
        Ok(f) => f,
        Err(fault) => return Some(fault),
    };
    let p = &m.node.pages[f];
    let mut frames = Vec::with_capacity(1);
    if !page_alloc::alloc_pages(m, 1, &mut frames) {
        p.unlock();
        filemap::put_page(&m.node, f);
        return oom(m, r, idx);
    }
    let nf = frames[0];
    let mut g = r.pt.lock(idx);
    if g.get() != Pte::None {
        drop(g);
        p.unlock();
        filemap::put_page(&m.node, f);
        pool::free_frames(m, &frames, false);
        return None;
    }
    pool::empty_slot(m, nf);
    let src = match filemap::page_loc(m, f) {
        filemap::Loc::Pool(o) => m.pool.slots.addr() + o,
        filemap::Loc::View(v, o) => v.view.addr() + o,
    };
    let dst = r.page_addr(idx);
    if let Err(e) = m.retry_again(PAGE_SIZE, |_| {
        m.mm.uffd.copy(dst, src, PAGE_SIZE, false, true)
    }) {
        log::error!("copying file page {index} into a private region at {dst:#x}: {e}");
        drop(g);
        p.unlock();
        filemap::put_page(&m.node, f);
        pool::free_frames(m, &frames, false);
        return Some(Fault::Retry);
    }
    mark_page_accessed(&*m.node.lru, &m.node.pages, f, &m.vm);
    p.unlock();
    filemap::put_page(&m.node, f);
    m.node.pages[nf].init(Owner::Anon(r.id, idx), pg::ANON_MAPPED);
    g.set(Pte::Frame(nf));
    m.node.lru.add(&m.node.pages, &[nf], &m.vm);
    m.vm.inc(Item::NrAnonPages);
    m.vm.inc(Item::NrMapped);
    m.vm.inc(Item::Pgfault);
    drop(g);
    m.node.note_resident();
    wake(m, r, idx);
    Some(Fault::Done)
}

use super::huge_memory::{self, HPAGE_PMD_NR};

/// The first page of `idx`'s 2 MiB unit, if the unit lies wholly inside the region.
fn huge_unit(r: &RegionInner, idx: PgOff) -> Option<PgOff> {
    let u = idx.round_down(HPAGE_PMD_NR);
    (u + HPAGE_PMD_NR <= r.end()).then_some(u)
}

/// Locks the entries of unit `u` if every one is `want`; None otherwise (nothing held).
fn lock_unit(r: &RegionInner, u: PgOff, want: Pte) -> Option<Vec<PteGuard<'_>>> {
    let mut v = Vec::with_capacity(HPAGE_PMD_NR.usize());
    for j in PgOff::range(u, u + HPAGE_PMD_NR) {
        let g = r.pt.lock(j);
        if g.get() != want {
            return None;
        }
        v.push(g);
    }
    Some(v)
}

/// A fault on an untouched page of a huge region: a read maps the huge zero page over the whole
/// unit (one UFFDIO_ZEROPAGE, no frame); a write maps 512 fresh frames. None: the unit is not
/// wholly untouched (fall back to small pages).
fn do_huge_pmd_anonymous_page(
    m: &MmInner,
    r: &RegionInner,
    idx: PgOff,
    write: bool,
) -> Option<Fault> {
    let u = huge_unit(r, idx)?;
    if write {
        if r.pt.get(u) != Pte::None {
            return None;
        }
        let res = do_anonymous_page_win(m, r, u, Some(HPAGE_PMD_NR.usize()));
        wake_pages(m, r, u, HPAGE_PMD_NR);
        return Some(res.unwrap_or(Fault::Done));
    }
    let mut gs = lock_unit(r, u, Pte::None)?;
    if !huge_memory::mm_get_huge_zero_page(m) {
        m.vm.inc(Item::ThpFaultFallback);
        return None;
    }
    let addr = r.page_addr(u);
    let len = huge_memory::HPAGE_PMD_SIZE;
    let ok = match m.retry_again(len, |o| m.mm.uffd.zeropage(addr + o, len - o, true)) {
        Ok(_) => true,
        Err(e) => {
            log::debug!("UFFDIO_ZEROPAGE over a huge unit at {addr:#x}: {e}");
            false
        }
    };
    let ok = ok
        && match m.mm.uffd.writeprotect(addr, len, true, true) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("UFFDIO_WRITEPROTECT over a huge unit at {addr:#x}: {e}");
                false
            }
        };
    if !ok {
        // Partly mapped by a racing path: undo and fall back to small pages.
        m.vm.warn_on(
            r.view.advise(u.offset(), len, Advice::DontNeed),
            "MADV_DONTNEED of view pages",
        );
        huge_memory::put_huge_zero_unit(m);
        drop(gs);
        return None;
    }
    for g in gs.iter_mut() {
        g.set(Pte::HugeZero);
    }
    drop(gs);
    m.vm.inc(Item::NrThpZeroMapped);
    m.vm.inc(Item::Pgfault);
    m.vm.inc(Item::ZeroPageFault);
    wake_pages(m, r, u, HPAGE_PMD_NR);
    Some(Fault::Done)
}

/// A write to the huge zero page: the unit is unmapped and 512 fresh frames take its place
/// (`do_huge_pmd_wp_page` on the huge zero page).
fn do_huge_pmd_wp_page(m: &MmInner, r: &RegionInner, idx: PgOff) -> Option<Fault> {
    let u = idx.round_down(HPAGE_PMD_NR);
    let Some(mut gs) = lock_unit(r, u, Pte::HugeZero) else {
        // Split meanwhile (partial discard): small zero pages now.
        return None;
    };
    m.vm.warn_on(
        r.view
            .advise(u.offset(), huge_memory::HPAGE_PMD_SIZE, Advice::DontNeed),
        "MADV_DONTNEED of view pages",
    );
    for g in gs.iter_mut() {
        g.set(Pte::None);
    }
    drop(gs);
    m.vm.sub(Item::NrThpZeroMapped, 1);
    huge_memory::put_huge_zero_unit(m);
    let res = do_anonymous_page_win(m, r, u, Some(HPAGE_PMD_NR.usize()));
    wake_pages(m, r, u, HPAGE_PMD_NR);
    m.vm.inc(Item::WpFault);
    Some(res.unwrap_or(Fault::Done))
}

/// Splits a huge-zero unit into small zero pages (a partial discard of it), dropping the unit's
/// reference with the old behaviour of seed 003.
pub(crate) fn split_huge_zero(m: &MmInner, r: &RegionInner, u: PgOff) {
    if u + HPAGE_PMD_NR > r.end() {
        return;
    }
    let Some(mut gs) = lock_unit(r, u, Pte::HugeZero) else {
        return;
    };
    for g in gs.iter_mut() {
        g.set(Pte::Zero);
    }
    drop(gs);
    m.vm.sub(Item::NrThpZeroMapped, 1);
    m.vm.add(Item::NrZeroPageMapped, HPAGE_PMD_NR);
    huge_memory::put_huge_zero_unit(m);
}

#[cfg(test)]
mod tests {
    use crate::mm::page::Pfn;
    use crate::mm::pool;
    use crate::{Mm, MmConfig, SwapConfig};
    use std::io::Write;

    /// A system call that writes into an empty pool slot (what a read straight into the slots
    /// would do if a slot it took for present were not) completes: the handler fills the slot
    /// with zeros instead of waking the access into the same fault forever.
    #[test]
    fn a_read_into_an_empty_pool_slot_completes() {
        let mm = Mm::new(MmConfig::new(4 << 20).swap(SwapConfig::None)).unwrap();
        let m = mm.inner();
        let frames: Vec<Pfn> = (0..64).map(Pfn::new).collect();
        let present = pool::slots_present(m, &frames);
        let f = frames[present.iter().position(|&p| !p).expect("an empty slot")];
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[0x5a; 4096]).unwrap();
        let lost = m.vm.get(crate::vmstat::Item::PoolSlotLost);
        m.pool.slots.pread_pages(&file, 0, &[f.offset()]).unwrap();
        let mut b = [0u8; 4096];
        m.pool.slots.read_bytes(f.offset(), &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0x5a));
        assert_eq!(m.vm.get(crate::vmstat::Item::PoolSlotLost), lost + 1);
        // The slot holds a page now; give it back as the pool expects a free frame's slot.
        m.pool.slots.dontneed_pages(&[f.offset()]).unwrap();
    }
}

/// Test hook: make the fault path's wakes count as failed (`mm_warn`, the soak's test of its
/// counter checks).
#[doc(hidden)]
pub(crate) mod inject {
    use std::sync::atomic::{AtomicU64, Ordering};

    static WAKE_WARNS: AtomicU64 = AtomicU64::new(0);

    /// The next `n` UFFDIO_WAKEs of the fault path are logged and counted as failed
    /// (`mm_warn`), as a real failure is; the wake itself still happens, so nothing waits.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn wake_warns(n: u64) {
        WAKE_WARNS.store(n, Ordering::SeqCst);
    }

    /// Test builds only (the `testing` feature, which the CLI's tests build it with):
    /// `USERMM_TEST_INJECT_MM_WARN=N` sets [`wake_warns`] when a manager is created, so a test
    /// can reach the hook in another process (`usermm bench soak`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn from_env() {
        if let Some(n) = std::env::var("USERMM_TEST_INJECT_MM_WARN")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            wake_warns(n);
        }
    }

    /// Whether this wake is to count as failed ([`wake_warns`]).
    pub(crate) fn wake_warn() -> bool {
        WAKE_WARNS.load(Ordering::Relaxed) > 0
            && WAKE_WARNS
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}
