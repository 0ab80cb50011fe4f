//! Algorithms as data: each generator turns (collective, counts, rank, nranks)
//! into a per-rank [`Schedule`] that the one engine executes and the verifier
//! proves. See `ir.rs` for the vocabulary and the rules.
//!
//! Entry points: [`build`] makes one rank's schedule; [`algos_for`] and
//! [`applicable`] say which algorithms a call may use; [`default_algo`] picks
//! one by size; [`verify()`] proves a (collective, counts, nranks, algorithm)
//! correct by running every rank's schedule on symbolic data.
//!
//! One generator file per algorithm family: `ring.rs`, `recursive_doubling.rs`,
//! `direct.rs` (the starlike ones and one-shot allreduce), `tree.rs`
//! (binomial), `two_stage.rs` (scatter-allgather and
//! reduce-scatter-gather), `alltoall.rs`, `barrier.rs`, `p2p.rs`,
//! `rabenseifner.rs`, `double_binary_tree.rs`, `torus2d.rs`, `bruck.rs`
//! (allgather and all-to-all), `recursive_halving.rs` (reduce_scatter),
//! `pipelined_chain.rs` (broadcast); `plan.rs` holds what they share.

mod alltoall;
mod barrier;
mod bruck;
pub mod cost;
mod direct;
mod double_binary_tree;
pub mod hazard;
mod hierarchical;
pub mod ir;
pub mod lower;
mod p2p;
mod pipelined_chain;
mod plan;
mod rabenseifner;
mod recursive_doubling;
mod recursive_halving;
mod ring;
pub mod topology;
mod torus2d;
mod tree;
mod two_stage;
pub mod verify;

pub use cost::{CostModel, LinkCost};
pub use ir::{Algo, Buf, CollArgs, Phase, Schedule, Span, Step};
pub use topology::Topology;
pub use verify::{verify, verify_p2p, verify_schedules, At, Fault, Layout, VerifyError};

use crate::types::CollKind;
use plan::Plan;
use thiserror::Error;

/// Why a schedule cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("a communicator needs at least one rank")]
    NoRanks,
    #[error("rank {rank} is out of range for {nranks} ranks")]
    RankOutOfRange { rank: usize, nranks: usize },
    #[error("algorithm {} does not apply to {kind} (it takes {})", .algo.name(), algo_names(.kind))]
    NotApplicable { kind: CollKind, algo: Algo },
    #[error("{kind} on {nranks} ranks takes {expected} counts, got {got}")]
    BadCounts {
        kind: CollKind,
        nranks: usize,
        expected: usize,
        got: usize,
    },
    #[error("{kind}: root {root} is out of range for {nranks} ranks")]
    RootOutOfRange {
        kind: CollKind,
        root: usize,
        nranks: usize,
    },
    #[error("algorithm {} needs the same number of ranks on every host", .algo.name())]
    NotUniform { algo: Algo },
    #[error("{kind} at rank {rank}: the peer is the rank itself")]
    SelfPeer { kind: CollKind, rank: usize },
}

fn algo_names(kind: &CollKind) -> String {
    let names: Vec<&str> = algos_for(*kind).iter().map(|a| a.name()).collect();
    names.join(", ")
}

/// The algorithms that apply to a collective, the size-based default's
/// candidates among them.
pub fn algos_for(kind: CollKind) -> &'static [Algo] {
    use Algo::*;
    match kind {
        CollKind::AllReduce => &[
            Ring,
            RecursiveDoubling,
            Direct,
            Rabenseifner,
            DoubleBinaryTree,
            Torus2d,
            Torus2dRing,
            Hierarchical,
            OneShot,
        ],
        CollKind::Reduce => &[BinomialTree, ReduceScatterGather, Direct],
        CollKind::Broadcast => &[BinomialTree, ScatterAllgather, PipelinedChain, Direct],
        CollKind::AllGather => &[Ring, Direct, RecursiveDoubling, Bruck, Hierarchical],
        CollKind::ReduceScatter => &[Ring, Direct, RecursiveHalving, Hierarchical],
        CollKind::AllToAll => &[Pairwise, Direct, Bruck],
        CollKind::Gather | CollKind::Scatter => &[Direct],
        CollKind::Barrier => &[Dissemination],
        CollKind::Send | CollKind::Recv => &[P2p],
    }
}

