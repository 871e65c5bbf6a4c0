//! The layers around a device's [`Link`], as smoltcp's `phy` middlewares wrap a device: fault
//! injection ([`crate::fault`]) next to the link and capture ([`crate::capture`]) on the
//! wire side of it, so a capture shows what really went out (a dropped packet is missing, a
//! duplicated one is there twice, a corrupted one has a bad ICRC) and everything that came
//! in (before a receive fault dropped it).
//!
//! Packets between two QPs of the device never reach the link; the device hands them through
//! [`Layers::local`] so that they meet the same rules and are captured once, as on a wire.
//!
//! A port that is down (`softroce link set NAME down`, or the netdev it follows lost its
//! carrier) carries nothing, as a pulled cable: what the device sends, what arrives and what
//! passes between its own QPs is dropped here and counted (`link_port_down_dropped`), before
//! any capture or fault rule sees it; RC requesters retry until they report
//! `IBV_WC_RETRY_EXC_ERR`, as on hardware.
//!
//! With no capture, no fault rule and the port up, every call goes straight to the link
//! after one test.

use super::link::{Link, RxPacket, WireView};
use super::NetCounters;
use crate::capture::{DeviceCapture, Direction};
use crate::fault::{Decision, FaultInjector, HeldPackets, Way};
use proto::transport::{GidType, Nanos, Transmit};
use std::io;
use std::net::IpAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

/// A received packet held back by a fault rule.
struct HeldRx {
    src: IpAddr,
    dst: IpAddr,
    packet: Vec<u8>,
    bth: usize,
    gid_type: GidType,
}

impl HeldRx {
    fn view(&self) -> RxPacket<'_> {
        RxPacket {
            src: self.src,
            dst: self.dst,
            packet: &self.packet,
            bth: self.bth,
            gid_type: self.gid_type,
        }
    }
}

/// A device's link with its capture and fault layers.
pub struct Layers {
    inner: Box<dyn Link + Send>,
    pub capture: DeviceCapture,
    pub faults: FaultInjector,
    held_tx: HeldPackets<(Vec<u8>, Transmit)>,
    held_rx: HeldPackets<HeldRx>,
    held_local: HeldPackets<(Vec<u8>, usize)>,
    start: Instant,
    /// Packets a corrupt rule broke that did not go through the link's ICRC check (received,
    /// or between local QPs): counted where the check would have counted them.
    corrupt_dropped: u64,
    /// Whether the link was asked to keep what it sends ([`Link::keep_last_sent`]).
    keeping_sent: bool,
    /// The port is down: nothing passes ([`Layers::set_port_up`]).
    port_down: bool,
    /// Packets dropped because the port was down.
    port_down_dropped: u64,
}

impl Layers {
    pub fn new(inner: Box<dyn Link + Send>, node_guid: u64, seed: u64) -> Layers {
        Layers {
            inner,
            capture: DeviceCapture::new(node_guid),
            faults: FaultInjector::new(seed),
            held_tx: HeldPackets::default(),
            held_rx: HeldPackets::default(),
            held_local: HeldPackets::default(),
            start: Instant::now(),
            corrupt_dropped: 0,
            keeping_sent: false,
            port_down: false,
            port_down_dropped: 0,
        }
    }

    /// The port comes up or goes down. Going down, the packets held by fault rules are lost
    /// with it.
    pub fn set_port_up(&mut self, up: bool) {
        self.port_down = !up;
        if !up {
            let held = self.held_tx.len() + self.held_rx.len() + self.held_local.len();
            self.port_down_dropped += held as u64;
            self.held_tx = HeldPackets::default();
            self.held_rx = HeldPackets::default();
            self.held_local = HeldPackets::default();
        }
    }

