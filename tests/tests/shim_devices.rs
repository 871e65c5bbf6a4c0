//! Unmodified `ibv_devices` and `ibv_devinfo -v` (ibverbs-utils, rdma-core 44) under
//! LD_PRELOAD=libsoftroce.so see exactly the devices of the `softroce daemon` at
//! `$SOFTROCE_SOCKET`, described like kernel rxe; with no daemon they see none and are told why
//! in one line. Also `softroce run -- ibv_devinfo`, end to end.

mod shim_support;

use std::process::Command;

use shim_support::{
    check_output, require_program, shim_libs, softroce_bin, workspace_root, Daemon,
};

/// `ibv_devinfo -v` of kernel rxe (rdma-core 44 on kernel 6.1), checked in by the research.
fn rxe_capture() -> Option<String> {
    let p = workspace_root().join("../shared/captures/devinfo/rxe1-ibv_devinfo-v.txt");
    let alt = std::path::Path::new("/work/shared/captures/devinfo/rxe1-ibv_devinfo-v.txt");
    std::fs::read_to_string(p)
        .or_else(|_| std::fs::read_to_string(alt))
        .ok()
}

/// The node GUID as `ibv_devices` prints it (16 hex digits) and as `ibv_devinfo` does.
fn guid_forms(guid: u64) -> (String, String) {
    let hex = format!("{guid:016x}");
    let colons = format!(
        "{}:{}:{}:{}",
        &hex[0..4],
        &hex[4..8],
        &hex[8..12],
        &hex[12..16]
    );
    (hex, colons)
}

fn assert_lines(out: &str, expect: &[&str]) {
    let lines: Vec<&str> = out.lines().collect();
    for e in expect {
        assert!(lines.contains(e), "missing line {e:?} in:\n{out}");
    }
}

#[test]
fn ibv_devices_lists_the_daemons_device_with_its_guid() {
    let daemon = Daemon::start("devices-default", &[]);
    let truth = daemon.query_devices();
    assert_eq!(truth.len(), 1);
    let (hex, _) = guid_forms(truth[0].node_guid);
    let out = daemon.run_preloaded(&require_program("ibv_devices"), &[]);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec!["srxe0", hex.as_str()]),
        "srxe0 with the daemon's node GUID {hex} missing from:\n{out}"
    );
}

#[test]
fn ibv_devinfo_verbose_shows_the_daemons_configuration() {
    let daemon = Daemon::start(
        "devinfo-srxe7",
        &[
            "--addr",
            "127.0.0.2",
            "--addr",
            "::1",
            "--name",
            "srxe7",
            "--mtu",
            "1024",
        ],
    );
    let truth = daemon.query_devices();
    let (_, guid) = guid_forms(truth[0].node_guid);
    let gid0 = std::net::Ipv6Addr::from(truth[0].gids[0].gid).to_string();
    assert_eq!(
        gid0, "::ffff:127.0.0.2",
        "the protocol and ibv_devinfo agree on GID 0"
    );
    let out = daemon.run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
    assert_lines(
        &out,
        &[
            "hca_id:\tsrxe7",
            "\ttransport:\t\t\tInfiniBand (0)",
            "\tfw_ver:\t\t\t\t0.0.0",
            &format!("\tnode_guid:\t\t\t{guid}"),
            &format!("\tsys_image_guid:\t\t\t{guid}"),
            "\tvendor_id:\t\t\t0xffffff",
            "\tphys_port_cnt:\t\t\t1",
            "\tmax_qp:\t\t\t\t1048560",
            "\tdevice_cap_flags:\t\t0x01223c76",
            "\tatomic_cap:\t\t\tATOMIC_HCA (1)",
            "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            "\t\t\tactive_mtu:\t\t1024 (3)",
            "\t\t\tlink_layer:\t\tEthernet",
            "\t\t\tgid_tbl_len:\t\t1024",
            "\t\t\tphys_state:\t\tLINK_UP (5)",
            "\t\t\tGID[  0]:\t\t::ffff:127.0.0.2, RoCE v2",
            "\t\t\tGID[  1]:\t\t::1, RoCE v2",
        ],
    );
    assert!(!out.contains("srxe0"), "only the daemon's device:\n{out}");
    assert!(
        !out.contains("GID[  2]"),
        "only two GIDs expected (loopback has no link-local address):\n{out}"
    );
    assert!(!out.contains("board_id"), "rxe has no board_id:\n{out}");
}

