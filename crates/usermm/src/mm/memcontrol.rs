//! One budget for a process tree: the charge counter of a memory cgroup, shared by the managers
//! of many processes. Mirrors `mm/page_counter.c` (`page_counter_try_charge`,
//! `page_counter_uncharge`, the `watermark` high-water mark) and the charging half of
//! `mm/memcontrol.c` (`try_charge`, per-member usage as `memory.stat` per cgroup).
//!
//! A memory cgroup charges every page of every process in it against one limit, and reclaim
//! under that limit scans every process's pages. Here each process keeps its own manager (its
//! frames, LRU lists and kswapd: the data path stays in the process, where `UFFDIO_MOVE` works
//! and costs no cross-process hop, bench/processes.md), and the managers of one group share a
//! small file mapped `MAP_SHARED`: the limit, the pages charged in total and by each member,
//! and the high-water marks. A manager charges a frame before it uses it and uncharges it when
//! the frame is freed; its free frames, for every watermark decision (allocation, kswapd,
//! throttling, dirty limits), are the fewer of its own free frames and the group's margin. So
//! when the tree nears the limit every member's kswapd wakes and reclaims its share, in
//! proportion to the pages it holds (as `shrink_node` scans each cgroup's lruvec in proportion
//! to its size), and an allocation over the limit reclaims directly, then waits for the others.
//!
//! The file: a header of 16 words (magic, limit, usage, peak usage, processes joined, pages
//! reaped from dead members, the last reap in ms of CLOCK_MONOTONIC, the pressure futex, its
//! sleepers, a signal pending, members present, the last signaller; the rest unused) and
//! [`MAX_MEMBERS`] members of 4 words (pid, usage, peak, the process's start time). A member
//! leaves at manager drop and uncharges what it still holds. A member that exits without
//! dropping its manager (exit(2) runs no destructors of statics, as under `usermm run`) or is
//! killed (SIGKILL) is found by the next member short of pages or whose kswapd wakes: it checks
//! the members' pids (pid and start time, so a reused pid is not mistaken for the dead process;
//! a zombie counts as gone) and uncharges the dead ones' pages. A process that exec(2)s joins
//! again under the same pid and drops its old image's slot.
//!
//! A process that exits leaves its group at once ([`MemCgroup::leave`], called by `usermm
//! run`'s preload library from its exit destructor and its `_exit`), as a memory cgroup
//! uncharges an exiting task's pages in `exit_mmap` before its parent ever reaps it: waiting
//! for the next member to find it dead left a finished compiler's 40-80 MiB charged for up to
//! 100 ms, which the tree's other processes reclaimed from their own pages to make room for.
//! Whatever the process allocates in its last moments after leaving is charged to nobody.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::sys::{Mapping, PAGE_SIZE};
use crate::{Error, Result};

/// "usermmcg", version 1.
const MAGIC: u64 = u64::from_le_bytes(*b"usermcg1");
/// Processes that can be members of one group at once.
pub const MAX_MEMBERS: usize = 1024;
const HEADER_WORDS: usize = 16;
const MEMBER_WORDS: usize = 4;
const FILE_LEN: usize = (HEADER_WORDS + MAX_MEMBERS * MEMBER_WORDS) * 8;

const H_MAGIC: usize = 0;
const H_LIMIT: usize = 1;
const H_USAGE: usize = 2;
const H_PEAK: usize = 3;
const H_JOINED: usize = 4;
const H_REAPED: usize = 5;
const H_LAST_REAP: usize = 6;
/// The pressure futex: bumped (its low 32 bits) by a member that finds the margin low.
const H_SEQ: usize = 7;
/// Reclaimers asleep on the futex.
const H_WAITERS: usize = 8;
/// A signal is out and no reclaimer has started a round since (one wake per round).
const H_PENDING: usize = 9;
/// Members present now.
const H_MEMBERS: usize = 10;
/// The member slot (word index) that signalled last.
const H_SIGNALLER: usize = 11;

const M_PID: usize = 0;
const M_USAGE: usize = 1;
const M_PEAK: usize = 2;
const M_START: usize = 3;

/// Members this program image holds (several managers of one process may share a group). A
/// join that finds none here but a slot under its own pid is in a process that exec'd.
static LIVE_HERE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How often a member short of pages looks for dead members.
const REAP_INTERVAL_MS: u64 = 100;

