//! One budget shared by several managers (`memcontrol.rs`, a memory cgroup's page counter):
//! managers that join one group file never hold more frames together than its limit, each
//! reclaims its share when the group runs short, and the recycled pages an idle manager keeps
//! in free frames go back to the group. Here the managers share a process; `usermm run`'s
//! tests (crates/usermm-cli/tests/run.rs) check the same across a process tree.

mod common;

use common::*;
use usermm::{MemCgroup, Mm, MmConfig, SwapConfig};

const LIMIT: u64 = 16 * MIB;

fn group(name: &str) -> (MemCgroup, std::path::PathBuf) {
    let p = std::env::temp_dir().join(format!("usermm-group-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    (MemCgroup::create(&p, LIMIT).expect("group file"), p)
}

fn member(path: &std::path::Path) -> Mm {
    Mm::new(
        MmConfig::new(LIMIT)
            .swap(SwapConfig::Ram { size: 256 * MIB })
            .group(path),
    )
    .expect("manager in the group")
}

/// Three managers each write and verify 48 MiB at once under one 16 MiB group: every word
/// comes back, each swapped, and the frames they held together never passed the limit (the
/// group's high-water mark), though each alone could have held the whole 16 MiB.
#[test]
fn managers_in_one_group_hold_its_budget_together() {
    init_log();
    let (g, path) = group("three");
    let mms: Vec<Mm> = (0..3).map(|_| member(&path)).collect();
    let pages = (48 * MIB) as usize / PAGE;
    std::thread::scope(|s| {
        for (k, mm) in mms.iter().enumerate() {
            s.spawn(move || {
                let r = mm.map_anon(pages * PAGE).unwrap();
                for pass in 0..2u64 {
                    for p in 0..pages {
                        r.write_u64(p * PAGE, pattern(k as u64, p as u64, pass));
                    }
                    for p in 0..pages {
                        assert_eq!(
                            r.read_u64(p * PAGE),
                            pattern(k as u64, p as u64, pass),
                            "manager {k} page {p} pass {pass}"
                        );
                    }
                }
            });
        }
    });
    for mm in &mms {
        mm.settle(std::time::Duration::from_secs(5));
        assert_eq!(mm.audit(), Vec::<String>::new());
    }
    let st = g.stat();
    assert!(st.peak <= LIMIT / PAGE as u64, "{st:?}");
    assert!(
        st.peak > LIMIT / PAGE as u64 / 2,
        "the group was hardly used: {st:?}"
    );
    assert_eq!(st.joined, 3);
    for mm in &mms {
        assert!(mm.vmstat().val("pswpout") > 0);
        assert!(mm.peak_resident_bytes() <= LIMIT);
    }
    let members = g.members();
    assert_eq!(members.len(), 3);
    assert_eq!(
        members.iter().map(|m| m.usage).sum::<u64>(),
        g.usage(),
        "the members' charges add up to the group's"
    );
    drop(mms);
    assert_eq!(g.usage(), 0, "managers leaving uncharge everything");
    assert!(g.members().is_empty());
    std::fs::remove_file(&path).unwrap();
}

/// A manager that filled the whole budget and went idle gives it up to one that needs it: its
/// kswapd sees the group short, drains its recycled free frames and reclaims its share, so the
/// busy manager's working set grows to most of the budget.
#[test]
fn an_idle_member_gives_its_frames_to_a_busy_one() {
    init_log();
    let (g, path) = group("idle");
    let idle = member(&path);
    let busy = member(&path);
    let r = idle.map_anon((32 * MIB) as usize).unwrap();
    for p in 0..r.len() / PAGE {
        r.write_u64(p * PAGE, pattern(1, p as u64, 0));
    }
    assert!(
        idle.resident_bytes() > LIMIT / 2,
        "the first manager holds the budget: {}",
        idle.resident_bytes()
    );
    let b = busy.map_anon((12 * MIB) as usize).unwrap();
    for pass in 0..8u64 {
        for p in 0..b.len() / PAGE {
            b.write_u64(p * PAGE, pattern(2, p as u64, pass));
        }
    }
    eprintln!(
        "idle {}\nbusy {}\n{:?}",
        idle.vmstat(),
        busy.vmstat(),
        g.members()
    );
    assert!(
        busy.resident_bytes() >= 8 * MIB,
        "the busy manager holds {} MiB of the {} MiB budget; the idle one {} MiB",
        busy.resident_bytes() / MIB,
        LIMIT / MIB,
        idle.resident_bytes() / MIB
    );
    assert!(g.stat().peak <= LIMIT / PAGE as u64);
    for mm in [&idle, &busy] {
        mm.settle(std::time::Duration::from_secs(5));
        assert_eq!(mm.audit(), Vec::<String>::new());
    }
    for p in 0..r.len() / PAGE {
        assert_eq!(
            r.read_u64(p * PAGE),
            pattern(1, p as u64, 0),
            "idle page {p}"
        );
    }
    drop((idle, busy));
    std::fs::remove_file(&path).unwrap();
}

/// A group file that is not one, or missing, fails `Mm::new` naming the path and what to do.
#[test]
fn a_bad_group_file_fails_at_mm_new() {
    let p = std::env::temp_dir().join(format!("usermm-group-{}-bad", std::process::id()));
    std::fs::write(&p, b"not a group").unwrap();
    let e = Mm::new(MmConfig::new(LIMIT).group(&p))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&p.display().to_string()), "{e}");
    std::fs::remove_file(&p).unwrap();
    let e = Mm::new(MmConfig::new(LIMIT).group(&p))
        .unwrap_err()
        .to_string();
    assert!(e.contains("USERMM_GROUP"), "{e}");
}
