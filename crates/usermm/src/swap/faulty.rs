//! A fault-injecting swap device for tests: wraps any [`SwapDevice`] and fails chosen writes
//! and/or reads with an injected I/O error. Mirrors nothing in Linux directly; it plays the role
//! of the block layer's fault injection (`fail_make_request`) for `mm/page_io.c`'s error paths
//! (`end_swap_bio_write` redirtying the page, `end_swap_bio_read` failing the fault).
//!
//! Each direction has its own [`FailMode`]. An operation is one `write_pages`/`read_pages` call;
//! operations are counted per direction from the moment its mode was set. Discard always passes
//! through. A failed operation transfers nothing, unless short I/O is set
//! ([`FaultySwap::set_short_io`]): then it transfers the first half of its pages and fails
//! with the rest (a device that stopped in the middle of a cluster). The error is EIO, or the
//! errno set with [`FaultySwap::set_errno`] (ENOSPC: a device that filled up mid-cluster).
//! Slow I/O is a delay before every read ([`FaultySwap::set_read_delay`]) or write
//! ([`FaultySwap::set_write_delay`]): a device that stalls.

use crate::sync::{AtomicU64, Ordering};
use std::io;
use std::sync::Arc;

use crate::sync::Mutex;

use super::SwapDevice;
use crate::conv::Saturate;
use crate::sys::Mapping;

/// When a [`FaultySwap`] fails operations of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Never fail (the default).
    #[default]
    Never,
    /// Fail every operation.
    All,
    /// Let the first `n` operations succeed, then fail every later one.
    AfterN(u64),
    /// Fail operations number `n`, `2n`, `3n`, ... (counting from 1); `EveryNth(0)` never fails.
    EveryNth(u64),
    /// Fail operations whose slot range includes this slot.
    Slot(u64),
}

#[derive(Debug, Default)]
struct Rule {
    mode: FailMode,
    /// Operations seen since the mode was set.
    ops: u64,
}

impl Rule {
    /// Counts one operation on `[slot, slot+n)`; returns the slot to report if it must fail.
    fn check(&mut self, slot: u64, n: u64) -> Option<u64> {
        self.ops += 1;
        match self.mode {
            FailMode::Never => None,
            FailMode::All => Some(slot),
            FailMode::AfterN(k) => (self.ops > k).then_some(slot),
            FailMode::EveryNth(k) => (self.ops.checked_rem(k) == Some(0)).then_some(slot),
            FailMode::Slot(s) => (s >= slot && s - slot < n).then_some(s),
        }
    }
}

/// A swap device that fails chosen operations of the device it wraps (see the module docs).
///
/// ```
/// use std::sync::Arc;
/// use usermm::swap::{faulty::FailMode, FaultySwap, RamSwap, SwapDevice};
/// use usermm_sys::Mapping;
///
/// let dev = FaultySwap::new(Arc::new(RamSwap::new(1 << 20)?)).fail_writes(FailMode::EveryNth(2));
/// let pool = Mapping::anon(4096, 0)?;
/// dev.write_pages(0, &pool, &[0])?;
/// let e = dev.write_pages(1, &pool, &[0]).unwrap_err();
/// assert_eq!(e.to_string(), "injected write failure at slot 1");
/// assert_eq!(dev.injected_write_failures(), 1);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct FaultySwap {
    inner: Arc<dyn SwapDevice>,
    write_rule: Mutex<Rule>,
    read_rule: Mutex<Rule>,
    write_failures: AtomicU64,
    read_failures: AtomicU64,
    /// Slow I/O: every read sleeps this long (µs) before it is served.
    read_delay_us: AtomicU64,
    /// Slow I/O: every write sleeps this long (µs) before it is served.
    write_delay_us: AtomicU64,
    /// A failed operation first transfers the first half of its pages.
    short_io: crate::sync::AtomicBool,
    /// The errno of injected failures (0: a plain I/O error, EIO).
    errno: AtomicU64,
}

impl std::fmt::Debug for FaultySwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultySwap")
            .field("inner", &self.inner.name())
            .field("write_mode", &self.write_mode())
            .field("read_mode", &self.read_mode())
            .field("write_failures", &self.injected_write_failures())
            .field("read_failures", &self.injected_read_failures())
            .finish()
    }
}

impl FaultySwap {
    /// Wraps `inner`; nothing fails until a mode is set.
    pub fn new(inner: Arc<dyn SwapDevice>) -> Self {
        FaultySwap {
            inner,
            write_rule: Mutex::new(Rule::default()),
            read_rule: Mutex::new(Rule::default()),
            write_failures: AtomicU64::new(0),
            read_failures: AtomicU64::new(0),
            read_delay_us: AtomicU64::new(0),
            write_delay_us: AtomicU64::new(0),
            short_io: crate::sync::AtomicBool::new(false),
            errno: AtomicU64::new(0),
        }
    }

