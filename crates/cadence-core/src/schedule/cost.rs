//! The α-β-γ cost model the tuner ranks algorithms with.
//!
//! Terms:
//! - **link class**: shared memory (both ranks on one host) or TCP (between
//!   hosts). Each has an **α**, the fixed cost of one message (seconds), and a
//!   **β**, the cost of one byte (seconds per byte, 1/bandwidth).
//! - **γ**: the cost of one byte of local work (a reduction on arrival, a
//!   local copy or reduce step).
//! - **NIC share**: TCP messages leaving (or entering) one host in one phase
//!   share that host's link, so a phase's TCP time is α plus the bytes of the
//!   whole host, not of one rank, times β. That is what makes a flat ring or
//!   `direct` expensive across hosts with several ranks each, and what the
//!   hierarchical schedules avoid.
//!
//! A rank's time is the sum over its phases of
//! `max(shared-memory part, TCP part) + γ · local bytes`, where the
//! shared-memory part is α per message plus its shared-memory bytes times β
//! (the engine moves them one after another on one thread), and the TCP part
//! is `α · (1 + serial · (k − 1))` for the rank's k TCP messages in the
//! phase (their latencies overlap only in part: one thread posts them and
//! handles their arrivals) plus the host's TCP bytes times β. The estimate
//! of a schedule set is its slowest rank. It ignores skew between ranks and overlap across
//! phases: it ranks algorithms; it does not predict wall time to the percent.
//!
//! **With a measured fabric** (a topology file or the start-up profile:
//! [`Fabric`], indexed like the topology's hosts) the TCP bytes cost what
//! the network measured instead of one β for every host pair: a host's
//! bytes over its NIC's rate (the fastest it sent or received alone), each
//! message at least its size over its host pair's alone rate, and the bytes
//! every rank of a group (a rack) sends out of it (receives into it) in one
//! phase over the group's shared capacity. A ring that crosses an
//! oversubscribed uplink twice then costs what it runs at, and `auto` can
//! tell hierarchical in the found order from a torus in rank order.

use super::ir::{Schedule, Step};
use super::topology::Topology;
use crate::fabric::pathfind::Fabric;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkCost {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte.
    pub beta: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub shm: LinkCost,
    pub tcp: LinkCost,
    /// Seconds per byte of local reduction or copy.
    pub gamma: f64,
    /// Incast: when a host receives from k other hosts in one phase, its
    /// TCP bytes cost `β · (1 + incast · (k-1))`. Flows from several hosts
    /// converge on one switch port and finish unevenly, so `direct` (k =
    /// n-1) trails the ring (k = 1), which moves the same bytes.
    pub incast: f64,
    /// The share of each further concurrent TCP message's α that a phase
    /// pays (0: latencies overlap fully, 1: messages go one after another).
    /// One thread posts the messages and handles their arrivals, so their
    /// latencies overlap only in part; the default was fitted on the
    /// emulated cluster.
    #[serde(default = "default_tcp_serial")]
    pub tcp_serial: f64,
}

fn default_tcp_serial() -> f64 {
    0.7
}

impl Default for CostModel {
    /// Rough figures for a current x86 server: 1 µs / 8 GB/s through shared
    /// memory, 50 µs / 1.25 GB/s (10 Gbit/s) over TCP, 4 GB/s of reduction.
    /// Calibration (start-up across hosts, `cadence tune`) replaces them.
    fn default() -> Self {
        CostModel {
            shm: LinkCost {
                alpha: 1e-6,
                beta: 1.0 / 8e9,
            },
            tcp: LinkCost {
                alpha: 50e-6,
                beta: 1.0 / 1.25e9,
            },
            gamma: 1.0 / 4e9,
            incast: 0.1,
            tcp_serial: default_tcp_serial(),
        }
    }
}

