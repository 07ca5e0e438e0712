//! The mmap(2)-compatible address-space layer over usermm regions, shared by the C ABI
//! (`usermm_mmap`/`usermm_munmap`, the pointer-based `usermm_map_anon`/`usermm_unmap`) and the
//! preload library of `usermm run`. Mirrors the VMA side of `mm/mmap.c` and `mm/vma.c`: a tree
//! of mapped ranges, partial munmap (which splits a VMA in the kernel), MAP_FIXED replacement of
//! existing memory, and `mm/madvise.c`'s MADV_DONTNEED on private anonymous memory.
//!
//! A usermm [`Region`] can be neither split nor moved, so this layer keeps, per region, the set
//! of its pages that are still *live* (mapped from the caller's point of view):
//! * unmapping part of a region discards those pages (memory and swap are freed at once) and
//!   removes them from the live set; the address range itself stays reserved (reading it returns
//!   zeros, it is not given to anyone else) until the last live page of the region is unmapped,
//!   when the region is dropped and its address range returned to the kernel;
//! * `MAP_FIXED` anonymous memory over any part of a region (live or unmapped) is served in
//!   place: the pages are discarded (fresh zero-filled memory, exactly what the kernel gives) and
//!   become live again.
//!
//! Memory is only touched through the core crate, and system calls go through `usermm_sys`;
//! no `unsafe` here. The table lock is std's (a futex on the lock word): parking_lot's
//! process-wide parking table would hand a fork(2) child the queue entries of the parent's
//! threads parked at that moment, which the child's new threads (on the dead threads' cached
//! stacks) corrupt. Across a fork the forking thread holds the write guard ([`ForkHold`],
//! from [`Space::fork_prepare`]) and drops it in the parent and in the child.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLockReadGuard, RwLockWriteGuard};

use usermm::Region;

/// std's RwLock without poisoning (a panic while holding it is caught at the API edges and
/// must not wedge every later allocation).
#[derive(Debug)]
struct RwLock<T>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    const fn new(t: T) -> Self {
        RwLock(std::sync::RwLock::new(t))
    }
    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

type Table = BTreeMap<usize, Vma>;

/// The table's write lock, held across a fork(2) by the forking thread: from
/// [`Space::fork_prepare`] to [`Space::fork_parent`] or [`Space::fork_child_forget`] (the
/// pthread_atfork handlers, which run on that thread; the caller keeps it meanwhile).
#[derive(Debug)]
pub struct ForkHold(RwLockWriteGuard<'static, Table>);

/// The page size of usermm regions.
pub const PAGE: usize = 4096;

/// Rounds `n` up to a whole number of pages (None on overflow).
pub fn page_round_up(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(PAGE)
}

/// A set of page indices kept as disjoint half-open intervals `start -> end`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intervals {
    iv: BTreeMap<u64, u64>,
    count: u64,
}

impl Intervals {
    /// The set `[0, n)`.
    pub fn full(n: u64) -> Intervals {
        let mut s = Intervals::default();
        s.add(0, n);
        s
    }

    /// Number of pages in the set.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Removes `[a, b)`.
    pub fn remove(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        // Intervals that may overlap: the one starting before `a` and all starting in [a, b).
        let mut hit: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, &e)) = self.iv.range(..a).next_back() {
            if e > a {
                hit.push((s, e));
            }
        }
        hit.extend(self.iv.range(a..b).map(|(&s, &e)| (s, e)));
        for (s, e) in hit {
            self.iv.remove(&s);
            self.count -= e - s;
            if s < a {
                self.iv.insert(s, a);
                self.count += a - s;
            }
            if e > b {
                self.iv.insert(b, e);
                self.count += e - b;
            }
        }
    }

    /// Adds `[a, b)`, merging with neighbours.
    pub fn add(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        self.remove(a, b);
        let (mut s, mut e) = (a, b);
        if let Some((&ps, &pe)) = self.iv.range(..a).next_back() {
            if pe == a {
                self.iv.remove(&ps);
                self.count -= pe - ps;
                s = ps;
            }
        }
        if let Some(&ne) = self.iv.get(&b) {
            self.iv.remove(&b);
            self.count -= ne - b;
            e = ne;
        }
        self.iv.insert(s, e);
        self.count += e - s;
    }

    /// True when every page of `[a, b)` is in the set.
    pub fn contains_all(&self, a: u64, b: u64) -> bool {
        if a >= b {
            return true;
        }
        match self.iv.range(..=a).next_back() {
            Some((_, &e)) => e >= b,
            None => false,
        }
    }

    /// The intervals, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.iv.iter().map(|(&s, &e)| (s, e))
    }
}

