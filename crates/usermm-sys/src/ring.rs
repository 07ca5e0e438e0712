//! io_uring for batches of page I/O on files (the `io-uring` crate): positioned vectored reads
//! and writes of pages of a [`Mapping`], a whole batch submitted at once, so the device has all
//! of it in flight (this disk: 7.7k 4 KiB IOPS at queue depth 1, 60-67k at 32), and completed
//! before the call returns, so the pages stay borrowed for exactly as long as the kernel uses
//! them. One ring per thread, made on its first batch. Where io_uring is unavailable (an old
//! kernel, seccomp, `kernel.io_uring_disabled`) [`available`] is false and callers keep the
//! synchronous `preadv`/`pwritev` ([`Mapping::pread_pages`], [`Mapping::pwrite_pages`]).
//!
//! An operation that fails or transfers less than asked is done again synchronously, so every
//! result (errors, short reads at end of file) is exactly what the synchronous path gives.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};

use io_uring::{opcode, types, IoUring};

use crate::error::Result;
use crate::mem::Mapping;
use crate::PAGE_SIZE;

/// `io_uring_enter` flag: wait for completions (include/uapi/linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1;
/// Entries per ring: a batch larger than this is submitted in rounds of this many.
const DEPTH: u32 = 64;
/// Pages per operation's iovec array at most (IOV_MAX is 1024 iovecs).
const MAX_OP_PAGES: usize = 1024;

/// One positioned transfer: consecutive file pages from `file_off`, at the page offsets
/// `pages` of `mem` (each page inside `mem`; adjacent ones are merged into one iovec).
#[derive(Debug, Clone, Copy)]
pub struct PageIo<'a> {
    pub mem: &'a Mapping,
    pub pages: &'a [usize],
    pub file_off: u64,
}

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;
static AVAILABLE: AtomicU8 = AtomicU8::new(UNKNOWN);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Registers this thread's ring slot (its destructor) now, on a thread about to serve faults:
/// the first use of a thread-local with a destructor registers it with glibc, which takes the
/// dynamic loader's lock, and a fault taken by a thread inside dlopen(3) holds that lock.
pub fn warm_thread_local() {
    RING.with(|_| {});
}

/// Whether this process can use io_uring (probed once by making a ring).
pub fn available() -> bool {
    match AVAILABLE.load(Ordering::Relaxed) {
        YES => true,
        NO => false,
        _ => {
            let ok = IoUring::new(2).is_ok();
            AVAILABLE.store(if ok { YES } else { NO }, Ordering::Relaxed);
            ok
        }
    }
}

