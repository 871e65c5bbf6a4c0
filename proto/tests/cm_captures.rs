//! Golden vectors for the CM codec: every CM MAD the Linux kernel put on the wire in the
//! rdma_cm captures decodes, re-encodes to the same 256 bytes, and carries the field values
//! rdma_cm is documented to send.

use pcap_file::pcap::PcapReader;
use proto::cm::msg::{msg_kind, sidr_status, transport, CmMad, CmMessage, RejReason};
use proto::cm::rdma_cm::{self, CmaHdr, PortSpace, RoceRoute, RXE_ACK_DELAY};
use proto::wire::{mad, FrameRepr, Opcode};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

const CM_CAPTURES: [&str; 6] = [
    "rping",
    "ucmatose",
    "udaddy",
    "ib_send_bw_rdmacm",
    "host_probe_cm_rej",
    "host_probe_cm_rep",
];

/// The CM MADs of one capture, in order.
fn cm_mads(name: &str) -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/captures")
        .join(format!("{name}.pcap"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    while let Some(pkt) = reader.next_raw_packet() {
        let pkt = pkt.unwrap();
        let Ok(parsed) = FrameRepr::parse_ethernet(&pkt.data, pkt.orig_len as usize) else {
            continue;
        };
        if parsed.repr.transport.bth.opcode == Opcode::UD_SEND_ONLY
            && parsed.payload.len() == mad::MAD_LEN
            && parsed.payload[1] == mad::CLASS_CM
        {
            out.push(parsed.payload.to_vec());
        }
    }
    out
}

#[test]
fn every_captured_cm_mad_round_trips_byte_exactly() {
    let mut total = 0;
    for name in CM_CAPTURES {
        let mads = cm_mads(name);
        assert!(!mads.is_empty(), "{name}: no CM MADs");
        for (i, bytes) in mads.iter().enumerate() {
            let parsed = CmMad::parse(bytes).unwrap_or_else(|e| panic!("{name} #{i}: {e}"));
            let again = parsed.emit().unwrap();
            assert_eq!(
                &again[..],
                &bytes[..],
                "{name} #{i} {}",
                parsed.message.name()
            );
            total += 1;
        }
    }
    // rping 5, ucmatose 5, udaddy 2, ib_send_bw -R 10, cm_rej probe 2, cm_rep probe 6.
    assert_eq!(total, 30);
}

fn req_of(name: &str) -> (CmMad, proto::cm::msg::ReqRepr) {
    let mad = CmMad::parse(&cm_mads(name)[0]).unwrap();
    match &mad.message {
        CmMessage::Req(r) => (mad.clone(), r.clone()),
        other => panic!("{name}: first CM MAD is {other:?}"),
    }
}

#[test]
fn rping_req_fields_are_what_rdma_cm_sends() {
    let (mad, req) = req_of("rping");
    // Linux TID: hi_tid << 32 | the comm ID as the CPU stored it (the wire shows it swapped).
    assert_eq!(mad.header.transaction_id, 0x0000_0002_8ec2_ba74);
    assert_eq!(req.local_comm_id, 0x74ba_c28e);
    assert_eq!(req.service_id, rdma_cm::service_id(PortSpace::Tcp, 7174));
    assert_eq!(req.transport_type, transport::RC);
    assert_eq!(
        req.remote_cm_response_timeout,
        rdma_cm::CMA_CM_RESPONSE_TIMEOUT
    );
    assert_eq!(
        req.local_cm_response_timeout,
        rdma_cm::CMA_CM_RESPONSE_TIMEOUT
    );
    assert_eq!(req.max_cm_retries, rdma_cm::CMA_MAX_CM_RETRIES);
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.pkey, 0xffff);
    assert_eq!(req.path_mtu, 3);
    let hdr = CmaHdr::parse(&req.private_data).unwrap();
    assert_eq!(hdr.src_addr, IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11)));
    assert_eq!(hdr.dst_addr, IpAddr::V4(Ipv4Addr::new(10, 77, 0, 12)));
    // The path, rebuilt from the route rdma_cm resolved (PLT 18 on the lab kernel).
    let route = RoceRoute {
        src_addr: hdr.src_addr,
        dst_addr: hdr.dst_addr,
        src_port: hdr.src_port,
        dst_port: 7174,
        hop_limit: 64,
        traffic_class: 0,
        sl: 0,
        path_mtu: 3,
        packet_life_time: 18,
        rate: 0,
    };
    assert_eq!(req.primary_path, route.cm_path(RXE_ACK_DELAY));
    assert_eq!(req.primary_path.flow_label, 0xfdede);
}

