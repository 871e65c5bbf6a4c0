//! Writing pcapng (draft-ietf-opsawg-pcapng): the section header, one interface description
//! per device, Enhanced Packet Blocks with their direction, and Interface Statistics Blocks.
//! Blocks are appended to a caller's buffer in the host's byte order (readers take either,
//! from the section header's byte-order magic); nothing is allocated per packet.

/// Block types.
const SHB: u32 = 0x0a0d_0d0a;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const ISB: u32 = 0x0000_0005;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;

/// Option codes.
const OPT_END: u16 = 0;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
const ISB_STARTTIME: u16 = 2;
const ISB_ENDTIME: u16 = 3;
const ISB_IFRECV: u16 = 4;
const ISB_IFDROP: u16 = 5;

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u16 = 1;

/// Which way a packet went, as `epb_flags` bits 0-1 say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

impl Direction {
    fn flags(self) -> u32 {
        match self {
            Direction::Inbound => 1,
            Direction::Outbound => 2,
        }
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_ne_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_ne_bytes());
}

fn pad4(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&[0u8; 3][..(4 - len % 4) % 4]);
}

fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    put_u16(out, code);
    put_u16(out, value.len() as u16);
    out.extend_from_slice(value);
    pad4(out, value.len());
}

fn end_of_options(out: &mut Vec<u8>) {
    put_u16(out, OPT_END);
    put_u16(out, 0);
}

/// Starts a block of `kind` at the end of `out`; [`finish`] writes its length once known.
fn begin(out: &mut Vec<u8>, kind: u32) -> usize {
    let start = out.len();
    put_u32(out, kind);
    put_u32(out, 0);
    start
}

fn finish(out: &mut Vec<u8>, start: usize) {
    let len = (out.len() - start + 4) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_ne_bytes());
    put_u32(out, len);
}

/// Nanoseconds since the Unix epoch, as the interfaces' `if_tsresol` (10^-9) says.
pub fn timestamp_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The Section Header Block that starts a stream.
pub fn section_header(out: &mut Vec<u8>, application: &str) {
    let start = begin(out, SHB);
    put_u32(out, BYTE_ORDER_MAGIC);
    put_u16(out, 1); // major
    put_u16(out, 0); // minor
    out.extend_from_slice(&(-1i64).to_ne_bytes()); // section length: not known
    option(out, SHB_USERAPPL, application.as_bytes());
    end_of_options(out);
    finish(out, start);
}

/// An Interface Description Block: Ethernet, nanosecond timestamps.
pub fn interface_description(out: &mut Vec<u8>, name: &str, description: &str, snaplen: u32) {
    let start = begin(out, IDB);
    put_u16(out, LINKTYPE_ETHERNET);
    put_u16(out, 0);
    put_u32(out, snaplen);
    option(out, IF_NAME, name.as_bytes());
    option(out, IF_DESCRIPTION, description.as_bytes());
    option(out, IF_TSRESOL, &[9]);
    end_of_options(out);
    finish(out, start);
}

/// The bytes of an Enhanced Packet Block in front of its packet data.
pub const PACKET_BLOCK_HEAD: usize = 28;

/// The length of the Enhanced Packet Block [`packet_block`] writes around `captured` bytes of
/// a frame: the header (28 bytes), the bytes padded to 4, `epb_flags`, the end of options and
/// the trailing length.
pub const fn packet_block_len(captured: usize) -> usize {
    PACKET_BLOCK_HEAD + captured.next_multiple_of(4) + 8 + 4 + 4
}

/// Completes an Enhanced Packet Block around a frame already in place: `block` is
/// [`packet_block_len`]`(captured)` bytes long and holds the first `captured` bytes of a
/// frame `orig_len` bytes long at `block[PACKET_BLOCK_HEAD..]` (whatever lies after them is overwritten).
/// The frame is built straight into the block, so a captured packet is copied once.
pub fn packet_block(
    block: &mut [u8],
    interface: u32,
    timestamp_ns: u64,
    direction: Direction,
    captured: usize,
    orig_len: usize,
) {
    let len = packet_block_len(captured);
    debug_assert_eq!(block.len(), len);
    let words = [
        EPB,
        len as u32,
        interface,
        (timestamp_ns >> 32) as u32,
        timestamp_ns as u32,
        captured as u32,
        orig_len as u32,
    ];
    for (at, w) in words.iter().enumerate() {
        block[at * 4..at * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    let pad = PACKET_BLOCK_HEAD + captured;
    let options = PACKET_BLOCK_HEAD + captured.next_multiple_of(4);
    block[pad..options].fill(0);
    let o = &mut block[options..];
    o[..2].copy_from_slice(&EPB_FLAGS.to_ne_bytes());
    o[2..4].copy_from_slice(&4u16.to_ne_bytes());
    o[4..8].copy_from_slice(&direction.flags().to_ne_bytes());
    o[8..12].copy_from_slice(&[0; 4]); // opt_endofopt
    o[12..16].copy_from_slice(&(len as u32).to_ne_bytes());
}

/// An Interface Statistics Block: packets captured and dropped (for want of room between the
/// device and the writer) on `interface` between `start_ns` and `end_ns`.
pub fn interface_statistics(
    out: &mut Vec<u8>,
    interface: u32,
    start_ns: u64,
    end_ns: u64,
    received: u64,
    dropped: u64,
) {
    let start = begin(out, ISB);
    put_u32(out, interface);
    put_u32(out, (end_ns >> 32) as u32);
    put_u32(out, end_ns as u32);
    let split = |t: u64| {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&((t >> 32) as u32).to_ne_bytes());
        b[4..].copy_from_slice(&(t as u32).to_ne_bytes());
        b
    };
    option(out, ISB_STARTTIME, &split(start_ns));
    option(out, ISB_ENDTIME, &split(end_ns));
    option(out, ISB_IFRECV, &received.to_ne_bytes());
    option(out, ISB_IFDROP, &dropped.to_ne_bytes());
    end_of_options(out);
    finish(out, start);
}

/// Walks a pcapng byte stream block by block: `(block type, whole block)` for each complete
/// block at the front of `bytes`, and how many bytes they take (the rest is an incomplete
/// block). The CLI uses it to write only whole blocks and to count packets.
pub fn complete_blocks(bytes: &[u8]) -> (Vec<(u32, &[u8])>, usize) {
    let mut blocks = Vec::new();
    let mut at = 0;
    while let Some(head) = bytes.get(at..at + 8) {
        let kind = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
        let len = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]) as usize;
        if len < 12 || !len.is_multiple_of(4) {
            // Not a stream this module wrote: hand the rest over as it is.
            blocks.push((u32::MAX, &bytes[at..]));
            return (blocks, bytes.len());
        }
        let Some(block) = bytes.get(at..at + len) else {
            break;
        };
        blocks.push((kind, block));
        at += len;
    }
    (blocks, at)
}

