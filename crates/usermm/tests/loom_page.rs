//! Model check (loom) of the page state machine: a fault on page 0 of a region racing two
//! reclaim passes over the same page, running the real critical sections of mm/page_state.rs
//! that the fault path and reclaim call (`frame_fault` for a resident page, `swapin_install`
//! for a swapped one, `shrink_page_list` with `page_check_references`, `add_to_swap` and
//! `__remove_mapping`) over the real descriptors (`Page`: PG_locked trylock, flags), page table
//! (pte lock bit) and LRU (`isolate_lru_pages`/`putback`). Only what lies outside them is
//! modelled ([`Model`]: the view, the pool slots and the swap copy, each a cell whose contents
//! the model checks on every move: a page is mapped only from where its data is, unmapped only
//! from the view, written to swap only from its slot).
//! The second model is the pool's deferred slot drop (`mm/zap.rs`): a batch flush racing the
//! free and reuse of a frame whose drop is queued.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p usermm --release --test loom_page`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU8, Ordering};
use loom::sync::Arc;
use usermm::mm::lru::{Lru, Lruvec};
use usermm::mm::page::{pg, MemMap, Owner, Pfn, PgOff, RegionId, SwapEntry};
use usermm::mm::page_state::{self, Fault, FaultEnv, ReclaimEnv, SwapinEnv};
use usermm::mm::pgtable::{PageTable, Pte};
use usermm::mm::replacement::ReplacementPolicy;
use usermm::sync::yield_now;
use usermm::vmstat::Counters;

const F0: Pfn = Pfn::new(0);
const F1: Pfn = Pfn::new(1);
const IDX: PgOff = PgOff::ZERO;
const SLOT: SwapEntry = SwapEntry::new(7);

/// A cell's contents: nothing, or the page's data.
const EMPTY: u8 = 0;
const DATA: u8 = 2;

/// Everything outside the critical sections: page 0's place in the view, the frames' pool
/// slots, the swap copy, and which frames are free.
struct Model {
    view: AtomicU8,
    slots: [AtomicU8; 2],
    swap: AtomicU8,
    free: [AtomicU8; 2],
}

struct World {
    pages: MemMap,
    lru: Lruvec,
    vm: Counters,
    pt: PageTable,
    model: Model,
}

/// Page 0 resident in frame 0, parked in its pool slot (unmapped by an earlier reference check,
/// referenced once), dirty (never written to swap), on the inactive list; frame 1 free.
fn world() -> Arc<World> {
    let w = World {
        pages: MemMap::new(2),
        lru: Lruvec::default(),
        vm: Counters::default(),
        pt: PageTable::new(4),
        model: Model {
            view: AtomicU8::new(EMPTY),
            slots: [AtomicU8::new(DATA), AtomicU8::new(EMPTY)],
            swap: AtomicU8::new(EMPTY),
            free: [AtomicU8::new(0), AtomicU8::new(1)],
        },
    };
    w.pages[F0].init(
        Owner::Anon(RegionId::new(0), IDX),
        pg::UPTODATE | pg::SWAPBACKED | pg::DIRTY | pg::REFERENCED,
    );
    w.pt.lock(IDX).set(Pte::Frame(F0));
    w.lru.add(&w.pages, &[F0], &w.vm);
    Arc::new(w)
}

fn get(c: &AtomicU8) -> u8 {
    c.load(Ordering::SeqCst)
}
fn put(c: &AtomicU8, v: u8) {
    c.store(v, Ordering::SeqCst)
}
fn slot(w: &World, f: Pfn) -> &AtomicU8 {
    &w.model.slots[f.idx()]
}

impl FaultEnv for World {
    fn view_present(&self, _idx: PgOff) -> bool {
        get(&self.model.view) == DATA
    }
    fn note_stale(&self, idx: PgOff, pte: Pte) {
        panic!("a stale entry {pte:?} at page {idx}: the view lost a mapped page");
    }
    fn ensure_parked(&self, f: Pfn) -> bool {
        get(slot(self, f)) == DATA
    }
    fn try_to_free_swap(&self, f: Pfn) {
        let p = &self.pages[f];
        if p.test_clear(pg::SWAPCACHE) {
            put(&self.model.swap, EMPTY);
        }
        p.set(pg::DIRTY);
    }
    fn unprotect(&self, _idx: PgOff, _n: u64) {}
    fn write_window(&self, _idx: PgOff) -> u64 {
        1
    }
    fn write_expected(&self, _idx: PgOff) -> bool {
        false
    }
    fn writes_advance(&self, _idx: PgOff, _next: PgOff) {}
    fn place(&self, _idx: PgOff, f: Pfn, _wp: bool) -> bool {
        assert_eq!(get(&self.model.free[f.idx()]), 0, "mapping free frame {f}");
        assert_eq!(
            get(slot(self, f)),
            DATA,
            "mapping frame {f} whose slot is empty"
        );
        assert_eq!(get(&self.model.view), EMPTY, "mapping over a mapped page");
        put(slot(self, f), EMPTY);
        put(&self.model.view, DATA);
        true
    }
    fn ra_hit(&self) {}
    fn wake(&self, _idx: PgOff, _n: u64) {}
}

