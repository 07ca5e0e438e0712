use usermm::{Mm, MmConfig, SwapConfig};
fn main() {
    let mm = Mm::new(
        MmConfig::new(2 << 20)
            .swap(SwapConfig::Ram { size: 32 << 20 })
            .handler_threads(2),
    )
    .unwrap();
    let mut s: u64 = 88172645463325252;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut regs: Vec<usermm::Region> = (0..4).map(|_| mm.map_anon(512 * 4096).unwrap()).collect();
    for step in 0..std::env::args()
        .nth(1)
        .map_or(20000, |a| a.parse().unwrap())
    {
        let r = (rnd() % 4) as usize;
        let pages = regs[r].len() / 4096;
        let p = (rnd() as usize) % pages;
        let op = rnd() % 10;
        let desc;
        match op {
            0..=2 => {
                let n = (rnd() % 100) as usize;
                for q in p..(p + n).min(pages) {
                    regs[r].write_u64(q * 4096 + 8, q as u64);
                }
                desc = format!("fill r{r} p{p} n{n}");
            }
            3..=4 => {
                let _ = regs[r].read_u64(p * 4096);
                desc = format!("read r{r} p{p}");
            }
            5 => {
                let n = (rnd() % 64) as usize;
                let n = n.min(pages - p);
                regs[r].discard(p * 4096, n * 4096).unwrap();
                desc = format!("discard r{r} p{p} n{n}");
            }
            6 => {
                mm.reclaim_to(0);
                desc = "reclaim".into();
            }
            7 => {
                regs[r] = mm.map_anon(4096).unwrap();
                regs[r] = mm.map_anon(((rnd() % 600) as usize + 1) * 4096).unwrap();
                desc = format!("recreate r{r}");
            }
            _ => {
                let mut b = vec![0u8; 4096];
                regs[r].read_bytes(p * 4096, &mut b).unwrap();
                regs[r].write_bytes(p * 4096, &b).unwrap();
                desc = format!("rwpage r{r} p{p}");
            }
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
        let mut bad = mm.audit();
        if !bad.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(100));
            bad = mm.audit();
        }
        if !bad.is_empty() {
            println!("step {step} after {desc}: {:?}", &bad[..bad.len().min(5)]);
            std::thread::sleep(std::time::Duration::from_millis(500));
            println!("after settle: {:?}", &mm.audit()[..]);
            return;
        }
    }
    drop(regs);
    std::thread::sleep(std::time::Duration::from_millis(300));
    println!(
        "clean; after drop resident {} audit {:?}",
        mm.resident_bytes(),
        mm.audit()
    );
    println!("{}", mm.vmstat());
}
