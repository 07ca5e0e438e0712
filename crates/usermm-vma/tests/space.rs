//! The address-space layer on a real manager: partial unmap, holes, MAP_FIXED over managed
//! memory, discard, malloc lookups, segments.

use usermm::{Mm, MmConfig, SwapConfig};
use usermm_vma::{Coverage, Kind, Segment, Space, PAGE};

fn mm() -> Mm {
    Mm::new(MmConfig::new(8 << 20).swap(SwapConfig::Ram { size: 32 << 20 })).unwrap()
}

#[test]
fn partial_unmap_keeps_the_rest_and_drops_the_region_with_its_last_page() {
    let mm = mm();
    let s = Space::new();
    let r = mm.map_anon(16 * PAGE).unwrap();
    for i in 0..16 {
        r.write_u64(i * PAGE, i as u64 + 1);
    }
    let a = s.insert(r, Kind::Mmap);
    assert_eq!(s.coverage(a, 16 * PAGE), Coverage::Full);
    assert_eq!(s.coverage(a - PAGE, 2 * PAGE), Coverage::Partial);
    assert_eq!(s.coverage(a + 16 * PAGE, PAGE), Coverage::None);
    assert!(s.unmap(a + 4 * PAGE, 4 * PAGE).is_empty());
    let v = s.find(a).unwrap();
    assert_eq!(v.live_pages, 12);
    assert_eq!(
        v.region.read_u64(4 * PAGE),
        0,
        "unmapped pages are discarded"
    );
    assert_eq!(v.region.read_u64(3 * PAGE), 4);
    assert_eq!(v.region.read_u64(8 * PAGE), 9);
    assert!(!s.all_live(a, 16 * PAGE));
    assert!(s.all_live(a, 4 * PAGE));
    // MAP_FIXED over a hole and live pages: zeros, all live again.
    assert!(s.map_fixed(a + 3 * PAGE, 2 * PAGE));
    assert_eq!(s.find(a).unwrap().live_pages, 13);
    assert_eq!(v.region.read_u64(3 * PAGE), 0);
    assert!(
        !s.map_fixed(a + 15 * PAGE, 2 * PAGE),
        "past the end is not managed"
    );
    drop(v);
    assert_eq!(mm.nr_regions(), 1);
    assert!(s.unmap(a, 8 * PAGE).is_empty());
    let gone = s.unmap(a + 8 * PAGE, 8 * PAGE);
    assert_eq!(gone.len(), 1);
    assert!(s.find(a).is_none());
    drop(gone);
    assert_eq!(mm.nr_regions(), 0);
    assert_eq!(mm.commit().0, 0);
}

#[test]
fn segments_split_managed_and_unmanaged() {
    let mm = mm();
    let s = Space::new();
    let a = s.insert(mm.map_anon(4 * PAGE).unwrap(), Kind::Mmap);
    let segs = s.segments(a - PAGE, 6 * PAGE);
    assert_eq!(
        segs,
        vec![
            Segment {
                addr: a - PAGE,
                len: PAGE,
                managed: false
            },
            Segment {
                addr: a,
                len: 4 * PAGE,
                managed: true
            },
            Segment {
                addr: a + 4 * PAGE,
                len: PAGE,
                managed: false
            },
        ]
    );
    assert!(!s.might_overlap(a + 4 * PAGE + (1 << 30), PAGE));
}

#[test]
fn malloc_allocations_are_found_by_their_pointer_only() {
    let mm = mm();
    let s = Space::new();
    let r = mm.map_anon(4 * PAGE).unwrap();
    let start = r.as_ptr() as usize;
    let ptr = start + PAGE;
    s.insert(r, Kind::Malloc { ptr });
    let (_, usable) = s.malloc_lookup(ptr).unwrap();
    assert_eq!(usable, 3 * PAGE);
    assert!(s.malloc_lookup(start).is_none());
    assert!(s.take_malloc(start).is_none());
    assert!(s.take_malloc(ptr).is_some());
    assert!(s.find(ptr).is_none());
}

#[test]
fn discard_zeroes_only_managed_pages() {
    let mm = mm();
    let s = Space::new();
    let r = mm.map_anon(4 * PAGE).unwrap();
    for i in 0..4 {
        r.write_u64(i * PAGE, 7);
    }
    let a = s.insert(r, Kind::Mmap);
    s.discard(a + PAGE, 2 * PAGE);
    let v = s.find(a).unwrap();
    let got: Vec<u64> = (0..4).map(|i| v.region.read_u64(i * PAGE)).collect();
    assert_eq!(got, vec![7, 0, 0, 7]);
    assert_eq!(v.live_pages, 4);
}
