//! Running every rank's schedule on a modeled cluster: the executor half of
//! the simulator (issue 15).
//!
//! Semantics, as the engine runs a schedule (first version):
//! - A rank runs its phases one after another. Entering a phase it does the
//!   phase's local steps (`Copy`, `Reduce`: γ per byte), then **posts** the
//!   phase's transfers.
//! - A message is the k-th `Send` from a to b matched with the k-th `Recv`
//!   at b from a (channel order, as on the wire). Transfers are rendezvous:
//!   it starts once both ends have posted it, after the link class's α, as
//!   a flow over its route ([`Model::route`]) sharing links by max-min
//!   fairness ([`super::flows`]).
//! - A reducing receive costs its receiver γ per byte once the bytes are in.
//! - A phase ends when all its transfers are done (and its receiver's
//!   reductions); the rank enters the next.
//!
//! Not modeled yet: the engine's one-phase look-ahead (the next phase's
//! transfers start while the current one finishes), TCP streams per link,
//! CPU contention between ranks on one host.

use super::flows::Flows;
use crate::schedule::{Schedule, Step, Topology};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A cluster as the executor sees it: where ranks live, what links their
/// messages cross, and what things cost.
#[derive(Clone, Debug)]
pub struct Model {
    pub topo: Topology,
    /// Per host: bytes/s its NIC sends and receives.
    pub nic_out: Vec<f64>,
    pub nic_in: Vec<f64>,
    /// Per host its group (rack), and per group what flows out of and into
    /// it share (bytes/s; infinite: no shared uplink).
    pub group_of: Vec<usize>,
    pub group_out: Vec<f64>,
    pub group_in: Vec<f64>,
    /// Seconds per message between hosts and on one host.
    pub tcp_alpha: f64,
    pub shm_alpha: f64,
    /// Bytes/s a rank copies in from shared memory.
    pub shm_rate: f64,
    /// Seconds per byte of a local reduction or copy.
    pub gamma: f64,
}

impl Model {
    /// A flat cluster: every host's NIC at `rate` both ways, one switch.
    pub fn flat(topo: Topology, rate: f64, tcp_alpha: f64) -> Model {
        let h = topo.nhosts();
        Model {
            topo,
            nic_out: vec![rate; h],
            nic_in: vec![rate; h],
            group_of: vec![0; h],
            group_out: vec![f64::INFINITY],
            group_in: vec![f64::INFINITY],
            tcp_alpha,
            shm_alpha: 1e-6,
            shm_rate: 8e9,
            gamma: 1.0 / 4e9,
        }
    }

    fn nhosts(&self) -> usize {
        self.topo.nhosts()
    }

    fn ngroups(&self) -> usize {
        self.group_out.len()
    }

    /// Link capacities: NIC out per host, NIC in per host, group out, group
    /// in, then each rank's shared-memory copy-in.
    fn links(&self) -> Vec<f64> {
        let mut cap = self.nic_out.clone();
        cap.extend(&self.nic_in);
        cap.extend(&self.group_out);
        cap.extend(&self.group_in);
        cap.extend(std::iter::repeat_n(self.shm_rate, self.topo.nranks()));
        cap
    }

    /// The links a message from rank a to rank b crosses.
    pub fn route(&self, a: usize, b: usize) -> Vec<usize> {
        let (h, g) = (self.nhosts(), self.ngroups());
        let (ha, hb) = (self.topo.host_of(a), self.topo.host_of(b));
        if ha == hb {
            return vec![2 * h + 2 * g + b];
        }
        let (ga, gb) = (self.group_of[ha], self.group_of[hb]);
        let mut r = vec![ha, h + hb];
        if ga != gb {
            r.extend([2 * h + ga, 2 * h + g + gb]);
        }
        r
    }

    fn alpha(&self, a: usize, b: usize) -> f64 {
        if self.topo.host_of(a) == self.topo.host_of(b) {
            self.shm_alpha
        } else {
            self.tcp_alpha
        }
    }
}

struct Msg {
    src: usize,
    dst: usize,
    bytes: f64,
    /// Receiver-side reduction after arrival, bytes.
    reduce: f64,
    posted: [Option<f64>; 2],
}

/// Events ordered by time (earliest first in a max-heap).
struct Event(f64, Kind);
#[derive(Clone, Copy)]
enum Kind {
    /// Rank enters its transfers of its current phase.
    Post(usize),
    /// Message starts its flow.
    Start(usize),
}
impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0)
    }
}

