//! The benchmarks: `usemem` and its `swap-w-seq` and `anon-r-seq` presets (vm-scalability's
//! usemem, in [`usemem`], sized in [`presets`]), `dd` (seed 002's page-cache write loop, in
//! [`dd`]) and `fault-latency` (per-access latency of resident pages, minor and major faults,
//! in [`latency`]). Shared here: the small pseudo-random generator they use.

pub mod dd;
pub mod latency;
pub mod mmapfile;
pub mod presets;
pub mod simoop;
pub mod soak;
pub mod usemem;

/// xorshift64 (Marsaglia): a tiny, fast, reproducible generator. usemem uses `lrand48_r`; any
/// uniform source does for choosing access order.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; 0 is replaced, as xorshift would stay at 0).
    pub fn new(seed: u64) -> XorShift {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `[0, n)` (0 when `n` is 0), by scaling like usemem's `os_random_long`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::XorShift;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = XorShift::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (XorShift::new(42), XorShift::new(42));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(XorShift::new(0).next_u64(), 0);
    }
}
