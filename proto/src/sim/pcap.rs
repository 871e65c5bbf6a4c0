//! A classic pcap (libpcap 2.4, microsecond timestamps, LINKTYPE_ETHERNET) of the packets the
//! simulator carries, with an Ethernet header in front of each IP packet (or RoCE v1 GRH).

/// Writes classic pcap into memory.
#[derive(Debug, Clone)]
pub struct PcapWriter {
    buf: Vec<u8>,
}

impl Default for PcapWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PcapWriter {
    pub fn new() -> PcapWriter {
        let mut buf = Vec::new();
        buf.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        buf.extend_from_slice(&2u16.to_le_bytes());
        buf.extend_from_slice(&4u16.to_le_bytes());
        buf.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        buf.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        buf.extend_from_slice(&65535u32.to_le_bytes()); // snaplen
        buf.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        PcapWriter { buf }
    }

    /// Appends `ip_packet`, sent by node `from` at virtual time `now_ns`.
    pub fn record(&mut self, now_ns: u64, from: usize, ip_packet: &[u8]) {
        // RoCE v1 is a GRH (version 6, next header 0x1b) right after an Ethernet header
        // of Ethertype 0x8915.
        let ethertype: u16 = match (ip_packet.first().map(|b| b >> 4), ip_packet.get(6)) {
            (Some(6), Some(&crate::wire::GRH_NEXT_HEADER_IBA)) => crate::wire::ETHERTYPE_ROCE_V1,
            (Some(6), _) => 0x86dd,
            _ => 0x0800,
        };
        let len = (14 + ip_packet.len()) as u32;
        self.buf
            .extend_from_slice(&((now_ns / 1_000_000_000) as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&(((now_ns / 1_000) % 1_000_000) as u32).to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        // Locally administered MACs that name the nodes: 02:00:00:00:00:<node+1>.
        let node = (from as u8).wrapping_add(1);
        self.buf.extend_from_slice(&[0x02, 0, 0, 0, 0, 0xff]);
        self.buf.extend_from_slice(&[0x02, 0, 0, 0, 0, node]);
        self.buf.extend_from_slice(&ethertype.to_be_bytes());
        self.buf.extend_from_slice(ip_packet);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn write_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(path, &self.buf)
    }
}