/// Checks the rank-independent part of a call: the counts' shape (see the
/// table on [`CollArgs`]) and the root.
pub fn check_args(args: &CollArgs, nranks: usize) -> Result<(), ScheduleError> {
    if nranks == 0 {
        return Err(ScheduleError::NoRanks);
    }
    let kind = args.kind;
    let expected = match kind {
        CollKind::AllReduce
        | CollKind::Reduce
        | CollKind::Broadcast
        | CollKind::Send
        | CollKind::Recv => Some(1),
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::Gather | CollKind::Scatter => {
            Some(nranks)
        }
        CollKind::AllToAll => nranks.checked_mul(nranks),
        CollKind::Barrier => Some(0),
    };
    if expected != Some(args.counts.len()) {
        return Err(ScheduleError::BadCounts {
            kind,
            nranks,
            expected: expected.unwrap_or(usize::MAX),
            got: args.counts.len(),
        });
    }
    if kind.is_rooted() && args.root >= nranks {
        return Err(ScheduleError::RootOutOfRange {
            kind,
            root: args.root,
            nranks,
        });
    }
    Ok(())
}

fn check(args: &CollArgs, nranks: usize, algo: Algo) -> Result<(), ScheduleError> {
    if !algos_for(args.kind).contains(&algo) {
        return Err(ScheduleError::NotApplicable {
            kind: args.kind,
            algo,
        });
    }
    check_args(args, nranks)
}

/// Whether [`build`] accepts `algo` for this call on `nranks` ranks (for
/// send/recv it still refuses the rank that is its own peer).
///
/// Every generator handles any counts (zeros, fewer elements than ranks,
/// irregular v-counts) and any nranks, so this is only the table of
/// [`algos_for`] plus the shape of the arguments.
pub fn applicable(args: &CollArgs, nranks: usize, algo: Algo) -> bool {
    check(args, nranks, algo).is_ok()
}

/// Like [`applicable`] on a given topology: hierarchical schedules also need
/// every host to have the same number of ranks.
pub fn applicable_on(args: &CollArgs, topo: &Topology, algo: Algo) -> bool {
    check_on(args, topo, algo).is_ok()
}

fn check_on(args: &CollArgs, topo: &Topology, algo: Algo) -> Result<(), ScheduleError> {
    check(args, topo.nranks(), algo)?;
    if algo == Algo::Hierarchical && topo.uniform_ranks_per_host().is_none() {
        return Err(ScheduleError::NotUniform { algo });
    }
    Ok(())
}

