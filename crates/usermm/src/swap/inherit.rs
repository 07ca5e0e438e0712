//! The swapped pages a fork child shares with its parent: the child's swap device is its own
//! device with the parent's shared slots appended ([`InheritedSwap`]), read through the parent
//! over a socket ([`InheritLink`]). Mirrors the swap half of `copy_nonpresent_pte`
//! (mm/memory.c) at fork: a swapped-out page is not read, its slot gains a user
//! (`swap_duplicate`, mm/fork.rs on the parent's side), and the child's page table names it.
//!
//! The parent keeps each shared slot allocated, its contents unchanged, until the child
//! releases it (`swap_free` here: [`SwapDevice::invalidate`] of an inherited slot) or exits
//! (the socket closes). A child reads an inherited slot only when it faults on its page (or
//! its swap readahead window covers it): a fork copies nothing that is swapped out.
//!
//! Slots `[base, base + n)` of the child's device are the inherited ones, `base + k` standing
//! for the parent's slot `slots[k]`; they are allocated from the start
//! (`SwapSlots::reserve`), and once the child frees one it is an ordinary slot of its own
//! device (which has room for them: it was opened `n` pages larger).
//!
//! The wire format (both ends are this crate): a request is `[op: u32, n: u32]` and `n`
//! parent slots (u64, native endian); [`OP_READ`] is answered by `[status: u32, n: u32]`
//! and, when status is 0, the `n` pages in order (a nonzero status is an errno);
//! [`OP_RELEASE`] has no answer.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::{Mapping, PAGE_SIZE};

use super::SwapDevice;

/// Request: read the pages of these parent slots.
pub const OP_READ: u32 = 1;
/// Request: the child no longer needs these parent slots.
pub const OP_RELEASE: u32 = 2;
/// Answer status: the parent is exiting and sends, with this header, a file holding every page
/// the child still shares, each at `slot * 4096`; the child reads them from the file from
/// then on.
pub const STATUS_HANDOVER: u32 = u32::MAX;
/// The most slots one request names (a swap readahead window is at most 256).
pub const MAX_REQUEST: usize = 1024;

/// Releases are sent in batches of this many slots (or with the next read).
const RELEASE_BATCH: usize = 256;

/// Writes a request or answer header and its slot list.
pub(crate) fn send_slots(s: &mut UnixStream, op: u32, slots: &[u64]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(8 + slots.len() * 8);
    buf.extend_from_slice(&op.to_ne_bytes());
    buf.extend_from_slice(&u32::try_from(slots.len()).unwrap_or(u32::MAX).to_ne_bytes());
    for x in slots {
        buf.extend_from_slice(&x.to_ne_bytes());
    }
    s.write_all(&buf)
}

/// Sends `slots` as [`OP_RELEASE`] requests of at most [`MAX_REQUEST`] slots.
fn send_release(s: &mut UnixStream, slots: &[u64]) -> io::Result<()> {
    for c in slots.chunks(MAX_REQUEST) {
        send_slots(s, OP_RELEASE, c)?;
    }
    Ok(())
}

/// Reads a `[u32, u32]` header.
pub(crate) fn recv_header(s: &mut UnixStream) -> io::Result<(u32, u32)> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h)?;
    let a = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]);
    let b = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
    Ok((a, b))
}

