//! Two engines (A at 10.0.0.1, B at 10.0.0.2) with connected RC, UC and UD QPs and memory
//! regions, driven by fuzzer input: packets built field by field (any opcode, QPN, PSN, key,
//! bounds and length), raw bytes, legitimate traffic between the two with packets dropped or
//! damaged in flight, timers and posted work. [`World::check`] asserts what must hold whatever
//! arrives: memory that no key grants write access to never changes.

use crate::Input;
use proto::sim::hostile::{ipv4_udp, ExtFields, RawPacket};
use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::wire::Opcode;
use proto::Qpn;
use std::net::Ipv4Addr;

pub const A: usize = 0;
pub const B: usize = 1;
const IP: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)];
const MR_LEN: usize = 16 * 1024;
const QKEY: u32 = 0x1111_1111;

/// A region and what it must still hold at the end.
struct Sealed {
    addr: u64,
    keys: Option<MrKeys>,
    bytes: Vec<u8>,
}

pub struct World {
    pub sim: Sim,
    /// (A's QPN, B's QPN) of the RC, UC and UD pairs.
    pub qps: [(Qpn, Qpn); 3],
    /// The remotely writable MRs of A and B.
    pub mr: [(u64, MrKeys); 2],
    /// On B: an MR of another PD, a read-only MR of B's PD, and memory no MR covers.
    sealed: Vec<Sealed>,
    pub now: u64,
    buf: Vec<u8>,
    /// Packets given to each engine.
    fed: [u64; 2],
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl World {
    pub fn new() -> World {
        let mut sim = Sim::pair(7, LinkModel::default());
        let mut qps = [(Qpn::new(0), Qpn::new(0)); 3];
        for (i, ty) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
            let o = QpOptions {
                qp_type: ty,
                sq_psn: 0x00ff_fff0, // wraps soon: PSN arithmetic across 2^24
                rq_psn: 0x10,
                ..QpOptions::default()
            };
            qps[i] = sim.connect(A, B, &o);
        }
        let all = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
        let mr = [sim.alloc_mr(A, MR_LEN, all), sim.alloc_mr(B, MR_LEN, all)];
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
        let b = sim.dev(B);
        let other_pd = b.alloc_pd();
        let foreign_addr = b.memory_mut().alloc(4096);
        b.memory_mut().fill(foreign_addr, &pattern);
        let foreign = b.reg_mr(other_pd, foreign_addr, 4096, all).ok();
        let (ro_addr, ro) = sim.alloc_mr(B, 4096, Access::REMOTE_READ);
        sim.write_mem(B, ro_addr, &pattern);
        let guard = sim.dev(B).memory_mut().alloc(4096);
        sim.write_mem(B, guard, &pattern);
        let sealed = vec![
            Sealed {
                addr: foreign_addr,
                keys: foreign,
                bytes: pattern.clone(),
            },
            Sealed {
                addr: ro_addr,
                keys: Some(ro),
                bytes: pattern.clone(),
            },
            Sealed {
                addr: guard,
                keys: None,
                bytes: pattern,
            },
        ];
        World {
            sim,
            qps,
            mr,
            sealed,
            now: 1_000_000,
            buf: vec![0u8; MAX_FRAME_LEN],
            fed: [0; 2],
        }
    }

    fn qpns_of(&self, node: usize) -> [u32; 3] {
        let q = |p: (Qpn, Qpn)| if node == A { p.0 } else { p.1 }.value();
        [q(self.qps[0]), q(self.qps[1]), q(self.qps[2])]
    }

    fn rkeys(&self) -> Vec<u32> {
        let mut k = vec![
            self.mr[B].1.rkey.0,
            self.mr[A].1.rkey.0,
            self.mr[B].1.rkey.0 ^ 1,
        ];
        k.extend(self.sealed.iter().filter_map(|s| s.keys.map(|k| k.rkey.0)));
        k
    }