/// A simple size-based choice, where `bytes` is the collective's full buffer:
/// the vector being reduced or broadcast, the gathered output of allgather,
/// the input of reduce_scatter.
pub fn default_algo(args: &CollArgs, nranks: usize, elem_size: usize) -> Algo {
    use Algo::*;
    use CollKind as K;
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    let bytes = args.counts.iter().sum::<usize>().saturating_mul(elem_size);
    match args.kind {
        // Tiny buffers on 3-8 ranks: one exchange of whole buffers, then a
        // local reduction in rank order. On 2 cores, 8 B-512 B: 3 ranks
        // 1.25-1.45x, 8 ranks 1.1-1.45x faster than recursive doubling,
        // 4 ranks level to 1.2x (`--algo recursive_doubling,one_shot
        // --rounds 3`); at 4 KiB on 8 ranks recursive doubling led.
        K::AllReduce if bytes < 4 * KIB && (3..=8).contains(&nranks) => OneShot,
        // Small buffers are latency-bound: log2(n) rounds beat the ring's
        // 2(n-1) steps, and whole-buffer messages cost little.
        K::AllReduce if bytes < 32 * KIB => RecursiveDoubling,
        // Medium: two phases of n-1 concurrent messages each; with few ranks
        // the concurrent messages do not oversubscribe a rank's links.
        K::AllReduce if bytes <= MIB && nranks <= 8 => Direct,
        // Beyond 8 ranks, direct's n-1 concurrent messages flood each rank,
        // and the ring's 2(n-1) steps cost latency: Rabenseifner moves the
        // ring's bytes in 2·log2(n) rounds. Measured on one 16-core host at
        // 12 and 16 ranks (issue 11): the ring was 1.3–2.5× slower than
        // rabenseifner or torus2d at 32 KiB and 256 KiB, and fine at 2 MiB.
        K::AllReduce if bytes <= MIB => Rabenseifner,
        // Large: bandwidth-bound; the ring keeps every link busy with 1/n of
        // the buffer per step and sends the minimum 2(n-1)/n per rank.
        K::AllReduce => Ring,
        // Up to 8 ranks, small broadcasts go straight from the root to every
        // rank (one phase; no leaf waits on a forwarding rank the scheduler
        // has not run): on 2 cores, 8 B–32 KiB, 8 ranks 1.1–2× faster than
        // the binomial tree, 4 ranks level, p99 3–20× lower at both
        // (`--algo binomial_tree,direct --rounds 3`).
        K::Broadcast if bytes < 32 * KIB && (3..=8).contains(&nranks) => Direct,
        // A tree's root sends the whole buffer per level; above a few hundred
        // KiB, scattering first halves the root's traffic. With 2 ranks there
        // is nothing to scatter.
        K::Broadcast if bytes < 256 * KIB || nranks <= 2 => BinomialTree,
        K::Broadcast => ScatterAllgather,
        // Up to 4 ranks, small reduces go straight to the root (one phase; no
        // inner rank waits on a child the scheduler has not run): 4 ranks on
        // 2 cores, 8 B–8 KiB, 1.05–1.7× faster than the binomial tree and
        // p99 5–10× lower (`--algo binomial_tree,direct --rounds 3`); level
        // or behind from 32 KiB.
        K::Reduce if bytes < 16 * KIB && nranks <= 4 => Direct,
        // Large reduces stream through shared memory (the sender's core
        // copies, the receiver's reduces: `engine::prefers_stream`), and
        // then the tree beat the two stages at 2-4 ranks on 2 cores, 256
        // KiB-16 MiB: 2 ranks 1.3-1.5x, 4 ranks level to 1.5x (`--algo
        // binomial_tree,reduce_scatter_gather --rounds 2`, twice). Beyond 4
        // ranks the two stages spread the reduction over the cores (not
        // measured with streaming).
        K::Reduce if bytes < 256 * KIB || nranks <= 4 => BinomialTree,
        K::Reduce => ReduceScatterGather,
        // Recursive doubling takes any counts and any n (it folds), so it is
        // always applicable; latency wins below 64 KiB, one phase of
        // concurrent messages below 1 MiB, the ring above.
        // Up to 4 ranks, direct's one phase of n-1 small messages beats
        // recursive doubling's 2 rounds (3 with the fold at 3 ranks): on 2
        // cores, 3 ranks 1.3–1.8× and 4 ranks 1.05–1.3× faster from 64 B to
        // 32 KiB (`--algo recursive_doubling,direct`).
        K::AllGather if bytes < 64 * KIB && nranks <= 4 => Direct,
        K::AllGather if bytes < 64 * KIB => RecursiveDoubling,
        K::AllGather if bytes < MIB => Direct,
        K::AllGather => Ring,
        K::ReduceScatter if bytes < MIB => Direct,
        K::ReduceScatter => Ring,
        // One phase of n-1 concurrent messages: on one host each goes through
        // its own ring, and one wait beats pairwise's n-1 rounds of waits.
        // Measured on 2 cores (ranks outnumbering cores, `--algo
        // pairwise,direct`): 4 ranks 15–35 % faster from 256 B to 16 KiB per
        // rank, level from 64 KiB; 8 ranks 1.3–1.6× below 64 KiB and
        // 1.05–1.15× from 1 MiB. Across hosts see `default_algo_on`.
        K::AllToAll => Direct,
        K::Gather | K::Scatter => Direct,
        K::Barrier => Dissemination,
        K::Send | K::Recv => P2p,
    }
}

