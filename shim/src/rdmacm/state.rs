//! The objects behind `rdma_event_channel *`, `rdma_cm_id *` and `rdma_cm_event *`, their
//! registries (a caller's pointer is only dereferenced once known to be ours), the daemon's
//! handles mapped back to them, and the process's one shared `ibv_context` (and default PD)
//! per device, which every id of that device reports as `id->verbs` (librdmacm's
//! `cma_device`: apps check `id->verbs == pd->context`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, RwLock};

use libc::{c_int, c_void};
use proto::ctl::{CmIdInfo, Request, Response};

use crate::abi::*;
use crate::daemon;
use crate::ffi::{Errno, Zeroable};
use crate::rdmacm::abi::*;
use crate::rdmacm::sockaddr;
use crate::runtime::{self, Registry};

/// Live `rdma_event_channel *` values.
pub static CHANNELS: Registry = Registry::new();

/// The addresses of the last channels destroyed (see [`was_destroyed`]).
static DESTROYED: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
const DESTROYED_KEPT: usize = 64;

/// Records that the channel at `p` was destroyed (just removed from [`CHANNELS`]).
pub fn destroyed(p: *const RdmaEventChannel) {
    let mut d = DESTROYED.lock().unwrap_or_else(|e| e.into_inner());
    if d.len() == DESTROYED_KEPT {
        d.pop_front();
    }
    d.push_back(p as usize);
}

/// Whether `p`, not a live channel, is one destroyed lately: a thread that asks it for an
/// event raced its destruction (rping's cm thread does at exit) and waits, as a reader of the
/// kernel's channel that got there first does, rather than fail.
pub fn was_destroyed(p: *const RdmaEventChannel) -> bool {
    let d = DESTROYED.lock().unwrap_or_else(|e| e.into_inner());
    d.contains(&(p as usize))
}
/// Live `rdma_cm_id *` values.
pub static IDS: Registry = Registry::new();
/// Live `rdma_cm_event *` values (handed out, not yet acknowledged).
pub static EVENTS: Registry = Registry::new();
/// Event processing (shared) against freeing an id (exclusive): see `events::get_event`.
pub static PROCESSING: RwLock<()> = RwLock::new(());

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends a CM request on the process's control connection; a daemon-side failure becomes its
/// errno (the daemon's message is logged there).
pub fn call(request: &Request) -> Result<(Response, Vec<OwnedFd>), Errno> {
    let control = daemon::connection().map_err(|e| e.errno())?;
    if control.is_lost() {
        return Err(Errno(libc::ENODEV));
    }
    match control.request(request, &[])? {
        (Response::Error { errno, .. }, _) => Err(Errno(if errno > 0 { errno } else { libc::EIO })),
        answer => Ok(answer),
    }
}

/// Like [`call`] for requests answered with `Done`.
pub fn call_done(request: &Request) -> Result<(), Errno> {
    match call(request)?.0 {
        Response::Done => Ok(()),
        _ => Err(Errno::PROTO),
    }
}

/// The allocation behind an `rdma_event_channel *` (its first member).
#[repr(C)]
pub struct ShimChannel {
    pub ch: RdmaEventChannel,
    /// The daemon's handle.
    pub handle: u32,
    /// Our end of the event socketpair; `ch.fd` is its number.
    pub fd: OwnedFd,
    /// Event records that were in flight on another channel when their id migrated here
    /// (`rdma_migrate_id`): read before the socket, in order.
    pub carried: Mutex<std::collections::VecDeque<Vec<u8>>>,
}

