//! Process-wide shim state: the device table (built lazily, never in a constructor, because
//! ld.so runs a preloaded library's constructors last and every child process inherits
//! LD_PRELOAD), and registries of the live objects handed to C, so a pointer from a caller is
//! only dereferenced after it is known to be one of ours.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::ffi::c_char;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libc::c_int;

use crate::abi::*;
use crate::daemon::ControlConnection;
use crate::discovery::{source_from_env, DeviceDescription, DeviceSource, GidDescription};
use crate::ffi::Errno;
use crate::shm::Mapping;
use proto::ctl::{Request, Response};
use proto::ring::doorbell::Doorbells;

/// `struct ibv_device` plus the description it was built from. `dev` is first, so the
/// `ibv_device *` handed out is the address of the whole `ShimDevice`.
#[repr(C)]
pub struct ShimDevice {
    pub dev: IbvDevice,
    pub index: usize,
    pub desc: DeviceDescription,
    /// Port 1's GID table as the daemon last gave it, and the generation it came with
    /// (`None`: the one in `desc`, of unknown generation). The table changes while contexts
    /// are open (the netdev's addresses come and go): [`ShimDevice::gids`].
    live_gids: Mutex<(Option<u16>, Vec<Option<GidDescription>>)>,
}

impl ShimDevice {
    pub fn new(index: usize, desc: DeviceDescription) -> Self {
        let mut dev = IbvDevice {
            _ops: IbvDeviceOps {
                _dummy1: std::ptr::null_mut(),
                _dummy2: std::ptr::null_mut(),
            },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        // The names and paths of a kernel device: the shim shows the files behind them
        // (`fsview`), which UCX (`/dev/infiniband/<dev_name>`) and others look up.
        write_c_string(&mut dev.name, &desc.name);
        write_c_string(&mut dev.dev_name, &format!("uverbs{index}"));
        write_c_string(
            &mut dev.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        write_c_string(
            &mut dev.ibdev_path,
            &format!("/sys/class/infiniband/{}", desc.name),
        );
        let gids = desc
            .ports
            .first()
            .map(|p| p.gids.clone())
            .unwrap_or_default();
        Self {
            dev,
            index,
            desc,
            live_gids: Mutex::new((None, gids)),
        }
    }

    /// Port 1's GID table now, for a context whose doorbell table's port word says the
    /// daemon's table is at `generation`: a copy of another generation is asked for again
    /// (one control request per change, as the kernel's query reads its GID cache). Without
    /// a generation (no doorbell table), or when the daemon cannot answer, the last copy.
    pub fn gids(&self, generation: Option<u16>) -> Vec<Option<GidDescription>> {
        let Ok(mut live) = self.live_gids.lock() else {
            return self
                .desc
                .ports
                .first()
                .map(|p| p.gids.clone())
                .unwrap_or_default();
        };
        if generation.is_some() && live.0 != generation {
            // The generation was read before the question: the answer is at least as new.
            let fresh = crate::daemon::connection()
                .and_then(|c| c.query_devices())
                .ok()
                .and_then(|infos| {
                    let info = infos.iter().find(|i| i.name == self.desc.name)?;
                    let d = crate::discovery::description_from_daemon(info);
                    d.ports.into_iter().next().map(|p| p.gids)
                });
            if let Some(gids) = fresh {
                *live = (generation, gids);
            }
        }
        live.1.clone()
    }

    pub fn as_ptr(&self) -> *mut IbvDevice {
        (&self.dev as *const IbvDevice).cast_mut()
    }
}

/// Copies `s` into a fixed C char array, truncating so a NUL always fits.
pub fn write_c_string(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    if let Some(last) = dst.get_mut(n) {
        *last = 0;
    }
}

/// Never mutated after it is built, so element addresses are stable.
struct DeviceTable(Vec<ShimDevice>);

// SAFETY: the table is immutable once built; the only raw pointers inside (`_ops`) are null.
unsafe impl Sync for DeviceTable {}
// SAFETY: as above.
unsafe impl Send for DeviceTable {}

static DEVICES: OnceLock<DeviceTable> = OnceLock::new();

/// The process's devices, built from [`source_from_env`] on first use. Their addresses stay
/// valid for the life of the process (apps keep `ibv_device *` after `ibv_free_device_list`).
pub fn devices() -> &'static [ShimDevice] {
    &DEVICES.get_or_init(|| build_table(&*source_from_env())).0
}

fn build_table(source: &dyn DeviceSource) -> DeviceTable {
    DeviceTable(
        source
            .devices()
            .into_iter()
            .enumerate()
            .map(|(i, d)| ShimDevice::new(i, d))
            .collect(),
    )
}

/// Maps an `ibv_device *` from a caller back to our device, rejecting null and foreign pointers.
pub fn device_from_ptr(p: *const IbvDevice) -> Result<&'static ShimDevice, Errno> {
    if p.is_null() {
        return Err(Errno::INVAL);
    }
    devices()
        .iter()
        .find(|d| std::ptr::eq(&d.dev, p))
        .ok_or(Errno::INVAL)
}