/// Simulated seconds for every rank's schedule (`schedules[r]` is rank r's)
/// to finish on `model`, elements of `elem_size` bytes. Err when the
/// schedules do not match up (a send without its receive), which the
/// verifier rules out for the library's own.
pub fn simulate(schedules: &[Schedule], model: &Model, elem_size: usize) -> Result<f64, String> {
    let n = schedules.len();
    if n != model.topo.nranks() {
        return Err(format!("{n} schedules for {} ranks", model.topo.nranks()));
    }
    let es = elem_size as f64;
    // Messages by channel order, and each phase's messages.
    let mut msgs: Vec<Msg> = Vec::new();
    let mut by_key: HashMap<(usize, usize, usize), usize> = HashMap::new();
    let mut sent = vec![HashMap::<usize, usize>::new(); n];
    let mut got = vec![HashMap::<usize, usize>::new(); n];
    // phase_msgs[r][p]: (message, end: 0 sender / 1 receiver)
    let mut phase_msgs: Vec<Vec<Vec<(usize, usize)>>> = Vec::with_capacity(n);
    let mut local: Vec<Vec<f64>> = Vec::with_capacity(n);
    for s in schedules {
        let r = s.rank;
        let mut per_phase = Vec::with_capacity(s.phases.len());
        let mut costs = Vec::with_capacity(s.phases.len());
        for phase in &s.phases {
            let mut mine = Vec::new();
            let mut cost = 0.0;
            for step in &phase.steps {
                let (a, b, end, span, reduce) = match step {
                    Step::Send { peer, src } => (r, *peer, 0, *src, false),
                    Step::Recv {
                        peer,
                        dst,
                        reduce_with,
                    } => (*peer, r, 1, *dst, reduce_with.is_some()),
                    Step::Copy { src, .. } | Step::Reduce { src, .. } => {
                        cost += src.len as f64 * es * model.gamma;
                        continue;
                    }
                };
                let counter = if end == 0 {
                    sent[r].entry(b).or_insert(0)
                } else {
                    got[r].entry(a).or_insert(0)
                };
                let key = (a, b, *counter);
                *counter += 1;
                let m = *by_key.entry(key).or_insert_with(|| {
                    msgs.push(Msg {
                        src: a,
                        dst: b,
                        bytes: span.len as f64 * es,
                        reduce: 0.0,
                        posted: [None, None],
                    });
                    msgs.len() - 1
                });
                if reduce {
                    msgs[m].reduce = span.len as f64 * es;
                }
                mine.push((m, end));
            }
            per_phase.push(mine);
            costs.push(cost);
        }
        phase_msgs.push(per_phase);
        local.push(costs);
    }
    let mut ends = vec![[false; 2]; msgs.len()];
    for &(m, end) in phase_msgs.iter().flatten().flatten() {
        ends[m][end] = true;
    }
    if let Some(m) = ends.iter().position(|e| !(e[0] && e[1])) {
        let x = &msgs[m];
        return Err(format!(
            "a message from rank {} to rank {} has no matching {}",
            x.src,
            x.dst,
            if ends[m][0] { "receive" } else { "send" }
        ));
    }

    let mut flows = Flows::new(model.links());
    let mut events = BinaryHeap::new();
    let mut phase = vec![0usize; n];
    // Per rank: transfers of its current phase not done yet, and when its
    // reductions of arrived bytes are done.
    let mut open = vec![0usize; n];
    let mut busy_until = vec![0.0f64; n];
    let mut finished = vec![0.0f64; n];
    // A rank enters its phase: local steps first, then its transfers post
    // (nothing when it has no phase left).
    let enter = |r: usize, at: f64, phase: &[usize], events: &mut BinaryHeap<Event>| {
        if let Some(cost) = local[r].get(phase[r]) {
            events.push(Event(at + cost, Kind::Post(r)));
        }
    };
    for r in 0..n {
        enter(r, 0.0, &phase, &mut events);
    }
    loop {
        let next = events.peek().map_or(f64::INFINITY, |e| e.0);
        let done = flows.run_until(next);
        let now = flows.now();
        // Ranks whose phase may have ended at `now`.
        let mut check: Vec<usize> = Vec::new();
        if !done.is_empty() {
            for m in done {
                let x = &msgs[m];
                busy_until[x.dst] = busy_until[x.dst].max(now) + x.reduce * model.gamma;
                open[x.src] -= 1;
                open[x.dst] -= 1;
                check.extend([x.src, x.dst]);
            }
        } else {
            if !next.is_finite() {
                break;
            }
            while events.peek().is_some_and(|e| e.0 <= now) {
                let Event(t, kind) = events.pop().expect("peeked");
                match kind {
                    Kind::Post(r) => {
                        let mine = &phase_msgs[r][phase[r]];
                        open[r] = mine.len();
                        for &(m, end) in mine {
                            msgs[m].posted[end] = Some(t);
                            if let [Some(a), Some(b)] = msgs[m].posted {
                                let (s, d) = (msgs[m].src, msgs[m].dst);
                                events.push(Event(a.max(b) + model.alpha(s, d), Kind::Start(m)));
                            }
                        }
                        check.push(r);
                    }
                    Kind::Start(m) => {
                        let (s, d) = (msgs[m].src, msgs[m].dst);
                        flows.start(m, model.route(s, d), msgs[m].bytes);
                    }
                }
            }
        }
        check.sort_unstable();
        check.dedup();
        for r in check {
            if open[r] == 0 && msgs_posted(&phase_msgs[r][phase[r]], &msgs) {
                let end = now.max(busy_until[r]);
                phase[r] += 1;
                finished[r] = end;
                enter(r, end, &phase, &mut events);
            }
        }
    }
    if let Some(r) = (0..n).find(|&r| phase[r] < phase_msgs[r].len()) {
        return Err(format!(
            "rank {r} is stuck in phase {} of {} (a cyclic wait)",
            phase[r],
            phase_msgs[r].len()
        ));
    }
    Ok(finished.into_iter().fold(0.0, f64::max))
}