/// Writes every operation's pages to `file`; one result per operation.
pub fn write_pages(file: &File, ops: &[PageIo<'_>]) -> Vec<Result<()>> {
    batch(file, ops, true)
}

/// Reads every operation's pages from `file`; one result per operation (a read that meets the
/// end of the file is an error, as [`Mapping::pread_pages`] reports it).
pub fn read_pages(file: &File, ops: &[PageIo<'_>]) -> Vec<Result<()>> {
    batch(file, ops, false)
}

/// Reads every operation's pages from `file` through io_uring where it can; true for each
/// operation read in full. The caller does the others its own way (a short read at the end of
/// the file, an error, or no io_uring): nothing is retried here.
pub fn try_read_pages(file: &File, ops: &[PageIo<'_>]) -> Vec<bool> {
    uring_batch(file, ops, false)
        .into_iter()
        .map(|d| d.is_some())
        .collect()
}

fn sync_op(file: &File, op: &PageIo<'_>, write: bool) -> Result<()> {
    if write {
        op.mem.pwrite_pages(file, op.file_off, op.pages)
    } else {
        op.mem.pread_pages(file, op.file_off, op.pages)
    }
}

/// The iovecs of `op` (adjacent pages merged), or None if a page is outside its mapping or
/// the operation is too large for one vectored call (done synchronously then).
fn iovecs(op: &PageIo<'_>) -> Option<Vec<libc::iovec>> {
    if op.pages.is_empty() || op.pages.len() > MAX_OP_PAGES {
        return None;
    }
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(op.pages.len());
    for &p in op.pages {
        if p.checked_add(PAGE_SIZE).is_none_or(|e| e > op.mem.len()) {
            return None;
        }
        let base = op.mem.addr() + p;
        if let Some(last) = iov.last_mut() {
            if last.iov_base as usize + last.iov_len == base {
                last.iov_len += PAGE_SIZE;
                continue;
            }
        }
        iov.push(libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: PAGE_SIZE,
        });
    }
    Some(iov)
}

fn batch(file: &File, ops: &[PageIo<'_>], write: bool) -> Vec<Result<()>> {
    ops.iter()
        .zip(uring_batch(file, ops, write))
        .map(|(op, r)| r.unwrap_or_else(|| sync_op(file, op, write)))
        .collect()
}

/// The operations done through io_uring: Some for each completed in full.
fn uring_batch(file: &File, ops: &[PageIo<'_>], write: bool) -> Vec<Option<Result<()>>> {
    let mut done: Vec<Option<Result<()>>> = (0..ops.len()).map(|_| None).collect();
    if available() {
        RING.with(|cell| {
            // A nested use on this thread (a signal handler's I/O) goes synchronously.
            let Ok(mut slot) = cell.try_borrow_mut() else {
                return;
            };
            if slot.is_none() {
                *slot = IoUring::new(DEPTH).ok();
            }
            let Some(ring) = slot.as_mut() else { return };
            if !submit_all(ring, file, ops, write, &mut done) {
                // Entries the kernel never took are still queued in this ring: it must never
                // be entered again. Leak it (its memory and descriptor) and go synchronous.
                if let Some(r) = slot.take() {
                    std::mem::forget(r);
                }
                AVAILABLE.store(NO, Ordering::Relaxed);
            }
        });
    }
    done
}

/// Submits the operations in rounds of at most DEPTH and reaps each round whole before the
/// next; fills `done` for each operation that completed in full (the others stay None and are
/// done synchronously by the caller). False if the kernel refused a submission: the entries it
/// did not take are still queued, so the ring is unusable (every entry it took was reaped).
fn submit_all(
    ring: &mut IoUring,
    file: &File,
    ops: &[PageIo<'_>],
    write: bool,
    done: &mut [Option<Result<()>>],
) -> bool {
    let fd = types::Fd(file.as_raw_fd());
    let mut k = 0;
    while k < ops.len() {
        let end = (k + DEPTH as usize).min(ops.len());
        // Kept alive until every entry of the round has completed.
        let iovs: Vec<Option<Vec<libc::iovec>>> = ops[k..end].iter().map(iovecs).collect();
        let mut queued = 0usize;
        {
            let mut sq = ring.submission();
            for (j, iov) in iovs.iter().enumerate() {
                let Some(iov) = iov else { continue };
                let i = k + j;
                let len = u32::try_from(iov.len()).unwrap_or(u32::MAX);
                let entry = if write {
                    opcode::Writev::new(fd, iov.as_ptr(), len)
                        .offset(ops[i].file_off)
                        .build()
                } else {
                    opcode::Readv::new(fd, iov.as_ptr(), len)
                        .offset(ops[i].file_off)
                        .build()
                }
                .user_data(i as u64);
                // SAFETY: the entry names memory that outlives its completion: the iovec
                // arrays (`iovs`) and the pages they point to (inside `ops[i].mem`, checked by
                // `iovecs`, borrowed by the caller for this whole call) are not released
                // before every entry the kernel took has been reaped below; an entry it did
                // not take is never submitted (the ring is abandoned).
                if unsafe { sq.push(&entry) }.is_err() {
                    break;
                }
                queued += 1;
            }
        }
        let (mut taken, mut in_flight) = (0usize, 0usize);
        let mut refused = false;
        while (taken < queued && !refused) || in_flight > 0 {
            let res = if taken < queued && !refused {
                ring.submit_and_wait(usize::from(in_flight > 0))
            } else {
                // Only waiting: enter with nothing to submit.
                // SAFETY: to_submit 0 and GETEVENTS with no argument: the kernel only waits
                // for and posts completions of entries it already took.
                unsafe {
                    ring.submitter()
                        .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
                }
                .map(|_| 0)
            };
            match res {
                Ok(n) => {
                    taken += n;
                    in_flight += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && in_flight == 0 => {
                    std::thread::yield_now();
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {}
                Err(_) => refused = true,
            }
            for cqe in ring.completion() {
                let i = cqe.user_data() as usize;
                in_flight = in_flight.saturating_sub(1);
                let want = ops[i].pages.len() * PAGE_SIZE;
                if usize::try_from(cqe.result()).is_ok_and(|n| n == want) {
                    done[i] = Some(Ok(()));
                }
            }
        }
        drop(iovs);
        if refused && taken < queued {
            return false;
        }
        k = end;
    }
    true
}

/// The tag-less slot table entry of a read in flight: the file (kept open until its read
/// completes) and the caller's tag.
type InFlight = Option<(std::sync::Arc<File>, u64)>;

/// One asynchronous page read's end ([`AsyncPageReads::reap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageReadDone {
    /// The buffer slot the page was read into: read it through [`AsyncPageReads::buffer`] at
    /// [`AsyncPageReads::slot_offset`], then give it back with [`AsyncPageReads::release`].
    pub slot: usize,
    /// The tag given with the read.
    pub tag: u64,
    /// Bytes read (`PAGE_SIZE`: the whole page; fewer: the end of the file), or the errno.
    pub result: std::result::Result<usize, i32>,
}

/// Page reads a thread puts in flight and goes on, then reaps when they end: one thread's
/// ring (not `Send`: the ring is set up for a single issuer whose completions it runs itself,
/// `IORING_SETUP_DEFER_TASKRUN`, so a completion never interrupts another thread nor waits for
/// one; the ring's descriptor polls readable when a completion is there to reap). Each read
/// goes into one of the reader's own page slots, which the caller copies out after the read
/// ended and releases; nothing else names that memory, so the kernel's writes into it never
/// race a reader.
pub struct AsyncPageReads {
    ring: IoUring,
    /// Per slot: what is in flight there (the slot taken until released).
    used: Vec<InFlight>,
    free: Vec<usize>,
    /// Reads the kernel has or may have taken and not completed (their slots' memory and
    /// files must outlive them).
    in_flight: usize,
    /// Entries queued that the kernel did not take yet (submitted again by the next call).
    queued: bool,
    buf: Mapping,
    /// Signalled by the kernel when a completion is there to run (a poll of the ring's own
    /// descriptor is not woken by deferred task work).
    efd: std::os::fd::OwnedFd,
    /// Not Send nor Sync: the ring's single issuer is the thread that made it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for AsyncPageReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPageReads")
            .field("in_flight", &self.in_flight)
            .field("slots", &self.used.len())
            .finish_non_exhaustive()
    }
}

impl AsyncPageReads {
    /// A ring and `slots` page slots (at most that many reads in flight) for this thread;
    /// fails where io_uring (with deferred task work, Linux 6.1) is unavailable.
    pub fn new(slots: usize) -> std::io::Result<Self> {
        if !available() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
        }
        let slots = slots.clamp(1, 1024);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(u32::try_from(slots).unwrap_or(1024).next_power_of_two())?;
        let buf = Mapping::anon(slots * PAGE_SIZE, 0).map_err(std::io::Error::other)?;
        // SAFETY: eventfd(2) with no memory arguments; a non-negative result is a new
        // descriptor this process owns.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` was just returned by eventfd and is owned by nobody else.
        let efd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        ring.submitter().register_eventfd(raw)?;
        Ok(AsyncPageReads {
            efd,
            ring,
            used: (0..slots).map(|_| None).collect(),
            free: (0..slots).rev().collect(),
            in_flight: 0,
            queued: false,
            buf,
            _thread: std::marker::PhantomData,
        })
    }

    /// The memory the reads go into (slot `k` at [`Self::slot_offset`]`(k)`).
    pub fn buffer(&self) -> &Mapping {
        &self.buf
    }

    /// Where slot `slot` is in [`Self::buffer`].
    pub fn slot_offset(&self, slot: usize) -> usize {
        slot * PAGE_SIZE
    }

    /// Reads in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A descriptor that polls readable when [`Self::reap`] has completions to give.
    pub fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.efd)
    }

    /// Whether a completion may be waiting to be reaped (checked without a system call).
    pub fn ready(&mut self) -> bool {
        self.in_flight > 0
            && (self.ring.submission().taskrun() || !self.ring.completion().is_empty())
    }

    /// Puts a read of the page at `file_off` of `file` in flight, tagged `tag`, and returns
    /// its slot at once; None (nothing in flight) when every slot is taken or the queue is
    /// full: the caller reads synchronously.
    pub fn submit(
        &mut self,
        file: &std::sync::Arc<File>,
        file_off: u64,
        tag: u64,
    ) -> Option<usize> {
        let slot = self.free.pop()?;
        let entry = opcode::Read::new(
            types::Fd(file.as_raw_fd()),
            (self.buf.addr() + self.slot_offset(slot)) as *mut u8,
            PAGE_SIZE as u32,
        )
        .offset(file_off)
        .build()
        .user_data(slot as u64);
        // SAFETY: the entry names slot `slot` of `self.buf`, reserved for it (off the free
        // list) until its completion is reaped and the slot released, and a file held open in
        // `self.used` until then; Drop waits for every entry the kernel may have taken before
        // the memory goes.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.free.push(slot);
            return None;
        }
        self.used[slot] = Some((file.clone(), tag));
        self.in_flight += 1;
        self.queued = true;
        self.enter(0);
        Some(slot)
    }

    /// Submits what is queued and runs the ring's completions, waiting for `want` of them.
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => {
                    self.queued = !self.ring.submission().is_empty();
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    // Short of resources, or the completion queue is full: reaping frees it.
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// Appends every ended read to `out`; with `wait`, waits for at least one first (if any
    /// is in flight).
    pub fn reap(&mut self, wait: bool, out: &mut Vec<PageReadDone>) {
        if self.in_flight == 0 {
            return;
        }
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into `count` from the non-blocking eventfd this owns.
        let _ = unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&self.efd),
                (&mut count as *mut u64).cast(),
                8,
            )
        };
        if wait || self.queued || count > 0 || self.ring.submission().taskrun() {
            let want = usize::from(wait && self.ring.completion().is_empty());
            self.enter(want);
        }
        let ended: Vec<(usize, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (slot, r) in ended {
            // The slot stays off the free list until the caller has copied it out.
            let Some((_file, tag)) = self.used.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.in_flight -= 1;
            out.push(PageReadDone {
                slot,
                tag,
                result: usize::try_from(r).map_err(|_| -r),
            });
        }
    }

    /// Gives back slot `slot` of a reaped read (its page copied out).
    pub fn release(&mut self, slot: usize) {
        if slot < self.used.len() && self.used[slot].is_none() && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }
}

