//! The seed switches: each Linux commit usermm carries is a switch between the behaviour before
//! the commit (`old`) and after it (`new`, the default), so its effect can be measured A/B
//! (`usermm compare --switch NAME`). Also `laptop_mode`, the sysctl seed 004 is about.
//!
//! Set from the API ([`Settings::set`]), the CLI (`--set name=value`, repeatable) or the
//! environment (`USERMM_SET="name=value,name=value"`). Every switch accepts `old` and `new` and
//! two descriptive values of its own; `usermm info` lists them.
//!
//! Kernel counterparts: there are none as switches: each is a code change in mm/ (see
//! docs/seeds.md for where each lives in Linux and in usermm).

#[cfg(not(loom))]
use crate::error::{ConfigError, Error, Result};

/// A behaviour chosen by a switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Behaviour {
    /// Before the seed commit.
    Old,
    /// After the seed commit (the default).
    New,
}

/// The switches, one per mechanism of the four seed commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Switch {
    /// Seed 000: the swap cache maintains DIRTY/TOWRITE/WRITEBACK marks under its tree lock on
    /// every writeback start and end (old), or sets `AS_NO_WRITEBACK_TAGS` and flips only the
    /// page flag (new).
    SwapcacheWritebackTags,
    /// Seed 002: a new page-cache page is marked accessed with an atomic operation after it is
    /// visible, in write_end (old), or with a plain store before insertion via `Fgp::ACCESSED`
    /// (new).
    AccessedInit,
    /// Seed 003: every huge-zero mapping takes and every unmap drops a reference on one global
    /// counter (old), or each Mm takes one reference on first use and drops it at teardown (new).
    HugeZeroRefcount,
    /// Seed 004: in laptop mode reclaim isolates only clean pages and rotates dirty ones (old), or
    /// isolates dirty pages too and counts them (new).
    LaptopModeIsolate,
    /// Seed 004 series: reclaim wakes the flushers when every isolated page is dirty and not
    /// queued for writeback (new); old: it does not.
    ReclaimWakeFlushers,
    /// Seed 004 series: kswapd writes a dirty file page only when it has been seen twice (the
    /// reclaim flag) and the node is flagged dirty (new); old: on the first encounter.
    KswapdWriteTwice,
    /// Seed 004 series: dirty file pages that rotate on the inactive list are activated (new);
    /// old: they stay inactive.
    ActivateRotatedDirty,
    /// The page replacement policy: the two-list active/inactive LRU (old, `lru_gen=off`) or
    /// Linux 6.1's multi-gen LRU (new, `lru_gen=on`; `CONFIG_LRU_GEN`, `/sys/kernel/mm/lru_gen/
    /// enabled`). Not a seed commit: off by default (see [`SwitchInfo::default`]).
    LruGen,
    /// Who serves a fault: the handler threads reading the userfaultfd (old, `handler`), or
    /// the faulting thread itself in a SIGBUS handler (new, `sigbus`; `UFFD_FEATURE_SIGBUS`,
    /// ExtMem's design). Not a seed commit: `handler` by default, because under `sigbus` a
    /// kernel-mode access (`read(2)` into a page not resident) fails with EFAULT
    /// (docs/fault_path.md).
    FaultPath,
    /// How a writeback batch's runs of file pages reach the disk: one `pwritev` per run in
    /// turn (old, `sync`), or every run in flight at once through io_uring (new, `io_uring`,
    /// the default; where io_uring is unavailable, detected at run time, the synchronous path
    /// runs whatever the setting).
    FileIo,
    /// How fault-around maps a run of clean pages into a shared file region: UFFDIO_COPY with
    /// MODE_WP and the pool slots dropped after (old, `copy`), or UFFDIO_MOVE of the run, then
    /// UFFDIO_WRITEPROTECT, with each page's hash taken before the move and after the
    /// protection so that a store by another thread in between marks the page dirty (new,
    /// `move`, the default; bench/filemap-continue.md: 130-214 ns a page against 1980-3413).
    CleanMap,
    /// How a clean swap-cache page (its swap copy still valid) is mapped, and how a store to it
    /// is seen: write-protected, its first store a write-protect fault that drops the swap
    /// copy (old, `wp`), or writable with the hash of its contents recorded, compared when
    /// reclaim unmaps it (new, `hash`): a changed page has its swap copy dropped then, as
    /// Linux's reclaim reads the pte dirty bit, and no store ever faults.
    AnonClean,
    /// How an empty pool slot gets the page a device then reads into: none, the data goes
    /// through the bounce buffer and one UFFDIO_COPY per run (old, `copy`), or pages moved in
    /// runs from a transparent huge page, so the read lands straight in the slots in few
    /// physically contiguous pieces (new, `huge`; mm/pool.rs `fill_empty_from_huge`).
    PoolFill,
    /// How a swap-in stream (major faults walking up a region, every page read ahead used) is
    /// read from a device whose reads wait (a disk, Redis; memory tiers always `sync`): each
    /// window by the fault that reaches it (old, `sync`), or the next windows by the readahead
    /// workers while the program uses this one, mapped before it gets there, the next window
    /// queued when the first page of one is used (new, `async`; memory.rs `swap_ra_async`),
    /// as a file's PG_readahead marker queues its next window.
    SwapRaAsync,
    /// What a swap-in from a device whose pages are uncompressed in memory (the RAM device:
    /// [`SwapDevice::pages_in_memory`](crate::swap::SwapDevice::pages_in_memory)) keeps: the
    /// slot, the page clean in the swap cache until a store (old, `keep`), or nothing: the slot
    /// is freed once the page is copied out and the page is dirty (new, `skip`), as Linux's
    /// `do_swap_page` skips the swap cache on a `SWP_SYNCHRONOUS_IO` device (zram). Writing such
    /// a page again is a copy; keeping it clean costs a hash at map and at unmap (or a
    /// write-protect fault) and a second copy of every swapped-in page in the device.
    SwapinCache,
    /// What a reference fault (a minor fault on a page reclaim unmapped to see its next use)
    /// maps: that page alone (old, `off`), or with it the run of pages next to it that were
    /// unmapped for observation too and are still parked in their pool slots, up to
    /// 16 pages (`REF_AROUND`, mm/page_state.rs) in one ioctl (new, `on`),
    /// as x86 Linux's fault-around maps its neighbours young. A program touching a page again
    /// mostly touches its neighbours soon after; each of them would be a round trip of its own.
    RefAround,
}

