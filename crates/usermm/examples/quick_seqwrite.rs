//! Scratch: sequential write of TOTAL MiB through a 256 MiB budget.
use std::time::Instant;
use usermm::{Mm, MmConfig, SwapConfig};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total: usize = args.get(1).map_or(1024, |s| s.parse().unwrap()) << 20;
    let ram = args.get(2).is_some_and(|s| s == "ram");
    let swap = if ram {
        SwapConfig::Ram { size: 1 << 30 }
    } else {
        SwapConfig::File {
            path: None,
            size: 1 << 30,
        }
    };
    let budget: usize = args.get(3).map_or(256, |s| s.parse().unwrap()) << 20;
    let mm = Mm::new(MmConfig::new(budget as u64).swap(swap)).unwrap();
    let r = mm.map_anon(total).unwrap();
    let t = Instant::now();
    let mut off = 0;
    while off < total {
        r.write_u64(off, off as u64);
        off += 4096;
    }
    let el = t.elapsed().as_secs_f64();
    println!(
        "write {:.0} MiB/s ({el:.2}s)",
        total as f64 / el / 1048576.0
    );
    let vm = mm.vmstat();
    for (k, v) in vm.iter().filter(|(_, v)| *v > 0) {
        print!("{k}={v} ");
    }
    println!("\npeak {} MiB", mm.peak_resident_bytes() >> 20);
}
