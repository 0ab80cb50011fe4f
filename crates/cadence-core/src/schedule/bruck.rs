//! Bruck's algorithms: allgather and all-to-all in ceil(log2 n) rounds, for
//! any n.
//!
//! Terms:
//! - **round** k (k = 0, 1, … while 2^k < n): the rank sends to one peer and
//!   receives from another at distance 2^k.
//! - **position** j of rank r: a place in r's rotated view of the blocks.
//!   Bruck's algorithms work on positions, so that every rank runs the same
//!   pattern relative to itself; the rotation is undone at the end.
//!
//! Allgather: position j of rank r is the block of rank (r+j) mod n. Before
//! round k the rank holds positions `0..2^k`; it sends the first
//! `m = min(2^k, n-2^k)` of them to r-2^k and receives positions
//! `2^k..2^k+m` from r+2^k (which are that rank's positions `0..m`), so after
//! the last round it holds all n. The classic algorithm keeps positions in a
//! rotated buffer and rotates it into place at the end; here the positions
//! live directly in Output: positions `0..n` are Output's blocks from r to
//! n-1 and then from 0 to r-1, so a run of positions is contiguous in Output
//! except where it wraps from block n-1 to block 0. Sender and receiver hold
//! the same blocks and so wrap at the same block, and a message is sent as
//! (at most) two pieces split there. No scratch, no final rotation.
//!
//! All-to-all: position j of rank r holds a block meant for rank (r-j) mod
//! n; at first r's own send block for it. In round k every rank sends, to
//! r-2^k, every position j with bit k set and receives the same positions
//! from r+2^k. A block thus travels from its source s by the set bits of
//! j = (s-d) mod n and reaches d at position j; at the end position j of r
//! holds the block from source r+j. Before round k, position j of rank h
//! holds the block from source h + (j mod 2^k) (to that minus j), so both
//! ends of a message know every block's length from the counts. Position j
//! is final after round k = its highest set bit: then its blocks (positions
//! `2^k..2^(k+1)`, sources r+2^k, r+2^k+1, …) land straight in Output, where
//! they are contiguous but for the wrap from source n-1 to 0, and the
//! message carries them first. The rest of the message (positions that move
//! again) lands in a fresh **receive area** of scratch. The sender **packs**
//! its positions with bit k set into one scratch **staging** area by local
//! copies (from Input, or a receive area of an earlier round), so a round is
//! one message of up to three pieces per peer. Scratch: the largest staging
//! area plus every round's receive area.
//!
//! ceil(log2 n) latencies; allgather sends (n-1)/n of the output like the
//! ring, all-to-all sends each block once per set bit of its distance, about
//! log2(n)/2 times the data: for small blocks, where latency dominates.

use super::ir::{Buf, CollArgs, Span};
use super::plan::{Blocks, Plan};

/// The rounds' distances 1, 2, 4, … below n.
fn distances(n: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(move |&d| d < n)
}

/// Spans of Output holding the blocks `first, first+1, …` (count `m`, taken
/// mod n): one span, or two where the run wraps from block n-1 to block 0.
fn wrapped(blocks: &Blocks, n: usize, first: usize, m: usize) -> [Span; 2] {
    let end = first + m;
    if end <= n {
        [blocks.range(Buf::Output, first, end), Span::output(0, 0)]
    } else {
        [
            blocks.range(Buf::Output, first, n),
            blocks.range(Buf::Output, 0, end - n),
        ]
    }
}

pub(crate) fn allgather(plan: &mut Plan, counts: &[usize]) {
    let (r, n) = (plan.rank, plan.nranks);
    let blocks = Blocks::of_counts(counts);
    for (k, d) in distances(n).enumerate() {
        let m = d.min(n - d);
        let (to, from) = ((r + n - d) % n, (r + d) % n);
        let mut phase = plan.phase();
        if k == 0 {
            // The own block goes out from Input, not from its fresh copy
            // (see `ring::allgather_groups` on why).
            let own = Span::input(0, counts[r]);
            phase.copy(own, blocks.span(Buf::Output, r)).send(to, own);
        } else {
            for piece in wrapped(&blocks, n, r, m) {
                phase.send(to, piece);
            }
        }
        for piece in wrapped(&blocks, n, (r + d) % n, m) {
            phase.recv(from, piece);
        }
    }
}

pub(crate) fn alltoall(plan: &mut Plan, args: &CollArgs) {
    let (r, n) = (plan.rank, plan.nranks);
    let block = |s: usize, d: usize| args.alltoall_block(s, d, n);
    // Offsets of rank q's receive blocks in its Output, by source.
    let recv_blocks =
        |q: usize| Blocks::of_counts(&(0..n).map(|s| block(s, q)).collect::<Vec<_>>());
    let send = Blocks::of_counts(&(0..n).map(|d| block(r, d)).collect::<Vec<_>>());
    let recv = recv_blocks(r);
    // The length of position j's block on rank h before the round at
    // distance d.
    let len_at = |h: usize, j: usize, d: usize| {
        let s = (h + j % d) % n;
        block(s, (s + n - j) % n)
    };
    let rounds: Vec<usize> = distances(n).collect();
    // Per round: the positions that move, the final ones (below 2d) first.
    let moving = |d: usize| (1..n).filter(move |j| j & d != 0);
    // Scratch: the staging area, as large as the largest packing, then the
    // rounds' receive areas one after another.
    let staging = rounds
        .iter()
        .map(|&d| moving(d).map(|j| len_at(r, j, d)).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut area = staging;
    // Where each position's block lives now: at first, in Input.
    let mut at: Vec<Span> = (0..n)
        .map(|j| send.span(Buf::Input, (r + n - j) % n))
        .collect();
    for &d in &rounds {
        let (to, from) = ((r + n - d) % n, (r + d) % n);
        let finals = d.min(n - d);
        let mut phase = plan.phase();
        if d == 1 {
            phase.copy(at[0], recv.span(Buf::Output, r));
        }
        let mut packed = 0;
        for j in moving(d) {
            phase.copy(at[j], Span::scratch(packed, at[j].len));
            packed += at[j].len;
        }
        // The final part in the pieces the receiver's Output splits it into.
        let mut sent = 0;
        for piece in wrapped(&recv_blocks(to), n, (to + d) % n, finals) {
            phase.send(to, Span::scratch(sent, piece.len));
            sent += piece.len;
        }
        phase.send(to, Span::scratch(sent, packed - sent));
        for piece in wrapped(&recv, n, from, finals) {
            phase.recv(from, piece);
        }
        let start = area;
        for j in moving(d).filter(|&j| j >= 2 * d) {
            at[j] = Span::scratch(area, len_at(from, j, d));
            area += at[j].len;
        }
        phase.recv(from, Span::scratch(start, area - start));
    }
    plan.need_scratch(area);
}
