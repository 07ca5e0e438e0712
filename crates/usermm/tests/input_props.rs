//! Property tests over every parser and check that user input reaches: sizes
//! (`parse_size`), seed switches (`Settings::parse`), swap device names (`SwapConfig::parse`),
//! the environment (`MmConfig::from_env`) and whole configurations (`MmConfig::validate`).
//! Random strings and numbers, overflow, zero, negative, huge, unknown and duplicated names,
//! empty input: each is either accepted with the right value or refused with an error that
//! names the value; nothing panics.

use proptest::prelude::*;
use usermm::{parse_size, MmConfig, Settings, SwapConfig};

const UNITS: [(&str, u64); 5] = [
    ("", 1),
    ("k", 1 << 10),
    ("M", 1 << 20),
    ("G", 1 << 30),
    ("T", 1 << 40),
];

fn msg(e: usermm::Error) -> String {
    e.to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parse_size_never_panics_and_names_what_it_refuses(s in ".{0,24}") {
        if let Err(e) = parse_size(&s) {
            let m = msg(e);
            prop_assert!(m.contains(&format!("{s:?}")), "{m}");
        }
    }

    #[test]
    fn whole_sizes_are_exact_or_refused_as_too_large(n in any::<u64>(), u in 0usize..5, lower in any::<bool>(), ib in 0u8..3) {
        let (unit, mult) = UNITS[u];
        let unit = if lower { unit.to_lowercase() } else { unit.to_string() };
        let tail = match (ib, unit.is_empty()) { (1, false) => "iB", (2, _) => "B", _ => "" };
        let s = format!("{n}{unit}{tail}");
        match n.checked_mul(mult) {
            Some(v) => prop_assert_eq!(parse_size(&s).unwrap(), v, "{}", s),
            None => {
                let m = msg(parse_size(&s).unwrap_err());
                prop_assert!(m.contains("too large") && m.contains(&s), "{m}");
            }
        }
    }

    #[test]
    fn negative_and_exponent_sizes_are_refused(n in 1u64..u64::MAX, u in 0usize..5) {
        let unit = UNITS[u].0;
        for s in [format!("-{n}{unit}"), format!("{n}e3{unit}"), format!("0x{n}{unit}")] {
            let m = msg(parse_size(&s).unwrap_err());
            prop_assert!(m.contains(&format!("{s:?}")), "{m}");
        }
    }

    #[test]
    fn fractional_sizes_round_down(whole in 0u64..1_000_000, frac in 0u32..1000, u in 1usize..5) {
        let (unit, mult) = UNITS[u];
        let s = format!("{whole}.{frac:03}{unit}");
        let got = parse_size(&s).unwrap();
        let exact = whole as f64 * mult as f64 + frac as f64 / 1000.0 * mult as f64;
        prop_assert!(got as f64 <= exact + 1.0 && got as f64 >= exact - mult as f64 / 1e6 - 1.0,
            "{s}: {got} vs {exact}");
    }

    #[test]
    fn settings_never_panic_and_name_what_they_refuse(s in "[a-z_=, 0-9]{0,40}") {
        if let Err(e) = Settings::parse(&s) {
            let m = msg(e);
            // The message quotes the offending item, name or value.
            let items: Vec<&str> = s.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
            prop_assert!(items.iter().any(|i| {
                let (n, v) = i.split_once('=').unwrap_or((i, ""));
                m.contains(&format!("{:?}", i)) || m.contains(&format!("{:?}", n.trim()))
                    || m.contains(&format!("{:?}", v.trim()))
            }), "{s:?}: {m}");
        }
    }

    #[test]
    fn duplicated_settings_mean_the_last_one(picks in proptest::collection::vec((0usize..usermm::settings::SWITCHES.len() + 1, any::<bool>()), 0..12)) {
        let names: Vec<&str> = usermm::settings::SWITCHES.iter().map(|i| i.name)
            .chain(std::iter::once("laptop_mode")).collect();
        let value = |name: &str, new: bool| if name == "laptop_mode" {
            if new { "on" } else { "off" }
        } else if new { "new" } else { "old" };
        let list: Vec<String> = picks.iter()
            .map(|&(i, b)| format!("{}={}", names[i], value(names[i], b))).collect();
        let parsed = Settings::parse(&list.join(",")).unwrap();
        // Keep only each name's last occurrence: the same settings.
        let mut last: Vec<String> = Vec::new();
        for (k, &(i, _)) in picks.iter().enumerate() {
            if !picks[k + 1..].iter().any(|&(j, _)| j == i) {
                last.push(list[k].clone());
            }
        }
        prop_assert_eq!(Settings::parse(&last.join(",")).unwrap(), parsed);
        // Display round-trips.
        prop_assert_eq!(Settings::parse(&parsed.to_string()).unwrap(), parsed);
    }

    #[test]
    fn swap_names_never_panic_and_name_what_they_refuse(s in ".{0,24}", size in any::<u64>()) {
        match SwapConfig::parse(&s, size) {
            Ok(SwapConfig::File { path: Some(p), size: got }) => {
                prop_assert_eq!(got, size);
                prop_assert_eq!(format!("file:{}", p.display()), s.trim());
            }
            Ok(_) => {}
            Err(e) => {
                let m = msg(e);
                prop_assert!(m.contains(&format!("{:?}", s.trim())) && m.contains("file:PATH"), "{m}");
            }
        }
    }

    #[test]
    fn configurations_are_valid_exactly_in_range(
        budget in prop_oneof![Just(0u64), Just(u64::MAX), 0u64..(1 << 50)],
        threads in prop_oneof![Just(0usize), Just(usize::MAX), 0usize..100_000],
        page_cluster in 0u32..40,
        fault_around in 0u32..2000,
        ratio in 0u32..300,
        swappiness in 0u32..400,
    ) {
        let mut c = MmConfig::new(budget).handler_threads(threads);
        c.page_cluster = page_cluster;
        c.fault_around_max = fault_around;
        c.dirty_ratio = ratio;
        c.swappiness = swappiness;
        let ok = budget >= 1 << 20 && budget / 4096 < u32::MAX as u64
            && threads <= usermm::mm::MAX_HANDLER_THREADS
            && page_cluster <= 9 && (1..=512).contains(&fault_around)
            && ratio <= 100 && swappiness <= 200;
        match c.validate() {
            Ok(()) => prop_assert!(ok),
            Err(e) => {
                prop_assert!(!ok);
                let m = msg(e);
                prop_assert!(m.starts_with("invalid argument: "), "{m}");
                // The value that is out of range is in the message.
                prop_assert!([budget.to_string(), threads.to_string(), page_cluster.to_string(),
                    fault_around.to_string(), ratio.to_string(), swappiness.to_string()]
                    .iter().any(|v| m.contains(v.as_str())), "{m}");
                prop_assert!(!m.contains("Some(") && !m.contains(" { "), "Debug text: {m}");
            }
        }
    }
}

