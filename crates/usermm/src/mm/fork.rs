//! fork(2) without reading swapped-out memory: a parent's swapped pages are shared with the
//! child by their swap slots, as `copy_nonpresent_pte` shares them in mm/memory.c
//! (`swap_duplicate`: the slot gains a user and is freed by its last one). Mirrors the swap
//! part of `dup_mmap` (kernel/fork.c) on the parent's side; the child's side is
//! `swap/inherit.rs` (its device reads the shared slots through the parent).
//!
//! Parent: [`share_swapped`] takes a user of every swapped page of a region
//! (`SwapState::swap_duplicate`) and lists them; [`serve_child`] starts a thread
//! (`usermm-forkd`) that answers the child's reads of those slots from the swap device and
//! drops each slot's extra user when the child releases it, or all of them when the child's
//! socket closes (exit, exec, SIGKILL). A shared slot is never rewritten: the parent's write
//! to its page frees its own use of the slot first (`try_to_free_swap`), and reclaim gives a
//! dirty page whose slot is shared a new one (`add_to_swap`).
//!
//! The parent's resident pages are copied: [`write_for_fork`] writes them straight into the
//! child's memory (`process_vm_writev`) from the view or the frame pool under each page's lock,
//! [`copy_for_fork`] copies them for the socket where that is refused. An exiting parent
//! hands each child its remaining shared pages in a file ([`hand_over_all`]).
//!
//! Child: [`adopt_anon_inherited`] makes the received range a region whose swapped pages name
//! the inherited slots of its device.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::swap::inherit::{
    recv_header, recv_slots, send_slots, MAX_REQUEST, OP_READ, OP_RELEASE, STATUS_HANDOVER,
};
use crate::sys::{Mapping, PAGE_SIZE};

use super::page::{pg, Pfn, PgOff, SwapEntry};
use super::pgtable::Pte;
use super::region::{Region, RegionInner};
use super::{Mm, MmInner};

/// Pages read from the device per request to it.
const SERVE_BATCH: usize = 64;

/// `copy_nonpresent_pte` for the swapped pages of `r`'s first `npages`: each swapped page's
/// slot gains a user (`swap_duplicate`) on behalf of a fork child. Returns them as (page,
/// slot), in page order. A page being swapped in or out meanwhile is left out (the caller
/// copies it).
pub(crate) fn share_swapped(
    m: &MmInner,
    r: &RegionInner,
    npages: u64,
    except: &[u64],
) -> Vec<(PgOff, SwapEntry)> {
    let Some(sw) = &m.swap else {
        return Vec::new();
    };
    let end = PgOff::new(npages.min(r.pt.npages()));
    let mut candidates = Vec::new();
    r.pt.for_each_used(PgOff::new(0), end, |idx, pte| {
        if matches!(pte, Pte::Swap(_)) && except.binary_search(&idx.raw()).is_err() {
            candidates.push(idx);
        }
    });
    let mut shared = Vec::with_capacity(candidates.len());
    // A chunk's entries are locked in page order (as every run of ptes is), their slots
    // duplicated under one lock of the counts, then released.
    for chunk in candidates.chunks(512) {
        let mut guards = Vec::with_capacity(chunk.len());
        let mut got = Vec::with_capacity(chunk.len());
        for &idx in chunk {
            let g = r.pt.lock(idx);
            if let Pte::Swap(s) = g.get() {
                got.push((idx, s));
            }
            guards.push(g);
        }
        let ok = sw.swap_duplicate_many(got.iter().map(|&(_, s)| s));
        shared.extend(
            got.into_iter()
                .zip(ok)
                .filter(|&(_, ok)| ok)
                .map(|(x, _)| x),
        );
        drop(guards);
    }
    m.vm.add(crate::vmstat::Item::ForkSwapShared, shared.len() as u64);
    shared
}

/// Drops the child's use of `slots` (its socket closed, or it released them).
pub(crate) fn put_shared(m: &MmInner, slots: impl IntoIterator<Item = u64>) {
    if let Some(sw) = &m.swap {
        for s in slots {
            sw.swap_put(SwapEntry::new(s), &m.vm);
        }
    }
}

