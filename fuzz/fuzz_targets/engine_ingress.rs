//! Packet ingress, parser and engine together: two engines with connected RC, UC and UD QPs
//! receive packets built field by field from the input (any opcode, QPN, PSN, R_Key, bounds,
//! length, pad), raw bytes, and their own traffic damaged, lost and duplicated in flight,
//! between timers and posted work. Nothing may panic, and memory that no key grants remote
//! write access to (another PD's MR, a read-only MR, unregistered memory) never changes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softroce_fuzz::{world::World, Input};

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let mut w = World::new();
    for _ in 0..64 {
        if inp.is_empty() {
            break;
        }
        w.step(&mut inp);
    }
    w.check();
});