/// What a managed range was created by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// mmap-like: `usermm_mmap`, `usermm_map_anon` or an intercepted mmap(2).
    Mmap,
    /// An intercepted malloc-family allocation returning `ptr` (inside the region).
    Malloc { ptr: usize },
}

#[derive(Debug)]
struct Vma {
    region: Arc<Region>,
    len: usize,
    live: Intervals,
    kind: Kind,
}

impl Vma {
    fn end(&self, start: usize) -> usize {
        start + self.len
    }
}

/// A piece of an address range: managed by this space or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: usize,
    pub len: usize,
    pub managed: bool,
}

/// How much of an address range this space manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    None,
    Partial,
    Full,
}

/// A managed range as a fork(2) child must be given it ([`Space::fork_prepare_ranges`]).
#[derive(Debug, Clone)]
pub struct ForkRange {
    pub start: usize,
    pub len: usize,
    pub kind: Kind,
    pub region: Arc<Region>,
}

/// A managed range as seen by a lookup.
#[derive(Debug, Clone)]
pub struct VmaInfo {
    pub start: usize,
    pub len: usize,
    pub kind: Kind,
    pub region: Arc<Region>,
    /// Pages still mapped from the caller's point of view.
    pub live_pages: u64,
}

/// The managed ranges of one address space (one per manager in the C ABI, one per process in
/// the preload library).
#[derive(Debug)]
pub struct Space {
    table: RwLock<Table>,
    /// Lowest start and highest end ever managed: a lock-free first test for `free(3)`.
    lo: AtomicUsize,
    hi: AtomicUsize,
}

impl Default for Space {
    fn default() -> Self {
        Space::new()
    }
}

impl Space {
    pub const fn new() -> Space {
        Space {
            table: RwLock::new(BTreeMap::new()),
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
        }
    }

    /// Adds a fresh region (all pages live); returns its start address.
    pub fn insert(&self, region: Region, kind: Kind) -> usize {
        let start = region.as_ptr() as usize;
        let len = region.len();
        let vma = Vma {
            live: Intervals::full((len / PAGE) as u64),
            region: Arc::new(region),
            len,
            kind,
        };
        let mut t = self.table.write();
        self.lo.fetch_min(start, Ordering::Relaxed);
        self.hi.fetch_max(start + len, Ordering::Relaxed);
        t.insert(start, vma);
        start
    }

