//! `#[repr(C)]` mirrors of rdma-core 44's `<rdma/rdma_cma.h>` (x86_64). Field names are the C
//! names so `tests/abi_layout.rs` can compare every offset with the system header; the anonymous
//! sockaddr unions of `struct rdma_addr` are one `sockaddr_storage` each here (the union's size
//! and alignment are those of its largest member, `sockaddr_storage`).

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_void, sockaddr, sockaddr_storage, socklen_t};

use crate::abi::{IbvAhAttr, IbvCompChannel, IbvContext, IbvCq, IbvGid, IbvPd, IbvQp, IbvSrq};

/// `enum rdma_cm_event_type`.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: u32 = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: u32 = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: u32 = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: u32 = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: u32 = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: u32 = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: u32 = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: u32 = 7;
pub const RDMA_CM_EVENT_REJECTED: u32 = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: u32 = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: u32 = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: u32 = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: u32 = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: u32 = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: u32 = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: u32 = 15;

/// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013F;

/// The QKey of the UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

pub const RDMA_MAX_RESP_RES: u8 = 0xFF;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;

/// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

/// `rdma_set_option` levels and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// Not in rdma-core 44's header but accepted by its kernel ABI (`RDMA_OPTION_ID_RNR_RETRY_TIMER`
/// in later releases): the responder's minimum RNR NAK timer.
pub const RDMA_OPTION_ID_RNR_RETRY_TIMER: c_int = 4;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// `rdma_cm_join_mc_attr_ex.comp_mask` bits and join flags.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RdmaIbAddr {
    pub sgid: IbvGid,
    pub dgid: IbvGid,
    /// Big-endian.
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination (each a union of the sockaddr kinds, represented
/// by its largest member) and the IB view (the GIDs).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaAddr {
    /// `union { src_addr, src_sin, src_sin6, src_storage }`.
    pub src_addr: sockaddr_storage,
    /// `union { dst_addr, dst_sin, dst_sin6, dst_storage }`.
    pub dst_addr: sockaddr_storage,
    /// `union { struct rdma_ib_addr ibaddr; } addr`.
    pub addr: RdmaIbAddr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaRoute {
    pub addr: RdmaAddr,
    /// `struct ibv_sa_path_rec *` (the shim never fills one: RoCE has no SA).
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct RdmaEventChannel {
    pub fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct RdmaCmId {
    pub verbs: *mut IbvContext,
    pub channel: *mut RdmaEventChannel,
    pub context: *mut c_void,
    pub qp: *mut IbvQp,
    pub route: RdmaRoute,
    /// `enum rdma_port_space`.
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut RdmaCmEvent,
    pub send_cq_channel: *mut IbvCompChannel,
    pub send_cq: *mut IbvCq,
    pub recv_cq_channel: *mut IbvCompChannel,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub pd: *mut IbvPd,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RdmaConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RdmaUdParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: IbvAhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union RdmaCmEventParam {
    pub conn: RdmaConnParam,
    pub ud: RdmaUdParam,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct RdmaCmEvent {
    pub id: *mut RdmaCmId,
    pub listen_id: *mut RdmaCmId,
    /// `enum rdma_cm_event_type`.
    pub event: c_int,
    pub status: c_int,
    pub param: RdmaCmEventParam,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
#[derive(Debug)]
pub struct RdmaAddrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: socklen_t,
    pub ai_dst_len: socklen_t,
    pub ai_src_addr: *mut sockaddr,
    pub ai_dst_addr: *mut sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut RdmaAddrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
#[derive(Debug)]
pub struct RdmaCmJoinMcAttrEx {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut sockaddr,
}

/// `struct ibv_ece` (from `<infiniband/verbs.h>`; used by the ECE calls).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvEce {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

// SAFETY: integers, raw pointers and sockaddr_storage (plain bytes): all valid as zero.
unsafe impl crate::ffi::Zeroable for RdmaCmId {}
// SAFETY: as above.
unsafe impl crate::ffi::Zeroable for RdmaCmEvent {}
// SAFETY: as above.
unsafe impl crate::ffi::Zeroable for RdmaAddrinfo {}
// SAFETY: as above.
unsafe impl crate::ffi::Zeroable for RdmaAddr {}

/// `rdma_event_str`: the names librdmacm prints.
pub fn event_name(event: c_int) -> &'static std::ffi::CStr {
    match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_of_rdma_core_44() {
        // Cross-checked in full by tests/abi_layout.rs; these are the ones apps index by.
        assert_eq!(size_of::<RdmaAddr>(), 296);
        assert_eq!(size_of::<RdmaConnParam>(), 24);
        assert_eq!(size_of::<RdmaUdParam>(), 56);
        assert_eq!(size_of::<RdmaCmEvent>(), 80);
    }

    #[test]
    fn event_names() {
        assert_eq!(
            event_name(RDMA_CM_EVENT_ESTABLISHED as c_int).to_str().ok(),
            Some("RDMA_CM_EVENT_ESTABLISHED")
        );
        assert_eq!(event_name(99).to_str().ok(), Some("UNKNOWN EVENT"));
        assert_eq!(event_name(-1).to_str().ok(), Some("UNKNOWN EVENT"));
    }
}
