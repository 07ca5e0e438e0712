//! PAGEMAP_SCAN (`fs/proc/task_mmu.c`, Linux 6.7+): asks the kernel which pages of a range are
//! present, swapped, the zero page, or written since write protection. Used for observation in
//! tests and benchmarks (how much of a region the kernel really backs), never on the fault path.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::error::{Result, SysError, Syscall};

/// Page categories (include/uapi/linux/fs.h).
pub mod category {
    pub const WPALLOWED: u64 = 1 << 0;
    pub const WRITTEN: u64 = 1 << 1;
    pub const FILE: u64 = 1 << 2;
    pub const PRESENT: u64 = 1 << 3;
    pub const SWAPPED: u64 = 1 << 4;
    pub const PFNZERO: u64 = 1 << 5;
    pub const HUGE: u64 = 1 << 6;
}

#[repr(C)]
#[derive(Default)]
struct ScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<ScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// Counts the pages in `[start, start+len)` that have all categories in `mask`
/// (`inverted` flips chosen bits). Returns Err(Unsupported) on kernels without PAGEMAP_SCAN.
pub fn count_pages(start: usize, len: usize, mask: u64, inverted: u64) -> Result<u64> {
    let f = File::open("/proc/self/pagemap")
        .map_err(|e| SysError::os(Syscall::PagemapScan, "opening /proc/self/pagemap", e))?;
    let mut regions = vec![PageRegion::default(); 256];
    let end = (start + len) as u64;
    let mut cur = start as u64;
    let mut pages = 0u64;
    while cur < end {
        let mut a = ScanArg {
            size: std::mem::size_of::<ScanArg>() as u64,
            start: cur,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            category_inverted: inverted,
            category_mask: mask,
            return_mask: mask,
            ..Default::default()
        };
        // SAFETY: PAGEMAP_SCAN reads `a` and writes at most vec_len PageRegion records into
        // `regions`, which outlives the call; it only inspects page tables, changing nothing
        // (no WP flags are passed).
        let r = unsafe { libc::ioctl(f.as_raw_fd(), PAGEMAP_SCAN as _, &mut a as *mut ScanArg) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOTTY) || e.raw_os_error() == Some(libc::EINVAL) {
                return Err(SysError::Unsupported {
                    call: Syscall::PagemapScan,
                });
            }
            return Err(SysError::os(
                Syscall::PagemapScan,
                format!("of {len:#x} bytes at {start:#x}"),
                e,
            ));
        }
        for reg in &regions[..r as usize] {
            pages += (reg.end - reg.start) / crate::PAGE_SIZE as u64;
        }
        if a.walk_end <= cur {
            break;
        }
        cur = a.walk_end;
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Advice, Mapping, PAGE_SIZE};

    #[test]
    fn counts_present_and_zero_pages() {
        let m = Mapping::anon(16 * PAGE_SIZE, 0).unwrap();
        m.advise(0, 16 * PAGE_SIZE, Advice::NoHugePage).unwrap();
        for i in 0..4 {
            m.write_u64(i * PAGE_SIZE, 1);
        }
        for i in 4..6 {
            let _ = m.read_u64(i * PAGE_SIZE);
        }
        match count_pages(m.addr(), m.len(), category::PRESENT, 0) {
            Ok(n) => {
                assert_eq!(n, 6);
                assert_eq!(
                    count_pages(m.addr(), m.len(), category::PFNZERO, 0).unwrap(),
                    2
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
            Err(e) => panic!("{e}"),
        }
    }
}