    /// False when no byte of `[addr, addr+len)` can be managed (no lock taken).
    pub fn might_overlap(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len.max(1));
        end > self.lo.load(Ordering::Relaxed) && addr < self.hi.load(Ordering::Relaxed)
    }

    fn overlapping(t: &BTreeMap<usize, Vma>, addr: usize, end: usize) -> Vec<usize> {
        let mut v: Vec<usize> = t
            .range(..end)
            .rev()
            .take_while(|(&s, vma)| vma.end(s) > addr)
            .map(|(&s, _)| s)
            .collect();
        v.reverse();
        v
    }

    /// Splits `[addr, addr+len)` into managed and unmanaged pieces, in address order.
    pub fn segments(&self, addr: usize, len: usize) -> Vec<Segment> {
        let end = addr.saturating_add(len);
        if !self.might_overlap(addr, len) {
            return vec![Segment {
                addr,
                len,
                managed: false,
            }];
        }
        let t = self.table.read();
        let mut out = Vec::new();
        let mut cur = addr;
        for s in Self::overlapping(&t, addr, end) {
            let e = t[&s].end(s);
            let (a, b) = (s.max(addr), e.min(end));
            if a > cur {
                out.push(Segment {
                    addr: cur,
                    len: a - cur,
                    managed: false,
                });
            }
            out.push(Segment {
                addr: a,
                len: b - a,
                managed: true,
            });
            cur = b;
        }
        if cur < end {
            out.push(Segment {
                addr: cur,
                len: end - cur,
                managed: false,
            });
        }
        out
    }

    /// How much of `[addr, addr+len)` is managed (live or unmapped pages of a region alike).
    pub fn coverage(&self, addr: usize, len: usize) -> Coverage {
        let segs = self.segments(addr, len);
        match (
            segs.iter().any(|s| s.managed),
            segs.iter().all(|s| s.managed),
        ) {
            (false, _) => Coverage::None,
            (true, true) => Coverage::Full,
            (true, false) => Coverage::Partial,
        }
    }

    /// True when every page of `[addr, addr+len)` is managed and live.
    pub fn all_live(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len);
        let t = self.table.read();
        let mut cur = addr;
        for s in Self::overlapping(&t, addr, end) {
            let v = &t[&s];
            if s > cur {
                return false;
            }
            let (a, b) = (cur, v.end(s).min(end));
            let (pa, pb) = (((a - s) / PAGE) as u64, (b - s).div_ceil(PAGE) as u64);
            if !v.live.contains_all(pa, pb) {
                return false;
            }
            cur = b;
        }
        cur >= end
    }

    /// The managed range containing `addr`.
    pub fn find(&self, addr: usize) -> Option<VmaInfo> {
        if !self.might_overlap(addr, 1) {
            return None;
        }
        let t = self.table.read();
        let (&s, v) = t.range(..=addr).next_back()?;
        (addr < v.end(s)).then(|| VmaInfo {
            start: s,
            len: v.len,
            kind: v.kind,
            region: v.region.clone(),
            live_pages: v.live.count(),
        })
    }

    /// Unmaps the managed pages of `[addr, addr+len)` (page aligned): discards them and removes
    /// them from the live set. Returns the regions left without live pages, already removed
    /// from the table: dropping them (outside any lock of the caller) returns their address
    /// ranges to the kernel.
    pub fn unmap(&self, addr: usize, len: usize) -> Vec<Arc<Region>> {
        let end = addr.saturating_add(len);
        let mut gone = Vec::new();
        let mut t = self.table.write();
        for s in Self::overlapping(&t, addr, end) {
            let v = t.get_mut(&s).expect("overlapping start is in the table");
            let (a, b) = (s.max(addr), v.end(s).min(end));
            let (pa, pb) = (((a - s) / PAGE) as u64, (b - s).div_ceil(PAGE) as u64);
            v.live.remove(pa, pb);
            if v.live.is_empty() {
                let v = t.remove(&s).expect("present");
                gone.push(v.region);
            } else {
                let off = pa as usize * PAGE;
                let n = (pb - pa) as usize * PAGE;
                // In range by construction; an error here would be a bug in this layer.
                let _ = v.region.discard(off, n);
            }
        }
        gone
    }

    /// Serves `MAP_FIXED` private anonymous memory over `[addr, addr+len)`, which must be fully
    /// managed (check with [`coverage`](Self::coverage) under the same caller-side
    /// serialization): the pages become fresh zero-filled memory and live. Returns false (and
    /// changes nothing) when the range is not fully managed.
    pub fn map_fixed(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len);
        let mut t = self.table.write();
        let starts = Self::overlapping(&t, addr, end);
        // Full coverage check under the write lock.
        let mut cur = addr;
        for &s in &starts {
            if s > cur {
                return false;
            }
            cur = t[&s].end(s).min(end);
        }
        if cur < end {
            return false;
        }
        for s in starts {
            let v = t.get_mut(&s).expect("present");
            let (a, b) = (s.max(addr), v.end(s).min(end));
            let (pa, pb) = (((a - s) / PAGE) as u64, (b - s).div_ceil(PAGE) as u64);
            let _ = v
                .region
                .discard(pa as usize * PAGE, (pb - pa) as usize * PAGE);
            v.live.add(pa, pb);
        }
        true
    }

    /// MADV_DONTNEED on the managed pages of `[addr, addr+len)` (page aligned): they read as
    /// zeros afterwards; memory and swap are freed.
    pub fn discard(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len);
        let t = self.table.read();
        for s in Self::overlapping(&t, addr, end) {
            let v = &t[&s];
            let (a, b) = (s.max(addr), v.end(s).min(end));
            let (pa, pb) = ((a - s) / PAGE, (b - s).div_ceil(PAGE));
            let _ = v.region.discard(pa * PAGE, (pb - pa) * PAGE);
        }
    }

    /// The malloc allocation returning `ptr`, if this space holds it: (region, usable bytes).
    pub fn malloc_lookup(&self, ptr: usize) -> Option<(Arc<Region>, usize)> {
        let v = self.find(ptr)?;
        match v.kind {
            Kind::Malloc { ptr: p } if p == ptr => Some((v.region, v.start + v.len - ptr)),
            _ => None,
        }
    }

    /// Removes the malloc allocation returning `ptr`; the caller drops the region.
    pub fn take_malloc(&self, ptr: usize) -> Option<Arc<Region>> {
        if !self.might_overlap(ptr, 1) {
            return None;
        }
        // Most pointers tested here are not ours (glibc's thread arenas live among usermm's
        // regions): decide under the shared lock, take the exclusive one only to remove.
        {
            let t = self.table.read();
            let (&s, v) = t.range(..=ptr).next_back()?;
            if ptr >= v.end(s) || v.kind != (Kind::Malloc { ptr }) {
                return None;
            }
        }
        let mut t = self.table.write();
        let (&s, v) = t.range(..=ptr).next_back()?;
        if ptr >= v.end(s) || v.kind != (Kind::Malloc { ptr }) {
            return None;
        }
        t.remove(&s).map(|v| v.region)
    }

    /// Number of managed ranges and their total length in bytes.
    pub fn stats(&self) -> (usize, usize) {
        let t = self.table.read();
        (t.len(), t.values().map(|v| v.len).sum())
    }

    /// Locks the table exclusively for a fork (pthread_atfork prepare), so that the child sees
    /// a consistent table. Pass the hold to [`fork_parent`](Self::fork_parent) or
    /// [`fork_child_forget`](Self::fork_child_forget) on the same thread.
    pub fn fork_prepare(&'static self) -> ForkHold {
        ForkHold(self.table.write())
    }

    /// As [`fork_prepare`](Self::fork_prepare), and returns every managed range (start,
    /// length, what made it, region) as it is while locked: what a fork(2) child must be
    /// given a copy of.
    pub fn fork_prepare_ranges(&'static self) -> (ForkHold, Vec<ForkRange>) {
        let t = self.table.write();
        let v = t
            .iter()
            .map(|(&s, vma)| ForkRange {
                start: s,
                len: vma.len,
                kind: vma.kind,
                region: vma.region.clone(),
            })
            .collect();
        (ForkHold(t), v)
    }

    /// Unlocks after [`fork_prepare`](Self::fork_prepare), in the parent.
    pub fn fork_parent(&'static self, hold: ForkHold) {
        drop(hold);
    }

    /// In a forked child, after [`fork_prepare`](Self::fork_prepare): forgets every region
    /// without dropping it (the manager's threads and mappings do not exist in the child;
    /// dropping would talk to the parent's userfaultfd), then unlocks. The child's only thread
    /// is the forking one, which holds the lock. Returns how many regions were forgotten.
    pub fn fork_child_forget(&'static self, hold: ForkHold) -> usize {
        let mut t = hold.0;
        let old = std::mem::take(&mut *t);
        let n = old.len();
        std::mem::forget(old);
        self.lo.store(usize::MAX, Ordering::Relaxed);
        self.hi.store(0, Ordering::Relaxed);
        drop(t);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_add_remove_merge() {
        let mut s = Intervals::full(10);
        s.remove(2, 4);
        s.remove(6, 7);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 2), (4, 6), (7, 10)]);
        assert_eq!(s.count(), 7);
        assert!(s.contains_all(4, 6));
        assert!(!s.contains_all(3, 5));
        s.add(3, 7);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 2), (3, 10)]);
        assert_eq!(s.count(), 9);
        s.add(2, 3);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 10)]);
        s.remove(0, 10);
        assert!(s.is_empty());
        s.add(5, 6);
        s.add(1, 2);
        s.remove(0, 100);
        assert!(s.is_empty());
    }

    #[test]
    fn intervals_match_a_bitset_model() {
        // Deterministic pseudo-random operations checked against a plain bitset.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut s = Intervals::full(64);
        let mut model = [true; 64];
        for _ in 0..2000 {
            let a = next(64);
            let b = a + next(64 - a + 1);
            let add = next(2) == 0;
            if add {
                s.add(a, b);
            } else {
                s.remove(a, b);
            }
            for m in &mut model[a as usize..b as usize] {
                *m = add;
            }
            assert_eq!(s.count(), model.iter().filter(|&&m| m).count() as u64);
            let mut expect = vec![];
            let mut i = 0;
            while i < 64 {
                if model[i] {
                    let st = i;
                    while i < 64 && model[i] {
                        i += 1;
                    }
                    expect.push((st as u64, i as u64));
                } else {
                    i += 1;
                }
            }
            assert_eq!(s.iter().collect::<Vec<_>>(), expect);
        }
    }
}