/// Static description of one switch.
#[derive(Debug, Clone, Copy)]
pub struct SwitchInfo {
    pub switch: Switch,
    /// The name used by `--set`, `USERMM_SET` and `usermm compare --switch`.
    pub name: &'static str,
    /// The seed commit file in `shared/seeds/` (e.g. "000").
    pub seed: &'static str,
    /// Descriptive value for the old behaviour.
    pub old: &'static str,
    /// Descriptive value for the new behaviour.
    pub new: &'static str,
    /// One line on what it changes.
    pub what: &'static str,
    /// The behaviour of [`Settings::default`]: new for the seed commits; for `lru_gen` the
    /// policy that measured better (docs/lru_gen.md).
    pub default: Behaviour,
}

/// All switches, in seed order.
pub const SWITCHES: &[SwitchInfo] = &[
    SwitchInfo {
        switch: Switch::SwapcacheWritebackTags,
        name: "swapcache_writeback_tags",
        seed: "000",
        old: "on",
        new: "off",
        what: "swap cache keeps DIRTY/TOWRITE/WRITEBACK tree marks under its tree lock",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::AccessedInit,
        name: "accessed_init",
        seed: "002",
        old: "atomic",
        new: "nonatomic",
        what: "how a new page-cache page is marked accessed: atomic after insertion, or plain store before",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::HugeZeroRefcount,
        name: "huge_zero_refcount",
        seed: "003",
        old: "global",
        new: "per_mm",
        what: "huge zero page reference per mapping on a global counter, or once per Mm",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::LaptopModeIsolate,
        name: "laptop_mode_isolate",
        seed: "004",
        old: "clean_only",
        new: "dirty_too",
        what: "in laptop mode, reclaim isolates only clean pages, or dirty ones too",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::ReclaimWakeFlushers,
        name: "reclaim_wake_flushers",
        seed: "004",
        old: "off",
        new: "on",
        what: "reclaim wakes the flushers when all isolated pages are dirty and unqueued",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::KswapdWriteTwice,
        name: "kswapd_write_twice",
        seed: "004",
        old: "off",
        new: "on",
        what: "kswapd writes a dirty file page only on its second trip (PG_reclaim) on a dirty node",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::ActivateRotatedDirty,
        name: "activate_rotated_dirty",
        seed: "004",
        old: "off",
        new: "on",
        what: "dirty file pages that rotate on the inactive list are activated",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::LruGen,
        name: "lru_gen",
        seed: "6.1 lru_gen",
        old: "off",
        new: "on",
        what: "page replacement: two-list active/inactive LRU (off) or the multi-gen LRU (on)",
        default: Behaviour::Old,
    },
    SwitchInfo {
        switch: Switch::FaultPath,
        name: "fault_path",
        seed: "issue 13",
        old: "handler",
        new: "sigbus",
        what: "who serves a fault: handler threads reading the userfaultfd, or the faulting thread in a SIGBUS handler",
        default: Behaviour::Old,
    },
    SwitchInfo {
        switch: Switch::FileIo,
        name: "file_io",
        seed: "issue 15",
        old: "sync",
        new: "io_uring",
        what: "file I/O: writeback's runs one pwritev per run in turn and a random fault's page read in place, or the runs all in flight at once and the fault's read in flight while its handler serves others, through io_uring",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::CleanMap,
        name: "clean_map",
        seed: "issue 15",
        old: "copy",
        new: "move",
        what: "how fault-around maps clean pages into a shared file region: a write-protected copy (the slots dropped after), or a move then write protection, the pages hashed around the gap",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::AnonClean,
        name: "anon_clean",
        seed: "issue 13",
        old: "wp",
        new: "hash",
        what: "how a clean swap-cache page is mapped: write-protected (a store faults and drops the swap copy), or writable with its hash recorded and compared when reclaim unmaps it",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::PoolFill,
        name: "pool_fill",
        seed: "issue 15",
        old: "copy",
        new: "huge",
        what: "how an empty pool slot a file read needs gets its page: the read goes through the bounce buffer and UFFDIO_COPY, or pages are moved in from a huge page and the device reads straight into them",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::SwapRaAsync,
        name: "swap_ra_async",
        seed: "issue 11",
        old: "sync",
        new: "async",
        what: "how a swap-in stream's windows are read: each by the fault that reaches it, or the next ones by the readahead workers while the program uses this one, mapped before it gets there",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::SwapinCache,
        name: "swapin_cache",
        seed: "issue 14",
        old: "keep",
        new: "skip",
        what: "what a swap-in from the RAM device keeps: its slot, the page clean in the swap cache, or nothing (the slot freed once the page is copied out, the page dirty), as do_swap_page skips the swap cache on zram",
        default: Behaviour::New,
    },
    SwitchInfo {
        switch: Switch::RefAround,
        name: "ref_around",
        seed: "issue 13",
        old: "off",
        new: "on",
        what: "what a reference fault maps: the page alone, or with it the neighbours reclaim unmapped for observation too, up to 16 pages in one ioctl",
        default: Behaviour::New,
    },
];

