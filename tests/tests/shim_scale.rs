//! The scale goal of issue 5 in a small, fast form: `bench/scale.c` (the program `scripts/bench`
//! runs with 10,000 QPs and 100,000 MRs), compiled here against the system
//! `<infiniband/verbs.h>` and run unmodified under LD_PRELOAD, creates 2,000 RC QPs and 20,000
//! MRs in one daemon. The program itself proves that every QP and every MR works (an RDMA
//! WRITE through each, every completion successful, the last 8,192 writes' bytes compared);
//! this test checks that it did, that `softroce res show` counts exactly what it holds, and
//! that everything is freed when it exits. With `--churn` it also deregisters and registers
//! again 5,000 times (the table reuses what a deregistration frees, issue 17), and proves that
//! a deregistered MR's R_Key is refused by the responder afterwards; after the idle phase one
//! WRITE on one QP among the idle ones must complete (its doorbell wakes the device).

mod shim_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shim_support::programs::loopback_daemon;
use shim_support::{check_output, compile_c, softroce_bin, Daemon};

const QPS: usize = 2_000;
const MRS: usize = 20_000;
const CHURN: usize = 5_000;

/// The client's row of `softroce res show` for `program`: its pd, mr, cq, qp, srq, ah, mw
/// counts, or None when no client of that name is listed.
fn res_row(daemon: &Daemon, program: &str) -> Option<Vec<usize>> {
    let out = Command::new(softroce_bin())
        .args(["res", "show", "--socket"])
        .arg(&daemon.socket)
        .output()
        .expect("run softroce res show");
    let text = check_output("softroce res show", out);
    text.lines().find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // client pid uid program pd mr cq qp srq ah mw
        if cols.len() == 11 && cols[3] == program {
            cols[4..].iter().map(|c| c.parse().ok()).collect()
        } else {
            None
        }
    })
}

#[test]
fn two_thousand_qps_and_twenty_thousand_mrs_all_work_and_are_counted_and_freed() {
    let exe = compile_c("scale", include_str!("../../bench/scale.c"), &["ibverbs"]);
    let daemon = loopback_daemon("scale", 140);
    let mut child = daemon
        .command(&exe)
        .args([
            QPS.to_string(),
            MRS.to_string(),
            "--mrs-first".into(),
            "--churn".into(),
            CHURN.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the scale program");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let mut line = String::new();
        let n = lines
            .read_line(&mut line)
            .expect("read the program's output");
        if n == 0 {
            let status = child.wait().expect("wait");
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
            panic!(
                "the scale program ended ({status}) before it was ready:\n{}\n{err}\n--- daemon\n{}",
                seen.join(""),
                daemon.log()
            );
        }
        seen.push(line.clone());
        if line.starts_with("scale=ready") {
            break;
        }
        assert!(Instant::now() < deadline, "not ready in time: {seen:?}");
    }
    let text = seen.join("");
    assert!(text.contains(&format!("scale=qps count={QPS} ")), "{text}");
    assert!(text.contains(&format!("scale=mrs count={MRS} ")), "{text}");
    // The source MR, the MRS, the CHURN re-registrations and the stale-key test's one.
    assert!(
        text.contains(&format!(
            "scale=churn count={CHURN} registrations={} ",
            MRS + 2 + CHURN
        )) && text.contains("stale_key=refused"),
        "{text}"
    );
    // One write per MR (there are more MRs than QP pairs), 8,192 of them compared byte for byte.
    assert!(
        text.contains(&format!("scale=verify writes={MRS} bytes_checked=65536 ")),
        "{text}"
    );

    // res show: pd, mr (the 20,000 and the writes' source buffer), cq, qp, srq, ah, mw.
    let row = res_row(&daemon, "scale").expect("the scale client is listed by res show");
    assert_eq!(row, vec![1, MRS + 1, 1, QPS, 0, 0, 0], "res show row");

    drop(child.stdin.take());
    let status = child.wait().expect("wait for the scale program");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut lines, &mut rest);
    assert!(status.success(), "scale program failed ({status}): {rest}");
    assert!(rest.contains("scale=single qp="), "{rest}");
    assert!(rest.contains("scale=destroyed"), "{rest}");

    // The client is gone and forgotten once it exits.
    let deadline = Instant::now() + Duration::from_secs(10);
    while res_row(&daemon, "scale").is_some() {
        assert!(
            Instant::now() < deadline,
            "the client is still listed after it exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