impl Drop for AsyncPageReads {
    fn drop(&mut self) {
        // Every read the kernel took completes before its memory goes.
        let mut out = Vec::new();
        while self.in_flight > 0 {
            let before = self.in_flight;
            self.reap(true, &mut out);
            if self.in_flight == before {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            out.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn batched_writes_and_reads_match_the_synchronous_path() {
        if !available() {
            eprintln!("io_uring unavailable here: only the fallback is exercised");
        }
        let mut f = tempfile_in_tmp();
        f.write_all(&vec![0u8; 64 * PAGE_SIZE]).unwrap();
        let src = Mapping::anon(64 * PAGE_SIZE, 0).unwrap();
        for p in 0..64 {
            src.fill(p * PAGE_SIZE, PAGE_SIZE, p as u8 + 1).unwrap();
        }
        // Scattered runs: file pages 0..4 from mapping pages 10..14, page 20 from 3, 40..43
        // from 50, 51, 60 (not adjacent in memory).
        let a: Vec<usize> = (10..14).map(|p| p * PAGE_SIZE).collect();
        let b = vec![3 * PAGE_SIZE];
        let c = vec![50 * PAGE_SIZE, 51 * PAGE_SIZE, 60 * PAGE_SIZE];
        let ops = [
            PageIo {
                mem: &src,
                pages: &a,
                file_off: 0,
            },
            PageIo {
                mem: &src,
                pages: &b,
                file_off: 20 * PAGE_SIZE as u64,
            },
            PageIo {
                mem: &src,
                pages: &c,
                file_off: 40 * PAGE_SIZE as u64,
            },
        ];
        for r in write_pages(&f, &ops) {
            r.unwrap();
        }
        let dst = Mapping::anon(8 * PAGE_SIZE, 0).unwrap();
        let d1: Vec<usize> = (0..4).map(|p| p * PAGE_SIZE).collect();
        let d2: Vec<usize> = (4..7).map(|p| p * PAGE_SIZE).collect();
        let reads = [
            PageIo {
                mem: &dst,
                pages: &d1,
                file_off: 0,
            },
            PageIo {
                mem: &dst,
                pages: &d2,
                file_off: 40 * PAGE_SIZE as u64,
            },
        ];
        for r in read_pages(&f, &reads) {
            r.unwrap();
        }
        let mut got = vec![0u8; PAGE_SIZE];
        for (page, want) in [(0, 11u8), (3, 14), (4, 51), (5, 52), (6, 61)] {
            dst.read_bytes(page * PAGE_SIZE, &mut got).unwrap();
            assert!(got.iter().all(|&x| x == want), "page {page}");
        }
        // Past the end of the file: the same error as the synchronous path.
        let far = [PageIo {
            mem: &dst,
            pages: &d1,
            file_off: 1000 * PAGE_SIZE as u64,
        }];
        let e = read_pages(&f, &far).pop().unwrap().unwrap_err();
        let s = dst
            .pread_pages(&f, 1000 * PAGE_SIZE as u64, &d1)
            .unwrap_err();
        assert_eq!(e.to_string(), s.to_string());
        f.flush().unwrap();
    }

    #[test]
    fn async_page_reads_end_with_each_page_and_the_end_of_the_file() {
        let Ok(mut r) = AsyncPageReads::new(16) else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        let mut f = tempfile_in_tmp();
        // 200 pages, each filled with its number, and 100 bytes of a last one.
        for p in 0..200u32 {
            f.write_all(&vec![(p % 251) as u8 + 1; PAGE_SIZE]).unwrap();
        }
        f.write_all(&[7u8; 100]).unwrap();
        let f = std::sync::Arc::new(f);
        let mut got = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        let mut collect = |r: &mut AsyncPageReads, out: &mut Vec<PageReadDone>| {
            for d in out.drain(..) {
                let mut page = vec![0u8; PAGE_SIZE];
                r.buffer()
                    .read_bytes(r.slot_offset(d.slot), &mut page)
                    .unwrap();
                r.release(d.slot);
                assert!(got.insert(d.tag, (d.result, page)).is_none(), "tag twice");
            }
        };
        // More reads than slots: a full reader refuses (None) until reaping frees a slot.
        let mut refused = 0;
        for p in (0..=200u64).rev() {
            while r.submit(&f, p * PAGE_SIZE as u64, p).is_none() {
                refused += 1;
                assert_eq!(r.in_flight(), 16, "refused with a slot free");
                r.reap(true, &mut out);
                collect(&mut r, &mut out);
            }
        }
        assert!(refused > 0);
        // The descriptor polls readable once a completion is there.
        let mut pfd = libc::pollfd {
            fd: r.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1);
        while r.in_flight() > 0 {
            r.reap(true, &mut out);
            collect(&mut r, &mut out);
        }
        assert_eq!(got.len(), 201);
        for (&p, (res, page)) in &got {
            if p == 200 {
                assert_eq!(*res, Ok(100), "the last page ends the file");
                assert!(page[..100].iter().all(|&b| b == 7));
            } else {
                assert_eq!(*res, Ok(PAGE_SIZE), "page {p}");
                let want = (p % 251) as u8 + 1;
                assert!(page.iter().all(|&b| b == want), "page {p}'s contents");
            }
        }
        // A read past the end of a file completes with nothing read (the caller reads it the
        // synchronous way, which zero-fills); without waiting, reap gives it once it ended.
        let slot = r.submit(&f, 1 << 40, 9).unwrap();
        assert!(r.in_flight() == 1);
        let t = std::time::Instant::now();
        while out.is_empty() {
            assert!(t.elapsed().as_secs() < 5, "the read never ended");
            r.reap(false, &mut out);
        }
        assert_eq!((out[0].slot, out[0].tag, out[0].result), (slot, 9, Ok(0)));
        r.release(slot);
    }

    /// A read of a file on disk with O_DIRECT completes in the background (not inline at its
    /// submission, as a read from the kernel's cache does): the descriptor must poll readable
    /// as soon as it ends. A poll of the ring's own descriptor is not woken by deferred task
    /// work (it slept until its timeout); this caught that. Skips visibly where the filesystem
    /// refuses O_DIRECT (tmpfs), and fails there under `USERMM_TEST_STRICT=1`.
    #[test]
    fn async_page_reads_wake_a_poll_when_a_disk_read_ends() {
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(mut r) = AsyncPageReads::new(4) else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        let tmp = std::env::var("TMPDIR").unwrap_or_else(|_| "/var/tmp".into());
        let dir = tempfile::tempdir_in(&tmp).unwrap();
        let path = dir.path().join("direct");
        std::fs::write(&path, vec![5u8; 64 * PAGE_SIZE]).unwrap();
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        else {
            crate::skip_test(&format!("{tmp} refuses O_DIRECT"));
            return;
        };
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        let f = std::sync::Arc::new(f);
        let mut pfd = libc::pollfd {
            fd: r.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        for k in 0..8u64 {
            r.submit(&f, (k * 7 % 64) * PAGE_SIZE as u64, k).unwrap();
            let t = std::time::Instant::now();
            let mut got = Vec::new();
            while got.is_empty() {
                pfd.revents = 0;
                // SAFETY: one valid pollfd on the stack.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
                r.reap(false, &mut got);
                assert!(
                    t.elapsed() < std::time::Duration::from_millis(500),
                    "read {k}: its poll woke {:?} after the submission",
                    t.elapsed()
                );
            }
            assert_eq!(got.len(), 1, "read {k}");
            assert_eq!((got[0].tag, got[0].result), (k, Ok(PAGE_SIZE)));
            let mut page = vec![0u8; PAGE_SIZE];
            r.buffer()
                .read_bytes(r.slot_offset(got[0].slot), &mut page)
                .unwrap();
            assert!(page.iter().all(|&b| b == 5));
            r.release(got[0].slot);
        }
    }

    fn tempfile_in_tmp() -> File {
        tempfile::tempfile().unwrap()
    }
}
