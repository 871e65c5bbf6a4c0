//! Address handles (UD destinations), held by the daemon.

use libc::{c_int, c_void};
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
        super::released(ctx.call_done(&Request::DestroyAh { ah: handle }))?;
        if !AHS.remove(ah) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in ibv_create_ah, unregistered just now.
        drop(unsafe { Box::from_raw(ah) });
        Ok(())
    })
}

/// `IBV_WC_GRH`: the receive buffer starts with the 40-byte GRH area.
const IBV_WC_GRH: libc::c_uint = 1;

/// The sending side's address, as a received UD completion and its 40-byte GRH area show it.
/// RoCE v2 over IPv4 puts the IPv4 header in the area's last 20 bytes (the first 20 are zero);
/// IPv6 (and RoCE v1) put a GRH-shaped header in all 40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReplyPath {
    /// The sender's GID: our AH's destination.
    dgid: [u8; 16],
    /// Our own GID the datagram was sent to, and its type, to find our GID index.
    sgid: [u8; 16],
    sgid_type: u32,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
}

/// rdma-core's `get_grh_header_version` and `set_ah_attr_by_ipv4`/`_ipv6`: IPv4 when the first
/// word does not say IPv6 and offset 20 holds a version-4 header (or it does say 6 but offset
/// 20 holds an IPv4 header with a valid checksum).
fn reply_path(area: &[u8; 40]) -> Result<ReplyPath, Errno> {
    let first = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
    let ip4 = &area[20..40];
    let ip4_version = ip4[0] >> 4;
    let is_v4 = if first >> 28 != 6 {
        if ip4_version != 4 {
            return Err(Errno(libc::EPROTONOSUPPORT));
        }
        true
    } else {
        ip4[0] == 0x45 && ipv4_checksum_ok(ip4)
    };
    let mapped = |a: &[u8]| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(a);
        g
    };
    if is_v4 {
        // A multicast destination is not in any GID table (rdma-core refuses it likewise).
        if ip4[16] & 0xf0 == 0xe0 {
            return Err(Errno::INVAL);
        }
        return Ok(ReplyPath {
            dgid: mapped(&ip4[12..16]),
            sgid: mapped(&ip4[16..20]),
            sgid_type: IBV_GID_TYPE_ROCE_V2,
            flow_label: first & 0xf_ffff,
            hop_limit: ip4[8],
            traffic_class: ip4[1],
        });
    }
    let sgid_type = match area[6] {
        17 => IBV_GID_TYPE_ROCE_V2,   // next header UDP: RoCE v2 over IPv6
        0x1b => IBV_GID_TYPE_ROCE_V1, // the IBA next header: RoCE v1
        _ => return Err(Errno(libc::EPROTONOSUPPORT)),
    };
    let mut dgid = [0u8; 16];
    let mut sgid = [0u8; 16];
    dgid.copy_from_slice(&area[8..24]);
    sgid.copy_from_slice(&area[24..40]);
    Ok(ReplyPath {
        dgid,
        sgid,
        sgid_type,
        flow_label: first & 0xf_ffff,
        hop_limit: area[7],
        traffic_class: ((first >> 20) & 0xff) as u8,
    })
}