/// The block type of an Enhanced Packet Block and of an Interface Statistics Block, for
/// readers of [`complete_blocks`].
pub const BLOCK_EPB: u32 = EPB;
pub const BLOCK_ISB: u32 = ISB;

/// `isb_ifdrop` of an Interface Statistics Block written by [`interface_statistics`].
pub fn isb_dropped(block: &[u8]) -> Option<u64> {
    // type, length, interface, timestamp (8), then options.
    let mut at = 20;
    while let Some(h) = block.get(at..at + 4) {
        let code = u16::from_ne_bytes([h[0], h[1]]);
        let len = u16::from_ne_bytes([h[2], h[3]]) as usize;
        if code == OPT_END {
            return None;
        }
        if code == ISB_IFDROP && len == 8 {
            let v = block.get(at + 4..at + 12)?;
            return Some(u64::from_ne_bytes(v.try_into().ok()?));
        }
        at += 4 + len.div_ceil(4) * 4;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::{Block, PcapNgReader};
    use pcap_file::DataLink;

    #[test]
    fn a_stream_reads_back_with_pcap_file() {
        let mut out = Vec::new();
        section_header(&mut out, "softroce test");
        interface_description(&mut out, "srxe0", "softroce srxe0", 0);
        interface_description(&mut out, "srxe1", "softroce srxe1", 128);
        let frame: Vec<u8> = (0..61u8).collect();
        // Each frame built in place, then the block laid around it (cut to `captured`).
        let mut epb = |iface, ts, direction, captured: usize| {
            let at = out.len();
            out.extend_from_slice(&[0xee; PACKET_BLOCK_HEAD]);
            out.extend_from_slice(&frame);
            out.resize(at + packet_block_len(captured), 0xee);
            packet_block(&mut out[at..], iface, ts, direction, captured, frame.len());
        };
        epb(0, 1_700_000_000_123_456_789, Direction::Outbound, 61);
        epb(1, 5, Direction::Inbound, 16);
        epb(0, 7, Direction::Outbound, 10);
        interface_statistics(&mut out, 0, 1, 2, 1, 3);
        let mut r = PcapNgReader::new(&out[..]).unwrap();
        let mut packets = Vec::new();
        let mut stats = 0;
        while let Some(b) = r.next_block() {
            match b.unwrap() {
                Block::EnhancedPacket(p) => packets.push((
                    p.interface_id,
                    p.timestamp.as_nanos(),
                    p.original_len,
                    p.data.to_vec(),
                )),
                Block::InterfaceStatistics(_) => stats += 1,
                _ => {}
            }
        }
        assert_eq!(r.interfaces().len(), 2);
        assert_eq!(r.interfaces()[0].linktype, DataLink::ETHERNET);
        assert_eq!(packets.len(), 3);
        assert_eq!(
            packets[2],
            (0, 7, 61, frame[..10].to_vec()),
            "built in place, cut"
        );
        assert_eq!(
            packets[0],
            (0, 1_700_000_000_123_456_789, 61, frame.clone())
        );
        assert_eq!(packets[1], (1, 5, 61, frame[..16].to_vec()));
        assert_eq!(stats, 1);

        let (blocks, used) = complete_blocks(&out[..out.len() - 5]);
        assert!(used < out.len() - 5, "the cut last block is left out");
        let kinds: Vec<u32> = blocks.iter().map(|b| b.0).collect();
        assert_eq!(kinds, [SHB, IDB, IDB, EPB, EPB, EPB]);
        let (blocks, used) = complete_blocks(&out);
        assert_eq!(used, out.len());
        assert_eq!(isb_dropped(blocks.last().unwrap().1), Some(3));
    }
}
