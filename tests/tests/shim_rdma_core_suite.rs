//! rdma-core's own Python test-suite (shipped by Debian's rdma-core package, run through
//! python3-pyverbs) against srxe0 under LD_PRELOAD: the device and PD modules must pass (only
//! the device-memory tests may skip: softroce has no on-device memory, like kernel rxe), and
//! the MR, CQ, QP, extended CQ/QP, completion-event, atomic, AH and fork modules, which move
//! data, must pass but for the features kernel rxe does not offer either.

mod shim_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use shim_support::{check_output, require_program, Daemon};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// An unpacked private copy of the suite under `name` (tests run in parallel).
fn unpack_suite(name: &str) -> (PathBuf, PathBuf) {
    let python = require_program("python3"); // /usr/bin/python3: the one pyverbs is built for
    assert!(
        Path::new(SUITE).join("run_tests.py").is_file(),
        "rdma-core's test-suite is missing ({SUITE}): run scripts/test (installs rdma-core, python3-pyverbs)"
    );
    let pyverbs = Command::new(&python)
        .args(["-c", "import pyverbs.device"])
        .output()
        .expect("python3");
    assert!(
        pyverbs.status.success(),
        "pyverbs is not importable by {}: run scripts/test (installs python3-pyverbs)",
        python.display()
    );

    // The suite ships partly gzipped; unpack a private copy.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(SUITE)
        .arg(&dir)
        .output()
        .expect("cp");
    check_output("copy rdma-core tests", cp);
    let gz = Command::new("gzip")
        .arg("-dr")
        .arg(dir.join("tests"))
        .output()
        .expect("gzip");
    check_output("gunzip rdma-core tests", gz);
    (python, dir)
}

/// The number of tests unittest ran, from its summary.
fn tests_ran(report: &str) -> usize {
    report
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no unittest summary:\n{report}"))
}

/// Runs the suite in `dir` through `cmd` (the daemon's command for python, with the runner
/// and its arguments); it must exit 0 and run at least `at_least` tests. Returns unittest's
/// report (on stderr, with pyverbs' harmless interpreter-shutdown noise).
fn run_suite(daemon: &Daemon, cmd: &mut Command, dir: &Path, at_least: usize) -> String {
    let out = cmd.current_dir(dir).output().expect("run rdma-core tests");
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "rdma-core tests failed:\n{report}\n--- daemon\n{}",
        daemon.log()
    );
    let ran = tests_ran(&report);
    assert!(ran >= at_least, "only {ran} rdma-core tests ran:\n{report}");
    report
}

#[test]
fn rdma_core_device_and_pd_tests_pass() {
    let (python, dir) = unpack_suite("rdma-core-suite");
    let daemon = Daemon::start("rdma-core-suite", &[]);
    let mut cmd = daemon.command(&python);
    cmd.args(["tests/run_tests.py", "-v", "--dev", "srxe0"])
        .args(["test_device", "test_pd"]);
    let report = run_suite(&daemon, &mut cmd, &dir, 20);
    for line in report.lines().filter(|l| l.contains(" ... ")) {
        let passed = line.ends_with(" ... ok");
        let dm_skip = line.contains("skipped 'Device memory is not supported'");
        assert!(passed || dm_skip, "unexpected result: {line}\n{report}");
    }
}

/// Why a data-path test of the suite may skip: features kernel rxe does not offer either,
/// or the host lacks (huge pages, a GPU for dmabuf).
const ALLOWED_SKIPS: &[&str] = &[
    "ODP is not supported",
    "Allocating dmabuf is not supported",
    "Create XRCD is not supported",
    "Parent Domain is not supported",
    "Device memory is not supported",
    "There are no huge pages",
    "Raw Packet QP",
    "Importing a device is not supported",
];

#[test]
fn rdma_core_data_path_tests_pass() {
    let (python, dir) = unpack_suite("rdma-core-suite-datapath");
    // Traffic between QPs of one process: the device needs the real RoCE port.
    let daemon = Daemon::start(
        "rdma-core-suite-datapath",
        &["--addr", "127.0.0.42", "--port", "4791"],
    );
    let mut cmd = daemon.command(&python);
    cmd.args(["tests/run_tests.py", "-v", "--dev", "srxe0", "--gid", "0"])
        .args([
            "test_mr",
            "test_cq",
            "test_qp",
            "test_cq_events",
            "test_cqex",
            "test_qpex",
            "test_atomic",
            "test_addr",
            "test_odp",
            "test_shared_pd",
            "test_parent_domain",
            "test_fork",
            "test_relaxed_ordering",
        ]);
    let report = run_suite(&daemon, &mut cmd, &dir, 100);
    let mut passed = 0;
    for line in report.lines().filter(|l| l.contains(" ... ")) {
        if line.ends_with(" ... ok") {
            passed += 1;
            continue;
        }
        assert!(
            line.contains("skipped") && ALLOWED_SKIPS.iter().any(|why| line.contains(why)),
            "unexpected result: {line}\n{report}"
        );
    }
    // IBTA 1.5's RDMA ATOMIC WRITE through `ibv_wr_atomic_write`, bytes compared by the suite.
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("test_qp_ex_rc_atomic_write ") && l.ends_with(" ... ok")),
        "ibv_wr_atomic_write did not pass:\n{report}"
    );
    assert!(
        passed >= 60,
        "only {passed} rdma-core data-path tests passed:\n{report}"
    );
}

/// The suite's rdma_cm module (connected and UD traffic, RDMA READ and WRITE, a rejected
/// connection, an external QP, multicast joins and leaves), through `tests/data/
/// rdma_core_rdmacm.py`: the suite's own runner but for the device's address, which it would
/// read from a `device/net` link that a virtual device (kernel rxe, softroce) does not have,
/// and so skip every test. Every test must pass; they build their PDs, MRs and AHs on the PD
/// librdmacm gives each id with its device (`PD(cmid)`), and their UD peers' AHs from the
/// `ESTABLISHED` event's `ah_attr`.
#[test]
fn rdma_core_rdmacm_tests_pass() {
    let (python, dir) = unpack_suite("rdma-core-suite-rdmacm");
    let runner = shim_support::workspace_root().join("tests/data/rdma_core_rdmacm.py");
    let daemon = Daemon::start(
        "rdma-core-suite-rdmacm",
        &["--addr", "127.0.0.172", "--port", "4791"],
    );
    let mut cmd = daemon.command(&python);
    cmd.arg(&runner)
        .args(["-v", "--dev", "srxe0", "--gid", "0", "test_rdmacm"])
        .env("SOFTROCE_SUITE_ADDR", "127.0.0.172");
    let report = run_suite(&daemon, &mut cmd, &dir, 10);
    for line in report.lines().filter(|l| l.contains(" ... ")) {
        assert!(
            line.ends_with(" ... ok"),
            "unexpected result: {line}\n{report}"
        );
    }
}
