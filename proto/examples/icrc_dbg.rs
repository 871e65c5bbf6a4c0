use proto::wire::icrc;
use std::hint::black_box;
use std::time::Instant;
fn main() {
    let bytes: Vec<u8> = (0..16_384u32).map(|i| (i * 131 + i / 7) as u8).collect();
    let (ip, udp, bth) = (&bytes[..20], &bytes[20..28], &bytes[28..40]);
    let mut cold = vec![0u8; 1 << 20];
    let slots = cold.len() / 4096;
    for mode in ["pay", "payrot", "out", "outrot", "memcpy", "memcpyrot"] {
        for size in [64usize, 1024] {
            let payload = &bytes[40..40 + size];
            let mut best = f64::MAX;
            let mut i = 0;
            for _ in 0..50 {
                let t = Instant::now();
                for _ in 0..20000 {
                    i += 1;
                    let at = if mode.ends_with("rot") {
                        (i % (slots * 64)) * 64
                    } else {
                        4096 * 3 + 64 + 2048
                    };
                    let dst = &mut cold[at..at + size];
                    match mode {
                        "pay" | "payrot" => {
                            black_box(icrc::v2_copying_payload(
                                ip,
                                udp,
                                bth,
                                black_box(payload),
                                dst,
                            ));
                        }
                        "out" | "outrot" => {
                            black_box(icrc::v2_copying_out(ip, udp, bth, black_box(payload), dst));
                        }
                        _ => {
                            dst.copy_from_slice(black_box(payload));
                            black_box(dst);
                        }
                    };
                }
                best = best.min(t.elapsed().as_nanos() as f64 / 20000.0);
            }
            println!("{mode} {size}: {best:.1} ns");
        }
    }
}