    /// Whether the port is down.
    pub fn port_down(&self) -> bool {
        self.port_down
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// Whether either layer has anything to do.
    #[inline]
    fn active(&self) -> bool {
        self.port_down
            || self.capture.is_on()
            || self.faults.is_on()
            || !self.held_tx.is_empty()
            || !self.held_rx.is_empty()
            || !self.held_local.is_empty()
    }

    /// Tells the link whether a capture listens (when that changed).
    fn sync_keep_sent(&mut self) {
        let on = self.capture.is_on();
        if on != self.keeping_sent {
            self.keeping_sent = on;
            self.inner.keep_last_sent(on);
        }
    }

    /// Sends through the link and records what left.
    fn send_out(&mut self, frame: &mut [u8], t: &Transmit, corrupt: bool) {
        self.sync_keep_sent();
        if corrupt {
            if !self.inner.send_corrupted(frame, t) {
                // The link cannot break a packet: it is lost instead, as the receiver's ICRC
                // check would have it.
                return;
            }
        } else {
            self.inner.send(frame, t);
        }
        self.record_sent();
    }

    fn record_sent(&mut self) {
        if !self.capture.is_on() {
            return;
        }
        match self.inner.last_sent() {
            Some(WireView::Udp(d)) => self.capture.datagram(Direction::Outbound, &d),
            Some(WireView::Ethernet { frame, bth }) => {
                self.capture.ethernet(Direction::Outbound, frame, bth)
            }
            None => {}
        }
    }

    /// Sends the held packets that are due.
    fn release_tx(&mut self, now: Nanos) {
        while let Some((_, (mut frame, t))) = self.held_tx.pop_due(now) {
            self.send_out(&mut frame, &t, false);
            self.held_tx.passed(now, Way::Tx);
        }
    }

    /// A packet between two QPs of this device (the engine's network-layer packet at
    /// `block[frame]`, BTH at `bth` in it; its ICRC computed only when the queue left room
    /// for a capture, [`crate::net::LocalFrames`]), on its way to `deliver`: it
    /// meets the fault rules and the capture, and is delivered now (once, twice) or later
    /// ([`Layers::release_local`]). Returns whether the capture completed its block in place
    /// ([`DeviceCapture::local_packet`]; `block` is the frame alone when the queue left no
    /// room around it).
    pub fn local(
        &mut self,
        block: &mut [u8],
        frame: Range<usize>,
        bth: usize,
        deliver: &mut dyn FnMut(&[u8]),
    ) -> bool {
        if !self.active() {
            if let Some(f) = block.get(frame) {
                deliver(f);
            }
            return false;
        }
        if self.port_down {
            self.port_down_dropped += 1;
            return false;
        }
        let Some(bytes) = block.get(frame.clone()) else {
            return false;
        };
        // The clock only for what needs it: with a capture alone, a clock read per packet
        // was a tenth of what the capture cost the device thread.
        let timed = self.faults.is_on() || !self.held_local.is_empty();
        let now = if timed { self.now() } else { 0 };
        let decision = if self.faults.is_on() {
            self.faults
                .decide(now, Way::Local, bytes.get(bth..).unwrap_or(&[]))
        } else {
            Decision::Pass
        };
        let on = self.capture.is_on();
        let mut in_place = false;
        match decision {
            Decision::Pass | Decision::Nak { .. } | Decision::Duplicate => {
                if on {
                    in_place = self.capture.local_packet(block, frame.clone(), bth);
                }
                let Some(bytes) = block.get(frame) else {
                    return in_place;
                };
                deliver(bytes);
                if decision == Decision::Duplicate {
                    // The second one is a copy in the capture's batch.
                    if on {
                        self.capture.packet(Direction::Outbound, bytes, bth, false);
                    }
                    deliver(bytes);
                    self.held_local.passed(now, Way::Local);
                } else if timed {
                    self.held_local.passed(now, Way::Local);
                }
            }
            Decision::Drop => {}
            Decision::Corrupt => {
                if on {
                    self.capture.packet(Direction::Outbound, bytes, bth, true);
                }
                self.corrupt_dropped += 1;
            }
            Decision::Delay(due) => self
                .held_local
                .delay(due, Way::Local, (bytes.to_vec(), bth)),
            Decision::Reorder => self
                .held_local
                .reorder(now, Way::Local, (bytes.to_vec(), bth)),
        }
        in_place
    }

    /// Hands the held packets between local QPs that are due to `deliver` (with where each
    /// one's BTH starts). Returns whether any was.
    pub fn release_local(&mut self, deliver: &mut dyn FnMut(&[u8], usize)) -> bool {
        if self.held_local.is_empty() {
            return false;
        }
        let now = self.now();
        let mut any = false;
        while let Some((_, (frame, bth))) = self.held_local.pop_due(now) {
            any = true;
            if self.capture.is_on() {
                self.capture.packet(Direction::Outbound, &frame, bth, false);
            }
            deliver(&frame, bth);
            self.held_local.passed(now, Way::Local);
        }
        any
    }

    /// How long until a held packet is due.
    fn held_wait(&self) -> Option<Duration> {
        let next = [
            self.held_tx.poll_at(),
            self.held_rx.poll_at(),
            self.held_local.poll_at(),
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(Duration::from_nanos(next.saturating_sub(self.now())))
    }

    /// The device goes away: captures listening to it end.
    pub fn close(&mut self) {
        self.capture.close();
    }
}

impl Link for Layers {
    fn poll(&mut self, wait: Duration, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize {
        if !self.active() {
            return self.inner.poll(wait, deliver);
        }
        if self.port_down {
            // The socket still receives (it is the host's); the port takes nothing.
            let dropped = &mut self.port_down_dropped;
            self.inner.poll(wait, &mut |_: &RxPacket<'_>| *dropped += 1);
            return 0;
        }
        if !wait.is_zero() && self.capture.is_on() {
            // The device is about to block: what the capture holds goes to its reader now.
            self.capture.hand_over();
        }
        self.capture.tick();
        let now = self.now();
        self.release_tx(now);
        let mut n = 0;
        while let Some((_, held)) = self.held_rx.pop_due(now) {
            n += 1;
            deliver(&held.view());
            self.held_rx.passed(now, Way::Rx);
        }
        let wait = self.held_wait().map_or(wait, |w| wait.min(w));
        let (capture, faults, held_rx, corrupt_dropped) = (
            &mut self.capture,
            &mut self.faults,
            &mut self.held_rx,
            &mut self.corrupt_dropped,
        );
        // After blocking, the clock read before is stale for what arrived.
        let mut stale = !wait.is_zero();
        n += self.inner.poll(wait, &mut |p: &RxPacket<'_>| {
            if capture.is_on() {
                if std::mem::take(&mut stale) {
                    capture.tick();
                }
                capture.packet(Direction::Inbound, p.packet, p.bth, false);
            }
            let decision = if faults.is_on() {
                faults.decide(now, Way::Rx, p.transport())
            } else {
                Decision::Pass
            };
            match decision {
                Decision::Pass | Decision::Nak { .. } => {
                    deliver(p);
                    held_rx.passed(now, Way::Rx);
                }
                Decision::Drop => {}
                Decision::Duplicate => {
                    deliver(p);
                    deliver(p);
                    held_rx.passed(now, Way::Rx);
                }
                Decision::Corrupt => *corrupt_dropped += 1,
                Decision::Delay(_) | Decision::Reorder => {
                    let held = HeldRx {
                        src: p.src,
                        dst: p.dst,
                        packet: p.packet.to_vec(),
                        bth: p.bth,
                        gid_type: p.gid_type,
                    };
                    if let Decision::Delay(due) = decision {
                        held_rx.delay(due, Way::Rx, held);
                    } else {
                        held_rx.reorder(now, Way::Rx, held);
                    }
                }
            }
        });
        n
    }

    fn send(&mut self, frame: &mut [u8], t: &Transmit) {
        if !self.active() {
            self.inner.send(frame, t);
            return;
        }
        if self.port_down {
            self.port_down_dropped += 1;
            return;
        }
        // The clock only when a fault rule or a held packet needs it (as in `local`): a
        // capture alone reads it once per round of the loop, not per packet.
        let timed = self.faults.is_on() || !self.held_tx.is_empty();
        let now = if timed { self.now() } else { 0 };
        let decision = if self.faults.is_on() {
            let bth = frame.get(t.transport_offset..t.len).unwrap_or(&[]);
            self.faults.decide(now, Way::Tx, bth)
        } else {
            Decision::Pass
        };
        match decision {
            Decision::Pass | Decision::Nak { .. } => {
                self.send_out(frame, t, false);
                self.held_tx.passed(now, Way::Tx);
                self.release_tx(now);
            }
            Decision::Drop => {}
            Decision::Duplicate => {
                // The link seals a copy: the frame can be sent again as it is.
                self.send_out(frame, t, false);
                self.send_out(frame, t, false);
                self.held_tx.passed(now, Way::Tx);
                self.release_tx(now);
            }
            Decision::Corrupt => self.send_out(frame, t, true),
            Decision::Delay(due) => {
                let copy = frame.get(..t.len).unwrap_or_default().to_vec();
                self.held_tx.delay(due, Way::Tx, (copy, *t));
            }
            Decision::Reorder => {
                let copy = frame.get(..t.len).unwrap_or_default().to_vec();
                self.held_tx.reorder(now, Way::Tx, (copy, *t));
            }
        }
    }

    fn send_gsi(&mut self, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        if self.port_down {
            self.port_down_dropped += 1;
            return;
        }
        // Sent outside a round of the loop (a control message woke the device).
        self.capture.tick();
        self.sync_keep_sent();
        self.inner.send_gsi(src, dst, packet);
        self.record_sent();
    }

    fn send_gsi_as(&mut self, gid_type: GidType, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        if self.port_down {
            self.port_down_dropped += 1;
            return;
        }
        // Sent outside a round of the loop (a control message woke the device).
        self.capture.tick();
        self.sync_keep_sent();
        self.inner.send_gsi_as(gid_type, src, dst, packet);
        self.record_sent();
    }

    fn flush(&mut self) {
        if !self.held_tx.is_empty() {
            let now = self.now();
            self.release_tx(now);
        }
        self.inner.flush();
        self.capture.flush();
        if self.keeping_sent && !self.capture.is_on() {
            self.sync_keep_sent();
        }
    }

    fn set_addresses(&mut self, addrs: &[IpAddr]) {
        self.inner.set_addresses(addrs);
    }

    fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        self.inner.join_group(group)
    }

    fn leave_group(&mut self, group: IpAddr) {
        self.inner.leave_group(group);
    }

    fn max_sleep(&self) -> Option<Duration> {
        match (self.inner.max_sleep(), self.held_wait()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn counters(&self) -> NetCounters {
        let mut c = self.inner.counters();
        c.rx_bad_icrc += self.corrupt_dropped;
        c.port_down_dropped += self.port_down_dropped;
        c
    }

    fn last_sent(&self) -> Option<WireView<'_>> {
        self.inner.last_sent()
    }

    fn send_corrupted(&mut self, frame: &mut [u8], t: &Transmit) -> bool {
        self.inner.send_corrupted(frame, t)
    }

    fn keep_last_sent(&mut self, on: bool) {
        self.inner.keep_last_sent(on);
    }

    fn peer_solves_ident(&mut self, peer: IpAddr, yes: bool) {
        self.inner.peer_solves_ident(peer, yes);
    }

    fn set_carrier(&mut self, on: bool) {
        self.inner.set_carrier(on);
    }

    fn solicit_neighbour(&mut self, peer: IpAddr) {
        self.inner.solicit_neighbour(peer);
    }
}