/// Line-by-line against the kernel rxe capture: only the lines that name the device, its
/// GUIDs, the loopback MTU and the addresses may differ. The daemon is given rxe's CQ depth
/// (`--max-cqe 32767`; softroce's default is deeper, for the stacks: docs/stacks.md) and
/// rxe's port speed on `lo` (`--speed 1000`: 1X SDR; softroce's default is 4X EDR, also for
/// the stacks), which `max_cqe_follows_the_daemons_configuration` and
/// `port_speed_follows_the_daemons_configuration` check separately.
#[test]
fn ibv_devinfo_verbose_matches_kernel_rxe_capture() {
    let capture = rxe_capture().expect("shared/captures/devinfo/rxe1-ibv_devinfo-v.txt not found");
    let daemon = Daemon::start(
        "devinfo-capture",
        &["--max-cqe", "32767", "--speed", "1000"],
    );
    let out = daemon.run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
    let may_differ = |l: &str| {
        [
            "hca_id:",
            "node_guid:",
            "sys_image_guid:",
            "active_mtu:",
            "GID[",
        ]
        .iter()
        .any(|k| l.trim_start().starts_with(k))
    };
    let ours: Vec<&str> = out.lines().filter(|l| !may_differ(l)).collect();
    let theirs: Vec<&str> = capture.lines().filter(|l| !may_differ(l)).collect();
    assert_eq!(ours.len(), theirs.len(), "line count differs:\n{out}");
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "ibv_devinfo -v differs from kernel rxe");
    }
}

#[test]
fn two_daemons_on_two_sockets_give_two_views() {
    let a = Daemon::start("view-a", &["--name", "srxa", "--addr", "127.0.0.1"]);
    let b = Daemon::start(
        "view-b",
        &["--name", "srxb", "--addr", "127.0.0.3", "--mtu", "512"],
    );
    let devinfo = require_program("ibv_devinfo");
    let seen_a = a.run_preloaded(&devinfo, &["-v"]);
    let seen_b = b.run_preloaded(&devinfo, &["-v"]);
    assert_lines(
        &seen_a,
        &[
            "hca_id:\tsrxa",
            "\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
            "\t\t\tactive_mtu:\t\t4096 (5)",
        ],
    );
    assert_lines(
        &seen_b,
        &[
            "hca_id:\tsrxb",
            "\t\t\tGID[  0]:\t\t::ffff:127.0.0.3, RoCE v2",
            "\t\t\tactive_mtu:\t\t512 (2)",
        ],
    );
    assert!(!seen_a.contains("srxb") && !seen_b.contains("srxa"));
}

#[test]
fn without_a_daemon_there_are_no_devices_and_one_clear_line() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("daemons/none");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("ctl.sock");
    let out = Command::new(require_program("ibv_devices"))
        .env("LD_PRELOAD", &shim_libs().preload)
        .env("SOFTROCE_SOCKET", &socket)
        .output()
        .expect("run ibv_devices");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    // Only ibv_devices' two header lines ("device / node GUID" and the dashes).
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 2, "no device rows expected:\n{stdout}");
    assert!(rows[1].trim_start().starts_with("------"), "{stdout}");
    assert_eq!(
        stderr,
        format!(
            "softroce: no daemon at {} (start one with: softroce daemon)\n",
            socket.display()
        )
    );

    // ibv_devinfo says what it says when a machine has no RDMA device at all.
    let out = Command::new(require_program("ibv_devinfo"))
        .env("LD_PRELOAD", &shim_libs().preload)
        .env("SOFTROCE_SOCKET", &socket)
        .output()
        .expect("run ibv_devinfo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        stderr.matches("softroce: no daemon at").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("No IB devices found"), "{stderr}");
}

