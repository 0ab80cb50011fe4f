//! Double binary tree allreduce (as in NCCL): two binary trees over all ranks,
//! each reducing one half of the buffer to its root and broadcasting it back,
//! both at once and pipelined in segments.
//!
//! Terms:
//! - **place** of a rank: its index in the topology's ring order (the
//!   default order, or the path finder's), so ranks at nearby places are
//!   near in the network and the trees' low edges stay on a host or in a
//!   rack.
//! - **position**: a rank's place in a tree. Tree 0 uses the place itself;
//!   tree 1 **mirrors** it (`n-1-p`) when n is even and **shifts** it
//!   (`p-1 mod n`) when n is odd. Either way the ranks that are leaves in one
//!   tree are inner nodes in the other, so every rank does inner-node work in
//!   about one tree only and the two trees' traffic spreads over all links.
//! - **binary tree** over positions 0..n: a position u > 0 with lowest set bit
//!   b has **parent** `(u xor b) | 2b` (u+b or u-b, whichever clears bit b and
//!   sets 2b), or `u xor b` when that is not below n. Every step up raises the
//!   lowest set bit, so this reaches 0, the **root**; a node has at most two
//!   **children**, the root one.
//! - **half**: tree t reduces and broadcasts half t of the buffer (balanced).
//! - **segment**: one of `segments` balanced pieces of a half; the pipeline
//!   unit.
//! - **slot**: a global time step. Every message of segment 0 has a slot, the
//!   same for sender and receiver; segment j's messages take the slots of
//!   segment 0 plus j. A rank's phase for slot s holds all its messages in
//!   slot s, so matching steps always sit in phases of the same slot and no
//!   cyclic wait can arise (the ranks at the smallest unfinished slot can
//!   always finish it).
//! - **ready**: the slot from which a node's partial result (its Input
//!   reduced with its children's partial results) is complete. A leaf is
//!   ready at 0; a node receives its children in order of readiness, one per
//!   slot, and is ready the slot after the last.
//!
//! Reduce: node u reduces the first child's segment on arrival with its
//! Input (`Output = Input ⊕ child`, no copy), later children into Output, then
//! sends Output (a leaf: its Input) to its parent in the slot its parent
//! chose. Broadcast: the root, ready at slot R, sends the finished segment to
//! its children in slot R; a node forwards it to its children the slot after
//! it arrives. Within one segment a node's steps are in distinct slots (its
//! receives, then its send up, then the broadcast); steps of different
//! segments or halves in one phase touch disjoint spans. In place, a leaf
//! sends `Input[seg]` before the broadcast overwrites it.
//!
//! Each half is finished on its tree's root and only copied from there, so
//! all ranks hold the same bits.
//!
//! About 2·log2(n) + segments latencies and each rank sends about one buffer:
//! log-depth like recursive doubling, and near the ring's bandwidth once the
//! pipeline is full.

use super::ir::Span;
use super::plan::{Blocks, Plan};
use super::topology::Topology;

/// Elements per segment the pipeline aims at: long enough that a segment's
/// latency is small next to its transfer time on fast links.
const SEGMENT_ELEMS: usize = 1 << 15;
/// The most segments per half: more only adds phases once the pipeline is full.
const MAX_SEGMENTS: usize = 64;

/// Segments per half of `len` elements: one per `SEGMENT_ELEMS`, at least
/// one and at most `MAX_SEGMENTS`.
fn segments_for(len: usize) -> usize {
    len.div_ceil(SEGMENT_ELEMS).clamp(1, MAX_SEGMENTS)
}

pub(crate) fn allreduce(plan: &mut Plan, topo: &Topology, count: usize) {
    let halves = Blocks::balanced(count, 2);
    let segments = segments_for(halves.max_len());
    allreduce_in_segments(plan, topo, count, segments);
}

/// One tree's timing: for every position, its parent, its children in the
/// order it receives them, the slot of its send up (segment 0) and the slot
/// in which the broadcast reaches it.
struct Tree {
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
    up: Vec<usize>,
    down: Vec<usize>,
}

/// The trees of the last few sizes, shared by every rank of the process:
/// a tree is the same for all ranks of a job, and building one is O(n log n)
/// (the choice builds a few hosts' ranks' schedules per call shape).
static TREES: std::sync::Mutex<Vec<(usize, std::sync::Arc<Tree>)>> =
    std::sync::Mutex::new(Vec::new());
const TREES_KEPT: usize = 4;

impl Tree {
    /// [`Tree::new`], from [`TREES`] when built already.
    fn shared(n: usize) -> std::sync::Arc<Tree> {
        let mut kept = TREES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = kept.iter().find(|(m, _)| *m == n) {
            return t.clone();
        }
        let t = std::sync::Arc::new(Tree::new(n));
        if kept.len() == TREES_KEPT {
            kept.remove(0);
        }
        kept.push((n, t.clone()));
        t
    }

    fn new(n: usize) -> Tree {
        let parent: Vec<Option<usize>> = (0..n)
            .map(|u| {
                (u > 0).then(|| {
                    let b = 1 << u.trailing_zeros();
                    let up = (u ^ b) | (b << 1);
                    if up < n {
                        up
                    } else {
                        u ^ b
                    }
                })
            })
            .collect();
        let mut children = vec![Vec::new(); n];
        for (u, p) in parent.iter().enumerate() {
            if let Some(p) = *p {
                children[p].push(u);
            }
        }
        // Readiness bottom-up: a child's lowest set bit is below its parent's
        // (the root's is above everything), so positions by increasing lowest
        // set bit visit children first.
        let mut order: Vec<usize> = (1..n).collect();
        order.sort_by_key(|&u| u.trailing_zeros());
        order.push(0);
        let mut ready = vec![0; n];
        let mut up = vec![0; n];
        for &u in &order {
            children[u].sort_by_key(|&c| (ready[c], c));
            let mut slot = 0;
            for &c in &children[u] {
                up[c] = slot.max(ready[c]);
                slot = up[c] + 1;
            }
            ready[u] = slot;
        }
        // The broadcast top-down, in reverse order: parents before children.
        let mut down = vec![0; n];
        for &u in order.iter().rev() {
            let from = if u == 0 { ready[0] } else { down[u] + 1 };
            for &c in &children[u] {
                down[c] = from;
            }
        }
        Tree {
            parent,
            children,
            up,
            down,
        }
    }
}

