//! Every libibverbs export that is not implemented yet, as a stub that fails the way the verb
//! documents failure (never a crash): `NULL` + `errno = EOPNOTSUPP` for constructors, the
//! errno value for verbs that return one, -1 + errno for the -1 verbs, nothing for `void`s.
//!
//! They must exist even unimplemented: binaries are linked BIND_NOW, so a name the shim lacks
//! binds to the real libibverbs, which then receives the shim's objects and crashes
//! (verbs-abi.md finding 3). `shim/libibverbs-exports.txt` lists every name; the e2e test
//! `shim_exports` checks that the built library exports all of them, unversioned.
//!
//! The provider-private `IBVERBS_PRIVATE_34` entry points (`ibv_cmd_*`, ...) are only called by
//! provider libraries such as libmlx5, never with the shim's objects; they are declared without
//! parameters because on x86-64 SysV a callee may ignore arguments its caller passes.

use libc::{c_char, c_int, c_uint, c_void, size_t};

use crate::abi::*;
use crate::ffi::{self, Errno};

macro_rules! unsupported {
    ($( $(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $conv:ident; )*) => {
        $(
            $(#[$meta])*
            #[no_mangle]
            pub extern "C" fn $name($($arg: $ty),*) -> $ret {
                unsupported!(@$conv)
            }
        )*
    };
    (@null) => { ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP)) };
    (@errno) => { ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP)) };
    (@minus_one) => { ffi::int_or_minus_one(|| Err(Errno::OPNOTSUPP)) };
    (@void) => { () };
}

