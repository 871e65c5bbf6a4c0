//! rdma-core's own Python test-suite (shipped by Debian's rdma-core package, run through
//! python3-pyverbs) against srxe0 under LD_PRELOAD: the device and PD modules must pass; only
//! the device-memory tests may skip (softroce has no on-device memory, like kernel rxe).

mod shim_support;

use std::path::Path;
use std::process::Command;

use shim_support::{check_output, require_program, Daemon};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

#[test]
fn rdma_core_device_and_pd_tests_pass() {
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
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdma-core-suite");
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

    let daemon = Daemon::start("rdma-core-suite", &[]);
    let out = daemon
        .command(&python)
        .args([
            "tests/run_tests.py",
            "-v",
            "--dev",
            "srxe0",
            "test_device",
            "test_pd",
        ])
        .current_dir(&dir)
        .output()
        .expect("run rdma-core tests");
    // unittest reports on stderr; pyverbs prints harmless interpreter-shutdown noise there too.
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rdma-core tests failed:\n{report}");
    let ran: usize = report
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no unittest summary:\n{report}"));
    assert!(ran >= 20, "only {ran} rdma-core tests ran:\n{report}");
    for line in report.lines().filter(|l| l.contains(" ... ")) {
        let passed = line.ends_with(" ... ok");
        let dm_skip = line.contains("skipped 'Device memory is not supported'");
        assert!(passed || dm_skip, "unexpected result: {line}\n{report}");
    }
}
