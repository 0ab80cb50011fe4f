//! What the model keeps of one rank's schedule: per phase, the messages and
//! bytes it moves by link class (a [`PhaseLoad`]), with runs of equal
//! consecutive phases kept once (a ring's 2(n − 1) steps are a handful of
//! runs when its chunks are alike), so an estimate's memory and time follow
//! the runs, not the phases.

use super::super::ir::{Schedule, Step};
use super::super::topology::Topology;
use crate::fabric::pathfind::Fabric;
use std::cell::Cell;

/// What one rank moves in one phase.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub(super) struct PhaseLoad {
    pub shm_msgs: usize,
    pub shm_bytes: usize,
    pub tcp_out: usize,
    pub tcp_in: usize,
    pub tcp_msgs_out: usize,
    pub tcp_msgs_in: usize,
    pub local_bytes: usize,
    /// Hosts this rank receives from over TCP, as a bit set (by host index
    /// mod 64: an estimate, not an identity).
    pub tcp_from: u64,
    /// With a fabric: bytes to (from) hosts of other groups, and the
    /// longest one message takes at its host pair's alone rate.
    pub cross_out: usize,
    pub cross_in: usize,
    pub pair_secs: f64,
}

/// A fabric's per-host NIC rates and group of each host, for the model.
/// A host's NIC rate (`fabric::infer::nic_estimates`: the fastest it sent
/// or received alone) is worked out when first asked for: a choice prices
/// a few hosts' ranks, and every host's would read the whole H × H matrix
/// for each new call shape.
pub(super) struct Network<'f> {
    pub fabric: &'f Fabric,
    nic_out: Vec<Cell<f64>>,
    nic_in: Vec<Cell<f64>>,
}

impl<'f> Network<'f> {
    pub fn new(fabric: &'f Fabric) -> Network<'f> {
        let unknown = || (0..fabric.nhosts()).map(|_| Cell::new(f64::NAN)).collect();
        Network {
            fabric,
            nic_out: unknown(),
            nic_in: unknown(),
        }
    }

    /// The fastest host `h` sent at alone.
    pub fn nic_out(&self, h: usize) -> f64 {
        let rate = &self.fabric.rate;
        Self::known(&self.nic_out[h], || {
            (0..rate.len()).filter(|&b| b != h).map(|b| rate[h][b])
        })
    }

    /// The fastest host `h` received at alone.
    pub fn nic_in(&self, h: usize) -> f64 {
        let rate = &self.fabric.rate;
        Self::known(&self.nic_in[h], || {
            (0..rate.len()).filter(|&a| a != h).map(|a| rate[a][h])
        })
    }

    fn known<I: Iterator<Item = f64>>(cell: &Cell<f64>, rates: impl Fn() -> I) -> f64 {
        if cell.get().is_nan() {
            cell.set(rates().fold(0.0f64, f64::max));
        }
        cell.get()
    }

    /// Seconds for `bytes` at `rate` bytes/s (a rate never measured: free,
    /// the other terms decide).
    pub fn secs(bytes: usize, rate: f64) -> f64 {
        if rate > 0.0 && rate.is_finite() {
            bytes as f64 / rate
        } else {
            0.0
        }
    }
}

/// One rank's loads, phase after phase, equal consecutive phases as one run
/// (see [`super::Pricing::loads`]).
#[derive(Debug, PartialEq)]
pub struct RankLoads {
    pub(super) rank: usize,
    /// (load, phases it lasts), never 0 phases.
    pub(super) runs: Vec<(PhaseLoad, usize)>,
}

impl RankLoads {
    pub(super) fn new(rank: usize) -> RankLoads {
        RankLoads {
            rank,
            runs: Vec::new(),
        }
    }

    /// Appends `times` phases of load `p`.
    pub(super) fn push(&mut self, p: PhaseLoad, times: usize) {
        if times == 0 {
            return;
        }
        match self.runs.last_mut() {
            Some((last, k)) if *last == p => *k += times,
            _ => self.runs.push((p, times)),
        }
    }

    /// The number of phases.
    pub fn phases(&self) -> usize {
        self.runs.iter().map(|r| r.1).sum()
    }
}

/// A phase's load before its shared-memory bytes are settled: what
/// phases laid over each other (a pipeline's segments) add up.
#[derive(Default, Clone, Copy, PartialEq)]
pub(super) struct RawLoad {
    load: PhaseLoad,
    shm_out: usize,
    shm_in: usize,
}

impl RawLoad {
    /// This phase and `o` in one.
    pub fn add(&mut self, o: &RawLoad) {
        let (p, q) = (&mut self.load, &o.load);
        p.shm_msgs += q.shm_msgs;
        p.tcp_out += q.tcp_out;
        p.tcp_in += q.tcp_in;
        p.tcp_msgs_out += q.tcp_msgs_out;
        p.tcp_msgs_in += q.tcp_msgs_in;
        p.local_bytes += q.local_bytes;
        p.tcp_from |= q.tcp_from;
        p.cross_out += q.cross_out;
        p.cross_in += q.cross_in;
        p.pair_secs = p.pair_secs.max(q.pair_secs);
        self.shm_out += o.shm_out;
        self.shm_in += o.shm_in;
    }