/// A serving thread's stop signal, for [`hand_over_all`]; in [`SERVERS`] while it runs.
#[derive(Debug)]
struct ServerCtl {
    pid: u32,
    stop: crate::sys::uffd::EventFd,
    /// Where [`handover`] makes its file (`$TMPDIR` or /tmp).
    handover_dir: std::ffi::OsString,
}

/// The threads serving this process's fork children.
static SERVERS: crate::sync::Mutex<Vec<Arc<ServerCtl>>> = crate::sync::Mutex::new(Vec::new());

/// This process is exiting (or exec'ing): every thread serving a fork child writes the pages
/// the child still shares into a file of their own and hands the child that file
/// ([`handover`]), so the child keeps its memory after the parent is gone. Waits for them, at
/// most `timeout` in all. Returns how many children were handed their pages. Allocates
/// nothing and takes only this module's lock: `_exit` calls it, possibly from a signal
/// handler that interrupted malloc.
pub fn hand_over_all(timeout: std::time::Duration) -> usize {
    // Only the process that started them (not a vfork child sharing its memory).
    let me = std::process::id();
    let lock = || SERVERS.lock();
    let mut n = 0;
    for c in lock().iter().filter(|c| c.pid == me) {
        c.stop.signal();
        n += 1;
    }
    let t0 = std::time::Instant::now();
    while lock().iter().any(|c| c.pid == me) {
        if t0.elapsed() > timeout {
            log::error!("a fork child's pages were not handed over in time; it may lose them");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    n - lock().iter().filter(|c| c.pid == me).count()
}

/// The slots a fork child still shares with this process (each with one use taken for it by
/// [`share_swapped`]): sorted, each marked when the child releases it. Dropping it releases
/// every slot still held ([`put_shared`]), whichever way the serving thread ends, also when it
/// never starts. A sorted vector, not a hash set: a GiB swapped is a quarter of a million
/// slots, and hashing them on the forking thread cost the parent's fork() 10 ms.
struct Held {
    m: Arc<MmInner>,
    slots: Vec<u64>,
    gone: Vec<bool>,
    left: usize,
}

impl Held {
    /// The slots as [`share_swapped`] listed them; [`Held::index`] orders them.
    fn new(m: Arc<MmInner>, slots: Vec<u64>) -> Held {
        Held {
            m,
            left: slots.len(),
            slots,
            gone: Vec::new(),
        }
    }

    /// Sorts the slots for lookups, on the serving thread: even nearly in order (pages swapped
    /// out together have consecutive slots), sorting a GiB's worth in fork() cost it 2-4 ms.
    fn index(&mut self) {
        self.slots.sort_unstable();
        self.slots.dedup();
        self.left = self.slots.len();
        self.gone = vec![false; self.left];
    }

    fn is_empty(&self) -> bool {
        self.left == 0
    }

    fn find(&self, slot: u64) -> Option<usize> {
        self.slots
            .binary_search(&slot)
            .ok()
            .filter(|&i| !self.gone[i])
    }

    fn contains(&self, slot: u64) -> bool {
        self.find(slot).is_some()
    }

    /// Marks `slot` released by the child; false if it was not held.
    fn remove(&mut self, slot: u64) -> bool {
        let Some(i) = self.find(slot) else {
            return false;
        };
        self.gone[i] = true;
        self.left -= 1;
        true
    }

    /// The slots still held (ascending once indexed; all of them before).
    fn held(&self) -> Vec<u64> {
        let gone = |i: usize| self.gone.get(i).copied().unwrap_or(false);
        self.slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| !gone(i))
            .map(|(_, &s)| s)
            .collect()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        put_shared(&self.m, self.held());
    }
}

/// Starts the thread that serves a fork child's reads of the slots `shared` (from
/// [`share_swapped`]) over `stream`, until the child closes it; then the slots it still held
/// lose its use (also when the thread cannot be started).
pub(crate) fn serve_child(m: Arc<MmInner>, stream: UnixStream, shared: Vec<u64>) -> io::Result<()> {
    // Dropped on every way out before the thread has it (or with the closure, should the thread
    // not start), which releases the slots.
    let mut held = Held::new(Arc::clone(&m), shared);
    let ctl = Arc::new(ServerCtl {
        pid: std::process::id(),
        stop: crate::sys::uffd::EventFd::new().map_err(io::Error::other)?,
        // Read here, on the forking thread: the serving thread must not read the environment,
        // which a program that called setenv(3) keeps in its heap (managed memory, possibly
        // swapped out).
        handover_dir: std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into()),
    });
    SERVERS.lock().push(Arc::clone(&ctl));
    let ctl2 = Arc::clone(&ctl);
    let r = super::spawn_thread("usermm-forkd".to_string(), move || {
        held.index();
        match serve(&m, stream, &mut held, &ctl2) {
            // The child exited or exec'd: what it still shared is released below.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Err(e) => log::error!("serving a fork child's reads of shared swap slots: {e}"),
            Ok(()) => {}
        }
        drop(held);
        SERVERS.lock().retain(|c| !Arc::ptr_eq(c, &ctl2));
    });
    if let Err(e) = r {
        SERVERS.lock().retain(|c| !Arc::ptr_eq(c, &ctl));
        return Err(e);
    }
    Ok(())
}