    /// A transport packet for `to` built field by field from the input.
    pub fn structured(&mut self, inp: &mut Input<'_>, to: usize) -> Vec<u8> {
        let mut known: Vec<u8> = Opcode::all().map(|o| o.0).collect();
        known.sort_unstable();
        let opcode = if inp.bool() {
            known[inp.u8() as usize % known.len()]
        } else {
            inp.u8()
        };
        let own = self.qpns_of(to);
        let dest = inp.pick_or_raw(&[own[0], own[1], own[2], 1, 0xff_ffff, 0]) & 0xff_ffff;
        let expected = self
            .sim
            .dev(to)
            .query_qp(Qpn::new(dest))
            .map(|(_, a)| if to == B { a.rq_psn } else { a.sq_psn }.value())
            .unwrap_or(0);
        let psn = match inp.u8() % 4 {
            0 => expected,
            1 => expected.wrapping_add(inp.u8() as i8 as u32),
            2 => expected.wrapping_sub(u32::from(inp.u8())),
            _ => inp.u32(),
        } & 0xff_ffff;
        let base = self.mr[to].0;
        let va = match inp.u8() % 4 {
            0 => base + u64::from(inp.u16()),
            1 => {
                self.sealed[inp.u8() as usize % self.sealed.len()].addr
                    + u64::from(inp.u16() % 4200)
            }
            2 => base.wrapping_sub(u64::from(inp.u16())),
            _ => inp.u64(),
        };
        let rkeys = self.rkeys();
        let peer = self.qpns_of(1 - to);
        let f = ExtFields {
            va,
            rkey: inp.pick_or_raw(&rkeys),
            dma_len: inp.pick_or_raw(&[0, 1, 8, 64, 1024, 4096, MR_LEN as u32, u32::MAX]),
            swap_add: inp.u64(),
            compare: inp.u64(),
            aeth: (u32::from(inp.u8()) << 24) | (inp.u32() & 0xff_ffff),
            qkey: inp.pick_or_raw(&[QKEY]),
            src_qpn: inp.pick_or_raw(&peer),
            imm: inp.pick_or_raw(&rkeys),
            feth: inp.u32(),
        };
        let len = inp.pick_or_raw(&[0, 1, 3, 4, 8, 64, 256, 1024, 4096]) as usize % 4200;
        let mut p = RawPacket::new(opcode, dest, psn, &f, len);
        let flags = inp.u8();
        if flags & 1 != 0 {
            p.pad_count = inp.u8() & 3;
        }
        if flags & 2 != 0 {
            p.pad_bytes = usize::from(inp.u8() & 7);
        }
        if flags & 4 != 0 {
            p.tver = inp.u8() & 0xf;
        }
        if flags & 8 != 0 {
            p.pkey = inp.u16();
        }
        p.ack_req = flags & 16 != 0;
        p.solicited = flags & 32 != 0;
        p.becn = flags & 64 != 0;
        let mut bytes = p.to_bytes();
        if flags & 128 != 0 {
            let cut = usize::from(inp.u16()) % (bytes.len() + 1);
            bytes.truncate(cut);
        }
        bytes
    }

    /// Wraps a transport packet in IPv4 and UDP from the other node to `to`.
    pub fn wrap(&self, inp: &mut Input<'_>, to: usize, transport: &[u8], seal: bool) -> Vec<u8> {
        let sport = inp.u16() | 0xc000;
        let src = if inp.u8() == 0xff {
            Ipv4Addr::new(10, 0, 0, 9)
        } else {
            IP[1 - to]
        };
        ipv4_udp(src, IP[to], sport, inp.u8() & 3, transport, seal)
    }

    /// One action chosen by the input.
    pub fn step(&mut self, inp: &mut Input<'_>) {
        match inp.u8() % 10 {
            0 => {
                let n = usize::from(inp.u16()) % 4400;
                let raw = inp.bytes(n).to_vec();
                self.feed(B, &raw, false);
            }
            1 => {
                let n = usize::from(inp.u16()) % 4400;
                let raw = inp.bytes(n).to_vec();
                self.feed(B, &raw, true);
            }
            op @ (2..=4) => {
                let to = if op == 3 { A } else { B };
                let t = self.structured(inp, to);
                let seal = op == 4;
                let packet = self.wrap(inp, to, &t, seal);
                self.feed(to, &packet, seal);
            }
            5 => self.pump(inp),
            6 => {
                self.now += u64::from(inp.u32()) * 64;
                let now = self.now;
                for n in [A, B] {
                    if self.sim.dev(n).poll_timeout().is_some_and(|t| t <= now) {
                        self.sim.dev(n).handle_timeout(now);
                    }
                }
            }
            7 => self.post_work(inp),
            8 => {
                let own = self.qpns_of(B);
                let q = Qpn::new(own[inp.u8() as usize % 3]);
                let (addr, keys) = self.mr[B];
                let off = u64::from(inp.u16()) % MR_LEN as u64;
                let len = u32::from(inp.u16());
                let sge = Sge {
                    addr: addr + off,
                    length: len,
                    lkey: keys.lkey,
                };
                let _ = self.sim.dev(B).post_recv(
                    q,
                    RecvWr {
                        wr_id: u64::from(inp.u16()),
                        sg_list: vec![sge],
                    },
                );
            }
            _ => {
                self.sim.drain_completions();
                for n in [A, B] {
                    while self.sim.dev(n).poll_event().is_some() {}
                }
            }
        }
    }

