//! The schedule IR: what one rank does for one collective, as data.
//!
//! Terms used throughout the schedule layer:
//! - **span**: a range of elements `[off, off+len)` in one of the rank's three
//!   buffers (`Input`, `Output`, `Scratch`). Offsets and lengths are in elements,
//!   never bytes; the engine lowers them to bytes once.
//! - **step**: one action: send a span to a peer, receive a span from a peer
//!   (optionally reducing it with local data), copy a span, or reduce one span
//!   into another.
//! - **phase**: a group of steps that run together. The engine first runs the
//!   phase's local steps (`Copy`, `Reduce`) in the order listed, then progresses
//!   all its `Send`s and `Recv`s concurrently, runs its `Fold`s as their data
//!   lands, and finishes the phase when all of them are done. Phases run
//!   strictly one after another.
//! - **fold**: `dst = dst ⊕ src`, where `src` is exactly the span a `Recv` of
//!   the same phase lands. The engine reduces each piece of `src` as soon as
//!   it has landed, so a rank that gathers several contributions to one span
//!   adds them while later bytes still arrive instead of after the phase.
//!   The folds into one `dst` form a **chain**: element by element they run
//!   in step order, after the phase's reducing `Recv` into `dst` (if any)
//!   has landed that element. So the result has the same bits as reducing
//!   the contributions one after another once all had arrived.
//! - **channel order**: messages between two ranks are FIFO. The k-th `Send` from
//!   rank a to rank b (counting over the whole schedule, in phase order, then
//!   step order) is received by the k-th `Recv` at b from a, and both carry the
//!   same number of elements.
//!
//! Rules every schedule obeys (the verifier checks them):
//! - no step writes `Input` (the user's input is read-only);
//! - within a phase, a span written by a `Recv` overlaps no other span of that
//!   phase's transfers (except its own `reduce_with`, when equal to `dst`);
//! - the schedule is correct both when `Input` and `Output` are distinct memory
//!   and, for collectives that allow in-place use (allreduce, reduce), when they
//!   are the same memory (the engine passes the same pointer for both); a
//!   `Copy` from `Input[i..]` to `Output[i..]` is then a no-op, which the
//!   engine skips;
//! - for Reduce, non-root ranks never write `Output` (in an in-place call it
//!   is the user's tensor; partial results live in `Scratch`);
//! - a `Fold`'s `src` is the whole destination of one `Recv` of its phase
//!   that does not reduce, and no other fold reads it; its `dst` is either
//!   disjoint from every other span of the phase's transfers or exactly the
//!   destination of the phase's one reducing `Recv` into it; two folds'
//!   destinations are equal or disjoint;
//! - a phase may only complete when the peers it talks to are in the phases
//!   holding the matching steps (transfers are rendezvous: a large message only
//!   completes while the receiver consumes it), so no cyclic wait exists.

use crate::types::CollKind;
use serde::Serialize;

/// One of a rank's three buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Buf {
    /// The user's input (read-only). For in-place calls the same memory as `Output`.
    Input,
    /// The user's output.
    Output,
    /// Temporary memory owned by the engine, `Schedule::scratch_len` elements.
    Scratch,
}

/// A range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Span {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Span {
    pub const fn new(buf: Buf, off: usize, len: usize) -> Span {
        Span { buf, off, len }
    }
    pub const fn input(off: usize, len: usize) -> Span {
        Span::new(Buf::Input, off, len)
    }
    pub const fn output(off: usize, len: usize) -> Span {
        Span::new(Buf::Output, off, len)
    }
    pub const fn scratch(off: usize, len: usize) -> Span {
        Span::new(Buf::Scratch, off, len)
    }
    pub const fn end(&self) -> usize {
        self.off + self.len
    }
    /// Whether two spans share at least one element of the same buffer.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.off < other.end()
            && other.off < self.end()
    }
}

/// One action of one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Step {
    /// Send the elements of `src` to `peer`.
    Send { peer: usize, src: Span },
    /// Receive `dst.len` elements from `peer`. With `reduce_with: None`,
    /// `dst = incoming`; with `Some(a)`, `dst = a ⊕ incoming` where `a` has the
    /// same length as `dst` and is either `dst` itself or a span that does not
    /// overlap it (typically the same range of `Input`).
    Recv {
        peer: usize,
        dst: Span,
        reduce_with: Option<Span>,
    },
    /// Local copy, `dst = src` (same length, no overlap).
    Copy { src: Span, dst: Span },
    /// Local reduction, `dst = dst ⊕ src` (same length, no overlap).
    Reduce { src: Span, dst: Span },
    /// `dst = dst ⊕ src` while `src`'s `Recv` in this phase lands, in chain
    /// order (see the module comment).
    Fold { src: Span, dst: Span },
}

impl Step {
    pub fn is_transfer(&self) -> bool {
        matches!(self, Step::Send { .. } | Step::Recv { .. })
    }
}

/// Steps that run together (see the module comment).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Phase {
    pub steps: Vec<Step>,
}