/// Whether error message `m` names `value`: all of it (trimmed), or, for a list such as
/// USERMM_SET's or a swap chain, the item that is wrong.
fn names_value(m: &str, value: &str) -> bool {
    let quoted = |t: &str| {
        m.contains(&format!("{t:?}"))
            || m.contains(&format!("'{t}'"))
            || m.contains(&format!("`{t}`"))
    };
    let v = value.trim();
    // The items of a list (USERMM_SET's "a=b,c=d", a swap chain "zswap+file") and their parts.
    let mut parts: Vec<&str> = Vec::new();
    for item in v.split(',') {
        parts.push(item);
        parts.extend(item.split('='));
        parts.extend(item.split('+'));
    }
    m.contains(v)
        || quoted(value)
        || quoted(v)
        || parts
            .into_iter()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .any(quoted)
}

/// The environment is process-wide: one test sets and clears every variable in turn.
#[test]
fn environment_values_are_named_when_bad() {
    let vars = [
        "USERMM_BUDGET",
        "USERMM_SWAP",
        "USERMM_SWAP_SIZE",
        "USERMM_OVERCOMMIT",
        "USERMM_SWAP_ENCRYPT",
        "USERMM_SWAP_KEEP",
        "USERMM_SET",
    ];
    let clear = || vars.iter().for_each(|v| std::env::remove_var(v));
    clear();
    assert!(MmConfig::from_env().is_ok());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(2048));
    let strat = (0usize..vars.len(), "[ -~]{0,16}");
    runner
        .run(&strat, |(i, value)| {
            clear();
            std::env::set_var(vars[i], &value);
            let r = MmConfig::from_env();
            clear();
            if let Err(e) = r {
                let m = msg(e);
                prop_assert!(m.contains(vars[i]), "{}={value:?}: {m}", vars[i]);
                // The value, or the part of it that is wrong, is named too.
                prop_assert!(
                    names_value(&m, &value),
                    "{}={value:?}: the message does not name the value: {m}",
                    vars[i]
                );
            }
            Ok(())
        })
        .unwrap();
    // Known bad values, each named with its variable.
    for (var, value) in [
        ("USERMM_BUDGET", "-1"),
        ("USERMM_BUDGET", "256Q"),
        ("USERMM_BUDGET", "99999999999999999999"),
        ("USERMM_SWAP_SIZE", "1e9"),
        ("USERMM_SWAP", "tape"),
        ("USERMM_OVERCOMMIT", "maybe"),
        ("USERMM_SWAP_ENCRYPT", "2"),
        ("USERMM_SWAP_KEEP", "yes please"),
        ("USERMM_SET", "nosuch"),
    ] {
        clear();
        std::env::set_var(var, value);
        let m = msg(MmConfig::from_env().unwrap_err());
        clear();
        assert!(
            m.contains(var) && m.contains(value.trim()),
            "{var}={value}: {m}"
        );
        assert_eq!(m.matches("invalid argument").count(), 1, "{m}");
    }
}
