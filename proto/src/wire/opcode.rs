//! The BTH opcode table: for every opcode kernel rxe implements, which extended transport
//! headers follow the BTH, in which order, and what the opcode means to the transport
//! (IBTA Vol. 1 §9.2.1, table 36; rxe_opcode.c).

use core::fmt;

/// The transport service an opcode belongs to: bits 7..5 of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Rc,
    Uc,
    Rd,
    Ud,
    /// Congestion notification (opcode 0x81, Annex A17).
    Cnp,
    /// Manufacturer-specific opcodes (0xC0..0xFF, IBTA Vol. 1 §9.2.1 table 36, bits 7..5 =
    /// 110b or 111b): softroce's selective acknowledgement lives here.
    Vendor,
}

/// A set of extended transport headers. The order of the constants is the order on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    pub const FETH: HeaderSet = HeaderSet(1 << 1);
    pub const RETH: HeaderSet = HeaderSet(1 << 2);
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 3);
    pub const AETH: HeaderSet = HeaderSet(1 << 4);
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 5);
    pub const IMM: HeaderSet = HeaderSet(1 << 6);
    pub const IETH: HeaderSet = HeaderSet(1 << 7);
    /// The 16 reserved bytes of a CNP.
    pub const CNP_RESERVED: HeaderSet = HeaderSet(1 << 8);
    pub const NONE: HeaderSet = HeaderSet(0);

    /// Wire order and length of each header.
    pub const ORDER: [(HeaderSet, usize); 9] = [
        (Self::DETH, 8),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::ATOMIC_ETH, 28),
        (Self::AETH, 4),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMM, 4),
        (Self::IETH, 4),
        (Self::CNP_RESERVED, 16),
    ];

    pub const fn union(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Total length of the headers in the set.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `header` from the end of the BTH, if this set includes it.
    pub const fn offset_of(self, header: HeaderSet) -> Option<usize> {
        if !self.contains(header) {
            return None;
        }
        let mut at = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0 .0 == header.0 {
                return Some(at);
            }
            if self.contains(Self::ORDER[i].0) {
                at += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 9] = [
            "DETH",
            "FETH",
            "RETH",
            "AtomicETH",
            "AETH",
            "AtomicAckETH",
            "ImmDt",
            "IETH",
            "CNP",
        ];
        let mut list = f.debug_set();
        for (i, (h, _)) in Self::ORDER.iter().enumerate() {
            if self.contains(*h) {
                list.entry(&NAMES[i]);
            }
        }
        list.finish()
    }
}

/// What an opcode is, to the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    pub name: &'static str,
    pub headers: HeaderSet,
    pub flags: u16,
}

impl OpInfo {
    /// First packet of a message.
    pub const START: u16 = 1 << 0;
    /// Last packet of a message.
    pub const END: u16 = 1 << 1;
    /// Carries payload bytes (possibly zero of them).
    pub const PAYLOAD: u16 = 1 << 2;
    /// Sent by a requester (as opposed to an ACK or read response).
    pub const REQUEST: u16 = 1 << 3;
    /// Sent by a responder.
    pub const RESPONSE: u16 = 1 << 4;
    /// Consumes a receive WQE.
    pub const RWR: u16 = 1 << 5;
    /// Generates a receive completion.
    pub const COMP: u16 = 1 << 6;
    pub const SEND: u16 = 1 << 7;
    pub const WRITE: u16 = 1 << 8;
    pub const READ: u16 = 1 << 9;
    pub const ATOMIC: u16 = 1 << 10;
    pub const FLUSH: u16 = 1 << 11;
    pub const ATOMIC_WRITE: u16 = 1 << 12;
    pub const ACK: u16 = 1 << 13;
    pub const CNP: u16 = 1 << 14;
    /// softroce's selective acknowledgement ([`Opcode::SOFTROCE_SACK`]).
    pub const SACK: u16 = 1 << 15;

    pub const fn has(&self, flag: u16) -> bool {
        self.flags & flag == flag
    }

    /// Length of the extended headers between the BTH and the payload.
    pub const fn header_len(&self) -> usize {
        self.headers.len()
    }
}

/// A BTH opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

const fn op(name: &'static str, headers: HeaderSet, flags: u16) -> Option<OpInfo> {
    Some(OpInfo {
        name,
        headers,
        flags,
    })
}