/// Place p's position in tree t (see the module comment).
fn position(t: usize, p: usize, n: usize) -> usize {
    match (t, n % 2) {
        (0, _) => p,
        (_, 0) => n - 1 - p,
        _ => (p + n - 1) % n,
    }
}

/// The place at position u of tree t: the inverse of [`position`].
fn place_at(t: usize, u: usize, n: usize) -> usize {
    match (t, n % 2) {
        (0, _) => u,
        (_, 0) => n - 1 - u,
        _ => (u + 1) % n,
    }
}

/// A step of this rank, keyed for ordering: (slot, tree, segment, order
/// within them). Both ends of a message derive the same (slot, tree,
/// segment), and a pair of ranks has at most one message per (tree,
/// segment) and direction, so sorting by the key lists messages between two
/// ranks in the same order on both sides.
type Keyed = ((usize, usize, usize, usize), Event);

enum Event {
    Send(usize, Span),
    Recv(usize, Span, Option<Span>),
}

fn allreduce_in_segments(plan: &mut Plan, topo: &Topology, count: usize, segments: usize) {
    let n = plan.nranks;
    let order = topo.ring_order();
    let place = order
        .iter()
        .position(|&x| x == plan.rank)
        .expect("every rank is in the ring order");
    let rank_at = |t: usize, u: usize, n: usize| order[place_at(t, u, n)];
    let tree = Tree::shared(n);
    let halves = Blocks::balanced(count, 2);
    let mut events: Vec<Keyed> = Vec::new();
    for t in 0..2 {
        let u = position(t, place, n);
        let segs = Blocks::balanced(halves.len(t), segments);
        for j in 0..segments {
            let off = halves.off(t) + segs.off(j);
            let len = segs.len(j);
            let (input, output) = (Span::input(off, len), Span::output(off, len));
            let mut push = |slot: usize, i: usize, e: Event| events.push(((slot + j, t, j, i), e));
            for (i, &c) in tree.children[u].iter().enumerate() {
                let with = if i == 0 { input } else { output };
                push(
                    tree.up[c],
                    i,
                    Event::Recv(rank_at(t, c, n), output, Some(with)),
                );
            }
            if let Some(p) = tree.parent[u] {
                let mine = if tree.children[u].is_empty() {
                    input
                } else {
                    output
                };
                push(tree.up[u], 0, Event::Send(rank_at(t, p, n), mine));
                push(tree.down[u], 0, Event::Recv(rank_at(t, p, n), output, None));
            }
            for (i, &c) in tree.children[u].iter().enumerate() {
                push(tree.down[c], i, Event::Send(rank_at(t, c, n), output));
            }
        }
    }
    events.sort_by_key(|&(key, _)| key);
    let mut at = 0;
    while at < events.len() {
        let slot = events[at].0 .0;
        let mut phase = plan.phase();
        while at < events.len() && events[at].0 .0 == slot {
            match events[at].1 {
                Event::Send(peer, src) => phase.send(peer, src),
                Event::Recv(peer, dst, None) => phase.recv(peer, dst),
                Event::Recv(peer, dst, Some(with)) => phase.recv_reduce(peer, dst, with),
            };
            at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ir::{Algo, CollArgs, Schedule};
    use super::super::verify::verify_schedules;
    use super::*;
    use crate::types::CollKind;

    fn schedules(n: usize, count: usize, segments: usize) -> Vec<Schedule> {
        (0..n)
            .map(|r| {
                let mut plan = Plan::new(r, n);
                allreduce_in_segments(&mut plan, &Topology::single_host(n), count, segments);
                plan.finish(Algo::DoubleBinaryTree)
            })
            .collect()
    }

    /// The verify matrix builds with one segment at its small counts; this
    /// proves the pipeline with several, including more than elements.
    #[test]
    fn pipelined_segments_verify() {
        for n in 2..=32 {
            for count in [1, 7, 2 * n + 3, 100] {
                for segments in [2, 3, 8] {
                    let a = CollArgs {
                        kind: CollKind::AllReduce,
                        root: 0,
                        counts: vec![count],
                    };
                    if let Err(e) = verify_schedules(&a, &schedules(n, count, segments)) {
                        panic!("n={n} count={count} segments={segments}: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn trees_are_binary_and_complementary() {
        for n in 2..=64 {
            let t = Tree::new(n);
            assert!(t.children.iter().all(|c| c.len() <= 2), "n={n}");
            assert_eq!(t.children[0].len(), 1, "n={n}");
            // Inner nodes of tree 0 are even positions (and 0); the mirrored
            // or shifted tree 1 makes them leaves there, except near the
            // root where the shift or the mirror must land somewhere.
            let inner = |r: usize| !t.children[r].is_empty();
            let both = (0..n)
                .filter(|&r| inner(r) && inner(position(1, r, n)))
                .count();
            assert!((0..n).all(|p| place_at(1, position(1, p, n), n) == p));
            assert!(both <= 2, "n={n}: {both} ranks are inner in both trees");
        }
    }
}
