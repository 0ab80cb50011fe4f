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

mod closed;
mod loads;

use super::ir::{Algo, CollArgs, Schedule};
use super::topology::Topology;
use super::ScheduleError;
use crate::fabric::pathfind::Fabric;
pub use loads::RankLoads;
use loads::{Network, PhaseLoad};
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
    /// ([`Pricing::loads`]): an estimate keeps a few words a run of equal
    /// phases of each rank, not its steps, so a caller can drop each
    /// schedule once read.
    ///
    /// Each host's phases are cut where any of its given ranks' runs (or,
    /// with a fabric, its group's sums) change, and each piece's cost is
    /// worked out once, so the work follows the runs (but for one addition
    /// a phase).
    pub fn estimate_loads(&self, ranks: &[RankLoads], pricing: &Pricing) -> f64 {
        let (topo, net) = (pricing.topo, pricing.net.as_ref());
        // The given ranks by host, hosts numbered densely in order of first
        // appearance (`slot`), so a few ranks' bound costs their hosts only.
        let mut slot = vec![u32::MAX; topo.nhosts()];
        let mut on_host: Vec<Vec<&RankLoads>> = Vec::new();
        for r in ranks {
            let h = topo.host_of(r.rank);
            if slot[h] == u32::MAX {
                slot[h] = on_host.len() as u32;
                on_host.push(Vec::new());
            }
            on_host[slot[h] as usize].push(r);
        }
        // Per group: the bytes its given ranks send out of it and receive
        // into it, piece by piece.
        let group_sums: Vec<Piecewise> = match net {
            None => Vec::new(),
            Some(n) => {
                let mut members = vec![Vec::new(); n.fabric.group_out.len()];
                for r in ranks {
                    members[n.fabric.group_of[topo.host_of(r.rank)]].push(r);
                }
                members.iter().map(|m| Piecewise::of_cross(m)).collect()
            }
        };
        let mut slowest = 0.0f64;
        for members in &on_host {
            let h = topo.host_of(members[0].rank);
            let group = net.map(|n| (n, n.fabric.group_of[h]));
            let mut ends: Vec<usize> = members.iter().flat_map(|r| run_ends(&r.runs)).collect();
            if let Some((_, g)) = group {
                ends.extend(group_sums[g].ends.iter().copied());
            }
            ends.sort_unstable();
            ends.dedup();
            let mut at: Vec<Cursor> = members.iter().map(|r| Cursor::new(&r.runs)).collect();
            let mut group_at = 0;
            let mut totals = vec![0.0f64; members.len()];
            let mut loads = vec![PhaseLoad::default(); members.len()];
            let mut start = 0;
            for end in ends {
                for (l, c) in loads.iter_mut().zip(&mut at) {
                    *l = c.at(start);
                }
                let host_out: usize = loads.iter().map(|p| p.tcp_out).sum();
                let host_in: usize = loads.iter().map(|p| p.tcp_in).sum();
                let host_from = loads.iter().fold(0u64, |f, p| f | p.tcp_from);
                let shared = match group {
                    None => 0.0,
                    Some((n, g)) => {
                        let (out, inn) = group_sums[g].at(&mut group_at, start);
                        Network::secs(out, n.fabric.group_out[g])
                            .max(Network::secs(inn, n.fabric.group_in[g]))
                    }
                };
                let host = HostPhase {
                    host: h,
                    out: host_out,
                    inn: host_in,
                    from: host_from,
                    shared,
                };
                for (p, t) in loads.iter().zip(&mut totals) {
                    if *p != PhaseLoad::default() {
                        // Added phase by phase, not multiplied: the same
                        // sum to the last bit as pricing each phase, so
                        // near-ties fall as they always did.
                        let c = self.phase_cost(p, &host, net);
                        for _ in start..end {
                            *t += c;
                        }
                    }
                }
                start = end;
            }
            slowest = totals.into_iter().fold(slowest, f64::max);
        }
        slowest
    }

    /// One phase of one rank, given what its host (and group) move then.
    fn phase_cost(&self, p: &PhaseLoad, host: &HostPhase, net: Option<&Network>) -> f64 {
        // One thread handles every shared-memory message in turn, so each
        // costs its α.
        let shm = p.shm_msgs as f64 * self.shm.alpha + p.shm_bytes as f64 * self.shm.beta;
        let tcp = if p.tcp_out + p.tcp_in > 0 {
            let k = host.from.count_ones().max(1) as f64;
            let incast = 1.0 + self.incast * (k - 1.0);
            let msgs = p.tcp_msgs_out.max(p.tcp_msgs_in).max(1) as f64;
            let alpha = self.tcp.alpha * (1.0 + self.tcp_serial * (msgs - 1.0));
            let wire = match net {
                None => host.out.max(host.inn) as f64 * self.tcp.beta * incast,
                Some(n) => {
                    let nic = Network::secs(host.out, n.nic_out(host.host))
                        .max(Network::secs(host.inn, n.nic_in(host.host)));
                    (nic * incast).max(p.pair_secs).max(host.shared)
                }
            };
            alpha + wire
        } else {
            0.0
        };
        shm.max(tcp) + p.local_bytes as f64 * self.gamma
    }
}

