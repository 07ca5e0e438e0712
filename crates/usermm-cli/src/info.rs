//! `usermm info`: starts a manager with the given settings and reports what it found and chose:
//! how userfaultfd was opened and which features the kernel negotiated, the budget and the
//! watermarks scaled from it, the commit limit, the swap device (each tier of a chain with its counters) and the handler
//! threads.

use serde_json::json;
use usermm::{Mm, MmConfig};

use crate::Failure;

/// Prints the report as text, or as one JSON object with `json`.
pub fn run(cfg: MmConfig, json_out: bool) -> Result<(), Failure> {
    let m = Mm::new(cfg).map_err(Failure::run)?;
    let u = m.uffd_info();
    let w = m.watermarks();
    let (_, commit_limit) = m.commit();
    let handlers = match m.config().handler_threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    if json_out {
        let v = json!({
            "engine": "usermm",
            "uffd_origin": format!("{:?}", u.origin),
            "uffd_features": u.features,
            "budget_bytes": m.budget(),
            "watermarks_pages": {"min": w.min, "low": w.low, "high": w.high},
            "swap_device": m.swap_name(),
            "swap_bytes": m.swap_bytes(),
            "swap_tiers": m.swap_tiers().into_iter().map(|(tier, counters)| json!({
                "tier": tier,
                "counters": counters.into_iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<String, serde_json::Value>>(),
            })).collect::<Vec<_>>(),
            "commit_limit_bytes": commit_limit,
            "overcommit": m.config().overcommit,
            "handler_threads": handlers,
            "page_cluster": m.config().page_cluster,
            "fault_around_max_pages": m.config().fault_around_max,
            "thp": m.config().thp,
            "laptop_mode": m.config().settings.laptop_mode,
            "switches": m.config().settings.iter().map(|(i, b)| json!({
                "name": i.name, "seed": i.seed, "old": i.old, "new": i.new,
                "value": if b == usermm::Behaviour::New { i.new } else { i.old },
                "what": i.what,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!("userfaultfd: {:?}", u.origin);
        println!("features: {}", u.features.join(" "));
        println!(
            "budget: {} ({} pages); watermarks (pages): min {} low {} high {}",
            crate::output::mib(m.budget()),
            m.budget() / 4096,
            w.min,
            w.low,
            w.high
        );
        println!(
            "swap: {} ({})",
            m.swap_name(),
            crate::output::mib(m.swap_bytes())
        );
        let tiers = m.swap_tiers();
        if tiers.len() > 1 {
            for (i, (tier, counters)) in tiers.iter().enumerate() {
                println!("  tier {i}: {tier}");
                if !counters.is_empty() {
                    let c: Vec<String> = counters.iter().map(|(n, v)| format!("{n} {v}")).collect();
                    println!("    {}", c.join(", "));
                }
            }
        }
        println!(
            "commit limit: {}{}",
            crate::output::mib(commit_limit),
            if m.config().overcommit {
                " (overcommit on: not enforced)"
            } else {
                ""
            }
        );
        println!(
            "fault handler threads: {handlers}; readahead up to {} pages; write fault-around up to {} pages",
            1u32 << m.config().page_cluster,
            m.config().fault_around_max
        );
        println!(
            "thp: {}; laptop_mode: {}",
            if m.config().thp { "always" } else { "never" },
            if m.config().settings.laptop_mode {
                "on"
            } else {
                "off"
            }
        );
        println!("seed switches (--set NAME=old|new, or the values in brackets):");
        for (i, b) in m.config().settings.iter() {
            let (cur, mark) = if b == usermm::Behaviour::New {
                (i.new, "new")
            } else {
                (i.old, "OLD")
            };
            println!(
                "  {:<26} = {cur:<10} ({mark}; seed {} [{}|{}]) {}",
                i.name, i.seed, i.old, i.new, i.what
            );
        }
    }
    Ok(())
}
