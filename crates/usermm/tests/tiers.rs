//! Swap tiers under a live memory manager: a zswap pool in front of the on-demand RAM device,
//! with mixed page contents, verified word by word, and slots given back when freed.

use std::sync::Arc;

use usermm::swap::{Compressor, RamSwap, SwapDevice, Zswap};
use usermm::{Mm, MmConfig, SwapConfig};

const P: usize = 4096;

/// Page `k`'s word `i`: pages cycle through zero, same-filled, compressible and random.
fn word(k: usize, i: usize, seed: u64) -> u64 {
    let mut x = (k as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 29;
    match k % 4 {
        0 => 0,
        1 => 0x5a5a_0000_0000_0000 | k as u64,
        2 => x & 0x3f,
        _ => x,
    }
}

#[test]
fn zswap_over_ram_under_a_manager() {
    let _ = env_logger::builder().is_test(true).try_init();
    let ram = Arc::new(RamSwap::new(96 << 20).unwrap());
    let zswap = Arc::new(Zswap::new(ram.clone(), Compressor::Lz4, 1 << 20));
    let dev: Arc<dyn SwapDevice> = zswap.clone();
    let budget = 8 << 20;
    let mm = Mm::new(MmConfig::new(budget).swap(SwapConfig::Device(dev))).unwrap();
    let tiers = mm.swap_tiers();
    assert_eq!(tiers.len(), 2, "{:?}", tiers);
    assert!(tiers[0].0.starts_with("zswap(lz4"), "{}", tiers[0].0);
    assert!(tiers[1].0.starts_with("ram"), "{}", tiers[1].0);

    let len = 32 << 20;
    let r = mm.map_anon(len).unwrap();
    for pass in 0..2u64 {
        for k in 0..len / P {
            for i in 0..P / 8 {
                r.write_u64(k * P + i * 8, word(k, i, pass));
            }
        }
        for k in 0..len / P {
            for i in 0..P / 8 {
                let got = r.read_u64(k * P + i * 8);
                assert_eq!(got, word(k, i, pass), "pass {pass} page {k} word {i}");
            }
        }
    }
    let vm = mm.vmstat();
    eprintln!("{vm}");
    for c in [
        "zswpout",
        "zswpin",
        "zswpwb",
        "zswap_reject_compress_poor",
        "pswpout",
        "pswpin",
    ] {
        assert!(vm.val(c) > 0, "{c} = 0");
    }
    assert!(vm.val("zswap_same_filled") > 0);
    assert!(vm.val("zswap_pool_bytes") <= (1 << 20) + (1 << 17));
    assert!(mm.peak_resident_bytes() <= budget);
    // The counters vmstat shows are the tier's own.
    assert_eq!(
        vm.val("zswpout"),
        zswap
            .counters()
            .iter()
            .find(|c| c.0 == "zswpout")
            .unwrap()
            .1
    );

    // Unmapping frees every slot: the pool empties and the RAM device gives its pages back
    // (all but at most the cluster allocation continues in, and the warm clusters it keeps for
    // reuse, at most an eighth of the device).
    drop(r);
    let vm = mm.vmstat();
    assert_eq!(vm.val("zswap_stored_pages"), 0);
    assert_eq!(vm.val("zswap_pool_bytes"), 0);
    assert_eq!(vm.val("nr_swap_used"), 0);
    let left = ram.resident_bytes().unwrap();
    let warm = ram.warm_pages();
    assert!(warm <= ram.nr_pages() / 8, "{warm} warm pages");
    assert!(
        left <= (256 + warm) * P as u64,
        "the RAM device still holds {left} bytes ({warm} warm pages)"
    );
}

#[test]
fn zswap_spec_opens_under_a_manager() {
    let cfg = MmConfig::new(8 << 20)
        .swap(SwapConfig::parse("zswap:zstd,pool=25%+ram", 32 << 20).unwrap());
    let mm = Mm::new(cfg).unwrap();
    assert!(
        mm.swap_name()
            .starts_with("zswap(zstd:3, pool max 2097152 bytes)+ram"),
        "{}",
        mm.swap_name()
    );
    let r = mm.map_anon(24 << 20).unwrap();
    for off in (0..r.len()).step_by(64) {
        r.write_u64(off, (off as u64) & 0xffff);
    }
    for off in (0..r.len()).step_by(64) {
        assert_eq!(r.read_u64(off), (off as u64) & 0xffff, "offset {off}");
    }
    let vm = mm.vmstat();
    assert!(vm.val("zswpout") > 0 && vm.val("zswpin") > 0, "{vm}");
}

/// The bytes `ram` holds once kswapd's trims (about every 200 ms while it is idle) brought them
/// to at most `limit`, or after five seconds of waiting.
fn ram_held_after_trims(ram: &RamSwap, limit: u64) -> u64 {
    let mut left = 0;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = ram.resident_bytes().unwrap();
        if left <= limit {
            break;
        }
    }
    left
}

