//! Loads written down without building the schedule, for the algorithms
//! whose one rank has O(n) phases: building a ring rank's 2(n − 1) phases
//! costs milliseconds at thousands of ranks, and the choice needs a few
//! hosts' ranks of every candidate. Each must give exactly the loads of the
//! schedule the generator builds ([`super::loads::of_schedule`]); the tests
//! check every rank against it on many topologies and sizes.

use super::super::ir::{Algo, CollArgs};
use super::super::ring::slice_count;
use super::super::topology::Topology;
use super::loads::{Network, PhaseAcc, RankLoads};
use crate::types::CollKind;

/// The loads of `rank`'s schedule of `algo` for `args`, when written down
/// here; `None`: build the schedule.
pub(super) fn loads(
    args: &CollArgs,
    rank: usize,
    algo: Algo,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> Option<RankLoads> {
    let n = topo.nranks();
    match (args.kind, algo) {
        (CollKind::AllReduce, Algo::Ring) if n > 1 && rank < n => Some(ring_allreduce(
            args.counts.first().copied().unwrap_or(0),
            rank,
            topo,
            net,
            es,
        )),
        _ => None,
    }
}

/// `ring::allreduce`: a reduce-scatter pass, then an allgather pass, over
/// n balanced chunks; a hop between hosts in slices.
fn ring_allreduce(
    count: usize,
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> RankLoads {
    let m = topo.nranks();
    let pos = topo.ring_pos(rank);
    let next = topo.ring_rank((pos + 1) % m);
    let prev = topo.ring_rank((pos + m - 1) % m);
    let me = topo.host_of(rank);
    let (out_across, in_across) = (topo.host_of(next) != me, topo.host_of(prev) != me);
    // Chunk c is [c·count/m, (c+1)·count/m) (`Blocks::balanced`).
    let displ = |c: usize| (c as u128 * count as u128 / m as u128) as usize;
    let len = |c: usize| displ(c + 1) - displ(c);
    // (messages, longest) of a chunk of `l` elements on a hop.
    let cut = |l: usize, across: bool| {
        if across {
            let k = slice_count(l);
            (k, l.div_ceil(k))
        } else {
            (1, l)
        }
    };
    let mut acc = PhaseAcc::new(topo, net, es, rank);
    let mut out = RankLoads::new(rank);
    let step = |acc: &mut PhaseAcc, out: &mut RankLoads, send: usize, recv: usize, reduce| {
        if send == 0 && recv == 0 {
            return; // an empty phase is dropped
        }
        if send > 0 {
            let (k, longest) = cut(send, out_across);
            acc.send(next, send, k, longest);
        }
        if recv > 0 {
            let (k, longest) = cut(recv, in_across);
            acc.recv(prev, recv, k, longest, reduce);
        }
        out.push(acc.take(), 1);
    };
    if count.is_multiple_of(m) {
        // Every chunk alike: each pass is one run.
        let l = count / m;
        for reduce in [true, false] {
            let mut one = RankLoads::new(rank);
            step(&mut acc, &mut one, l, l, reduce);
            if let Some(&(p, _)) = one.runs.first() {
                out.push(p, m - 1);
            }
        }
        return out;
    }
    // In step s position p sends chunk p − s and receives chunk p − s − 1
    // (reduce-scatter), then sends p + 1 − s and receives p − s (allgather).
    for s in 0..m - 1 {
        step(
            &mut acc,
            &mut out,
            len((pos + m - s) % m),
            len((pos + 2 * m - s - 1) % m),
            true,
        );
    }
    for s in 0..m - 1 {
        step(
            &mut acc,
            &mut out,
            len((pos + 1 + m - s) % m),
            len((pos + m - s) % m),
            false,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::super::{build_on, Algo, CollArgs, Topology};
    use super::super::Pricing;
    use crate::fabric::pathfind::Fabric;
    use crate::types::CollKind;

    /// Topologies of `n` ranks: one host, hosts of 1, 3 or 8 consecutive
    /// ranks, ranks dealt out to hosts unevenly, and a ring order that is
    /// not the default.
    fn topologies(n: usize) -> Vec<Topology> {
        let mut v = vec![Topology::single_host(n)];
        for per in [1, 3, 8] {
            v.push(Topology::from_hosts(
                &(0..n).map(|r| r / per).collect::<Vec<_>>(),
            ));
        }
        let dealt: Vec<usize> = (0..n).map(|r| (r * 7 + r / 3) % n.div_ceil(2)).collect();
        v.push(Topology::from_hosts(&dealt));
        let t = Topology::from_hosts(&(0..n).map(|r| r / 2).collect::<Vec<_>>());
        let hosts: Vec<usize> = (0..t.nhosts()).rev().collect();
        v.push(t.with_host_order(&hosts).unwrap());
        v
    }

    /// Two racks with uneven rates, so the pair and group terms show.
    fn fabric(nh: usize) -> Fabric {
        Fabric {
            rate: (0..nh)
                .map(|a| {
                    (0..nh)
                        .map(|b| 1e8 * (1 + (a * 3 + b) % 5) as f64)
                        .collect()
                })
                .collect(),
            group_of: (0..nh).map(|h| h % 2).collect(),
            group_out: vec![2e8, 3e8],
            group_in: vec![2.5e8, 1.5e8],
        }
    }

    #[test]
    fn written_down_loads_are_the_built_schedules_loads() {
        let mut checked = 0;
        for n in [2usize, 3, 5, 8, 13, 24, 37] {
            let counts = [0, 1, n - 1, n, n + 1, 7 * n + 3, 16_384 * n + 5, 40_000 * n];
            for topo in topologies(n) {
                let f = fabric(topo.nhosts());
                let nets = [None, (topo.nhosts() > 1).then_some(&f)];
                for net in nets
                    .iter()
                    .filter(|x| x.is_some() || std::ptr::eq(*x, &nets[0]))
                {
                    for es in [1, 4] {
                        let pricing = Pricing::new(&topo, *net, es);
                        for &count in &counts {
                            let args = CollArgs {
                                kind: CollKind::AllReduce,
                                root: 0,
                                counts: vec![count],
                            };
                            for rank in 0..n {
                                let built = build_on(&args, rank, &topo, Algo::Ring).unwrap();
                                let want = pricing.loads(&built);
                                let got = pricing.loads_of(&args, rank, Algo::Ring).unwrap();
                                assert_eq!(
                                    got, want,
                                    "n {n}, count {count}, rank {rank}, {topo:?}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 5000, "{checked}");
    }
}
