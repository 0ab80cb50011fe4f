//! Direct ("starlike") algorithms: allreduce (two stages, and one-shot),
//! reduce_scatter, reduce, broadcast, allgather, gather, scatter.
//!
//! Terms:
//! - **block**: the part of a buffer one rank is responsible for: balanced
//!   chunk r of the buffer for allreduce, rank r's block at its displacement
//!   for the v-collectives.
//! - **owner**: the rank a block belongs to. It alone reduces its block.
//! - **stage**: one phase in which a rank exchanges with all n-1 **peers** at
//!   once, visiting them in the order r+1, r+2, … so that ranks start on
//!   different partners. Allreduce is two stages (reduce to owners, then
//!   allgather from them); reduce_scatter is the first of those, allgather the
//!   second; reduce, broadcast, gather and scatter are a single stage to or
//!   from the root (reduce and broadcast: the root owns one block, the whole
//!   buffer).
//! - **slot**: a piece of scratch, one block long, holding one peer's
//!   contribution to the owner's block until it is reduced.
//!
//! The owner receives n-1 contributions to its block in one phase; they cannot
//! all reduce into one span at once, so the first peer's reduces on arrival
//! (`block = Input ⊕ incoming`, no copy of Input) and the others land in slots
//! that are folded into the block in peer order as they land (`Step::Fold`:
//! each element gets the contributions in the same order whenever its bytes
//! come in). The owner alone computes its block, so every rank ends with the
//! same bits.
//!
//! Two latencies for allreduce, and each rank sends 2(n-1)/n of the buffer,
//! but as n-1 concurrent messages: for medium buffers on few ranks.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};

/// The peers of rank r in visiting order, with their distance k = 1..n.
fn peers(r: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    (1..n).map(move |k| (k, (r + k) % n))
}

/// First stage of allreduce and reduce_scatter: send block p of Input to each
/// owner p, and gather the contributions to this rank's block: the first
/// peer's reduced into `dst` on arrival, the others into slots, folded into
/// `dst` in peer order as they land.
fn reduce_to_owners(plan: &mut Plan, blocks: &Blocks, dst: Span) {
    let (r, n) = (plan.rank, plan.nranks);
    let own = blocks.span(Buf::Input, r);
    plan.need_scratch((n - 2) * own.len);
    let mut phase = plan.phase();
    for (k, p) in peers(r, n) {
        phase.send(p, blocks.span(Buf::Input, p));
        if k == 1 {
            phase.recv_reduce(p, dst, own);
        } else {
            phase.recv(p, slot(k, own.len));
        }
    }
    for k in 2..n {
        phase.fold(slot(k, own.len), dst);
    }
}

/// Where the peer at distance k ≥ 2 leaves its contribution.
fn slot(k: usize, len: usize) -> Span {
    Span::scratch((k - 2) * len, len)
}

/// Allreduce: reduce each chunk at its owner, then every owner sends its
/// finished chunk to every peer.
pub(crate) fn allreduce(plan: &mut Plan, count: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let chunks = Blocks::balanced(count, n);
    let own = chunks.span(Buf::Output, r);
    reduce_to_owners(plan, &chunks, own);
    let mut phase = plan.phase();
    for (_, p) in peers(r, n) {
        phase.send(p, own).recv(p, chunks.span(Buf::Output, p));
    }
}

/// One-shot allreduce: every rank sends its whole Input to every peer and
/// receives theirs into one scratch slot per rank (one phase, one wait on
/// each peer, no rank waiting on another's partial result), then reduces
/// the n buffers into Output locally, in rank order: ((x0 ⊕ x1) ⊕ x2) ⊕ …
/// on every rank, so every rank ends with the same bits (⊕ of two values is
/// commutative; only the grouping has to agree). It moves n-1 whole buffers
/// per rank, so it is for small ones. In an in-place call Output is Input,
/// so a rank other than 0 keeps its own contribution in its slot first.
pub(crate) fn one_shot_allreduce(plan: &mut Plan, count: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let input = Span::input(0, count);
    let slot = |k: usize| Span::scratch(k * count, count);
    plan.need_scratch(n * count);
    let mut phase = plan.phase();
    if r != 0 {
        phase.copy(input, slot(r));
    }
    for (_, p) in peers(r, n) {
        phase.send(p, input).recv(p, slot(p));
    }
    let out = Span::output(0, count);
    let mut phase = plan.phase();
    phase.copy(if r == 0 { input } else { slot(0) }, out);
    for k in 1..n {
        phase.reduce(slot(k), out);
    }
}

