//! `libsoftroce.so`: the libibverbs C ABI of rdma-core 44, for unmodified programs under
//! `LD_PRELOAD` (and, built as `libibverbs.so.1`, for programs that `dlopen` libibverbs).
//!
//! * [`abi`]: `#[repr(C)]` mirrors of the rdma-core structs, layout-checked against the
//!   system `<infiniband/verbs.h>` by `tests/abi_layout.rs`.
//! * [`ffi`]: the C boundary: panics never cross it, every failure becomes the verb's documented
//!   errno convention.
//! * [`daemon`]: the process's control connection to `softroce daemon` (handshake, requests,
//!   hang-up monitoring, fork handling).
//! * [`discovery`]: device descriptions ([`discovery::DeviceSource`]): the daemon's device list
//!   combined with kernel rxe's constants.
//! * [`runtime`]: lazily built device table, live-object registries, async-event plumbing.
//! * [`verbs`]: every exported libibverbs function (unimplemented ones fail with EOPNOTSUPP).
//!
//! All exports are unversioned on purpose: an unversioned definition satisfies every
//! `name@IBVERBS_x` reference, while a wrongly versioned one silently loses to the real
//! library (verbs-abi.md §3.2).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod daemon;
pub mod discovery;
pub mod ffi;
pub mod fsview;
pub mod rdmacm;
pub mod rsocket;
pub mod runtime;
pub mod shm;
pub mod verbs;
