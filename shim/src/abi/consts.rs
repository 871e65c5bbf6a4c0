//! Enum values from rdma-core 44 `verbs.h` (and the private `driver.h` for the sysfs GID type).

use libc::c_int;

// enum ibv_node_type
pub const IBV_NODE_CA: c_int = 1;
// enum ibv_transport_type
pub const IBV_TRANSPORT_IB: c_int = 0;

// enum ibv_atomic_cap
pub const IBV_ATOMIC_NONE: c_int = 0;
pub const IBV_ATOMIC_HCA: c_int = 1;
pub const IBV_ATOMIC_GLOB: c_int = 2;

// enum ibv_mtu
pub const IBV_MTU_256: c_int = 1;
pub const IBV_MTU_512: c_int = 2;
pub const IBV_MTU_1024: c_int = 3;
pub const IBV_MTU_2048: c_int = 4;
pub const IBV_MTU_4096: c_int = 5;

// enum ibv_port_state
pub const IBV_PORT_NOP: c_int = 0;
pub const IBV_PORT_DOWN: c_int = 1;
pub const IBV_PORT_INIT: c_int = 2;
pub const IBV_PORT_ARMED: c_int = 3;
pub const IBV_PORT_ACTIVE: c_int = 4;
pub const IBV_PORT_ACTIVE_DEFER: c_int = 5;

// link layer (anonymous enum)
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// ibv_port_attr.active_width and .active_speed: IBTA 14.2.5.6 PortInfo LinkWidthActive and
// LinkSpeedActive, as the kernel's ib_verbs.h encodes them (IB_WIDTH_*, IB_SPEED_*)
pub const IB_WIDTH_1X: u8 = 1;
pub const IB_WIDTH_4X: u8 = 2;
pub const IB_WIDTH_8X: u8 = 4;
pub const IB_WIDTH_12X: u8 = 8;
pub const IB_WIDTH_2X: u8 = 16;
pub const IB_SPEED_SDR: u8 = 1;
pub const IB_SPEED_DDR: u8 = 2;
pub const IB_SPEED_QDR: u8 = 4;
pub const IB_SPEED_FDR10: u8 = 8;
pub const IB_SPEED_FDR: u8 = 16;
pub const IB_SPEED_EDR: u8 = 32;
pub const IB_SPEED_HDR: u8 = 64;
pub const IB_SPEED_NDR: u8 = 128;

// enum ibv_port_cap_flags
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;

// enum ibv_gid_type (ibv_gid_entry.gid_type)
pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

// enum ibv_gid_type_sysfs (driver.h; what the private ibv_query_gid_type returns)
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: c_int = 0;
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

// enum ibv_event_type
pub const IBV_EVENT_CQ_ERR: c_int = 0;
pub const IBV_EVENT_QP_FATAL: c_int = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_int = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
pub const IBV_EVENT_COMM_EST: c_int = 4;
pub const IBV_EVENT_SQ_DRAINED: c_int = 5;
pub const IBV_EVENT_PATH_MIG: c_int = 6;
pub const IBV_EVENT_PATH_MIG_ERR: c_int = 7;
pub const IBV_EVENT_DEVICE_FATAL: c_int = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_int = 9;
pub const IBV_EVENT_PORT_ERR: c_int = 10;
pub const IBV_EVENT_LID_CHANGE: c_int = 11;
pub const IBV_EVENT_PKEY_CHANGE: c_int = 12;
pub const IBV_EVENT_SM_CHANGE: c_int = 13;
pub const IBV_EVENT_SRQ_ERR: c_int = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;
pub const IBV_EVENT_CLIENT_REREGISTER: c_int = 17;
pub const IBV_EVENT_GID_CHANGE: c_int = 18;
pub const IBV_EVENT_WQ_FATAL: c_int = 19;

// enum ibv_fork_status
pub const IBV_FORK_DISABLED: c_int = 0;
pub const IBV_FORK_ENABLED: c_int = 1;
pub const IBV_FORK_UNNEEDED: c_int = 2;

// enum ibv_rereg_mr_err_code
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
pub const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

// enum ibv_device_cap_flags (the ones rxe reports)
pub const IBV_DEVICE_BAD_PKEY_CNTR: u32 = 1 << 1;
pub const IBV_DEVICE_BAD_QKEY_CNTR: u32 = 1 << 2;
pub const IBV_DEVICE_AUTO_PATH_MIG: u32 = 1 << 4;
pub const IBV_DEVICE_CHANGE_PHY_PORT: u32 = 1 << 5;
pub const IBV_DEVICE_UD_AV_PORT_ENFORCE: u32 = 1 << 6;
pub const IBV_DEVICE_PORT_ACTIVE_EVENT: u32 = 1 << 10;
pub const IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;
pub const IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;
pub const IBV_DEVICE_SRQ_RESIZE: u32 = 1 << 13;
pub const IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
pub const IBV_DEVICE_MEM_MGT_EXTENSIONS: u32 = 1 << 21;
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;

// enum ibv_rate, paired with (multiple of 2.5 Gb/s, Mb/s) as rdma-core's verbs.c tables give
// them; -1 marks "no exact multiple".
pub(crate) const RATE_TABLE: &[(c_int, c_int, c_int)] = &[
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_ERR: c_int = 6;

// enum ibv_qp_type
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;

// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
pub const IBV_WR_LOCAL_INV: c_int = 7;
pub const IBV_WR_BIND_MW: c_int = 8;
pub const IBV_WR_SEND_WITH_INV: c_int = 9;
pub const IBV_WR_TSO: c_int = 10;
pub const IBV_WR_DRIVER1: c_int = 11;
pub const IBV_WR_FLUSH: c_int = 14;
pub const IBV_WR_ATOMIC_WRITE: c_int = 15;

// enum ibv_send_flags
pub const IBV_SEND_INLINE: u32 = 1 << 3;

// enum ibv_mw_type
pub const IBV_MW_TYPE_1: c_int = 1;
pub const IBV_MW_TYPE_2: c_int = 2;

// enum ibv_create_cq_wc_flags: IBV_WC_STANDARD_FLAGS (byte_len, imm, qp_num, src_qp, slid,
// sl, dlid_path_bits); timestamps and the rest are not supported, as on rxe.
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;

// enum ibv_srq_attr_mask
pub const IBV_SRQ_MAX_WR: c_int = 1 << 0;
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

// enum ibv_wc_opcode: receive opcodes have this bit set.
pub const IBV_WC_RECV: c_int = 1 << 7;
