//! Address handles (UD destinations), held by the daemon.

use libc::c_int;
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, AHS};
use crate::verbs::{pd, qp};

/// The daemon's handle of a live AH of ours, for UD send WQEs.
pub(crate) fn ah_handle(ah: *mut IbvAh) -> Option<u32> {
    // SAFETY: dereferenced only when registered, i.e. a live IbvAh.
    AHS.contains(ah).then(|| unsafe { (*ah).handle })
}

/// `ibv_create_ah`: NULL + errno. RoCE needs a GRH (`is_global`), as on rxe.
///
/// # Safety
/// `attr` is NULL or a readable `ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    ffi::ptr_or_null(|| {
        let ctx = pd::pd_context(pd)?;
        let a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_ref() };
        // RoCE addresses are GIDs: the kernel's rdma_check_ah_attr refuses an AH without a
        // GRH on a RoCE port with EINVAL.
        if a.is_global == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: live PD.
        let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
        let handle = match ctx
            .call(
                &Request::CreateAh {
                    pd: pd_handle,
                    attr: qp::to_ctl_ah(a),
                },
                &[],
            )?
            .0
        {
            Response::Ah { ah } => ah,
            _ => return Err(Errno::PROTO),
        };
        let p = Box::into_raw(Box::new(IbvAh {
            context,
            pd,
            handle,
        }));
        AHS.insert(p);
        Ok(p)
    })
}

/// `ibv_destroy_ah`: 0 or errno.
///
/// # Safety
/// `ah` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    ffi::zero_or_errno(|| {
        let handle = ah_handle(ah).ok_or(Errno::INVAL)?;
        // SAFETY: live AH (checked above).
        let ctx = runtime::context_from_ptr(unsafe { (*ah).context })?;
        match ctx.call_done(&Request::DestroyAh { ah: handle }) {
            Ok(()) | Err(Errno(libc::ENODEV)) => {}
            Err(e) => return Err(e),
        }
        if !AHS.remove(ah) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in ibv_create_ah, unregistered just now.
        drop(unsafe { Box::from_raw(ah) });
        Ok(())
    })
}

/// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold the GRH (or, for RoCE v2
/// over IPv4, 20 unused bytes then the IPv4 header, as rxe writes it).
const IBV_WC_GRH: u32 = 1 << 1;

/// Which network header a received GRH area holds (libibverbs' `get_grh_header_version`):
/// IPv6 when the first nibble says 6 unless bytes 20..40 are a valid IPv4 header.
fn grh_ip_version(grh: &[u8; 40]) -> Option<u8> {
    let ip4 = &grh[20..40];
    let ip4_ok = ip4[0] >> 4 == 4 && ip4[0] & 0xf == 5 && {
        let mut sum: u32 = 0;
        for pair in ip4.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    };
    match grh[0] >> 4 {
        6 if ip4_ok => Some(4),
        6 => Some(6),
        _ if ip4[0] >> 4 == 4 => Some(4),
        _ => None,
    }
}

/// The AH attributes that answer a received UD message: the sender's GID as destination,
/// our GID it was sent to as source (by index), as libibverbs' `ibv_init_ah_from_wc`.
fn ah_from_grh(
    ctx: &runtime::ShimContext,
    port_num: u8,
    wc: &IbvWc,
    grh: Option<&[u8; 40]>,
) -> Result<IbvAhAttr, Errno> {
    let mut a = IbvAhAttr {
        port_num,
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        ..IbvAhAttr::default()
    };
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Ok(a);
    }
    let grh = grh.ok_or(Errno::INVAL)?;
    let (sgid, dgid, tclass, flow) =
        match grh_ip_version(grh).ok_or(Errno(libc::EPROTONOSUPPORT))? {
            4 => {
                let ip4 = &grh[20..40];
                let map = |b: &[u8]| {
                    let mut g = [0u8; 16];
                    g[10] = 0xff;
                    g[11] = 0xff;
                    g[12..].copy_from_slice(b);
                    g
                };
                (map(&ip4[12..16]), map(&ip4[16..20]), ip4[1], 0)
            }
            _ => {
                let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&grh[8..24]);
                d.copy_from_slice(&grh[24..40]);
                (s, d, ((vtf >> 20) & 0xff) as u8, vtf & 0xfffff)
            }
        };
    let port = ctx
        .device
        .desc
        .ports
        .get(usize::from(port_num).wrapping_sub(1))
        .ok_or(Errno::INVAL)?;
    let index = port
        .gids
        .iter()
        .position(|g| g.as_ref().is_some_and(|g| g.gid == dgid))
        .ok_or(Errno::NOENT)?;
    a.is_global = 1;
    a.grh = IbvGlobalRoute {
        dgid: IbvGid { raw: sgid },
        flow_label: flow,
        sgid_index: u8::try_from(index).map_err(|_| Errno::INVAL)?,
        hop_limit: 0xff,
        traffic_class: tclass,
    };
    Ok(a)
}

/// `ibv_init_ah_from_wc`: 0, or -1 + errno.
///
/// # Safety
/// `wc` and `ah_attr` NULL or valid; `grh` NULL or 40 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut IbvContext,
    port_num: u8,
    wc: *mut IbvWc,
    grh: *mut libc::c_void,
    ah_attr: *mut IbvAhAttr,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let wc = ffi::non_null(wc)?;
        let out = ffi::non_null(ah_attr)?;
        // SAFETY: non-null; 40 bytes when given (the verb's contract).
        let grh = (!grh.is_null()).then(|| unsafe { &*grh.cast::<[u8; 40]>() });
        // SAFETY: non-null, the caller's completion.
        let a = ah_from_grh(ctx, port_num, unsafe { wc.as_ref() }, grh)?;
        // SAFETY: non-null, writable.
        unsafe { out.as_ptr().write(a) };
        Ok(0)
    })
}

/// `ibv_create_ah_from_wc`: an AH answering the sender of `wc`.
///
/// # Safety
/// As [`ibv_init_ah_from_wc`].
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut libc::c_void,
    port_num: u8,
) -> *mut IbvAh {
    ffi::ptr_or_null(|| {
        pd::pd_context(pd)?;
        let mut attr = IbvAhAttr::default();
        // SAFETY: a live PD of ours (checked just above).
        let ctx_ptr = unsafe { (*pd).context };
        // SAFETY: our context, the caller's wc/grh.
        if unsafe { ibv_init_ah_from_wc(ctx_ptr, port_num, wc, grh, &mut attr) } != 0 {
            return Err(Errno::last());
        }
        // SAFETY: a live PD and a filled attribute struct.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            Err(Errno::last())
        } else {
            Ok(ah)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_versions_as_libibverbs() {
        let mut g = [0u8; 40];
        // IPv4 header at 20 with a right checksum.
        let ip4: [u8; 20] = [
            0x45, 0, 0, 0x3c, 0, 0, 0x40, 0, 0x40, 0x11, 0, 0, 127, 0, 0, 1, 127, 0, 0, 2,
        ];
        g[20..].copy_from_slice(&ip4);
        let mut sum: u32 = ip4
            .chunks(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let ck = !(sum as u16);
        g[30..32].copy_from_slice(&ck.to_be_bytes());
        assert_eq!(grh_ip_version(&g), Some(4));
        let mut g6 = [0u8; 40];
        g6[0] = 0x60;
        assert_eq!(grh_ip_version(&g6), Some(6));
        assert_eq!(grh_ip_version(&[0u8; 40]), None);
    }
}
