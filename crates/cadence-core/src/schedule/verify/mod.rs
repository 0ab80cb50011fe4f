//! Symbolic verification: run every rank's schedule together on symbolic data
//! and compare every Output with the collective's definition (the table on
//! [`CollArgs`]). A pass proves the algorithm correct for that (collective,
//! counts, nranks, root), element by element, in every memory layout the
//! engine may be given.
//!
//! Terms:
//! - **value**: what one element holds. `Uninit`; `Data` (rank r's original
//!   element i, for collectives that move data; broadcast's root starts with
//!   its Output as data); or `Partial` (for reductions: the **mask** of ranks
//!   whose element i has been folded in, the element index i, and the
//!   **expression**, an id for the shape of the reduction tree).
//! - **expression**: leaves are ranks; a node is the unordered pair of its two
//!   operands' expressions, interned, so two values share an id exactly when
//!   they were computed by the same tree of operations up to swapping the two
//!   operands of a node. IEEE add, multiply, min and max are commutative but
//!   not associative, so that is exactly when two ranks are guaranteed the
//!   same bits; allreduce requires it of every element.
//! - **layout**: `Distinct` (Input and Output are separate memory) or
//!   `InPlace` (Input *is* Output; allreduce and reduce). In place, a read of
//!   Input sees whatever the schedule already wrote to Output, so reading
//!   `Input[i]` after writing `Output[i]` shows up as a double count or a wrong
//!   value. Structural checks run on physical memory, so in place they also
//!   catch a Recv into Output that overlaps a Send from Input.
//! - **capture**: the values a Send carries, read when its phase starts.
//! - **clock**: per rank, the mask of ranks it knows have entered the
//!   collective (a vector clock of one bit per rank). A send carries its
//!   sender's clock at capture; a recv merges it at completion. Only receives
//!   carry knowledge: a send may complete early on a buffering transport. A
//!   barrier must leave every rank with every bit.
//!
//! Execution follows `ir.rs`: when a rank enters a phase it runs the local
//! steps in order, then captures its sends. The phase completes when, for
//! every transfer, the peer has reached (or passed) the phase holding the
//! matching step (the k-th Send a→b matches the k-th Recv at b from a); then
//! its Recvs take effect. If no rank can move and some are unfinished, the
//! schedules deadlock. The outcome does not depend on the order ranks are
//! visited in: a rank's memory changes only by its own steps, and what it
//! receives was captured at a point fixed in the sender's own sequence.
//!
//! The engine may start a transfer of the next phase before the current one
//! completes (its lookahead). It does so by the rule `structure.rs` checks
//! within a phase (`schedule::hazard`), which says why the results are
//! still those of this phase-by-phase run.
//!
//! Files: `fault.rs` (what a failure says), `world.rs` (one verification
//! problem: initial memory, expected results, the order of the checks),
//! `structure.rs` (bounds, writes and overlaps within a phase, on physical
//! memory), `channels.rs` (pairing sends with receives), `symbolic.rs` (the
//! run on symbolic values, deadlocks included).

mod channels;
mod fault;
mod structure;
mod symbolic;
mod world;

pub use fault::{At, Elem, Fault, VerifyError, Wait};

use super::ir::{Algo, CollArgs, Schedule};
use super::topology::Topology;
use super::{build, build_on, check_args, check_on, ScheduleError};
use crate::types::CollKind;
use std::fmt;
use world::World;

/// The most ranks a verification covers: masks are bits of a u64.
pub const MAX_RANKS: usize = 64;

/// How Input and Output relate in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Separate memory.
    Distinct,
    /// The same memory (an in-place call).
    InPlace,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Distinct => "separate input and output",
            Layout::InPlace => "in place",
        })
    }
}

/// Builds every rank's schedule for the call and verifies them together (see
/// the module comment). For send/recv, `root` names the peer on the side the
/// kind says: every pair (other → root) for `Send`, (root → other) for `Recv`
/// is checked with [`verify_p2p`].
pub fn verify(args: &CollArgs, nranks: usize, algo: Algo) -> Result<(), VerifyError> {
    verify_on(args, &Topology::single_host(nranks), algo)
}

