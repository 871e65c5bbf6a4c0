use std::time::Instant;
fn main() {
    const MSG: usize = 1 << 20;
    let total: usize = 1 << 30;
    for mtu in [4096usize, 1024] {
        let src = vec![0x5au8; MSG];
        let mut dst = vec![0u8; MSG];
        let mut pkt = vec![0u8; 8192];
        let reps = total / MSG;
        // memcpy src->dst
        let t = Instant::now();
        for _ in 0..reps {
            for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
                d.copy_from_slice(s);
            }
            std::hint::black_box(&mut dst);
        }
        let memcpy = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        // crc over hot chunk
        let t = Instant::now();
        let mut acc = 0u32;
        for _ in 0..reps {
            for _ in 0..MSG / mtu {
                acc ^= crc32fast::hash(std::hint::black_box(&pkt[..mtu]));
            }
        }
        let crc = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        // src -> pkt (L3 -> L1)
        let t = Instant::now();
        for _ in 0..reps {
            for s in src.chunks(mtu) {
                pkt[..mtu].copy_from_slice(s);
                std::hint::black_box(&mut pkt);
            }
        }
        let rd = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        // pkt -> dst
        let t = Instant::now();
        for _ in 0..reps {
            for d in dst.chunks_mut(mtu) {
                d.copy_from_slice(&pkt[..mtu]);
                std::hint::black_box(&mut pkt);
            }
            std::hint::black_box(&mut dst);
        }
        let wr = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        // baseline
        let t = Instant::now();
        for _ in 0..reps {
            for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
                d.copy_from_slice(s);
                acc ^= crc32fast::hash(d);
            }
            std::hint::black_box(&mut dst);
        }
        let base = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        // engine-like data path: rd + crc + crc + wr
        let t = Instant::now();
        for _ in 0..reps {
            for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
                pkt[..mtu].copy_from_slice(s);
                acc ^= crc32fast::hash(&pkt[..mtu]);
                acc ^= crc32fast::hash(std::hint::black_box(&pkt[..mtu]));
                d.copy_from_slice(&pkt[..mtu]);
            }
            std::hint::black_box(&mut dst);
        }
        let eng = total as f64 / t.elapsed().as_secs_f64() / 1e9;
        std::hint::black_box(acc);
        println!("mtu {mtu}: memcpy {memcpy:.1} crc {crc:.1} rd {rd:.1} wr {wr:.1} base {base:.1} enginedata {eng:.1} GB/s ratio {:.2}", eng/base);
    }
}
