//! Ring algorithms: allreduce, allgather, reduce_scatter, and the ring
//! passes the hierarchical schedules reuse.
//!
//! Terms:
//! - **ring**: a list of member ranks; position p sends only to its **next**
//!   (position p+1 mod m) and receives only from its **prev** (p-1 mod m).
//!   The flat algorithms use the topology's ring order (host after host), so
//!   the ring crosses each host boundary once; on one host that is rank order.
//! - **chunk**: one of the m pieces the buffer (or a region of it) is cut
//!   into, indexed by ring position: balanced chunks for allreduce, the ranks'
//!   blocks for allgather and reduce_scatter.
//! - **step**: one phase of the ring. In step s every member sends one chunk
//!   and receives another, so every link carries 1/m of the buffer at once.
//! - **reduce-scatter pass**: m-1 steps in which every chunk travels once
//!   around the ring, gaining one member's contribution per hop; at the end
//!   position p holds the fully reduced chunk p+1.
//! - **allgather pass**: m-1 steps in which every finished chunk travels once
//!   around the ring, so every member ends with all of them.
//!
//! Each member sends (m-1)/m of the buffer per pass: bandwidth-optimal, but a
//! pass costs m-1 latencies, so rings are for large buffers.
//!
//! A chunk is reduced on a rank exactly once per pass, on arrival, reading the
//! rank's own contribution (`dst = own ⊕ incoming`). So Input is never copied
//! to Output first and, when Input and Output are the same memory, `Input[i]`
//! is read before anything writes `Output[i]`. Every chunk's final value is
//! computed on one rank and only copied from there, so all ranks hold the same
//! bits.

use super::ir::{Buf, Span};
use super::plan::{Blocks, PhaseBuilder, Plan};
use super::topology::Topology;

/// A ring step's chunk travels between hosts as **slices** of about this
/// many elements (at most [`MAX_SLICES`]), so the engine's lookahead can
/// forward slice k while later slices still arrive: a TCP link does not idle
/// for the last byte's round trip at each step boundary. Small chunks stay
/// whole (one message, one latency), and so do shared-memory hops, where a
/// message costs a wake-up more than it saves.
const SLICE_ELEMS: usize = 16 * 1024;
const MAX_SLICES: usize = 16;

/// How many slices a chunk of `len` elements crossing hosts travels in.
pub(crate) fn slice_count(len: usize) -> usize {
    (len / SLICE_ELEMS).clamp(1, MAX_SLICES)
}

/// The slices of a chunk: both ends of a message compute them from the same
/// chunk length, so they agree.
fn slices(span: Span) -> impl Iterator<Item = Span> {
    let k = slice_count(span.len);
    let cut = Blocks::balanced_in(span.off, span.len, k);
    (0..k).map(move |i| cut.span(span.buf, i))
}

/// One ring step: sends `src` to the next member and receives `dst` from
/// the previous one, sliced on hops between hosts (see [`SLICE_ELEMS`]);
/// with `with`, `dst = with ⊕ incoming`. Both ends of a hop decide alike:
/// whether it crosses hosts, and the chunk's length.
fn exchange(phase: &mut PhaseBuilder, ring: &Ring, src: Span, dst: Span, with: Option<Span>) {
    let cut = |span: Span, across: bool| -> Vec<Span> {
        if across {
            slices(span).collect()
        } else {
            vec![span]
        }
    };
    for s in cut(src, ring.out_across) {
        phase.send(ring.next(), s);
    }
    let dsts = cut(dst, ring.in_across);
    match with {
        None => {
            for d in dsts {
                phase.recv(ring.prev(), d);
            }
        }
        Some(w) => {
            for (d, w) in dsts.into_iter().zip(cut(w, ring.in_across)) {
                phase.recv_reduce(ring.prev(), d, w);
            }
        }
    }
}

/// A ring over `members`, seen from one of them.
pub(crate) struct Ring<'a> {
    members: &'a [usize],
    pos: usize,
    /// Whether the hop to the next member, and from the previous one,
    /// crosses hosts.
    out_across: bool,
    in_across: bool,
}