/// What one rank moves in one phase.
#[derive(Default, Clone, Copy)]
struct PhaseLoad {
    shm_msgs: usize,
    shm_bytes: usize,
    tcp_out: usize,
    tcp_in: usize,
    tcp_msgs_out: usize,
    tcp_msgs_in: usize,
    local_bytes: usize,
    /// Hosts this rank receives from over TCP, as a bit set (by host index
    /// mod 64: an estimate, not an identity).
    tcp_from: u64,
    /// With a fabric: bytes to (from) hosts of other groups, and the
    /// longest one message takes at its host pair's alone rate.
    cross_out: usize,
    cross_in: usize,
    pair_secs: f64,
}

/// A fabric's per-host NIC rates and group of each host, for the model.
struct Network<'f> {
    fabric: &'f Fabric,
    nic_out: Vec<f64>,
    nic_in: Vec<f64>,
}

impl<'f> Network<'f> {
    fn new(fabric: &'f Fabric) -> Network<'f> {
        let (nic_out, nic_in) = crate::fabric::infer::nic_estimates(&fabric.rate);
        Network {
            fabric,
            nic_out,
            nic_in,
        }
    }

    /// Seconds for `bytes` at `rate` bytes/s (a rate never measured: free,
    /// the other terms decide).
    fn secs(bytes: usize, rate: f64) -> f64 {
        if rate > 0.0 && rate.is_finite() {
            bytes as f64 / rate
        } else {
            0.0
        }
    }
}

impl CostModel {
    /// Whether an estimate over some ranks' schedules bounds the estimate
    /// over all of them from below: every term grows with a host's summed
    /// bytes and senders only while no parameter is negative.
    pub fn bounds_hold(&self) -> bool {
        [
            self.shm.alpha,
            self.shm.beta,
            self.tcp.alpha,
            self.tcp.beta,
            self.gamma,
            self.incast,
            self.tcp_serial,
        ]
        .iter()
        .all(|&v| v >= 0.0)
    }

    /// Estimated seconds for one call, given every rank's schedule (in rank
    /// order) on `topo`, with elements of `elem_size` bytes.
    pub fn estimate(&self, schedules: &[Schedule], topo: &Topology, elem_size: usize) -> f64 {
        self.estimate_on(schedules, topo, None, elem_size)
    }

    /// [`CostModel::estimate`] on a measured `fabric` (see the module's
    /// comment); `None`: one TCP class for every host pair. A fabric that
    /// does not have `topo`'s hosts is ignored.
    ///
    /// Given the schedules of only some ranks (each knows its rank), it is
    /// a lower bound of the estimate over all of them: a host's shared
    /// bytes and senders are summed over fewer ranks, and the slowest rank
    /// is looked for among fewer (every parameter at least 0: see
    /// [`CostModel::bounds_hold`]).
    pub fn estimate_on(
        &self,
        schedules: &[Schedule],
        topo: &Topology,
        fabric: Option<&Fabric>,
        elem_size: usize,
    ) -> f64 {
        let pricing = Pricing::new(topo, fabric, elem_size);
        let loads: Vec<RankLoads> = schedules.iter().map(|s| pricing.loads(s)).collect();
        self.estimate_loads(&loads, &pricing)
    }