/// Reads `n` u64 slots.
pub(crate) fn recv_slots(s: &mut UnixStream, n: usize) -> io::Result<Vec<u64>> {
    let mut b = vec![0u8; n * 8];
    s.read_exact(&mut b)?;
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// Where a fork child reads the pages it shares with its parent.
#[derive(Debug)]
enum Source {
    /// From the parent, over the socket.
    Parent(UnixStream),
    /// From the file the exiting parent wrote them to (at `slot * 4096`).
    File(std::fs::File),
    /// Nowhere: the parent died before handing them over.
    Gone,
}

/// The child's end of the socket to the parent that shares its swapped pages, and which of
/// them the child still holds.
#[derive(Debug)]
pub struct InheritLink {
    parent: u32,
    /// The parent's slot of each inherited page: inherited slot `k` is the parent's
    /// `slots[k]`.
    slots: Vec<u64>,
    /// One bit per inherited slot, set while the child holds it.
    live: Box<[AtomicU64]>,
    nr_live: AtomicU64,
    /// Where the shared pages are read from.
    src: Mutex<Source>,
    /// Parent slots freed by the child, not yet sent.
    released: Mutex<Vec<u64>>,
    reads: AtomicU64,
    read_pages: AtomicU64,
    /// Where the inherited slots start on the child's device (set when the device is made).
    base: AtomicU64,
}

impl InheritLink {
    /// The child's link to `parent` (a pid, for messages) over `stream`, inheriting the
    /// parent's swap slots `slots` (the child's page table names inherited slot `k` for the
    /// page the parent had in `slots[k]`).
    pub fn new(parent: u32, stream: UnixStream, slots: Vec<u64>) -> InheritLink {
        let words = slots.len().div_ceil(64);
        let live: Box<[AtomicU64]> = (0..words)
            .map(|w| {
                let bits = (slots.len() - w * 64).min(64);
                AtomicU64::new(if bits == 64 {
                    u64::MAX
                } else {
                    (1 << bits) - 1
                })
            })
            .collect();
        InheritLink {
            parent,
            nr_live: AtomicU64::new(slots.len() as u64),
            slots,
            live,
            src: Mutex::new(Source::Parent(stream)),
            released: Mutex::new(Vec::new()),
            reads: AtomicU64::new(0),
            read_pages: AtomicU64::new(0),
            base: AtomicU64::new(u64::MAX),
        }
    }

    /// How many slots were inherited.
    pub fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Whether nothing was inherited.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Inherited slots the child still holds.
    pub fn nr_live(&self) -> u64 {
        self.nr_live.load(Ordering::Relaxed)
    }

    /// The first inherited slot on the child's device (u64::MAX before the device is made).
    pub fn base(&self) -> u64 {
        self.base.load(Ordering::Relaxed)
    }

    fn is_live(&self, k: usize) -> bool {
        self.live[k / 64].load(Ordering::Relaxed) & (1 << (k % 64)) != 0
    }

    /// Clears inherited slot `k`; true if it was held.
    fn drop_live(&self, k: usize) -> bool {
        let bit = 1u64 << (k % 64);
        if self.live[k / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            self.nr_live.fetch_sub(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    fn lost(&self, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "a page this process inherited at fork was still swapped out in its parent \
                 (pid {}), which {what} before handing it over; the page is lost (a parent \
                 that exits hands its children their pages, one killed outright cannot)",
                self.parent
            ),
        )
    }

    /// Reads the pages of inherited slots `ks` (indexes, all held) into `pool` at `pages`.
    fn read(&self, ks: &[usize], pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        let parent_slots: Vec<u64> = ks.iter().map(|&k| self.slots[k]).collect();
        let mut g = self.src.lock();
        let res = match &mut *g {
            Source::Gone => return Err(self.lost("has exited")),
            Source::File(f) => read_file(f, &parent_slots, pool, pages),
            Source::Parent(s) => {
                let release = std::mem::take(&mut *self.released.lock());
                match self.ask(s, &release, &parent_slots, pool, pages) {
                    Ok(None) => Ok(()),
                    Ok(Some(file)) => {
                        // The parent exited and left the pages in `file`.
                        let r = read_file(&file, &parent_slots, pool, pages);
                        for x in &release {
                            crate::sys::net::punch_hole(
                                std::os::fd::AsRawFd::as_raw_fd(&file),
                                x * PAGE_SIZE as u64,
                                PAGE_SIZE as u64,
                            );
                        }
                        *g = Source::File(file);
                        r
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::ConnectionReset
                        ) =>
                    {
                        *g = Source::Gone;
                        return Err(self.lost("has exited or was killed"));
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match res {
            Ok(()) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.read_pages
                    .fetch_add(ks.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!(
                    "reading pages inherited from the parent (pid {}): {e}",
                    self.parent
                ),
            )),
        }
    }

    /// Asks the parent for the pages of `slots` (sending the releases first). Some(file): the
    /// parent answered with the file it handed its pages over in (it is exiting).
    fn ask(
        &self,
        s: &mut UnixStream,
        release: &[u64],
        slots: &[u64],
        pool: &Mapping,
        pages: &[usize],
    ) -> io::Result<Option<std::fs::File>> {
        let mut buf = vec![0u8; MAX_REQUEST.min(slots.len()) * PAGE_SIZE];
        // A parent that exited may have left its handover in the socket: read it even if the
        // request cannot be sent.
        let sent = send_release(s, release);
        for (chunk, offs) in slots.chunks(MAX_REQUEST).zip(pages.chunks(MAX_REQUEST)) {
            let sent = sent
                .as_ref()
                .map_err(|e| e.kind())
                .and_then(|()| send_slots(s, OP_READ, chunk).map_err(|e| e.kind()));
            let mut h = [0u8; 8];
            let fd = match crate::sys::net::recv_exact_with_fd(
                std::os::fd::AsRawFd::as_raw_fd(s),
                &mut h,
            ) {
                Ok(fd) => fd,
                Err(e) => return Err(sent.err().map_or(e, io::Error::from)),
            };
            let status = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]);
            let n = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
            if status == STATUS_HANDOVER {
                return match fd {
                    Some(fd) => Ok(Some(std::fs::File::from(fd))),
                    None => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the parent's handover came without its file",
                    )),
                };
            }
            if status != 0 {
                return Err(io::Error::from_raw_os_error(status as i32));
            }
            if n as usize != chunk.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("asked for {} pages, the parent sent {n}", chunk.len()),
                ));
            }
            let b = &mut buf[..chunk.len() * PAGE_SIZE];
            s.read_exact(b)?;
            for (i, &off) in offs.iter().enumerate() {
                pool.write_bytes(off, &b[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
                    .map_err(io::Error::other)?;
            }
        }
        Ok(None)
    }

    /// The child freed inherited slot `k`: the parent may free its slot (sent in a batch).
    fn release(&self, k: usize) {
        if !self.drop_live(k) {
            return;
        }
        let batch = {
            let mut r = self.released.lock();
            r.push(self.slots[k]);
            if r.len() < RELEASE_BATCH && self.nr_live() > 0 {
                return;
            }
            std::mem::take(&mut *r)
        };
        // A reader holding the socket sends the batch with its request instead.
        if let Some(mut g) = self.src.try_lock() {
            match &mut *g {
                Source::Parent(s) => {
                    // A parent that is gone left its handover (if any) to the next read.
                    if send_release(s, &batch).is_err() && self.nr_live() > 0 {
                        self.released.lock().extend(batch);
                        return;
                    }
                }
                Source::File(f) => {
                    for x in &batch {
                        crate::sys::net::punch_hole(
                            std::os::fd::AsRawFd::as_raw_fd(f),
                            x * PAGE_SIZE as u64,
                            PAGE_SIZE as u64,
                        );
                    }
                }
                Source::Gone => {}
            }
            if self.nr_live() == 0 {
                // Nothing more to read: the parent drops its end and its thread.
                *g = Source::Gone;
            }
            return;
        }
        self.released.lock().extend(batch);
    }
}

