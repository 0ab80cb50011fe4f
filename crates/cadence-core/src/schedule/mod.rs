//! Algorithms as data: each generator turns (collective, counts, rank, nranks)
//! into a per-rank [`Schedule`] that the one engine executes and the verifier
//! proves. See `ir.rs` for the vocabulary and the rules.
//!
//! Entry points: [`build`] makes one rank's schedule; [`algos_for`] and
//! [`applicable`] say which algorithms a call may use (`crate::choice` picks
//! one); [`verify()`] proves a (collective, counts, nranks, algorithm)
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

/// The size table moved to [`crate::choice::defaults`]; kept here for callers.
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
    #[error(
        "algorithm {} needs every rank's counts; an alltoall whose counts only each rank knows \
         takes pairwise or direct",
        .algo.name()
    )]
    NeedsEveryRanksCounts { algo: Algo },
    #[error("alltoall counts of rank {owner} given to build rank {rank}'s schedule")]
    NotItsCounts { owner: usize, rank: usize },
    #[error(
        "alltoall: rank {rank} sends itself {sends} elements but expects {expects} from itself"
    )]
    SelfBlock {
        rank: usize,
        sends: usize,
        expects: usize,
    },
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
        // The whole matrix, the row every rank sends, or one rank's own.
        CollKind::AllToAll if args.counts.len() == nranks => Some(nranks),
        CollKind::AllToAll if args.own_alltoall(nranks).is_some() => Some(2 * nranks + 1),
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
    if let Some((owner, send, recv)) = args.own_alltoall(nranks) {
        if owner >= nranks {
            return Err(ScheduleError::RankOutOfRange {
                rank: owner,
                nranks,
            });
        }
        if send[owner] != recv[owner] {
            return Err(ScheduleError::SelfBlock {
                rank: owner,
                sends: send[owner],
                expects: recv[owner],
            });
        }
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
    check_args(args, nranks)?;
    // Bruck forwards other ranks' blocks: it needs their lengths.
    if algo == Algo::Bruck && args.own_alltoall(nranks).is_some() {
        return Err(ScheduleError::NeedsEveryRanksCounts { algo });
    }
    Ok(())
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

pub(crate) fn check_on(args: &CollArgs, topo: &Topology, algo: Algo) -> Result<(), ScheduleError> {
    check(args, topo.nranks(), algo)?;
    if algo == Algo::Hierarchical && topo.uniform_ranks_per_host().is_none() {
        return Err(ScheduleError::NotUniform { algo });
    }
    Ok(())
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
    if let Some((owner, _, _)) = args.own_alltoall(nranks) {
        if owner != rank {
            return Err(ScheduleError::NotItsCounts { owner, rank });
        }
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
        (CollKind::AllToAll, Algo::Pairwise) => alltoall::pairwise(&mut plan, args),
        (CollKind::AllToAll, Algo::Direct) => alltoall::direct(&mut plan, args),
        (CollKind::AllToAll, Algo::Bruck) => bruck::alltoall(&mut plan, args),
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
    fn an_alltoall_of_one_row_is_the_matrix_of_that_row_everywhere() {
        // Odd sizes and empty blocks, on rank counts that are not powers
        // of two: every algorithm builds the same schedule from the row as
        // from the matrix whose every row it is, and the buffers and the
        // call's size agree.
        for n in [1, 2, 3, 5, 6, 8] {
            let row: Vec<usize> = (0..n).map(|d| (d * 7 + n) % 5).collect();
            let short = args(CollKind::AllToAll, 0, row.clone());
            let whole = args(CollKind::AllToAll, 0, row.repeat(n));
            assert_eq!(short.elements(n), whole.elements(n));
            assert!(check_args(&short, n).is_ok());
            for r in 0..n {
                assert_eq!(
                    short.buffer_lens(r, n),
                    whole.buffer_lens(r, n),
                    "n {n} rank {r}"
                );
                for algo in algos_for(CollKind::AllToAll) {
                    assert_eq!(
                        build(&short, r, n, *algo),
                        build(&whole, r, n, *algo),
                        "n {n} rank {r} {}",
                        algo.name()
                    );
                }
            }
        }
        // A length that is neither n nor n² is refused.
        let odd = args(CollKind::AllToAll, 0, vec![1; 5]);
        assert!(check_args(&odd, 4).is_err());
    }

    #[test]
    fn an_alltoall_of_one_ranks_own_counts_is_its_schedule_of_the_matrix() {
        // Rank r knows its row and column only; the matrix is for comparison.
        for n in [1, 2, 3, 5, 8] {
            let m: Vec<usize> = (0..n * n).map(|i| (i * 7 + n) % 4).collect();
            let whole = args(CollKind::AllToAll, 0, m.clone());
            for r in 0..n {
                let send: Vec<usize> = (0..n).map(|d| m[r * n + d]).collect();
                let recv: Vec<usize> = (0..n).map(|s| m[s * n + r]).collect();
                let own = CollArgs::alltoallv(r, &send, &recv);
                assert_eq!(own.own_alltoall(n), Some((r, &send[..], &recv[..])));
                assert_eq!(
                    own.buffer_lens(r, n),
                    whole.buffer_lens(r, n),
                    "n {n} rank {r}"
                );
                for algo in [Algo::Pairwise, Algo::Direct] {
                    assert_eq!(
                        build(&own, r, n, algo),
                        build(&whole, r, n, algo),
                        "n {n} rank {r} {}",
                        algo.name()
                    );
                }
                if n > 1 {
                    assert_eq!(
                        build(&own, r, n, Algo::Bruck),
                        Err(ScheduleError::NeedsEveryRanksCounts { algo: Algo::Bruck })
                    );
                    assert_eq!(
                        build(&own, (r + 1) % n, n, Algo::Pairwise),
                        Err(ScheduleError::NotItsCounts {
                            owner: r,
                            rank: (r + 1) % n
                        })
                    );
                }
            }
        }
        let mut bad = CollArgs::alltoallv(1, &[1, 2, 3], &[4, 5, 6]);
        assert_eq!(
            check_args(&bad, 3),
            Err(ScheduleError::SelfBlock {
                rank: 1,
                sends: 2,
                expects: 5
            })
        );
        *bad.counts.last_mut().unwrap() = 3;
        assert!(matches!(
            check_args(&bad, 3),
            Err(ScheduleError::RankOutOfRange { rank: 3, .. })
        ));
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
