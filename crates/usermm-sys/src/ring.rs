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

    fn tempfile_in_tmp() -> File {
        tempfile::tempfile().unwrap()
    }
}