impl ShimChannel {
    /// `CmCreateChannel`: the daemon keeps one end of a SEQPACKET pair, we get the other.
    pub fn create() -> Result<*mut ShimChannel, Errno> {
        let (handle, fd) = match call(&Request::CmCreateChannel)? {
            (Response::CmChannel { channel }, mut fds) if fds.len() == 1 => {
                (channel, fds.remove(0))
            }
            _ => return Err(Errno::PROTO),
        };
        let p = Box::into_raw(Box::new(ShimChannel {
            ch: RdmaEventChannel { fd: fd.as_raw_fd() },
            handle,
            fd,
            carried: Mutex::new(std::collections::VecDeque::new()),
        }));
        CHANNELS.insert(p);
        Ok(p)
    }

    /// Closes our end first (so nothing more is read from it), then tells the daemon.
    ///
    /// # Safety
    /// `p` came from [`ShimChannel::create`] and was just removed from [`CHANNELS`].
    pub unsafe fn destroy(p: *mut ShimChannel) {
        // SAFETY: per the contract, a live Box<ShimChannel> nobody else frees.
        let b = unsafe { Box::from_raw(p) };
        let handle = b.handle;
        drop(b);
        let _ = call_done(&Request::CmDestroyChannel { channel: handle });
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Maps an `rdma_event_channel *` from a caller to ours.
pub fn channel_from_ptr<'a>(p: *mut RdmaEventChannel) -> Result<&'a ShimChannel, Errno> {
    if !CHANNELS.contains(p) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so the first member (same address) of a live Box<ShimChannel>.
    Ok(unsafe { &*p.cast::<ShimChannel>() })
}

/// Options set with `rdma_set_option`, kept on the id (the daemon gets them too) so the
/// shim applies the ones that land in QP attributes.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdOptions {
    pub tos: Option<u8>,
    pub reuseaddr: Option<bool>,
    pub afonly: Option<bool>,
    pub ack_timeout: Option<u8>,
    pub min_rnr_timer: Option<u8>,
}

/// A joined multicast group: the address, the caller's context and the group's GID (known
/// once `MULTICAST_JOIN` arrived; the QP is attached to it then).
#[derive(Clone, Debug)]
pub struct McastGroup {
    pub addr: SocketAddr,
    pub context: usize,
    pub mgid: Option<[u8; 16]>,
    pub attached_qp: usize,
}

/// Mutable, lock-protected part of an id.
#[derive(Default)]
pub struct IdState {
    /// Events of this id handed out by `rdma_get_cm_event` and not yet acknowledged:
    /// `rdma_destroy_id` waits for them, as librdmacm does.
    pub events_out: u32,
    /// Index of the id's device in the shim's device table, once bound.
    pub device: Option<usize>,
    pub options: IdOptions,
    /// `id_priv->initiator_depth` / `responder_resources` of librdmacm.
    pub initiator_depth: u8,
    pub responder_resources: u8,
    /// The connection failed after `CONNECT_RESPONSE` processing: a later `DISCONNECTED`
    /// is swallowed (librdmacm's `connect_error`).
    pub connect_error: bool,
    /// `rdma_create_ep` of a passive id: every `rdma_get_request` child gets a QP like this.
    pub ep_qp_init_attr: Option<Box<IbvQpInitAttr>>,
    /// `rdma_create_ep`'s PD for those QPs.
    pub ep_pd: usize,
    /// A private channel this id owns (synchronous ids, created with a NULL channel).
    pub private_channel: usize,
    pub mcast: Vec<McastGroup>,
    /// Set by `rdma_destroy_id`: events read for it later are dropped.
    pub destroying: bool,
    /// `DEVICE_REMOVAL` was reported (the daemon went away).
    pub removal_reported: bool,
}

// SAFETY: the raw pointers inside (init attrs' CQ/SRQ pointers) are only used under the lock
// and only as opaque values passed back to the verbs.
unsafe impl Send for IdState {}

/// The allocation behind an `rdma_cm_id *` (its first member).
#[repr(C)]
pub struct ShimCmId {
    pub id: RdmaCmId,
    /// The daemon's handle.
    pub handle: u32,
    /// Created without a channel, or migrated to none: operations wait for their own event
    /// (librdmacm's `sync`).
    pub sync: AtomicBool,
    pub state: Mutex<IdState>,
    /// Signalled when `events_out` drops.
    pub acked: Condvar,
}

static ID_BY_HANDLE: OnceLock<Mutex<HashMap<u32, usize>>> = OnceLock::new();

fn id_map() -> MutexGuard<'static, HashMap<u32, usize>> {
    lock(ID_BY_HANDLE.get_or_init(|| Mutex::new(HashMap::new())))
}

