//! Rooted collectives as two bandwidth-optimal stages: reduce as ring
//! reduce-scatter then gather, broadcast as scatter then ring allgather.
//!
//! Terms:
//! - **virtual rank** v = (rank - root) mod n, so the root is 0. The **ring**
//!   runs over virtual ranks: v sends to its **next** v+1 and receives from its
//!   **prev** v-1 (mod n).
//! - **chunk**: one of n balanced pieces of the buffer; chunk c belongs to
//!   virtual rank c in the scatter.
//! - **step**: one phase of a ring pass (see `ring.rs`).
//! - **slot** (reduce): one of two alternating pieces of scratch, a chunk
//!   long, where a non-root rank keeps the partial chunk it forwards next.
//!   Non-root ranks never write Output, so their user tensor survives an
//!   in-place reduce, as with NCCL; the root works in Output.
//!
//! Reduce: a ring reduce-scatter pass leaves the finished chunk v+1 on every v
//! (see `ring.rs`); then every non-root rank sends it to the root, which
//! receives all n-1 at once.
//!
//! Broadcast: the root sends chunk v to every v at once; then an allgather
//! pass in which the root, which already holds everything, only sends (its
//! own chunks, straight from Output) and v = n-1 does not send to it.
//!
//! Either way the root moves about two buffers' worth instead of a whole
//! buffer per tree level, and all links work at once, at the price of n
//! latencies: for large buffers.

use super::ir::{Buf, Span};
use super::plan::{to_real, to_virtual, Blocks, Plan};

pub(crate) fn reduce(plan: &mut Plan, count: usize, root: usize) {
    let n = plan.nranks;
    let v = to_virtual(plan.rank, root, n);
    let real = |u: usize| to_real(u % n, root, n);
    let (next, prev) = (real(v + 1), real(v + n - 1));
    let chunks = Blocks::balanced(count, n);
    let slot_size = chunks.max_len();
    let slot = |s: usize, c: usize| Span::scratch((s % 2) * slot_size, chunks.len(c));
    // Where the partial chunk c made in step s lives.
    let partial = |s: usize, c: usize| {
        if v == 0 {
            chunks.span(Buf::Output, c)
        } else {
            slot(s, c)
        }
    };
    if v != 0 {
        plan.need_scratch((n - 1).min(2) * slot_size);
    }
    // Reduce-scatter: in step s, v passes on chunk v-s and adds its Input to
    // chunk v-s-1.
    for s in 0..n - 1 {
        let send_c = (v + n - s) % n;
        let recv_c = (v + 2 * n - s - 1) % n;
        let src = if s == 0 {
            chunks.span(Buf::Input, send_c)
        } else {
            partial(s - 1, send_c)
        };
        plan.phase().send(next, src).recv_reduce(
            prev,
            partial(s, recv_c),
            chunks.span(Buf::Input, recv_c),
        );
    }
    // Gather: v holds finished chunk v+1; the root already holds chunk 1.
    let mut phase = plan.phase();
    if v == 0 {
        for u in 1..n {
            phase.recv(real(u), chunks.span(Buf::Output, (u + 1) % n));
        }
    } else {
        phase.send(real(0), partial(n - 2, (v + 1) % n));
    }
}

pub(crate) fn broadcast(plan: &mut Plan, count: usize, root: usize) {
    let n = plan.nranks;
    let v = to_virtual(plan.rank, root, n);
    let real = |u: usize| to_real(u % n, root, n);
    let chunks = Blocks::balanced(count, n);
    let chunk = |c: usize| chunks.span(Buf::Output, c);
    // Scatter.
    let mut phase = plan.phase();
    if v == 0 {
        for u in 1..n {
            phase.send(real(u), chunk(u));
        }
    } else {
        phase.recv(real(0), chunk(v));
    }
    // Allgather: in step s, v sends chunk v-s and receives chunk v-s-1. The
    // root never receives; it has all chunks, so it sends its own copy of the
    // chunk the ring would have it forward.
    for s in 0..n - 1 {
        let mut phase = plan.phase();
        if v != n - 1 {
            phase.send(real(v + 1), chunk((v + n - s) % n));
        }
        if v != 0 {
            phase.recv(real(v + n - 1), chunk((v + 2 * n - s - 1) % n));
        }
    }
}