unsupported! {
    // Memory regions.
    fn ibv_reg_dmabuf_mr(_pd: *mut IbvPd, _offset: u64, _length: size_t, _iova: u64, _fd: c_int, _access: c_int) -> *mut IbvMr = null;
    fn ibv_import_mr(_pd: *mut IbvPd, _mr_handle: u32) -> *mut IbvMr = null;
    /// Nothing can have been imported.
    fn ibv_unimport_mr(_mr: *mut IbvMr) -> () = void;
    fn ibv_import_pd(_context: *mut IbvContext, _pd_handle: u32) -> *mut IbvPd = null;
    /// Nothing can have been imported.
    fn ibv_unimport_pd(_pd: *mut IbvPd) -> () = void;
    fn ibv_import_dm(_context: *mut IbvContext, _dm_handle: u32) -> *mut c_void = null;
    /// Nothing can have been imported.
    fn ibv_unimport_dm(_dm: *mut c_void) -> () = void;

    // Completion queues.

    // Shared receive queues.

    // Queue pairs.
    /// No QP exists, so none can be converted.
    fn ibv_query_ece(_qp: *mut IbvQp, _ece: *mut c_void) -> c_int = errno;
    fn ibv_set_ece(_qp: *mut IbvQp, _ece: *mut c_void) -> c_int = errno;

    // Address handles.
    fn ibv_resolve_eth_l2_from_gid(_context: *mut IbvContext, _attr: *mut IbvAhAttr, _eth_mac: *mut u8, _vid: *mut u16) -> c_int = minus_one;

    // Kernel-struct converters used by librdmacm on the kernel's answers; the shim's rdma_cm
    // will not produce kernel structs, so these have nothing to convert.
    fn ibv_copy_ah_attr_from_kern(_dst: *mut IbvAhAttr, _src: *mut c_void) -> () = void;
    fn ibv_copy_qp_attr_from_kern(_dst: *mut IbvQpAttr, _src: *mut c_void) -> () = void;
    fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *mut c_void) -> () = void;
    fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *mut c_void) -> () = void;

    // IBVERBS_PRIVATE_34: the provider interface.
    fn _verbs_init_and_alloc_context() -> *mut c_void = null;
    fn verbs_open_device() -> *mut c_void = null;
    fn execute_ioctl() -> c_int = errno;
    fn ibv_read_ibdev_sysfs_file(_buf: *mut c_char, _size: size_t) -> c_int = minus_one;
    /// Provider constructors (libmlx5, libefa) call this at load time; there is nothing to
    /// register with, and it must not fail.
    fn verbs_register_driver_34(_ops: *const c_void) -> () = void;
    /// The pre-34 registration entry point, kept by libibverbs for old providers.
    fn ibv_register_driver(_name: *const c_char, _init: *const c_void) -> () = void;
    fn verbs_set_ops(_ctx: *mut c_void, _ops: *const c_void) -> () = void;
    fn verbs_uninit_context(_ctx: *mut c_void) -> () = void;
    fn verbs_init_cq(_cq: *mut c_void, _ctx: *mut c_void, _channel: *mut c_void, _cq_context: *mut c_void) -> () = void;
    fn __verbs_log(_ctx: *mut c_void, _fmt: *const c_char) -> () = void;
    fn ibv_cmd_advise_mr() -> c_int = errno;
    fn ibv_cmd_alloc_dm() -> c_int = errno;
    fn ibv_cmd_alloc_mw() -> c_int = errno;
    fn ibv_cmd_alloc_pd() -> c_int = errno;
    fn ibv_cmd_attach_mcast() -> c_int = errno;
    fn ibv_cmd_close_xrcd() -> c_int = errno;
    fn ibv_cmd_create_ah() -> c_int = errno;
    fn ibv_cmd_create_counters() -> c_int = errno;
    fn ibv_cmd_create_cq() -> c_int = errno;
    fn ibv_cmd_create_cq_ex() -> c_int = errno;
    fn ibv_cmd_create_flow() -> c_int = errno;
    fn ibv_cmd_create_flow_action_esp() -> c_int = errno;
    fn ibv_cmd_create_qp() -> c_int = errno;
    fn ibv_cmd_create_qp_ex() -> c_int = errno;
    fn ibv_cmd_create_qp_ex2() -> c_int = errno;
    fn ibv_cmd_create_rwq_ind_table() -> c_int = errno;
    fn ibv_cmd_create_srq() -> c_int = errno;
    fn ibv_cmd_create_srq_ex() -> c_int = errno;
    fn ibv_cmd_create_wq() -> c_int = errno;
    fn ibv_cmd_dealloc_mw() -> c_int = errno;
    fn ibv_cmd_dealloc_pd() -> c_int = errno;
    fn ibv_cmd_dereg_mr() -> c_int = errno;
    fn ibv_cmd_destroy_ah() -> c_int = errno;
    fn ibv_cmd_destroy_counters() -> c_int = errno;
    fn ibv_cmd_destroy_cq() -> c_int = errno;
    fn ibv_cmd_destroy_flow() -> c_int = errno;
    fn ibv_cmd_destroy_flow_action() -> c_int = errno;
    fn ibv_cmd_destroy_qp() -> c_int = errno;
    fn ibv_cmd_destroy_rwq_ind_table() -> c_int = errno;
    fn ibv_cmd_destroy_srq() -> c_int = errno;
    fn ibv_cmd_destroy_wq() -> c_int = errno;
    fn ibv_cmd_detach_mcast() -> c_int = errno;
    fn ibv_cmd_free_dm() -> c_int = errno;
    fn ibv_cmd_get_context() -> c_int = errno;
    fn ibv_cmd_modify_cq() -> c_int = errno;
    fn ibv_cmd_modify_flow_action_esp() -> c_int = errno;
    fn ibv_cmd_modify_qp() -> c_int = errno;
    fn ibv_cmd_modify_qp_ex() -> c_int = errno;
    fn ibv_cmd_modify_srq() -> c_int = errno;
    fn ibv_cmd_modify_wq() -> c_int = errno;
    fn ibv_cmd_open_qp() -> c_int = errno;
    fn ibv_cmd_open_xrcd() -> c_int = errno;
    fn ibv_cmd_poll_cq() -> c_int = errno;
    fn ibv_cmd_post_recv() -> c_int = errno;
    fn ibv_cmd_post_send() -> c_int = errno;
    fn ibv_cmd_post_srq_recv() -> c_int = errno;
    fn ibv_cmd_query_context() -> c_int = errno;
    fn ibv_cmd_query_device_any() -> c_int = errno;
    fn ibv_cmd_query_mr() -> c_int = errno;
    fn ibv_cmd_query_port() -> c_int = errno;
    fn ibv_cmd_query_qp() -> c_int = errno;
    fn ibv_cmd_query_srq() -> c_int = errno;
    fn ibv_cmd_read_counters() -> c_int = errno;
    fn ibv_cmd_reg_dm_mr() -> c_int = errno;
    fn ibv_cmd_reg_dmabuf_mr() -> c_int = errno;
    fn ibv_cmd_reg_mr() -> c_int = errno;
    fn ibv_cmd_req_notify_cq() -> c_int = errno;
    fn ibv_cmd_rereg_mr() -> c_int = errno;
    fn ibv_cmd_resize_cq() -> c_int = errno;

    // Vendor direct-verbs entry points that perftest links (verbs-abi.md §1, MLX5/EFA): stubbed
    // so the real libmlx5/libefa never see a shim context.
    fn mlx5dv_open_device(_device: *mut IbvDevice, _attr: *mut c_void) -> *mut IbvContext = null;
    fn mlx5dv_create_qp(_context: *mut IbvContext, _qp_attr: *mut c_void, _mlx5_attr: *mut c_void) -> *mut IbvQp = null;
    fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut IbvQpEx) -> *mut c_void = null;
    fn mlx5dv_create_mkey(_attr: *mut c_void) -> *mut c_void = null;
    fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int = errno;
    fn mlx5dv_crypto_login(_context: *mut IbvContext, _attr: *mut c_void) -> c_int = errno;
    fn mlx5dv_dek_create(_context: *mut IbvContext, _attr: *mut c_void) -> *mut c_void = null;
    fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int = errno;
    fn mlx5dv_devx_general_cmd(_context: *mut IbvContext, _in: *const c_void, _inlen: size_t, _out: *mut c_void, _outlen: size_t) -> c_int = errno;
    fn efadv_create_qp_ex(_context: *mut IbvContext, _attr: *mut c_void, _efa_attr: *mut c_void, _inlen: u32) -> *mut IbvQp = null;
    fn efadv_query_device(_context: *mut IbvContext, _attr: *mut c_void, _inlen: u32) -> c_int = errno;
}

/// `ibv_query_qp_data_in_order`: 0, "no ordering guarantee", the answer that is always safe.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut IbvQp, _op: c_int, _flags: u32) -> c_int {
    0
}

/// `__ioctl_final_num_attrs(num_attrs, buf)`: providers size ioctl buffers with it; returning
/// the count unchanged is what libibverbs does when nothing is appended.
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _buf: *mut c_void) -> c_uint {
    num_attrs
}

/// `verbs_allow_disassociate_destroy` (a `bool` variable in libibverbs, not a function):
/// providers read it. `AtomicBool` has the layout of `bool` and lives in writable data.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
