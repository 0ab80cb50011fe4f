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

use super::ir::{Algo, Buf, CollArgs, Schedule, Span, Step};
use super::topology::Topology;
use super::{build, build_on, check_args, check_on, ScheduleError};
use crate::types::CollKind;
use std::collections::HashMap;
use std::fmt;
use thiserror::Error;

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

/// Where a step is: rank, phase and step index within the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub rank: usize,
    pub phase: usize,
    pub step: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} phase {} step {}",
            self.rank, self.phase, self.step
        )
    }
}

/// One element of one buffer, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elem {
    pub buf: Buf,
    pub index: usize,
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[{}]", self.buf, self.index)
    }
}

/// A transfer that cannot complete, in a deadlock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub at: At,
    pub peer: usize,
    /// The peer's phase holding the matching step.
    pub peer_phase: usize,
    /// The phase the peer is stuck in; `None` if it has finished.
    pub peer_now: Option<usize>,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} waits for rank {} to reach phase {}, ",
            self.at, self.peer, self.peer_phase
        )?;
        match self.peer_now {
            Some(q) => write!(f, "which is stuck in phase {q}"),
            None => write!(f, "which has finished"),
        }
    }
}

/// What is wrong with a set of schedules.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum Fault {
    #[error("{nranks} ranks: the verifier covers at most {MAX_RANKS}")]
    TooManyRanks { nranks: usize },
    #[error("{0}")]
    BadArgs(ScheduleError),
    #[error("send and recv are verified in pairs, with verify_p2p")]
    PointToPoint,
    #[error("rank {rank}: {error}")]
    Build { rank: usize, error: ScheduleError },
    #[error("schedule {index} claims to be rank {rank} of {nranks}")]
    WrongRank {
        index: usize,
        rank: usize,
        nranks: usize,
    },
    #[error("schedules use different algorithms")]
    MixedAlgos,
    #[error("{at}: peer {peer} is out of range or the rank itself")]
    BadPeer { at: At, peer: usize },
    #[error("{at}: {span:?} is out of bounds ({buf_len} elements)")]
    OutOfBounds { at: At, span: Span, buf_len: usize },
    #[error("{at}: writes Input, which is read-only")]
    WritesInput { at: At },
    #[error("{at}: a non-root rank writes Output in a reduce (the user's buffer)")]
    WritesNonRootOutput { at: At },
    #[error("{at}: operands of {a} and {b} elements")]
    LenMismatch { at: At, a: usize, b: usize },
    #[error("{at}: {what}")]
    Overlap { at: At, what: String },
    #[error("{send} sends {send_len} elements but the matching {recv} receives {recv_len}")]
    TransferLenMismatch {
        send: At,
        recv: At,
        send_len: usize,
        recv_len: usize,
    },
    #[error(
        "{at}: no matching {} (rank {from} sends {sends} messages to rank {to}, \
         which receives {recvs} from it)",
        counterpart(.is_send)
    )]
    Unmatched {
        at: At,
        from: usize,
        to: usize,
        sends: usize,
        recvs: usize,
        is_send: bool,
    },
    #[error("deadlock: {}", waits_text(.waits))]
    Deadlock { waits: Vec<Wait> },
    #[error("{at}: {elem} reduces two values that both contain rank(s) {}", ranks_text(.both))]
    DoubleCount { at: At, elem: Elem, both: u64 },
    #[error("{at}: {elem} reduces element {a} with element {b}")]
    Misaligned {
        at: At,
        elem: Elem,
        a: usize,
        b: usize,
    },
    #[error("{at}: {elem} reduces {value}, which is not a reduction operand")]
    NotReducible { at: At, elem: Elem, value: String },
    #[error("rank {rank} Output[{index}] holds {got}, expected {expected}")]
    WrongResult {
        rank: usize,
        index: usize,
        expected: String,
        got: String,
    },
    #[error("Output[{index}] is computed in different operand orders on ranks {a} and {b}, so its bits may differ")]
    NotBitwiseIdentical { index: usize, a: usize, b: usize },
    #[error("rank {rank} can leave the barrier before hearing from rank(s) {}", ranks_text(.missing))]
    BarrierIncomplete { rank: usize, missing: u64 },
}

fn counterpart(is_send: &bool) -> &'static str {
    if *is_send {
        "Recv"
    } else {
        "Send"
    }
}

fn waits_text(waits: &[Wait]) -> String {
    let parts: Vec<String> = waits.iter().map(Wait::to_string).collect();
    parts.join("; ")
}

fn ranks_text(mask: &u64) -> String {
    let ranks: Vec<String> = (0..MAX_RANKS)
        .filter(|r| mask >> r & 1 == 1)
        .map(|r| r.to_string())
        .collect();
    format!("{{{}}}", ranks.join(", "))
}

/// A verification failure: the call, the layout it showed up in (`None` for
/// faults found before running) and the fault.
#[derive(Clone, Debug, PartialEq, Error)]
#[error(
    "{kind} (root {root}, counts {counts:?}) with {} on {nranks} ranks{}: {fault}",
    algo_text(.algo),
    layout_text(.layout)
)]
pub struct VerifyError {
    pub kind: CollKind,
    pub root: usize,
    pub counts: Vec<usize>,
    pub algo: Option<Algo>,
    pub nranks: usize,
    pub layout: Option<Layout>,
    pub fault: Fault,
}

fn algo_text(algo: &Option<Algo>) -> &'static str {
    algo.map_or("no algorithm", Algo::name)
}

fn layout_text(layout: &Option<Layout>) -> String {
    layout.map_or(String::new(), |l| format!(", {l}"))
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

/// What one element holds (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Uninit,
    Data { rank: usize, index: usize },
    Partial { mask: u64, index: usize, expr: u32 },
}

/// Expression ids below this are leaves (the rank); interned nodes follow.
const FIRST_NODE: u32 = MAX_RANKS as u32;

impl Val {
    fn leaf(rank: usize, index: usize) -> Val {
        Val::Partial {
            mask: 1 << rank,
            index,
            expr: rank as u32,
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Val::Uninit => write!(f, "uninitialized memory"),
            Val::Data { rank, index } => write!(f, "rank {rank}'s element {index}"),
            Val::Partial { mask, index, .. } => {
                write!(
                    f,
                    "element {index} reduced over rank(s) {}",
                    ranks_text(&mask)
                )
            }
        }
    }
}

/// What an Output element must hold at the end.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Data {
        rank: usize,
        index: usize,
    },
    /// Element `index` reduced over all ranks, each exactly once.
    Total {
        index: usize,
    },
}

impl Expect {
    fn holds(self, v: Val, all: u64) -> bool {
        match (self, v) {
            (Expect::Data { rank, index }, Val::Data { rank: r, index: i }) => {
                rank == r && index == i
            }
            (Expect::Total { index }, Val::Partial { mask, index: i, .. }) => {
                mask == all && index == i
            }
            _ => false,
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Expect::Data { rank, index } => write!(f, "rank {rank}'s element {index}"),
            Expect::Total { index } => {
                write!(f, "element {index} reduced over all ranks once each")
            }
        }
    }
}

/// One verification problem: the schedules, the initial memory and what must
/// come out.
struct World<'a> {
    schedules: &'a [Schedule],
    /// Per rank, the logical (Input, Output) lengths.
    lens: Vec<(usize, usize)>,
    input: Vec<Vec<Val>>,
    output: Vec<Vec<Val>>,
    /// Per rank, its expected Output, or `None` when it is not checked.
    expect: Vec<Option<Vec<Expect>>>,
    /// Every rank's Output must carry the same expressions (allreduce).
    same_bits: bool,
    /// Every rank must hear from every other (barrier).
    barrier: bool,
    /// The call may be in place (allreduce, reduce).
    in_place: bool,
    /// For reduce: the root (the only rank allowed to write Output).
    reduce_root: Option<usize>,
}

