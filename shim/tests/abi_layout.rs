//! Layout test: every `#[repr(C)]` struct in `softroce::abi` against the system
//! `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>` (rdma-core 44). A C program generated from the same list prints
//! `sizeof`, `_Alignof` and `offsetof` of every field; the Rust side computes the same with
//! `size_of`/`align_of`/`offset_of!`; any difference fails with the struct and field named.
//!
//! Needs `cc` and libibverbs-dev; without them the test fails and says to run scripts/test.

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use softroce::abi::*;
use softroce::rdmacm::abi::*;

struct StructLayout {
    c_name: &'static str,
    size: usize,
    align: usize,
    /// (C member designator, Rust offset)
    fields: Vec<(&'static str, usize)>,
}

macro_rules! c_field {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $c:literal) => {
        $c
    };
}

macro_rules! layouts {
    ($( $ty:ty => $c:literal { $( $f:ident $(as $cf:literal)? ),* $(,)? } )*) => {
        vec![$(
            StructLayout {
                c_name: $c,
                size: size_of::<$ty>(),
                align: align_of::<$ty>(),
                fields: vec![$( (c_field!($f $(, $cf)?), offset_of!($ty, $f)) ),*],
            }
        ),*]
    };
}

fn rust_layouts() -> Vec<StructLayout> {
    layouts! {
        IbvGid => "union ibv_gid" { raw }
        IbvGidEntry => "struct ibv_gid_entry" { gid, gid_index, port_num, gid_type, ndev_ifindex }
        IbvDeviceAttr => "struct ibv_device_attr" {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
        }
        IbvOdpCaps => "struct ibv_odp_caps" {
            general_caps,
            rc_odp_caps as "per_transport_caps.rc_odp_caps",
            uc_odp_caps as "per_transport_caps.uc_odp_caps",
            ud_odp_caps as "per_transport_caps.ud_odp_caps",
        }
        IbvTsoCaps => "struct ibv_tso_caps" { max_tso, supported_qpts }
        IbvRssCaps => "struct ibv_rss_caps" {
            supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size,
            rx_hash_fields_mask, rx_hash_function,
        }
        IbvPacketPacingCaps => "struct ibv_packet_pacing_caps" {
            qp_rate_limit_min, qp_rate_limit_max, supported_qpts,
        }
        IbvTmCaps => "struct ibv_tm_caps" { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
        IbvCqModerationCaps => "struct ibv_cq_moderation_caps" { max_cq_count, max_cq_period }
        IbvPciAtomicCaps => "struct ibv_pci_atomic_caps" { fetch_add, swap, compare_swap }
        IbvDeviceAttrEx => "struct ibv_device_attr_ex" {
            orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
            raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
            phys_port_cnt_ex,
        }
        IbvPortAttr => "struct ibv_port_attr" {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2,
        }
        IbvDeviceOps => "struct _ibv_device_ops" { _dummy1, _dummy2 }
        IbvDevice => "struct ibv_device" {
            _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path,
        }
        IbvContextOps => "struct ibv_context_ops" {
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
        }
        IbvContext => "struct ibv_context" {
            device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
        }
        VerbsContext => "struct verbs_context" {
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv_ as "priv", query_device_ex,
            ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
            create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3,
            sz, context,
        }
        IbvQueryDeviceExInput => "struct ibv_query_device_ex_input" { comp_mask }
        IbvPd => "struct ibv_pd" { context, handle }
        IbvXrcd => "struct ibv_xrcd" { context }
        IbvXrcdInitAttr => "struct ibv_xrcd_init_attr" { comp_mask, fd, oflags }
        IbvMr => "struct ibv_mr" { context, pd, addr, length, handle, lkey, rkey }
        IbvMwBindInfo => "struct ibv_mw_bind_info" { mr, addr, length, mw_access_flags }
        IbvCompChannel => "struct ibv_comp_channel" { context, fd, refcnt }
        IbvCq => "struct ibv_cq" {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed,
        }
        IbvCqEx => "struct ibv_cq_ex" {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
            read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num,
            read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
            read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns,
        }
        IbvCqInitAttrEx => "struct ibv_cq_init_attr_ex" {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
        }
        IbvSrqAttr => "struct ibv_srq_attr" { max_wr, max_sge, srq_limit }
        IbvSrqInitAttr => "struct ibv_srq_init_attr" { srq_context, attr }
        IbvTmCap => "struct ibv_tm_cap" { max_num_tags, max_ops }
        IbvSrqInitAttrEx => "struct ibv_srq_init_attr_ex" {
            srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap,
        }
        IbvSrq => "struct ibv_srq" {
            context, srq_context, pd, handle, mutex, cond, events_completed,
        }
        IbvQp => "struct ibv_qp" {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        }
        IbvQpEx => "struct ibv_qp_ex" {
            qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
            wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
            wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
            wr_complete, wr_abort, wr_atomic_write,
        }
        IbvQpCap => "struct ibv_qp_cap" {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
        }
        IbvQpInitAttr => "struct ibv_qp_init_attr" {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
        }
        IbvRxHashConf => "struct ibv_rx_hash_conf" {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask,
        }
        IbvQpInitAttrEx => "struct ibv_qp_init_attr_ex" {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags,
        }
        IbvGlobalRoute => "struct ibv_global_route" {
            dgid, flow_label, sgid_index, hop_limit, traffic_class,
        }
        IbvAhAttr => "struct ibv_ah_attr" {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
        }
        IbvAh => "struct ibv_ah" { context, pd, handle }
        IbvQpAttr => "struct ibv_qp_attr" {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit,
        }
        IbvSge => "struct ibv_sge" { addr, length, lkey }
        IbvSendWrRdma => "__typeof__(((struct ibv_send_wr *)0)->wr.rdma)" { remote_addr, rkey }
        IbvSendWrAtomic => "__typeof__(((struct ibv_send_wr *)0)->wr.atomic)" {
            remote_addr, compare_add, swap, rkey,
        }
        IbvSendWrUd => "__typeof__(((struct ibv_send_wr *)0)->wr.ud)" { ah, remote_qpn, remote_qkey }
        IbvSendWrBindMw => "__typeof__(((struct ibv_send_wr *)0)->bind_mw)" { mw, rkey, bind_info }
        IbvSendWrTso => "__typeof__(((struct ibv_send_wr *)0)->tso)" { hdr, hdr_sz, mss }
        IbvSendWr => "struct ibv_send_wr" {
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr,
            qp_type as "qp_type.xrc.remote_srqn", ext as "bind_mw",
        }
        IbvRecvWr => "struct ibv_recv_wr" { wr_id, next, sg_list, num_sge }
        IbvWc => "struct ibv_wc" {
            wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
            pkey_index, slid, sl, dlid_path_bits,
        }
        IbvAsyncEvent => "struct ibv_async_event" { element, event_type }
        IbvEce => "struct ibv_ece" { vendor_id, options, comp_mask }
        // <rdma/rdma_cma.h>
        RdmaIbAddr => "struct rdma_ib_addr" { sgid, dgid, pkey }
        RdmaAddr => "struct rdma_addr" {
            src_addr, src_addr as "src_sin", src_addr as "src_sin6", src_addr as "src_storage",
            dst_addr, dst_addr as "dst_sin", dst_addr as "dst_sin6", dst_addr as "dst_storage",
            addr, addr as "addr.ibaddr",
        }
        RdmaRoute => "struct rdma_route" { addr, path_rec, num_paths }
        RdmaEventChannel => "struct rdma_event_channel" { fd }
        RdmaCmId => "struct rdma_cm_id" {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type,
        }
        RdmaConnParam => "struct rdma_conn_param" {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num,
        }
        RdmaUdParam => "struct rdma_ud_param" { private_data, private_data_len, ah_attr, qp_num, qkey }
        RdmaCmEvent => "struct rdma_cm_event" {
            id, listen_id, event, status, param, param as "param.conn", param as "param.ud",
        }
        RdmaAddrinfo => "struct rdma_addrinfo" {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next,
        }
        RdmaCmJoinMcAttrEx => "struct rdma_cm_join_mc_attr_ex" { comp_mask, join_flags, addr }
    }
}

/// The unions and anonymous pieces whose sizes matter but have no fields listed above.
fn extra_sizes() -> Vec<(&'static str, usize)> {
    vec![
        (
            "__typeof__(((struct ibv_send_wr *)0)->wr)",
            size_of::<IbvSendWrWr>(),
        ),
        (
            "__typeof__(((struct ibv_async_event *)0)->element)",
            size_of::<IbvAsyncEventElement>(),
        ),
        (
            "struct _compat_ibv_port_attr (offset of port_cap_flags2)",
            COMPAT_PORT_ATTR_SIZE,
        ),
        (
            "__typeof__(((struct rdma_cm_event *)0)->param)",
            size_of::<RdmaCmEventParam>(),
        ),
    ]
}

fn c_program(layouts: &[StructLayout]) -> String {
    let mut c = String::from(
        "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n#include <stddef.h>\n#include <stdio.h>\n\
         #define L(T, NAME) printf(\"%s|size|%zu\\n%s|align|%zu\\n\", NAME, sizeof(T), NAME, _Alignof(T))\n\
         #define F(T, NAME, FIELD) printf(\"%s|%s|%zu\\n\", NAME, #FIELD, offsetof(T, FIELD))\n\
         int main(void) {\n",
    );
    for l in layouts {
        c.push_str(&format!("  L({0}, \"{0}\");\n", l.c_name));
        for (f, _) in &l.fields {
            c.push_str(&format!("  F({0}, \"{0}\", {1});\n", l.c_name, f));
        }
    }
    c.push_str(
        "  printf(\"__typeof__(((struct ibv_send_wr *)0)->wr)|size|%zu\\n\", sizeof(((struct ibv_send_wr *)0)->wr));\n\
         printf(\"__typeof__(((struct ibv_async_event *)0)->element)|size|%zu\\n\", sizeof(((struct ibv_async_event *)0)->element));\n\
         printf(\"struct _compat_ibv_port_attr (offset of port_cap_flags2)|size|%zu\\n\", offsetof(struct ibv_port_attr, port_cap_flags2));\n\
         printf(\"__typeof__(((struct rdma_cm_event *)0)->param)|size|%zu\\n\", sizeof(((struct rdma_cm_event *)0)->param));\n\
         return 0;\n}\n",
    );
    c
}

fn run_c_layout_program(source: &str) -> BTreeMap<(String, String), usize> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abi_layout");
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, source).expect("write layout.c");
    let out = Command::new("cc")
        .arg("-std=gnu11")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}); run scripts/test, which installs the toolchain and libibverbs-dev"));
    assert!(
        out.status.success(),
        "compiling the layout probe against <infiniband/verbs.h> and <rdma/rdma_cma.h> failed (are libibverbs-dev and librdmacm-dev installed? run scripts/test):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run layout probe");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(|line| {
            let mut parts = line.rsplitn(3, '|');
            let value: usize = parts.next().unwrap().parse().unwrap();
            let key = parts.next().unwrap().to_owned();
            let name = parts.next().unwrap().to_owned();
            ((name, key), value)
        })
        .collect()
}