/// [`default_algo`] on a topology. Across hosts, when every host holds the
/// same number (≥ 2) of ranks, the columns' TCP traffic plus shared memory
/// (hierarchical) wins from a few KiB: allreduce from 8 KiB, allgather and
/// reduce_scatter from 64 KiB (below, recursive doubling's and recursive
/// halving's log2(n) rounds). Measured on 4 emulated hosts × 2 at 1 Gbit/s
/// (docs/benchmarks.md). With
/// one rank per host, allreduce prefers the host-ordered ring to `direct`
/// from 32 KiB, whose n-1 concurrent flows per rank share one NIC.
pub fn default_algo_on(args: &CollArgs, topo: &Topology, elem_size: usize) -> Algo {
    const KIB: usize = 1 << 10;
    let flat = default_algo(args, topo.nranks(), elem_size);
    if topo.nhosts() < 2 {
        return flat;
    }
    let bytes = args.counts.iter().sum::<usize>().saturating_mul(elem_size);
    let several = topo.uniform_ranks_per_host().is_some_and(|l| l > 1);
    match args.kind {
        CollKind::AllReduce if several && bytes >= 8 * KIB => Algo::Hierarchical,
        CollKind::AllGather | CollKind::ReduceScatter if several && bytes >= 64 * KIB => {
            Algo::Hierarchical
        }
        CollKind::ReduceScatter if several => Algo::RecursiveHalving,
        CollKind::AllReduce if !several && bytes >= 32 * KIB => Algo::Ring,
        // One peer per round across hosts, so that no NIC takes n-1
        // senders at once (the choice before direct won on one host; not
        // measured against direct across hosts).
        CollKind::AllToAll => Algo::Pairwise,
        // The tree follows the hosts (one crossing per host); direct would
        // put n-1 messages on the root's NIC. Direct won on one host only
        // (where its point is ranks sharing cores); not measured across.
        CollKind::Broadcast if flat == Algo::Direct => Algo::BinomialTree,
        // Likewise one_shot's n-1 messages a rank: measured on one host only.
        CollKind::AllReduce if flat == Algo::OneShot => Algo::RecursiveDoubling,
        _ => flat,
    }
}

/// Rank `rank`'s schedule for one call, all ranks on one host.
pub fn build(
    args: &CollArgs,
    rank: usize,
    nranks: usize,
    algo: Algo,
) -> Result<Schedule, ScheduleError> {
    build_on(args, rank, &Topology::single_host(nranks), algo)
}

