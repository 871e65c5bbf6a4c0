//! Shared by the congestion-control tests: long-running RDMA WRITE flows in the simulator,
//! kept busy by re-posting as work requests complete (as `ib_write_bw` does).

#![allow(dead_code)]

use proto::sim::Sim;
use proto::transport::*;
use proto::types::Qpn;

pub const US: Nanos = 1_000;
pub const MS: Nanos = 1_000_000;

/// A sender QP writing `msg` bytes at a time into one MR of the receiver, with `depth`
/// requests outstanding.
#[derive(Debug, Clone, Copy)]
pub struct Flow {
    pub node: usize,
    pub qpn: Qpn,
    pub remote_qpn: Qpn,
    pub local: (u64, MrKeys),
    pub remote: (u64, MrKeys),
    pub msg: u32,
    pub depth: usize,
    /// The flow posts nothing before this time.
    pub start: Nanos,
    pub posted: u64,
}

impl Flow {
    /// Connects `node` to `receiver` with `o` and registers the buffers.
    pub fn new(
        sim: &mut Sim,
        node: usize,
        receiver: usize,
        o: &proto::sim::QpOptions,
        msg: u32,
        depth: usize,
    ) -> Flow {
        let (qpn, remote_qpn) = sim.connect(node, receiver, o);
        let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
        let local = sim.alloc_mr(node, msg as usize, acc);
        let remote = sim.alloc_mr(receiver, msg as usize, acc);
        Flow {
            node,
            qpn,
            remote_qpn,
            local,
            remote,
            msg,
            depth,
            start: 0,
            posted: 0,
        }
    }

    /// Posts until `depth` requests are outstanding.
    pub fn refill(&mut self, sim: &mut Sim) {
        if sim.now < self.start {
            return;
        }
        while sim.outstanding(self.node, self.qpn) < self.depth {
            let wr = SendWr::new(
                self.posted,
                SendOp::Write(RemoteAddr {
                    va: self.remote.0,
                    rkey: self.remote.1.rkey,
                }),
                Some(Sge {
                    addr: self.local.0,
                    length: self.msg,
                    lkey: self.local.1.lkey,
                }),
            );
            sim.post_send(self.node, self.qpn, wr).expect("post_send");
            self.posted += 1;
        }
    }
}

/// Runs the simulation until `end`, keeping every flow busy; `every` is called after each
/// step (for sampling).
pub fn drive(sim: &mut Sim, flows: &mut [Flow], end: Nanos, mut every: impl FnMut(&mut Sim)) {
    let mut seen = usize::MAX;
    let mut started = 0;
    while sim.now < end {
        // Posting is needed only when something completed or a flow's start came.
        let now_started = flows.iter().filter(|f| f.start <= sim.now).count();
        if sim.completions.len() != seen || now_started != started {
            seen = sim.completions.len();
            started = now_started;
            for f in flows.iter_mut() {
                f.refill(sim);
            }
        }
        // Flows that start later need the clock to reach them even when nothing else moves.
        let next_start = flows
            .iter()
            .filter(|f| f.start > sim.now)
            .map(|f| f.start)
            .min()
            .unwrap_or(end);
        if !sim.step(next_start.min(end)) {
            if next_start >= end {
                break;
            }
            sim.now = next_start;
        }
        every(sim);
    }
}

/// The data bytes (IP packet lengths of RDMA WRITE requests) `node` sent in `[from, to)`,
/// from the simulator's trace.
pub fn sent_bytes(sim: &Sim, node: usize, from: Nanos, to: Nanos) -> u64 {
    sim.trace
        .iter()
        .filter(|i| i.from == node && i.time >= from && i.time < to && i.opcode.0 < 0x0c)
        .map(|i| i.len as u64)
        .sum()
}