/// Reduce-scatter: the first stage of allreduce over the ranks' blocks.
pub(crate) fn reduce_scatter(plan: &mut Plan, counts: &[usize]) {
    let blocks = Blocks::of_counts(counts);
    let dst = Span::output(0, counts[plan.rank]);
    reduce_to_owners(plan, &blocks, dst);
}

/// Reduce: every rank sends its whole Input to the root at once; the root
/// reduces the first peer's into Output on arrival and folds the others in,
/// in peer order, as they land. Non-roots wait on nobody, which is what pays
/// when ranks share cores: a rank never waits for one that the scheduler
/// has not run yet, as a tree's inner ranks do.
pub(crate) fn reduce(plan: &mut Plan, count: usize, root: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let whole = Span::input(0, count);
    if r != root {
        plan.phase().send(root, whole);
        return;
    }
    let dst = Span::output(0, count);
    plan.need_scratch((n - 2) * count);
    let mut phase = plan.phase();
    for (k, p) in peers(r, n) {
        if k == 1 {
            phase.recv_reduce(p, dst, whole);
        } else {
            phase.recv(p, slot(k, count));
        }
    }
    for k in 2..n {
        phase.fold(slot(k, count), dst);
    }
}

/// Broadcast: the root sends its whole Output to every peer at once. A
/// non-root waits on the root alone, never on a forwarding rank the scheduler
/// may not have run yet (a tree's inner ranks), which is what pays for small
/// messages when ranks share cores. The root sends n-1 copies, so it loses to
/// the tree once the root's copying outweighs the latencies it saves.
pub(crate) fn broadcast(plan: &mut Plan, count: usize, root: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let data = Span::output(0, count);
    let mut phase = plan.phase();
    if r != root {
        phase.recv(root, data);
        return;
    }
    for (_, p) in peers(r, n) {
        phase.send(p, data);
    }
}

/// Allgather: every rank sends its Input to every peer and copies it into its
/// own block of Output.
pub(crate) fn allgather(plan: &mut Plan, counts: &[usize]) {
    let (r, n) = (plan.rank, plan.nranks);
    let blocks = Blocks::of_counts(counts);
    let own = Span::input(0, counts[r]);
    let mut phase = plan.phase();
    phase.copy(own, blocks.span(Buf::Output, r));
    for (_, p) in peers(r, n) {
        phase.send(p, own).recv(p, blocks.span(Buf::Output, p));
    }
}

/// Gather: every rank sends its Input to the root, which receives all blocks
/// at once and copies its own.
pub(crate) fn gather(plan: &mut Plan, counts: &[usize], root: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let own = Span::input(0, counts[r]);
    let mut phase = plan.phase();
    if r != root {
        phase.send(root, own);
        return;
    }
    let blocks = Blocks::of_counts(counts);
    phase.copy(own, blocks.span(Buf::Output, r));
    for (_, p) in peers(r, n) {
        phase.recv(p, blocks.span(Buf::Output, p));
    }
}

/// Scatter: the root sends every rank its block of Input at once and copies
/// its own.
pub(crate) fn scatter(plan: &mut Plan, counts: &[usize], root: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let own = Span::output(0, counts[r]);
    let mut phase = plan.phase();
    if r != root {
        phase.recv(root, own);
        return;
    }
    let blocks = Blocks::of_counts(counts);
    phase.copy(blocks.span(Buf::Input, r), own);
    for (_, p) in peers(r, n) {
        phase.send(p, blocks.span(Buf::Input, p));
    }
}
