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