/// Whether this rank has posted every transfer of its phase (it has once
/// its Post event ran; a phase without transfers counts as posted then).
fn msgs_posted(mine: &[(usize, usize)], msgs: &[Msg]) -> bool {
    mine.iter().all(|&(m, end)| msgs[m].posted[end].is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{build_on, Algo, CollArgs};
    use crate::types::CollKind;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs()
    }

    fn run(kind: CollKind, algo: Algo, counts: Vec<usize>, model: &Model) -> f64 {
        let args = CollArgs {
            kind,
            root: 0,
            counts,
        };
        let s: Vec<_> = (0..model.topo.nranks())
            .map(|r| build_on(&args, r, &model.topo, algo).unwrap())
            .collect();
        simulate(&s, model, 4).unwrap()
    }

    #[test]
    fn one_message_costs_alpha_plus_bytes_over_rate() {
        // A broadcast between two hosts is one message.
        let m = Model {
            gamma: 0.0,
            ..Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6)
        };
        let t = run(CollKind::Broadcast, Algo::BinomialTree, vec![1 << 20], &m);
        let want = 50e-6 + (4 << 20) as f64 / 1.25e8;
        assert!(close(t, want, 1e-9), "{t} vs {want}");
    }

    #[test]
    fn a_ring_allgather_on_a_uniform_network_is_its_closed_form() {
        // n hosts, each step every host sends one block to the next (in
        // slices, together): (n - 1) (α + block / rate).
        for n in [3usize, 5, 8] {
            let hosts: Vec<usize> = (0..n).collect();
            let m = Model {
                gamma: 0.0,
                ..Model::flat(Topology::from_hosts(&hosts), 1.25e8, 50e-6)
            };
            let block = 1usize << 18;
            let t = run(CollKind::AllGather, Algo::Ring, vec![block; n], &m);
            let want = (n - 1) as f64 * (50e-6 + (block * 4) as f64 / 1.25e8);
            assert!(close(t, want, 1e-6), "n={n}: {t} vs {want}");
        }
    }

    #[test]
    fn an_oversubscribed_uplink_is_shared_by_the_flows_crossing_it() {
        // Racks {0, 2} and {1, 3} (interleaved), 1 Gbit/s hosts, 250 Mbit/s
        // uplinks: the ring in rank order crosses each uplink with two
        // flows a step, the found order with one: twice as fast.
        let (fast, slow) = (1.25e8, 3.125e7);
        let racks = |topo: Topology| Model {
            group_of: vec![0, 1, 0, 1],
            group_out: vec![slow; 2],
            group_in: vec![slow; 2],
            gamma: 0.0,
            ..Model::flat(topo, fast, 0.0)
        };
        let rank_order = Topology::from_hosts(&[0, 1, 2, 3]);
        let found = rank_order.clone().with_host_order(&[0, 2, 1, 3]).unwrap();
        let block = 1usize << 20;
        let slow_t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![block; 4],
            &racks(rank_order),
        );
        let fast_t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![block; 4],
            &racks(found),
        );
        let want = 3.0 * (block * 4) as f64 / slow;
        assert!(close(fast_t, want, 1e-6), "{fast_t} vs {want}");
        assert!(
            close(slow_t, 2.0 * want, 1e-6),
            "{slow_t} vs {}",
            2.0 * want
        );
    }

    #[test]
    fn schedules_that_do_not_match_up_are_an_error() {
        use crate::schedule::{Phase, Span};
        let m = Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6);
        let sched = |rank: usize, steps: Vec<Step>| Schedule {
            rank,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![Phase { steps }],
            scratch_len: 0,
        };
        let send = Step::Send {
            peer: 1,
            src: Span::input(0, 8),
        };
        let e = simulate(&[sched(0, vec![send]), sched(1, vec![])], &m, 4).unwrap_err();
        assert!(
            e.contains("from rank 0 to rank 1 has no matching receive"),
            "{e}"
        );
        let e = simulate(&[sched(0, vec![])], &m, 4).unwrap_err();
        assert!(e.contains("1 schedules for 2 ranks"), "{e}");
    }

    #[test]
    fn every_algorithm_finishes_on_mixed_hosts() {
        // No cyclic wait and a positive time for every allreduce algorithm
        // on 3 hosts x 2 ranks: the executor's matching agrees with the
        // generators'.
        let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2]);
        let m = Model::flat(t.clone(), 1.25e8, 50e-6);
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![100_003],
        };
        for &a in crate::schedule::algos_for(CollKind::AllReduce) {
            if !crate::schedule::applicable_on(&args, &t, a) {
                continue;
            }
            let secs = run(CollKind::AllReduce, a, vec![100_003], &m);
            assert!(secs > 0.0 && secs.is_finite(), "{a:?}: {secs}");
        }
    }
}