/// Rank `rank`'s schedule for one call on `topo`'s hosts.
pub fn build_on(
    args: &CollArgs,
    rank: usize,
    topo: &Topology,
    algo: Algo,
) -> Result<Schedule, ScheduleError> {
    let nranks = topo.nranks();
    check_on(args, topo, algo)?;
    if rank >= nranks {
        return Err(ScheduleError::RankOutOfRange { rank, nranks });
    }
    let kind = args.kind;
    if matches!(kind, CollKind::Send | CollKind::Recv) && args.root == rank {
        return Err(ScheduleError::SelfPeer { kind, rank });
    }
    let mut plan = Plan::new(rank, nranks);
    let count = args.counts.first().copied().unwrap_or(0);
    let counts = &args.counts[..];
    let root = args.root;
    if nranks == 1 {
        local_only(&mut plan, args);
        return Ok(plan.finish(algo));
    }
    match (kind, algo) {
        (CollKind::AllReduce, Algo::Ring) => ring::allreduce(&mut plan, topo, count),
        (CollKind::AllReduce, Algo::RecursiveDoubling) => {
            recursive_doubling::allreduce(&mut plan, count)
        }
        (CollKind::AllReduce, Algo::Direct) => direct::allreduce(&mut plan, count),
        (CollKind::AllReduce, Algo::OneShot) => direct::one_shot_allreduce(&mut plan, count),
        (CollKind::AllReduce, Algo::Hierarchical) => {
            hierarchical::allreduce(&mut plan, topo, count)
        }
        (CollKind::AllReduce, Algo::Rabenseifner) => rabenseifner::allreduce(&mut plan, count),
        (CollKind::AllReduce, Algo::DoubleBinaryTree) => {
            double_binary_tree::allreduce(&mut plan, topo, count)
        }
        (CollKind::AllReduce, Algo::Torus2d) => {
            torus2d::allreduce(&mut plan, count, torus2d::RowGather::Direct)
        }
        (CollKind::AllReduce, Algo::Torus2dRing) => {
            torus2d::allreduce(&mut plan, count, torus2d::RowGather::Ring)
        }
        (CollKind::Reduce, Algo::BinomialTree) => tree::reduce(&mut plan, topo, count, root),
        (CollKind::Reduce, Algo::ReduceScatterGather) => two_stage::reduce(&mut plan, count, root),
        (CollKind::Reduce, Algo::Direct) => direct::reduce(&mut plan, count, root),
        (CollKind::Broadcast, Algo::BinomialTree) => tree::broadcast(&mut plan, topo, count, root),
        (CollKind::Broadcast, Algo::ScatterAllgather) => {
            two_stage::broadcast(&mut plan, count, root)
        }
        (CollKind::Broadcast, Algo::Direct) => direct::broadcast(&mut plan, count, root),
        (CollKind::Broadcast, Algo::PipelinedChain) => {
            pipelined_chain::broadcast(&mut plan, topo, count, root)
        }
        (CollKind::AllGather, Algo::Ring) => ring::allgather(&mut plan, topo, counts),
        (CollKind::AllGather, Algo::Direct) => direct::allgather(&mut plan, counts),
        (CollKind::AllGather, Algo::RecursiveDoubling) => {
            recursive_doubling::allgather(&mut plan, counts)
        }
        (CollKind::AllGather, Algo::Bruck) => bruck::allgather(&mut plan, counts),
        (CollKind::AllGather, Algo::Hierarchical) => {
            hierarchical::allgather(&mut plan, topo, counts)
        }
        (CollKind::ReduceScatter, Algo::Ring) => ring::reduce_scatter(&mut plan, topo, counts),
        (CollKind::ReduceScatter, Algo::Direct) => direct::reduce_scatter(&mut plan, counts),
        (CollKind::ReduceScatter, Algo::RecursiveHalving) => {
            recursive_halving::reduce_scatter(&mut plan, counts)
        }
        (CollKind::ReduceScatter, Algo::Hierarchical) => {
            hierarchical::reduce_scatter(&mut plan, topo, counts)
        }
        (CollKind::AllToAll, Algo::Pairwise) => alltoall::pairwise(&mut plan, counts),
        (CollKind::AllToAll, Algo::Direct) => alltoall::direct(&mut plan, counts),
        (CollKind::AllToAll, Algo::Bruck) => bruck::alltoall(&mut plan, counts),
        (CollKind::Gather, Algo::Direct) => direct::gather(&mut plan, counts, root),
        (CollKind::Scatter, Algo::Direct) => direct::scatter(&mut plan, counts, root),
        (CollKind::Barrier, Algo::Dissemination) => barrier::dissemination(&mut plan),
        (CollKind::Send, Algo::P2p) => p2p::send(&mut plan, count, root),
        (CollKind::Recv, Algo::P2p) => p2p::recv(&mut plan, count, root),
        // `check` accepted only the pairs of `algos_for`, all handled above.
        _ => return Err(ScheduleError::NotApplicable { kind, algo }),
    }
    Ok(plan.finish(algo))
}