fn serve(m: &MmInner, mut s: UnixStream, held: &mut Held, ctl: &ServerCtl) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let bounce = Mapping::anon(SERVE_BATCH * PAGE_SIZE, 0).map_err(io::Error::other)?;
    let Some(sw) = &m.swap else {
        return Ok(());
    };
    let mut data = Vec::new();
    while !held.is_empty() {
        let (_, stop) = crate::sys::net::poll2(s.as_raw_fd(), ctl.stop.raw_fd(), -1)?;
        if stop {
            return handover(m, &s, held, &bounce, &ctl.handover_dir);
        }
        let (op, n) = recv_header(&mut s)?;
        let n = n as usize;
        if n > MAX_REQUEST {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a request for {n} pages"),
            ));
        }
        let slots = recv_slots(&mut s, n)?;
        match op {
            OP_RELEASE => {
                let gone: Vec<u64> = slots.into_iter().filter(|&x| held.remove(x)).collect();
                put_shared(m, gone);
            }
            OP_READ => {
                if slots.iter().any(|&x| !held.contains(x)) {
                    // Only what was shared with this child is read for it.
                    send_slots(&mut s, libc::EPERM as u32, &[])?;
                    continue;
                }
                data.clear();
                data.resize(n * PAGE_SIZE, 0);
                let mut status = 0;
                let res = read_slots(&sw.dev, &bounce, &slots, |i, b| {
                    data[i * PAGE_SIZE..i * PAGE_SIZE + b.len()].copy_from_slice(b);
                    Ok(())
                });
                if let Err(e) = res {
                    log::error!("reading swap slots for a fork child: {e}");
                    status = e.raw_os_error().unwrap_or(libc::EIO) as u32;
                }
                use std::io::Write;
                if status == 0 {
                    let mut hdr = [0u8; 8];
                    hdr[4..].copy_from_slice(&u32::try_from(n).unwrap_or(0).to_ne_bytes());
                    s.write_all(&hdr)?;
                    s.write_all(&data)?;
                } else {
                    send_slots(&mut s, status, &[])?;
                }
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown request {op}"),
                ))
            }
        }
    }
    Ok(())
}

