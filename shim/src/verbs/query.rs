//! Device, port, GID and P_Key queries.
//!
//! Return conventions follow rdma-core 44 exactly, because they differ per verb:
//! `ibv_query_device`/`ibv_query_port`/`_ibv_query_gid_ex` return an errno value,
//! `ibv_query_gid`/`ibv_query_pkey`/`ibv_query_gid_type`/`ibv_get_pkey_index` return -1 with
//! errno, `_ibv_query_gid_table` returns a count or -errno.

use libc::{c_int, size_t};

use crate::abi::*;
use crate::discovery::{self, GidDescription, PortDescription};
use crate::ffi::{self, copy_sized, Errno};
use crate::runtime::{self, ShimContext};

fn port_of(ctx: &ShimContext, port_num: u32) -> Result<&PortDescription, Errno> {
    let idx = usize::try_from(port_num).map_err(|_| Errno::INVAL)?;
    idx.checked_sub(1)
        .and_then(|i| ctx.device.desc.ports.get(i))
        .ok_or(Errno::INVAL)
}

/// The port's GID table as it is now ([`ShimContext::gids`]; port 1 is the only port).
fn live_gids(ctx: &ShimContext, port: &PortDescription) -> Vec<Option<GidDescription>> {
    if ctx
        .device
        .desc
        .ports
        .first()
        .is_some_and(|p| std::ptr::eq(port, p))
    {
        ctx.gids()
    } else {
        port.gids.clone()
    }
}

/// The GID at `index`: `EINVAL` past the table, `ENODATA` for an empty slot (what the kernel's
/// `ib_get_cached_gid` path reports and rdma-core maps per verb).
fn gid_at(ctx: &ShimContext, port: &PortDescription, index: u32) -> Result<GidDescription, Errno> {
    let len = u32::try_from(port.attr.gid_tbl_len).unwrap_or(0);
    if index >= len {
        return Err(Errno::INVAL);
    }
    live_gids(ctx, port)
        .get(index as usize)
        .copied()
        .flatten()
        .ok_or(Errno::NODATA)
}

fn gid_entry(g: &GidDescription, index: u32, port_num: u32) -> IbvGidEntry {
    IbvGidEntry {
        gid: IbvGid { raw: g.gid },
        gid_index: index,
        port_num,
        gid_type: g.gid_type,
        ndev_ifindex: g.ndev_ifindex,
    }
}

/// `ibv_query_device`.
///
/// # Safety
/// `device_attr` is NULL or valid for a write of `struct ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut IbvContext,
    device_attr: *mut IbvDeviceAttr,
) -> c_int {
    ffi::zero_or_errno(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let out = ffi::non_null(device_attr)?;
        // SAFETY: non-null and, per the caller, a writable ibv_device_attr.
        unsafe { out.as_ptr().write(ctx.device.desc.attr.orig_attr) };
        Ok(())
    })
}

/// `verbs_context.query_device_ex`, reached by the inline `ibv_query_device_ex`, which passes
/// its own `sizeof(struct ibv_device_attr_ex)`.
///
/// # Safety
/// `input` is NULL or readable; `attr` is NULL or valid for `attr_size` bytes.
pub unsafe extern "C" fn vctx_query_device_ex(
    context: *mut IbvContext,
    input: *const IbvQueryDeviceExInput,
    attr: *mut IbvDeviceAttrEx,
    attr_size: size_t,
) -> c_int {
    ffi::zero_or_errno(|| {
        let ctx = runtime::context_from_ptr(context)?;
        if !input.is_null() {
            // SAFETY: non-null input struct from the caller.
            let mask = unsafe { (*input).comp_mask };
            if mask != 0 {
                return Err(Errno::INVAL);
            }
        }
        if attr_size < std::mem::size_of::<IbvDeviceAttr>() {
            return Err(Errno::INVAL);
        }
        let out = ffi::non_null(attr)?;
        // SAFETY: the caller's struct is attr_size bytes long.
        unsafe { copy_sized(&ctx.device.desc.attr, out.as_ptr().cast(), attr_size) };
        Ok(())
    })
}

