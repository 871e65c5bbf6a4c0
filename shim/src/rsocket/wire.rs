//! What a stream rsocket puts on the wire, as librdmacm's `rsocket.c` (rdma-core v44) does:
//! the connection private data (`struct rs_conn_data`), the SGL entries a receiver RDMA-writes
//! into its peer's target SGL (`struct rs_sge`), and the 32-bit immediate data of every
//! RDMA WRITE WITH IMMEDIATE (3-bit operation, 29-bit length/credits/control code).

/// `struct rs_conn_data.version`: the only version librdmacm speaks.
pub const RS_CONN_VERSION: u8 = 1;
/// `RS_CONN_FLAG_NET`: the sender's host order is network (big-endian) order.
pub const RS_CONN_FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: the target buffer list is followed by an iomap table.
pub const RS_CONN_FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of `struct rs_conn_data` (private data of the REQ and the REP).
pub const CONN_DATA_LEN: usize = 40;
/// Bytes of `struct rs_sge`.
pub const SGE_LEN: usize = 16;
/// `RS_SGL_SIZE`: entries of the target SGL each side exposes.
pub const RS_SGL_SIZE: usize = 2;

/// Immediate-data operations (bits 31..29).
pub const RS_OP_DATA: u32 = 0;
pub const RS_OP_WRITE: u32 = 2;
pub const RS_OP_SGL: u32 = 4;
pub const RS_OP_IOMAP_SGL: u32 = 6;
pub const RS_OP_CTRL: u32 = 7;
/// Control codes carried by `RS_OP_CTRL`.
pub const RS_CTRL_DISCONNECT: u32 = 0;
pub const RS_CTRL_KEEPALIVE: u32 = 1;
pub const RS_CTRL_SHUTDOWN: u32 = 2;

const DATA_MASK: u32 = 0x1FFF_FFFF;

/// `rs_msg_set(op, data)`: the host-order immediate (sent big-endian).
pub fn msg_set(op: u32, data: u32) -> u32 {
    (op << 29) | (data & DATA_MASK)
}

/// `rs_msg_op(imm)`.
pub fn msg_op(msg: u32) -> u32 {
    msg >> 29
}

/// `rs_msg_data(imm)`.
pub fn msg_data(msg: u32) -> u32 {
    msg & DATA_MASK
}

/// `struct rs_sge`: a remotely writable buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RsSge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

impl RsSge {
    /// Host-order image, as written by RDMA into the peer's target SGL (`swap` when the
    /// peer's host order differs, `RS_OPT_SWAP_SGL`).
    pub fn to_host_bytes(self, swap: bool) -> [u8; SGE_LEN] {
        let s = if swap {
            RsSge {
                addr: self.addr.swap_bytes(),
                key: self.key.swap_bytes(),
                length: self.length.swap_bytes(),
            }
        } else {
            self
        };
        let mut b = [0u8; SGE_LEN];
        b[0..8].copy_from_slice(&s.addr.to_ne_bytes());
        b[8..12].copy_from_slice(&s.key.to_ne_bytes());
        b[12..16].copy_from_slice(&s.length.to_ne_bytes());
        b
    }

    fn emit_be(self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn parse_be(b: &[u8]) -> RsSge {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[0..8]);
        let mut k = [0u8; 4];
        k.copy_from_slice(&b[8..12]);
        let mut l = [0u8; 4];
        l.copy_from_slice(&b[12..16]);
        RsSge {
            addr: u64::from_be_bytes(a),
            key: u32::from_be_bytes(k),
            length: u32::from_be_bytes(l),
        }
    }
}

/// `struct rs_conn_data` (all multi-byte fields in network order, whatever the flags say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnData {
    pub version: u8,
    pub flags: u8,
    /// Receive credits granted (the sender's receive queue depth).
    pub credits: u16,
    /// `rs_value_to_scale(target_iomap_size, 8)`.
    pub target_iomap_size: u8,
    /// Where the peer writes SGL updates: address, rkey, and *entry count* as length.
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer.
    pub data_buf: RsSge,
}