impl ShimCmId {
    /// Registers a new id (daemon handle `handle`) on `channel`.
    pub fn register(
        handle: u32,
        channel: *mut RdmaEventChannel,
        context: *mut c_void,
        ps: c_int,
        qp_type: c_int,
        sync: bool,
    ) -> *mut ShimCmId {
        let mut id = RdmaCmId::zeroed();
        id.channel = channel;
        id.context = context;
        id.ps = ps;
        id.qp_type = qp_type;
        id.route.addr.addr.pkey = 0xffffu16.to_be();
        let p = Box::into_raw(Box::new(ShimCmId {
            id,
            handle,
            sync: AtomicBool::new(sync),
            state: Mutex::new(IdState::default()),
            acked: Condvar::new(),
        }));
        IDS.insert(p);
        id_map().insert(handle, p as usize);
        p
    }

    pub fn state(&self) -> MutexGuard<'_, IdState> {
        lock(&self.state)
    }

    /// Whether operations on the id wait for their own event.
    pub fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Acquire)
    }

    pub fn as_id_ptr(&self) -> *mut RdmaCmId {
        (&self.id as *const RdmaCmId).cast_mut()
    }

    /// Fills the public fields from what the daemon knows of the id: addresses, GIDs,
    /// `port_num`, and `verbs` (the shared context of its device).
    pub fn apply_info(&self, info: &CmIdInfo) -> Result<(), Errno> {
        let p = self.as_id_ptr();
        let device = match &info.device {
            Some(name) => runtime::devices().iter().position(|d| d.desc.name == *name),
            None => None,
        };
        let verbs = match device {
            Some(i) => shared_context(i)?,
            None => std::ptr::null_mut(),
        };
        // The id's first device brings the device's PD with it, as librdmacm's
        // `ucma_get_device` sets `id->pd` (programs use it for their MRs, AHs and QPs without
        // allocating one: pyverbs' `PD(cmid)`, rdma-core's test_rdmacm); a QP created on the
        // id replaces it with its own PD.
        let pd = if device.is_some() && self.state().device.is_none() {
            default_pd(verbs)?
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: `p` is this live id; apps read these fields without locking, as with
        // librdmacm, which writes them from the event path too.
        unsafe {
            if let Some(a) = info.src_addr {
                (*p).route.addr.src_addr = sockaddr::storage(a);
            }
            if let Some(a) = info.dst_addr {
                (*p).route.addr.dst_addr = sockaddr::storage(a);
            }
            (*p).route.addr.addr.sgid = IbvGid { raw: info.src_gid };
            (*p).route.addr.addr.dgid = IbvGid { raw: info.dst_gid };
            if let Some(path) = &info.path {
                (*p).route.addr.addr.pkey = path.pkey.to_be();
                (*p).route.num_paths = 1;
            }
            if !verbs.is_null() {
                (*p).verbs = verbs;
                (*p).port_num = info.port_num.max(1);
            }
            if !pd.is_null() && (*p).pd.is_null() {
                (*p).pd = pd;
            }
        }
        if device.is_some() {
            self.state().device = device;
        }
        Ok(())
    }

    /// Asks the daemon for the id's addresses and applies them.
    pub fn refresh(&self) -> Result<(), Errno> {
        match call(&Request::CmQueryId { id: self.handle })?.0 {
            Response::CmIdInfo(info) => self.apply_info(&info),
            _ => Err(Errno::PROTO),
        }
    }

    /// The channel its events arrive on.
    pub fn channel(&self) -> Result<&ShimChannel, Errno> {
        channel_from_ptr(self.id.channel)
    }
}

