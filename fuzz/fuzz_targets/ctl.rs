//! The control-socket messages: whatever a client sends decodes to a request or to an error,
//! never a panic or an allocation the length fields dictate; what decodes re-encodes to a
//! message that decodes to the same value. The same for the daemon's answers and CM events
//! (which the shim decodes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::ctl::{decode, encode, CmEventMsg, Request, Response};

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

fuzz_target!(|data: &[u8]| {
    round_trip::<Request>(data);
    round_trip::<Response>(data);
    round_trip::<CmEventMsg>(data);
});
