//! Randomness from the kernel's CSPRNG (`getrandom(2)`): the key of every engine's key
//! generator (R_Keys, L_Keys, QPNs), the CM's starting PSNs, comm IDs and transaction IDs.
//! These must not be guessable by an off-path sender (ReDMArk, USENIX Security 2021), so they
//! come from the OS, never from a hasher's seed or the clock.

/// Fills `out` from `getrandom(2)`, retrying on EINTR. Blocks only before the kernel's pool is
/// initialised at boot; any other failure is a broken system, and the daemon must not run
/// with predictable keys.
pub fn fill(out: &mut [u8]) {
    let mut done = 0;
    while done < out.len() {
        let rest = &mut out[done..];
        // SAFETY: `rest` is valid for writes of its length; flags 0 read the urandom pool.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            assert!(
                e.kind() == std::io::ErrorKind::Interrupted,
                "getrandom failed: {e}"
            );
            continue;
        }
        done += n as usize;
    }
}

pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    fill(&mut b);
    b
}

pub fn u32() -> u32 {
    u32::from_ne_bytes(bytes())
}

pub fn u64() -> u64 {
    u64::from_ne_bytes(bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ() {
        let a: Vec<u64> = (0..16).map(|_| super::u64()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b.len(), a.len());
    }
}
