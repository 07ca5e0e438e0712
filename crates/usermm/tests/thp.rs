//! Huge fault units and the huge zero page (seed 003). One test function: the huge zero page's
//! reference count is process-wide, so the cases run in sequence.

use usermm::mm::huge_memory::{
    huge_zero_page_allocated, huge_zero_refcount, shrink_huge_zero_page,
};
use usermm::vmstat::Counters;
use usermm::{Behaviour, Mm, MmConfig, Settings, SwapConfig, Switch};

const MIB: usize = 1 << 20;

fn mm(b: Behaviour) -> Mm {
    let mut cfg = MmConfig::new(8 << 20)
        .swap(SwapConfig::Ram { size: 64 << 20 })
        .settings(Settings::default().with(Switch::HugeZeroRefcount, b));
    cfg.thp = true;
    Mm::new(cfg).unwrap()
}

#[test]
fn huge_zero_page_and_huge_faults() {
    let base = huge_zero_refcount();
    assert_eq!(
        base, 0,
        "nothing else in this process maps the huge zero page"
    );
    for b in [Behaviour::New, Behaviour::Old] {
        let m = mm(b);
        let r = m.map_anon(64 * MIB).unwrap();
        assert_eq!(
            r.as_ptr() as usize % (2 * MIB),
            0,
            "huge regions are 2 MiB aligned"
        );
        // Read every 2 MiB: one huge-zero fault per unit, no budget.
        for off in (0..r.len()).step_by(2 * MIB) {
            assert_eq!(r.read_u64(off), 0);
        }
        let v = m.vmstat();
        assert_eq!(v.val("nr_thp_zero_mapped"), 32, "{b:?}");
        assert_eq!(v.val("zero_page_fault"), 32, "{b:?}");
        assert_eq!(m.resident_bytes(), 0);
        // Reads elsewhere in a unit do not fault again.
        assert_eq!(r.read_u64(MIB + 8), 0);
        assert_eq!(m.vmstat().val("pgfault"), 32);
        // The switch: references on the global counter.
        match b {
            Behaviour::New => {
                assert_eq!(v.val("thp_zero_page_get"), 1, "once per manager");
                assert_eq!(huge_zero_refcount(), 2, "the manager's + the shrinker's");
            }
            Behaviour::Old => {
                assert_eq!(v.val("thp_zero_page_get"), 32, "once per mapping");
                assert_eq!(huge_zero_refcount(), 33);
            }
        }
        // A write replaces a unit with 512 fresh frames.
        r.write_u64(4 * MIB + 16, 0xabcd);
        let v = m.vmstat();
        assert_eq!(v.val("thp_fault_alloc"), 1, "{v}");
        assert_eq!(v.val("nr_thp_zero_mapped"), 31);
        assert_eq!(m.resident_bytes(), 2 * MIB as u64);
        assert_eq!(r.read_u64(4 * MIB + 16), 0xabcd);
        assert_eq!(r.read_u64(4 * MIB + 24), 0);
        assert_eq!(r.read_u64(6 * MIB - 8), 0);
        // Writing an untouched unit of a fresh region maps a huge page directly.
        let w = m.map_anon(4 * MIB).unwrap();
        w.write_u64(0, 1);
        assert_eq!(m.vmstat().val("thp_fault_alloc"), 2);
        // A partial discard splits a huge-zero unit into small zero pages.
        r.discard(8 * MIB, 4096).unwrap();
        let v = m.vmstat();
        assert_eq!(v.val("nr_thp_zero_mapped"), 30, "{v}");
        assert_eq!(v.val("nr_zero_page_mapped"), 511);
        assert_eq!(r.read_u64(8 * MIB), 0);
        assert_eq!(r.read_u64(8 * MIB + 4096), 0);
        // Whole-unit writes past the budget swap like small pages and come back.
        for off in (0..r.len()).step_by(4096) {
            r.write_u64(off, off as u64 ^ 0x55);
        }
        for off in (0..r.len()).step_by(4096) {
            assert_eq!(r.read_u64(off), off as u64 ^ 0x55);
        }
        let v = m.vmstat();
        assert!(v.val("pswpout") > 0);
        match b {
            // The manager's reference keeps the page until teardown.
            Behaviour::New => assert_eq!(v.val("thp_zero_page_free"), 0),
            // Every unit was written: the last use went away and reclaim's shrinker freed it.
            Behaviour::Old => assert_eq!(v.val("thp_zero_page_free"), 1, "{v}"),
        }
        drop(r);
        drop(w);
        drop(m);
        if b == Behaviour::New {
            assert_eq!(
                huge_zero_refcount(),
                1,
                "only the shrinker's reference is left"
            );
            assert!(huge_zero_page_allocated());
            let vm = Counters::default();
            assert!(shrink_huge_zero_page(&vm));
        }
        assert_eq!(huge_zero_refcount(), 0);
        assert!(!huge_zero_page_allocated());
    }
    // THP off: small zero pages, no huge-zero references.
    let m = Mm::new(MmConfig::new(8 << 20).swap(SwapConfig::None)).unwrap();
    let r = m.map_anon(4 * MIB).unwrap();
    assert_eq!(r.read_u64(0), 0);
    let v = m.vmstat();
    assert_eq!(v.val("nr_thp_zero_mapped"), 0);
    assert_eq!(v.val("thp_zero_page_get"), 0);
}
