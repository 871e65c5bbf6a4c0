//! The librdmacm half of the symbol tables: every name rdma-core 44's librdmacm.so.1 exports
//! (41 `rdma_*` and 27 rsocket `r*`, `shim/librdmacm-exports.txt`) is exported unversioned by
//! the preload library, so it wins every `name@RDMACM_1.x` reference; the replacement
//! `librdmacm.so.1` defines the RDMACM_1.0..1.3 nodes and its SONAME; and datagram rsockets
//! really fail with ENOSYS from C.

mod shim_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use shim_support::symbols::{assert_replacement_library, defined_symbols, export_list};
use shim_support::{compile_c, shim_libs};

const VERSION_NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

#[test]
fn export_list_matches_installed_librdmacm() {
    let real = Path::new("/lib/x86_64-linux-gnu/librdmacm.so.1");
    assert!(
        real.is_file(),
        "librdmacm1 is not installed: run scripts/test"
    );
    let installed: BTreeSet<String> = defined_symbols(real)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !n.starts_with("RDMACM_"))
        .collect();
    let names = export_list("shim/librdmacm-exports.txt");
    assert_eq!(installed, names);
    assert_eq!(names.iter().filter(|n| n.starts_with("rdma_")).count(), 41);
}

#[test]
fn preload_library_exports_every_librdmacm_name_unversioned() {
    let syms = defined_symbols(&shim_libs().preload);
    let mut missing = Vec::new();
    for name in export_list("shim/librdmacm-exports.txt") {
        match syms.iter().find(|(n, _)| *n == name) {
            None => missing.push(name),
            Some((_, v)) => assert!(v.is_empty(), "{name} is exported versioned ({v})"),
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by libsoftroce.so: {missing:?}"
    );
}

#[test]
fn replacement_librdmacm_defines_version_nodes_and_soname() {
    let lib = shim_libs().replacement_dir.join("librdmacm.so.1");
    assert!(lib.is_file(), "{} was not built", lib.display());
    assert_replacement_library(
        &lib,
        "librdmacm.so.1",
        VERSION_NODES,
        "shim/librdmacm-exports.txt",
    );
}

/// A C program linked against the real librdmacm (so every reference is `@RDMACM_1.x`) runs
/// against the replacement and the preload form: the pure functions answer as librdmacm does,
/// a stream rsocket fails without a daemon and a datagram one with ENOSYS, NULL arguments fail cleanly, and with no daemon the
/// channel cannot be created (ENODEV-like failure, never a crash).
#[test]
fn c_caller_sees_librdmacm_conventions_without_a_daemon() {
    let src = r#"
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <arpa/inet.h>
int main(void) {
    if (strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED")) return 1;
    if (strcmp(rdma_event_str(1000), "UNKNOWN EVENT")) return 2;
    errno = 0;
    if (rsocket(AF_INET, SOCK_STREAM, 0) != -1) return 3;
    errno = 0;
    if (rsocket(AF_INET, SOCK_DGRAM, 0) != -1 || errno != ENOSYS) return 3;
    if (rdma_create_id(NULL, NULL, NULL, RDMA_PS_TCP) != -1 || errno != EINVAL) return 4;
    if (rdma_ack_cm_event(NULL) != -1 || errno != EINVAL) return 5;
    if (rdma_destroy_id(NULL) != -1 || errno != EINVAL) return 6;
    struct rdma_addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_port_space = RDMA_PS_TCP;
    if (rdma_getaddrinfo("127.0.0.190", "7471", &hints, &res)) return 7;
    struct sockaddr_in *sin = (struct sockaddr_in *)res->ai_dst_addr;
    if (sin->sin_family != AF_INET || ntohs(sin->sin_port) != 7471) return 8;
    if (res->ai_qp_type != IBV_QPT_RC || res->ai_port_space != RDMA_PS_TCP) return 9;
    if (sin->sin_addr.s_addr != inet_addr("127.0.0.190")) return 10;
    rdma_freeaddrinfo(res);
    hints.ai_flags = RAI_PASSIVE;
    hints.ai_port_space = RDMA_PS_UDP;
    hints.ai_family = AF_INET6;
    if (rdma_getaddrinfo(NULL, "7174", &hints, &res)) return 11;
    if (!res->ai_src_addr || res->ai_dst_addr || res->ai_qp_type != IBV_QPT_UD) return 12;
    rdma_freeaddrinfo(res);
    if (rdma_create_event_channel() != NULL) return 13;
    puts("ok");
    return 0;
}
"#;
    let exe = compile_c("rdmacm_conventions", src, &["rdmacm", "ibverbs"]);
    let libs = shim_libs();
    let nowhere = std::env::temp_dir().join("softroce-no-daemon-here.sock");
    for (how, var, value) in [
        ("preload", "LD_PRELOAD", libs.preload.as_os_str().to_owned()),
        (
            "replacement",
            "LD_LIBRARY_PATH",
            libs.replacement_dir.as_os_str().to_owned(),
        ),
    ] {
        let out = Command::new(&exe)
            .env(var, &value)
            .env("SOFTROCE_SOCKET", &nowhere)
            .output()
            .expect("run the C program");
        assert!(
            out.status.success(),
            "{how}: exit {:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{how}");
    }
}