/// What an mmap(2) request asks of usermm (see [`classify_mmap`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MmapRequest {
    /// Private anonymous read-write memory of `len` bytes (rounded up to pages); `fixed` is the
    /// address for MAP_FIXED (`noreplace` for MAP_FIXED_NOREPLACE).
    Anon {
        len: usize,
        fixed: Option<(usize, bool)>,
    },
    /// Not servable by usermm: mmap(2) would fail with or usermm_mmap fails with `errno`,
    /// and `msg` says why. The preload library passes such requests to the kernel instead.
    Unserved { errno: i32, msg: String },
}

/// Flags usermm serves (they do not change the semantics of private anonymous memory, or only
/// as a hint): MAP_NORESERVE (usermm's own commit accounting applies), MAP_POPULATE and
/// MAP_NONBLOCK (hints, ignored), MAP_STACK (a no-op in Linux too), MAP_DENYWRITE,
/// MAP_EXECUTABLE and MAP_FILE (ignored by Linux).
const SERVED_FLAGS: i32 = libc::MAP_PRIVATE
    | libc::MAP_ANONYMOUS
    | libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_NORESERVE
    | libc::MAP_POPULATE
    | libc::MAP_NONBLOCK
    | libc::MAP_STACK
    | libc::MAP_DENYWRITE
    | libc::MAP_EXECUTABLE
    | libc::MAP_FILE;

