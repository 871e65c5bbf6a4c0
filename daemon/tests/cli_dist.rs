//! What `dist/` ships: the systemd unit passes `systemd-analyze verify` with the binary it
//! starts (and fails it with a binary that does not exist), and runs the daemon with the
//! socket in /run/softroce; `--help` of every command carries an example.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// `systemd-analyze verify` on the unit with its ExecStart binary replaced by `exe`.
fn verify_unit(exe: &str) -> (bool, String) {
    let unit = std::fs::read_to_string(root().join("dist/softroce.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/softroce daemon --config /etc/softroce/softroce.toml --socket /run/softroce/ctl.sock"));
    assert!(unit.contains("RuntimeDirectory=softroce"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dist");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("softroce.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/softroce", exe)).unwrap();
    let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect(
            "systemd-analyze is missing: run scripts/test (scripts/install-deps installs systemd)",
        );
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_systemd_unit_verifies() {
    let (ok, text) = verify_unit(env!("CARGO_BIN_EXE_softroce"));
    assert!(ok, "systemd-analyze verify: {text}");
    let (ok, text) = verify_unit("/nonexistent/softroce");
    assert!(
        !ok,
        "a unit whose binary is missing must not verify: {text}"
    );
}

#[test]
fn every_command_has_an_example_in_its_help() {
    let commands: &[&[&str]] = &[
        &["daemon"],
        &["run"],
        &["link", "add"],
        &["link", "del"],
        &["link", "show"],
        &["stat"],
        &["res", "show"],
        &["capture"],
        &["fault"],
        &["doctor"],
        &["pcap", "check"],
    ];
    for c in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args(*c)
            .arg("--help")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{c:?} --help failed");
        let example = text
            .lines()
            .any(|l| l.trim_start().starts_with("softroce ") || l.contains("Example: softroce "));
        assert!(
            example,
            "`softroce {} --help` shows no example:\n{text}",
            c.join(" ")
        );
    }
}
