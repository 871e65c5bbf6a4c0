//! Access to registered memory. The engine never dereferences an address itself: the daemon
//! backs this trait with `process_vm_readv`/`process_vm_writev` on the client process, tests
//! and the simulator with [`VecMemory`].
//!
//! Addresses are the virtual addresses the application registered (`ibv_reg_mr`'s `addr`),
//! in the address space `space` of the PD the MR belongs to ([`super::Engine::alloc_pd_in`]):
//! a daemon serving several processes keys its `process_vm_*` calls by it (a pid, say).
//! The engine has already checked keys, access flags and bounds before it calls the trait, so
//! an implementation only reports what the host itself refuses (an unmapped page).

use std::cell::Cell;

/// The host could not reach the memory (unmapped, process gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory at {addr:#x}+{len} is not accessible")]
pub struct MemoryError {
    pub addr: u64,
    pub len: usize,
}

/// Reads, writes and atomics on registered memory, by virtual address.
pub trait MemoryAccess {
    /// Copies `out.len()` bytes starting at `addr` into `out`.
    fn read(&self, space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError>;
    /// Copies `data` to `addr`.
    fn write(&mut self, space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError>;

    /// Copies `data` to `addr` in a buffer whose contents the consumer may look at only once
    /// the work request that owns it completes: a receive buffer, or the local buffer of a
    /// READ or an atomic (IBTA §10.8.3.1: the consumer owns it again only then). A memory
    /// that is not in this process may then carry the bytes along with the completion instead
    /// of writing them at once; the default writes them at once.
    fn write_for_completion(
        &mut self,
        space: u64,
        addr: u64,
        data: &[u8],
    ) -> Result<(), MemoryError> {
        self.write(space, addr, data)
    }

    /// 64-bit compare-and-swap in host byte order (IBTA §9.4.5: the responder operates on the
    /// 8-byte aligned word); returns the original value. The default reads then writes, which is
    /// atomic because the engine runs one operation at a time; a daemon sharing memory with a
    /// running process overrides it with a real atomic.
    fn compare_swap(
        &mut self,
        space: u64,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let orig = self.read_u64(space, addr)?;
        if orig == compare {
            self.write(space, addr, &swap.to_ne_bytes())?;
        }
        Ok(orig)
    }

    /// 64-bit fetch-and-add (wrapping); returns the original value.
    fn fetch_add(&mut self, space: u64, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let orig = self.read_u64(space, addr)?;
        self.write(space, addr, &orig.wrapping_add(add).to_ne_bytes())?;
        Ok(orig)
    }

    /// The `len` bytes at `addr` as a slice, when this memory can lend them directly (they
    /// are in this process); `None`, the default, means "use [`MemoryAccess::read`]". The
    /// transmit path copies a lent payload into the packet by the same pass that computes
    /// the ICRC, instead of a copy and then a hash.
    ///
    /// The engine copies a lent slice before its next call into this memory (other than
    /// [`MemoryAccess::leave_in_place`]): a memory may lend from a buffer of its own that a
    /// later read refills (the daemon lends from its read-ahead window of another process's
    /// memory).
    fn lend(&self, _space: u64, _addr: u64, _len: usize) -> Option<&[u8]> {
        None
    }

    /// Whether the payload this memory just lent (`len` bytes at `addr`) may stay out of a
    /// packet that is not sealed: the packet's consumer is in this process, in the same
    /// thread, and takes the bytes from where they were lent instead of from the packet (the
    /// same-host fast path: one copy, by the kernel, from the sender's buffer into the
    /// receiver's). A memory that says yes takes note of where the bytes are, for that
    /// consumer, and must make sure the packet goes nowhere else. No, by default.
    fn leave_in_place(&self, _addr: u64, _len: usize) -> bool {
        false
    }

    /// The `len` bytes at `addr` as a mutable slice, when this memory is in this process;
    /// `None`, the default, means "use [`MemoryAccess::write`]". The receive path copies an
    /// RDMA WRITE's payload out of the packet by the same pass that verifies the ICRC.
    fn lend_mut(&mut self, _space: u64, _addr: u64, _len: usize) -> Option<&mut [u8]> {
        None
    }

    /// Reads one 64-bit word in host byte order.
    fn read_u64(&self, space: u64, addr: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(space, addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

/// Memory made of separate `Vec<u8>` allocations at made-up, non-overlapping addresses: the
/// memory of a test or of a simulated host. One address space: `space` is ignored.
#[derive(Debug, Clone)]
pub struct VecMemory {
    /// The allocations, in increasing order of base (allocations only grow).
    regions: Vec<Region>,
    next_base: u64,
    /// The region the last access fell in: consecutive packets of a message hit the same one.
    last_hit: Cell<usize>,
}

impl Default for VecMemory {
    fn default() -> Self {
        VecMemory::new()
    }
}

impl VecMemory {
    pub fn new() -> VecMemory {
        VecMemory {
            regions: Vec::new(),
            // Far from zero so that a zero address is never valid, page aligned.
            next_base: 0x1000_0000,
            last_hit: Cell::new(0),
        }
    }

    /// Allocates `len` zeroed bytes and returns their address (page aligned, so atomics work).
    /// The bytes are page aligned in this process too (see [`Region`]).
    pub fn alloc(&mut self, len: usize) -> u64 {
        let base = self.next_base;
        self.regions.push(Region::zeroed(base, len));
        // Leave a gap so that an access running past the end is refused, not silently served
        // by the next allocation.
        self.next_base = base + ((len as u64 + 0x1fff) & !0xfff);
        base
    }

    /// Index of the region holding `addr` (the last one hit, or by binary search), and the
    /// offset of `addr` in it.
    fn locate(&self, addr: u64) -> Option<(usize, usize)> {
        let hit = self.last_hit.get();
        let i = match self.regions.get(hit) {
            Some(r) if addr >= r.base && addr - r.base < r.len as u64 => hit,
            _ => {
                let i = self.regions.partition_point(|r| r.base <= addr);
                let i = i.checked_sub(1)?;
                self.last_hit.set(i);
                i
            }
        };
        let start = usize::try_from(addr - self.regions[i].base).ok()?;
        Some((i, start))
    }

    /// The bytes of the allocation that contains `[addr, addr+len)`.
    pub fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (i, start) = self.locate(addr)?;
        self.regions[i].bytes().get(start..start.checked_add(len)?)
    }

    fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (i, start) = self.locate(addr)?;
        self.regions[i]
            .bytes_mut()
            .get_mut(start..start.checked_add(len)?)
    }

    /// Test helper: fills memory, panicking on a bad address (test code only).
    pub fn fill(&mut self, addr: u64, data: &[u8]) {
        self.write(0, addr, data)
            .expect("VecMemory::fill outside an allocation");
    }
}

/// One [`VecMemory`] allocation. Its bytes start on a page boundary of this process, as its
/// address does, so that an address has the same offset in its cache line and page in both,
/// as an application's registered buffer has for the daemon. A plain `Vec` would start at
/// whatever 16-byte offset the heap's history gives it: the speed of the engine's copies and
/// ICRCs (64-byte loads and stores) depends on that offset, and benchmarks would move with
/// anything else the program allocates.
#[derive(Debug)]
struct Region {
    base: u64,
    /// Up to a page more than `len`, so that the bytes can start on a page boundary.
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Region {
    const PAGE: usize = 4096;

    fn zeroed(base: u64, len: usize) -> Region {
        let storage = vec![0u8; len + Self::PAGE - 1];
        let start = storage.as_ptr().addr().wrapping_neg() % Self::PAGE;
        Region {
            base,
            storage,
            start,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl Clone for Region {
    /// A copy is page aligned too.
    fn clone(&self) -> Region {
        let mut copy = Region::zeroed(self.base, self.len);
        copy.bytes_mut().copy_from_slice(self.bytes());
        copy
    }
}

impl MemoryAccess for VecMemory {
    fn read(&self, _space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let src = self.slice(addr, out.len()).ok_or(MemoryError {
            addr,
            len: out.len(),
        })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn lend(&self, _space: u64, addr: u64, len: usize) -> Option<&[u8]> {
        self.slice(addr, len)
    }

    fn lend_mut(&mut self, _space: u64, addr: u64, len: usize) -> Option<&mut [u8]> {
        self.slice_mut(addr, len)
    }

    fn write(&mut self, _space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let dst = self.slice_mut(addr, data.len()).ok_or(MemoryError {
            addr,
            len: data.len(),
        })?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_memory_bytes_have_their_address_offset_in_a_page() {
        let mut m = VecMemory::new();
        let addrs: Vec<u64> = [1usize << 20, 100, 4096, 1].map(|len| m.alloc(len)).into();
        m.fill(addrs[0] + 4095, &[7]);
        for mem in [&m, &m.clone()] {
            for &a in &addrs {
                for at in [a, a + 1, a + 64] {
                    let Some(bytes) = mem.slice(at, 1) else {
                        continue;
                    };
                    assert_eq!(bytes.as_ptr().addr() % 4096, (at % 4096) as usize);
                }
            }
            assert_eq!(mem.slice(addrs[0] + 4095, 1), Some(&[7u8][..]));
        }
    }

    #[test]
    fn vec_memory_bounds_and_atomics() {
        let mut m = VecMemory::new();
        let a = m.alloc(16);
        let b = m.alloc(8);
        assert!(b > a + 16, "allocations keep a gap");
        m.write(0, a + 8, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(m.fetch_add(0, a + 8, 3).unwrap(), 5);
        assert_eq!(m.compare_swap(0, a + 8, 8, 42).unwrap(), 8);
        assert_eq!(m.read_u64(0, a + 8).unwrap(), 42);
        assert_eq!(m.compare_swap(0, a + 8, 1, 7).unwrap(), 42);
        assert_eq!(m.read_u64(0, a + 8).unwrap(), 42);
        let mut out = [0u8; 4];
        assert!(m.read(0, a + 14, &mut out).is_err());
        assert!(m.read(0, 0, &mut out).is_err());
        assert_eq!(m.lend(0, a + 8, 8), Some(&42u64.to_ne_bytes()[..]));
        assert_eq!(m.lend(0, a + 14, 4), None);
        m.lend_mut(0, a, 2).unwrap().copy_from_slice(&[9, 9]);
        assert_eq!(m.lend(0, a, 3), Some(&[9, 9, 0][..]));
        assert!(m.lend_mut(0, a + 15, 2).is_none());
    }
}