#[test]
fn the_ram_device_gives_back_what_it_kept_once_the_program_stops_swapping() {
    // Below the device's bound of warm pages (an eighth of 64 MiB), freed slots are kept for
    // reuse, but only while the program swaps: unused for the idle age, they go back.
    let ram = Arc::new(RamSwap::new(64 << 20).unwrap());
    ram.set_idle_age(std::time::Duration::from_millis(300));
    let mm = Mm::new(MmConfig::new(4 << 20).swap(SwapConfig::Device(ram.clone()))).unwrap();
    let r = mm.map_anon(12 << 20).unwrap();
    let pages = r.len() / P;
    for p in 0..pages {
        r.write_u64(p * P, p as u64 * 5 + 3);
    }
    let held = ram.resident_bytes().unwrap();
    assert!(held >= 6 << 20, "{held} bytes on the device");
    // All but one page in 64 let go: whole clusters discarded, and single slots freed in the
    // clusters of the pages kept.
    for p in (0..pages).filter(|p| p % 64 != 0) {
        r.discard(p * P, P).unwrap();
    }
    let kept = pages.div_ceil(64) as u64;
    let left = ram_held_after_trims(&ram, kept * P as u64);
    assert!(
        left <= kept * P as u64,
        "the device still holds {left} bytes for at most {kept} live pages ({} warm)",
        ram.warm_pages()
    );
    assert_eq!(ram.warm_pages(), 0);
    for p in 0..pages {
        let want = if p % 64 == 0 { p as u64 * 5 + 3 } else { 0 };
        assert_eq!(r.read_u64(p * P), want, "page {p}");
    }
}

/// A program whose swap shrinks: the RAM device gives back the slots freed inside clusters
/// that still hold live pages once they waited unused (kswapd's `trim`), keeping the live
/// pages and at most its bound of freed ones.
#[test]
fn the_ram_device_gives_back_what_a_shrunk_swap_left_free() {
    let ram = Arc::new(RamSwap::new(64 << 20).unwrap());
    ram.set_warm_age(std::time::Duration::ZERO);
    let mm = Mm::new(MmConfig::new(4 << 20).swap(SwapConfig::Device(ram.clone()))).unwrap();
    let r = mm.map_anon(32 << 20).unwrap();
    let pages = r.len() / P;
    for p in 0..pages {
        r.write_u64(p * P, p as u64 * 7 + 1);
    }
    let held = ram.resident_bytes().unwrap();
    assert!(held >= 24 << 20, "{held} bytes on the device");
    // Every other page let go: half the slots freed, no cluster wholly free.
    for p in (1..pages).step_by(2) {
        r.discard(p * P, P).unwrap();
    }
    let bound = (ram.nr_pages() / 8).min(usermm::swap::ram::WARM_MAX_BYTES / P as u64);
    let left = ram_held_after_trims(&ram, (pages as u64 / 2 + bound) * P as u64);
    assert!(
        left <= (pages as u64 / 2 + bound) * P as u64,
        "the device still holds {left} bytes for {} live pages ({} warm)",
        pages / 2,
        ram.warm_pages()
    );
    for p in (0..pages).step_by(2) {
        assert_eq!(r.read_u64(p * P), p as u64 * 7 + 1, "page {p}");
    }
    for p in (1..pages).step_by(2).take(64) {
        assert_eq!(r.read_u64(p * P), 0, "let-go page {p}");
    }
}