/// Named algorithms. Not every algorithm applies to every collective; see
/// [`crate::schedule::algos_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algo {
    /// Reduce-scatter and/or allgather around a ring of ranks, n-1 steps each.
    Ring,
    /// Pairwise exchanges at distance 1, 2, 4, … (non-powers of two fold the
    /// extra ranks into partners first).
    RecursiveDoubling,
    /// "Starlike": every rank exchanges with every other rank directly, in one
    /// phase per stage.
    Direct,
    /// Binomial tree rooted at the collective's root.
    BinomialTree,
    /// Broadcast as scatter from the root followed by a ring allgather.
    ScatterAllgather,
    /// Reduce as ring reduce-scatter followed by a gather to the root.
    ReduceScatterGather,
    /// All-to-all as n-1 rounds of pairwise exchange (round k: send to r+k,
    /// receive from r-k).
    Pairwise,
    /// Barrier by dissemination: round k signals r+2^k, waits on r-2^k.
    Dissemination,
    /// Point-to-point send/recv.
    P2p,
    /// Shared memory inside each host, TCP only between ranks with the same
    /// local rank (see `hierarchical.rs`).
    Hierarchical,
    /// Allreduce as recursive-halving reduce-scatter then recursive-doubling
    /// allgather (non-powers of two fold first, as recursive doubling does).
    Rabenseifner,
    /// Allreduce over two complementary binary trees, each reducing then
    /// broadcasting half of the buffer, pipelined in segments.
    DoubleBinaryTree,
    /// Allreduce on an X×Y grid of ranks: ring reduce-scatter along rows,
    /// ring allreduce along columns, direct allgather along rows (one phase).
    Torus2d,
    /// Bruck: log2(n) rounds at distances 1, 2, 4, … (allgather, alltoall).
    Bruck,
    /// Reduce-scatter by recursive halving (non-powers of two fold first).
    RecursiveHalving,
    /// Broadcast down the chain root → root+1 → …, pipelined in segments.
    PipelinedChain,
    /// [`Algo::Torus2d`] with a ring allgather along the rows in its last
    /// stage: the seed study's "2d-torus(ring)".
    Torus2dRing,
    /// Allreduce in one exchange: every rank sends its whole buffer to
    /// every other, then reduces all n buffers locally in rank order.
    OneShot,
}

impl Algo {
    pub const ALL: [Algo; 18] = [
        Algo::Ring,
        Algo::RecursiveDoubling,
        Algo::Direct,
        Algo::BinomialTree,
        Algo::ScatterAllgather,
        Algo::ReduceScatterGather,
        Algo::Pairwise,
        Algo::Dissemination,
        Algo::P2p,
        Algo::Hierarchical,
        Algo::Rabenseifner,
        Algo::DoubleBinaryTree,
        Algo::Torus2d,
        Algo::Bruck,
        Algo::RecursiveHalving,
        Algo::PipelinedChain,
        Algo::Torus2dRing,
        Algo::OneShot,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "recursive_doubling",
            Algo::Direct => "direct",
            Algo::BinomialTree => "binomial_tree",
            Algo::ScatterAllgather => "scatter_allgather",
            Algo::ReduceScatterGather => "reduce_scatter_gather",
            Algo::Pairwise => "pairwise",
            Algo::Dissemination => "dissemination",
            Algo::P2p => "p2p",
            Algo::Hierarchical => "hierarchical",
            Algo::Rabenseifner => "rabenseifner",
            Algo::DoubleBinaryTree => "double_binary_tree",
            Algo::Torus2d => "torus2d",
            Algo::Bruck => "bruck",
            Algo::RecursiveHalving => "recursive_halving",
            Algo::PipelinedChain => "pipelined_chain",
            Algo::Torus2dRing => "torus2d_ring",
            Algo::OneShot => "one_shot",
        }
    }

    pub fn from_name(s: &str) -> Option<Algo> {
        Algo::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// What a collective call asks for, independent of rank. Buffer layouts (all in
/// elements; `n` ranks; `displ(c)[r]` is the prefix sum of `c` before `r`):
///
/// | kind           | `counts`                          | Input of rank r                 | Output of rank r                      |
/// |----------------|-----------------------------------|---------------------------------|---------------------------------------|
/// | AllReduce      | `[count]`                         | `count`                         | `count`                               |
/// | Reduce         | `[count]`                         | `count`                         | `count` (result meaningful at root)   |
/// | Broadcast      | `[count]`                         | unused                          | `count` (root's holds the data)       |
/// | AllGather      | `counts[r]` per rank (`n`)        | `counts[r]`                     | `sum(counts)`, r's block at `displ[r]`|
/// | ReduceScatter  | `counts[r]` per rank (`n`)        | `sum(counts)`                   | `counts[r]`                           |
/// | AllToAll       | `n*n`, `counts[s*n+d]` = s→d; or `n`: every rank sends `counts[d]` to d; or `2n+1`: one rank's own (see [`CollArgs::alltoallv`]) | blocks for d=0..n in order | blocks from s=0..n in order |
/// | Gather         | `counts[r]` per rank (`n`)        | `counts[r]`                     | root: `sum(counts)`; others: unused   |
/// | Scatter        | `counts[r]` per rank (`n`)        | root: `sum(counts)`; others: -  | `counts[r]`                           |
/// | Barrier        | `[]`                              | -                               | -                                     |
/// | Send           | `[count]`, `root` = destination   | `count`                         | -                                     |
/// | Recv           | `[count]`, `root` = source        | -                               | `count`                               |
///
/// The engine always provides `Output` with the size in this table (allocating
/// it for ranks whose user call has no output), so schedules may use it freely.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CollArgs {
    pub kind: CollKind,
    /// Root for rooted collectives, peer for Send/Recv, 0 otherwise.
    pub root: usize,
    pub counts: Vec<usize>,
}