/// Maps an `rdma_cm_id *` from a caller to ours.
pub fn id_from_ptr<'a>(p: *mut RdmaCmId) -> Result<&'a ShimCmId, Errno> {
    if !IDS.contains(p) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so the first member (same address) of a live Box<ShimCmId>.
    Ok(unsafe { &*p.cast::<ShimCmId>() })
}

/// The id the daemon calls `handle`, if it is live.
pub fn id_by_handle<'a>(handle: u32) -> Option<&'a ShimCmId> {
    let p = *id_map().get(&handle)?;
    id_from_ptr(p as *mut RdmaCmId).ok()
}

/// Unregisters an id (its daemon handle too); false if it was not live.
pub fn unregister_id(id: &ShimCmId) -> bool {
    let p = id as *const ShimCmId;
    if !IDS.remove(p) {
        return false;
    }
    let mut map = id_map();
    if map.get(&id.handle) == Some(&(p as usize)) {
        map.remove(&id.handle);
    }
    true
}

/// The allocation behind an `rdma_cm_event *` (its first member).
#[repr(C)]
pub struct ShimEvent {
    pub ev: RdmaCmEvent,
    /// The bytes `ev.param.*.private_data` points to.
    pub private_data: Vec<u8>,
    /// The id whose `events_out` this event counts in.
    pub owner: *mut ShimCmId,
}

/// One device's process-wide verbs objects: librdmacm's `cma_device`.
#[derive(Clone, Copy, Default)]
struct CmaDevice {
    context: usize,
    pd: usize,
}

static CMA_DEVICES: Mutex<Vec<CmaDevice>> = Mutex::new(Vec::new());

/// The process's shared `ibv_context` of device `index`, opened on first use and kept for the
/// life of the process (as librdmacm keeps its `cma_device` contexts).
pub fn shared_context(index: usize) -> Result<*mut IbvContext, Errno> {
    let devs = runtime::devices();
    let dev = devs.get(index).ok_or(Errno(libc::ENODEV))?;
    let mut table = lock(&CMA_DEVICES);
    if table.len() < devs.len() {
        table.resize(devs.len(), CmaDevice::default());
    }
    if table[index].context == 0 {
        // SAFETY: a device pointer of our own table.
        let ctx = unsafe { crate::verbs::context::ibv_open_device(dev.as_ptr()) };
        if ctx.is_null() {
            return Err(Errno::last());
        }
        table[index].context = ctx as usize;
    }
    Ok(table[index].context as *mut IbvContext)
}

/// The default PD of a device (what `rdma_create_qp` uses when given none), allocated on
/// first use on the shared context.
pub fn default_pd(context: *mut IbvContext) -> Result<*mut IbvPd, Errno> {
    let index = runtime::context_from_ptr(context)?.device.index;
    shared_context(index)?;
    let mut table = lock(&CMA_DEVICES);
    let entry = table.get_mut(index).ok_or(Errno(libc::ENODEV))?;
    if entry.context != context as usize {
        // Not the shared context: a PD of another context would not match `id->verbs`.
        return Err(Errno::INVAL);
    }
    if entry.pd == 0 {
        let shared = entry.context as *mut IbvContext;
        // SAFETY: the shared context is live for the life of the process.
        let pd = unsafe { crate::verbs::pd::ibv_alloc_pd(shared) };
        if pd.is_null() {
            return Err(Errno::last());
        }
        entry.pd = pd as usize;
    }
    Ok(entry.pd as *mut IbvPd)
}

/// Opens every device's shared context (for `rdma_get_devices`).
pub fn all_shared_contexts() -> Result<Vec<*mut IbvContext>, Errno> {
    (0..runtime::devices().len()).map(shared_context).collect()
}
