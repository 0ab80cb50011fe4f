//! Recursive halving: reduce_scatter in log2(n) rounds, and the halving
//! rounds that Rabenseifner's allreduce shares (`rabenseifner.rs`).
//!
//! Terms (fold, p, virtual rank and roles as in `recursive_doubling.rs`):
//! - **segment** of virtual ranks `lo..hi`: the contiguous elements whose
//!   reduction they are responsible for. For reduce_scatter, virtual rank v's
//!   segment is the blocks of the real ranks it stands for (both ranks of a
//!   folded pair), so a range of virtual ranks is a contiguous range of blocks
//!   whatever the counts.
//! - **window**: the virtual ranks whose segment a rank is still reducing,
//!   `0..p` at first. Round i (i = 0 … log2(p)-1) uses the **mask** p/2^(i+1):
//!   virtual rank v exchanges with its **partner** v xor mask, which has the
//!   same window. The window splits at `lo + mask`; v **keeps** the half it
//!   lies in and sends its partial result for the other half, receiving the
//!   partner's partial result for the kept half and reducing it on arrival. The
//!   window halves every round, until it is v alone.
//! - **partial**: where a rank's running result for an element lives. Round 0
//!   reads the rank's contribution where it starts (Input, or the fold's
//!   result); later rounds read what the previous round wrote.
//!
//! Every element is reduced along one path of halving rounds and its final
//! value exists on one rank only, so no two ranks compute it.
//!
//! Reduce-scatter: the fold is whole-buffer (the extra rank sends all of its
//! Input to its partner, which reduces it into scratch); plain ranks keep
//! their partials in scratch the size of the half they keep after round 0
//! and reduce the last round straight into Output. A folded rank finishes
//! both blocks of its pair, copies its own to Output and sends the extra
//! rank its block. log2(p) (+2 with a fold) latencies, and each rank sends
//! about (p-1)/p of the buffer: between direct and ring.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};
use super::recursive_doubling::{Geometry, Role};

/// Where the halving rounds of one rank read and write.
pub(crate) struct Halving<'a> {
    /// Elements `[start, end)` of the segment of virtual ranks `lo..hi`.
    pub segment: &'a dyn Fn(usize, usize) -> (usize, usize),
    /// The rank's contribution to elements `[off, off+len)` before round 0.
    pub start: &'a dyn Fn(usize, usize) -> Span,
    /// Where a round leaves its partial result for `[off, off+len)`; the flag
    /// says the round is the last.
    pub partial: &'a dyn Fn(usize, usize, bool) -> Span,
}

/// The halving rounds of virtual rank v (see the module comment).
pub(crate) fn halving_rounds(plan: &mut Plan, g: &Geometry, v: usize, h: &Halving<'_>) {
    let (mut lo, mut hi) = (0, 1 << g.rounds);
    for i in 0..g.rounds {
        let mask = 1 << (g.rounds - 1 - i);
        let mid = lo + mask;
        let (keep, give) = if v < mid {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (ks, ke) = (h.segment)(keep.0, keep.1);
        let (gs, ge) = (h.segment)(give.0, give.1);
        // Round 0 reads the contribution; later rounds the previous round's
        // partial, which covers exactly this round's window.
        let current = |off: usize, len: usize| {
            if i == 0 {
                (h.start)(off, len)
            } else {
                (h.partial)(off, len, false)
            }
        };
        let last = i + 1 == g.rounds;
        plan.phase()
            .send(g.real(v ^ mask), current(gs, ge - gs))
            .recv_reduce(
                g.real(v ^ mask),
                (h.partial)(ks, ke - ks, last),
                current(ks, ke - ks),
            );
        (lo, hi) = keep;
    }
}

/// Reduce-scatter: fold, halving rounds over the ranks' blocks, unfold.
pub(crate) fn reduce_scatter(plan: &mut Plan, counts: &[usize]) {
    let r = plan.rank;
    let g = Geometry::new(plan.nranks);
    let blocks = Blocks::of_counts(counts);
    let segment = |lo: usize, hi: usize| (blocks.off(g.first(lo)), blocks.off(g.first(hi)));
    let total = blocks.total();
    let own = Span::output(0, counts[r]);
    match g.role(r) {
        Role::Extra { partner } => {
            plan.phase().send(partner, Span::input(0, total));
            plan.phase().recv(partner, own);
        }
        Role::Folded { extra, v } => {
            // Partials mirror Input's offsets in scratch; the fold fills it.
            plan.need_scratch(total);
            plan.phase()
                .recv_reduce(extra, Span::scratch(0, total), Span::input(0, total));
            let in_scratch = |off: usize, len: usize| Span::scratch(off, len);
            halving_rounds(
                plan,
                &g,
                v,
                &Halving {
                    segment: &segment,
                    start: &in_scratch,
                    partial: &|off, len, _| in_scratch(off, len),
                },
            );
            plan.phase()
                .copy(blocks.span(Buf::Scratch, r), own)
                .send(extra, blocks.span(Buf::Scratch, extra));
        }
        Role::Plain { v } => {
            // After round 0 this rank only ever holds partials for the half
            // of the virtual ranks it kept, so scratch mirrors that half.
            let half = 1 << (g.rounds - 1);
            let (base, end) = if v < half {
                segment(0, half)
            } else {
                segment(half, 2 * half)
            };
            plan.need_scratch(end - base);
            halving_rounds(
                plan,
                &g,
                v,
                &Halving {
                    segment: &segment,
                    start: &|off, len| Span::input(off, len),
                    // The last round's kept segment is this rank's block.
                    partial: &|off, len, last| {
                        if last {
                            own
                        } else {
                            Span::scratch(off - base, len)
                        }
                    },
                },
            );
        }
    }
}
