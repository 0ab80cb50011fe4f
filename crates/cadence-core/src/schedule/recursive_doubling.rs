//! Recursive doubling: allreduce and allgather in log2(n) rounds.
//!
//! Terms:
//! - **p**: the largest power of two not above n; **rem** = n - p.
//! - **fold**: ranks below 2·rem pair up as (2i, 2i+1). The even one, an
//!   **extra** rank, hands its data to the odd one and sits out the rounds; the
//!   odd one, a **folded** rank, takes part for both. At the end the folded
//!   rank hands the result back (**unfold**). Ranks from 2·rem up are
//!   **plain**.
//! - **virtual rank**: the index of a taking-part rank among the p: i for the
//!   folded rank 2i+1, r - rem for a plain rank r.
//! - **round** k (k = 0 … log2(p)-1): virtual rank v exchanges with its
//!   **partner** v xor 2^k.
//! - **group** (allgather): in round k, the 2^k virtual ranks that share v's
//!   bits above k. v holds its group's blocks and receives the partner's group,
//!   so the group doubles every round. The blocks of a group are contiguous in
//!   Output, whatever the counts, so any counts and any n work.
//!
//! In an allreduce round both partners send their whole current value and
//! compute mine ⊕ theirs; the two results are the same tree of operations with
//! the operands of the top node swapped, which IEEE arithmetic gives the same
//! bits, so every rank ends with identical results.
//!
//! log2(p) (+2 with a fold) latencies, but whole-buffer messages: for small
//! buffers.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};

/// Which part a rank plays, and the arithmetic of virtual ranks (shared with
/// the other algorithms that fold: `rabenseifner.rs`, `recursive_halving.rs`).
pub(crate) struct Geometry {
    pub rem: usize,
    pub rounds: u32,
}

pub(crate) enum Role {
    Extra { partner: usize },
    Folded { extra: usize, v: usize },
    Plain { v: usize },
}

impl Geometry {
    pub fn new(n: usize) -> Geometry {
        let p = 1 << n.ilog2();
        Geometry {
            rem: n - p,
            rounds: p.ilog2(),
        }
    }

    pub fn role(&self, r: usize) -> Role {
        if r >= 2 * self.rem {
            Role::Plain { v: r - self.rem }
        } else if r.is_multiple_of(2) {
            Role::Extra { partner: r + 1 }
        } else {
            Role::Folded {
                extra: r - 1,
                v: r / 2,
            }
        }
    }

    /// The real rank taking part as virtual rank v.
    pub fn real(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }

    /// The first real rank whose data virtual rank v holds after the fold
    /// (n for v = p), so virtual ranks `a..b` hold the blocks of real ranks
    /// `first(a)..first(b)`.
    pub fn first(&self, v: usize) -> usize {
        if v < self.rem {
            2 * v
        } else {
            v + self.rem
        }
    }
}

/// Allreduce: fold, rounds of whole-buffer exchange-and-reduce, unfold.
pub(crate) fn allreduce(plan: &mut Plan, count: usize) {
    let all: Vec<usize> = (0..plan.nranks).collect();
    allreduce_among(plan, &all, Span::new(Buf::Input, 0, count));
}

/// Allreduce among `members` (any ranks, this one included; their positions
/// play the ranks of the module comment) of the region `own` of each one's
/// buffer (`Input`, or `Output` when an earlier stage left a partial result
/// there); the result lands in the same region of Output. Hierarchical
/// schedules use it across hosts.
pub(crate) fn allreduce_among(plan: &mut Plan, members: &[usize], own: Span) {
    let me = members
        .iter()
        .position(|&r| r == plan.rank)
        .expect("the rank is a member");
    let g = Geometry::new(members.len());
    let (off, count) = (own.off, own.len);
    let region = |buf: Buf| Span::new(buf, if buf == Buf::Scratch { 0 } else { off }, count);
    match g.role(me) {
        Role::Extra { partner } => {
            plan.phase().send(members[partner], own);
            plan.phase().recv(members[partner], region(Buf::Output));
        }
        Role::Folded { extra, v } => {
            // The rounds alternate Output and Scratch (see `rounds`); start the
            // chain where it will end in Output, so no final copy is needed.
            let start = if g.rounds % 2 == 1 {
                Buf::Scratch
            } else {
                Buf::Output
            };
            plan.phase().recv_reduce(members[extra], region(start), own);
            let end = rounds(plan, &g, members, v, own, start);
            plan.phase().send(members[extra], region(end));
        }
        Role::Plain { v } => {
            let end = rounds(plan, &g, members, v, own, own.buf);
            if end != Buf::Output {
                plan.phase().copy(region(end), region(Buf::Output));
            }
        }
    }
}

/// The exchange rounds of allreduce, starting from the value in `cur` (a
/// buffer, at `own`'s region; Scratch from 0); returns the buffer holding
/// the result.
fn rounds(
    plan: &mut Plan,
    g: &Geometry,
    members: &[usize],
    v: usize,
    own: Span,
    mut cur: Buf,
) -> Buf {
    let region = |buf: Buf| Span::new(buf, if buf == Buf::Scratch { 0 } else { own.off }, own.len);
    plan.need_scratch(own.len);
    for k in 0..g.rounds {
        let partner = members[g.real(v ^ (1 << k))];
        // The value sent in a round cannot be written in it, so each round
        // writes the other buffer. From Input that must be Scratch, not Output:
        // in place the two are the same memory.
        let next = match cur {
            Buf::Scratch => Buf::Output,
            Buf::Input | Buf::Output => Buf::Scratch,
        };
        plan.phase()
            .send(partner, region(cur))
            .recv_reduce(partner, region(next), region(cur));
        cur = next;
    }
    cur
}

/// Allgather: fold, rounds of group exchange, unfold.
pub(crate) fn allgather(plan: &mut Plan, counts: &[usize]) {
    let r = plan.rank;
    let g = Geometry::new(plan.nranks);
    let blocks = Blocks::of_counts(counts);
    let own = Span::input(0, counts[r]);
    let all = Span::output(0, blocks.total());
    match g.role(r) {
        Role::Extra { partner } => {
            plan.phase().send(partner, own);
            plan.phase().recv(partner, all);
        }
        Role::Folded { extra, v } => {
            plan.phase()
                .copy(own, blocks.span(Buf::Output, r))
                .recv(extra, blocks.span(Buf::Output, extra));
            group_rounds(plan, &g, v, &blocks, None);
            plan.phase().send(extra, all);
        }
        Role::Plain { v } => {
            plan.phase().copy(own, blocks.span(Buf::Output, r));
            group_rounds(plan, &g, v, &blocks, Some(own));
        }
    }
}

/// The exchanges of growing groups. With `own` (a plain rank's Input), the
/// first round sends it instead of the same block's copy in Output (see
/// `ring::allgather_groups` on why).
fn group_rounds(plan: &mut Plan, g: &Geometry, v: usize, blocks: &Blocks, own: Option<Span>) {
    for k in 0..g.rounds {
        let size = 1 << k;
        let mine = v & !(size - 1);
        let theirs = mine ^ size;
        let group = |first: usize| blocks.range(Buf::Output, g.first(first), g.first(first + size));
        let send = match own {
            Some(span) if k == 0 => span,
            _ => group(mine),
        };
        plan.phase()
            .send(g.real(v ^ size), send)
            .recv(g.real(v ^ size), group(theirs));
    }
}
