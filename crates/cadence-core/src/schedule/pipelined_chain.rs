//! Pipelined chain broadcast: the data flows down the chain in segments, so
//! every link works at once. The chain is the topology's
//! (`Topology::chain_from`): root → root+1 → … → root-1 on one host, and
//! across hosts the ring order from the root on, leaving the root's host
//! once.
//!
//! Terms:
//! - **chain position** i: the root is 0, and position i receives from i-1
//!   and sends to i+1 (the last sends to nobody).
//! - **segment**: one of S balanced pieces of the buffer (see
//!   [`segments_for`]).
//! - **slot** t: one phase of every rank. In slot t position i sends segment
//!   t-i to i+1 and receives segment t-i+1 from i-1 (those that exist), so
//!   segment j leaves position i in slot i+j, one slot after it arrived. Both
//!   ends of a link agree on each message's slot and a rank's phases follow
//!   its slots, so the ranks at the smallest unfinished slot can always
//!   finish it: no cyclic wait. The segment received and the one sent in a
//!   slot differ, so a phase's spans never overlap.
//!
//! n-2+S slots; every rank but the last receives and sends the buffer once:
//! bandwidth-optimal for large buffers, at the price of n-1 latencies for
//! the first segment to reach the end.

use super::ir::Buf;
use super::plan::{Blocks, Plan};
use super::topology::Topology;

/// Elements per segment aimed at for large buffers.
const SEGMENT_ELEMS: usize = 1 << 15;
/// At least this many segments (and at least n), so that filling the
/// pipeline (n-1 slots) costs at most about as much as draining it.
const MIN_SEGMENTS: usize = 8;
/// No more segments than this (unless n is larger): beyond it the per-message
/// overhead outweighs the shorter fill.
const MAX_SEGMENTS: usize = 1024;

/// Segments for `count` elements on n ranks: `count / SEGMENT_ELEMS` for
/// large buffers, capped at `MAX_SEGMENTS`, at least `max(n, MIN_SEGMENTS)`,
/// and never more than the elements (so none is empty; 0 for count 0).
pub(crate) fn segments_for(count: usize, n: usize) -> usize {
    count
        .div_ceil(SEGMENT_ELEMS)
        .min(MAX_SEGMENTS)
        .max(n.max(MIN_SEGMENTS))
        .min(count)
}

pub(crate) fn broadcast(plan: &mut Plan, topo: &Topology, count: usize, root: usize) {
    let n = plan.nranks;
    let chain = topo.chain_from(root);
    let i = chain
        .iter()
        .position(|&r| r == plan.rank)
        .expect("every rank is on the chain");
    let (next, prev) = (chain[(i + 1) % n], chain[(i + n - 1) % n]);
    let s = segments_for(count, n);
    if s == 0 {
        return;
    }
    let segs = Blocks::balanced(count, s);
    // This rank's slots: from receiving segment 0 (slot i-1) to sending
    // segment s-1 (slot i+s-1).
    for t in i.saturating_sub(1)..i + s {
        let mut phase = plan.phase();
        if i > 0 && t + 1 >= i && t + 1 - i < s {
            phase.recv(prev, segs.span(Buf::Output, t + 1 - i));
        }
        if i + 1 < n && t >= i && t - i < s {
            phase.send(next, segs.span(Buf::Output, t - i));
        }
    }
}
