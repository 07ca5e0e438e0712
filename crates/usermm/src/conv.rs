//! Integer conversions that cannot lose bits, named so that the core keeps clippy's
//! `cast_possible_truncation` on (mm/ and swap/ warn on every `as` that could truncate).
//! Mirrors no kernel file (the kernel relies on C's implicit conversions).

#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "usermm needs a 64-bit target (page indexes and file offsets are u64 used as usize)"
);

/// Integer conversions that cannot lose bits here, named so that mm/ and swap/ can keep
/// clippy's `cast_possible_truncation` on: `u64` to `usize` is lossless on the 64-bit targets
/// usermm builds for (see the `compile_error!` above); `u32()` is for values bounded by a
/// validated limit (frame numbers: the budget is below 16 TiB; region and mapping ids) and
/// panics, naming the value, if that bound was broken.
pub trait Narrow {
    fn usize(self) -> usize;
    fn u32(self) -> u32;
}

impl Narrow for u64 {
    #[inline]
    #[allow(clippy::cast_possible_truncation)]
    fn usize(self) -> usize {
        self as usize
    }
    #[inline]
    fn u32(self) -> u32 {
        u32::try_from(self).unwrap_or_else(|_| panic!("{self} does not fit in 32 bits"))
    }
}

impl Narrow for usize {
    #[inline]
    fn usize(self) -> usize {
        self
    }
    #[inline]
    fn u32(self) -> u32 {
        u32::try_from(self).unwrap_or_else(|_| panic!("{self} does not fit in 32 bits"))
    }
}

/// A `u128` (a `Duration` in ns, us or ms) as `u64`, saturating (u64 nanoseconds are 584 years).
/// (The loom build has only the page state machine, which measures no time.)
#[cfg_attr(loom, allow(dead_code))]
pub trait Saturate {
    fn sat_u64(self) -> u64;
}

impl Saturate for u128 {
    #[inline]
    fn sat_u64(self) -> u64 {
        u64::try_from(self).unwrap_or(u64::MAX)
    }
}