/// Reads the pages of `slots` from `dev` through `bounce` ([`SERVE_BATCH`] pages), one
/// device request per run of consecutive slots, handing each run to `out` as (index of its
/// first slot in `slots`, its bytes).
fn read_slots(
    dev: &Arc<dyn crate::swap::SwapDevice>,
    bounce: &Mapping,
    slots: &[u64],
    mut out: impl FnMut(usize, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut b = vec![0u8; SERVE_BATCH * PAGE_SIZE];
    let mut i = 0;
    while i < slots.len() {
        let mut j = i + 1;
        while j < slots.len() && j - i < SERVE_BATCH && slots[j] == slots[j - 1] + 1 {
            j += 1;
        }
        let offs: Vec<usize> = (0..j - i).map(|x| x * PAGE_SIZE).collect();
        let b = &mut b[..(j - i) * PAGE_SIZE];
        dev.read_pages(slots[i], bounce, &offs)?;
        bounce.read_bytes(0, b).map_err(io::Error::other)?;
        out(i, b)?;
        i = j;
    }
    Ok(())
}

/// Writes the pages of the slots the child still shares (`held`) into a new unlinked file in
/// `dir`, at `slot * 4096`, and sends the child that file with a [`STATUS_HANDOVER`] header: it
/// reads them from there from then on (swap/inherit.rs). The parent is exiting.
fn handover(
    m: &MmInner,
    s: &UnixStream,
    held: &Held,
    bounce: &Mapping,
    dir: &std::ffi::OsStr,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let Some(sw) = &m.swap else {
        return Ok(());
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "a file in {} for a fork child's pages: {e}",
                    dir.to_string_lossy()
                ),
            )
        })?;
    let slots = held.held();
    read_slots(&sw.dev, bounce, &slots, |i, b| {
        file.write_all_at(b, slots[i] * PAGE_SIZE as u64)
    })?;
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&STATUS_HANDOVER.to_ne_bytes());
    hdr[4..].copy_from_slice(&u32::try_from(slots.len()).unwrap_or(u32::MAX).to_ne_bytes());
    crate::sys::net::send_with_fd(s.as_raw_fd(), &hdr, file.as_raw_fd())?;
    m.vm.add(crate::vmstat::Item::ForkSwapHandover, slots.len() as u64);
    Ok(())
}

/// A fork child's region over the received range `[addr, addr+len)`: its resident pages are
/// adopted as `Mm::adopt_anon` does, and page `idx` of each `(idx, k)` of `inherited` names
/// inherited slot `k` of this manager's device (`swap/inherit.rs`), read when first touched.
pub(crate) fn adopt_anon_inherited(
    mm: &Mm,
    addr: usize,
    len: usize,
    noreserve: bool,
    inherited: &[(PgOff, u64)],
) -> Result<Region> {
    let m = mm.inner();
    let base = match (&m.swap, &m.cfg.inherit) {
        (Some(_), Some(link)) if link.base() != u64::MAX => link.base(),
        _ if inherited.is_empty() => u64::MAX,
        _ => {
            return Err(Error::io(
                "adopting a range with pages shared with the parent",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "this manager was not made with the parent's link (MmConfig::inherit)",
                ),
            ))
        }
    };
    let r = super::mmap::adopt_anon(mm, addr, len, noreserve)?;
    for &(idx, k) in inherited {
        let slot = SwapEntry::new(base + k);
        if idx >= r.r.end() {
            if let Some(sw) = &m.swap {
                sw.swap_free(slot, &m.vm);
            }
            continue;
        }
        let mut g = r.r.pt.lock(idx);
        if g.get() == Pte::None {
            g.set(Pte::Swap(slot));
        } else if let Some(sw) = &m.swap {
            // The page came with the copy: the shared slot is not needed.
            drop(g);
            sw.swap_free(slot, &m.vm);
        }
    }
    Ok(r)
}