    /// Nothing moved or computed: a phase without steps.
    pub fn is_empty(&self) -> bool {
        self.load == PhaseLoad::default() && self.shm_out == 0 && self.shm_in == 0
    }

    pub fn finish(mut self) -> PhaseLoad {
        // A shared-memory message costs its receiver the copy; the sender's
        // side is one copy into the ring, counted as well.
        self.load.shm_bytes = self.shm_out.max(self.shm_in);
        self.load
    }
}

/// One rank's messages in one phase, classified as the model sees them:
/// the one place that says what a message costs which side.
pub(super) struct PhaseAcc<'a> {
    topo: &'a Topology,
    net: Option<&'a Network<'a>>,
    es: usize,
    me: usize,
    raw: RawLoad,
}

impl<'a> PhaseAcc<'a> {
    pub fn new(topo: &'a Topology, net: Option<&'a Network<'a>>, es: usize, rank: usize) -> Self {
        PhaseAcc {
            topo,
            net,
            es,
            me: topo.host_of(rank),
            raw: RawLoad::default(),
        }
    }

    /// With a fabric: (crosses a group boundary, seconds at the pair's
    /// rate) of `bytes` from host `from` to host `to`.
    fn pair(&self, from: usize, to: usize, bytes: usize) -> (bool, f64) {
        match self.net {
            None => (false, 0.0),
            Some(n) => (
                n.fabric.group_of[from] != n.fabric.group_of[to],
                Network::secs(bytes, n.fabric.rate[from][to]),
            ),
        }
    }

    /// `len` elements to `peer` as `k` messages, the longest `longest`.
    pub fn send(&mut self, peer: usize, len: usize, k: usize, longest: usize) {
        self.send_to_host(self.topo.host_of(peer), len, k, longest)
    }

    /// [`PhaseAcc::send`] to a rank on host `to`.
    pub fn send_to_host(&mut self, to: usize, len: usize, k: usize, longest: usize) {
        let bytes = len * self.es;
        if to == self.me {
            self.raw.load.shm_msgs += k;
            self.raw.shm_out += bytes;
        } else {
            let (cross, secs) = self.pair(self.me, to, longest * self.es);
            let p = &mut self.raw.load;
            p.tcp_msgs_out += k;
            p.tcp_out += bytes;
            p.cross_out += if cross { bytes } else { 0 };
            p.pair_secs = p.pair_secs.max(secs);
        }
    }

    /// `len` elements from `peer` as `k` messages, the longest `longest`,
    /// reduced on arrival or not.
    pub fn recv(&mut self, peer: usize, len: usize, k: usize, longest: usize, reduce: bool) {
        self.recv_from_host(self.topo.host_of(peer), len, k, longest, reduce)
    }

    /// [`PhaseAcc::recv`] from a rank on host `from`.
    pub fn recv_from_host(
        &mut self,
        from: usize,
        len: usize,
        k: usize,
        longest: usize,
        reduce: bool,
    ) {
        let bytes = len * self.es;
        if from == self.me {
            self.raw.load.shm_msgs += k;
            self.raw.shm_in += bytes;
        } else {
            let (cross, secs) = self.pair(from, self.me, longest * self.es);
            let p = &mut self.raw.load;
            p.tcp_msgs_in += k;
            p.tcp_in += bytes;
            p.cross_in += if cross { bytes } else { 0 };
            p.pair_secs = p.pair_secs.max(secs);
            if len > 0 {
                p.tcp_from |= 1 << (from % 64);
            }
        }
        if reduce {
            self.raw.load.local_bytes += bytes;
        }
    }

    /// `len` elements of local copying or reducing.
    pub fn local(&mut self, len: usize) {
        self.raw.load.local_bytes += len * self.es;
    }

    /// The phase's load; the accumulator starts the next phase empty.
    pub fn take(&mut self) -> PhaseLoad {
        self.take_raw().finish()
    }

    /// [`PhaseAcc::take`] before its shared-memory bytes are settled.
    pub fn take_raw(&mut self) -> RawLoad {
        std::mem::take(&mut self.raw)
    }
}

/// The loads of a built schedule.
pub(super) fn of_schedule(
    s: &Schedule,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> RankLoads {
    let mut acc = PhaseAcc::new(topo, net, es, s.rank);
    let mut out = RankLoads::new(s.rank);
    for phase in &s.phases {
        for step in &phase.steps {
            match step {
                Step::Send { peer, src } => acc.send(*peer, src.len, 1, src.len),
                Step::Recv {
                    peer,
                    dst,
                    reduce_with,
                } => acc.recv(*peer, dst.len, 1, dst.len, reduce_with.is_some()),
                Step::Copy { src, .. } | Step::Reduce { src, .. } | Step::Fold { src, .. } => {
                    acc.local(src.len)
                }
            }
        }
        out.push(acc.take(), 1);
    }
    out
}