/// # Safety
/// `out` is NULL or valid for `len` bytes.
unsafe fn query_port_into(
    context: *mut IbvContext,
    port_num: u8,
    out: *mut u8,
    len: usize,
) -> Result<(), Errno> {
    let ctx = runtime::context_from_ptr(context)?;
    let port = port_of(ctx, u32::from(port_num))?;
    let out = ffi::non_null(out)?;
    // The state is read each time, as the kernel's query reads the port: it goes down and
    // up while the context is open (`softroce link set`, the netdev's carrier), and a
    // program that got IBV_EVENT_PORT_ERR looks here to see when it is back. The daemon
    // keeps it in the context's doorbell table: no system call.
    let mut attr = port.attr;
    if let Some(p) = ctx.bells.as_ref().and_then(|(b, _)| b.port()) {
        discovery::apply_port(&mut attr, p.active, p.active_mtu);
    }
    // SAFETY: the caller's struct is `len` bytes long.
    unsafe { copy_sized(&attr, out.as_ptr(), len) };
    Ok(())
}

/// The exported `ibv_query_port@IBVERBS_1.1`: receives the 48-byte
/// `struct _compat_ibv_port_attr` (old binaries, and the inline fallback when the
/// `verbs_context` op is unusable), so it must never write `port_cap_flags2`.
///
/// # Safety
/// `port_attr` is NULL or valid for a write of 48 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut IbvContext,
    port_num: u8,
    port_attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: the caller's compat struct is COMPAT_PORT_ATTR_SIZE bytes.
    ffi::zero_or_errno(|| unsafe {
        query_port_into(context, port_num, port_attr.cast(), COMPAT_PORT_ATTR_SIZE)
    })
}

/// `verbs_context.query_port`, reached by the `ibv_query_port` macro (`___ibv_query_port`)
/// with the caller's `sizeof(struct ibv_port_attr)`.
///
/// # Safety
/// `port_attr` is NULL or valid for `port_attr_len` bytes.
pub unsafe extern "C" fn vctx_query_port(
    context: *mut IbvContext,
    port_num: u8,
    port_attr: *mut IbvPortAttr,
    port_attr_len: size_t,
) -> c_int {
    ffi::zero_or_errno(|| {
        // SAFETY: the caller's struct is port_attr_len bytes.
        unsafe { query_port_into(context, port_num, port_attr.cast(), port_attr_len) }
    })
}