/// With one rank every collective is the identity from Input to Output
/// (broadcast's data is already in Output; barrier has nothing to do).
fn local_only(plan: &mut Plan, args: &CollArgs) {
    let (input, output) = args.buffer_lens(0, 1);
    match args.kind {
        CollKind::Broadcast | CollKind::Barrier | CollKind::Send | CollKind::Recv => {}
        _ => {
            plan.phase()
                .copy(Span::input(0, input), Span::output(0, output));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kind: CollKind, root: usize, counts: Vec<usize>) -> CollArgs {
        CollArgs { kind, root, counts }
    }

    #[test]
    fn every_algorithm_outside_the_table_is_refused() {
        for kind in CollKind::ALL {
            let a = args(
                kind,
                1,
                match kind {
                    CollKind::AllGather
                    | CollKind::ReduceScatter
                    | CollKind::Gather
                    | CollKind::Scatter => vec![3; 4],
                    CollKind::AllToAll => vec![3; 16],
                    CollKind::Barrier => vec![],
                    _ => vec![3],
                },
            );
            for algo in Algo::ALL {
                let listed = algos_for(kind).contains(&algo);
                assert_eq!(applicable(&a, 4, algo), listed, "{kind} {}", algo.name());
                let built = build(&a, 0, 4, algo);
                if listed {
                    assert!(built.is_ok(), "{kind} {}: {built:?}", algo.name());
                } else {
                    assert_eq!(built, Err(ScheduleError::NotApplicable { kind, algo }));
                }
            }
        }
    }

    #[test]
    fn bad_arguments_are_refused() {
        let ar = args(CollKind::AllReduce, 0, vec![4]);
        assert_eq!(build(&ar, 0, 0, Algo::Ring), Err(ScheduleError::NoRanks));
        assert_eq!(
            build(&ar, 4, 4, Algo::Ring),
            Err(ScheduleError::RankOutOfRange { rank: 4, nranks: 4 })
        );
        let ag = args(CollKind::AllGather, 0, vec![1, 2, 3]);
        assert_eq!(
            build(&ag, 0, 4, Algo::Ring),
            Err(ScheduleError::BadCounts {
                kind: CollKind::AllGather,
                nranks: 4,
                expected: 4,
                got: 3
            })
        );
        assert!(!applicable(&ag, 4, Algo::Ring));
        let bc = args(CollKind::Broadcast, 4, vec![8]);
        assert_eq!(
            build(&bc, 0, 4, Algo::BinomialTree),
            Err(ScheduleError::RootOutOfRange {
                kind: CollKind::Broadcast,
                root: 4,
                nranks: 4
            })
        );
        let send = args(CollKind::Send, 2, vec![8]);
        assert_eq!(
            build(&send, 2, 4, Algo::P2p),
            Err(ScheduleError::SelfPeer {
                kind: CollKind::Send,
                rank: 2
            })
        );
        let msg = build(&ar, 0, 4, Algo::Pairwise).unwrap_err().to_string();
        assert_eq!(
            msg,
            "algorithm pairwise does not apply to allreduce \
             (it takes ring, recursive_doubling, direct, rabenseifner, \
             double_binary_tree, torus2d, torus2d_ring, hierarchical, one_shot)"
        );
    }

    #[test]
    fn default_algo_follows_the_size_table() {
        let ar = |count| args(CollKind::AllReduce, 0, vec![count]);
        assert_eq!(default_algo(&ar(1024), 8, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(1023), 8, 4), Algo::OneShot);
        assert_eq!(default_algo(&ar(2), 3, 4), Algo::OneShot);
        assert_eq!(default_algo(&ar(2), 2, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(2), 9, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(8192), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&ar(1 << 18), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&ar(8192), 16, 4), Algo::Rabenseifner);
        assert_eq!(default_algo(&ar(1 << 18), 12, 4), Algo::Rabenseifner);
        assert_eq!(default_algo(&ar(1 << 19), 16, 4), Algo::Ring);
        assert_eq!(default_algo(&ar(1 << 20), 4, 4), Algo::Ring);
        let bc = |count| args(CollKind::Broadcast, 0, vec![count]);
        assert_eq!(default_algo(&bc(1000), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&bc(8192), 8, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1000), 2, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1000), 9, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1 << 20), 8, 4), Algo::ScatterAllgather);
        assert_eq!(default_algo(&bc(1 << 20), 2, 4), Algo::BinomialTree);
        let rd = |count| args(CollKind::Reduce, 0, vec![count]);
        assert_eq!(default_algo(&rd(1000), 8, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&rd(1 << 20), 8, 4), Algo::ReduceScatterGather);
        let ag = |each| args(CollKind::AllGather, 0, vec![each; 4]);
        assert_eq!(default_algo(&ag(1000), 4, 4), Algo::Direct);
        let ag8 = |each| args(CollKind::AllGather, 0, vec![each; 8]);
        assert_eq!(default_algo(&ag8(100), 8, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ag(10_000), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&ag(1 << 20), 4, 4), Algo::Ring);
        let rs = |each| args(CollKind::ReduceScatter, 0, vec![each; 4]);
        assert_eq!(default_algo(&rs(1000), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&rs(1 << 20), 4, 4), Algo::Ring);
        let a2a = |each| args(CollKind::AllToAll, 0, vec![each; 16]);
        assert_eq!(default_algo(&a2a(16), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&a2a(1 << 20), 4, 4), Algo::Direct);
        // Whatever the size, the default is always one the call may use.
        for kind in CollKind::ALL {
            let a = args(kind, 0, vec![]);
            assert!(algos_for(kind).contains(&default_algo(&a, 4, 4)));
        }
    }

    #[test]
    fn across_hosts_the_table_goes_hierarchical() {
        let two_each = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]);
        let one_each = Topology::from_hosts(&[0, 1, 2, 3]);
        let at = |kind, topo: &Topology, bytes: usize| {
            let n = topo.nranks();
            let counts = match kind {
                CollKind::AllReduce => vec![bytes / 4],
                _ => vec![bytes / 4 / n; n],
            };
            default_algo_on(&args(kind, 0, counts), topo, 4)
        };
        use Algo::*;
        use CollKind::*;
        assert_eq!(at(AllReduce, &two_each, 4096), RecursiveDoubling);
        assert_eq!(at(AllReduce, &two_each, 64), RecursiveDoubling);
        assert_eq!(at(AllReduce, &two_each, 8192), Hierarchical);
        assert_eq!(at(ReduceScatter, &two_each, 16 << 10), RecursiveHalving);
        assert_eq!(at(ReduceScatter, &two_each, 64 << 10), Hierarchical);
        assert_eq!(at(AllGather, &two_each, 32 << 10), RecursiveDoubling);
        assert_eq!(at(AllGather, &two_each, 64 << 10), Hierarchical);
        assert_eq!(at(AllReduce, &one_each, 64 << 10), Ring);
        assert_eq!(at(AllGather, &one_each, 64 << 20), Ring);
        // All-to-all goes one peer per round across hosts.
        let a2a = |topo: &Topology| {
            let n = topo.nranks();
            default_algo_on(&args(AllToAll, 0, vec![4; n * n]), topo, 4)
        };
        assert_eq!(a2a(&two_each), Pairwise);
        assert_eq!(a2a(&one_each), Pairwise);
        assert_eq!(a2a(&Topology::single_host(4)), Direct);
        // Broadcast keeps the flat table, but for direct, which is for
        // ranks sharing one host's cores: across hosts the tree.
        assert_eq!(at(Broadcast, &two_each, 64 << 20), ScatterAllgather);
        assert_eq!(at(Broadcast, &two_each, 64), BinomialTree);
        let bc = |bytes: usize| args(Broadcast, 0, vec![bytes / 4]);
        assert_eq!(
            default_algo_on(&bc(64), &Topology::single_host(8), 4),
            Direct
        );
    }

    #[test]
    fn one_rank_is_a_local_copy() {
        let ar = args(CollKind::AllReduce, 0, vec![5]);
        for algo in algos_for(CollKind::AllReduce) {
            let s = build(&ar, 0, 1, *algo).unwrap();
            assert_eq!(
                s.phases,
                vec![Phase {
                    steps: vec![Step::Copy {
                        src: Span::input(0, 5),
                        dst: Span::output(0, 5)
                    }]
                }]
            );
            assert_eq!(s.scratch_len, 0);
        }
        let bc = args(CollKind::Broadcast, 0, vec![5]);
        assert!(build(&bc, 0, 1, Algo::BinomialTree)
            .unwrap()
            .phases
            .is_empty());
    }
}