/// Flags Linux knows that usermm does not serve.
const UNSERVED_FLAGS: i32 = libc::MAP_SHARED
    | libc::MAP_SHARED_VALIDATE
    | libc::MAP_HUGETLB
    | libc::MAP_LOCKED
    | libc::MAP_GROWSDOWN
    | libc::MAP_32BIT
    | libc::MAP_SYNC
    | (0x3f << libc::MAP_HUGE_SHIFT);

/// Classifies an mmap(2) call (with mmap's argument conventions) into what usermm serves and
/// what it does not, with the errno and a message for the latter.
///
/// Served: `MAP_PRIVATE | MAP_ANONYMOUS` with `PROT_READ | PROT_WRITE`, any length > 0, the
/// flags in the served set, MAP_FIXED / MAP_FIXED_NOREPLACE at a page-aligned address (whether
/// the address is servable is decided against a [`Space`]). A hint address without MAP_FIXED
/// is ignored, as the kernel may.
pub fn classify_mmap(
    addr: usize,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> MmapRequest {
    let un = |errno: i32, msg: String| MmapRequest::Unserved { errno, msg };
    if len == 0 {
        return un(libc::EINVAL, "length is zero: map at least one byte".into());
    }
    let Some(rlen) = page_round_up(len).filter(|&l| l <= isize::MAX as usize) else {
        return un(libc::ENOMEM, format!("length {len} is too large"));
    };
    if off.rem_euclid(PAGE as i64) != 0 || off < 0 {
        return un(
            libc::EINVAL,
            format!("offset {off} is not a non-negative multiple of the page size (4096)"),
        );
    }
    let unknown = flags & !(SERVED_FLAGS | UNSERVED_FLAGS);
    if unknown != 0 {
        return un(
            libc::EINVAL,
            format!("unknown flags {unknown:#x} in {flags:#x}"),
        );
    }
    match flags & 0x03 {
        x if x == libc::MAP_PRIVATE => {}
        x if x == libc::MAP_SHARED || x == libc::MAP_SHARED_VALIDATE => {
            return un(
                libc::ENOTSUP,
                "MAP_SHARED memory is not managed by usermm (only MAP_PRIVATE|MAP_ANONYMOUS is); use mmap(2) for shared memory".into(),
            )
        }
        _ => {
            return un(
                libc::EINVAL,
                "flags contain none of MAP_PRIVATE, MAP_SHARED or MAP_SHARED_VALIDATE".into(),
            )
        }
    }
    if flags & libc::MAP_ANONYMOUS == 0 {
        if fd < 0 {
            return un(
                libc::EBADF,
                format!("fd {fd} is not an open file and MAP_ANONYMOUS is not set"),
            );
        }
        let Ok(kind) = usermm_sys::fd_file_type(fd) else {
            return un(
                libc::EBADF,
                format!("fd {fd} is not an open file descriptor"),
            );
        };
        if kind != libc::S_IFREG {
            return un(
                libc::ENODEV,
                format!("fd {fd} is not a regular file: only regular files can be mapped"),
            );
        }
        return un(
            libc::ENODEV,
            format!("fd {fd}: file mappings are not served by usermm's mmap yet; use mmap(2)"),
        );
    }
    let bad = flags & UNSERVED_FLAGS & !(libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
    if bad != 0 {
        return un(
            libc::ENOTSUP,
            format!(
                "flags {bad:#x} (MAP_HUGETLB, MAP_LOCKED, MAP_GROWSDOWN, MAP_32BIT or MAP_SYNC) are not served by usermm"
            ),
        );
    }
    if prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
        return un(
            libc::EINVAL,
            format!("unknown protection bits in {prot:#x}"),
        );
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        return un(
            libc::ENOTSUP,
            format!("protection {prot:#x}: usermm serves PROT_READ|PROT_WRITE memory only"),
        );
    }
    let fixed = if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
        if !addr.is_multiple_of(PAGE) {
            return un(
                libc::EINVAL,
                format!("MAP_FIXED address {addr:#x} is not page aligned (4096)"),
            );
        }
        if addr.checked_add(rlen).is_none() {
            return un(
                libc::EINVAL,
                format!("MAP_FIXED range {addr:#x}+{len:#x} overflows"),
            );
        }
        Some((addr, flags & libc::MAP_FIXED == 0))
    } else {
        None
    };
    MmapRequest::Anon { len: rlen, fixed }
}

