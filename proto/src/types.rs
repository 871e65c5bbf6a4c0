//! Newtypes for the numbers a RoCE stack juggles: packet sequence numbers, queue pair numbers
//! and keys. Mixing them up is a classic source of protocol bugs, so each gets its own type.

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number (IBTA Vol. 1 §9.7.1). All arithmetic wraps modulo 2^24.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN space is 24 bits wide.
    pub const MASK: u32 = 0x00ff_ffff;

    /// Builds a PSN, silently dropping the bits above 24 (as modify_qp does).
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance from `other` to `self`, in the range -2^23 .. 2^23.
    /// Like rxe's `psn_compare`, `a` is "after" `b` when it lies within 2^23 ahead of it.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// Serial-number comparison modulo 2^24 (total: never panics).
    pub const fn cmp_seq(self, other: Psn) -> Ordering {
        let d = self.diff(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 24-bit queue pair number. QPN 1 is the GSI QP; 0xFFFFFF addresses multicast.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    pub const MASK: u32 = 0x00ff_ffff;
    /// The general services interface QP that carries MADs (IBTA §3.5.3).
    pub const GSI: Qpn = Qpn(1);
    /// Destination QPN of multicast packets (IBTA §9.8.5).
    pub const MULTICAST: Qpn = Qpn(0x00ff_ffff);

    pub const fn new(value: u32) -> Qpn {
        Qpn(value & Self::MASK)
    }

    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

macro_rules! key_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u32);

        impl $name {
            pub const fn value(self) -> u32 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#010x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}

key_newtype!(
    /// A remote key: names a memory region or window to a remote peer (RETH, AtomicETH, IETH).
    Rkey
);
key_newtype!(
    /// A local key: names a memory region in a local scatter/gather element.
    Lkey
);
key_newtype!(
    /// A UD queue key, carried in every DETH (IBTA §10.2.4).
    Qkey
);

impl Qkey {
    /// The well-known Q_Key of QP1, the GSI QP (IBTA §13.4.6.1).
    pub const GSI: Qkey = Qkey(0x8001_0000);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_at_24_bits() {
        assert_eq!(Psn::new(0xff_ffff).next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
    }

    #[test]
    fn psn_compare_is_serial() {
        let a = Psn::new(0xff_fff0);
        let b = Psn::new(0x10);
        assert!(b.is_after(a));
        assert!(a.is_before(b));
        assert_eq!(b.diff(a), 0x20);
        assert_eq!(a.diff(b), -0x20);
        assert_eq!(a.cmp_seq(a), Ordering::Equal);
        // Exactly half the space apart: the sign bit decides, as in rxe.
        assert_eq!(Psn::new(0x80_0000).diff(Psn::new(0)), -0x80_0000);
    }
}