impl<'a> Ring<'a> {
    /// `rank` must be one of `members`.
    pub fn new(members: &'a [usize], rank: usize, topo: &Topology) -> Ring<'a> {
        let pos = members
            .iter()
            .position(|&r| r == rank)
            .expect("the rank is a member of its ring");
        let m = members.len();
        let host = |p: usize| topo.host_of(members[p % m]);
        Ring {
            members,
            pos,
            out_across: host(pos + 1) != host(pos),
            in_across: host(pos + m - 1) != host(pos),
        }
    }
    pub fn len(&self) -> usize {
        self.members.len()
    }
    /// The member `k` positions after this one (k may be "negative" mod m).
    pub fn at(&self, k: usize) -> usize {
        self.members[(self.pos + k) % self.len()]
    }
    fn next(&self) -> usize {
        self.at(1)
    }
    fn prev(&self) -> usize {
        self.at(self.len() - 1)
    }
    /// Position p+k mod m, for chunk indices.
    fn chunk(&self, k: usize) -> usize {
        (self.pos + k) % self.len()
    }
}

/// Reduce-scatter pass over `chunks` (one per ring position): this rank's
/// contribution to chunk c is `own`'s chunk c (Input, or Output when an
/// earlier stage left a partial result there); results go to Output. Returns
/// the chunk this rank finishes, `pos+1`.
pub(crate) fn reduce_scatter_pass(
    plan: &mut Plan,
    ring: &Ring,
    chunks: &Blocks,
    own: Buf,
) -> usize {
    let m = ring.len();
    // In step s position p passes on chunk p-s (its own contribution in step
    // 0, else the partial result it made in step s-1) and adds its own to
    // chunk p-s-1. After step m-2 it holds the finished chunk p+1.
    for s in 0..m.saturating_sub(1) {
        let send_c = ring.chunk(m - s);
        let recv_c = ring.chunk(2 * m - s - 1);
        let src = if s == 0 { own } else { Buf::Output };
        exchange(
            &mut plan.phase(),
            ring,
            chunks.span(src, send_c),
            chunks.span(Buf::Output, recv_c),
            Some(chunks.span(own, recv_c)),
        );
    }
    ring.chunk(1)
}

/// Allgather pass over `chunks` in Output, where this rank holds the
/// finished chunk `pos+1` (what [`reduce_scatter_pass`] leaves).
pub(crate) fn allgather_pass(plan: &mut Plan, ring: &Ring, chunks: &Blocks) {
    let m = ring.len();
    // In step s position p forwards finished chunk p+1-s and receives chunk
    // p-s: every chunk but p+1 arrives, so no copy is needed.
    for s in 0..m.saturating_sub(1) {
        let send_c = ring.chunk(1 + m - s);
        let recv_c = ring.chunk(m - s);
        exchange(
            &mut plan.phase(),
            ring,
            chunks.span(Buf::Output, send_c),
            chunks.span(Buf::Output, recv_c),
            None,
        );
    }
}

/// Allreduce: a reduce-scatter pass, then an allgather pass, both on Output.
pub(crate) fn allreduce(plan: &mut Plan, topo: &Topology, count: usize) {
    let order = topo.ring_order();
    let ring = Ring::new(&order, plan.rank, topo);
    let chunks = Blocks::balanced(count, ring.len());
    reduce_scatter_pass(plan, &ring, &chunks, Buf::Input);
    allgather_pass(plan, &ring, &chunks);
}

/// Allgather: an allgather pass over the ranks' blocks of Output.
pub(crate) fn allgather(plan: &mut Plan, topo: &Topology, counts: &[usize]) {
    let r = plan.rank;
    let order = topo.ring_order();
    let ring = Ring::new(&order, r, topo);
    let blocks = Blocks::of_counts(counts);
    let own = Span::input(0, counts[r]);
    plan.phase().copy(own, blocks.span(Buf::Output, r));
    allgather_groups(
        plan,
        &ring,
        &|x| vec![blocks.span(Buf::Output, x)],
        Some(vec![own]),
    );
}

/// Allgather pass where member x's **group** is `group(x)`: spans of Output
/// (the same number for every member, possibly scattered); every member
/// starts with its own group and ends with all of them. Each span is its own
/// message, so the receiver needs no unpacking.
///
/// With `own`, step 0 sends those spans (the same data as this rank's
/// group, in Input) instead: the user's input, not the copy this rank has
/// just written to Output. A same-host peer then reads memory the copy did
/// not dirty in this core's cache; where two cores share no cache, a dirty
/// line costs a transfer from the other core (2 ranks, 2 MiB allgather on
/// such a pair: 530–600 µs from Output, 117–123 from Input).
pub(crate) fn allgather_groups(
    plan: &mut Plan,
    ring: &Ring,
    group: &dyn Fn(usize) -> Vec<Span>,
    own: Option<Vec<Span>>,
) {
    let m = ring.len();
    let mut own = own;
    // In step s this rank forwards the group of the member s positions back
    // (its own in step 0) and receives the group of the member s+1 back.
    for s in 0..m.saturating_sub(1) {
        let send = match own.take() {
            Some(spans) if s == 0 => spans,
            _ => group(ring.at(m - s)),
        };
        let recv = group(ring.at(2 * m - s - 1));
        debug_assert_eq!(send.len(), recv.len());
        let mut phase = plan.phase();
        for (src, dst) in send.into_iter().zip(recv) {
            exchange(&mut phase, ring, src, dst, None);
        }
    }
}

/// Reduce-scatter: a reduce-scatter pass over the ranks' blocks of Input.
pub(crate) fn reduce_scatter(plan: &mut Plan, topo: &Topology, counts: &[usize]) {
    let r = plan.rank;
    let order = topo.ring_order();
    let ring = Ring::new(&order, r, topo);
    let blocks = Blocks::of_counts(counts);
    reduce_scatter_groups(
        plan,
        &ring,
        &|x| vec![blocks.span(Buf::Input, x)],
        0,
        &[Span::output(0, counts[r])],
    );
}

/// Reduce-scatter pass where member x's group is a list of segments and
/// `own(x)` is this rank's contribution to them (spans of Input, or of
/// Scratch below `slots`); the group of this rank is finished into `finish`
/// (spans of the same lengths). Every member of the ring runs it with the
/// same segment lengths.
///
/// Partial results travel through two scratch **slots** from `slots` on, each
/// the largest group's size with its segments packed, alternating, because
/// the group sent in a step cannot also be written in it; the last step
/// reduces straight into `finish`. Scratch below `slots` is left alone.
pub(crate) fn reduce_scatter_groups(
    plan: &mut Plan,
    ring: &Ring,
    own: &dyn Fn(usize) -> Vec<Span>,
    slots: usize,
    finish: &[Span],
) {
    let m = ring.len();
    if m < 2 {
        return;
    }
    let total = |x: usize| own(x).iter().map(|s| s.len).sum::<usize>();
    let slot_len = (0..m).map(|k| total(ring.at(k))).max().unwrap_or(0);
    // Steps 0..m-3 write slots 0, 1, 0, …: at most two are live.
    plan.need_scratch(slots + (m - 2).min(2) * slot_len);
    // Member x's group packed into slot k.
    let packed = |k: usize, x: usize| -> Vec<Span> {
        let mut at = slots + (k % 2) * slot_len;
        own(x)
            .iter()
            .map(|seg| {
                let span = Span::scratch(at, seg.len);
                at += seg.len;
                span
            })
            .collect()
    };
    // In step s this rank passes on the group of the member s+1 back and adds
    // its own contribution to the group of the member s+2 back; in step m-2
    // that is its own group, finished into `finish`.
    for s in 0..m - 1 {
        let send_x = ring.at(2 * m - s - 1);
        let recv_x = ring.at(2 * m - s - 2);
        let src = if s == 0 {
            own(send_x)
        } else {
            packed(s - 1, send_x)
        };
        let dst = if s == m - 2 {
            finish.to_vec()
        } else {
            packed(s, recv_x)
        };
        let with = own(recv_x);
        debug_assert!(src.len() == dst.len() && dst.len() == with.len());
        let mut phase = plan.phase();
        for ((src, dst), with) in src.into_iter().zip(dst).zip(with) {
            exchange(&mut phase, ring, src, dst, Some(with));
        }
    }
}
