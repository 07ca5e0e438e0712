use usermm::{Mm, MmConfig, SwapConfig};

#[test]
fn write_beyond_budget_and_read_back() {
    let _ = env_logger::builder().is_test(true).try_init();
    let budget = 8 << 20;
    let mm = Mm::new(MmConfig::new(budget).swap(SwapConfig::Ram { size: 64 << 20 })).unwrap();
    let r = mm.map_anon(32 << 20).unwrap();
    let words = r.len() / 8;
    for i in (0..words).step_by(64) {
        r.write_u64(i * 8, i as u64 ^ 0xdead_beef);
    }
    let vm = mm.vmstat();
    eprintln!("{vm}");
    assert!(vm.val("pswpout") > 0);
    assert!(mm.peak_resident_bytes() <= budget);
    for i in (0..words).step_by(64) {
        assert_eq!(r.read_u64(i * 8), i as u64 ^ 0xdead_beef, "word {i}");
    }
    let vm = mm.vmstat();
    eprintln!("{vm}");
    assert!(vm.val("pswpin") > 0);
}