/// A fork child's swap device: its own device, whose slots from `base` on start out holding the
/// pages it shares with its parent (see the module documentation).
pub struct InheritedSwap {
    own: Arc<dyn SwapDevice>,
    link: Arc<InheritLink>,
    base: u64,
}

impl std::fmt::Debug for InheritedSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl InheritedSwap {
    /// `own` (opened `link.len()` pages larger than the child's own swap) with its last
    /// `link.len()` slots standing for the inherited ones.
    pub fn new(own: Arc<dyn SwapDevice>, link: Arc<InheritLink>) -> io::Result<InheritedSwap> {
        let base = own.nr_pages().checked_sub(link.len()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the swap device has {} pages, fewer than the {} inherited",
                    own.nr_pages(),
                    link.len()
                ),
            )
        })?;
        link.base.store(base, Ordering::Relaxed);
        Ok(InheritedSwap { own, link, base })
    }

    /// The inherited slots (on this device) and the link they are read through.
    pub fn link(&self) -> &Arc<InheritLink> {
        &self.link
    }

    /// The inherited slot index of device slot `slot`, if it is one the child still holds.
    fn inherited(&self, slot: u64) -> Option<usize> {
        let k = usize::try_from(slot.checked_sub(self.base)?).ok()?;
        (k < self.link.slots.len() && self.link.is_live(k)).then_some(k)
    }
}