/// [`MemCgroup::margin`] of a process that left its group: no limit.
const UNLIMITED: u64 = u64::MAX / 4;

/// One member's figures, as [`MemCgroup::members`] lists them (live members only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStat {
    pub pid: u32,
    /// Pages charged now.
    pub usage: u64,
    /// The most pages it held at once.
    pub peak: u64,
}

/// A group's totals ([`MemCgroup::stat`]), in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupStat {
    pub limit: u64,
    pub usage: u64,
    /// The most pages the whole group held at once (`memory.peak`).
    pub peak: u64,
    /// Processes that ever joined.
    pub joined: u64,
    /// Pages uncharged on behalf of members that died holding them.
    pub reaped: u64,
}

/// A process's handle on a group's shared counter; with a member slot after [`MemCgroup::join`].
#[derive(Debug)]
pub struct MemCgroup {
    map: Mapping,
    path: PathBuf,
    /// Word index of this process's member slot, and the pid that took it (a fork child that
    /// inherits the handle is not that member and never touches the slot).
    member: Option<(usize, u32)>,
    /// Set by [`MemCgroup::leave`]: the process is exiting and gave its charge back; from then
    /// on it charges nothing and its slot (free, maybe another process's) is never touched.
    left: AtomicBool,
    /// Charges and uncharges of the member slot in progress: `leave` waits for them before it
    /// frees the slot, so none lands in a slot freed (or taken by another process) under it.
    busy: AtomicU32,
}

fn err(path: &Path, what: &str, e: impl Into<std::io::Error>) -> Error {
    Error::io(format!("budget group {}: {what}", path.display()), e.into())
}

fn invalid(path: &Path, why: String) -> Error {
    Error::io(
        format!("budget group {}", path.display()),
        std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    )
}