impl Switch {
    /// The description of this switch.
    pub fn info(self) -> &'static SwitchInfo {
        SWITCHES
            .iter()
            .find(|i| i.switch == self)
            .expect("every switch is described")
    }

    fn index(self) -> usize {
        SWITCHES
            .iter()
            .position(|i| i.switch == self)
            .expect("every switch is described")
    }

    /// The switch called `name`.
    #[cfg(not(loom))]
    pub fn from_name(name: &str) -> Result<Switch> {
        SWITCHES
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.switch)
            .ok_or_else(|| {
                Error::from(ConfigError::UnknownSwitch {
                    name: name.into(),
                    known: SWITCHES
                        .iter()
                        .map(|i| i.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            })
    }
}

/// The seed switches and `laptop_mode`. `Default` is every switch at its
/// [`SwitchInfo::default`] (new for the seed commits, `lru_gen` off), laptop mode off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    behaviour: [Behaviour; SWITCHES.len()],
    /// `vm.laptop_mode`: reclaim does not write dirty pages itself (`may_writepage = 0`); with
    /// switch `laptop_mode_isolate` old it also leaves them on the list (ISOLATE_CLEAN).
    pub laptop_mode: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        let mut behaviour = [Behaviour::New; SWITCHES.len()];
        for (b, i) in behaviour.iter_mut().zip(SWITCHES) {
            *b = i.default;
        }
        Settings {
            behaviour,
            laptop_mode: false,
        }
    }
}

impl Settings {
    /// The behaviour of switch `s`.
    pub fn get(&self, s: Switch) -> Behaviour {
        self.behaviour[s.index()]
    }

    /// True when switch `s` has its new (post-commit) behaviour.
    pub fn is_new(&self, s: Switch) -> bool {
        self.get(s) == Behaviour::New
    }

    /// Sets switch `s`.
    pub fn with(mut self, s: Switch, b: Behaviour) -> Settings {
        self.behaviour[s.index()] = b;
        self
    }

