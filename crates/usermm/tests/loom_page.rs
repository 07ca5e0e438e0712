//! Model check (loom) of the page state machine: a fault on a resident page racing reclaim of
//! the same page, using the real descriptors (`Page`: PG_locked trylock, flags), page table
//! (pte lock bit) and LRU (`isolate`/`putback`), with the lock order and steps that
//! `mm/memory.rs` (frame_fault, do_swap_page) and `mm/vmscan.rs` (shrink_page_list) follow.
//! The second model is the pool's deferred slot drop (`mm/zap.rs`): a batch flush racing the
//! free and reuse of a frame whose drop is queued.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p usermm --release --test loom_page`.
#![cfg(loom)]

use loom::sync::Arc;
use usermm::mm::lru::{Lru, Lruvec};
use usermm::mm::page::{pg, MemMap, Owner, Pfn, PgOff, RegionId, SwapEntry};
use usermm::mm::pgtable::{PageTable, Pte};
use usermm::mm::replacement::ReplacementPolicy;
use usermm::sync::yield_now;
use usermm::vmstat::Counters;

const F0: Pfn = Pfn::new(0);
const F1: Pfn = Pfn::new(1);

struct World {
    pages: MemMap,
    lru: Lruvec,
    vm: Counters,
    pt: PageTable,
}

fn world() -> Arc<World> {
    let w = World {
        pages: MemMap::new(2),
        lru: Lruvec::default(),
        vm: Counters::default(),
        pt: PageTable::new(4),
    };
    w.pages[F0].init(
        Owner::Anon(RegionId::new(0), PgOff::ZERO),
        pg::UPTODATE | pg::SWAPBACKED | pg::DIRTY | pg::MAPPED,
    );
    w.pages[F0].clear(pg::MAPPED); // parked: unmapped by an earlier reference check
    w.pages[F0].set(pg::REFERENCED);
    {
        let mut g = w.pt.lock(PgOff::ZERO);
        g.set(Pte::Frame(F0));
    }
    w.lru.add(&w.pages, &[F0], &w.vm);
    Arc::new(w)
}

/// The fault path: trylock the page (defer = yield and retry), then the pte lock, re-check,
/// map. A swapped entry is a major fault into frame 1.
fn fault(w: &World) {
    loop {
        match w.pt.get(PgOff::ZERO) {
            Pte::Frame(f) => {
                let p = &w.pages[f];
                if !p.trylock() {
                    yield_now();
                    continue;
                }
                let g = w.pt.lock(PgOff::ZERO);
                if g.get() != Pte::Frame(f) {
                    drop(g);
                    p.unlock();
                    continue;
                }
                assert!(p.test(pg::UPTODATE), "mapping a page that reclaim freed");
                p.set(pg::MAPPED);
                drop(g);
                p.unlock();
                return;
            }
            Pte::Swap(_) => {
                let mut g = w.pt.lock(PgOff::ZERO);
                if !matches!(g.get(), Pte::Swap(_)) {
                    continue;
                }
                w.pages[F1].init(
                    Owner::Anon(RegionId::new(0), PgOff::ZERO),
                    pg::UPTODATE | pg::SWAPBACKED | pg::MAPPED,
                );
                g.set(Pte::Frame(F1));
                drop(g);
                w.lru.add(&w.pages, &[F1], &w.vm);
                return;
            }
            other => panic!("unexpected entry {other:?}"),
        }
    }
}

/// One reclaim pass over the inactive list: isolate (trylock), check references, unmap or
/// write out and `__remove_mapping` under the pte lock.
fn reclaim(w: &World) {
    let mut iso = Vec::new();
    w.lru
        .isolate_lru_pages(&w.pages, Lru::InactiveAnon, 1, 1, false, &mut iso, &w.vm);
    for f in iso {
        let p = &w.pages[f];
        assert!(p.test(pg::LOCKED), "isolated pages are locked");
        let referenced_ptes = p.test(pg::MAPPED);
        if referenced_ptes {
            p.clear(pg::MAPPED); // unmap: clear the young bit
            w.lru.putback(&w.pages, &[f], &w.vm);
            continue;
        }
        // pageout + __remove_mapping
        let mut g = w.pt.lock(PgOff::ZERO);
        assert_eq!(
            g.get(),
            Pte::Frame(f),
            "the entry cannot change while reclaim holds the page"
        );
        g.set(Pte::Swap(SwapEntry::new(7)));
        drop(g);
        p.reset_flags(0);
    }
}

#[test]
fn fault_races_reclaim() {
    loom::model(|| {
        let w = world();
        let w1 = w.clone();
        let t = loom::thread::spawn(move || fault(&w1));
        reclaim(&w);
        reclaim(&w);
        t.join().unwrap();
        // Whatever the interleaving: exactly one consistent home for the page. Resident: one
        // frame, uptodate, unlocked, on the LRU, the other frame free. Swapped: no frame holds it.
        match w.pt.get(PgOff::ZERO) {
            Pte::Frame(f) => {
                let p = &w.pages[f];
                assert!(p.test(pg::UPTODATE), "a resident page must be uptodate");
                assert!(!p.test(pg::LOCKED), "no lock left held");
                assert!(p.test(pg::LRU), "a resident page must be on an LRU list");
                assert!(
                    !w.pages[if f == F0 { F1 } else { F0 }].test(pg::LRU),
                    "the freed frame must not stay on the LRU"
                );
            }
            Pte::Swap(_) => {
                assert!(
                    !w.pages[F0].test(pg::LRU) && !w.pages[F1].test(pg::LRU),
                    "a swapped page has no frame"
                );
            }
            other => panic!("entry is {other:?}"),
        }
    });
}

/// A pool slot's contents in the zap model.
const EMPTY: u8 = 0;
const STALE: u8 = 1;
const DATA: u8 = 2;

#[test]
fn slot_drop_never_lands_on_a_reused_frame() {
    use loom::sync::atomic::{AtomicU8, Ordering};
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
