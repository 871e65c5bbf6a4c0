//! The dynamic symbol tables of the shim's builds and of the real libraries, read with binutils
//! (`nm`, `readelf`), for the export tests of libibverbs and librdmacm.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::{check_output, require_program, workspace_root};

/// The names of an export list of the workspace (`shim/libibverbs-exports.txt`,
/// `shim/librdmacm-exports.txt`): one a line.
pub fn export_list(relative: &str) -> BTreeSet<String> {
    std::fs::read_to_string(workspace_root().join(relative))
        .unwrap_or_else(|e| panic!("read {relative}: {e}"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Defined dynamic symbols as (name, version suffix such as "@@IBVERBS_1.1" or "").
pub fn defined_symbols(lib: &Path) -> Vec<(String, String)> {
    let out = Command::new(require_program("nm"))
        .args(["-D", "--defined-only", "--with-symbol-versions"])
        .arg(lib)
        .output()
        .expect("run nm");
    check_output("nm -D", out)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|sym| match sym.find('@') {
            Some(i) => (sym[..i].to_owned(), sym[i..].to_owned()),
            None => (sym.to_owned(), String::new()),
        })
        .collect()
}

/// `readelf ARGS LIB`'s output.
pub fn readelf(args: &[&str], lib: &Path) -> String {
    let out = Command::new(require_program("readelf"))
        .args(args)
        .arg(lib)
        .output()
        .expect("run readelf");
    check_output("readelf", out)
}

/// A replacement library (`replacement/<soname>`) names itself `soname`, defines every node of
/// `version_nodes` (ld.so refuses a binary whose required version is missing), and has no code
/// of its own: it needs `libsoftroce.so` (found through `$ORIGIN/..`), which exports every name
/// of the list `exports` unversioned, so one copy of the shim serves a process whichever
/// library the loader meets first.
pub fn assert_replacement_library(lib: &Path, soname: &str, version_nodes: &[&str], exports: &str) {
    let dynamic = readelf(&["-d"], lib);
    assert!(
        dynamic.contains(&format!("Library soname: [{soname}]")),
        "{dynamic}"
    );
    assert!(
        dynamic.contains("Shared library: [libsoftroce.so]"),
        "{soname} does not need libsoftroce.so:\n{dynamic}"
    );
    assert!(
        dynamic.contains("Library runpath: [$ORIGIN/..]"),
        "{soname} does not look for libsoftroce.so beside replacement/:\n{dynamic}"
    );
    let versions = readelf(&["-V", "--wide"], lib);
    for node in version_nodes {
        assert!(
            versions.contains(&format!("Name: {node}\n"))
                || versions.contains(&format!("Name: {node} ")),
            "version node {node} not defined:\n{versions}"
        );
    }
    let own = defined_symbols(lib);
    let shim = defined_symbols(&lib.parent().unwrap().join("../libsoftroce.so"));
    for name in export_list(exports) {
        assert!(
            !own.iter().any(|(n, _)| *n == name),
            "{name} is defined in the replacement {soname} itself: a second copy of the shim"
        );
        let Some((_, version)) = shim.iter().find(|(n, _)| *n == name) else {
            panic!("{name} missing from the libsoftroce.so the replacement {soname} needs");
        };
        assert!(
            version.is_empty(),
            "{name} is versioned {version} in libsoftroce.so"
        );
    }
}
