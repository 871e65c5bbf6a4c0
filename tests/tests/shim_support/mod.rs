//! Helpers shared by the `shim_*` end-to-end tests: build the shim (both forms) through
//! scripts/shim-build.sh, find the real programs, compile small C programs.
//!
//! Missing programs or headers fail the test with a message to run scripts/test, which installs
//! them (scripts/install-deps); they never make a test pass silently.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub struct ShimLibs {
    /// The LD_PRELOAD library.
    pub preload: PathBuf,
    /// Directory holding the replacement `libibverbs.so.1` (for LD_LIBRARY_PATH).
    pub replacement_dir: PathBuf,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn scratch_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Builds the shim once per test binary (in its own target dir, so it never waits on the lock
/// the running `cargo test` holds).
pub fn shim_libs() -> &'static ShimLibs {
    static LIBS: OnceLock<ShimLibs> = OnceLock::new();
    LIBS.get_or_init(|| {
        let out = scratch_root().join("shim-e2e");
        let built = Command::new("bash")
            .arg(workspace_root().join("scripts/shim-build.sh"))
            .arg(&out)
            .env("CARGO", env!("CARGO"))
            .output()
            .expect("run scripts/shim-build.sh");
        check_output("scripts/shim-build.sh", built);
        let libs = ShimLibs {
            preload: out.join("libsoftroce.so"),
            replacement_dir: out.join("replacement"),
        };
        assert!(
            libs.preload.is_file(),
            "{} was not built",
            libs.preload.display()
        );
        assert!(libs.replacement_dir.join("libibverbs.so.1").is_file());
        libs
    })
}

/// The absolute path of an installed program, or a failure telling how to install it.
pub fn require_program(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed. Run scripts/test, which installs the test prerequisites \
         (scripts/install-deps: ibverbs-utils, libibverbs-dev, gcc, binutils)"
    );
}

/// Fails with the program's output unless it exited 0.
pub fn check_output(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `program args` with the shim preloaded and returns its stdout (asserting success).
pub fn run_preloaded(program: &Path, args: &[&str]) -> String {
    let libs = shim_libs();
    let out = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", &libs.preload)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    check_output(
        &format!("LD_PRELOAD=libsoftroce.so {}", program.display()),
        out,
    )
}

/// Compiles a C test program against the system headers; `libs` are extra `-l` flags.
pub fn compile_c(name: &str, source: &str, libs: &[&str]) -> PathBuf {
    let cc = require_program("cc");
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").is_file(),
        "<infiniband/verbs.h> is missing: run scripts/test (installs libibverbs-dev)"
    );
    let dir = scratch_root().join("shim-c");
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source).expect("write C source");
    let out = Command::new(cc)
        .args(["-std=gnu11", "-Wall", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs.iter().map(|l| format!("-l{l}")))
        .output()
        .expect("run cc");
    check_output(&format!("cc {name}.c"), out);
    exe
}
