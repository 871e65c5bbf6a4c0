//! The symbol tables of both builds: every libibverbs name is exported by the preload library,
//! unversioned (so it wins every `name@IBVERBS_x` reference, verbs-abi.md §3.2), and the
//! replacement `libibverbs.so.1` defines all of libibverbs' version nodes.

mod shim_support;

use std::collections::BTreeSet;
use std::path::Path;

use shim_support::shim_libs;
use shim_support::symbols::{assert_replacement_library, defined_symbols, export_list, readelf};

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

#[test]
fn preload_library_exports_every_libibverbs_name_unversioned() {
    let libs = shim_libs();
    let syms = defined_symbols(&libs.preload);
    let mut missing = Vec::new();
    for name in export_list("shim/libibverbs-exports.txt") {
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
    assert_eq!(installed, export_list("shim/libibverbs-exports.txt"));
}

#[test]
fn replacement_library_defines_version_nodes_and_soname() {
    let lib = shim_libs().replacement_dir.join("libibverbs.so.1");
    assert_replacement_library(
        &lib,
        "libibverbs.so.1",
        VERSION_NODES,
        "shim/libibverbs-exports.txt",
    );
}
