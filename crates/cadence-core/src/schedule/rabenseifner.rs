//! Rabenseifner's allreduce: a recursive-halving reduce-scatter followed by a
//! recursive-doubling allgather.
//!
//! Terms (fold, p, virtual rank, roles as in `recursive_doubling.rs`; window,
//! mask, partner and keeping as in `recursive_halving.rs`):
//! - **chunk**: one of p balanced pieces of the buffer; after the halving
//!   rounds virtual rank v holds finished chunk v. A window of virtual ranks
//!   `lo..hi` covers chunks `lo..hi`, which are contiguous.
//! - **doubling round** k (k = 0 … log2(p)-1): v exchanges with v xor 2^k;
//!   each sends the finished chunks of its group (the 2^k virtual ranks that
//!   share its bits above k) and receives the partner group's, so the
//!   finished part doubles every round until every rank has all of it.
//!
//! Everything happens in Output: round 0 reads the rank's Input (or, on a
//! folded rank, the fold's result in Output) and every round writes only the
//! half it keeps, which it never sends in the same phase. When Input and
//! Output are the same memory, `Input[i]` is read (as the `reduce_with` of
//! the receive that overwrites it, or by a send of the other half) before
//! anything writes `Output[i]`. Every chunk is finished on one virtual rank
//! and only copied from there, so all ranks hold the same bits.
//!
//! 2·log2(p) latencies (+2 with a fold) and each rank sends 2(p-1)/p of the
//! buffer: the bandwidth of the ring with the latency of recursive doubling,
//! for medium and large buffers.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};
use super::recursive_doubling::{Geometry, Role};
use super::recursive_halving::{halving_rounds, Halving};

pub(crate) fn allreduce(plan: &mut Plan, count: usize) {
    let g = Geometry::new(plan.nranks);
    let chunks = Blocks::balanced(count, 1 << g.rounds);
    let whole = |buf: Buf| Span::new(buf, 0, count);
    let segment = |lo: usize, hi: usize| (chunks.off(lo), chunks.off(hi));
    let output = |off: usize, len: usize| Span::output(off, len);
    let run = |plan: &mut Plan, v: usize, start: Buf| {
        halving_rounds(
            plan,
            &g,
            v,
            &Halving {
                segment: &segment,
                start: &|off, len| Span::new(start, off, len),
                partial: &|off, len, _| output(off, len),
            },
        );
        doubling_rounds(plan, &g, v, &chunks);
    };
    match g.role(plan.rank) {
        Role::Extra { partner } => {
            plan.phase().send(partner, whole(Buf::Input));
            plan.phase().recv(partner, whole(Buf::Output));
        }
        Role::Folded { extra, v } => {
            plan.phase()
                .recv_reduce(extra, whole(Buf::Output), whole(Buf::Input));
            run(plan, v, Buf::Output);
            plan.phase().send(extra, whole(Buf::Output));
        }
        Role::Plain { v } => run(plan, v, Buf::Input),
    }
}

/// The allgather half: v starts with finished chunk v and doubles its group.
fn doubling_rounds(plan: &mut Plan, g: &Geometry, v: usize, chunks: &Blocks) {
    for k in 0..g.rounds {
        let size = 1 << k;
        let mine = v & !(size - 1);
        let theirs = mine ^ size;
        plan.phase()
            .send(
                g.real(v ^ size),
                chunks.range(Buf::Output, mine, mine + size),
            )
            .recv(
                g.real(v ^ size),
                chunks.range(Buf::Output, theirs, theirs + size),
            );
    }
}