/// `ibv_query_gid`: an empty slot reads as the all-zero GID with success (rdma-core keeps that
/// old behaviour; `ibv_devinfo` relies on it to skip empty entries).
///
/// # Safety
/// `gid` is NULL or valid for a 16-byte write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut IbvContext,
    port_num: u8,
    index: c_int,
    gid: *mut IbvGid,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let port = port_of(ctx, u32::from(port_num))?;
        let index = u32::try_from(index).map_err(|_| Errno::INVAL)?;
        let out = ffi::non_null(gid)?;
        let raw = match gid_at(ctx, port, index) {
            Ok(g) => g.gid,
            Err(Errno::NODATA) => [0; 16],
            Err(e) => return Err(e),
        };
        // SAFETY: non-null, a writable union ibv_gid per the caller.
        unsafe { out.as_ptr().write(IbvGid { raw }) };
        Ok(0)
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0 or an errno value;
/// `ENODATA` for an empty slot.
///
/// # Safety
/// `entry` is NULL or valid for a write of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut IbvContext,
    port_num: u32,
    gid_index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: size_t,
) -> c_int {
    ffi::zero_or_errno(|| {
        let ctx = runtime::context_from_ptr(context)?;
        if flags != 0 {
            return Err(Errno::INVAL);
        }
        let out = ffi::non_null(entry)?;
        let port = port_of(ctx, port_num)?;
        let g = gid_at(ctx, port, gid_index)?;
        // SAFETY: the caller's entry is entry_size bytes long.
        unsafe {
            copy_sized(
                &gid_entry(&g, gid_index, port_num),
                out.as_ptr().cast(),
                entry_size,
            )
        };
        Ok(())
    })
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`): the valid entries of all
/// ports, packed at a stride of `entry_size`; the count, or -EINVAL when `max_entries` is too
/// small (rdma-core's test_query_gid_table_bad_flow checks that).
///
/// # Safety
/// `entries` is NULL or valid for `max_entries * entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut IbvContext,
    entries: *mut IbvGidEntry,
    max_entries: size_t,
    flags: u32,
    entry_size: size_t,
) -> isize {
    ffi::count_or_neg_errno(|| {
        let ctx = runtime::context_from_ptr(context)?;
        if flags != 0 || entry_size < std::mem::size_of::<IbvGidEntry>() {
            return Err(Errno::INVAL);
        }
        let valid: Vec<IbvGidEntry> = ctx
            .device
            .desc
            .ports
            .iter()
            .enumerate()
            .flat_map(|(pi, port)| {
                let port_num = pi as u32 + 1;
                live_gids(ctx, port)
                    .into_iter()
                    .enumerate()
                    .take(usize::try_from(port.attr.gid_tbl_len).unwrap_or(0))
                    .filter_map(move |(gi, g)| g.map(|g| gid_entry(&g, gi as u32, port_num)))
            })
            .collect();
        if valid.len() > max_entries {
            return Err(Errno::INVAL);
        }
        let base = ffi::non_null(entries)?.as_ptr().cast::<u8>();
        for (i, e) in valid.iter().enumerate() {
            // SAFETY: i < valid.len() <= max_entries, and the caller's buffer holds
            // max_entries records of entry_size bytes.
            unsafe { copy_sized(e, base.add(i * entry_size), entry_size) };
        }
        Ok(valid.len() as isize)
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; imported by `ibv_devinfo`): the sysfs GID type,
/// 0 = "IB/RoCE v1", 1 = "RoCE v2". An empty slot reads as type 0 with success.
///
/// # Safety
/// `gid_type` is NULL or valid for an int write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut IbvContext,
    port_num: u8,
    index: u32,
    gid_type: *mut c_int,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let port = port_of(ctx, u32::from(port_num))?;
        let out = ffi::non_null(gid_type)?;
        let sysfs_type = match gid_at(ctx, port, index) {
            Ok(g) if g.gid_type == IBV_GID_TYPE_ROCE_V2 => IBV_GID_TYPE_SYSFS_ROCE_V2,
            Ok(_) | Err(Errno::NODATA) => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
            Err(e) => return Err(e),
        };
        // SAFETY: non-null, writable per the caller.
        unsafe { out.as_ptr().write(sysfs_type) };
        Ok(0)
    })
}

/// `ibv_query_pkey`: the P_Key in network byte order; -1 with errno past `pkey_tbl_len`.
///
/// # Safety
/// `pkey` is NULL or valid for a 2-byte write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut IbvContext,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let port = port_of(ctx, u32::from(port_num))?;
        let index = usize::try_from(index).map_err(|_| Errno::INVAL)?;
        if index >= usize::from(port.attr.pkey_tbl_len) {
            return Err(Errno::INVAL);
        }
        let out = ffi::non_null(pkey)?;
        let value = port.pkeys.get(index).copied().unwrap_or(0);
        // SAFETY: non-null, writable per the caller.
        unsafe { out.as_ptr().write(value.to_be()) };
        Ok(0)
    })
}

/// `ibv_get_pkey_index`: the index of a P_Key (given in network byte order), or -1.
///
/// # Safety
/// `context` is NULL or any pointer (only used if it is a live context of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut IbvContext,
    port_num: u8,
    pkey: u16,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let port = port_of(ctx, u32::from(port_num))?;
        let wanted = u16::from_be(pkey);
        port.pkeys
            .iter()
            .take(usize::from(port.attr.pkey_tbl_len))
            .position(|&p| p == wanted)
            .map(|i| i as c_int)
            .ok_or(Errno::NOENT)
    })
}