impl SwapDevice for InheritedSwap {
    fn name(&self) -> String {
        format!(
            "{} (+{} pages shared with parent pid {})",
            self.own.name(),
            self.link.len(),
            self.link.parent
        )
    }
    fn tier(&self) -> String {
        format!(
            "pages shared with the parent (pid {}) at fork: {} of {} still held",
            self.link.parent,
            self.link.nr_live(),
            self.link.len()
        )
    }
    fn nr_pages(&self) -> u64 {
        self.own.nr_pages()
    }
    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        // The allocator never hands out an inherited slot the child still holds (freeing one
        // releases it first); a write to one anyway makes it the child's own.
        for i in 0..pages.len() as u64 {
            if let Some(k) = self.inherited(slot + i) {
                self.link.release(k);
            }
        }
        self.own.write_pages(slot, pool, pages)
    }
    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        let mut i = 0;
        while i < pages.len() {
            let first = self.inherited(slot + i as u64).is_some();
            let mut j = i + 1;
            while j < pages.len() && self.inherited(slot + j as u64).is_some() == first {
                j += 1;
            }
            if first {
                let ks: Vec<usize> = (i..j)
                    .filter_map(|x| self.inherited(slot + x as u64))
                    .collect();
                if ks.len() != j - i {
                    return Err(io::Error::other(
                        "an inherited slot was freed while being read",
                    ));
                }
                self.link.read(&ks, pool, &pages[i..j])?;
            } else {
                self.own.read_pages(slot + i as u64, pool, &pages[i..j])?;
            }
            i = j;
        }
        Ok(())
    }
    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        self.own.discard(slot, n)
    }
    fn reuse_freed_first(&self) -> bool {
        self.own.reuse_freed_first()
    }
    fn invalidate(&self, slot: u64) {
        if let Some(k) = self.inherited(slot) {
            self.link.release(k);
        }
        self.own.invalidate(slot);
    }
    fn trim(&self) {
        self.own.trim();
    }
    fn lower(&self) -> Option<&Arc<dyn SwapDevice>> {
        Some(&self.own)
    }
    fn blocks_on_read(&self) -> bool {
        // An inherited page is a round trip to the parent.
        self.link.nr_live() > 0 || self.own.blocks_on_read()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("fork_swap_inherited", self.link.len()),
            ("fork_swap_held", self.link.nr_live()),
            ("fork_swap_reads", self.link.reads.load(Ordering::Relaxed)),
            (
                "fork_swap_read_pages",
                self.link.read_pages.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// Reads the pages of the parent's `slots` from the handover file into `pool` at `pages`.
fn read_file(f: &std::fs::File, slots: &[u64], pool: &Mapping, pages: &[usize]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; PAGE_SIZE];
    for (&slot, &off) in slots.iter().zip(pages) {
        f.read_exact_at(&mut b, slot * PAGE_SIZE as u64)?;
        pool.write_bytes(off, &b).map_err(io::Error::other)?;
    }
    Ok(())
}

impl Drop for InheritLink {
    fn drop(&mut self) {
        // The socket closes: the parent frees every slot still shared.
        *self.src.lock() = Source::Gone;
    }
}
