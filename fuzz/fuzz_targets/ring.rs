//! The rings a client shares with the daemon, with the client hostile: it writes anything
//! anywhere in the ring memory (header, indexes, flags, slots) between the daemon's pops of
//! send and receive WQEs and its pushes of completions. The daemon's side never reads or
//! writes outside the ring (AddressSanitizer watches), never panics, decodes every slot or
//! refuses it, and what it decodes becomes a work request the engine accepts or refuses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::ring::wqe::{self, Cqe, RecvWqe, SendWqe};
use proto::ring::{RingGeometry, SharedRing};
use proto::transport::{Engine, EngineConfig, QpCap, QpInit, QpType, VecMemory};
use softroce_fuzz::Input;

/// 64-byte aligned memory standing in for the memfd mapping.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line(#[allow(dead_code)] [u8; 64]);

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let g = RingGeometry::new(
        u32::from(inp.u8() % 16) + 1,
        64 + 16 * u32::from(inp.u8() % 34),
    )
    .unwrap();
    let len = g.byte_len();
    let mut sq_mem = vec![Line([0; 64]); len.div_ceil(64)];
    let mut cq_mem = vec![Line([0; 64]); len.div_ceil(64)];
    let sq_base = sq_mem.as_mut_ptr() as *mut u8;
    let cq_base = cq_mem.as_mut_ptr() as *mut u8;
    // SAFETY: both buffers are 64-byte aligned, `len` long, and outlive the handles.
    let mut sq = unsafe { SharedRing::init(sq_base, g) };
    let mut cq = unsafe { SharedRing::init(cq_base, g) };
    // The shim's ends, attached to what the daemon wrote.
    let mut shim_sq = unsafe { SharedRing::attach(sq_base, len, true) }.unwrap();
    let mut shim_cq = unsafe { SharedRing::attach(cq_base, len, false) }.unwrap();

    let mut engine = Engine::new(
        EngineConfig::new("10.0.0.1".parse().unwrap(), 1),
        VecMemory::new(),
    );
    let pd = engine.alloc_pd();
    let cqh = engine.create_cq(64).unwrap();
    let qp = engine
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cqh,
            recv_cq: cqh,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();

    let mut slot = vec![0u8; g.slot_size as usize];
    let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
    for _ in 0..128 {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 7 {
            0 | 1 => {
                // The hostile client scribbles on either ring.
                let base = if inp.bool() { sq_base } else { cq_base };
                let at = usize::from(inp.u16()) % len;
                let bytes = inp.vec(255);
                let n = bytes.len().min(len - at);
                // SAFETY: `at + n <= len`, inside the buffer.
                unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(at), n) };
            }
            2 => {
                // The client posts a slot of its choosing (possibly after corrupting indexes).
                let n = usize::from(inp.u8()).min(slot.len());
                let entry = inp.bytes(n).to_vec();
                let _ = shim_sq.push(&entry);
            }
            3 => {
                // The daemon takes a send WQE and hands it to the engine.
                let max_sge = usize::from(inp.u8() % 33);
                let max_inline = usize::from(inp.u16() % 1024);
                if let Ok(true) = sq.pop(&mut slot) {
                    if let Ok(w) = SendWqe::decode(&slot, max_sge, max_inline, &mut sges) {
                        // What decodes re-encodes into a slot of the same size.
                        let mut again = vec![0u8; slot.len()];
                        let _ = w.encode(&mut again);
                        if let Ok(wr) = w.work_request() {
                            let _ = engine.post_send(qp, wr);
                        }
                    }
                }
            }
            4 => {
                // The same slot read as a receive WQE.
                let max_sge = usize::from(inp.u8() % 33);
                if let Ok(true) = sq.pop(&mut slot) {
                    if let Ok(w) = RecvWqe::decode(&slot, max_sge, &mut sges) {
                        let _ = engine.post_recv(qp, w.work_request());
                    }
                }
            }
            5 => {
                // The daemon completes work: pushes, arms, sleeps.
                let mut c = [0u8; wqe::CQE_SLOT_LEN];
                Cqe {
                    wr_id: inp.u64(),
                    status: inp.u32(),
                    ..Cqe::default()
                }
                .encode(&mut c);
                let _ = cq.push(&c);
                let _ = cq.take_arm(inp.bool());
                let _ = sq.consumer_prepare_sleep();
                sq.consumer_awake();
                let _ = (sq.available(), cq.free());
            }
            _ => {
                // The shim polls (it trusts the daemon's header, but the indexes may lie).
                let mut out = vec![0u8; g.slot_size as usize];
                if let Ok(true) = shim_cq.pop(&mut out) {
                    let _ = Cqe::decode(&out);
                }
                shim_cq.arm(inp.bool());
            }
        }
    }
    drop((sq_mem, cq_mem));
});