impl CollArgs {
    /// The elements rank `s` sends to rank `d` in an alltoall of `nranks`
    /// ranks: from the whole matrix, or from the one row every rank sends
    /// (the form a uniform alltoall takes: O(n) a call, not O(n²)).
    pub fn alltoall_block(&self, s: usize, d: usize, nranks: usize) -> usize {
        if let Some((owner, send, recv)) = self.own_alltoall(nranks) {
            debug_assert!(
                s == owner || d == owner,
                "only rank {owner}'s blocks are known"
            );
            return match (s == owner, d == owner) {
                (true, _) => send[d],
                (_, true) => recv[s],
                _ => 0,
            };
        }
        if self.counts.len() == nranks {
            self.counts[d]
        } else {
            self.counts[s * nranks + d]
        }
    }

    /// An alltoall whose counts only rank `rank` knows: `send[d]` elements
    /// to each rank d, `recv[s]` from each rank s (alltoallv: nobody holds
    /// the n × n matrix, O(n) a call). The ranks' counts are checked where
    /// they meet: a message of another length than its receiver expects is
    /// a mismatch naming the sender.
    pub fn alltoallv(rank: usize, send: &[usize], recv: &[usize]) -> CollArgs {
        let mut counts = Vec::with_capacity(send.len() + recv.len() + 1);
        counts.extend_from_slice(send);
        counts.extend_from_slice(recv);
        counts.push(rank);
        CollArgs {
            kind: CollKind::AllToAll,
            root: 0,
            counts,
        }
    }

    /// The rank and its send and receive counts, for the counts of
    /// [`CollArgs::alltoallv`] (a length no other form has: 2n + 1).
    pub fn own_alltoall(&self, nranks: usize) -> Option<(usize, &[usize], &[usize])> {
        if self.kind != CollKind::AllToAll || self.counts.len() != 2 * nranks + 1 {
            return None;
        }
        let (send, rest) = self.counts.split_at(nranks);
        Some((rest[nranks], send, &rest[..nranks]))
    }

    /// Elements the whole call moves or reduces, over every rank's blocks
    /// (what its size is judged by).
    pub fn elements(&self, nranks: usize) -> usize {
        elements(self.kind, &self.counts, nranks)
    }

    /// Elements in rank `rank`'s Input and Output (see the table above).
    pub fn buffer_lens(&self, rank: usize, nranks: usize) -> (usize, usize) {
        let total: usize = self.counts.iter().sum();
        let c0 = self.counts.first().copied().unwrap_or(0);
        match self.kind {
            CollKind::AllReduce | CollKind::Reduce => (c0, c0),
            CollKind::Broadcast => (0, c0),
            CollKind::AllGather => (self.counts[rank], total),
            CollKind::ReduceScatter => (total, self.counts[rank]),
            CollKind::AllToAll => {
                let sent = (0..nranks)
                    .map(|d| self.alltoall_block(rank, d, nranks))
                    .sum();
                let got = (0..nranks)
                    .map(|s| self.alltoall_block(s, rank, nranks))
                    .sum();
                (sent, got)
            }
            CollKind::Gather => (self.counts[rank], if rank == self.root { total } else { 0 }),
            CollKind::Scatter => (if rank == self.root { total } else { 0 }, self.counts[rank]),
            CollKind::Barrier => (0, 0),
            CollKind::Send => (c0, 0),
            CollKind::Recv => (0, c0),
        }
    }
}

/// [`CollArgs::elements`] of a call of `kind` with `counts`.
///
/// Of an alltoall that only one rank's counts describe, as if every rank
/// sent what this one does (the whole is known to nobody).
pub fn elements(kind: CollKind, counts: &[usize], nranks: usize) -> usize {
    match kind {
        CollKind::AllToAll if counts.len() == nranks => counts.iter().sum::<usize>() * nranks,
        CollKind::AllToAll if counts.len() == 2 * nranks + 1 => {
            counts[..nranks].iter().sum::<usize>() * nranks
        }
        _ => counts.iter().sum(),
    }
}

/// One rank's plan for one collective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Schedule {
    pub rank: usize,
    pub nranks: usize,
    pub algo: Algo,
    pub phases: Vec<Phase>,
    /// Elements of scratch memory the engine must provide.
    pub scratch_len: usize,
}