impl SwapinEnv for World {
    fn add_to_swap_cache(&self, _entry: SwapEntry, _f: Pfn) {}
    fn swap_free(&self, _entry: SwapEntry) {
        put(&self.model.swap, EMPTY);
    }
    fn place_read(&self, _idx: PgOff, f: Pfn, _wp: bool) {
        assert_eq!(get(&self.model.view), EMPTY, "swap-in over a mapped page");
        assert_eq!(
            get(&self.model.free[f.idx()]),
            1,
            "swap-in into a used frame"
        );
        put(&self.model.free[f.idx()], 0);
        put(&self.model.view, DATA);
    }
}

impl ReclaimEnv for World {
    fn try_to_unmap(&self, frames: &[Pfn]) {
        for &f in frames {
            let p = &self.pages[f];
            assert!(p.test(pg::LOCKED), "unmapping an unlocked page");
            assert_eq!(
                get(&self.model.view),
                DATA,
                "unmapping a page not in the view"
            );
            put(&self.model.view, EMPTY);
            put(slot(self, f), DATA);
            p.clear(pg::MAPPED | pg::WP);
        }
    }
    fn get_swap_pages(&self, n: usize, out: &mut Vec<SwapEntry>) {
        out.extend(std::iter::repeat_n(SLOT, n));
    }
    fn add_to_swap_cache(&self, _entry: SwapEntry, _f: Pfn) {}
    fn pageout(&self, ready: &[Pfn]) -> Vec<Pfn> {
        for &f in ready {
            let p = &self.pages[f];
            if p.test_clear(pg::DIRTY) {
                assert_eq!(
                    get(slot(self, f)),
                    DATA,
                    "writing frame {f} without its data"
                );
                put(&self.model.swap, DATA);
            }
        }
        Vec::new()
    }
    fn with_page_table<T>(
        &self,
        rid: RegionId,
        idx: PgOff,
        op: impl FnOnce(Option<&PageTable>) -> T,
    ) -> T {
        assert_eq!((rid, idx), (RegionId::new(0), IDX));
        op(Some(&self.pt))
    }
    fn evicted(&self, _entry: SwapEntry) {}
    fn swap_free(&self, _entry: SwapEntry) {
        put(&self.model.swap, EMPTY);
    }
    fn free_frames(&self, frames: &[Pfn]) {
        for &f in frames {
            self.pages[f].reset_flags(0);
            put(slot(self, f), EMPTY);
            put(&self.model.free[f.idx()], 1);
        }
    }
}

/// A thread touching page 0: it faults until the page is in the view (the fault path's
/// dispatch on the entry, as mm/memory.rs's `handle_fault`), with the real critical sections.
fn touch(w: &World, write: bool) {
    loop {
        let pte = w.pt.get(IDX);
        // The access itself: a read of a mapped page, a write of a mapped writable page succeed;
        // a write of a write-protected one is a write-protect fault.
        let mut wp = false;
        if get(&w.model.view) == DATA {
            match pte {
                _ if !write => return,
                Pte::Frame(f) if !w.pages[f].test(pg::WP) => return,
                _ => wp = true,
            }
        }
        match pte {
            Pte::Frame(f) => {
                match page_state::frame_fault(&w.pages, &w.pt, &w.vm, w, IDX, f, write, wp) {
                    // Done: the thread is woken and accesses the page again (the loop).
                    Some(Fault::Done) | None => {}
                    Some(Fault::Retry) => yield_now(),
                }
            }
            Pte::Swap(s) => {
                // do_swap_page: the frame is taken from the free ones, then the entry is
                // locked and checked again before the read.
                let mut g = w.pt.lock(IDX);
                if g.get() != Pte::Swap(s) {
                    continue;
                }
                assert_eq!(get(&w.model.swap), DATA, "swapping in a slot without data");
                let f = if get(&w.model.free[0]) == 1 { F0 } else { F1 };
                page_state::swapin_install(
                    &w.pages,
                    &w.lru,
                    &w.vm,
                    w,
                    &mut g,
                    Owner::Anon(RegionId::new(0), IDX),
                    IDX,
                    s,
                    f,
                    !write,
                    false,
                    Vec::new(),
                );
            }
            other => panic!("unexpected entry {other:?}"),
        }
    }
}

/// One reclaim pass over the inactive list: isolate (trylock) and the real `shrink_page_list`.
fn reclaim(w: &World) {
    let mut iso = Vec::new();
    w.lru
        .isolate_lru_pages(&w.pages, Lru::InactiveAnon, 1, 1, false, &mut iso, &w.vm);
    for &f in &iso {
        assert!(w.pages[f].test(pg::LOCKED), "isolated pages are locked");
    }
    page_state::shrink_page_list(&w.pages, &w.lru, &w.vm, w, iso, true, true);
}

