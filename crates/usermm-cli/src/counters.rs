//! Named counter snapshots that do not depend on where they came from: a usermm manager's
//! [`Vmstat`], the kernel's `/proc/vmstat`, or a memory cgroup's `memory.stat`. The benchmark
//! reports and the A/B comparison work on these, so usermm's and the kernel's numbers print in
//! the same format under the same keys.
//!
//! Mirrors the two kinds of line in `/proc/vmstat` (`mm/vmstat.c`): state items (`nr_*`, a level
//! at one instant) and event counters (only grow; a run reports their difference).

use serde::{Deserialize, Serialize};
use usermm::Vmstat;

/// Counter values by name, in a stable order (the source's order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters(pub Vec<(String, u64)>);

impl Counters {
    /// The counters of a usermm manager.
    pub fn from_vmstat(v: &Vmstat) -> Counters {
        Counters(v.iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Parses `name value` lines (`/proc/vmstat`, `memory.stat`, `memory.events`); lines that do
    /// not have that shape are skipped.
    pub fn parse(text: &str) -> Counters {
        Counters(
            text.lines()
                .filter_map(|l| {
                    let mut it = l.split_whitespace();
                    let (k, v) = (it.next()?, it.next()?);
                    if it.next().is_some() {
                        return None;
                    }
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The value of `name`, None when absent.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    /// The value of `name`, 0 when absent.
    pub fn val(&self, name: &str) -> u64 {
        self.get(name).unwrap_or(0)
    }

    /// A JSON object of name: value, in order.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
                .collect(),
        )
    }

    /// All (name, value) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Adds (or replaces) one counter.
    pub fn set(&mut self, name: &str, v: u64) {
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some(e) => e.1 = v,
            None => self.0.push((name.to_string(), v)),
        }
    }

    /// `self - before` for event counters; state items (as `is_state` says) keep their later
    /// value. Counters missing from `before` count from 0; a counter that went backwards (a
    /// cgroup counter reset) gives 0.
    pub fn delta(&self, before: &Counters, is_state: impl Fn(&str) -> bool) -> Counters {
        Counters(
            self.0
                .iter()
                .map(|(k, v)| {
                    let d = if is_state(k) {
                        *v
                    } else {
                        v.saturating_sub(before.val(k))
                    };
                    (k.clone(), d)
                })
                .collect(),
        )
    }
}

/// `/proc/vmstat` (and usermm's vmstat): `nr_*` lines are state items, except the four that
/// `mm/vmstat.c` lists among them but only ever grow (`nr_dirtied`, `nr_written`,
/// `nr_vmscan_write`, `nr_vmscan_immediate_reclaim`); everything else counts events.
pub fn vmstat_is_state(name: &str) -> bool {
    const NR_EVENTS: &[&str] = &[
        "nr_dirtied",
        "nr_written",
        "nr_vmscan_write",
        "nr_vmscan_immediate_reclaim",
    ];
    (name.starts_with("nr_") && !NR_EVENTS.contains(&name))
        || matches!(
            name,
            "zswap_stored_pages" | "zswap_pool_bytes" | "zswap_same_filled"
        )
}

/// `memory.stat` (cgroup v1 and v2): event counters are the page-fault, paging, scan/steal,
/// swap, workingset and THP event lines; the rest (`anon`, `file`, `cache`, `rss`, `swap`,
/// `inactive_anon`, limits, ...) are levels.
pub fn memcg_is_state(name: &str) -> bool {
    let n = name.strip_prefix("total_").unwrap_or(name);
    const EVENTS: &[&str] = &[
        "pg",
        "pswp",
        "zswp",
        "swpin",
        "swpout",
        "thp_",
        "workingset_refault",
        "workingset_activate",
        "workingset_restore",
        "workingset_nodereclaim",
    ];
    !EVENTS.iter().any(|p| n.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_delta() {
        let a = Counters::parse("nr_free_pages 10\npgfault 5\nbogus line here\npswpout 1\n");
        let b = Counters::parse("nr_free_pages 7\npgfault 12\npswpout 1\npgmajfault 3\n");
        assert_eq!(a.0.len(), 3);
        let d = b.delta(&a, vmstat_is_state);
        assert_eq!(d.val("nr_free_pages"), 7);
        assert_eq!(d.val("pgfault"), 7);
        assert_eq!(d.val("pswpout"), 0);
        assert_eq!(d.val("pgmajfault"), 3);
        assert_eq!(d.get("nope"), None);
        // A counter going backwards clamps at 0 rather than wrapping.
        assert_eq!(a.delta(&b, vmstat_is_state).val("pgfault"), 0);
        // nr_written only grows: a run reports its difference.
        let (a, b) = (
            Counters::parse(
                "nr_written 50000
nr_dirty 10
",
            ),
            Counters::parse(
                "nr_written 50300
nr_dirty 4
",
            ),
        );
        let d = b.delta(&a, vmstat_is_state);
        assert_eq!((d.val("nr_written"), d.val("nr_dirty")), (300, 4));
    }

    #[test]
    fn memcg_state_and_events() {
        for s in [
            "anon",
            "file",
            "cache",
            "rss",
            "swap",
            "total_rss",
            "inactive_anon",
        ] {
            assert!(memcg_is_state(s), "{s}");
        }
        for e in [
            "pgfault",
            "pgmajfault",
            "pgscan_direct",
            "total_pgpgout",
            "pswpout",
            "workingset_refault_anon",
            "thp_fault_alloc",
        ] {
            assert!(!memcg_is_state(e), "{e}");
        }
    }

    #[test]
    fn set_adds_or_replaces() {
        let mut c = Counters::default();
        c.set("allocstall", 3);
        c.set("allocstall", 4);
        assert_eq!(c.0, vec![("allocstall".to_string(), 4)]);
    }
}