/// Like [`verify`], with the ranks on `topo`'s hosts (ring orders and
/// hierarchical schedules depend on them).
pub fn verify_on(args: &CollArgs, topo: &Topology, algo: Algo) -> Result<(), VerifyError> {
    let nranks = topo.nranks();
    let fail = |fault| VerifyError {
        kind: args.kind,
        root: args.root,
        counts: args.counts.clone(),
        algo: Some(algo),
        nranks,
        layout: None,
        fault,
    };
    if nranks > MAX_RANKS {
        return Err(fail(Fault::TooManyRanks { nranks }));
    }
    check_on(args, topo, algo).map_err(|e| fail(Fault::BadArgs(e)))?;
    if matches!(args.kind, CollKind::Send | CollKind::Recv) {
        if nranks == 1 {
            // The only rank would be its own peer: report what build says.
            build(args, 0, 1, algo).map_err(|error| fail(Fault::Build { rank: 0, error }))?;
        }
        let count = args.counts[0];
        for other in (0..nranks).filter(|&r| r != args.root) {
            let (src, dst) = if args.kind == CollKind::Send {
                (other, args.root)
            } else {
                (args.root, other)
            };
            verify_p2p(count, src, dst, nranks)?;
        }
        return Ok(());
    }
    let schedules = (0..nranks)
        .map(|rank| {
            build_on(args, rank, topo, algo).map_err(|error| fail(Fault::Build { rank, error }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    verify_schedules(args, &schedules)
}

/// Verifies schedules made elsewhere (one per rank, in rank order) for a
/// collective call; what [`verify`] runs after building them.
pub fn verify_schedules(args: &CollArgs, schedules: &[Schedule]) -> Result<(), VerifyError> {
    let nranks = schedules.len();
    let algo = schedules.first().map(|s| s.algo);
    let fail = |layout, fault| VerifyError {
        kind: args.kind,
        root: args.root,
        counts: args.counts.clone(),
        algo,
        nranks,
        layout,
        fault,
    };
    if nranks > MAX_RANKS {
        return Err(fail(None, Fault::TooManyRanks { nranks }));
    }
    if matches!(args.kind, CollKind::Send | CollKind::Recv) {
        return Err(fail(None, Fault::PointToPoint));
    }
    check_args(args, nranks).map_err(|e| fail(None, Fault::BadArgs(e)))?;
    let world = World::collective(args, schedules);
    world.check().map_err(|(layout, fault)| fail(layout, fault))
}

/// Verifies one point-to-point message of `count` elements from `src` to
/// `dst`, the other ranks doing nothing.
pub fn verify_p2p(count: usize, src: usize, dst: usize, nranks: usize) -> Result<(), VerifyError> {
    let fail = |layout, fault| VerifyError {
        kind: CollKind::Send,
        root: dst,
        counts: vec![count],
        algo: Some(Algo::P2p),
        nranks,
        layout,
        fault,
    };
    if nranks > MAX_RANKS {
        return Err(fail(None, Fault::TooManyRanks { nranks }));
    }
    let side = |rank: usize| -> Result<Schedule, VerifyError> {
        let args = if rank == src {
            CollArgs {
                kind: CollKind::Send,
                root: dst,
                counts: vec![count],
            }
        } else if rank == dst {
            CollArgs {
                kind: CollKind::Recv,
                root: src,
                counts: vec![count],
            }
        } else {
            return Ok(Schedule {
                rank,
                nranks,
                algo: Algo::P2p,
                phases: Vec::new(),
                scratch_len: 0,
            });
        };
        build(&args, rank, nranks, Algo::P2p)
            .map_err(|error| fail(None, Fault::Build { rank, error }))
    };
    if src >= nranks || dst >= nranks {
        let root = src.max(dst);
        return Err(fail(
            None,
            Fault::BadArgs(ScheduleError::RootOutOfRange {
                kind: CollKind::Send,
                root,
                nranks,
            }),
        ));
    }
    let schedules = (0..nranks).map(side).collect::<Result<Vec<_>, _>>()?;
    let world = World::p2p(count, src, dst, &schedules);
    world.check().map_err(|(layout, fault)| fail(layout, fault))
}

#[cfg(test)]
mod tests;
