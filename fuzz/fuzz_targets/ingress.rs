//! The ingress parser on arbitrary bytes: Ethernet frames, raw IP packets, bare transport
//! packets and MADs. Under `cfg(fuzzing)` the ICRC check is skipped so that the fuzzer reaches
//! everything behind it. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::wire::{mad, FrameRepr, RocePacket, TransportRepr};

fuzz_target!(|data: &[u8]| {
    let claimed = data.len() + (data.first().copied().unwrap_or(0) as usize % 3);
    if let Ok(p) = FrameRepr::parse_ethernet(data, claimed) {
        // Whatever parses must re-emit without panicking.
        let mut out = vec![0u8; p.repr.buffer_len()];
        if p.payload.len() == p.repr.transport.payload_len {
            let _ = p.repr.emit(&mut out, p.payload);
        }
    }
    let _ = FrameRepr::parse_ip(data, data.len());
    if let Ok(p) = RocePacket::new_checked(data) {
        let _ = TransportRepr::parse(&p);
    }
    let _ = mad::cm_summary(data);
});
