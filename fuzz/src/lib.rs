//! What the fuzz targets share: a reader that turns the fuzzer's bytes into choices (running
//! dry gives zeros, so every input is a valid program), and the engine world the ingress
//! target attacks.

pub mod world;

/// Choices drawn from fuzzer input, front to back.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
    /// Up to `max` bytes, the count drawn first.
    pub fn vec(&mut self, max: usize) -> Vec<u8> {
        let n = usize::from(self.u8()) % (max + 1);
        self.bytes(n).to_vec()
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.bytes(N);
        out[..b.len()].copy_from_slice(b);
        out
    }
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
    /// One of `options`, or the raw value when the choice byte falls past them.
    pub fn pick_or_raw(&mut self, options: &[u32]) -> u32 {
        let i = self.u8() as usize;
        match options.get(i % (options.len() + 1)) {
            Some(v) => *v,
            None => self.u32(),
        }
    }
}
