//! 24-bit packet sequence numbers.
//!
//! PSNs live in a ring of 2^24 values. Ordering is defined the way IBA
//! defines validity windows: `a` is before `b` when the forward distance from
//! `a` to `b` is less than half the ring (2^23). Plain integer comparison is
//! wrong across wraparound and is deliberately not offered.

use core::fmt;

/// A packet sequence number: always `< 2^24`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Mask of the valid bits.
    pub const MASK: u32 = Self::MODULUS - 1;
    /// Half the ring: the largest forward distance still "ahead".
    pub const HALF: u32 = 1 << 23;

    /// The PSN `v mod 2^24`.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The PSN `v` if it fits in 24 bits.
    #[inline]
    pub const fn checked(v: u32) -> Option<Psn> {
        if v <= Self::MASK {
            Some(Psn(v))
        } else {
            None
        }
    }

    /// The raw 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` on the ring.
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` on the ring.
    #[inline]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The PSN after this one.
    #[inline]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Forward distance from `self` to `later`, in `0 .. 2^24`.
    #[inline]
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & Self::MASK
    }

    /// Signed distance `self - other` in `-2^23 .. 2^23`: positive when
    /// `self` is after `other`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift into the top 24 bits so the i32 sign is the ring's half.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Whether `self` comes strictly before `other` on the ring.
    #[inline]
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// Whether `self` comes strictly after `other` on the ring.
    #[inline]
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// Whether `self` lies in the half-open window `[start, start + len)`.
    #[inline]
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        start.distance_to(self) < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraparound() {
        let top = Psn::new(Psn::MASK);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert!(top.before(Psn::new(0)));
        assert!(Psn::new(5).after(top));
        assert_eq!(Psn::new(2).diff(top), 3);
        assert_eq!(top.diff(Psn::new(2)), -3);
        assert_eq!(top.distance_to(Psn::new(2)), 3);
        assert!(Psn::new(1).in_window(top, 3));
        assert!(!Psn::new(2).in_window(top, 3));
        assert_eq!(Psn::checked(1 << 24), None);
        assert_eq!(Psn::new((1 << 24) + 7), Psn::new(7));
    }

    #[test]
    fn half_ring_boundary() {
        let a = Psn::new(0);
        // Exactly half a ring apart: "before" by the sign convention of diff.
        assert_eq!(Psn::new(Psn::HALF).diff(a), -(Psn::HALF as i32));
        assert!(Psn::new(Psn::HALF - 1).after(a));
    }

    proptest! {
        #[test]
        fn add_then_diff(a in 0u32..Psn::MODULUS, n in 0u32..Psn::HALF) {
            let p = Psn::new(a);
            let q = p.add(n);
            prop_assert_eq!(q.diff(p), n as i32);
            prop_assert_eq!(p.diff(q), -(n as i32));
            prop_assert_eq!(p.distance_to(q), n);
            prop_assert_eq!(q.sub(n), p);
            prop_assert_eq!(n > 0, p.before(q));
        }
    }
}