    /// Legitimate work on A towards B's MR.
    fn post_work(&mut self, inp: &mut Input<'_>) {
        let own = self.qpns_of(A);
        let q = Qpn::new(own[inp.u8() as usize % 2]);
        let (addr, keys) = self.mr[A];
        let (raddr, rkeys) = self.mr[B];
        let len = u32::from(inp.u16()) % (MR_LEN as u32 / 2);
        let remote = RemoteAddr {
            va: raddr + u64::from(inp.u16()) % (MR_LEN as u64 / 2),
            rkey: rkeys.rkey,
        };
        let aligned = RemoteAddr {
            va: remote.va & !7,
            ..remote
        };
        let op = match inp.u8() % 7 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm(inp.u32()),
            2 => SendOp::Write(remote),
            3 => SendOp::WriteWithImm(remote, inp.u32()),
            4 => SendOp::Read(remote),
            5 => SendOp::CompareSwap {
                remote: aligned,
                compare: inp.u64(),
                swap: inp.u64(),
            },
            _ => SendOp::FetchAdd {
                remote: aligned,
                add: inp.u64(),
            },
        };
        let sge = Sge {
            addr,
            length: len,
            lkey: keys.lkey,
        };
        let wr = SendWr::new(u64::from(inp.u16()), op, Some(sge));
        let _ = self.sim.dev(A).post_send(q, wr);
    }

    /// Carries packets both ways for a few rounds; the input drops or damages some.
    fn pump(&mut self, inp: &mut Input<'_>) {
        let now = self.now;
        for _ in 0..(inp.u8() % 16 + 1) {
            let mut moved = false;
            for (from, to) in [(A, B), (B, A)] {
                let Some(tx) = self.sim.dev(from).poll_transmit(now, &mut self.buf) else {
                    continue;
                };
                moved = true;
                let mut packet = self.buf[..tx.len].to_vec();
                match inp.u8() % 8 {
                    0 => continue, // lost
                    1 => {
                        // Damaged after the ICRC: delivered as if verified, so that the
                        // damage reaches the transport.
                        let at = usize::from(inp.u16()) % packet.len();
                        packet[at] ^= inp.u8() | 1;
                        self.feed(to, &packet, false);
                    }
                    2 => {
                        self.feed(to, &packet, true);
                        self.feed(to, &packet, true); // duplicated
                    }
                    _ => self.feed(to, &packet, true),
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Hands a packet to an engine, with (`icrc`) or without its ICRC checked.
    fn feed(&mut self, to: usize, packet: &[u8], icrc: bool) {
        let now = self.now;
        self.fed[to] += 1;
        if icrc {
            self.sim.dev(to).handle_packet(now, packet);
        } else {
            self.sim.dev(to).handle_verified_packet(now, packet);
        }
    }

    /// What must hold whatever arrived.
    pub fn check(&mut self) {
        for n in [A, B] {
            let c = *self.sim.dev(n).counters();
            let fates =
                c.rcvd_pkts + c.dropped_pkts + c.icrc_errors + (c.rp_cnp_handled + c.rp_cnp_ignored) + c.drops.bad_pkey;
            assert_eq!(
                fates, self.fed[n],
                "every packet has exactly one fate: {c:#?}"
            );
            assert_eq!(
                c.dropped_pkts,
                c.drops.dropped_total(),
                "every drop has a reason: {c:#?}"
            );
        }
        for s in &self.sealed {
            let now = self.sim.read_mem(B, s.addr, s.bytes.len());
            assert!(
                now == s.bytes,
                "memory no key grants remote write to changed at {:#x} (keys {:?})",
                s.addr,
                s.keys
            );
        }
    }
}