#[test]
fn softroce_run_preloads_the_shim_and_points_it_at_the_daemon() {
    let daemon = Daemon::start("run", &["--name", "srxrun", "--addr", "127.0.0.4"]);
    let out = Command::new(softroce_bin())
        .arg("run")
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--", "ibv_devinfo", "-v"])
        // `softroce run` must find libsoftroce.so and set both variables itself.
        .env_remove("LD_PRELOAD")
        .env_remove("SOFTROCE_SOCKET")
        .env_remove("SOFTROCE_SHIM")
        .output()
        .expect("run softroce run");
    let stdout = check_output("softroce run -- ibv_devinfo -v", out);
    assert_lines(
        &stdout,
        &[
            "hca_id:\tsrxrun",
            "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
            "\t\t\tGID[  0]:\t\t::ffff:127.0.0.4, RoCE v2",
        ],
    );
}

/// The port's width and speed follow the daemon's `--speed` (Mb/s) by the kernel's table for
/// RoCE ports: 100 Gb/s (4X EDR) by default, as rxe on a link of unknown speed; in
/// `ibv_devinfo -v` and in the sysfs `rate` the stacks read.
#[test]
fn port_speed_follows_the_daemons_configuration() {
    let devinfo = require_program("ibv_devinfo");
    for (name, args, width, speed, rate) in [
        (
            "speed-default",
            &[][..],
            "4X (2)",
            "25.0 Gbps (32)",
            "100 Gb/sec (4X EDR)",
        ),
        (
            "speed-10g",
            &["--speed", "10000"][..],
            "1X (1)",
            "10.0 Gbps (8)",
            "10 Gb/sec (1X FDR10)",
        ),
        (
            "speed-1g",
            &["--speed", "1000"][..],
            "1X (1)",
            "2.5 Gbps (1)",
            "2.5 Gb/sec (1X SDR)",
        ),
    ] {
        let daemon = Daemon::start(name, args);
        let out = daemon.run_preloaded(&devinfo, &["-v"]);
        assert!(
            out.contains(&format!("\tactive_width:\t\t{width}\n")),
            "{name}: {out}"
        );
        assert!(
            out.contains(&format!("\tactive_speed:\t\t{speed}\n")),
            "{name}: {out}"
        );
        let cat = daemon.run_preloaded(
            std::path::Path::new("/bin/cat"),
            &["/sys/class/infiniband/srxe0/ports/1/rate"],
        );
        assert_eq!(cat.trim_end(), rate, "{name}");
    }
}

/// `max_cqe` is the daemon's per-device setting: 1,048,575 by default (libfabric's ofi_rxm asks
/// for 262,144-entry CQs), what `--max-cqe` says otherwise; a CQ of 262,144 entries is created.
#[test]
fn max_cqe_follows_the_daemons_configuration() {
    let daemon = Daemon::start("devinfo-max-cqe", &[]);
    let out = daemon.run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
    assert!(out.contains("\tmax_cqe:\t\t\t1048575\n"), "{out}");
    let small = Daemon::start("devinfo-max-cqe-small", &["--max-cqe", "65535"]);
    let out = small.run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
    assert!(out.contains("\tmax_cqe:\t\t\t65535\n"), "{out}");
    let exe = shim_support::compile_c(
        "deep_cq",
        r#"
#include <infiniband/verbs.h>
#include <stdio.h>
int main(void) {
    struct ibv_device **l = ibv_get_device_list(NULL);
    struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
    if (!c) return 1;
    struct ibv_cq *cq = ibv_create_cq(c, 262144, NULL, NULL, 0);
    printf("cqe %d\n", cq ? cq->cqe : -1);
    struct ibv_cq *too_deep = ibv_create_cq(c, 1048576 * 2, NULL, NULL, 0);
    printf("too deep %s\n", too_deep ? "created" : "refused");
    return !(cq && cq->cqe >= 262144 && !too_deep);
}
"#,
        &["ibverbs"],
    );
    let out = daemon.run_preloaded(&exe, &[]);
    assert!(out.contains("too deep refused"), "{out}");
}