    /// All switches with their current behaviour.
    pub fn iter(&self) -> impl Iterator<Item = (&'static SwitchInfo, Behaviour)> + '_ {
        SWITCHES.iter().zip(self.behaviour.iter().copied())
    }

    /// `name=value,name=value` (as in `USERMM_SET`), e.g. `laptop_mode=on,laptop_mode_isolate=old`.
    #[cfg(not(loom))]
    pub fn parse(list: &str) -> Result<Settings> {
        let mut s = Settings::default();
        s.apply(list)?;
        Ok(s)
    }

    /// Applies a `name=value,...` list on top of these settings.
    #[cfg(not(loom))]
    pub fn apply(&mut self, list: &str) -> Result<()> {
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| Error::from(ConfigError::NoValue { item: item.into() }))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(ConfigError::NoName { item: item.into() }.into());
            }
            self.set(name, value.trim())?;
        }
        Ok(())
    }

    /// Sets one switch or setting by name. Switches take `old`, `new` or their two descriptive
    /// values (`usermm info` lists them); `laptop_mode` takes `on`/`off` (or 1/0, true/false).
    #[cfg(not(loom))]
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if name == "laptop_mode" {
            self.laptop_mode = match value {
                "on" | "1" | "true" | "yes" => true,
                "off" | "0" | "false" | "no" => false,
                _ => {
                    return Err(ConfigError::LaptopMode {
                        value: value.into(),
                    }
                    .into())
                }
            };
            return Ok(());
        }
        let s = Switch::from_name(name)?;
        let info = s.info();
        let b = if value == "old" || value == info.old {
            Behaviour::Old
        } else if value == "new" || value == info.new {
            Behaviour::New
        } else {
            return Err(ConfigError::SwitchValue {
                switch: info.name,
                value: value.into(),
                old: info.old,
                new: info.new,
            }
            .into());
        };
        self.behaviour[s.index()] = b;
        Ok(())
    }

    /// The settings in `USERMM_SET` (defaults when unset or empty).
    #[cfg(not(loom))]
    pub fn from_env() -> Result<Settings> {
        match std::env::var("USERMM_SET") {
            Ok(v) => Settings::parse(&v).map_err(|e| e.prefixed("USERMM_SET")),
            Err(_) => Ok(Settings::default()),
        }
    }
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (info, b) in self.iter() {
            let v = match b {
                Behaviour::Old => info.old,
                Behaviour::New => info.new,
            };
            write!(f, "{}={v},", info.name)?;
        }
        write!(
            f,
            "laptop_mode={}",
            if self.laptop_mode { "on" } else { "off" }
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_new() {
        let s = Settings::default();
        assert!(SWITCHES.iter().all(|i| s.get(i.switch) == i.default
            && (matches!(i.switch, Switch::LruGen | Switch::FaultPath) || s.is_new(i.switch))));
        assert_eq!(
            s.get(Switch::LruGen),
            Behaviour::Old,
            "lru_gen is off by default"
        );
        assert_eq!(
            s.get(Switch::FaultPath),
            Behaviour::Old,
            "faults are served by handler threads by default"
        );
        assert!(!s.laptop_mode);
    }

    #[test]
    fn parse_names_and_aliases() {
        let s = Settings::parse("swapcache_writeback_tags=on, accessed_init=old,laptop_mode=on")
            .unwrap();
        assert_eq!(s.get(Switch::SwapcacheWritebackTags), Behaviour::Old);
        assert_eq!(s.get(Switch::AccessedInit), Behaviour::Old);
        assert!(s.is_new(Switch::HugeZeroRefcount));
        assert!(s.laptop_mode);
        let s = Settings::parse("huge_zero_refcount=global,huge_zero_refcount=per_mm").unwrap();
        assert!(s.is_new(Switch::HugeZeroRefcount));
        // Display round-trips.
        let s = Settings::parse("laptop_mode_isolate=clean_only,laptop_mode=1").unwrap();
        assert_eq!(Settings::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Settings::parse("nosuch=old").unwrap_err().to_string();
        assert!(e.contains("nosuch") && e.contains("accessed_init"), "{e}");
        let e = Settings::parse("accessed_init=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("atomic") && e.contains("nonatomic"), "{e}");
        let e = Settings::parse("accessed_init").unwrap_err().to_string();
        assert!(e.contains("name=value"), "{e}");
        assert!(Settings::parse("laptop_mode=2").is_err());
        let e = Settings::parse("lru_gen=maybe").unwrap_err().to_string();
        assert!(
            e.contains("lru_gen") && e.contains("on") && e.contains("off"),
            "{e}"
        );
        assert!(Settings::parse("lru_gen=on")
            .unwrap()
            .is_new(Switch::LruGen));
        assert!(!Settings::parse("lru_gen=off")
            .unwrap()
            .is_new(Switch::LruGen));
    }
}