/// Copies bytes `[off, off + buf.len())` of region `r` (page-aligned) into `buf` for a fork
/// child, without faulting where it can: a resident page is copied from the view or from its
/// pool slot under its page lock (a fault on each parked page was most of a fork's time);
/// an untouched page is zeros. Any other page (swapped, locked by reclaim or a fault) is read
/// through the view, which faults it in. Returns the pages read that way.
pub(crate) fn copy_for_fork(
    m: &MmInner,
    r: &RegionInner,
    off: usize,
    buf: &mut [u8],
) -> Result<u64> {
    let copy_err = |e| Error::io("copying memory for a fork child", e);
    let present = r.view.resident(off, buf.len()).map_err(copy_err)?;
    let in_slot = slots_held(m, r, off, buf.len() / PAGE_SIZE);
    let mut faulted = 0;
    let mut swapped: Vec<(usize, SwapEntry)> = Vec::new();
    for (i, page) in buf.chunks_mut(PAGE_SIZE).enumerate() {
        let idx = PgOff::new(((off / PAGE_SIZE) + i) as u64);
        let done = match r.pt.get(idx) {
            Pte::None | Pte::Zero | Pte::HugeZero => {
                page.fill(0);
                true
            }
            Pte::Frame(f) => match lock_resident(m, r, idx, f, present[i], in_slot[i]) {
                Some((map, at)) => {
                    let ok = map.read_bytes(at, page).is_ok();
                    m.node.pages[f].unlock();
                    ok
                }
                None => false,
            },
            Pte::Swap(slot) => {
                // Read from the device below (batched after the loop), with the slot held so
                // that it cannot be freed and reused meanwhile.
                let g = r.pt.lock(idx);
                let held = g.get() == Pte::Swap(slot)
                    && m.swap.as_ref().is_some_and(|sw| sw.swap_duplicate(slot));
                drop(g);
                if held {
                    swapped.push((i, slot));
                }
                held
            }
            Pte::Poison => false,
        };
        if !done {
            r.view.read_bytes(idx.offset(), page).map_err(copy_err)?;
            faulted += 1;
        }
    }
    let n = (buf.len() / PAGE_SIZE) as u64;
    m.vm.add(
        crate::vmstat::Item::ForkCopyDirect,
        n - faulted - swapped.len() as u64,
    );
    if let (Some(sw), false) = (&m.swap, swapped.is_empty()) {
        // One device request per run of consecutive slots, all in flight together where the
        // device can (io_uring for the swap file): swapped pages are scattered reads.
        swapped.sort_unstable_by_key(|&(_, s)| s);
        let bounce = Mapping::anon(swapped.len() * PAGE_SIZE, 0).map_err(copy_err)?;
        let slots: Vec<SwapEntry> = swapped.iter().map(|&(_, s)| s).collect();
        let ok = super::page_io::swap_readpage(m, sw, &slots, &bounce);
        for (j, &(i, s)) in swapped.iter().enumerate() {
            let page = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            if !ok[j] || bounce.read_bytes(j * PAGE_SIZE, page).is_err() {
                r.view
                    .read_bytes(off + i * PAGE_SIZE, page)
                    .map_err(copy_err)?;
                faulted += 1;
            }
            sw.swap_put(s, &m.vm);
        }
    }
    m.vm.add(crate::vmstat::Item::ForkCopyFaulted, faulted);
    Ok(faulted)
}

/// Whether each of the `n` pages of `r` from byte `off` is parked in a pool slot that holds it:
/// for the pages whose entry names a frame now, (that frame, its slot holds a page), one
/// mincore per run of consecutive frames; false for the others. Checked again under the page
/// lock by [`lock_resident`] (PG_mapped, and the frame still the page's).
fn slots_held(m: &MmInner, r: &RegionInner, off: usize, n: usize) -> Vec<Option<(Pfn, bool)>> {
    let frames: Vec<(usize, Pfn)> = (0..n)
        .filter_map(
            |j| match r.pt.get(PgOff::new((off / PAGE_SIZE + j) as u64)) {
                Pte::Frame(f) => Some((j, f)),
                _ => None,
            },
        )
        .collect();
    let fs: Vec<Pfn> = frames.iter().map(|&(_, f)| f).collect();
    let mut held = vec![None; n];
    for (&(j, f), ok) in frames.iter().zip(super::pool::slots_present(m, &fs)) {
        held[j] = Some((f, ok));
    }
    held
}

/// Locks resident page `f` (page `idx` of `r`) and says where its bytes are: its view page if
/// it is mapped there (`in_view`, from mincore), else its pool slot if that holds it
/// (`in_slot`, from [`slots_held`]). Under the page lock neither reclaim nor a fault moves it;
/// the caller unlocks the page when done. None, the page left unlocked: it is locked by
/// someone else, or no longer `f`, or not where the checks said.
fn lock_resident<'a>(
    m: &'a MmInner,
    r: &'a RegionInner,
    idx: PgOff,
    f: Pfn,
    in_view: bool,
    in_slot: Option<(Pfn, bool)>,
) -> Option<(&'a Mapping, usize)> {
    let p = &m.node.pages[f];
    if !p.trylock() {
        return None;
    }
    let at = if r.pt.get(idx) != Pte::Frame(f) {
        None
    } else if p.test(pg::MAPPED) {
        in_view.then_some((&r.view, idx.offset()))
    } else {
        (in_slot == Some((f, true))).then_some((&m.pool.slots, f.offset()))
    };
    if at.is_none() {
        p.unlock();
    }
    at
}