/// Why private data is not an rsocket's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnDataError {
    Truncated,
    Version(u8),
}

impl ConnData {
    /// Our host's `RS_CONN_FLAG_NET` bit, as `rs_format_conn_data` sets it.
    pub fn host_flags() -> u8 {
        RS_CONN_FLAG_IOMAP
            | if cfg!(target_endian = "big") {
                RS_CONN_FLAG_NET
            } else {
                0
            }
    }

    /// Whether the peer's SGL updates must be byte-swapped (`RS_OPT_SWAP_SGL`).
    pub fn peer_needs_swap(&self) -> bool {
        (self.flags & RS_CONN_FLAG_NET != 0) != cfg!(target_endian = "big")
    }

    pub fn emit(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // b[4..7] reserved, zero.
        b[7] = self.target_iomap_size;
        self.target_sgl.emit_be(&mut b[8..24]);
        self.data_buf.emit_be(&mut b[24..40]);
        b
    }

    pub fn parse(b: &[u8]) -> Result<ConnData, ConnDataError> {
        if b.len() < CONN_DATA_LEN {
            return Err(ConnDataError::Truncated);
        }
        if b[0] != RS_CONN_VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        Ok(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: RsSge::parse_be(&b[8..24]),
            data_buf: RsSge::parse_be(&b[24..40]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_layout_is_librdmacms() {
        assert_eq!(msg_set(RS_OP_DATA, 2048), 0x0000_0800);
        assert_eq!(msg_set(RS_OP_SGL, 384), 0x8000_0180);
        assert_eq!(msg_set(RS_OP_CTRL, RS_CTRL_DISCONNECT), 0xE000_0000);
        assert_eq!(msg_set(RS_OP_CTRL, RS_CTRL_SHUTDOWN), 0xE000_0002);
        let m = msg_set(RS_OP_DATA, 0x1FFF_FFFF);
        assert_eq!((msg_op(m), msg_data(m)), (RS_OP_DATA, 0x1FFF_FFFF));
        assert_eq!(msg_op(0xC000_0005), RS_OP_IOMAP_SGL);
        // Credits are a 16-bit sequence beyond 2^16: the data field keeps them.
        assert_eq!(msg_data(msg_set(RS_OP_SGL, 0x1_0010)), 0x1_0010);
    }

    #[test]
    fn conn_data_round_trips_in_network_order() {
        let c = ConnData {
            version: 1,
            flags: RS_CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge {
                addr: 0x1122_3344_5566_7788,
                key: 0xAABB_CCDD,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x7f00_0000_1000,
                key: 0x1234,
                length: 65536,
            },
        };
        let b = c.emit();
        assert_eq!(&b[0..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &[0xAA, 0xBB, 0xCC, 0xDD]);
        assert_eq!(&b[20..24], &[0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 1, 0, 0]);
        assert_eq!(ConnData::parse(&b), Ok(c));
        assert_eq!(ConnData::parse(&b[..39]), Err(ConnDataError::Truncated));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), Err(ConnDataError::Version(2)));
    }

    #[test]
    fn swap_follows_the_net_flag() {
        let mut c = ConnData::parse(&[1u8; 40]).unwrap_or_else(|_| unreachable!());
        c.flags = ConnData::host_flags();
        assert!(!c.peer_needs_swap());
        c.flags ^= RS_CONN_FLAG_NET;
        assert!(c.peer_needs_swap());
        let s = RsSge {
            addr: 1,
            key: 2,
            length: 3,
        };
        let native = s.to_host_bytes(false);
        let swapped = s.to_host_bytes(true);
        assert_eq!(&native[0..8], &1u64.to_ne_bytes());
        assert_eq!(&swapped[0..8], &1u64.swap_bytes().to_ne_bytes());
    }
}