/// The IPv4 header checksum (RFC 791) of a 20-byte header verifies.
fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = h
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// `ibv_init_ah_from_wc`: the address handle attributes that answer a received datagram (what
/// udaddy's server and rdma_cm UD users reply with). 0, or -1 with errno.
///
/// # Safety
/// `wc` and `ah_attr` are NULL or valid; `grh` is NULL or the 40 readable bytes before the
/// datagram's payload.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut IbvContext,
    port_num: u8,
    wc: *mut IbvWc,
    grh: *mut c_void,
    ah_attr: *mut IbvAhAttr,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let wc = ffi::non_null(wc)?;
        let out = ffi::non_null(ah_attr)?;
        // SAFETY: non-null, the caller's completion.
        let wc = unsafe { wc.as_ref() };
        let mut a = IbvAhAttr {
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            port_num,
            ..Default::default()
        };
        if wc.wc_flags & IBV_WC_GRH != 0 {
            let area = ffi::non_null(grh.cast::<[u8; 40]>())?;
            // SAFETY: non-null, 40 readable bytes per the caller.
            let path = reply_path(unsafe { area.as_ref() })?;
            if port_num != 1 {
                return Err(Errno::INVAL);
            }
            // ibv_find_gid_index: our GID the datagram was addressed to, of the right type
            // (in the table as it is now).
            let index = ctx
                .gids()
                .iter()
                .position(|g| g.is_some_and(|g| g.gid == path.sgid && g.gid_type == path.sgid_type))
                .ok_or(Errno::NODATA)?;
            a.is_global = 1;
            a.grh = IbvGlobalRoute {
                dgid: IbvGid { raw: path.dgid },
                flow_label: path.flow_label,
                sgid_index: u8::try_from(index).map_err(|_| Errno::INVAL)?,
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
            };
        }
        // SAFETY: non-null, the caller's writable attributes.
        unsafe { out.as_ptr().write(a) };
        Ok(0)
    })
}

/// `ibv_create_ah_from_wc`: `ibv_init_ah_from_wc` then `ibv_create_ah`; NULL + errno.
///
/// # Safety
/// As [`ibv_init_ah_from_wc`]; `pd` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut IbvAh {
    ffi::ptr_or_null(|| {
        pd::pd_context(pd)?;
        // SAFETY: a live PD (checked just now).
        let context = unsafe { (*pd).context };
        let mut attr = IbvAhAttr::default();
        // SAFETY: the caller's pointers, forwarded; attr is ours.
        if unsafe { ibv_init_ah_from_wc(context, port_num, wc, grh, &mut attr) } != 0 {
            return Err(Errno::last());
        }
        // SAFETY: attr is ours and initialised.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            return Err(Errno::last());
        }
        Ok(ah)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the daemon writes before a UD payload received over RoCE v2/IPv4 from 10.77.0.11
    /// to 10.77.0.1: 20 zero bytes, then the IPv4 header.
    fn v4_area() -> [u8; 40] {
        let mut a = [0u8; 40];
        a[20..40].copy_from_slice(&[
            0x45, 0x00, 0x00, 0x9c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 77, 0, 11,
            10, 77, 0, 1,
        ]);
        a
    }

    #[test]
    fn an_ipv4_area_names_the_sender_and_our_address() {
        let p = reply_path(&v4_area()).unwrap();
        let mut want_d = [0u8; 16];
        want_d[10..].copy_from_slice(&[0xff, 0xff, 10, 77, 0, 11]);
        let mut want_s = want_d;
        want_s[15] = 1;
        assert_eq!((p.dgid, p.sgid), (want_d, want_s));
        assert_eq!(
            (p.sgid_type, p.hop_limit, p.traffic_class),
            (IBV_GID_TYPE_ROCE_V2, 64, 0)
        );
    }

    #[test]
    fn an_ipv6_area_and_bad_areas() {
        let mut a = [0u8; 40];
        a[0] = 0x60;
        a[6] = 17;
        a[7] = 64;
        a[8] = 0xfe;
        a[24] = 0xfd;
        let p = reply_path(&a).unwrap();
        assert_eq!((p.dgid[0], p.sgid[0], p.hop_limit), (0xfe, 0xfd, 64));
        a[6] = 6; // TCP: not RoCE
        assert_eq!(reply_path(&a), Err(Errno(libc::EPROTONOSUPPORT)));
        assert_eq!(reply_path(&[0u8; 40]), Err(Errno(libc::EPROTONOSUPPORT)));
        let mut m = v4_area();
        m[36] = 224; // a multicast destination
        assert_eq!(reply_path(&m), Err(Errno::INVAL));
    }
}
