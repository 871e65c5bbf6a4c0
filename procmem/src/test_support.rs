//! What the tests share.

use crate::ProcessMemory;

/// The memory of this process, the client of every test that needs no other.
pub(crate) fn me() -> ProcessMemory {
    ProcessMemory::new(std::process::id() as i32)
}