const S: u16 = OpInfo::START;
const E: u16 = OpInfo::END;
const P: u16 = OpInfo::PAYLOAD;
const RQ: u16 = OpInfo::REQUEST;
const RS: u16 = OpInfo::RESPONSE;
const RWR: u16 = OpInfo::RWR;
const C: u16 = OpInfo::COMP;
const SEND: u16 = OpInfo::SEND | RQ | P;
const WRITE: u16 = OpInfo::WRITE | RQ | P;

const H_NONE: HeaderSet = HeaderSet::NONE;
const H_RETH: HeaderSet = HeaderSet::RETH;
const H_IMM: HeaderSet = HeaderSet::IMM;
const H_RETH_IMM: HeaderSet = HeaderSet::RETH.union(HeaderSet::IMM);
const H_AETH: HeaderSet = HeaderSet::AETH;

/// The SEND and WRITE families, shared by RC (base 0x00) and UC (base 0x20).
const fn send_write_family(base: u8, names: [&'static str; 12]) -> [(u8, Option<OpInfo>); 12] {
    [
        (base, op(names[0], H_NONE, SEND | S | RWR)),
        (base + 1, op(names[1], H_NONE, SEND)),
        (base + 2, op(names[2], H_NONE, SEND | E | C)),
        (base + 3, op(names[3], H_IMM, SEND | E | C)),
        (base + 4, op(names[4], H_NONE, SEND | S | E | RWR | C)),
        (base + 5, op(names[5], H_IMM, SEND | S | E | RWR | C)),
        (base + 6, op(names[6], H_RETH, WRITE | S)),
        (base + 7, op(names[7], H_NONE, WRITE)),
        (base + 8, op(names[8], H_NONE, WRITE | E)),
        (base + 9, op(names[9], H_IMM, WRITE | E | RWR | C)),
        (base + 10, op(names[10], H_RETH, WRITE | S | E)),
        (
            base + 11,
            op(names[11], H_RETH_IMM, WRITE | S | E | RWR | C),
        ),
    ]
}

static TABLE: [Option<OpInfo>; 256] = build_table();

const fn build_table() -> [Option<OpInfo>; 256] {
    let mut t: [Option<OpInfo>; 256] = [None; 256];
    let rc = send_write_family(
        0x00,
        [
            "RC_SEND_FIRST",
            "RC_SEND_MIDDLE",
            "RC_SEND_LAST",
            "RC_SEND_LAST_WITH_IMMEDIATE",
            "RC_SEND_ONLY",
            "RC_SEND_ONLY_WITH_IMMEDIATE",
            "RC_RDMA_WRITE_FIRST",
            "RC_RDMA_WRITE_MIDDLE",
            "RC_RDMA_WRITE_LAST",
            "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            "RC_RDMA_WRITE_ONLY",
            "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        ],
    );
    let uc = send_write_family(
        0x20,
        [
            "UC_SEND_FIRST",
            "UC_SEND_MIDDLE",
            "UC_SEND_LAST",
            "UC_SEND_LAST_WITH_IMMEDIATE",
            "UC_SEND_ONLY",
            "UC_SEND_ONLY_WITH_IMMEDIATE",
            "UC_RDMA_WRITE_FIRST",
            "UC_RDMA_WRITE_MIDDLE",
            "UC_RDMA_WRITE_LAST",
            "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            "UC_RDMA_WRITE_ONLY",
            "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        ],
    );
    let mut i = 0;
    while i < 12 {
        t[rc[i].0 as usize] = rc[i].1;
        t[uc[i].0 as usize] = uc[i].1;
        i += 1;
    }
    let read = OpInfo::READ;
    t[0x0c] = op("RC_RDMA_READ_REQUEST", H_RETH, read | RQ | S | E);
    t[0x0d] = op("RC_RDMA_READ_RESPONSE_FIRST", H_AETH, read | RS | P | S);
    t[0x0e] = op("RC_RDMA_READ_RESPONSE_MIDDLE", H_NONE, read | RS | P);
    t[0x0f] = op("RC_RDMA_READ_RESPONSE_LAST", H_AETH, read | RS | P | E);
    t[0x10] = op("RC_RDMA_READ_RESPONSE_ONLY", H_AETH, read | RS | P | S | E);
    t[0x11] = op("RC_ACKNOWLEDGE", H_AETH, OpInfo::ACK | RS | S | E);
    t[0x12] = op(
        "RC_ATOMIC_ACKNOWLEDGE",
        HeaderSet::AETH.union(HeaderSet::ATOMIC_ACK_ETH),
        OpInfo::ATOMIC | RS | S | E,
    );
    t[0x13] = op(
        "RC_COMPARE_SWAP",
        HeaderSet::ATOMIC_ETH,
        OpInfo::ATOMIC | RQ | S | E,
    );
    t[0x14] = op(
        "RC_FETCH_ADD",
        HeaderSet::ATOMIC_ETH,
        OpInfo::ATOMIC | RQ | S | E,
    );
    t[0x16] = op(
        "RC_SEND_LAST_WITH_INVALIDATE",
        HeaderSet::IETH,
        SEND | E | C,
    );
    t[0x17] = op(
        "RC_SEND_ONLY_WITH_INVALIDATE",
        HeaderSet::IETH,
        SEND | S | E | RWR | C,
    );
    t[0x1c] = op(
        "RC_FLUSH",
        HeaderSet::FETH.union(HeaderSet::RETH),
        OpInfo::FLUSH | RQ | S | E,
    );
    t[0x1d] = op(
        "RC_ATOMIC_WRITE",
        H_RETH,
        OpInfo::ATOMIC_WRITE | RQ | P | S | E,
    );
    t[0x64] = op("UD_SEND_ONLY", HeaderSet::DETH, SEND | S | E | RWR | C);
    t[0x65] = op(
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        HeaderSet::DETH.union(HeaderSet::IMM),
        SEND | S | E | RWR | C,
    );
    t[0x81] = op("CNP", HeaderSet::CNP_RESERVED, OpInfo::CNP);
    // Manufacturer-specific: sent only to peers that negotiated selective retransmission
    // (see `wire::sack`); kernel rxe never sees it.
    t[0xc0] = op("SOFTROCE_SACK", H_AETH, OpInfo::SACK | RS | P | S | E);
    t
}

impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    pub const RC_FLUSH: Opcode = Opcode(0x1c);
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    pub const CNP: Opcode = Opcode(0x81);
    /// softroce's selective acknowledgement: AETH (a PSN sequence NAK for the first PSN the
    /// responder lacks) and a bitmap of the PSNs after it that it holds ([`super::sack`]).
    /// A manufacturer-specific opcode, sent only between softroce peers.
    pub const SOFTROCE_SACK: Opcode = Opcode(0xc0);

    /// The table entry, or `None` for an opcode rxe does not implement (RD, reserved, 0xff).
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    pub fn is_known(self) -> bool {
        self.info().is_some()
    }

    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            6 | 7 => Transport::Vendor,
            _ => Transport::Cnp,
        }
    }

    /// Every opcode in the table, in numeric order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        (0..=255u8).map(Opcode).filter(|o| o.is_known())
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_rxe_opcodes() {
        let known: Vec<u8> = Opcode::all().map(|o| o.0).collect();
        let mut expected: Vec<u8> = (0x00..=0x14).chain([0x16, 0x17, 0x1c, 0x1d]).collect();
        expected.extend(0x20..=0x2b);
        expected.extend([0x64, 0x65, 0x81, 0xc0]);
        assert_eq!(known, expected);
        assert!(!Opcode(0xff).is_known());
        assert!(!Opcode(0x15).is_known());
        assert!(!Opcode(0x40).is_known(), "RD is not implemented by rxe");
    }

    #[test]
    fn header_offsets_follow_wire_order() {
        let flush = Opcode::RC_FLUSH.info().unwrap().headers;
        assert_eq!(flush.offset_of(HeaderSet::FETH), Some(0));
        assert_eq!(flush.offset_of(HeaderSet::RETH), Some(4));
        assert_eq!(flush.len(), 20);
        let ud_imm = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap().headers;
        assert_eq!(ud_imm.offset_of(HeaderSet::IMM), Some(8));
        let write_imm = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            .info()
            .unwrap()
            .headers;
        assert_eq!(write_imm.offset_of(HeaderSet::IMM), Some(16));
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().header_len(),
            12
        );
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().header_len(), 28);
        assert_eq!(Opcode::CNP.info().unwrap().header_len(), 16);
        assert_eq!(Opcode(0x26).name(), "UC_RDMA_WRITE_FIRST");
        assert_eq!(Opcode(0x26).transport(), Transport::Uc);
        assert_eq!(Opcode::SOFTROCE_SACK.transport(), Transport::Vendor);
        assert_eq!(Opcode::SOFTROCE_SACK.info().unwrap().header_len(), 4);
    }
}
