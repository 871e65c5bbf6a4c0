//! Reading packet captures: classic pcap and pcapng, with the link types tcpdump and tshark
//! write for RoCE traffic (Ethernet, Linux cooked v1 and v2, raw IP, BSD loopback).

pub mod check;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;
use proto::wire::{self, FrameRepr, ParsedFrame};
use std::io::Read;

/// One captured record.
#[derive(Debug)]
pub struct Record {
    pub link: DataLink,
    /// Length of the packet on the wire.
    pub orig_len: usize,
    pub data: Vec<u8>,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a pcap or pcapng file: {0}")]
    Format(String),
}

/// A capture file opened for reading, either format.
pub enum CaptureReader<R: Read> {
    Pcap(PcapReader<R>),
    PcapNg(PcapNgReader<R>),
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl CaptureReader<std::io::Cursor<Vec<u8>>> {
    /// Reads a whole capture into memory and picks the format from its magic number.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ReadError> {
        let is_ng = bytes.get(..4) == Some(&PCAPNG_MAGIC[..]);
        let cursor = std::io::Cursor::new(bytes);
        if is_ng {
            PcapNgReader::new(cursor)
                .map(CaptureReader::PcapNg)
                .map_err(|e| ReadError::Format(e.to_string()))
        } else {
            PcapReader::new(cursor)
                .map(CaptureReader::Pcap)
                .map_err(|e| ReadError::Format(e.to_string()))
        }
    }
}

impl<R: Read> CaptureReader<R> {
    /// The next packet record, skipping pcapng's non-packet blocks. `Err` means the file ends
    /// mid-record or is corrupt from there on.
    pub fn next_record(&mut self) -> Option<Result<Record, String>> {
        match self {
            CaptureReader::Pcap(r) => {
                let link = r.header().datalink;
                // Raw records: pcap-file's checked records refuse orig_len > snaplen, which is
                // exactly what a capture with a small snaplen holds.
                r.next_raw_packet().map(|res| {
                    res.map(|p| Record {
                        link,
                        orig_len: p.orig_len as usize,
                        data: p.data.into_owned(),
                    })
                    .map_err(|e| e.to_string())
                })
            }
            CaptureReader::PcapNg(r) => loop {
                let block = match r.next_block()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e.to_string())),
                };
                let (iface, orig_len, data) = match block {
                    Block::EnhancedPacket(p) => {
                        (p.interface_id, p.original_len, p.data.into_owned())
                    }
                    Block::SimplePacket(p) => (0, p.original_len, p.data.into_owned()),
                    Block::Packet(p) => {
                        (p.interface_id as u32, p.original_len, p.data.into_owned())
                    }
                    _ => continue,
                };
                let Some(desc) = r.interfaces().get(iface as usize) else {
                    return Some(Err(format!("packet names unknown interface {iface}")));
                };
                return Some(Ok(Record {
                    link: desc.linktype,
                    orig_len: orig_len as usize,
                    data,
                }));
            },
        }
    }
}

/// Classifies a record's link layer and parses the RoCE frame inside, if any.
pub fn parse_record(rec: &Record) -> wire::Result<ParsedFrame<'_>> {
    let data = &rec.data[..];
    let wire_len = rec.orig_len.max(data.len());
    // Linux cooked headers carry the Ethertype at a fixed offset, then the network header.
    let after = |skip: usize, type_at: usize| -> wire::Result<ParsedFrame<'_>> {
        let ethertype = data
            .get(type_at..type_at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(wire::Error::Truncated {
                layer: "link header",
                need: skip,
                have: data.len(),
            })?;
        let rest = data.get(skip..).unwrap_or(&[]);
        FrameRepr::parse_ethertype(ethertype, rest, wire_len.saturating_sub(skip))
    };
    match rec.link {
        DataLink::ETHERNET => FrameRepr::parse_ethernet(data, wire_len),
        DataLink::LINUX_SLL => after(16, 14),
        DataLink::LINUX_SLL2 => after(20, 0),
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => FrameRepr::parse_ip(data, wire_len),
        DataLink::NULL | DataLink::LOOP => {
            let rest = data.get(4..).unwrap_or(&[]);
            FrameRepr::parse_ip(rest, wire_len.saturating_sub(4))
        }
        DataLink::Unknown(12) | DataLink::Unknown(14) => FrameRepr::parse_ip(data, wire_len),
        _ => Err(wire::Error::Unsupported("link type")),
    }
}
