//! The memory manager: one budget of frames, one swap device, the regions it serves, its threads
//! and counters. Mirrors `struct mm_struct` plus one `pg_data_t` node (`include/linux/mmzone.h`):
//! free frames, watermarks, the lruvec, kswapd.
//!
//! Submodules: `page` (descriptors, frame allocator), `page_state` (the locked critical
//! sections of faults on resident pages and of anonymous reclaim, shared with the model
//! checker), `pgtable` (per-region entries),
//! `replacement` (the page replacement policy trait), `lru` (the two-list LRU,
//! `mark_page_accessed`), `lru_gen` (the multi-gen LRU), `workingset` (shadows and refaults,
//! `mm/workingset.c`), `memory` (fault handling, `mm/memory.c`), `swap_state`
//! (swap cache and readahead, `mm/swap_state.c`), `vmscan` (reclaim and kswapd, `mm/vmscan.c`), `page_alloc` (`__alloc_pages`, `mm/page_alloc.c`),
//! `page_io` (swap device reads and writes, `mm/page_io.c`),
//! `handler` (the userfaultfd reader threads), `fault` (the faulting thread serving its own fault,
//! `fault_path=sigbus`, `arch/x86/mm/fault.c`), `region` (the region types, `vm_area_struct`),
//! `mmap` (creating and tearing down regions, `mm/mmap.c`), `madvise` (discard, `mm/madvise.c`),
//! `filemap` (the page cache, `mm/filemap.c`), `file` (cached files and file regions),
//! `readahead` (`mm/readahead.c`), `mpage` (asynchronous single-page reads for random faults, `fs/mpage.c`), `page_writeback` (dirty throttling and flushers), `pool`
//! (the frame pool: slots, recycling, bounce buffers, runs), `rmap` (unmapping a page from where
//! it is mapped, `mm/rmap.c`), `truncate` (`mm/truncate.c`), `shmem` (in-memory files to swap,
//! `mm/shmem.c`), `errseq` (writeback errors, `lib/errseq.c`), `memcontrol` (one budget shared
//! by the managers of a process tree, `mm/page_counter.c`).

// Truncating casts are spelled out (conv::Narrow, conv::Saturate, try_from) in the core.
#![warn(clippy::cast_possible_truncation)]

pub mod lru;
pub mod lru_gen;
pub mod page;
pub mod page_state;
pub mod pgtable;
pub mod radix_tree;
pub mod replacement;
pub mod zap;

// Under `--cfg loom` only the page state machine (descriptors, page table, LRU, and the fault
// and reclaim critical sections in page_state) is built, so the model checker explores it with
// loom's primitives; see tests/loom_page.rs.
#[cfg(not(loom))]
pub mod errseq;
#[cfg(not(loom))]
pub(crate) mod fault;
#[cfg(not(loom))]
pub mod file;
#[cfg(not(loom))]
pub mod filemap;
#[cfg(not(loom))]
pub(crate) mod fork;
#[cfg(not(loom))]
pub mod fs;
#[cfg(not(loom))]
pub mod handler;
#[cfg(not(loom))]
pub mod huge_memory;
#[cfg(not(loom))]
pub(crate) mod madvise;
#[cfg(not(loom))]
mod manager;
#[cfg(not(loom))]
pub mod memcontrol;
#[cfg(not(loom))]
pub mod memory;
#[cfg(not(loom))]
pub(crate) mod mmap;
#[cfg(not(loom))]
pub(crate) mod mmzone;
#[cfg(not(loom))]
pub(crate) mod mpage;
#[cfg(not(loom))]
pub(crate) mod page_alloc;
#[cfg(not(loom))]
pub(crate) mod page_io;
#[cfg(not(loom))]
pub mod page_writeback;
#[cfg(not(loom))]
pub(crate) mod pool;
#[cfg(not(loom))]
pub mod readahead;
#[cfg(not(loom))]
pub mod region;
#[cfg(not(loom))]
pub(crate) mod rmap;
#[cfg(not(loom))]
pub(crate) mod shmem;
#[cfg(not(loom))]
pub mod swap_state;
#[cfg(not(loom))]
pub(crate) mod truncate;
#[cfg(not(loom))]
pub mod vmscan;
#[cfg(not(loom))]
pub mod workingset;

/// Starts a usermm thread (a fault handler, the watchdog, kswapd, a flusher, a readahead
/// worker): named `name`, running `f` after [`pool::warm_thread_locals`], so no thread usermm
/// starts registers a thread-local destructor, which takes the dynamic loader's lock, while
/// serving a fault.
#[cfg(not(loom))]
pub(crate) fn spawn_thread(
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        pool::warm_thread_locals();
        f()
    })
}

#[cfg(not(loom))]
pub use manager::*;
#[cfg(not(loom))]
pub use mmzone::Watermarks;