/// What a host's given ranks move over TCP in one phase, and the seconds
/// its group's shared capacity needs for the group's bytes then.
struct HostPhase {
    host: usize,
    out: usize,
    inn: usize,
    from: u64,
    shared: f64,
}

/// Where each run of `runs` ends, in phases from the start.
fn run_ends(runs: &[(PhaseLoad, usize)]) -> impl Iterator<Item = usize> + '_ {
    runs.iter().scan(0, |end, r| {
        *end += r.1;
        Some(*end)
    })
}

/// Walks one rank's runs forward: its load in the phase at a position.
struct Cursor<'r> {
    runs: &'r [(PhaseLoad, usize)],
    i: usize,
    end: usize,
}

impl<'r> Cursor<'r> {
    fn new(runs: &'r [(PhaseLoad, usize)]) -> Cursor<'r> {
        Cursor {
            runs,
            i: 0,
            end: runs.first().map_or(0, |r| r.1),
        }
    }

    /// The load at phase `pos` (nothing past the last run); positions
    /// must not go back.
    fn at(&mut self, pos: usize) -> PhaseLoad {
        while self.i < self.runs.len() && self.end <= pos {
            self.i += 1;
            self.end += self.runs.get(self.i).map_or(0, |r| r.1);
        }
        self.runs
            .get(self.i)
            .map_or_else(PhaseLoad::default, |r| r.0)
    }
}

/// Sums of some ranks' group-crossing bytes, constant between `ends`.
struct Piecewise {
    ends: Vec<usize>,
    /// (bytes out of the group, into it) up to each end.
    sums: Vec<(usize, usize)>,
}

impl Piecewise {
    fn of_cross(ranks: &[&RankLoads]) -> Piecewise {
        // (position, sign, out, in): a run adds its bytes where it starts
        // and takes them away where it ends.
        let mut events: Vec<(usize, bool, usize, usize)> = Vec::new();
        for r in ranks {
            let mut start = 0;
            for (p, k) in &r.runs {
                if p.cross_out + p.cross_in > 0 {
                    events.push((start, true, p.cross_out, p.cross_in));
                    events.push((start + k, false, p.cross_out, p.cross_in));
                }
                start += k;
            }
        }
        events.sort_unstable_by_key(|e| e.0);
        let (mut ends, mut sums) = (Vec::new(), Vec::new());
        let (mut out, mut inn) = (0usize, 0usize);
        let mut i = 0;
        while i < events.len() {
            let pos = events[i].0;
            if pos > 0 {
                ends.push(pos);
                sums.push((out, inn));
            }
            while i < events.len() && events[i].0 == pos {
                let (_, add, o, n) = events[i];
                if add {
                    (out, inn) = (out + o, inn + n);
                } else {
                    (out, inn) = (out - o, inn - n);
                }
                i += 1;
            }
        }
        Piecewise { ends, sums }
    }

    /// The sums at phase `pos` (0 past the last end), with `i` a cursor
    /// the caller keeps; positions must not go back.
    fn at(&self, i: &mut usize, pos: usize) -> (usize, usize) {
        while *i < self.ends.len() && self.ends[*i] <= pos {
            *i += 1;
        }
        self.sums.get(*i).copied().unwrap_or((0, 0))
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
        loads::of_schedule(s, self.topo, self.net.as_ref(), self.elem_size)
    }

    /// [`Pricing::loads`] of `rank`'s schedule of `algo` for `args`,
    /// written down without building it where that is known (the
    /// algorithms whose one rank has O(n) phases), else built.
    pub fn loads_of(
        &self,
        args: &CollArgs,
        rank: usize,
        algo: Algo,
    ) -> Result<RankLoads, ScheduleError> {
        if super::check_on(args, self.topo, algo).is_ok() {
            let net = self.net.as_ref();
            if let Some(l) = closed::loads(args, rank, algo, self.topo, net, self.elem_size) {
                return Ok(l);
            }
        }
        super::build_on(args, rank, self.topo, algo).map(|s| self.loads(&s))
    }
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