    /// [`CostModel::estimate_on`] of the schedules whose loads these are
    /// ([`Pricing::loads`]): an estimate keeps a few words a phase of each
    /// rank, not its steps, so a caller can drop each schedule once read.
    pub fn estimate_loads(&self, ranks: &[RankLoads], pricing: &Pricing) -> f64 {
        let (topo, net) = (pricing.topo, pricing.net.as_ref());
        let loads: Vec<&Vec<PhaseLoad>> = ranks.iter().map(|r| &r.phases).collect();
        let nphases = loads.iter().map(|l| l.len()).max().unwrap_or(0);
        // The hosts of the given ranks, numbered densely (`slot`), so a few
        // ranks' bound costs their hosts, not every host.
        let mut slot = vec![u32::MAX; topo.nhosts()];
        let mut nslots = 0;
        let host_slots: Vec<usize> = ranks
            .iter()
            .map(|s| {
                let h = topo.host_of(s.rank);
                if slot[h] == u32::MAX {
                    slot[h] = nslots as u32;
                    nslots += 1;
                }
                slot[h] as usize
            })
            .collect();
        // Per host and phase index: TCP bytes out of and into the host.
        let mut host_out = vec![vec![0usize; nphases]; nslots];
        let mut host_in = vec![vec![0usize; nphases]; nslots];
        let mut host_from = vec![vec![0u64; nphases]; nslots];
        // Per group and phase: bytes leaving and entering the group.
        let ngroups = net.map_or(0, |n| n.fabric.group_out.len());
        let mut group_out = vec![vec![0usize; nphases]; ngroups];
        let mut group_in = vec![vec![0usize; nphases]; ngroups];
        for ((phases, s), &hs) in loads.iter().zip(ranks).zip(&host_slots) {
            for (i, p) in phases.iter().enumerate() {
                host_out[hs][i] += p.tcp_out;
                host_in[hs][i] += p.tcp_in;
                host_from[hs][i] |= p.tcp_from;
                if let Some(n) = net {
                    let g = n.fabric.group_of[topo.host_of(s.rank)];
                    group_out[g][i] += p.cross_out;
                    group_in[g][i] += p.cross_in;
                }
            }
        }
        loads
            .iter()
            .zip(ranks)
            .zip(&host_slots)
            .map(|((phases, s), &hs)| {
                let h = topo.host_of(s.rank);
                phases
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        // One thread handles every shared-memory message in
                        // turn, so each costs its α.
                        let shm =
                            p.shm_msgs as f64 * self.shm.alpha + p.shm_bytes as f64 * self.shm.beta;
                        let tcp = if p.tcp_out + p.tcp_in > 0 {
                            let k = host_from[hs][i].count_ones().max(1) as f64;
                            let incast = 1.0 + self.incast * (k - 1.0);
                            let msgs = p.tcp_msgs_out.max(p.tcp_msgs_in).max(1) as f64;
                            let alpha = self.tcp.alpha * (1.0 + self.tcp_serial * (msgs - 1.0));
                            let wire = match net {
                                None => {
                                    let bytes = host_out[hs][i].max(host_in[hs][i]);
                                    bytes as f64 * self.tcp.beta * incast
                                }
                                Some(n) => {
                                    let g = n.fabric.group_of[h];
                                    let nic = Network::secs(host_out[hs][i], n.nic_out[h])
                                        .max(Network::secs(host_in[hs][i], n.nic_in[h]));
                                    let shared =
                                        Network::secs(group_out[g][i], n.fabric.group_out[g]).max(
                                            Network::secs(group_in[g][i], n.fabric.group_in[g]),
                                        );
                                    (nic * incast).max(p.pair_secs).max(shared)
                                }
                            };
                            alpha + wire
                        } else {
                            0.0
                        };
                        shm.max(tcp) + p.local_bytes as f64 * self.gamma
                    })
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
    }
}

/// What pricing schedules on one topology (and measured fabric) needs once.
pub struct Pricing<'t> {
    topo: &'t Topology,
    net: Option<Network<'t>>,
    elem_size: usize,
}

impl<'t> Pricing<'t> {
    /// A fabric that does not have `topo`'s hosts is ignored.
    pub fn new(topo: &'t Topology, fabric: Option<&'t Fabric>, elem_size: usize) -> Pricing<'t> {
        let net = fabric
            .filter(|f| f.nhosts() == topo.nhosts())
            .map(Network::new);
        Pricing {
            topo,
            net,
            elem_size,
        }
    }

    /// What an estimate keeps of a rank's schedule.
    pub fn loads(&self, s: &Schedule) -> RankLoads {
        RankLoads {
            rank: s.rank,
            phases: phase_loads(s, self.topo, self.net.as_ref(), self.elem_size),
        }
    }
}

/// One rank's loads per phase (see [`Pricing::loads`]).
pub struct RankLoads {
    rank: usize,
    phases: Vec<PhaseLoad>,
}