/// Pages written per `process_vm_writev` batch (their page locks are held across it).
const WRITE_BATCH: usize = 256;

/// [`copy_for_fork`] straight into the fork child `pid`'s memory at the same addresses
/// (`process_vm_writev`: one copy, no socket): bytes `[off, off + len)` of `r`. A resident page
/// is written from the view or its pool slot under its page lock; any other page is first
/// copied out as [`copy_for_fork`] does (before any page lock is taken: that may fault).
/// Untouched pages are skipped (the child's fresh mapping reads zeros). Errors (EPERM where
/// ptrace rules refuse) leave the caller to send the range over the socket instead.
pub(crate) fn write_for_fork(
    m: &MmInner,
    r: &RegionInner,
    off: usize,
    len: usize,
    pid: i32,
) -> io::Result<()> {
    use crate::sys::VmSrc;
    let npages = len / PAGE_SIZE;
    let mut i = 0;
    while i < npages {
        let end = (i + WRITE_BATCH).min(npages);
        let n = end - i;
        let page_at = |j: usize| PgOff::new(((off / PAGE_SIZE) + j) as u64);
        // Pass 1, no page locks: what is not resident, copied out.
        let mut buf = vec![0u8; n * PAGE_SIZE];
        // 0 skip, 1 buffer, 2 resident.
        let kind: Vec<u8> = (0..n)
            .map(|j| match r.pt.get(page_at(i + j)) {
                Pte::None | Pte::Zero | Pte::HugeZero => 0,
                Pte::Frame(_) => 2,
                Pte::Swap(_) | Pte::Poison => 1,
            })
            .collect();
        // Each run of swapped pages copied out at once (their reads batched).
        let mut j = 0;
        while j < n {
            if kind[j] != 1 {
                j += 1;
                continue;
            }
            let mut k = j + 1;
            while k < n && kind[k] == 1 {
                k += 1;
            }
            copy_for_fork(
                m,
                r,
                off + (i + j) * PAGE_SIZE,
                &mut buf[j * PAGE_SIZE..k * PAGE_SIZE],
            )
            .map_err(io::Error::other)?;
            j = k;
        }
        // Pass 2: resident pages locked, written from where they are.
        let present = r
            .view
            .resident(off + i * PAGE_SIZE, n * PAGE_SIZE)
            .map_err(io::Error::other)?;
        let in_slot = slots_held(m, r, off + i * PAGE_SIZE, n);
        let mut locked = Vec::new();
        let mut retry = Vec::new();
        let mut src: Vec<(VmSrc<'_>, usize)> = Vec::with_capacity(n);
        for j in 0..n {
            let idx = page_at(i + j);
            let to = r.page_addr(idx);
            match kind[j] {
                1 => src.push((VmSrc::Buf(&buf[j * PAGE_SIZE..(j + 1) * PAGE_SIZE]), to)),
                2 => {
                    let at = match r.pt.get(idx) {
                        Pte::Frame(f) => lock_resident(m, r, idx, f, present[j], in_slot[j])
                            .map(|(map, at)| (f, map, at)),
                        _ => None,
                    };
                    match at {
                        Some((f, map, at)) => {
                            src.push((VmSrc::Page(map, at), to));
                            locked.push(f);
                        }
                        None => retry.push(j),
                    }
                }
                _ => {}
            }
        }
        let res = crate::sys::process_vm_write(pid, &src);
        for f in locked {
            m.node.pages[f].unlock();
        }
        let written = res?;
        if written < src.len() {
            return Err(io::Error::other(format!(
                "{written} of {} pages written to the fork child",
                src.len()
            )));
        }
        m.vm.add(crate::vmstat::Item::ForkCopyDirect, src.len() as u64);
        // Pages that changed state meanwhile: copied out now, locks released.
        for j in retry {
            let mut b = vec![0u8; PAGE_SIZE];
            copy_for_fork(m, r, off + (i + j) * PAGE_SIZE, &mut b).map_err(io::Error::other)?;
            let to = r.page_addr(page_at(i + j));
            if crate::sys::process_vm_write(pid, &[(VmSrc::Buf(&b), to)])? != 1 {
                return Err(io::Error::other("a page not written to the fork child"));
            }
        }
        i = end;
    }
    Ok(())
}
