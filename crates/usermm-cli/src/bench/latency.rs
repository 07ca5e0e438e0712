//! `usermm bench fault-latency`: the cost of one access, as the touching thread sees it, for the
//! three kinds of access usermm serves: a resident mapped page (no fault), a minor fault (a
//! resident page unmapped by reclaim to observe its next reference), and a major fault (a page
//! on the swap device, touched in random order so readahead does not hide it). With
//! `ref_around=on` (the default) a minor fault maps the parked neighbours of its page too, so
//! most of the minor phase's accesses then find their page mapped: its percentiles are those of
//! an access to a page reclaim unmapped, and `pgreffault` / `pgreffault_around` say how many
//! faulted; `--set ref_around=off` times the minor fault alone.

use std::time::Instant;

use serde_json::json;
use usermm::{Mm, MmConfig};

use super::XorShift;
use crate::Failure;

fn percentiles(mut v: Vec<u64>) -> serde_json::Value {
    v.sort_unstable();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0;
    json!({"n": v.len(), "p50_us": p(0.5), "p90_us": p(0.9), "p99_us": p(0.99), "max_us": p(1.0)})
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut r = XorShift::new(seed);
    for i in (1..n).rev() {
        v.swap(i, r.below(i as u64 + 1) as usize);
    }
    v
}

/// Runs the measurement and prints it (text or one JSON object).
pub fn run(cfg: MmConfig, pages: usize, json_out: bool) -> Result<(), Failure> {
    let len = pages.checked_mul(4096).ok_or_else(|| {
        Failure::Usage(format!("--pages: {pages} pages overflow the address space"))
    })?;
    // Resident accesses are only resident if every page fits under the budget with kswapd's
    // high watermark free, and major faults need every page on the swap device.
    let nr_frames = cfg.budget / 4096;
    let high = cfg
        .watermarks
        .unwrap_or_else(|| usermm::Watermarks::scaled(nr_frames))
        .high;
    let fit = nr_frames.saturating_sub(high);
    if pages as u64 > fit {
        return Err(Failure::Usage(format!(
            "--pages: {pages} pages ({} bytes) do not fit in --budget {} bytes with the free \
             watermark ({high} pages) kept: at most {fit} pages; use fewer pages or a larger budget",
            len,
            cfg.budget
        )));
    }
    let swap = super::presets::configured_swap_bytes(&cfg) / 4096;
    if (pages as u64) > swap {
        return Err(Failure::Usage(format!(
            "--pages: {pages} pages do not fit on the swap device ({swap} pages), so major faults \
             cannot be measured; use fewer pages, --swap-size or another --swap than none"
        )));
    }
    let mm = Mm::new(cfg).map_err(Failure::run)?;
    let r = mm.map_anon(len).map_err(Failure::run)?;
    let time = |off: usize, write: bool| {
        let t = Instant::now();
        if write {
            r.write_u64(off, off as u64);
        } else {
            std::hint::black_box(r.read_u64(off));
        }
        t.elapsed().as_nanos() as u64
    };
    for p in 0..pages {
        r.write_u64(p * 4096, (p * 4096) as u64);
    }
    // Resident, mapped: no fault at all.
    let before = mm.vmstat();
    let resident: Vec<u64> = shuffled(pages, 1)
        .into_iter()
        .map(|p| time(p * 4096 + 8, false))
        .collect();
    let faults = mm.vmstat().delta(&before).val("pgfault");
    if faults > 0 {
        return Err(Failure::Run(format!(
            "the resident pass took {faults} faults: {pages} pages did not stay resident in the \
             budget of {} bytes, so its latencies are not those of resident pages; use fewer pages",
            mm.budget()
        )));
    }
    // Major faults: push everything to swap, then touch in random order.
    mm.reclaim_to(0);
    let before = mm.vmstat();
    let major: Vec<u64> = shuffled(pages, 2)
        .into_iter()
        .map(|p| time(p * 4096, false))
        .collect();
    let d_major = mm.vmstat().delta(&before);
    // Minor faults: one reclaim pass unmaps resident pages without writing them; touch again.
    let before = mm.vmstat();
    let mut sc = 0;
    while mm.vmstat().delta(&before).val("pgunmap_ref") < (pages as u64) / 2 && sc < 8 {
        mm.reclaim_to(mm.resident_bytes().saturating_sub(4096));
        sc += 1;
    }
    let b2 = mm.vmstat();
    let minor: Vec<u64> = shuffled(pages, 3)
        .into_iter()
        .map(|p| time(p * 4096 + 16, false))
        .collect();
    let d_minor = mm.vmstat().delta(&b2);
    let out = json!({
        "workload": "fault-latency",
        "engine": "usermm",
        "pages": pages,
        "budget_bytes": mm.budget(),
        "swap_device": mm.swap_name(),
        "resident_access": percentiles(resident),
        "major_fault": percentiles(major),
        "major_fault_counters": {"pgmajfault": d_major.val("pgmajfault"), "swap_ra": d_major.val("swap_ra"), "swap_ra_hit": d_major.val("swap_ra_hit"), "handler_spin_hit": d_major.val("handler_spin_hit"), "handler_wakeup": d_major.val("handler_wakeup")},
        "minor_fault": percentiles(minor),
        "minor_fault_counters": {"pgreffault": d_minor.val("pgreffault"), "pgreffault_around": d_minor.val("pgreffault_around"), "pgmajfault": d_minor.val("pgmajfault")},
    });
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(Failure::run)?
        );
    } else {
        for k in ["resident_access", "minor_fault", "major_fault"] {
            let v = &out[k];
            println!(
                "{k:16} n={:6} p50 {:7.2} us  p90 {:7.2} us  p99 {:7.2} us  max {:8.1} us",
                v["n"],
                v["p50_us"].as_f64().unwrap_or(0.0),
                v["p90_us"].as_f64().unwrap_or(0.0),
                v["p99_us"].as_f64().unwrap_or(0.0),
                v["max_us"].as_f64().unwrap_or(0.0)
            );
        }
        println!("major: {}", out["major_fault_counters"]);
        println!("minor: {}", out["minor_fault_counters"]);
    }
    Ok(())
}