fn phase_loads(s: &Schedule, topo: &Topology, net: Option<&Network>, es: usize) -> Vec<PhaseLoad> {
    let me = topo.host_of(s.rank);
    // With a fabric: (crosses a group boundary, seconds at the pair's rate).
    let pair = |from: usize, to: usize, bytes: usize| -> (bool, f64) {
        match net {
            None => (false, 0.0),
            Some(n) => (
                n.fabric.group_of[from] != n.fabric.group_of[to],
                Network::secs(bytes, n.fabric.rate[from][to]),
            ),
        }
    };
    s.phases
        .iter()
        .map(|phase| {
            let mut p = PhaseLoad::default();
            let (mut shm_out, mut shm_in) = (0, 0);
            for step in &phase.steps {
                match step {
                    Step::Send { peer, src } => {
                        if topo.host_of(*peer) == me {
                            p.shm_msgs += 1;
                            shm_out += src.len * es;
                        } else {
                            let bytes = src.len * es;
                            p.tcp_msgs_out += 1;
                            p.tcp_out += bytes;
                            let (cross, secs) = pair(me, topo.host_of(*peer), bytes);
                            p.cross_out += if cross { bytes } else { 0 };
                            p.pair_secs = p.pair_secs.max(secs);
                        }
                    }
                    Step::Recv {
                        peer,
                        dst,
                        reduce_with,
                    } => {
                        if topo.host_of(*peer) == me {
                            p.shm_msgs += 1;
                            shm_in += dst.len * es;
                        } else {
                            let bytes = dst.len * es;
                            p.tcp_msgs_in += 1;
                            p.tcp_in += bytes;
                            let (cross, secs) = pair(topo.host_of(*peer), me, bytes);
                            p.cross_in += if cross { bytes } else { 0 };
                            p.pair_secs = p.pair_secs.max(secs);
                            if dst.len > 0 {
                                p.tcp_from |= 1 << (topo.host_of(*peer) % 64);
                            }
                        }
                        if reduce_with.is_some() {
                            p.local_bytes += dst.len * es;
                        }
                    }
                    Step::Copy { src, .. } | Step::Reduce { src, .. } | Step::Fold { src, .. } => {
                        p.local_bytes += src.len * es;
                    }
                }
            }
            // A shared-memory message costs its receiver the copy; the
            // sender's side is one copy into the ring, counted as well.
            p.shm_bytes = shm_out.max(shm_in);
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{algos_for, applicable_on, build_on, Algo, CollArgs};
    use crate::types::CollKind;

    fn best(kind: CollKind, bytes: usize, topo: &Topology, m: &CostModel) -> Algo {
        let n = topo.nranks();
        let counts = match kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => vec![bytes / 4],
            _ => vec![bytes / 4 / n; n],
        };
        let args = CollArgs {
            kind,
            root: 0,
            counts,
        };
        algos_for(kind)
            .iter()
            .copied()
            .filter(|&a| applicable_on(&args, topo, a))
            .map(|a| {
                let s: Vec<_> = (0..n)
                    .map(|r| build_on(&args, r, topo, a).unwrap())
                    .collect();
                (m.estimate(&s, topo, 4), a)
            })
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .unwrap()
            .1
    }

    /// The emulated cluster: 1 Gbit/s links, ~150 µs per TCP message.
    fn cluster() -> CostModel {
        CostModel {
            tcp: LinkCost {
                alpha: 150e-6,
                beta: 1.0 / 0.119e9,
            },
            ..CostModel::default()
        }
    }

    #[test]
    fn latency_wins_small_bandwidth_wins_large() {
        let one_host = Topology::single_host(8);
        let m = CostModel::default();
        assert_eq!(
            best(CollKind::AllReduce, 64, &one_host, &m),
            Algo::RecursiveDoubling
        );
        // Large: one of the bandwidth-optimal ones (ring, or Rabenseifner's
        // halving and doubling, which moves the same bytes in fewer steps).
        let hosts = Topology::from_hosts(&[0, 1, 2, 3]);
        let large = best(CollKind::AllReduce, 64 << 20, &hosts, &cluster());
        assert!(
            matches!(large, Algo::Ring | Algo::Rabenseifner),
            "{large:?}"
        );
    }

    #[test]
    fn several_ranks_per_host_go_hierarchical() {
        let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]);
        // The 2×4 torus puts each host's two ranks in a row: on this layout
        // it is hierarchical too (rows in shared memory, columns across).
        for bytes in [64 << 10, 1 << 20, 64 << 20] {
            let a = best(CollKind::AllReduce, bytes, &t, &cluster());
            assert!(
                matches!(a, Algo::Hierarchical | Algo::Torus2d),
                "{bytes} B: {a:?}"
            );
        }
    }

    /// Racks {0, 2} and {1, 3}: 1 Gbit/s hosts, 250 Mbit/s uplinks.
    fn interleaved_racks() -> Fabric {
        let (fast, slow) = (1.25e8, 3.125e7);
        Fabric {
            rate: (0..4)
                .map(|a| {
                    (0..4)
                        .map(|b| match (a == b, a % 2 == b % 2) {
                            (true, _) => 0.0,
                            (false, true) => fast,
                            (false, false) => slow,
                        })
                        .collect()
                })
                .collect(),
            group_of: vec![0, 1, 0, 1],
            group_out: vec![slow; 2],
            group_in: vec![slow; 2],
        }
    }

    #[test]
    fn a_measured_fabric_charges_shared_uplinks() {
        let f = interleaved_racks();
        let m = cluster();
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![16 << 20],
        };
        let ring = |t: &Topology| {
            let s: Vec<_> = (0..t.nranks())
                .map(|r| build_on(&args, r, t, Algo::Ring).unwrap())
                .collect();
            m.estimate_on(&s, t, Some(&f), 4)
        };
        // One rank per host: rank order crosses each uplink twice a step,
        // the found order once.
        let rank_order = Topology::from_hosts(&[0, 1, 2, 3]);
        let found = rank_order.clone().with_host_order(&[0, 2, 1, 3]).unwrap();
        let (slow, fast) = (ring(&rank_order), ring(&found));
        assert!((slow / fast - 2.0).abs() < 0.05, "{slow} vs {fast}");
        // 64 MiB: each step moves a quarter per flow; 6 steps at 250 Mbit/s.
        let at_uplink = 6.0 * (16 << 20) as f64 / 3.125e7;
        assert!(
            (fast / at_uplink - 1.0).abs() < 0.05,
            "{fast} vs {at_uplink}"
        );
        // Without the fabric the model cannot tell the orders apart.
        let plain = |t: &Topology| {
            let s: Vec<_> = (0..4)
                .map(|r| build_on(&args, r, t, Algo::Ring).unwrap())
                .collect();
            m.estimate(&s, t, 4)
        };
        assert_eq!(plain(&rank_order), plain(&found));
    }

    #[test]
    fn with_racks_auto_takes_hierarchical_in_the_found_order() {
        // Two ranks per host on 4 hosts with two racks (docs/topology.md): a
        // torus keeps rank order and crosses the uplinks often.
        let f = interleaved_racks();
        let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3])
            .with_host_order(&[0, 2, 1, 3])
            .unwrap();
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![16 << 20],
        };
        let m = cluster();
        let cost = |a| {
            let s: Vec<_> = (0..8).map(|r| build_on(&args, r, &t, a).unwrap()).collect();
            m.estimate_on(&s, &t, Some(&f), 4)
        };
        let best = algos_for(CollKind::AllReduce)
            .iter()
            .copied()
            .filter(|&a| applicable_on(&args, &t, a))
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
            .unwrap();
        assert_eq!(best, Algo::Hierarchical, "{:?}", cost(Algo::Torus2d));
    }

    #[test]
    fn host_traffic_is_shared() {
        // Two ranks per host sending across at once take twice one's time.
        let t = Topology::from_hosts(&[0, 0, 1, 1]);
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![1 << 20],
        };
        let m = cluster();
        let s = |a| {
            (0..4)
                .map(|r| build_on(&args, r, &t, a).unwrap())
                .collect::<Vec<_>>()
        };
        let flat = m.estimate(&s(Algo::Ring), &t, 4);
        let hier = m.estimate(&s(Algo::Hierarchical), &t, 4);
        assert!(hier < flat, "hierarchical {hier} vs ring {flat}");
    }
}
