//! Unmodified `ibv_devices` and `ibv_devinfo -v` (ibverbs-utils, rdma-core 44) under
//! LD_PRELOAD=libsoftroce.so see the built-in device `srxe0` and describe it like kernel rxe.

mod shim_support;

use shim_support::{require_program, run_preloaded, workspace_root};

/// `ibv_devinfo -v` of kernel rxe (rdma-core 44 on kernel 6.1), checked in by the research.
fn rxe_capture() -> Option<String> {
    let p = workspace_root().join("../shared/captures/devinfo/rxe1-ibv_devinfo-v.txt");
    let alt = std::path::Path::new("/work/shared/captures/devinfo/rxe1-ibv_devinfo-v.txt");
    std::fs::read_to_string(p)
        .or_else(|_| std::fs::read_to_string(alt))
        .ok()
}

#[test]
fn ibv_devices_lists_srxe0() {
    let out = run_preloaded(&require_program("ibv_devices"), &[]);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec!["srxe0", "005352fffe584500"]),
        "srxe0 with its node GUID missing from:\n{out}"
    );
}

#[test]
fn ibv_devinfo_verbose_reports_rxe_attributes() {
    let out = run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
    let expect = [
        "hca_id:\tsrxe0",
        "\ttransport:\t\t\tInfiniBand (0)",
        "\tfw_ver:\t\t\t\t0.0.0",
        "\tnode_guid:\t\t\t0053:52ff:fe58:4500",
        "\tvendor_id:\t\t\t0xffffff",
        "\tphys_port_cnt:\t\t\t1",
        "\tmax_mr_size:\t\t\t0xffffffffffffffff",
        "\tmax_qp:\t\t\t\t1048560",
        "\tdevice_cap_flags:\t\t0x01223c76",
        "\tmax_qp_rd_atom:\t\t\t128",
        "\tmax_qp_init_rd_atom:\t\t128",
        "\tatomic_cap:\t\t\tATOMIC_HCA (1)",
        "\tmax_pkeys:\t\t\t64",
        "\tnum_comp_vectors:\t\t1",
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
        "\t\t\tmax_mtu:\t\t4096 (5)",
        "\t\t\tactive_mtu:\t\t4096 (5)",
        "\t\t\tlink_layer:\t\tEthernet",
        "\t\t\tport_cap_flags:\t\t0x00010000",
        "\t\t\tgid_tbl_len:\t\t1024",
        "\t\t\tphys_state:\t\tLINK_UP (5)",
        "\t\t\tGID[  0]:\t\tfe80::53:52ff:fe58:4500, RoCE v2",
        "\t\t\tGID[  1]:\t\t::ffff:127.0.0.1, RoCE v2",
        "\t\t\tGID[  2]:\t\t::1, RoCE v2",
    ];
    let lines: Vec<&str> = out.lines().collect();
    for e in expect {
        assert!(
            lines.contains(&e),
            "missing line {e:?} in ibv_devinfo -v output:\n{out}"
        );
    }
    assert!(
        !out.contains("board_id"),
        "rxe has no board_id; the shim must not invent one"
    );
    assert!(
        !out.contains("GID[  3]"),
        "only three GIDs expected:\n{out}"
    );
}

/// Line-by-line against the kernel rxe capture: only the lines that name the device, its
/// GUIDs, the loopback MTU and the addresses may differ.
#[test]
fn ibv_devinfo_verbose_matches_kernel_rxe_capture() {
    let capture = rxe_capture().expect("shared/captures/devinfo/rxe1-ibv_devinfo-v.txt not found");
    let out = run_preloaded(&require_program("ibv_devinfo"), &["-v"]);
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
