//! Hierarchical schedules: shared memory inside each host, TCP only between
//! ranks with the same local rank, several cross-host rings side by side.
//!
//! Terms (see `topology.rs` for host, local rank, uniform):
//! - **local ring**: the ranks of one host, in local-rank order.
//! - **column**: the ranks with one local rank, one per host, in the
//!   topology's host order; with L ranks per host there are L columns, each
//!   its own cross-host ring.
//!
//! Allreduce with L ranks per host and H hosts, in three stages:
//! 1. reduce-scatter inside each host over L chunks: local rank ℓ ends with
//!    its host's partial sum of chunk ℓ+1 (mod L);
//! 2. each column allreduces that chunk across the hosts, all L columns at
//!    once: by recursive doubling for small chunks, else by a ring (reduce-
//!    scatter then allgather over H sub-chunks);
//! 3. allgather inside each host.
//!
//! Large buffers are **pipelined** (see [`SEGMENT_MIN`]): cut into segments
//! whose stages are laid over each other, so that one segment's local stages
//! run while its neighbours' cross-host stage is on the wire.
//!
//! Each host's NIC carries 2(H-1)/H of the buffer, against 2(N-1)/N for a
//! flat ring over all N = L·H ranks, and a small call takes 2(L-1) cheap
//! local steps plus 2(H-1) cross-host ones instead of 2(N-1) that all cross.
//! Every element's final value is computed once (in stage 2, on one rank)
//! and only copied from there, so all ranks hold the same bits.
//!
//! Allgather and reduce_scatter work on the ranks' blocks. A **column
//! group** is the blocks of one column's ranks, host by host (scattered in
//! the buffer):
//! - allgather: each column allgathers its members' blocks around a ring
//!   across the hosts (H-1 steps), then each host's local ring passes whole
//!   column groups around (L-1 steps, one message per block);
//! - reduce_scatter, the mirror image: each host's local ring reduce-scatters
//!   the column groups (local rank ℓ ends with its host's partial sums of
//!   column ℓ's blocks, packed in Scratch), then each column reduce-scatters
//!   those across the hosts, finishing every block on its own rank.
//!
//! Either way a host's NIC carries the blocks of the other hosts' ranks once:
//! (N-L) blocks, where a flat ring moves (N-1) through every rank.
//!
//! Needs a uniform topology (see [`super::applicable_on`]); with L = 1 it is
//! a ring over the hosts, with H = 1 a ring inside the host.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};
use super::recursive_doubling;
use super::ring::{
    allgather_groups, allgather_pass, reduce_scatter_groups, reduce_scatter_pass, Ring,
};
use super::topology::Topology;

/// Below this many elements per column chunk, the columns allreduce by
/// recursive doubling (log2 H steps, whole chunk each); from it, by a ring
/// (2(H-1) steps, 1/H of the chunk each). At 4 bytes that is a 32 KiB chunk,
/// a 64 KiB allreduce on 2 ranks per host: measured on 4 emulated hosts × 2
/// at 1 Gbit/s, recursive doubling wins at 32 KiB (466 vs 624 µs) and the
/// ring at 64 KiB (816 vs 1013 µs), where the bytes through each NIC
/// decide (96 KiB vs 128 KiB).
pub(crate) const CROSS_RING_MIN: usize = 8 * 1024;

/// From this many elements per segment the allreduce is **pipelined**: the
/// buffer is cut into up to [`MAX_SEGMENTS`] segments of at least this
/// size, each run through the three stages, segment k+1's stage 1 and
/// segment k-1's stage 3 (shared memory) in the same phases as segment k's
/// stage 2 (TCP), so the local stages hide under the network's time instead
/// of adding to it. Below it the stages of the whole buffer run once: the
/// local stages are short there and more segments mean more latencies.
const SEGMENT_MIN: usize = 1 << 20;
const MAX_SEGMENTS: usize = 8;

pub(crate) fn allreduce(plan: &mut Plan, topo: &Topology, count: usize) {
    let l = topo.uniform_ranks_per_host().unwrap_or(0);
    debug_assert!(l > 0, "hierarchical schedules need a uniform topology");
    let h = topo.nhosts();
    let k = segments(l, h, count);
    if k == 1 {
        allreduce_region(plan, topo, 0, count);
        return;
    }
    // Segment j starts 2(H-1) phases (one stage 2) after segment j-1, so
    // the stages 2 follow each other and each segment's stages 1 and 3 fall
    // in its neighbours' stage 2. Every segment has the same phase count on
    // every rank (ring passes only: the segments are above CROSS_RING_MIN),
    // so both ends of every message see the same merged phase and order.
    let segments = Blocks::balanced(count, k);
    for j in 0..k {
        let mut seg = Plan::new(plan.rank, plan.nranks);
        allreduce_region(&mut seg, topo, segments.off(j), segments.len(j));
        plan.overlay(seg, j * 2 * (h - 1));
    }
}