/// The start time of process `pid` (field 22 of /proc/PID/stat, clock ticks since boot); None
/// if it is gone or has exited (a zombie: its memory is freed, its parent has not waited yet).
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let mut fields = s[s.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn now_ms() -> u64 {
    // CLOCK_MONOTONIC is one clock for every process of the machine.
    crate::sys::monotonic_ns() / 1_000_000
}

impl MemCgroup {
    /// Creates a group file at `path` (mode 0600, must not exist) with a limit of `limit` bytes
    /// (`usermm run` does, once per run).
    pub fn create(path: &Path, limit: u64) -> Result<MemCgroup> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| err(path, "creating it", e))?;
        f.set_len(FILE_LEN as u64)
            .map_err(|e| err(path, "sizing it", e))?;
        let map = Mapping::shared(&f, FILE_LEN).map_err(|e| err(path, "mapping it", e))?;
        let g = MemCgroup {
            map,
            path: path.to_path_buf(),
            member: None,
            left: AtomicBool::new(false),
            busy: AtomicU32::new(0),
        };
        g.word(H_LIMIT)
            .store((limit / PAGE_SIZE as u64).max(1), Ordering::Relaxed);
        g.word(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(g)
    }

    /// Opens the group file at `path` without joining it (to read its figures).
    pub fn open(path: &Path) -> Result<MemCgroup> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| err(path, "opening it (USERMM_GROUP names a file `usermm run` creates; unset it to give this process a budget of its own)", e))?;
        let len = f.metadata().map_err(|e| err(path, "stat", e))?.len();
        if len != FILE_LEN as u64 {
            return Err(invalid(
                path,
                format!("{len} bytes, not {FILE_LEN}: not a usermm budget group file"),
            ));
        }
        let map = Mapping::shared(&f, FILE_LEN).map_err(|e| err(path, "mapping it", e))?;
        let g = MemCgroup {
            map,
            path: path.to_path_buf(),
            member: None,
            left: AtomicBool::new(false),
            busy: AtomicU32::new(0),
        };
        if g.word(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(invalid(
                path,
                "not a usermm budget group file (wrong magic)".into(),
            ));
        }
        Ok(g)
    }

    /// Opens the group at `path` and takes a member slot for this process. A slot this pid
    /// already holds is the image this process replaced by exec(2) (its manager went without
    /// leaving): its charge is dropped first.
    pub fn join(path: &Path) -> Result<MemCgroup> {
        let mut g = Self::open(path)?;
        let pid = std::process::id();
        let start = start_time(pid).unwrap_or(0);
        if LIVE_HERE.load(Ordering::Acquire) == 0 {
            for i in 0..MAX_MEMBERS {
                let base = HEADER_WORDS + i * MEMBER_WORDS;
                if g.word(base + M_PID).load(Ordering::Acquire) == u64::from(pid) {
                    g.release(base, u64::from(pid));
                }
            }
        }
        for _pass in 0..2 {
            for i in 0..MAX_MEMBERS {
                let base = HEADER_WORDS + i * MEMBER_WORDS;
                if g.word(base + M_PID)
                    .compare_exchange(0, u64::from(pid), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    g.word(base + M_USAGE).store(0, Ordering::Relaxed);
                    g.word(base + M_PEAK).store(0, Ordering::Relaxed);
                    g.word(base + M_START).store(start, Ordering::Release);
                    g.word(H_JOINED).fetch_add(1, Ordering::Relaxed);
                    g.word(H_MEMBERS).fetch_add(1, Ordering::AcqRel);
                    g.member = Some((base, pid));
                    LIVE_HERE.fetch_add(1, Ordering::AcqRel);
                    return Ok(g);
                }
            }
            // Full: dead members may hold slots.
            g.reap_dead(true);
        }
        Err(invalid(
            path,
            format!("{MAX_MEMBERS} processes are members already"),
        ))
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        self.map.atomic_u64(i * 8)
    }

    /// The group file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The limit in pages.
    pub fn limit(&self) -> u64 {
        self.word(H_LIMIT).load(Ordering::Relaxed)
    }

    /// Pages charged by the whole group.
    pub fn usage(&self) -> u64 {
        self.word(H_USAGE).load(Ordering::Relaxed)
    }

    /// Pages the group may still charge (`page_counter` margin).
    pub fn margin(&self) -> u64 {
        if self.has_left() {
            return UNLIMITED;
        }
        self.limit().saturating_sub(self.usage())
    }

    /// Whether this process has left the group ([`MemCgroup::leave`]).
    pub fn has_left(&self) -> bool {
        self.left.load(Ordering::Relaxed)
    }

    /// Runs `op` on this process's member slot (its word index), unless there is none or the
    /// process has left; [`MemCgroup::leave`] frees the slot only once no `op` runs.
    fn with_member<T>(&self, op: impl FnOnce(usize) -> T) -> Option<T> {
        let (b, _) = self.member?;
        // Dekker's pairing with `leave`: either this sees `left`, or `leave` sees `busy`.
        self.busy.fetch_add(1, Ordering::SeqCst);
        let r = (!self.left.load(Ordering::SeqCst)).then(|| op(b));
        self.busy.fetch_sub(1, Ordering::Release);
        r
    }

    /// The process is exiting: uncharges everything it holds and frees its member slot now
    /// (`exit_mmap`'s uncharge in a memory cgroup), instead of leaving it to the next member
    /// that finds it dead. Afterwards [`try_charge`](Self::try_charge) grants every request
    /// without charging the group, so the process's last allocations never wait on the others'
    /// reclaim. Returns the pages given back (0 if it had left already, or for a fork child's
    /// inherited handle, which is not the member).
    pub fn leave(&self) -> u64 {
        let Some((b, pid)) = self.member else {
            return 0;
        };
        if pid != std::process::id() || self.left.swap(true, Ordering::SeqCst) {
            return 0;
        }
        while self.busy.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        LIVE_HERE.fetch_sub(1, Ordering::AcqRel);
        let n = self.release(b, u64::from(pid)).unwrap_or(0);
        // Members asleep in their reclaimers see the room at once.
        self.wake_all();
        n
    }

    /// Pages charged by this process.
    pub fn my_usage(&self) -> u64 {
        self.with_member(|b| self.word(b + M_USAGE).load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Whether the last member that signalled pressure was another one (this process's own
    /// shortage is its kswapd's and direct reclaim's to meet: draining its own recycled pages
    /// for itself would only cost their reuse).
    pub fn others_short(&self) -> bool {
        self.with_member(|b| self.word(H_SIGNALLER).load(Ordering::Relaxed) != b as u64)
            .unwrap_or(false)
    }

    /// `page_counter_try_charge` of up to `n` pages: charges as many as the limit allows (all
    /// or part of `n`, maybe none) and returns how many. After [`leave`](Self::leave): all of
    /// `n`, charged to nobody.
    pub fn try_charge(&self, n: u64) -> u64 {
        if self.member.is_none() {
            return 0;
        }
        self.with_member(|b| {
            let limit = self.limit();
            let usage = self.word(H_USAGE);
            let mut cur = usage.load(Ordering::Relaxed);
            let k = loop {
                let k = n.min(limit.saturating_sub(cur));
                if k == 0 {
                    return 0;
                }
                match usage.compare_exchange_weak(cur, cur + k, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => break k,
                    Err(v) => cur = v,
                }
            };
            self.word(H_PEAK).fetch_max(cur + k, Ordering::Relaxed);
            let mine = self.word(b + M_USAGE).fetch_add(k, Ordering::Relaxed) + k;
            self.word(b + M_PEAK).fetch_max(mine, Ordering::Relaxed);
            k
        })
        .unwrap_or(n)
    }

    /// `page_counter_uncharge` of `n` pages this process charged (nothing after
    /// [`leave`](Self::leave), which gave them all back).
    pub fn uncharge(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.with_member(|b| {
            let prev = self.word(b + M_USAGE).fetch_sub(n, Ordering::Relaxed);
            debug_assert!(prev >= n, "uncharged {n} of {prev} pages");
            self.word(H_USAGE).fetch_sub(n, Ordering::AcqRel);
        });
    }

    /// Tells the group's reclaimers (`vmscan::memcg_reclaimd`, one per member) that the margin
    /// is low: one futex wake per round, however many members call this meanwhile.
    pub fn signal_pressure(&self) {
        // Alone in the group, the caller's own kswapd and direct reclaim are the group's.
        let Some((b, _)) = self.member else {
            return;
        };
        if self.has_left() {
            return;
        }
        if self.word(H_MEMBERS).load(Ordering::Relaxed) < 2 {
            return;
        }
        self.word(H_SIGNALLER).store(b as u64, Ordering::Relaxed);
        if self
            .word(H_PENDING)
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let seq = self.map.atomic_u32(H_SEQ * 8);
        seq.fetch_add(1, Ordering::AcqRel);
        if self.word(H_WAITERS).load(Ordering::Acquire) > 0 {
            crate::sys::futex_wake(seq, u32::MAX);
        }
    }

    /// A reclaimer's sleep: until a member signals pressure or `timeout` passes. It starts a
    /// round after it: the next signal wakes the sleepers again.
    pub fn wait_pressure(&self, timeout: std::time::Duration) {
        let seq = self.map.atomic_u32(H_SEQ * 8);
        let s = seq.load(Ordering::Acquire);
        self.word(H_WAITERS).fetch_add(1, Ordering::AcqRel);
        // A signal that landed before the count went up finds no sleeper and wakes nobody, but
        // it has changed the word or is about to: look once more before sleeping.
        if self.word(H_PENDING).load(Ordering::Acquire) == 0 && seq.load(Ordering::Acquire) == s {
            crate::sys::futex_wait(seq, s, timeout);
        }
        self.word(H_WAITERS).fetch_sub(1, Ordering::AcqRel);
        self.word(H_PENDING).store(0, Ordering::Release);
    }

    /// Wakes this group's sleeping reclaimers now (a member's manager is going: its reclaimer
    /// must see the shutdown).
    pub fn wake_all(&self) {
        let seq = self.map.atomic_u32(H_SEQ * 8);
        seq.fetch_add(1, Ordering::AcqRel);
        crate::sys::futex_wake(seq, u32::MAX);
    }

    /// Uncharges the pages of members that died without leaving (killed), at most every
    /// [`REAP_INTERVAL_MS`] across the group unless `now`; returns the pages freed.
    pub fn reap_dead(&self, now: bool) -> u64 {
        if self.has_left() {
            return 0;
        }
        let t = now_ms();
        let last = self.word(H_LAST_REAP);
        let prev = last.load(Ordering::Relaxed);
        if !now
            && (t.saturating_sub(prev) < REAP_INTERVAL_MS
                || last
                    .compare_exchange(prev, t, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err())
        {
            return 0;
        }
        let me = self.member.map(|(b, _)| b);
        let mut freed = 0;
        for i in 0..MAX_MEMBERS {
            let base = HEADER_WORDS + i * MEMBER_WORDS;
            if Some(base) == me {
                continue;
            }
            let pid = self.word(base + M_PID).load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let Ok(pid32) = u32::try_from(pid) else {
                continue;
            };
            let start = self.word(base + M_START).load(Ordering::Acquire);
            // A member that joined a moment ago may not have written its start time yet.
            if start == 0 || start_time(pid32) == Some(start) {
                continue;
            }
            // Exited (or its pid reused by another process) without leaving: its manager was
            // not dropped (exit(2) runs no destructors of statics) or it was killed.
            if let Some(n) = self.release(base, pid) {
                self.word(H_REAPED).fetch_add(n, Ordering::Relaxed);
                if n > 0 {
                    log::info!(
                        "budget group {}: process {pid} exited holding {n} pages; uncharged",
                        self.path.display()
                    );
                }
                freed += n;
            }
        }
        freed
    }

    /// Frees the member slot at word `base` if `pid` still holds it, uncharging its pages
    /// (whoever clears the pid uncharges); returns them.
    fn release(&self, base: usize, pid: u64) -> Option<u64> {
        self.word(base + M_PID)
            .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let n = self.word(base + M_USAGE).swap(0, Ordering::AcqRel);
        self.word(H_USAGE).fetch_sub(n, Ordering::AcqRel);
        self.word(H_MEMBERS).fetch_sub(1, Ordering::AcqRel);
        Some(n)
    }

    /// The group's totals.
    pub fn stat(&self) -> GroupStat {
        GroupStat {
            limit: self.limit(),
            usage: self.usage(),
            peak: self.word(H_PEAK).load(Ordering::Relaxed),
            joined: self.word(H_JOINED).load(Ordering::Relaxed),
            reaped: self.word(H_REAPED).load(Ordering::Relaxed),
        }
    }

    /// The members present now.
    pub fn members(&self) -> Vec<MemberStat> {
        (0..MAX_MEMBERS)
            .filter_map(|i| {
                let base = HEADER_WORDS + i * MEMBER_WORDS;
                let pid = self.word(base + M_PID).load(Ordering::Acquire);
                (pid != 0).then(|| MemberStat {
                    pid: u32::try_from(pid).unwrap_or(u32::MAX),
                    usage: self.word(base + M_USAGE).load(Ordering::Relaxed),
                    peak: self.word(base + M_PEAK).load(Ordering::Relaxed),
                })
            })
            .collect()
    }
}

impl Drop for MemCgroup {
    /// Leaving: uncharges what this process still holds (its manager is going, with its frames)
    /// and frees the slot. A fork child's inherited copy of the parent's handle does nothing.
    fn drop(&mut self) {
        if let Some((b, pid)) = self.member.take() {
            if pid == std::process::id() && !*self.left.get_mut() {
                self.release(b, u64::from(pid));
                LIVE_HERE.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("usermm-memcg-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn charges_stop_at_the_limit_and_members_leave_clean() {
        let p = tmp("limit");
        let g = MemCgroup::create(&p, 100 * PAGE_SIZE as u64).unwrap();
        let a = MemCgroup::join(&p).unwrap();
        let b = MemCgroup::join(&p).unwrap();
        assert_eq!(a.try_charge(60), 60);
        assert_eq!(b.try_charge(60), 40, "only the margin is charged");
        assert_eq!(b.try_charge(1), 0);
        assert_eq!(g.margin(), 0);
        a.uncharge(10);
        assert_eq!(g.usage(), 90);
        assert_eq!(a.my_usage(), 50);
        let mut m = g.members();
        m.sort_by_key(|s| s.usage);
        assert_eq!(
            m.iter().map(|s| (s.usage, s.peak)).collect::<Vec<_>>(),
            [(40, 40), (50, 60)]
        );
        drop(b);
        assert_eq!(g.usage(), 50, "a member leaving uncharges what it held");
        assert_eq!(g.members().len(), 1);
        let st = g.stat();
        assert_eq!((st.limit, st.peak, st.joined), (100, 100, 2));
        drop(a);
        assert_eq!(g.usage(), 0);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn concurrent_charges_never_pass_the_limit() {
        let p = tmp("race");
        let g = MemCgroup::create(&p, 1000 * PAGE_SIZE as u64).unwrap();
        let members: Vec<MemCgroup> = (0..4).map(|_| MemCgroup::join(&p).unwrap()).collect();
        std::thread::scope(|s| {
            for m in &members {
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let k = m.try_charge(1 + i % 7);
                        assert!(m.my_usage() <= 1000);
                        m.uncharge(k);
                    }
                });
            }
        });
        assert_eq!(g.usage(), 0);
        assert!(g.stat().peak <= 1000);
        drop(members);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_dead_members_pages_are_reaped_but_a_live_ones_are_not() {
        let p = tmp("reap");
        let g = MemCgroup::create(&p, 100 * PAGE_SIZE as u64).unwrap();
        let me = MemCgroup::join(&p).unwrap();
        assert_eq!(me.try_charge(30), 30);
        // A member whose process is gone: a child that exited, its pid and start time recorded.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap_or(1);
        child.wait().unwrap();
        let base = HEADER_WORDS + (MAX_MEMBERS - 1) * MEMBER_WORDS;
        g.word(base + M_START).store(start, Ordering::Relaxed);
        g.word(base + M_USAGE).store(25, Ordering::Relaxed);
        g.word(H_USAGE).fetch_add(25, Ordering::Relaxed);
        g.word(base + M_PID)
            .store(u64::from(pid), Ordering::Release);
        assert_eq!(g.usage(), 55);
        assert_eq!(me.reap_dead(true), 25);
        assert_eq!(g.usage(), 30, "the live member keeps its charge");
        assert_eq!(g.stat().reaped, 25);
        assert_eq!(g.members().len(), 1);
        drop(me);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn bad_files_fail_naming_the_path() {
        let p = tmp("bad");
        std::fs::write(&p, b"hello").unwrap();
        let e = MemCgroup::join(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("not a usermm budget group"),
            "{e}"
        );
        std::fs::remove_file(&p).unwrap();
        let e = MemCgroup::join(&p).unwrap_err().to_string();
        assert!(e.contains("USERMM_GROUP"), "{e}");
    }

    #[test]
    fn a_member_that_leaves_gives_its_charge_back_at_once_and_charges_nothing_after() {
        let p = tmp("leave");
        let g = MemCgroup::create(&p, 100 * PAGE_SIZE as u64).unwrap();
        let a = MemCgroup::join(&p).unwrap();
        let b = MemCgroup::join(&p).unwrap();
        assert_eq!(a.try_charge(70), 70);
        assert_eq!(b.try_charge(50), 30, "the limit holds before a leaves");
        assert_eq!(a.leave(), 70);
        assert_eq!(a.leave(), 0, "leaving twice gives nothing back twice");
        assert!(a.has_left());
        assert_eq!(
            g.usage(),
            30,
            "a's pages are uncharged at once, not reaped later"
        );
        assert_eq!(g.members().len(), 1);
        assert_eq!(b.try_charge(70), 70, "b has the room a left");
        // A process that left: its last allocations are granted and charged to nobody, its
        // frees uncharge nothing, its slot is not touched again.
        assert_eq!(a.try_charge(40), 40);
        a.uncharge(40);
        a.uncharge(70);
        assert_eq!(a.my_usage(), 0);
        assert_eq!(g.usage(), 100);
        assert_eq!(a.reap_dead(true), 0);
        drop(a);
        assert_eq!(
            g.usage(),
            100,
            "dropping a left member releases nothing again"
        );
        assert_eq!(g.stat().reaped, 0);
        drop(b);
        assert_eq!(g.usage(), 0);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn leaving_while_threads_charge_loses_no_page_of_the_group() {
        let p = tmp("leave-race");
        let g = MemCgroup::create(&p, 10_000 * PAGE_SIZE as u64).unwrap();
        let other = MemCgroup::join(&p).unwrap();
        assert_eq!(other.try_charge(123), 123);
        for _round in 0..20 {
            let a = MemCgroup::join(&p).unwrap();
            let go = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                for t in 0..3u64 {
                    let (a, go) = (&a, &go);
                    s.spawn(move || {
                        let mut held = Vec::new();
                        for i in 0..5_000u64 {
                            held.push(a.try_charge(1 + (i + t) % 5));
                            if held.len() > 8 {
                                a.uncharge(held.remove(0));
                            }
                            if i == 2_000 {
                                go.store(true, Ordering::Release);
                            }
                        }
                        for k in held {
                            a.uncharge(k);
                        }
                    });
                }
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                a.leave();
            });
            drop(a);
            assert_eq!(
                g.usage(),
                123,
                "only the other member's pages stay charged, none leaked or lost"
            );
        }
        drop(other);
        assert_eq!(g.usage(), 0);
        std::fs::remove_file(&p).unwrap();
    }
}