/// A set of live object addresses of one kind.
///
/// Every verb checks its object against one, so the data path's verbs (`ibv_poll_cq` in a
/// busy loop, `ibv_post_send`) did so under the lock on every call (5-11 % of a latency
/// client's samples). A thread remembers the last few addresses it found live, with the
/// registry's count of removals then: while no object of the kind was removed since, the
/// address is still live without a look at the set. (The check was and stays a snapshot: an
/// object destroyed by another thread right after it is the caller's race, as in rdma-core.)
pub struct Registry {
    live: Mutex<BTreeSet<usize>>,
    /// Objects removed so far.
    removals: AtomicU64,
}

/// Entries of the per-thread cache of [`Registry::contains`]: (registry, address, removals).
const SEEN_LIVE: usize = 4;

thread_local! {
    static SEEN: Cell<[(usize, usize, u64); SEEN_LIVE]> =
        const { Cell::new([(0, 0, u64::MAX); SEEN_LIVE]) };
}

impl Registry {
    pub const fn new() -> Self {
        Self {
            live: Mutex::new(BTreeSet::new()),
            removals: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<usize>> {
        // A panic while holding the lock cannot leave the set inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert<T>(&self, p: *const T) {
        self.lock().insert(p as usize);
    }

    /// Removes `p`; false if it was not live (double free, foreign pointer).
    pub fn remove<T>(&self, p: *const T) -> bool {
        let mut live = self.lock();
        let removed = live.remove(&(p as usize));
        // Under the lock, after the removal: a thread that reads the old count afterwards
        // saw the address live before this call, which it may (see the type's documentation).
        self.removals.fetch_add(1, Ordering::SeqCst);
        removed
    }

    pub fn contains<T>(&self, p: *const T) -> bool {
        if p.is_null() {
            return false;
        }
        let (me, at) = (self as *const Registry as usize, p as usize);
        let removals = self.removals.load(Ordering::SeqCst);
        let seen = SEEN.with(|s| s.get());
        if seen.contains(&(me, at, removals)) {
            return true;
        }
        if !self.lock().contains(&at) {
            return false;
        }
        // The oldest entry makes room (entries of a stale count are never matched again).
        SEEN.with(|s| {
            let mut v = s.get();
            v.rotate_right(1);
            v[0] = (me, at, removals);
            s.set(v);
        });
        true
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Calls `f` with every live address while holding the registry lock, so none of them can
    /// be unregistered (and then freed) meanwhile. `f` must not touch this registry.
    pub fn for_each_live(&self, mut f: impl FnMut(usize)) {
        for &p in self.lock().iter() {
            f(p);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

/// Live `ibv_context *` values (the address of the embedded `ibv_context`).
pub static CONTEXTS: Registry = Registry::new();
/// Live `ibv_pd *` values.
pub static PDS: Registry = Registry::new();
/// Live `ibv_comp_channel *` values.
pub static COMP_CHANNELS: Registry = Registry::new();
/// Live `ibv_mr *` values.
pub static MRS: Registry = Registry::new();
/// Live `ibv_cq *` (= `ibv_cq_ex *`) values.
pub static CQS: Registry = Registry::new();
/// Live `ibv_qp *` (= `ibv_qp_ex *`) values.
pub static QPS: Registry = Registry::new();
/// Live `ibv_srq *` values.
pub static SRQS: Registry = Registry::new();
/// Live `ibv_ah *` values.
pub static AHS: Registry = Registry::new();
/// Live `ibv_mw *` values.
pub static MWS: Registry = Registry::new();

/// A context's objects by the daemon's name for them, so that the records the daemon writes
/// (completion-channel events carry a CQ handle, async events a QPN or CQ/SRQ handle) map back
/// to the `ibv_*` pointers handed to the application.
#[derive(Default)]
pub struct ObjectTable {
    pub cqs: HashMap<u32, usize>,
    pub qps: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
}

/// The allocation behind an `ibv_context *`: the `verbs_context` (whose last member is the
/// `ibv_context`) followed by the shim's private state.
#[repr(C)]
pub struct ShimContext {
    pub vctx: VerbsContext,
    pub device: &'static ShimDevice,
    /// The process's daemon connection (shared by all contexts).
    pub control: &'static ControlConnection,
    /// `context.cmd_fd`: a duplicate of the control socket, owned here, so the app sees a real
    /// descriptor as with `/dev/infiniband/uverbsN`.
    pub cmd_fd: OwnedFd,
    /// Write end of the async event socket whose read end is `context.async_fd`. The daemon
    /// will get a duplicate; the shim itself writes `IBV_EVENT_DEVICE_FATAL` here when the
    /// daemon goes away.
    pub async_tx: OwnedFd,
    /// Read end, owned here and lent to the app as `context.async_fd`.
    pub async_rx: OwnedFd,
    /// Whether `IBV_EVENT_DEVICE_FATAL` was queued already: it is reported once per context,
    /// even when the monitor thread and `ibv_open_device` both notice the loss.
    pub fatal_posted: AtomicBool,
    /// The daemon's handle for this context (`OpenContext`).
    pub handle: u32,
    /// The device thread's doorbell eventfd: written (8 bytes) after posting to a ring whose
    /// consumer said it sleeps.
    pub doorbell: OwnedFd,
    /// The client's doorbell table on this device ([`proto::ring::doorbell`]): a QP's or
    /// SRQ's doorbell is rung after every post, so the daemon reads only rings with work.
    /// The handle is declared before its mapping, which outlives it.
    pub bells: Option<(Doorbells, Mapping)>,
    /// The client's ring chunks on this device, mapped once each (`Response::Qp::region`).
    pub ring_chunks: Mutex<HashMap<u32, Arc<Mapping>>>,
    /// CQs, QPs and SRQs of this context by daemon handle / QPN.
    pub objects: Mutex<ObjectTable>,
    /// The same-host fast path's directions and sources of this context.
    pub fast: crate::fast::FastPath,
}

/// Offset of the `ibv_context` inside [`ShimContext`] (320 for rdma-core 44).
pub const CONTEXT_OFFSET: usize = offset_of!(ShimContext, vctx) + offset_of!(VerbsContext, context);

/// Maps an `ibv_context *` from a caller to our context.
pub fn context_from_ptr<'a>(ctx: *mut IbvContext) -> Result<&'a ShimContext, Errno> {
    if !CONTEXTS.contains(ctx) {
        return Err(Errno::INVAL);
    }
    // SAFETY: `ctx` is registered, so it is the `vctx.context` member of a live, boxed
    // ShimContext (see `verbs::context::ibv_open_device`); stepping back CONTEXT_OFFSET bytes
    // gives the start of that allocation. It is only freed after being unregistered.
    Ok(unsafe { &*ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<ShimContext>() })
}

/// One async event as it travels on the async socket: 16 bytes, the layout of the kernel's
/// `struct ib_uverbs_async_event_desc` (`u64 element; u32 event_type; u32 reserved`). For port
/// events `element` is the port number; for object events it will be the object's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEventRecord {
    pub element: u64,
    pub event_type: u32,
}

impl AsyncEventRecord {
    pub const LEN: usize = 16;

    pub fn to_bytes(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.element.to_ne_bytes());
        b[8..12].copy_from_slice(&self.event_type.to_ne_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != Self::LEN {
            return None;
        }
        let element = u64::from_ne_bytes(b[..8].try_into().ok()?);
        let event_type = u32::from_ne_bytes(b[8..12].try_into().ok()?);
        Some(Self {
            element,
            event_type,
        })
    }
}

/// A connected `SOCK_SEQPACKET` pair: one message per record, real fds that apps can make
/// non-blocking and poll/epoll like the kernel's uverbs fds.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: fds is a valid 2-element array for socketpair to fill.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: socketpair succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A `pipe2(O_CLOEXEC)`: (read end, write end).
pub fn pipe() -> Result<(OwnedFd, OwnedFd), Errno> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: fds is a valid 2-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Errno::last());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes one whole record to a message-oriented fd.
pub fn write_record(fd: RawFd, bytes: &[u8]) -> Result<(), Errno> {
    loop {
        // SAFETY: bytes is a valid readable buffer of bytes.len() bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n >= 0 {
            return if n as usize == bytes.len() {
                Ok(())
            } else {
                Err(Errno::IO)
            };
        }
        let e = Errno::last();
        if e.0 != libc::EINTR {
            return Err(e);
        }
    }
}

/// Reads one record into `buf`; returns the byte count (0 on EOF). Blocking or `EAGAIN`
/// follows the fd's own mode, and a signal as the kernel's event files take one: the read
/// is restarted if the handler asked for `SA_RESTART`, else it fails with `EINTR`, which the
/// event verbs return (`ibv_get_cq_event`, `ibv_get_async_event`, `rdma_get_cm_event`).
/// qperf ends its server's wait for the last message so, with a timer of its own.
pub fn read_record(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: buf is a valid writable buffer of buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(Errno::last())
    }
}

impl ShimContext {
    /// Port 1's GID table now: it follows the netdev's addresses while the context is open,
    /// and the generation in the context's doorbell table says whether the device's copy is
    /// current ([`ShimDevice::gids`]).
    pub fn gids(&self) -> Vec<Option<GidDescription>> {
        let generation = self
            .bells
            .as_ref()
            .and_then(|(b, _)| b.port())
            .map(|p| p.gid_generation);
        self.device.gids(generation)
    }

    /// Sends `request` to the daemon; a daemon-side failure becomes its errno.
    pub fn call(
        &self,
        request: &Request,
        fds: &[RawFd],
    ) -> Result<(Response, Vec<OwnedFd>), Errno> {
        match self.control.request(request, fds)? {
            (Response::Error { errno, .. }, _) => {
                Err(Errno(if errno > 0 { errno } else { libc::EIO }))
            }
            answer => Ok(answer),
        }
    }

    /// Like [`Self::call`] for requests answered with `Done`.
    pub fn call_done(&self, request: &Request) -> Result<(), Errno> {
        match self.call(request, &[])?.0 {
            Response::Done => Ok(()),
            _ => Err(Errno::PROTO),
        }
    }

    /// The data path of this context is usable: not after the daemon is gone, and never in a
    /// fork child that inherited the context (its rings are the parent's: posting or polling
    /// there would corrupt or steal the parent's work). `ENODEV` otherwise.
    pub fn data_path_ok(&self) -> Result<(), Errno> {
        if self.control.is_lost() {
            Err(Errno(libc::ENODEV))
        } else {
            Ok(())
        }
    }

    /// The memory a new QP's rings are in: region 0 is the QP's own (`fd`, `len` bytes);
    /// another is one of the client's ring chunks, mapped the first time it is named and kept.
    pub fn ring_chunk(&self, region: u32, fd: &OwnedFd, len: u64) -> Result<Arc<Mapping>, Errno> {
        if region == 0 {
            return Mapping::map(fd, len).map(Arc::new);
        }
        let mut chunks = crate::verbs::qp::lock(&self.ring_chunks);
        if let Some(m) = chunks.get(&region) {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(Mapping::map(fd, len)?);
        chunks.insert(region, Arc::clone(&m));
        Ok(m)
    }

    /// Rings doorbell `index` after posting to its rings, and wakes the device thread if it
    /// said it sleeps (in the doorbell table, or in the ring: `ring_sleeping`).
    pub fn rang(&self, index: u32, ring_sleeping: bool) {
        let asleep = self.bells.as_ref().is_some_and(|(b, _)| b.ring(index));
        if asleep || ring_sleeping {
            self.ring_doorbell();
        }
    }

    /// Wakes the daemon's device thread (the ring consumer announced it sleeps).
    pub fn ring_doorbell(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a valid buffer to an eventfd this context owns. A
        // failure (EAGAIN on a saturated counter) still leaves the eventfd readable.
        unsafe { libc::write(self.doorbell.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// The object table, usable even after a panic elsewhere poisoned its lock (single
    /// inserts and removes cannot leave it inconsistent).
    pub fn objects(&self) -> MutexGuard<'_, ObjectTable> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an async event for this context, as the daemon will: the app sees it through
    /// `ibv_get_async_event` and `poll(ctx->async_fd)`.
    pub fn post_async_event(&self, record: AsyncEventRecord) -> Result<(), Errno> {
        write_record(self.async_tx.as_raw_fd(), &record.to_bytes())
    }

    /// Like [`Self::post_async_event`] but never blocks: used from the shim's own threads,
    /// which must not hang on an app that stopped reading its events (the event is dropped
    /// then, as the kernel drops events past a full async event queue).
    /// Queues `IBV_EVENT_DEVICE_FATAL` (element 0) unless this context already has it.
    pub fn post_device_fatal(&self) {
        if !self.fatal_posted.swap(true, Ordering::AcqRel) {
            self.try_post_async_event(AsyncEventRecord {
                element: 0,
                event_type: IBV_EVENT_DEVICE_FATAL as u32,
            });
        }
    }

    fn try_post_async_event(&self, record: AsyncEventRecord) {
        let bytes = record.to_bytes();
        // SAFETY: bytes is a valid readable buffer; the fd is owned by this live context.
        unsafe {
            libc::send(
                self.async_tx.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

/// The daemon is gone: every open context gets `IBV_EVENT_DEVICE_FATAL` (element 0), what the
/// kernel's `ib_uverbs_remove_one` queues on each uverbs file when a device disappears.
///
/// Called after the connection is marked lost; `ibv_open_device` checks that mark after
/// registering its context, so a context opened concurrently is covered by one side or both
/// (the registry lock orders them), and [`ShimContext::post_device_fatal`] posts only once.
pub fn post_device_fatal_to_all_contexts() {
    // A thread blocked in ibv_get_cq_event must not wait for ever: every completion channel
    // gets a record that says the device is gone (crate::verbs::events).
    COMP_CHANNELS.for_each_live(crate::verbs::events::wake_for_device_loss);
    CONTEXTS.for_each_live(|addr| {
        // SAFETY: `addr` is registered and the registry lock is held, so it is the context
        // member of a live Box<ShimContext> that ibv_close_device cannot free meanwhile (it
        // unregisters under the same lock first).
        let ctx = unsafe {
            &*(addr as *const u8)
                .sub(CONTEXT_OFFSET)
                .cast::<ShimContext>()
        };
        ctx.post_device_fatal();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_record_roundtrip_and_length_check() {
        let r = AsyncEventRecord {
            element: 1,
            event_type: IBV_EVENT_PORT_ACTIVE as u32,
        };
        assert_eq!(AsyncEventRecord::from_bytes(&r.to_bytes()), Some(r));
        assert_eq!(AsyncEventRecord::from_bytes(&[0u8; 15]), None);
    }

    #[test]
    fn c_string_truncates_with_nul() {
        let mut buf = [1 as c_char; 4];
        write_c_string(&mut buf, "abcdef");
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
    }

    #[test]
    fn registry_rejects_unknown_and_double_remove() {
        let r = Registry::new();
        let x = 5u32;
        assert!(!r.contains(&x as *const u32));
        r.insert(&x as *const u32);
        assert!(r.contains(&x as *const u32));
        assert!(r.remove(&x as *const u32));
        assert!(!r.remove(&x as *const u32));
        assert!(!r.contains(std::ptr::null::<u32>()));
    }

    #[test]
    fn a_remembered_address_is_forgotten_when_anything_is_removed() {
        let (r, other) = (Registry::new(), Registry::new());
        let xs = [1u64, 2, 3, 4, 5, 6];
        for x in &xs {
            r.insert(x as *const u64);
        }
        // Remembered here (more than the cache holds, so some were made room for).
        for _ in 0..2 {
            for x in &xs {
                assert!(r.contains(x as *const u64));
            }
        }
        assert!(
            !other.contains(&xs[0] as *const u64),
            "each registry its own"
        );
        // Removed by another thread: this one must not answer from what it remembered.
        std::thread::scope(|s| {
            s.spawn(|| assert!(r.remove(&xs[5] as *const u64)));
        });
        assert!(!r.contains(&xs[5] as *const u64));
        assert!(r.contains(&xs[4] as *const u64));
        r.insert(&xs[5] as *const u64);
        assert!(r.contains(&xs[5] as *const u64), "live again");
    }

    #[test]
    fn context_offset_is_rdma_core_44() {
        assert_eq!(CONTEXT_OFFSET, 320);
        assert_eq!(std::mem::size_of::<VerbsContext>(), 648);
    }
}
