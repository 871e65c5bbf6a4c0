//! `#[repr(C)]` mirrors of the rdma-core 44 structs (`<infiniband/verbs.h>`, x86_64) that the
//! shim builds, fills in or reads.
//!
//! Field names are the C names so the layout test (`shim/tests/abi_layout.rs`) can compare every
//! `offset_of!` here with `offsetof` from the system header. Anonymous C unions get a Rust name
//! (noted on the field); the layout test maps it back to the C member it overlays.
//!
//! Pointers to objects the shim never dereferences (flows, work queues, DM, ...) are typed as
//! `*mut c_void`: only the size and alignment of the slot matter for them.

#![allow(non_camel_case_types, non_snake_case)]

pub mod consts;

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t, size_t};

pub use consts::*;

/// `union ibv_gid`: 16 raw bytes, 8-byte aligned because of the `global` view's `__be64`s.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (what `ibv_query_gid_ex`/`ibv_query_gid_table` return).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvGidEntry {
    pub gid: IbvGid,
    pub gid_index: u32,
    pub port_num: u32,
    /// `enum ibv_gid_type`: IB 0, RoCE v1 1, RoCE v2 2.
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    /// Network byte order (`__be64`).
    pub node_guid: u64,
    /// Network byte order (`__be64`).
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_odp_caps` (with its anonymous `per_transport_caps` flattened).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvOdpCaps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvTsoCaps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvRssCaps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvPacketPacingCaps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvTmCaps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvCqModerationCaps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvPciAtomicCaps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex` (400 bytes; `query_device_ex` callers pass that size).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvDeviceAttrEx {
    pub orig_attr: IbvDeviceAttr,
    pub comp_mask: u32,
    pub odp_caps: IbvOdpCaps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: IbvTsoCaps,
    pub rss_caps: IbvRssCaps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: IbvPacketPacingCaps,
    pub raw_packet_caps: u32,
    pub tm_caps: IbvTmCaps,
    pub cq_mod_caps: IbvCqModerationCaps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: IbvPciAtomicCaps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` (52 bytes). The exported `ibv_query_port` symbol receives the older
/// `struct _compat_ibv_port_attr`, which is the first [`COMPAT_PORT_ATTR_SIZE`] bytes of this.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvPortAttr {
    /// `enum ibv_port_state`.
    pub state: c_int,
    /// `enum ibv_mtu`.
    pub max_mtu: c_int,
    /// `enum ibv_mtu`.
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Size of `struct _compat_ibv_port_attr`: everything before `port_cap_flags2`.
pub const COMPAT_PORT_ATTR_SIZE: usize = 48;

/// `struct _ibv_device_ops`: obsolete, never called, kept for layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvDeviceOps {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `struct ibv_device`. Apps read `name`, `node_type` and `transport_type` directly.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvDevice {
    pub _ops: IbvDeviceOps,
    /// `enum ibv_node_type`.
    pub node_type: c_int,
    /// `enum ibv_transport_type`.
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

pub type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut IbvSrq, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut IbvPd, c_int) -> *mut c_void;
pub type BindMwFn = unsafe extern "C" fn(*mut IbvQp, *mut c_void, *mut c_void) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `struct ibv_context_ops` (256 bytes). Only the slots the `static inline` verbs in verbs.h
/// jump through are live; the `_compat_*` slots are dead since rdma-core 18.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvContextOps {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

/// `struct ibv_context` (328 bytes). Always embedded as the last member of [`VerbsContext`].
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// Must be [`VERBS_ABI_IS_EXTENDED`] for the inline verbs to look at the `VerbsContext`.
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: `(void *)UINTPTR_MAX`.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

pub type QueryPortFn = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr, size_t) -> c_int;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut IbvContext,
    *const IbvQueryDeviceExInput,
    *mut IbvDeviceAttrEx,
    size_t,
) -> c_int;
pub type CreateCqExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvCqInitAttrEx) -> *mut IbvCqEx;
pub type CreateQpExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvQpInitAttrEx) -> *mut IbvQp;
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut IbvContext, *mut IbvSrqInitAttrEx) -> *mut IbvSrq;
pub type OpenXrcdFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvXrcdInitAttr) -> *mut IbvXrcd;
pub type CloseXrcdFn = unsafe extern "C" fn(*mut IbvXrcd) -> c_int;
pub type GetSrqNumFn = unsafe extern "C" fn(*mut IbvSrq, *mut u32) -> c_int;
pub type OpenQpFn = unsafe extern "C" fn(*mut IbvContext, *mut c_void) -> *mut IbvQp;

/// `struct verbs_context` (648 bytes): the extended op table that sits *in front of* the
/// `ibv_context` an application holds. The inline verbs find it with
/// `ctx - offsetof(struct verbs_context, context)` once `ctx->abi_compat` says it exists, and
/// only use an op whose offset from the end is covered by `sz`.
#[repr(C)]
pub struct VerbsContext {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: *mut c_void,
    pub alloc_null_mr: *mut c_void,
    pub read_counters: *mut c_void,
    pub attach_counters_point_flow: *mut c_void,
    pub create_counters: *mut c_void,
    pub destroy_counters: *mut c_void,
    pub reg_dm_mr: *mut c_void,
    pub alloc_dm: *mut c_void,
    pub free_dm: *mut c_void,
    pub modify_flow_action_esp: *mut c_void,
    pub destroy_flow_action: *mut c_void,
    pub create_flow_action_esp: *mut c_void,
    pub modify_qp_rate_limit: *mut c_void,
    pub alloc_parent_domain: *mut c_void,
    pub dealloc_td: *mut c_void,
    pub alloc_td: *mut c_void,
    pub modify_cq: *mut c_void,
    pub post_srq_ops: *mut c_void,
    pub destroy_rwq_ind_table: *mut c_void,
    pub create_rwq_ind_table: *mut c_void,
    pub destroy_wq: *mut c_void,
    pub modify_wq: *mut c_void,
    pub create_wq: *mut c_void,
    pub query_rt_values: *mut c_void,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: *mut c_void,
    pub ABI_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub ABI_placeholder1: *mut c_void,
    pub open_qp: Option<OpenQpFn>,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: Option<CreateSrqExFn>,
    pub open_xrcd: Option<OpenXrcdFn>,
    pub close_xrcd: Option<CloseXrcdFn>,
    pub _ABI_placeholder3: u64,
    /// `sizeof(struct verbs_context)` for rdma-core 44: 648. Must sit right before `context`.
    pub sz: size_t,
    pub context: IbvContext,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQueryDeviceExInput {
    pub comp_mask: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_xrcd`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvXrcd {
    pub context: *mut IbvContext,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvXrcdInitAttr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: size_t,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvMwBindInfo {
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_comp_channel`: `fd` is a real file descriptor apps poll/epoll.
#[repr(C)]
#[derive(Debug)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes): the first 128 bytes of [`IbvCqEx`].
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

type CqExFn<R> = Option<unsafe extern "C" fn(*mut IbvCqEx) -> R>;

/// `struct ibv_cq_ex` (288 bytes). Starts with the exact fields of `ibv_cq`, so
/// `ibv_cq_ex_to_cq` is a cast.
#[repr(C)]
pub struct IbvCqEx {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    /// `enum ibv_wc_status`.
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut IbvCqEx, *mut c_void) -> c_int>,
    pub next_poll: CqExFn<c_int>,
    pub end_poll: CqExFn<()>,
    pub read_opcode: CqExFn<c_int>,
    pub read_vendor_err: CqExFn<u32>,
    pub read_byte_len: CqExFn<u32>,
    pub read_imm_data: CqExFn<u32>,
    pub read_qp_num: CqExFn<u32>,
    pub read_src_qp: CqExFn<u32>,
    pub read_wc_flags: CqExFn<c_uint>,
    pub read_slid: CqExFn<u32>,
    pub read_sl: CqExFn<u8>,
    pub read_dlid_path_bits: CqExFn<u8>,
    pub read_completion_ts: CqExFn<u64>,
    pub read_cvlan: CqExFn<u16>,
    pub read_flow_tag: CqExFn<u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut IbvCqEx, *mut c_void)>,
    pub read_completion_wallclock_ns: CqExFn<u64>,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvCqInitAttrEx {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut IbvCompChannel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut IbvPd,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
}

/// `struct ibv_tm_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvTmCap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvSrqInitAttrEx {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
    pub comp_mask: u32,
    /// `enum ibv_srq_type`.
    pub srq_type: c_int,
    pub pd: *mut IbvPd,
    pub xrcd: *mut IbvXrcd,
    pub cq: *mut IbvCq,
    pub tm_cap: IbvTmCap,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct IbvSrq {
    pub context: *mut IbvContext,
    pub srq_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp` (160 bytes): the first member of [`IbvQpEx`].
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub handle: u32,
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: c_int,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_ex` (352 bytes): `qp_base` then the `ibv_wr_*` function pointers. The shim
/// will allocate every QP as one of these so `ibv_qp_to_qp_ex` can return the same address.
/// The `wr_*` slots have differing C signatures; they are stored type-erased.
#[repr(C)]
pub struct IbvQpEx {
    pub qp_base: IbvQp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: *mut c_void,
    pub wr_atomic_fetch_add: *mut c_void,
    pub wr_bind_mw: *mut c_void,
    pub wr_local_inv: *mut c_void,
    pub wr_rdma_read: *mut c_void,
    pub wr_rdma_write: *mut c_void,
    pub wr_rdma_write_imm: *mut c_void,
    pub wr_send: *mut c_void,
    pub wr_send_imm: *mut c_void,
    pub wr_send_inv: *mut c_void,
    pub wr_send_tso: *mut c_void,
    pub wr_set_ud_addr: *mut c_void,
    pub wr_set_xrc_srqn: *mut c_void,
    pub wr_set_inline_data: *mut c_void,
    pub wr_set_inline_data_list: *mut c_void,
    pub wr_set_sge: *mut c_void,
    pub wr_set_sge_list: *mut c_void,
    pub wr_start: *mut c_void,
    pub wr_complete: *mut c_void,
    pub wr_abort: *mut c_void,
    pub wr_atomic_write: *mut c_void,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvRxHashConf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut IbvPd,
    pub xrcd: *mut IbvXrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: IbvRxHashConf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_ah`.
#[repr(C)]
#[derive(Debug)]
pub struct IbvAh {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub handle: u32,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSendWrRdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSendWrAtomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSendWrUd {
    pub ah: *mut IbvAh,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbvSendWrWr {
    pub rdma: IbvSendWrRdma,
    pub atomic: IbvSendWrAtomic,
    pub ud: IbvSendWrUd,
}

/// `bind_mw` arm of the trailing anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSendWrBindMw {
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: IbvMwBindInfo,
}

/// `tso` arm of the trailing anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSendWrTso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The trailing anonymous union of `struct ibv_send_wr` (C members `bind_mw` / `tso`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbvSendWrExt {
    pub bind_mw: IbvSendWrBindMw,
    pub tso: IbvSendWrTso,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// Anonymous union `imm_data` (big-endian) / `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: IbvSendWrWr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// Anonymous union: C members `bind_mw` and `tso`.
    pub ext: IbvSendWrExt,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: c_int,
    /// `enum ibv_wc_opcode`.
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Anonymous union `imm_data` (big-endian) / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `element` of `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbvAsyncEventElement {
    pub cq: *mut IbvCq,
    pub qp: *mut IbvQp,
    pub srq: *mut IbvSrq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvAsyncEvent {
    pub element: IbvAsyncEventElement,
    /// `enum ibv_event_type`.
    pub event_type: c_int,
}
