//! Ring algorithms: allreduce, allgather, reduce_scatter.
//!
//! Terms:
//! - **ring**: the ranks in order 0 → 1 → … → n-1 → 0. Every rank sends only
//!   to its **next**, `(r+1) mod n`, and receives only from its **prev**,
//!   `(r-1) mod n`.
//! - **chunk**: one of the n pieces the buffer is cut into: balanced chunks for
//!   allreduce, the ranks' blocks for allgather and reduce_scatter.
//! - **step**: one phase of the ring. In step s every rank sends one chunk and
//!   receives another, so every link carries 1/n of the buffer at once.
//! - **reduce-scatter pass**: n-1 steps in which every chunk travels once
//!   around the ring, gaining one rank's contribution per hop; at the end each
//!   rank holds one fully reduced chunk.
//! - **allgather pass**: n-1 steps in which every finished chunk travels once
//!   around the ring, so every rank ends with all of them.
//!
//! Each rank sends (n-1)/n of the buffer per pass: bandwidth-optimal, but a
//! pass costs n-1 latencies, so rings are for large buffers.
//!
//! A chunk is reduced on a rank exactly once per pass, on arrival, reading the
//! rank's own Input (`dst = Input ⊕ incoming`). So Input is never copied to
//! Output first and, when Input and Output are the same memory, `Input[i]` is
//! read before anything writes `Output[i]`. Every chunk's final value is computed
//! on one rank and only copied from there, so all ranks hold the same bits.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};

fn neighbours(plan: &Plan) -> (usize, usize) {
    let (r, n) = (plan.rank, plan.nranks);
    ((r + 1) % n, (r + n - 1) % n)
}

/// Allreduce: a reduce-scatter pass, then an allgather pass, both on Output.
pub(crate) fn allreduce(plan: &mut Plan, count: usize) {
    let (r, n) = (plan.rank, plan.nranks);
    let (next, prev) = neighbours(plan);
    let chunks = Blocks::balanced(count, n);
    // Reduce-scatter: in step s rank r passes on chunk r-s (its own Input in
    // step 0, else the partial result it made in step s-1) and adds its Input
    // to chunk r-s-1. After step n-2 it holds the finished chunk r+1.
    for s in 0..n - 1 {
        let send_c = (r + n - s) % n;
        let recv_c = (r + 2 * n - s - 1) % n;
        let src = if s == 0 { Buf::Input } else { Buf::Output };
        plan.phase()
            .send(next, chunks.span(src, send_c))
            .recv_reduce(
                prev,
                chunks.span(Buf::Output, recv_c),
                chunks.span(Buf::Input, recv_c),
            );
    }
    // Allgather: in step s rank r forwards finished chunk r+1-s and receives
    // chunk r-s. It receives every chunk but r+1, which it finished itself, so
    // every chunk of Output is written and no copy is needed.
    for s in 0..n - 1 {
        let send_c = (r + 1 + n - s) % n;
        let recv_c = (r + n - s) % n;
        plan.phase()
            .send(next, chunks.span(Buf::Output, send_c))
            .recv(prev, chunks.span(Buf::Output, recv_c));
    }
}

/// Allgather: an allgather pass over the ranks' blocks of Output.
pub(crate) fn allgather(plan: &mut Plan, counts: &[usize]) {
    let (r, n) = (plan.rank, plan.nranks);
    let (next, prev) = neighbours(plan);
    let blocks = Blocks::of_counts(counts);
    let own = Span::input(0, counts[r]);
    // In step s rank r forwards block r-s (its own, straight from Input, in
    // step 0) and receives block r-s-1.
    for s in 0..n - 1 {
        let send_b = (r + n - s) % n;
        let recv_b = (r + 2 * n - s - 1) % n;
        let mut phase = plan.phase();
        let src = if s == 0 {
            phase.copy(own, blocks.span(Buf::Output, r));
            own
        } else {
            blocks.span(Buf::Output, send_b)
        };
        phase
            .send(next, src)
            .recv(prev, blocks.span(Buf::Output, recv_b));
    }
}

/// Reduce-scatter: a reduce-scatter pass over the ranks' blocks of Input.
///
/// Partial results travel through two scratch **slots** of the largest block's
/// size, alternating, because the block sent in a step cannot also be written
/// in it; the last step reduces straight into Output.
pub(crate) fn reduce_scatter(plan: &mut Plan, counts: &[usize]) {
    let (r, n) = (plan.rank, plan.nranks);
    let (next, prev) = neighbours(plan);
    let blocks = Blocks::of_counts(counts);
    let slot_size = blocks.max_len();
    let slot = |s: usize, len: usize| Span::scratch((s % 2) * slot_size, len);
    // Steps 0..n-3 write slots 0, 1, 0, …: at most two are live.
    plan.need_scratch((n - 2).min(2) * slot_size);
    // In step s rank r passes on block r-s-1 and adds its Input to block
    // r-s-2; in step n-2 that is block r, its own, finished into Output.
    for s in 0..n - 1 {
        let send_b = (r + 2 * n - s - 1) % n;
        let recv_b = (r + 2 * n - s - 2) % n;
        let src = if s == 0 {
            blocks.span(Buf::Input, send_b)
        } else {
            slot(s - 1, blocks.len(send_b))
        };
        let dst = if s == n - 2 {
            Span::output(0, counts[r])
        } else {
            slot(s, blocks.len(recv_b))
        };
        plan.phase()
            .send(next, src)
            .recv_reduce(prev, dst, blocks.span(Buf::Input, recv_b));
    }
}