/// How many pipelined segments an allreduce of `count` elements on `l`
/// ranks a host and `h` hosts is cut into. Pipelined segments must take
/// the ring across (see [`allreduce`]).
pub(crate) fn segments(l: usize, h: usize, count: usize) -> usize {
    if l > 1 && h > 1 && SEGMENT_MIN / l >= CROSS_RING_MIN {
        (count / SEGMENT_MIN).clamp(1, MAX_SEGMENTS)
    } else {
        1
    }
}

/// The three stages over the `len` elements from `off`.
fn allreduce_region(plan: &mut Plan, topo: &Topology, off: usize, len: usize) {
    let r = plan.rank;
    let l = topo.uniform_ranks_per_host().unwrap_or(0);
    let host = topo.ranks_on(topo.host_of(r)).to_vec();
    let local = Ring::new(&host, r, topo);
    let whole = Blocks::balanced_in(off, len, l);
    // Stage 1; with one rank per host the contribution stays in Input.
    let (own, chunk) = if l > 1 {
        (
            Buf::Output,
            reduce_scatter_pass(plan, &local, &whole, Buf::Input),
        )
    } else {
        (Buf::Input, 0)
    };
    // Stage 2: every rank of the column finishes the same chunk in stage 1.
    let column = topo.column(topo.local_rank(r));
    if whole.len(chunk) < CROSS_RING_MIN {
        // Latency-bound: log2(H) whole-chunk exchanges beat 2(H-1) ring steps.
        let region = Span::new(own, whole.off(chunk), whole.len(chunk));
        recursive_doubling::allreduce_among(plan, &column, region);
    } else {
        let cross = Ring::new(&column, r, topo);
        let sub = Blocks::balanced_in(whole.off(chunk), whole.len(chunk), cross.len());
        reduce_scatter_pass(plan, &cross, &sub, own);
        allgather_pass(plan, &cross, &sub);
    }
    // Stage 3.
    if l > 1 {
        allgather_pass(plan, &local, &whole);
    }
}

/// Allgather: across hosts along the columns, then column groups inside
/// each host (see the module comment).
pub(crate) fn allgather(plan: &mut Plan, topo: &Topology, counts: &[usize]) {
    let r = plan.rank;
    let blocks = Blocks::of_counts(counts);
    // The own block is copied to Output first; the cross-host ring's first
    // step sends it from Input (`allgather_groups`).
    let own = Span::input(0, counts[r]);
    plan.phase().copy(own, blocks.span(Buf::Output, r));
    let column = topo.column(topo.local_rank(r));
    let cross = Ring::new(&column, r, topo);
    allgather_groups(
        plan,
        &cross,
        &|x| vec![blocks.span(Buf::Output, x)],
        Some(vec![own]),
    );
    let host = topo.ranks_on(topo.host_of(r));
    let local = Ring::new(&host, r, topo);
    allgather_groups(
        plan,
        &local,
        &|x| column_group(topo, &blocks, Buf::Output, topo.local_rank(x)),
        None,
    );
}

/// Reduce-scatter: column groups inside each host, then across hosts along
/// the columns (see the module comment).
pub(crate) fn reduce_scatter(plan: &mut Plan, topo: &Topology, counts: &[usize]) {
    let r = plan.rank;
    let blocks = Blocks::of_counts(counts);
    let out = Span::output(0, counts[r]);
    let column = topo.column(topo.local_rank(r));
    let cross = Ring::new(&column, r, topo);
    if topo.uniform_ranks_per_host().unwrap_or(0) < 2 {
        // One rank per host: only the cross-host stage, from Input.
        let own = |x: usize| vec![blocks.span(Buf::Input, x)];
        reduce_scatter_groups(plan, &cross, &own, 0, &[out]);
        return;
    }
    let host = topo.ranks_on(topo.host_of(r));
    let local = Ring::new(&host, r, topo);
    let own_local = |x: usize| column_group(topo, &blocks, Buf::Input, topo.local_rank(x));
    if topo.nhosts() == 1 {
        reduce_scatter_groups(plan, &local, &own_local, 0, &[out]);
        return;
    }
    // The host's partial sums of this column's blocks, packed from Scratch 0
    // in host order; the passes' slots come after them.
    let mut at = 0;
    let partial: Vec<Span> = column
        .iter()
        .map(|&x| {
            let span = Span::scratch(at, counts[x]);
            at += counts[x];
            span
        })
        .collect();
    plan.need_scratch(at);
    reduce_scatter_groups(plan, &local, &own_local, at, &partial);
    // `partial` follows `column` (the topology's host order, which need not
    // be host index order).
    let own_cross = |x: usize| {
        let at = column
            .iter()
            .position(|&c| c == x)
            .expect("x is in the column");
        vec![partial[at]]
    };
    reduce_scatter_groups(plan, &cross, &own_cross, at, &[out]);
}

/// The blocks of the ranks with local rank `local`, host by host.
fn column_group(topo: &Topology, blocks: &Blocks, buf: Buf, local: usize) -> Vec<Span> {
    topo.column(local)
        .into_iter()
        .map(|x| blocks.span(buf, x))
        .collect()
}
