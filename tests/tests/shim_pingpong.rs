//! rdma-core's unmodified `ibv_*_pingpong` examples under LD_PRELOAD, against a private
//! `softroce daemon`: they find and open srxe0, allocate a PD, and then stop at the first verb that is not implemented yet
//! (`ibv_reg_mr`) with their own error message and exit status 1, never a crash. Without the
//! shim they would stop earlier ("No IB devices found" / "IB device srxe0 not found").
//! When memory registration lands, the expected message moves to the next missing verb.

mod shim_support;

use std::os::unix::process::ExitStatusExt;

use shim_support::{require_program, Daemon};

#[test]
fn pingpong_examples_fail_cleanly_at_the_first_missing_verb() {
    let daemon = Daemon::start("pingpong", &[]);
    for name in [
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
    ] {
        // -d/-g select srxe0 and its IPv4 GID; the program fails before any socket is opened.
        let out = daemon
            .command(&require_program(name))
            .args(["-d", "srxe0", "-g", "1"])
            .output()
            .unwrap_or_else(|e| panic!("run {name}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.signal(),
            None,
            "{name} was killed by a signal:\n{text}"
        );
        assert_eq!(out.status.code(), Some(1), "{name}:\n{text}");
        assert!(
            text.contains("Couldn't register MR"),
            "{name} stopped elsewhere:\n{text}"
        );
    }
}