impl<'a> World<'a> {
    fn collective(args: &CollArgs, schedules: &'a [Schedule]) -> World<'a> {
        let n = schedules.len();
        let kind = args.kind;
        let lens: Vec<(usize, usize)> = (0..n).map(|r| args.buffer_lens(r, n)).collect();
        let input = (0..n)
            .map(|r| {
                (0..lens[r].0)
                    .map(|i| {
                        if kind.reduces() {
                            Val::leaf(r, i)
                        } else {
                            Val::Data { rank: r, index: i }
                        }
                    })
                    .collect()
            })
            .collect();
        let output = (0..n)
            .map(|r| {
                (0..lens[r].1)
                    .map(|i| {
                        if kind == CollKind::Broadcast && r == args.root {
                            Val::Data { rank: r, index: i }
                        } else {
                            Val::Uninit
                        }
                    })
                    .collect()
            })
            .collect();
        World {
            schedules,
            lens,
            input,
            output,
            expect: (0..n).map(|r| expected_output(args, n, r)).collect(),
            same_bits: kind == CollKind::AllReduce,
            barrier: kind == CollKind::Barrier,
            in_place: matches!(kind, CollKind::AllReduce | CollKind::Reduce),
            reduce_root: (kind == CollKind::Reduce).then_some(args.root),
        }
    }

    fn p2p(count: usize, src: usize, dst: usize, schedules: &'a [Schedule]) -> World<'a> {
        let n = schedules.len();
        let lens: Vec<(usize, usize)> = (0..n)
            .map(|r| match r {
                _ if r == src => (count, 0),
                _ if r == dst => (0, count),
                _ => (0, 0),
            })
            .collect();
        World {
            schedules,
            input: (0..n)
                .map(|r| {
                    (0..lens[r].0)
                        .map(|i| Val::Data { rank: r, index: i })
                        .collect()
                })
                .collect(),
            output: lens.iter().map(|&(_, o)| vec![Val::Uninit; o]).collect(),
            expect: (0..n)
                .map(|r| {
                    (r == dst).then(|| {
                        (0..count)
                            .map(|index| Expect::Data { rank: src, index })
                            .collect()
                    })
                })
                .collect(),
            lens,
            same_bits: false,
            barrier: false,
            in_place: false,
            reduce_root: None,
        }
    }

    /// Runs every check in every layout that applies.
    fn check(&self) -> Result<(), (Option<Layout>, Fault)> {
        let n = self.schedules.len();
        let algo = self.schedules.first().map(|s| s.algo);
        for (index, s) in self.schedules.iter().enumerate() {
            if s.rank != index || s.nranks != n {
                return Err((
                    None,
                    Fault::WrongRank {
                        index,
                        rank: s.rank,
                        nranks: s.nranks,
                    },
                ));
            }
            if Some(s.algo) != algo {
                return Err((None, Fault::MixedAlgos));
            }
        }
        // Out of place first, completely, so that a fault shows up in the
        // simplest layout that has it. Matching needs the peers in range,
        // which the first structure check made sure of.
        let in_layout = |layout| move |f| (Some(layout), f);
        self.check_structure(Layout::Distinct)
            .map_err(in_layout(Layout::Distinct))?;
        let partner = self.match_channels().map_err(|f| (None, f))?;
        Sim::new(self, Layout::Distinct, &partner)
            .run()
            .map_err(in_layout(Layout::Distinct))?;
        if self.in_place {
            self.check_structure(Layout::InPlace)
                .map_err(in_layout(Layout::InPlace))?;
            Sim::new(self, Layout::InPlace, &partner)
                .run()
                .map_err(in_layout(Layout::InPlace))?;
        }
        Ok(())
    }

    /// Bounds, writes to Input, operand lengths, peers, and overlaps within a
    /// phase, on physical memory.
    fn check_structure(&self, layout: Layout) -> Result<(), Fault> {
        let n = self.schedules.len();
        for (r, sched) in self.schedules.iter().enumerate() {
            let (input_len, output_len) = self.lens[r];
            let buf_len = |buf: Buf| match buf {
                Buf::Input => input_len,
                Buf::Output => output_len,
                Buf::Scratch => sched.scratch_len,
            };
            for (q, phase) in sched.phases.iter().enumerate() {
                // The phase's transfer spans: (step, span, written).
                let mut transfers: Vec<(usize, Span, bool)> = Vec::new();
                // The phase's folds: (step, src, dst).
                let mut folds: Vec<(usize, Span, Span)> = Vec::new();
                for (i, step) in phase.steps.iter().enumerate() {
                    let at = At {
                        rank: r,
                        phase: q,
                        step: i,
                    };
                    let in_bounds = |span: &Span| {
                        let len = buf_len(span.buf);
                        match span.off.checked_add(span.len) {
                            Some(end) if end <= len => Ok(()),
                            _ => Err(Fault::OutOfBounds {
                                at,
                                span: *span,
                                buf_len: len,
                            }),
                        }
                    };
                    let non_root_reduce = self.reduce_root.is_some_and(|root| root != r);
                    let writable = |span: &Span| {
                        if span.buf == Buf::Input {
                            Err(Fault::WritesInput { at })
                        } else if span.buf == Buf::Output && non_root_reduce && span.len > 0 {
                            Err(Fault::WritesNonRootOutput { at })
                        } else {
                            Ok(())
                        }
                    };
                    let same_len = |a: &Span, b: &Span| {
                        if a.len == b.len {
                            Ok(())
                        } else {
                            Err(Fault::LenMismatch {
                                at,
                                a: a.len,
                                b: b.len,
                            })
                        }
                    };
                    let overlap = |what: &str, a: &Span, b: &Span| Fault::Overlap {
                        at,
                        what: format!("{what}: {a:?} and {b:?} overlap ({layout})"),
                    };
                    match step {
                        Step::Send { peer, src } => {
                            check_peer(at, *peer, n)?;
                            in_bounds(src)?;
                            transfers.push((i, *src, false));
                        }
                        Step::Recv {
                            peer,
                            dst,
                            reduce_with,
                        } => {
                            check_peer(at, *peer, n)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            transfers.push((i, *dst, true));
                            if let Some(a) = reduce_with {
                                in_bounds(a)?;
                                same_len(a, dst)?;
                                let (pa, pd) = (phys(a, layout), phys(dst, layout));
                                if pa != pd && pa.overlaps(&pd) {
                                    return Err(overlap(
                                        "reduce_with partly overlaps the destination",
                                        a,
                                        dst,
                                    ));
                                }
                                transfers.push((i, *a, false));
                            }
                        }
                        Step::Copy { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            let (ps, pd) = (phys(src, layout), phys(dst, layout));
                            // In place, copying Input[i] to Output[i] is
                            // copying memory onto itself: a no-op the engine
                            // must skip, not an overlap.
                            let aliased_noop = src.buf != dst.buf && ps == pd;
                            if ps.overlaps(&pd) && !aliased_noop {
                                return Err(overlap("copy", src, dst));
                            }
                        }
                        Step::Reduce { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            if phys(src, layout).overlaps(&phys(dst, layout)) {
                                return Err(overlap("reduce", src, dst));
                            }
                        }
                        Step::Fold { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            if phys(src, layout).overlaps(&phys(dst, layout)) {
                                return Err(overlap("fold", src, dst));
                            }
                            folds.push((i, *src, *dst));
                        }
                    }
                }
                check_folds(r, q, &phase.steps, &folds, &transfers, layout)?;
                // A span written by a Recv overlaps no other span of the
                // phase's transfers: they all run at the same time.
                for &(i, written, is_write) in &transfers {
                    if !is_write {
                        continue;
                    }
                    let pw = phys(&written, layout);
                    if let Some(&(j, other, _)) = transfers
                        .iter()
                        .find(|&&(j, other, _)| j != i && pw.overlaps(&phys(&other, layout)))
                    {
                        return Err(Fault::Overlap {
                            at: At {
                                rank: r,
                                phase: q,
                                step: i,
                            },
                            what: format!(
                                "Recv into {written:?} overlaps {other:?} of step {j}, \
                                 which runs at the same time ({layout})"
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Pairs the k-th Send a→b with the k-th Recv at b from a. Returns, for
    /// every transfer step, the step it pairs with.
    fn match_channels(&self) -> Result<Partners, Fault> {
        let n = self.schedules.len();
        // Per channel from*n + to: (step, length) of its sends and of its recvs.
        let mut sends: Vec<Vec<(At, usize)>> = vec![Vec::new(); n * n];
        let mut recvs: Vec<Vec<(At, usize)>> = vec![Vec::new(); n * n];
        let mut partner: Partners = Vec::with_capacity(n);
        for (r, sched) in self.schedules.iter().enumerate() {
            let mut of_rank = Vec::with_capacity(sched.phases.len());
            for (q, phase) in sched.phases.iter().enumerate() {
                for (i, step) in phase.steps.iter().enumerate() {
                    let at = At {
                        rank: r,
                        phase: q,
                        step: i,
                    };
                    match step {
                        Step::Send { peer, src } => sends[r * n + peer].push((at, src.len)),
                        Step::Recv { peer, dst, .. } => recvs[peer * n + r].push((at, dst.len)),
                        Step::Copy { .. } | Step::Reduce { .. } | Step::Fold { .. } => {}
                    }
                }
                of_rank.push(vec![None; phase.steps.len()]);
            }
            partner.push(of_rank);
        }
        for channel in 0..n * n {
            let (from, to) = (channel / n, channel % n);
            let (ss, rs) = (&sends[channel], &recvs[channel]);
            let unmatched = |at: At, is_send: bool| Fault::Unmatched {
                at,
                from,
                to,
                sends: ss.len(),
                recvs: rs.len(),
                is_send,
            };
            for k in 0..ss.len().max(rs.len()) {
                match (ss.get(k), rs.get(k)) {
                    (Some(&(send, send_len)), Some(&(recv, recv_len))) => {
                        if send_len != recv_len {
                            return Err(Fault::TransferLenMismatch {
                                send,
                                recv,
                                send_len,
                                recv_len,
                            });
                        }
                        partner[send.rank][send.phase][send.step] = Some(recv);
                        partner[recv.rank][recv.phase][recv.step] = Some(send);
                    }
                    (Some(&(send, _)), None) => return Err(unmatched(send, true)),
                    (None, Some(&(recv, _))) => return Err(unmatched(recv, false)),
                    (None, None) => {}
                }
            }
        }
        Ok(partner)
    }
}

/// The rules on a phase's folds (`ir.rs`): each reads the whole landing
/// span of one non-reducing `Recv` of the phase, no two read the same one,
/// and each writes a span that no transfer of the phase touches except the
/// one reducing `Recv` into exactly that span, and that no other fold reads
/// and every other fold writes exactly or not at all.
fn check_folds(
    rank: usize,
    phase: usize,
    steps: &[Step],
    folds: &[(usize, Span, Span)],
    transfers: &[(usize, Span, bool)],
    layout: Layout,
) -> Result<(), Fault> {
    let fault = |step: usize, what: String| Fault::Overlap {
        at: At { rank, phase, step },
        what: format!("{what} ({layout})"),
    };
    for (k, &(i, src, dst)) in folds.iter().enumerate() {
        let lands = steps
            .iter()
            .any(|s| matches!(s, Step::Recv { dst: d, reduce_with: None, .. } if *d == src));
        if !lands {
            return Err(fault(
                i,
                format!("Fold from {src:?}: no Recv of its phase lands exactly that span"),
            ));
        }
        let (ps, pd) = (phys(&src, layout), phys(&dst, layout));
        for &(j, other, _) in transfers {
            if !phys(&other, layout).overlaps(&pd) {
                continue;
            }
            let reduces_into_dst = matches!(
                steps[j],
                Step::Recv { dst: d, reduce_with: Some(_), .. } if d == dst
            );
            if !reduces_into_dst {
                return Err(fault(
                    i,
                    format!(
                        "Fold into {dst:?} overlaps {other:?} of step {j}, which runs meanwhile"
                    ),
                ));
            }
        }
        for &(j, src2, dst2) in &folds[k + 1..] {
            let (ps2, pd2) = (phys(&src2, layout), phys(&dst2, layout));
            if ps2 == ps {
                return Err(fault(j, format!("two folds read {src2:?}")));
            }
            if pd2.overlaps(&ps) || ps2.overlaps(&pd) {
                return Err(fault(
                    j,
                    format!("Fold into {dst2:?} and fold from {src:?} overlap one another"),
                ));
            }
            if pd2 != pd && pd2.overlaps(&pd) {
                return Err(fault(
                    j,
                    format!("Fold into {dst2:?} partly overlaps fold into {dst:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// `partner[rank][phase][step]`: the step a transfer pairs with.
type Partners = Vec<Vec<Vec<Option<At>>>>;

fn check_peer(at: At, peer: usize, n: usize) -> Result<(), Fault> {
    if peer < n && peer != at.rank {
        Ok(())
    } else {
        Err(Fault::BadPeer { at, peer })
    }
}

/// A span in physical memory: 0 = Input, 1 = Output, 2 = Scratch, with Input
/// mapped onto Output in place.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Phys {
    mem: usize,
    off: usize,
    len: usize,
}

impl Phys {
    fn overlaps(&self, other: &Phys) -> bool {
        self.mem == other.mem
            && self.len > 0
            && other.len > 0
            && self.off < other.off + other.len
            && other.off < self.off + self.len
    }
}

fn mem_of(buf: Buf, layout: Layout) -> usize {
    match (buf, layout) {
        (Buf::Input, Layout::Distinct) => 0,
        (Buf::Input, Layout::InPlace) | (Buf::Output, _) => 1,
        (Buf::Scratch, _) => 2,
    }
}

fn phys(span: &Span, layout: Layout) -> Phys {
    Phys {
        mem: mem_of(span.buf, layout),
        off: span.off,
        len: span.len,
    }
}

/// Expected Output of rank r (see the table on [`CollArgs`]); `None` where
/// the collective leaves it undefined.
fn expected_output(args: &CollArgs, n: usize, r: usize) -> Option<Vec<Expect>> {
    let c = &args.counts;
    let root = args.root;
    let count = c.first().copied().unwrap_or(0);
    let displ = |b: usize| -> usize { c[..b].iter().sum() };
    let totals = |from: usize, len: usize| {
        (from..from + len)
            .map(|index| Expect::Total { index })
            .collect()
    };
    let gathered = || {
        (0..n)
            .flat_map(|s| (0..c[s]).map(move |index| Expect::Data { rank: s, index }))
            .collect()
    };
    Some(match args.kind {
        CollKind::AllReduce => totals(0, count),
        CollKind::Reduce if r == root => totals(0, count),
        CollKind::Broadcast => (0..count)
            .map(|index| Expect::Data { rank: root, index })
            .collect(),
        CollKind::AllGather => gathered(),
        CollKind::Gather if r == root => gathered(),
        CollKind::ReduceScatter => totals(displ(r), c[r]),
        CollKind::AllToAll => (0..n)
            .flat_map(|s| {
                let off: usize = (0..r).map(|d| c[s * n + d]).sum();
                (0..c[s * n + r]).map(move |j| Expect::Data {
                    rank: s,
                    index: off + j,
                })
            })
            .collect(),
        CollKind::Scatter => {
            let off = displ(r);
            (0..c[r])
                .map(|j| Expect::Data {
                    rank: root,
                    index: off + j,
                })
                .collect()
        }
        CollKind::Barrier => Vec::new(),
        CollKind::Reduce | CollKind::Gather | CollKind::Send | CollKind::Recv => return None,
    })
}

/// The symbolic run of one world in one layout.
struct Sim<'w> {
    world: &'w World<'w>,
    layout: Layout,
    partner: &'w Partners,
    /// Per rank: Input, Output, Scratch (Input unused in place).
    mem: Vec<[Vec<Val>; 3]>,
    exprs: HashMap<(u32, u32), u32>,
    clock: Vec<u64>,
    /// Captured sends by (rank, phase, step): values and the sender's clock.
    captured: HashMap<(usize, usize, usize), (Vec<Val>, u64)>,
    /// Each rank's current phase (= its phase count when finished).
    pc: Vec<usize>,
    /// Whether the rank has entered its current phase.
    started: Vec<bool>,
}

impl<'w> Sim<'w> {
    fn new(world: &'w World<'w>, layout: Layout, partner: &'w Partners) -> Sim<'w> {
        let n = world.schedules.len();
        let mem = (0..n)
            .map(|r| {
                let scratch = vec![Val::Uninit; world.schedules[r].scratch_len];
                match layout {
                    Layout::Distinct => [world.input[r].clone(), world.output[r].clone(), scratch],
                    // The user's one buffer holds the input.
                    Layout::InPlace => [Vec::new(), world.input[r].clone(), scratch],
                }
            })
            .collect();
        Sim {
            world,
            layout,
            partner,
            mem,
            exprs: HashMap::new(),
            clock: (0..n).map(|r| 1 << r).collect(),
            captured: HashMap::new(),
            pc: vec![0; n],
            started: vec![false; n],
        }
    }

    fn run(mut self) -> Result<(), Fault> {
        let n = self.pc.len();
        let schedules = self.world.schedules;
        let finished = |sim: &Sim<'_>, r: usize| sim.pc[r] >= schedules[r].phases.len();
        loop {
            let mut progress = false;
            for r in 0..n {
                if !finished(&self, r) && !self.started[r] {
                    self.start(r)?;
                    progress = true;
                }
            }
            for r in 0..n {
                if self.started[r] && self.can_complete(r) {
                    self.complete(r)?;
                    progress = true;
                }
            }
            if (0..n).all(|r| finished(&self, r)) {
                break;
            }
            if !progress {
                return Err(Fault::Deadlock {
                    waits: self.waits(),
                });
            }
        }
        self.check_results()
    }

    fn read(&self, r: usize, span: &Span) -> Vec<Val> {
        self.mem[r][mem_of(span.buf, self.layout)][span.off..span.end()].to_vec()
    }

    fn write(&mut self, r: usize, span: &Span, vals: &[Val]) {
        self.mem[r][mem_of(span.buf, self.layout)][span.off..span.end()].copy_from_slice(vals);
    }

    /// `a ⊕ b`, where the result goes to `elem`.
    fn combine(&mut self, a: Val, b: Val, at: At, elem: Elem) -> Result<Val, Fault> {
        match (a, b) {
            (
                Val::Partial {
                    mask: ma,
                    index: ia,
                    expr: ea,
                },
                Val::Partial {
                    mask: mb,
                    index: ib,
                    expr: eb,
                },
            ) => {
                if ia != ib {
                    return Err(Fault::Misaligned {
                        at,
                        elem,
                        a: ia,
                        b: ib,
                    });
                }
                if ma & mb != 0 {
                    return Err(Fault::DoubleCount {
                        at,
                        elem,
                        both: ma & mb,
                    });
                }
                let next = FIRST_NODE + self.exprs.len() as u32;
                let expr = *self.exprs.entry((ea.min(eb), ea.max(eb))).or_insert(next);
                Ok(Val::Partial {
                    mask: ma | mb,
                    index: ia,
                    expr,
                })
            }
            (Val::Partial { .. }, other) | (other, _) => Err(Fault::NotReducible {
                at,
                elem,
                value: other.to_string(),
            }),
        }
    }

    /// `dst[j] = a[j] ⊕ b[j]` element by element.
    fn combine_into(
        &mut self,
        r: usize,
        dst: &Span,
        a: &[Val],
        b: &[Val],
        at: At,
    ) -> Result<(), Fault> {
        let mut out = Vec::with_capacity(a.len());
        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
            let elem = Elem {
                buf: dst.buf,
                index: dst.off + j,
            };
            out.push(self.combine(x, y, at, elem)?);
        }
        self.write(r, dst, &out);
        Ok(())
    }

    /// Enters rank r's current phase: local steps in order, then captures.
    fn start(&mut self, r: usize) -> Result<(), Fault> {
        let q = self.pc[r];
        let phase = &self.world.schedules[r].phases[q];
        for (i, step) in phase.steps.iter().enumerate() {
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            match step {
                Step::Copy { src, dst } => {
                    let vals = self.read(r, src);
                    self.write(r, dst, &vals);
                }
                Step::Reduce { src, dst } => {
                    let (old, add) = (self.read(r, dst), self.read(r, src));
                    self.combine_into(r, dst, &old, &add, at)?;
                }
                Step::Send { .. } | Step::Recv { .. } | Step::Fold { .. } => {}
            }
        }
        for (i, step) in phase.steps.iter().enumerate() {
            if let Step::Send { src, .. } = step {
                let vals = self.read(r, src);
                self.captured.insert((r, q, i), (vals, self.clock[r]));
            }
        }
        self.started[r] = true;
        Ok(())
    }

    /// Whether rank `r` has entered or passed phase `q`.
    fn reached(&self, r: usize, q: usize) -> bool {
        self.pc[r] > q || (self.pc[r] == q && self.started[r])
    }

    fn can_complete(&self, r: usize) -> bool {
        let q = self.pc[r];
        let steps = &self.world.schedules[r].phases[q].steps;
        steps.iter().enumerate().all(|(i, step)| {
            !step.is_transfer()
                || self.partner[r][q][i].is_some_and(|p| self.reached(p.rank, p.phase))
        })
    }

    /// Completes rank r's current phase: its Recvs take effect.
    fn complete(&mut self, r: usize) -> Result<(), Fault> {
        let q = self.pc[r];
        let phase = &self.world.schedules[r].phases[q];
        for (i, step) in phase.steps.iter().enumerate() {
            let Step::Recv {
                dst, reduce_with, ..
            } = step
            else {
                continue;
            };
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            let from = self.partner[r][q][i].expect("every transfer is matched before the run");
            let (incoming, clock) = self
                .captured
                .remove(&(from.rank, from.phase, from.step))
                .expect("a sender that reached its phase has captured its sends");
            match reduce_with {
                None => self.write(r, dst, &incoming),
                Some(a) => {
                    let base = self.read(r, a);
                    self.combine_into(r, dst, &base, &incoming, at)?;
                }
            }
            self.clock[r] |= clock;
        }
        // Folds take effect after every receive, in step order: element by
        // element that is the order the engine's chains keep.
        for (i, step) in phase.steps.iter().enumerate() {
            let Step::Fold { src, dst } = step else {
                continue;
            };
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            let (old, add) = (self.read(r, dst), self.read(r, src));
            self.combine_into(r, dst, &old, &add, at)?;
        }
        self.pc[r] += 1;
        self.started[r] = false;
        Ok(())
    }

    /// Every transfer that cannot complete, for a deadlock report.
    fn waits(&self) -> Vec<Wait> {
        let schedules = self.world.schedules;
        let mut waits = Vec::new();
        for (r, sched) in schedules.iter().enumerate() {
            let q = self.pc[r];
            let Some(phase) = sched.phases.get(q) else {
                continue;
            };
            for i in 0..phase.steps.len() {
                let Some(p) = self.partner[r][q][i] else {
                    continue;
                };
                if !self.reached(p.rank, p.phase) {
                    waits.push(Wait {
                        at: At {
                            rank: r,
                            phase: q,
                            step: i,
                        },
                        peer: p.rank,
                        peer_phase: p.phase,
                        peer_now: (self.pc[p.rank] < schedules[p.rank].phases.len())
                            .then_some(self.pc[p.rank]),
                    });
                }
            }
        }
        waits
    }

    fn check_results(&self) -> Result<(), Fault> {
        let n = self.pc.len();
        let all = if n == MAX_RANKS {
            u64::MAX
        } else {
            (1 << n) - 1
        };
        let output = |r: usize| &self.mem[r][1];
        for (r, expect) in self.world.expect.iter().enumerate() {
            let Some(expect) = expect else { continue };
            for (index, (&e, &got)) in expect.iter().zip(output(r)).enumerate() {
                if !e.holds(got, all) {
                    return Err(Fault::WrongResult {
                        rank: r,
                        index,
                        expected: e.to_string(),
                        got: got.to_string(),
                    });
                }
            }
        }
        if self.world.same_bits {
            let expr = |v: &Val| match *v {
                Val::Partial { expr, .. } => Some(expr),
                _ => None,
            };
            for (index, first) in output(0).iter().enumerate() {
                if let Some(b) = (1..n).find(|&b| expr(&output(b)[index]) != expr(first)) {
                    return Err(Fault::NotBitwiseIdentical { index, a: 0, b });
                }
            }
        }
        if self.world.barrier {
            if let Some(r) = (0..n).find(|&r| self.clock[r] != all) {
                return Err(Fault::BarrierIncomplete {
                    rank: r,
                    missing: all & !self.clock[r],
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{algos_for, applicable, Phase};
    use super::*;
    use crate::schedule::applicable_on;

    const MAX_N: usize = 32;

    fn args(kind: CollKind, root: usize, counts: Vec<usize>) -> CollArgs {
        CollArgs { kind, root, counts }
    }

    /// The count patterns of the matrix for a collective on n ranks: 0, 1, 7,
    /// n-1, 2n+3 everywhere, and for v-collectives irregular counts with
    /// zeros.
    fn count_patterns(kind: CollKind, n: usize) -> Vec<Vec<usize>> {
        let scalars = [0, 1, 7, n - 1, 2 * n + 3];
        let mut out: Vec<Vec<usize>> = match kind {
            CollKind::AllReduce | CollKind::Reduce | CollKind::Broadcast => {
                scalars.iter().map(|&c| vec![c]).collect()
            }
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::Gather
            | CollKind::Scatter => {
                let mut v: Vec<Vec<usize>> = scalars.iter().map(|&c| vec![c; n]).collect();
                v.push((0..n).map(|r| (r * 5 + 3) % 4).collect());
                v.push((0..n).map(|r| if r == n - 1 { 9 } else { 0 }).collect());
                v.push((0..n).map(|r| if r % 3 == 1 { 0 } else { r + 2 }).collect());
                v
            }
            CollKind::AllToAll => {
                let mut v: Vec<Vec<usize>> = scalars.iter().map(|&c| vec![c; n * n]).collect();
                v.push(
                    (0..n * n)
                        .map(|i| (i / n * 3 + i % n * 5 + 1) % 4)
                        .collect(),
                );
                v.push(
                    (0..n * n)
                        .map(|i| if i / n == i % n { 3 } else { 0 })
                        .collect(),
                );
                v
            }
            CollKind::Barrier => vec![vec![]],
            CollKind::Send | CollKind::Recv => vec![vec![0], vec![1], vec![7]],
        };
        out.dedup();
        out
    }

    fn roots(kind: CollKind, n: usize) -> Vec<usize> {
        let rooted = matches!(
            kind,
            CollKind::Reduce | CollKind::Broadcast | CollKind::Gather | CollKind::Scatter
        );
        match (rooted, n) {
            (false, _) => vec![0],
            (true, 1..=8) => (0..n).collect(),
            (true, _) => vec![0, 1, n / 2, n - 1],
        }
    }

    /// Every applicable algorithm × nranks 1..=MAX_N × count patterns × roots.
    fn verify_matrix(kind: CollKind) {
        let mut runs = 0;
        for n in 1..=MAX_N {
            for counts in count_patterns(kind, n) {
                for root in roots(kind, n) {
                    let a = args(kind, root, counts.clone());
                    for &algo in algos_for(kind) {
                        assert!(applicable(&a, n, algo));
                        if let Err(e) = verify(&a, n, algo) {
                            panic!("{e}");
                        }
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 0);
    }

    /// Worlds beyond the matrix, up to the verifier's limit, with fewer
    /// counts and roots: folds, uneven chunks and wrap-around at scale.
    fn verify_large_world(n: usize) {
        for kind in CollKind::ALL {
            if matches!(kind, CollKind::Send | CollKind::Recv) {
                continue;
            }
            let patterns = count_patterns(kind, n);
            // 2n+3 everywhere and the first irregular pattern; for alltoall
            // (n² blocks) only the irregular one.
            let chosen = match kind {
                CollKind::Barrier => &patterns[..],
                CollKind::AllToAll => &patterns[5..6],
                _ => &patterns[4..patterns.len().min(6)],
            };
            // The first and last root (just 0 when unrooted).
            let mut ends = roots(kind, n);
            if ends.len() > 2 {
                ends.drain(1..ends.len() - 1);
            }
            for counts in chosen {
                for &root in &ends {
                    let a = args(kind, root, counts.clone());
                    for &algo in algos_for(kind) {
                        if let Err(e) = verify(&a, n, algo) {
                            panic!("{e}");
                        }
                    }
                }
            }
        }
    }

    // The matrix covers 1..=MAX_N (32) in full; these go beyond it.
    #[test]
    fn large_worlds_33_to_40() {
        for n in [33, 37, 40] {
            verify_large_world(n);
        }
    }

    #[test]
    fn large_worlds_48_and_63() {
        verify_large_world(48);
        verify_large_world(63);
    }

    #[test]
    fn large_world_64() {
        verify_large_world(64);
    }

    /// Host layouts: contiguous and interleaved (rank r on host r mod H, so
    /// the ring order differs from rank order), uniform and not.
    fn topologies() -> Vec<Topology> {
        let mut out = Vec::new();
        for (hosts, per) in [
            (2, 1),
            (2, 2),
            (3, 2),
            (2, 3),
            (4, 2),
            (3, 3),
            (4, 4),
            (5, 3),
            (8, 4),
        ] {
            let n = hosts * per;
            out.push(Topology::from_hosts(
                &(0..n).map(|r| r / per).collect::<Vec<_>>(),
            ));
            out.push(Topology::from_hosts(
                &(0..n).map(|r| r % hosts).collect::<Vec<_>>(),
            ));
        }
        out.push(Topology::from_hosts(&[0, 1, 1, 1]));
        out.push(Topology::from_hosts(&[0, 0, 1, 2, 2, 2, 0]));
        out
    }

    #[test]
    fn every_algorithm_on_multi_host_topologies() {
        let mut runs = 0;
        for topo in topologies() {
            let n = topo.nranks();
            for kind in CollKind::ALL {
                if matches!(kind, CollKind::Send | CollKind::Recv) {
                    continue;
                }
                let patterns = count_patterns(kind, n);
                let chosen = match kind {
                    CollKind::AllToAll => &patterns[5..6],
                    CollKind::Barrier => &patterns[..],
                    _ => &patterns[..],
                };
                for counts in chosen {
                    let a = args(kind, n - 1, counts.clone());
                    for &algo in algos_for(kind) {
                        let ok = applicable_on(&a, &topo, algo);
                        let uniform = topo.uniform_ranks_per_host().is_some();
                        assert_eq!(ok, uniform || algo != Algo::Hierarchical);
                        if !ok {
                            continue;
                        }
                        if let Err(e) = verify_on(&a, &topo, algo) {
                            panic!("{e} on hosts {topo:?}");
                        }
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 100);
    }

    /// A deterministic shuffle (splitmix64), for the random ring orders.
    fn shuffled(mut v: Vec<usize>, seed: u64) -> Vec<usize> {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for i in (1..v.len()).rev() {
            v.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        v
    }

    #[test]
    fn every_algorithm_under_random_ring_orders() {
        // A topology file can give rings any order: a host order from the
        // path finder, or (the generators must not care) any permutation of
        // the ranks. Large counts too, so ring steps are sliced across hosts.
        let mut runs = 0;
        for (t, topo) in topologies().into_iter().enumerate() {
            let n = topo.nranks();
            let hosts = shuffled((0..topo.nhosts()).collect(), t as u64);
            let orders = [
                topo.clone().with_host_order(&hosts).unwrap(),
                topo.clone()
                    .with_order(shuffled((0..n).collect(), 100 + t as u64))
                    .unwrap(),
            ];
            for topo in orders {
                for kind in CollKind::ALL {
                    if matches!(kind, CollKind::Send | CollKind::Recv) {
                        continue;
                    }
                    let patterns = count_patterns(kind, n);
                    let big = 2 * 16 * 1024 * n + 5;
                    let extra = match kind {
                        CollKind::AllReduce | CollKind::Broadcast => vec![vec![big]],
                        CollKind::AllGather | CollKind::ReduceScatter => vec![vec![big / n; n]],
                        _ => vec![],
                    };
                    let extra = if n <= 4 { extra } else { vec![] };
                    let chosen: Vec<Vec<usize>> = match kind {
                        CollKind::AllToAll => patterns[5..6].to_vec(),
                        _ => patterns
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| [0, 2, 4, 5, 6, 7].contains(i))
                            .map(|(_, c)| c.clone())
                            .chain(extra)
                            .collect(),
                    };
                    for counts in chosen {
                        let a = args(kind, n / 2, counts);
                        for &algo in algos_for(kind) {
                            if !applicable_on(&a, &topo, algo) {
                                continue;
                            }
                            if let Err(e) = verify_on(&a, &topo, algo) {
                                panic!("{e} on hosts {topo:?}");
                            }
                            runs += 1;
                        }
                    }
                }
            }
        }
        assert!(runs > 300, "{runs}");
    }

    #[test]
    fn sliced_ring_steps() {
        // Chunks of two and three slices (and a ragged one), flat and across
        // hosts: the slices of a message line up on both ends.
        let slice = 16 * 1024;
        for topo in [
            Topology::single_host(3),
            Topology::from_hosts(&[0, 1, 0, 1]),
            Topology::from_hosts(&[0, 0, 1, 1, 2, 2]),
        ] {
            let n = topo.nranks();
            for count in [2 * slice * n + 5, 3 * slice * n - 1] {
                for (kind, counts) in [
                    (CollKind::AllReduce, vec![count]),
                    (CollKind::AllGather, vec![count / n; n]),
                    (CollKind::ReduceScatter, vec![count / n; n]),
                ] {
                    let a = args(kind, 0, counts);
                    for &algo in algos_for(kind) {
                        if matches!(algo, Algo::Ring | Algo::Hierarchical)
                            && applicable_on(&a, &topo, algo)
                        {
                            if let Err(e) = verify_on(&a, &topo, algo) {
                                panic!("{e} on hosts {topo:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rings_cross_each_host_boundary_once() {
        // Ranks interleaved over 2 hosts: a rank-order ring would cross
        // between hosts at every hop.
        let topo = Topology::from_hosts(&[0, 1, 0, 1, 0, 1]);
        let a = args(CollKind::AllReduce, 0, vec![60]);
        let mut crossing = 0;
        for r in 0..6 {
            let s = build_on(&a, r, &topo, Algo::Ring).unwrap();
            let peers: std::collections::BTreeSet<usize> = s
                .phases
                .iter()
                .flat_map(|p| &p.steps)
                .filter_map(|st| match st {
                    Step::Send { peer, .. } => Some(*peer),
                    _ => None,
                })
                .collect();
            assert_eq!(peers.len(), 1, "rank {r} sends to one next rank");
            let next = *peers.iter().next().unwrap();
            crossing += usize::from(topo.host_of(next) != topo.host_of(r));
        }
        assert_eq!(crossing, 2);
    }

    #[test]
    fn hierarchical_sends_only_same_local_rank_across_hosts() {
        let topo = Topology::from_hosts(&[0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        // Small: the columns exchange whole chunks (1/3 of the buffer) by
        // recursive doubling; large: ring sub-chunks, 1/(3·4) of it.
        for (count, most) in [(1000, 1000 / 3 + 1), (120_000, 120_000 / 12 + 1)] {
            let a = args(CollKind::AllReduce, 0, vec![count]);
            for r in 0..12 {
                let s = build_on(&a, r, &topo, Algo::Hierarchical).unwrap();
                for st in s.phases.iter().flat_map(|p| &p.steps) {
                    if let Step::Send { peer, src } = st {
                        if topo.host_of(*peer) != topo.host_of(r) {
                            assert_eq!(topo.local_rank(*peer), topo.local_rank(r));
                            assert!(src.len <= most, "{count}: {src:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pipelined_hierarchical_allreduce() {
        // From 2 Mi elements the segments' stages are laid over each other:
        // 2 and 3 segments (odd lengths), hosts contiguous and interleaved.
        let seg = 1 << 20;
        for topo in [
            Topology::from_hosts(&[0, 0, 1, 1]),
            Topology::from_hosts(&[0, 1, 2, 0, 1, 2]),
        ] {
            let (h, l) = (topo.nhosts(), 2);
            for k in [2, 3] {
                let count = k * seg + 5;
                let a = args(CollKind::AllReduce, 0, vec![count]);
                if let Err(e) = verify_on(&a, &topo, Algo::Hierarchical) {
                    panic!("{e} on hosts {topo:?}, {k} segments");
                }
                // One stage 2 after another, the local stages beside them.
                let s = build_on(&a, 0, &topo, Algo::Hierarchical).unwrap();
                assert_eq!(s.phases.len(), k * 2 * (h - 1) + 2 * (l - 1));
            }
        }
    }

    #[test]
    fn hierarchical_gathers_cross_hosts_once_per_block() {
        // 3 hosts × 2 ranks, interleaved: a host's NIC carries each block of
        // the other hosts' ranks once (allgather: in, reduce_scatter: out, as
        // partial sums), and only between ranks with the same local rank.
        let topo = Topology::from_hosts(&[0, 1, 2, 0, 1, 2]);
        let counts: Vec<usize> = (0..6).map(|r| 100 + r).collect();
        for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
            let a = args(kind, 0, counts.clone());
            let mut nic = [0usize; 3];
            for r in 0..6 {
                let s = build_on(&a, r, &topo, Algo::Hierarchical).unwrap();
                for st in s.phases.iter().flat_map(|p| &p.steps) {
                    if let Step::Send { peer, src } = st {
                        if topo.host_of(*peer) != topo.host_of(r) {
                            assert_eq!(topo.local_rank(*peer), topo.local_rank(r), "{kind}");
                            let h = if kind == CollKind::AllGather {
                                *peer
                            } else {
                                r
                            };
                            nic[topo.host_of(h)] += src.len;
                        }
                    }
                }
            }
            for (h, carried) in nic.iter().enumerate() {
                let own: usize = topo.ranks_on(h).iter().map(|&r| counts[r]).sum();
                let others = counts.iter().sum::<usize>() - own;
                assert_eq!(*carried, others, "{kind} host {h}");
            }
        }
    }

    #[test]
    fn allreduce_matrix() {
        verify_matrix(CollKind::AllReduce);
    }

    #[test]
    fn reduce_matrix() {
        verify_matrix(CollKind::Reduce);
    }

    #[test]
    fn broadcast_matrix() {
        verify_matrix(CollKind::Broadcast);
    }

    #[test]
    fn allgather_matrix() {
        verify_matrix(CollKind::AllGather);
    }

    #[test]
    fn reduce_scatter_matrix() {
        verify_matrix(CollKind::ReduceScatter);
    }

    #[test]
    fn alltoall_matrix() {
        verify_matrix(CollKind::AllToAll);
    }

    #[test]
    fn gather_matrix() {
        verify_matrix(CollKind::Gather);
    }

    #[test]
    fn scatter_matrix() {
        verify_matrix(CollKind::Scatter);
    }

    #[test]
    fn barrier_matrix() {
        verify_matrix(CollKind::Barrier);
    }

    #[test]
    fn send_recv_pairs() {
        for n in 2..=6 {
            for count in [0, 1, 7] {
                for src in 0..n {
                    for dst in (0..n).filter(|&d| d != src) {
                        verify_p2p(count, src, dst, n).unwrap();
                    }
                }
                for root in 0..n {
                    for kind in [CollKind::Send, CollKind::Recv] {
                        verify(&args(kind, root, vec![count]), n, Algo::P2p).unwrap();
                    }
                }
            }
        }
    }

    // ---- The verifier catches bugs. ----

    fn schedules(a: &CollArgs, n: usize, algo: Algo) -> Vec<Schedule> {
        (0..n).map(|r| build(a, r, n, algo).unwrap()).collect()
    }

    /// Where the `nth` step matching `pred` is in rank r's schedule.
    fn find(s: &Schedule, nth: usize, pred: impl Fn(&Step) -> bool) -> (usize, usize) {
        s.phases
            .iter()
            .enumerate()
            .flat_map(|(q, p)| p.steps.iter().enumerate().map(move |(i, st)| (q, i, st)))
            .filter(|(_, _, st)| pred(st))
            .map(|(q, i, _)| (q, i))
            .nth(nth)
            .expect("no such step")
    }

    fn is_recv(s: &Step) -> bool {
        matches!(s, Step::Recv { .. })
    }

    fn is_send(s: &Step) -> bool {
        matches!(s, Step::Send { .. })
    }

    #[test]
    fn catches_a_dropped_recv() {
        let a = args(CollKind::AllReduce, 0, vec![8]);
        let mut s = schedules(&a, 4, Algo::Ring);
        let (q, i) = find(&s[2], 1, is_recv);
        s[2].phases[q].steps.remove(i);
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(
                e.fault,
                Fault::Unmatched { from: 1, to: 2, .. } | Fault::Deadlock { .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("rank 1 phase"), "{e}");
    }

    #[test]
    fn catches_a_deadlock() {
        // Both ranks send in phase 0 and receive in phase 1: each send waits
        // for the other rank to reach its receive, which waits for the send.
        let a = args(CollKind::AllGather, 0, vec![1, 1]);
        let s: Vec<Schedule> = (0..2)
            .map(|r| Schedule {
                rank: r,
                nranks: 2,
                algo: Algo::Direct,
                phases: vec![
                    Phase {
                        steps: vec![
                            Step::Copy {
                                src: Span::input(0, 1),
                                dst: Span::output(r, 1),
                            },
                            Step::Send {
                                peer: 1 - r,
                                src: Span::input(0, 1),
                            },
                        ],
                    },
                    Phase {
                        steps: vec![Step::Recv {
                            peer: 1 - r,
                            dst: Span::output(1 - r, 1),
                            reduce_with: None,
                        }],
                    },
                ],
                scratch_len: 0,
            })
            .collect();
        let e = verify_schedules(&a, &s).unwrap_err();
        let Fault::Deadlock { waits } = &e.fault else {
            panic!("{e}")
        };
        assert_eq!(waits.len(), 2);
        assert_eq!(
            waits[0],
            Wait {
                at: At {
                    rank: 0,
                    phase: 0,
                    step: 1
                },
                peer: 1,
                peer_phase: 1,
                peer_now: Some(0)
            }
        );
        assert!(
            e.to_string()
                .contains("rank 0 phase 0 step 1 waits for rank 1 to reach phase 1"),
            "{e}"
        );
    }

    fn is_fold(s: &Step) -> bool {
        matches!(s, Step::Fold { .. })
    }

    #[test]
    fn applies_folds_after_the_receives_of_their_phase() {
        // Direct allreduce folds n-2 contributions per owner; without the
        // last of them rank 1's block misses a rank.
        let a = args(CollKind::AllReduce, 0, vec![10]);
        let mut s = schedules(&a, 4, Algo::Direct);
        assert!(verify_schedules(&a, &s).is_ok());
        let (q, i) = find(&s[1], 1, is_fold);
        s[1].phases[q].steps.remove(i);
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(matches!(e.fault, Fault::WrongResult { .. }), "{e}");
    }

    #[test]
    fn catches_a_fold_that_no_receive_lands() {
        let a = args(CollKind::AllReduce, 0, vec![10]);
        let mut s = schedules(&a, 4, Algo::Direct);
        let (q, i) = find(&s[2], 0, is_fold);
        if let Step::Fold { src, .. } = &mut s[2].phases[q].steps[i] {
            src.off += 1;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            e.to_string()
                .contains("no Recv of its phase lands exactly that span"),
            "{e}"
        );
    }

    #[test]
    fn catches_a_fold_into_what_a_receive_writes_meanwhile() {
        // Rank 0's first fold (from the first slot) into the second slot,
        // which a receive of the same phase lands.
        let a = args(CollKind::AllReduce, 0, vec![12]);
        let mut s = schedules(&a, 4, Algo::Direct);
        let (q, i) = find(&s[0], 0, is_fold);
        if let Step::Fold { src, dst } = &mut s[0].phases[q].steps[i] {
            *dst = Span::scratch(src.off + src.len, src.len);
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::Overlap { at, .. } if at == At { rank: 0, phase: q, step: i }),
            "{e}"
        );
        assert!(e.to_string().contains("which runs meanwhile"), "{e}");
    }

    #[test]
    fn catches_a_double_count() {
        let a = args(CollKind::AllReduce, 0, vec![6]);
        let mut s = schedules(&a, 3, Algo::Ring);
        s[0].phases.push(Phase {
            steps: vec![Step::Reduce {
                src: Span::input(0, 6),
                dst: Span::output(0, 6),
            }],
        });
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(matches!(e.fault, Fault::DoubleCount { both: 1, .. }), "{e}");
        assert_eq!(e.layout, Some(Layout::Distinct));
    }

    #[test]
    fn catches_a_write_to_input() {
        let a = args(CollKind::AllReduce, 0, vec![8]);
        let mut s = schedules(&a, 4, Algo::Ring);
        let (q, i) = find(&s[1], 0, is_recv);
        if let Step::Recv { dst, .. } = &mut s[1].phases[q].steps[i] {
            dst.buf = Buf::Input;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::WritesInput { at } if at == At { rank: 1, phase: q, step: i }),
            "{e}"
        );
    }

    #[test]
    fn catches_a_non_root_writing_its_reduce_output() {
        // In an in-place reduce a non-root's Output is the user's tensor.
        let a = args(CollKind::Reduce, 0, vec![4]);
        let mut s = schedules(&a, 2, Algo::BinomialTree);
        s[1].phases.push(Phase {
            steps: vec![Step::Copy {
                src: Span::input(0, 4),
                dst: Span::output(0, 4),
            }],
        });
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::WritesNonRootOutput { at } if at.rank == 1),
            "{e}"
        );
    }

    #[test]
    fn catches_mismatched_lengths() {
        let a = args(CollKind::AllGather, 0, vec![3; 4]);
        let mut s = schedules(&a, 4, Algo::Ring);
        let (q, i) = find(&s[3], 2, is_send);
        if let Step::Send { src, .. } = &mut s[3].phases[q].steps[i] {
            src.len -= 1;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::TransferLenMismatch { send_len: 2, recv_len: 3, send, .. } if send.rank == 3),
            "{e}"
        );
    }

    /// A two-rank allreduce that is right out of place and wrong in place: it
    /// overwrites Output with the peer's data, then reads Input.
    #[test]
    fn catches_an_in_place_hazard() {
        let a = args(CollKind::AllReduce, 0, vec![4]);
        let whole = |buf| Span::new(buf, 0, 4);
        let s: Vec<Schedule> = (0..2)
            .map(|r| Schedule {
                rank: r,
                nranks: 2,
                algo: Algo::Direct,
                phases: vec![
                    Phase {
                        steps: vec![
                            Step::Send {
                                peer: 1 - r,
                                src: whole(Buf::Input),
                            },
                            Step::Recv {
                                peer: 1 - r,
                                dst: whole(Buf::Scratch),
                                reduce_with: None,
                            },
                        ],
                    },
                    Phase {
                        steps: vec![Step::Copy {
                            src: whole(Buf::Scratch),
                            dst: whole(Buf::Output),
                        }],
                    },
                    Phase {
                        steps: vec![Step::Reduce {
                            src: whole(Buf::Input),
                            dst: whole(Buf::Scratch),
                        }],
                    },
                    Phase {
                        steps: vec![Step::Copy {
                            src: whole(Buf::Scratch),
                            dst: whole(Buf::Output),
                        }],
                    },
                ],
                scratch_len: 4,
            })
            .collect();
        let e = verify_schedules(&a, &s).unwrap_err();
        assert_eq!(e.layout, Some(Layout::InPlace), "{e}");
        assert!(matches!(e.fault, Fault::DoubleCount { .. }), "{e}");
    }

    /// Receiving into Output while sending Input in the same phase is fine
    /// out of place and a race in place.
    #[test]
    fn catches_an_in_place_race() {
        let a = args(CollKind::AllReduce, 0, vec![4]);
        let whole = |buf| Span::new(buf, 0, 4);
        let s: Vec<Schedule> = (0..2)
            .map(|r| Schedule {
                rank: r,
                nranks: 2,
                algo: Algo::Direct,
                phases: vec![Phase {
                    steps: vec![
                        Step::Send {
                            peer: 1 - r,
                            src: whole(Buf::Input),
                        },
                        Step::Recv {
                            peer: 1 - r,
                            dst: whole(Buf::Output),
                            reduce_with: Some(whole(Buf::Input)),
                        },
                    ],
                }],
                scratch_len: 0,
            })
            .collect();
        let e = verify_schedules(&a, &s).unwrap_err();
        assert_eq!(e.layout, Some(Layout::InPlace), "{e}");
        assert!(matches!(e.fault, Fault::Overlap { .. }), "{e}");
    }

    #[test]
    fn catches_different_operand_orders() {
        // Each rank receives both peers' inputs and reduces them into its own
        // in the order r+1, r+2: ((0+1)+2), ((1+2)+0), ((2+0)+1).
        let a = args(CollKind::AllReduce, 0, vec![1]);
        let one = |buf, off| Span::new(buf, off, 1);
        let s: Vec<Schedule> = (0..3)
            .map(|r| {
                let (p1, p2) = ((r + 1) % 3, (r + 2) % 3);
                Schedule {
                    rank: r,
                    nranks: 3,
                    algo: Algo::Direct,
                    phases: vec![
                        Phase {
                            steps: vec![
                                Step::Send {
                                    peer: p1,
                                    src: one(Buf::Input, 0),
                                },
                                Step::Send {
                                    peer: p2,
                                    src: one(Buf::Input, 0),
                                },
                                Step::Recv {
                                    peer: p1,
                                    dst: one(Buf::Output, 0),
                                    reduce_with: Some(one(Buf::Input, 0)),
                                },
                                Step::Recv {
                                    peer: p2,
                                    dst: one(Buf::Scratch, 0),
                                    reduce_with: None,
                                },
                            ],
                        },
                        Phase {
                            steps: vec![Step::Reduce {
                                src: one(Buf::Scratch, 0),
                                dst: one(Buf::Output, 0),
                            }],
                        },
                    ],
                    scratch_len: 1,
                }
            })
            .collect();
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::NotBitwiseIdentical { index: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn catches_an_incomplete_barrier() {
        // One ring round: everybody hears only from the rank below.
        let a = args(CollKind::Barrier, 0, vec![]);
        let nothing = Span::output(0, 0);
        let s: Vec<Schedule> = (0..4)
            .map(|r| Schedule {
                rank: r,
                nranks: 4,
                algo: Algo::Dissemination,
                phases: vec![Phase {
                    steps: vec![
                        Step::Send {
                            peer: (r + 1) % 4,
                            src: nothing,
                        },
                        Step::Recv {
                            peer: (r + 3) % 4,
                            dst: nothing,
                            reduce_with: None,
                        },
                    ],
                }],
                scratch_len: 0,
            })
            .collect();
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(
                e.fault,
                Fault::BarrierIncomplete {
                    rank: 0,
                    missing: 0b0110
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn catches_misplaced_data() {
        let a = args(CollKind::AllGather, 0, vec![2; 3]);
        let mut s = schedules(&a, 3, Algo::Direct);
        let steps = &mut s[0].phases[0].steps;
        let dsts: Vec<usize> = (0..steps.len()).filter(|&i| is_recv(&steps[i])).collect();
        let dst_of = |st: &Step| match st {
            Step::Recv { dst, .. } => *dst,
            _ => unreachable!(),
        };
        let (d0, d1) = (dst_of(&steps[dsts[0]]), dst_of(&steps[dsts[1]]));
        for (i, d) in [(dsts[0], d1), (dsts[1], d0)] {
            if let Step::Recv { dst, .. } = &mut steps[i] {
                *dst = d;
            }
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(matches!(e.fault, Fault::WrongResult { rank: 0, .. }), "{e}");
    }

    #[test]
    fn catches_overlapping_recvs_bounds_and_bad_peers() {
        let a = args(CollKind::AllGather, 0, vec![2; 3]);
        let base = schedules(&a, 3, Algo::Direct);
        let recvs: Vec<usize> = (0..base[0].phases[0].steps.len())
            .filter(|&i| is_recv(&base[0].phases[0].steps[i]))
            .collect();

        let mut s = base.clone();
        let first = s[0].phases[0].steps[recvs[0]].clone();
        if let (Step::Recv { dst: d0, .. }, Step::Recv { dst, .. }) =
            (first, &mut s[0].phases[0].steps[recvs[1]])
        {
            *dst = d0;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::Overlap { at, .. } if at.rank == 0),
            "{e}"
        );

        let mut s = base.clone();
        if let Step::Recv { dst, .. } = &mut s[0].phases[0].steps[recvs[0]] {
            dst.off = 5;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(
            matches!(e.fault, Fault::OutOfBounds { buf_len: 6, .. }),
            "{e}"
        );

        let mut s = base;
        if let Step::Recv { peer, .. } = &mut s[0].phases[0].steps[recvs[0]] {
            *peer = 0;
        }
        let e = verify_schedules(&a, &s).unwrap_err();
        assert!(matches!(e.fault, Fault::BadPeer { peer: 0, .. }), "{e}");
    }

    #[test]
    fn refuses_what_it_cannot_cover() {
        let a = args(CollKind::AllReduce, 0, vec![1]);
        let e = verify(&a, 65, Algo::Ring).unwrap_err();
        assert!(matches!(e.fault, Fault::TooManyRanks { nranks: 65 }));
        let e = verify(&a, 4, Algo::Pairwise).unwrap_err();
        assert!(matches!(
            e.fault,
            Fault::BadArgs(ScheduleError::NotApplicable { .. })
        ));
        let e = verify(&args(CollKind::Send, 0, vec![1]), 1, Algo::P2p).unwrap_err();
        assert!(matches!(
            e.fault,
            Fault::Build {
                error: ScheduleError::SelfPeer { .. },
                ..
            }
        ));
    }
}