#[test]
fn rust_abi_matches_system_verbs_h() {
    let layouts = rust_layouts();
    let c = run_c_layout_program(&c_program(&layouts));
    let mut mismatches = Vec::new();
    let mut checked = 0;
    let mut check = |name: &str, key: &str, rust: usize| {
        checked += 1;
        match c.get(&(name.to_owned(), key.to_owned())) {
            Some(&cv) if cv == rust => {}
            other => mismatches.push(format!("{name} {key}: C {other:?}, Rust {rust}")),
        }
    };
    for l in &layouts {
        check(l.c_name, "size", l.size);
        check(l.c_name, "align", l.align);
        for (f, off) in &l.fields {
            check(l.c_name, f, *off);
        }
    }
    for (name, size) in extra_sizes() {
        check(name, "size", size);
    }
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    // Guard against the probe silently checking nothing.
    assert!(checked > 400, "only {checked} layout facts checked");
}

#[test]
fn key_sizes_from_verbs_abi_md() {
    // The numbers the inline verbs in already-compiled binaries depend on (verbs-abi.md §2.3).
    assert_eq!(size_of::<VerbsContext>(), 648);
    assert_eq!(offset_of!(VerbsContext, context), 320);
    assert_eq!(offset_of!(IbvContext, abi_compat), 320);
    assert_eq!(size_of::<IbvContext>(), 328);
    assert_eq!(size_of::<IbvDeviceAttrEx>(), 400);
    assert_eq!(size_of::<IbvPortAttr>(), 52);
    assert_eq!(size_of::<IbvCqEx>(), 288);
    assert_eq!(size_of::<IbvQpEx>(), 352);
    assert_eq!(size_of::<IbvDevice>(), 664);
}
