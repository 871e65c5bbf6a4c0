//! The control-socket messages: whatever a client sends decodes to a request or to an error,
//! never a panic or an allocation the length fields dictate; what decodes re-encodes to a
//! message that decodes to the same value. The same for the daemon's answers and CM events
//! (which the shim decodes).
//!
//! Then the input as a session of requests (each a length byte and a message), executed as
//! far as they can be without a client process: against an engine, through the daemon's own
//! translation of client values (`ctl::QpAttr::engine_attr`, `AhAttr::address_vector`), so
//! that every handle, capacity, attribute mask, state, MTU, access flag and key a client can
//! name is validated or refused, never trusted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::ctl::{self, decode, encode, CmEventMsg, Request, Response};
use proto::transport::*;
use proto::Qpn;

fn round_trip<T>(data: &[u8])
where
    T: serde::Serialize + for<'a> serde::Deserialize<'a> + PartialEq + std::fmt::Debug,
{
    if let Ok(msg) = decode::<T>(data) {
        if let Ok(bytes) = encode(&msg) {
            let again: T = decode(&bytes).expect("an encoded message decodes");
            assert_eq!(again, msg);
        }
    }
}

/// One request, as the device thread would carry it out on the client's engine.
fn execute(e: &mut Engine<VecMemory>, r: Request) {
    match r {
        Request::AllocPd { .. } => {
            e.alloc_pd();
        }
        Request::DeallocPd { pd } => {
            let _ = e.dealloc_pd(pd);
        }
        Request::RegMr {
            pd,
            addr,
            length,
            access,
            ..
        } => {
            let _ = e.reg_mr(pd, addr, length, Access(access));
        }
        Request::DeregMr { mr } => {
            let _ = e.dereg_mr(mr);
        }
        Request::CreateCq { cqe, .. } => {
            let _ = e.create_cq(cqe as usize);
        }
        Request::DestroyCq { cq } => {
            let _ = e.destroy_cq(cq);
        }
        Request::CreateQp {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            cap,
            sq_sig_all,
        } => {
            let qp_type = match qp_type {
                ctl::qp_type::RC => QpType::Rc,
                ctl::qp_type::UC => QpType::Uc,
                ctl::qp_type::UD => QpType::Ud,
                _ => return,
            };
            let cap = QpCap {
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
            };
            let _ = e.create_qp(QpInit {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                srq,
                cap,
                sq_sig_all,
            });
        }
        Request::ModifyQp { qpn, attr, mask } => {
            let m = AttrMask(mask);
            if let Ok(a) = attr.engine_attr(m) {
                let _ = e.modify_qp(Qpn::new(qpn), &a, m);
            }
        }
        Request::QueryQp { qpn, .. } => {
            let _ = e.query_qp(Qpn::new(qpn));
        }
        Request::DestroyQp { qpn } => {
            let _ = e.destroy_qp(Qpn::new(qpn));
        }
        Request::CreateSrq {
            pd,
            max_wr,
            max_sge,
            ..
        } => {
            let _ = e.create_srq(pd, max_wr, max_sge);
        }
        Request::ModifySrq { srq, srq_limit, .. } => {
            let _ = e.arm_srq_limit(srq, srq_limit);
        }
        Request::DestroySrq { srq } => {
            let _ = e.destroy_srq(srq);
        }
        Request::CreateAh { pd, attr } => {
            let _ = e.create_ah(pd, attr.address_vector());
        }
        Request::DestroyAh { ah } => {
            let _ = e.destroy_ah(ah);
        }
        Request::AllocMw { pd, mw_type } => {
            let t = if mw_type == 2 {
                MwType::Type2
            } else {
                MwType::Type1
            };
            let _ = e.alloc_mw(pd, t);
        }
        Request::DeallocMw { mw } => {
            let _ = e.dealloc_mw(mw);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<Request>(data);
    round_trip::<Response>(data);
    round_trip::<CmEventMsg>(data);

    let mut e = Engine::new(
        EngineConfig::new("10.0.0.1".parse().unwrap(), 3),
        VecMemory::new(),
    );
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let (msg, next) = tail.split_at(usize::from(n).min(tail.len()));
        rest = next;
        if let Ok(r) = decode::<Request>(msg) {
            execute(&mut e, r);
        }
        // Whatever the session did, the engine still answers.
        let _ = e.poll_event();
    }
});