#[cfg(test)]
mod classify_tests {
    use super::*;
    const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
    const PA: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;

    fn errno(r: MmapRequest) -> i32 {
        match r {
            MmapRequest::Unserved { errno, msg } => {
                assert!(!msg.is_empty());
                errno
            }
            other => panic!("expected unserved, got {other:?}"),
        }
    }

    #[test]
    fn serves_private_anonymous_rw() {
        assert_eq!(
            classify_mmap(0, 5000, RW, PA | libc::MAP_NORESERVE, -1, 0),
            MmapRequest::Anon {
                len: 8192,
                fixed: None
            }
        );
        assert_eq!(
            classify_mmap(0x10000, 4096, RW, PA | libc::MAP_FIXED, -1, 0),
            MmapRequest::Anon {
                len: 4096,
                fixed: Some((0x10000, false))
            }
        );
        assert_eq!(
            classify_mmap(0x10000, 4096, RW, PA | libc::MAP_FIXED_NOREPLACE, -1, 0),
            MmapRequest::Anon {
                len: 4096,
                fixed: Some((0x10000, true))
            }
        );
    }

    #[test]
    fn rejects_with_mmap_errnos() {
        assert_eq!(errno(classify_mmap(0, 0, RW, PA, -1, 0)), libc::EINVAL);
        assert_eq!(errno(classify_mmap(0, 4096, RW, PA, -1, 100)), libc::EINVAL);
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, PA | 0x0020_0000, -1, 0)),
            libc::EINVAL
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, libc::MAP_ANONYMOUS, -1, 0)),
            libc::EINVAL
        );
        assert_eq!(
            errno(classify_mmap(
                0,
                4096,
                RW,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0
            )),
            libc::ENOTSUP
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, libc::MAP_PRIVATE, -1, 0)),
            libc::EBADF
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, libc::MAP_PRIVATE, 999_999, 0)),
            libc::EBADF
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, libc::MAP_PRIVATE, 0, 0)),
            libc::ENODEV
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, libc::PROT_NONE, PA, -1, 0)),
            libc::ENOTSUP
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, 0x100, PA, -1, 0)),
            libc::EINVAL
        );
        assert_eq!(
            errno(classify_mmap(0, 4096, RW, PA | libc::MAP_HUGETLB, -1, 0)),
            libc::ENOTSUP
        );
        assert_eq!(
            errno(classify_mmap(123, 4096, RW, PA | libc::MAP_FIXED, -1, 0)),
            libc::EINVAL
        );
        assert_eq!(
            errno(classify_mmap(0, usize::MAX, RW, PA, -1, 0)),
            libc::ENOMEM
        );
    }
}
