//! The symbol tables of both builds: every libibverbs name is exported by the preload library,
//! unversioned (so it wins every `name@IBVERBS_x` reference, verbs-abi.md §3.2), and the
//! replacement `libibverbs.so.1` defines all of libibverbs' version nodes.

mod shim_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use shim_support::{check_output, require_program, shim_libs, workspace_root};

const VERSION_NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
    "IBVERBS_PRIVATE_34",
];

/// The 147 names rdma-core 44's libibverbs.so.1 exports (shim/libibverbs-exports.txt).
fn libibverbs_names() -> BTreeSet<String> {
    let list = std::fs::read_to_string(workspace_root().join("shim/libibverbs-exports.txt"))
        .expect("read shim/libibverbs-exports.txt");
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Defined dynamic symbols as (name, version suffix such as "@@IBVERBS_1.1" or "").
fn defined_symbols(lib: &Path) -> Vec<(String, String)> {
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

fn readelf(args: &[&str], lib: &Path) -> String {
    let out = Command::new(require_program("readelf"))
        .args(args)
        .arg(lib)
        .output()
        .expect("run readelf");
    check_output("readelf", out)
}

#[test]
fn preload_library_exports_every_libibverbs_name_unversioned() {
    let libs = shim_libs();
    let syms = defined_symbols(&libs.preload);
    let mut missing = Vec::new();
    for name in libibverbs_names() {
        match syms.iter().find(|(n, _)| *n == name) {
            None => missing.push(name),
            Some((_, version)) => {
                assert!(
                    version.is_empty(),
                    "{name} is exported versioned ({version})"
                )
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by libsoftroce.so: {missing:?}"
    );
    // No version definitions at all: a node could capture a symbol and make ld.so prefer the
    // real library for references to other nodes.
    assert!(
        !readelf(&["-V", "--wide"], &libs.preload).contains(".gnu.version_d"),
        "the preload library must not define symbol versions"
    );
}

#[test]
fn export_list_matches_installed_libibverbs() {
    // Keeps shim/libibverbs-exports.txt honest against the rdma-core actually installed.
    let real = Path::new("/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert!(
        real.is_file(),
        "libibverbs1 is not installed: run scripts/test"
    );
    let installed: BTreeSet<String> = defined_symbols(real)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !n.starts_with("IBVERBS_"))
        .collect();
    assert_eq!(installed, libibverbs_names());
}

#[test]
fn replacement_library_defines_version_nodes_and_soname() {
    let lib = shim_libs().replacement_dir.join("libibverbs.so.1");
    let dynamic = readelf(&["-d"], &lib);
    assert!(
        dynamic.contains("Library soname: [libibverbs.so.1]"),
        "{dynamic}"
    );
    let versions = readelf(&["-V", "--wide"], &lib);
    for node in VERSION_NODES {
        assert!(
            versions.contains(&format!("Name: {node}\n"))
                || versions.contains(&format!("Name: {node} ")),
            "version node {node} not defined:\n{versions}"
        );
    }
    let syms = defined_symbols(&lib);
    for name in libibverbs_names() {
        let found = syms.iter().find(|(n, _)| *n == name);
        assert!(
            found.is_some(),
            "{name} missing from the replacement libibverbs.so.1"
        );
        let (_, version) = found.unwrap();
        assert!(
            version.is_empty() || version == "@@libibverbs.so.1",
            "{name} is versioned {version} in the replacement"
        );
    }
}