/// Whatever the interleaving: exactly one consistent home for the page. Resident: one frame,
/// up to date, unlocked, on the LRU, its data in the view (mapped) or its slot (parked), the
/// other frame free. Swapped: both frames free and the swap copy holds the data.
fn check_one_home(w: &World) {
    match w.pt.get(IDX) {
        Pte::Frame(f) => {
            let p = &w.pages[f];
            assert!(p.test(pg::UPTODATE), "a resident page must be uptodate");
            assert!(!p.test(pg::LOCKED), "no lock left held");
            assert!(p.test(pg::LRU), "a resident page must be on an LRU list");
            assert_eq!(get(&w.model.free[f.idx()]), 0, "the page's frame is free");
            let o = if f == F0 { F1 } else { F0 };
            assert!(
                !w.pages[o].test(pg::LRU),
                "the freed frame must not stay on the LRU"
            );
            let here = if p.test(pg::MAPPED) {
                &w.model.view
            } else {
                slot(w, f)
            };
            assert_eq!(get(here), DATA, "the page's data is where its flags say");
            if p.test(pg::SWAPCACHE) && !p.test(pg::DIRTY) {
                assert_eq!(
                    get(&w.model.swap),
                    DATA,
                    "a clean swap-cache page has its copy"
                );
            }
        }
        Pte::Swap(_) => {
            assert!(
                !w.pages[F0].test(pg::LRU) && !w.pages[F1].test(pg::LRU),
                "a swapped page has no frame"
            );
            assert_eq!(
                get(&w.model.swap),
                DATA,
                "a swapped page's copy holds its data"
            );
            assert_eq!(
                get(&w.model.view),
                EMPTY,
                "a swapped page is not in the view"
            );
        }
        other => panic!("entry is {other:?}"),
    }
}

/// loom's exhaustive search, with at most `LOOM_MAX_PREEMPTIONS` (default 3) forced preemptions
/// per execution (loom's recommended bound: bugs need few preemptions).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// A thread touching page 0 (reading or writing) while two reclaim passes run.
fn touch_races_reclaim(write: bool) {
    model(move || {
        let w = world();
        let w1 = w.clone();
        let t = loom::thread::spawn(move || touch(&w1, write));
        reclaim(&w);
        reclaim(&w);
        t.join().unwrap();
        check_one_home(&w);
    });
}

#[test]
fn fault_races_reclaim() {
    touch_races_reclaim(false);
}

/// The same race with a writing thread: a write to a clean swap-cache page drops its swap copy
/// (`do_wp_page`), a write fault on a swapped page frees the slot.
#[test]
fn write_fault_races_reclaim() {
    touch_races_reclaim(true);
}

/// A pool slot holding a stale copy, in the zap model.
const STALE: u8 = 1;

#[test]
fn slot_drop_never_lands_on_a_reused_frame() {
    use usermm::mm::zap::ZapQueue;
    loom::model(|| {
        // Frame 0's page was copied into its view: its slot holds a stale copy, queued.
        let pages = Arc::new(MemMap::new(2));
        pages[F0].init(Owner::Anon(RegionId::new(0), PgOff::ZERO), pg::MAPPED);
        let slot = Arc::new(AtomicU8::new(STALE));
        let q = Arc::new(ZapQueue::default());
        assert!(!q.push(&pages, F0));
        let (p1, s1, q1) = (pages.clone(), slot.clone(), q.clone());
        // The flusher: drops every queued slot.
        let t = loom::thread::spawn(move || {
            q1.flush(&p1, |frames| {
                for &f in frames {
                    assert_eq!(f, F0);
                    s1.store(EMPTY, Ordering::SeqCst);
                }
            });
        });
        // Meanwhile the page is discarded, its frame freed and reused by a new page.
        pages[F0].reset_flags(0);
        if q.settle_free(&pages, F0) {
            // Kept as a recycled page: the new user overwrites it in place.
            assert!(pages[F0].test(pg::POOLED));
            assert_eq!(
                slot.load(Ordering::SeqCst),
                STALE,
                "a pooled slot holds its page"
            );
        } else {
            // The drop has landed: the new user fills an empty slot (UFFDIO_COPY; a page
            // still there would be EEXIST).
            assert_eq!(
                slot.load(Ordering::SeqCst),
                EMPTY,
                "the drop landed before the flag cleared"
            );
        }
        slot.store(DATA, Ordering::SeqCst);
        t.join().unwrap();
        assert_eq!(
            slot.load(Ordering::SeqCst),
            DATA,
            "a drop landed on the reused frame"
        );
        assert!(!pages[F0].test(pg::ZAPPENDING));
    });
}