    /// Short I/O: a failing operation transfers the first half of its pages, then fails.
    pub fn set_short_io(&self, on: bool) {
        self.short_io.store(on, Ordering::Relaxed);
    }

    /// The errno injected failures report (e.g. `libc::ENOSPC`); 0 restores EIO.
    pub fn set_errno(&self, errno: i32) {
        self.errno.store(errno as u64, Ordering::Relaxed);
    }

    fn injected(&self, op: &str, slot: u64) -> io::Error {
        let msg = format!("injected {op} failure at slot {slot}");
        match self.errno.load(Ordering::Relaxed) {
            0 => io::Error::other(msg),
            e => {
                let os = io::Error::from_raw_os_error(i32::try_from(e).unwrap_or(libc::EIO));
                io::Error::new(os.kind(), format!("{msg}: {os}"))
            }
        }
    }

    /// The first half of `pages` (at least one page of a run of two or more) when short I/O
    /// is on, else none.
    fn short_part<'a>(&self, pages: &'a [usize]) -> &'a [usize] {
        if self.short_io.load(Ordering::Relaxed) && pages.len() > 1 {
            &pages[..pages.len() / 2]
        } else {
            &[]
        }
    }

    /// Builder: fail writes according to `mode`.
    pub fn fail_writes(self, mode: FailMode) -> Self {
        self.set_write_mode(mode);
        self
    }

    /// Builder: fail reads according to `mode`.
    pub fn fail_reads(self, mode: FailMode) -> Self {
        self.set_read_mode(mode);
        self
    }

    /// Changes the write failure mode at run time and restarts the write operation count.
    pub fn set_write_mode(&self, mode: FailMode) {
        *self.write_rule.lock() = Rule { mode, ops: 0 };
    }

    /// Changes the read failure mode at run time and restarts the read operation count.
    pub fn set_read_mode(&self, mode: FailMode) {
        *self.read_rule.lock() = Rule { mode, ops: 0 };
    }

    /// The current write failure mode.
    pub fn write_mode(&self) -> FailMode {
        self.write_rule.lock().mode
    }

    /// The current read failure mode.
    pub fn read_mode(&self) -> FailMode {
        self.read_rule.lock().mode
    }

    /// Write operations failed so far.
    pub fn injected_write_failures(&self) -> u64 {
        self.write_failures.load(Ordering::Relaxed)
    }

    /// Read operations failed so far.
    pub fn injected_read_failures(&self) -> u64 {
        self.read_failures.load(Ordering::Relaxed)
    }

    /// Slow I/O: from now on every read sleeps `d` first (a device that stalls).
    pub fn set_read_delay(&self, d: std::time::Duration) {
        self.read_delay_us
            .store(d.as_micros().sat_u64(), Ordering::Relaxed);
    }

    /// Slow I/O: from now on every write sleeps `d` first (a device that stalls on writes).
    pub fn set_write_delay(&self, d: std::time::Duration) {
        self.write_delay_us
            .store(d.as_micros().sat_u64(), Ordering::Relaxed);
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn SwapDevice> {
        &self.inner
    }
}

/// The injected delay of slow I/O (none for 0).
fn sleep_us(us: u64) {
    if us > 0 {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

impl SwapDevice for FaultySwap {
    fn name(&self) -> String {
        format!("faulty({})", self.inner.name())
    }

    fn nr_pages(&self) -> u64 {
        self.inner.nr_pages()
    }

    fn retry_window(&self) -> std::time::Duration {
        self.inner.retry_window()
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        sleep_us(self.write_delay_us.load(Ordering::Relaxed));
        if let Some(s) = self.write_rule.lock().check(slot, pages.len() as u64) {
            self.write_failures.fetch_add(1, Ordering::Relaxed);
            let part = self.short_part(pages);
            if !part.is_empty() {
                self.inner.write_pages(slot, pool, part)?;
            }
            return Err(self.injected("write", s));
        }
        self.inner.write_pages(slot, pool, pages)
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        sleep_us(self.read_delay_us.load(Ordering::Relaxed));
        if let Some(s) = self.read_rule.lock().check(slot, pages.len() as u64) {
            self.read_failures.fetch_add(1, Ordering::Relaxed);
            let part = self.short_part(pages);
            if !part.is_empty() {
                self.inner.read_pages(slot, pool, part)?;
            }
            return Err(self.injected("read", s));
        }
        self.inner.read_pages(slot, pool, pages)
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        self.inner.discard(slot, n)
    }

    fn invalidate(&self, slot: u64) {
        self.inner.invalidate(slot)
    }

    fn trim(&self) {
        self.inner.trim()
    }

    fn tier(&self) -> String {
        "faulty".into()
    }

    fn lower(&self) -> Option<&Arc<dyn SwapDevice>> {
        Some(&self.inner)
    }
}
