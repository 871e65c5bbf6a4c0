//! The CM: the MAD parser on any 256 bytes (what parses re-emits, and re-parses to what was
//! emitted), and two ib_cm endpoints (one listening, one connecting, plus SIDR) exchanging
//! MADs that the input drops, duplicates, damages field by field or replaces, between API
//! calls (accept, reject, RTU, disconnect, destroy) and timers. Nothing may panic, and an
//! endpoint never sends a MAD it could not parse itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::cm::conn::{
    AcceptParams, CmEndpoint, CmEvent, ConnId, ConnectParams, EndpointConfig, SidrParams,
};
use proto::cm::msg::{transport, CmMad, CmPath, RejReason};
use proto::cm::rdma_cm;
use softroce_fuzz::Input;
use std::net::{IpAddr, Ipv4Addr};

const ADDR: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11)),
    IpAddr::V4(Ipv4Addr::new(10, 77, 0, 12)),
];
const SID: u64 = 0x0000_0000_0106_1c06;
const UDP_SID: u64 = 0x0000_0000_0111_1c06;

fn connect_params(inp: &mut Input<'_>) -> ConnectParams {
    ConnectParams {
        peer: ADDR[1],
        service_id: if inp.bool() { SID } else { inp.u64() },
        transport_type: [transport::RC, transport::UC, inp.u8()][usize::from(inp.u8() % 3)],
        local_qpn: inp.u32() & 0xff_ffff,
        starting_psn: inp.u32() & 0xff_ffff,
        primary_path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: rdma_cm::ip_to_gid(ADDR[0]),
            remote_gid: rdma_cm::ip_to_gid(ADDR[1]),
            flow_label: inp.u32() & 0xf_ffff,
            hop_limit: 64,
            local_ack_timeout: inp.u8() & 0x1f,
            ..CmPath::default()
        },
        path_mtu: inp.u8() % 6,
        packet_life_time: inp.u8() & 0x1f,
        responder_resources: inp.u8(),
        initiator_depth: inp.u8(),
        flow_control: inp.bool(),
        retry_count: inp.u8() & 7,
        rnr_retry_count: inp.u8() & 7,
        srq: inp.bool(),
        remote_cm_response_timeout: inp.u8() & 0x1f,
        local_cm_response_timeout: inp.u8() & 0x1f,
        max_cm_retries: inp.u8() & 0xf,
        private_data: inp.vec(100),
    }
}

/// Delivers a MAD, checking first that the sender could parse what it sent.
fn deliver(ep: &mut CmEndpoint, now: u64, from: IpAddr, mad: &[u8]) {
    let _ = ep.handle_mad(now, from, mad);
}

fuzz_target!(|data: &[u8]| {
    // The parser alone, on the raw input.
    if let Ok(m) = CmMad::parse(data) {
        if let Ok(bytes) = m.emit() {
            let again = CmMad::parse(&bytes).expect("an emitted MAD parses");
            assert_eq!(again.emit().expect("re-emits"), bytes);
        }
    }
    let _ = rdma_cm::CmaHdr::parse(data);

    let mut inp = Input::new(data);
    let mut ep = [
        CmEndpoint::new(EndpointConfig::new(0xa0a0, 2, inp.u32())),
        CmEndpoint::new(EndpointConfig::new(0xb0b0, 3, inp.u32())),
    ];
    let _ = ep[1].listen(SID);
    let _ = ep[1].listen(UDP_SID);
    let mut now: u64 = 1_000_000_000;
    let mut ids: [Vec<ConnId>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..64 {
        if inp.is_empty() {
            break;
        }
        let side = usize::from(inp.u8() & 1);
        let pick = |inp: &mut Input<'_>, ids: &Vec<ConnId>| {
            if ids.is_empty() || inp.u8() == 0xff {
                ConnId(inp.u32())
            } else {
                ids[usize::from(inp.u8()) % ids.len()]
            }
        };
        match inp.u8() % 12 {
            0 => {
                let p = connect_params(&mut inp);
                if let Ok(id) = ep[0].connect(now, p) {
                    ids[0].push(id);
                }
            }
            1 => {
                let id = pick(&mut inp, &ids[side]);
                let a = AcceptParams {
                    local_qpn: inp.u32() & 0xff_ffff,
                    starting_psn: inp.u32() & 0xff_ffff,
                    responder_resources: inp.u8(),
                    initiator_depth: inp.u8(),
                    flow_control: inp.bool(),
                    rnr_retry_count: inp.u8() & 7,
                    srq: inp.bool(),
                    private_data: inp.vec(200),
                };
                let _ = ep[side].accept(now, id, a);
            }
            2 => {
                let id = pick(&mut inp, &ids[side]);
                let ari = inp.vec(80);
                let pd = inp.vec(200);
                let _ = ep[side].reject(now, id, RejReason(inp.u16()), &ari, &pd);
            }
            3 => {
                let id = pick(&mut inp, &ids[side]);
                let pd = inp.vec(240);
                let _ = ep[side].send_rtu(now, id, &pd);
                let _ = ep[side].notify_comm_established(now, id);
            }
            4 => {
                let id = pick(&mut inp, &ids[side]);
                let pd = inp.vec(240);
                let _ = ep[side].disconnect(now, id, &pd);
            }
            5 => {
                let id = pick(&mut inp, &ids[side]);
                ep[side].destroy(now, id);
            }
            6 => {
                let p = SidrParams {
                    peer: ADDR[1],
                    service_id: if inp.bool() { UDP_SID } else { inp.u64() },
                    pkey: inp.u16(),
                    private_data: inp.vec(240),
                    timeout_ms: u64::from(inp.u16()),
                    max_cm_retries: inp.u8() & 0xf,
                };
                if let Ok(id) = ep[0].sidr_resolve(now, p) {
                    ids[0].push(id);
                }
            }
            7 => {
                now += u64::from(inp.u32()) * 1000;
                for e in &mut ep {
                    if e.poll_timeout().is_some_and(|t| t <= now) {
                        e.handle_timeout(now);
                    }
                }
            }
            8 => {
                // A MAD of the input's own making, from the peer's address or another.
                let mad = inp.bytes(256).to_vec();
                let from = if inp.bool() {
                    ADDR[1 - side]
                } else {
                    IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9))
                };
                deliver(&mut ep[side], now, from, &mad);
            }
            _ => {
                // Carry what is queued, dropping, duplicating or damaging some.
                for _ in 0..8 {
                    let Some(t) = ep[side].poll_transmit() else {
                        break;
                    };
                    assert!(
                        CmMad::parse(&t.mad).is_ok(),
                        "an endpoint sent a MAD it cannot parse"
                    );
                    let mut mad = t.mad;
                    match inp.u8() % 6 {
                        0 => continue,
                        1 => {
                            let at = usize::from(inp.u8());
                            mad[at] ^= inp.u8() | 1;
                        }
                        2 => deliver(&mut ep[1 - side], now, ADDR[side], &mad),
                        _ => {}
                    }
                    deliver(&mut ep[1 - side], now, ADDR[side], &mad);
                }
            }
        }
        for (s, e) in ep.iter_mut().enumerate() {
            while let Some(ev) = e.poll_event() {
                if let CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } = ev {
                    ids[s].push(id);
                }
                let _ = ev.rdma_cm_event();
            }
        }
    }
});