#[test]
fn captured_replies_carry_the_documented_values() {
    let rping = cm_mads("rping");
    let rep = CmMad::parse(&rping[1]).unwrap();
    let req = CmMad::parse(&rping[0]).unwrap();
    assert_eq!(
        rep.header.transaction_id, req.header.transaction_id,
        "REP reuses the REQ TID"
    );
    let CmMessage::Rep(r) = rep.message else {
        panic!()
    };
    assert_eq!(r.remote_comm_id, req.message.local_comm_id());
    assert_eq!(r.target_ack_delay, RXE_ACK_DELAY);
    assert_eq!(
        (r.local_qpn, r.starting_psn, r.rnr_retry_count),
        (0x21, 0x26124f, 7)
    );

    // udaddy: SIDR resolves UDP port 7174 to QPN 0x23 with rdma_cm's UD Q_Key.
    let udaddy = cm_mads("udaddy");
    let CmMessage::SidrReq(sreq) = CmMad::parse(&udaddy[0]).unwrap().message else {
        panic!()
    };
    assert_eq!(sreq.service_id, rdma_cm::service_id(PortSpace::Udp, 7174));
    assert_eq!(sreq.pkey, 0xffff);
    assert!(CmaHdr::parse(&sreq.private_data).is_ok());
    let CmMessage::SidrRep(srep) = CmMad::parse(&udaddy[1]).unwrap().message else {
        panic!()
    };
    assert_eq!(srep.request_id, sreq.request_id);
    assert_eq!(srep.status, sidr_status::SUCCESS);
    assert_eq!((srep.qpn, srep.qkey), (0x23, rdma_cm::RDMA_UDP_QKEY));

    // No listener: REJ "invalid service ID" (8) answering the REQ, local comm ID 0.
    let rej = cm_mads("host_probe_cm_rej");
    let CmMessage::Rej(j) = CmMad::parse(&rej[1]).unwrap().message else {
        panic!()
    };
    assert_eq!(j.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!((j.local_comm_id, j.message_rejected), (0, msg_kind::REQ));
    // A listener destroyed while its REP is outstanding: REJ "consumer defined", "other".
    let probe = cm_mads("host_probe_cm_rep");
    let CmMessage::Rej(j) = CmMad::parse(probe.last().unwrap()).unwrap().message else {
        panic!()
    };
    assert_eq!(j.reason, RejReason::CONSUMER_DEFINED);
    assert_eq!(j.message_rejected, msg_kind::OTHER);
}

mod replay {
    //! The kernel's exchanges replayed through two `CmEndpoint`s configured like the lab
    //! hosts: every MAD our endpoints produce equals the captured one, byte for byte.

    use super::*;
    use proto::cm::conn::{
        AcceptParams, CmEndpoint, CmEvent, ConnectParams, EndpointConfig, SidrParams,
    };
    use proto::cm::rdma_cm::{QpType, RdmaConnParam};

    const A_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11));
    const B_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 12));

    /// Guest 1 (the active side): node GUID …ab01, hi_tid 2, IDs 0x8ec2ba7x.
    fn host_a(random_id_operand: u32) -> CmEndpoint {
        CmEndpoint::new(EndpointConfig::new(
            0x5054_00ff_fe4c_ab01,
            2,
            random_id_operand,
        ))
    }
    /// Guest 2 (the passive side): node GUID …ab02, hi_tid 2, IDs 0x3cdef99x.
    fn host_b(random_id_operand: u32) -> CmEndpoint {
        CmEndpoint::new(EndpointConfig::new(
            0x5054_00ff_fe4c_ab02,
            2,
            random_id_operand,
        ))
    }

    fn sent(ep: &mut CmEndpoint) -> [u8; 256] {
        let t = ep.poll_transmit().expect("a MAD to send");
        assert!(ep.poll_transmit().is_none());
        t.mad
    }

    #[test]
    fn rping_exchange_is_reproduced_byte_for_byte() {
        let cap = cm_mads("rping"); // REQ, REP, RTU, DREQ, DREP
        let mut a = host_a(0x8ec2_ba74);
        let mut b = host_b(0x3cde_f995);
        let route = RoceRoute {
            src_addr: A_ADDR,
            dst_addr: B_ADDR,
            src_port: 0x8228,
            dst_port: 7174,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            path_mtu: 3,
            packet_life_time: 18,
            rate: 0,
        };
        let param = RdmaConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: 0x21,
            ..RdmaConnParam::default()
        };
        let p = ConnectParams::rdma_cm(
            &route,
            PortSpace::Tcp,
            &param,
            QpType::Rc,
            0xc455a2,
            RXE_ACK_DELAY,
        )
        .unwrap();
        let a_id = a.connect(0, p).unwrap();
        assert_eq!(sent(&mut a)[..], cap[0][..], "REQ");

        b.listen(rdma_cm::service_id(PortSpace::Tcp, 7174)).unwrap();
        b.handle_mad(0, A_ADDR, &cap[0]).unwrap();
        let Some(CmEvent::ConnectRequest { id: b_id, .. }) = b.poll_event() else {
            panic!()
        };
        let accept = AcceptParams {
            local_qpn: 0x21,
            starting_psn: 0x26124f,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            ..AcceptParams::default()
        };
        b.accept(0, b_id, accept).unwrap();
        assert_eq!(sent(&mut b)[..], cap[1][..], "REP");

        a.handle_mad(0, B_ADDR, &cap[1]).unwrap();
        assert!(matches!(
            a.poll_event(),
            Some(CmEvent::ConnectResponse { .. })
        ));
        a.send_rtu(0, a_id, &[]).unwrap();
        assert_eq!(sent(&mut a)[..], cap[2][..], "RTU");
        b.handle_mad(0, A_ADDR, &cap[2]).unwrap();
        assert_eq!(b.poll_event(), Some(CmEvent::Established { id: b_id }));

        a.disconnect(0, a_id, &[]).unwrap();
        assert_eq!(sent(&mut a)[..], cap[3][..], "DREQ");
        b.handle_mad(0, A_ADDR, &cap[3]).unwrap();
        assert!(matches!(b.poll_event(), Some(CmEvent::Disconnected { .. })));
        b.disconnect(0, b_id, &[]).unwrap();
        assert_eq!(sent(&mut b)[..], cap[4][..], "DREP");
    }

    #[test]
    fn udaddy_sidr_is_reproduced_byte_for_byte() {
        let cap = cm_mads("udaddy"); // SIDR_REQ, SIDR_REP
        let mut a = host_a(0x8ec2_ba72);
        let mut b = host_b(0x3cde_f990);
        let hdr = CmaHdr {
            src_port: 0xdf81,
            src_addr: A_ADDR,
            dst_addr: B_ADDR,
        };
        let sid = rdma_cm::service_id(PortSpace::Udp, 7174);
        let p = SidrParams {
            peer: B_ADDR,
            service_id: sid,
            pkey: 0xffff,
            private_data: hdr.emit().unwrap().to_vec(),
            timeout_ms: 1 << (rdma_cm::CMA_CM_RESPONSE_TIMEOUT - 8),
            max_cm_retries: rdma_cm::CMA_MAX_CM_RETRIES,
        };
        let a_id = a.sidr_resolve(0, p).unwrap();
        assert_eq!(sent(&mut a)[..], cap[0][..], "SIDR_REQ");
        b.listen(sid).unwrap();
        b.handle_mad(0, A_ADDR, &cap[0]).unwrap();
        let Some(CmEvent::SidrRequest { id: b_id, .. }) = b.poll_event() else {
            panic!()
        };
        b.sidr_reply(
            0,
            b_id,
            sidr_status::SUCCESS,
            0x23,
            rdma_cm::RDMA_UDP_QKEY,
            &[],
        )
        .unwrap();
        assert_eq!(sent(&mut b)[..], cap[1][..], "SIDR_REP");
        a.handle_mad(0, B_ADDR, &cap[1]).unwrap();
        assert!(matches!(a.poll_event(), Some(CmEvent::SidrResponse { id, .. }) if id == a_id));
    }

    #[test]
    fn no_listener_rej_is_reproduced_byte_for_byte() {
        let cap = cm_mads("host_probe_cm_rej"); // REQ from the host probe, REJ from guest 1
        let mut guest = host_a(0x1234_5678);
        guest
            .handle_mad(0, IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)), &cap[0])
            .unwrap();
        assert_eq!(sent(&mut guest)[..], cap[1][..], "REJ");
        assert!(guest.is_empty());
    }
}
