//! Loads written down without building the schedule, for the algorithms
//! whose one rank has O(n) phases: building a ring rank's 2(n − 1) phases
//! costs milliseconds at thousands of ranks, and the choice needs a few
//! hosts' ranks of every candidate. Each must give exactly the loads of the
//! schedule the generator builds ([`super::loads::of_schedule`]); the tests
//! check every rank against it on many topologies and sizes.

use super::super::ir::{Algo, CollArgs};
use super::super::ring::slice_count;
use super::super::topology::Topology;
use super::super::{hierarchical, pipelined_chain};
use super::loads::{Network, PhaseAcc, PhaseLoad, RankLoads, RawLoad};
use crate::types::CollKind;

/// The loads of `rank`'s schedule of `algo` for `args`, when written down
/// here; `None`: build the schedule.
pub(super) fn loads(
    args: &CollArgs,
    rank: usize,
    algo: Algo,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> Option<RankLoads> {
    let n = topo.nranks();
    if n < 2 || rank >= n {
        return None;
    }
    let counts = &args.counts[..];
    let ring = || RingLoads::new(rank, topo, net, es);
    match (args.kind, algo) {
        (CollKind::AllReduce, Algo::Ring) => {
            Some(ring().allreduce(counts.first().copied().unwrap_or(0)))
        }
        (CollKind::AllGather, Algo::Ring) => Some(ring().allgather(counts)),
        (CollKind::ReduceScatter, Algo::Ring) => Some(ring().reduce_scatter(counts)),
        (CollKind::AllReduce, Algo::Direct) => {
            direct_allreduce(counts.first().copied().unwrap_or(0), rank, topo, net, es)
        }
        (CollKind::AllReduce, Algo::OneShot) => {
            one_shot_allreduce(counts.first().copied().unwrap_or(0), rank, topo, net, es)
        }
        (CollKind::Reduce, Algo::ReduceScatterGather) => {
            Some(rooted(args, rank, topo, net, es).reduce_scatter_gather())
        }
        (CollKind::Broadcast, Algo::ScatterAllgather) => {
            Some(rooted(args, rank, topo, net, es).scatter_allgather())
        }
        (CollKind::Broadcast, Algo::PipelinedChain) => {
            Some(rooted(args, rank, topo, net, es).pipelined_chain())
        }
        (CollKind::AllReduce, Algo::Hierarchical) => {
            hierarchical_allreduce(counts.first().copied().unwrap_or(0), rank, topo, net, es)
        }
        (CollKind::AllGather, Algo::Hierarchical) => {
            Some(hierarchical_allgather(counts, rank, topo, net, es))
        }
        (CollKind::ReduceScatter, Algo::Hierarchical) => {
            Some(hierarchical_reduce_scatter(counts, rank, topo, net, es))
        }
        _ => None,
    }
}

/// One rank's steps around the flat ring (`ring.rs`): each sends a chunk
/// to the next rank and receives one from the previous, in slices on a hop
/// between hosts.
struct RingLoads<'a> {
    m: usize,
    pos: usize,
    next: usize,
    prev: usize,
    out_across: bool,
    in_across: bool,
    topo: &'a Topology,
    acc: PhaseAcc<'a>,
    out: RankLoads,
}

impl<'a> RingLoads<'a> {
    fn new(rank: usize, topo: &'a Topology, net: Option<&'a Network<'a>>, es: usize) -> Self {
        let m = topo.nranks();
        let pos = topo.ring_pos(rank);
        let next = topo.ring_rank((pos + 1) % m);
        let prev = topo.ring_rank((pos + m - 1) % m);
        let me = topo.host_of(rank);
        RingLoads {
            m,
            pos,
            next,
            prev,
            out_across: topo.host_of(next) != me,
            in_across: topo.host_of(prev) != me,
            topo,
            acc: PhaseAcc::new(topo, net, es, rank),
            out: RankLoads::new(rank),
        }
    }

    /// The rank `k` places after this one in the ring.
    fn member(&self, k: usize) -> usize {
        self.topo.ring_rank((self.pos + k) % self.m)
    }

    /// (messages, longest) of a chunk of `l` elements on a hop.
    fn cut(l: usize, across: bool) -> (usize, usize) {
        if across {
            let k = slice_count(l);
            (k, l.div_ceil(k))
        } else {
            (1, l)
        }
    }

    /// `times` steps sending `send` and receiving `recv` elements (reduced
    /// on arrival or not); an empty step is no phase.
    fn step(&mut self, send: usize, recv: usize, reduce: bool, times: usize) {
        if send == 0 && recv == 0 {
            return;
        }
        if send > 0 {
            let (k, longest) = Self::cut(send, self.out_across);
            self.acc.send(self.next, send, k, longest);
        }
        if recv > 0 {
            let (k, longest) = Self::cut(recv, self.in_across);
            self.acc.recv(self.prev, recv, k, longest, reduce);
        }
        self.out.push(self.acc.take(), times);
    }

    /// `ring::allreduce`: a reduce-scatter pass, then an allgather pass,
    /// over n balanced chunks.
    fn allreduce(mut self, count: usize) -> RankLoads {
        let (m, pos) = (self.m, self.pos);
        if count.is_multiple_of(m) {
            // Every chunk alike: each pass is one run.
            let l = count / m;
            self.step(l, l, true, m - 1);
            self.step(l, l, false, m - 1);
            return self.out;
        }
        let chunks = Balanced { count, n: m };
        let len = |c: usize| chunks.len(c);
        // In step s position p sends chunk p − s and receives chunk
        // p − s − 1 (reduce-scatter), then sends p + 1 − s and receives
        // p − s (allgather).
        for s in 0..m - 1 {
            self.step(
                len((pos + m - s) % m),
                len((pos + 2 * m - s - 1) % m),
                true,
                1,
            );
        }
        for s in 0..m - 1 {
            self.step(len((pos + 1 + m - s) % m), len((pos + m - s) % m), false, 1);
        }
        self.out
    }

    /// `ring::allgather`: the own block copied, then in step s the block
    /// of the member s places back sent and that of s + 1 back received.
    fn allgather(mut self, counts: &[usize]) -> RankLoads {
        let (m, r) = (self.m, self.out.rank);
        if counts[r] > 0 {
            self.acc.local(counts[r]);
            let copy = self.acc.take();
            self.out.push(copy, 1);
        }
        if counts.iter().all(|&c| c == counts[0]) {
            self.step(counts[0], counts[0], false, m - 1);
            return self.out;
        }
        for s in 0..m - 1 {
            let (send, recv) = (self.member(m - s), self.member(2 * m - s - 1));
            self.step(counts[send], counts[recv], false, 1);
        }
        self.out
    }

    /// `ring::reduce_scatter`: in step s the partial block of the member
    /// s + 1 places back passed on, the own contribution to that of s + 2
    /// back reduced into what arrives.
    fn reduce_scatter(mut self, counts: &[usize]) -> RankLoads {
        let m = self.m;
        if counts.iter().all(|&c| c == counts[0]) {
            self.step(counts[0], counts[0], true, m - 1);
            return self.out;
        }
        for s in 0..m - 1 {
            let (send, recv) = (self.member(2 * m - s - 1), self.member(2 * m - s - 2));
            self.step(counts[send], counts[recv], true, 1);
        }
        self.out
    }
}

/// Chunk lengths of `count` elements cut into `n` (`Blocks::balanced`),
/// summed over ranges of chunks in O(1).
struct Balanced {
    count: usize,
    n: usize,
}

impl Balanced {
    fn displ(&self, c: usize) -> usize {
        // u64 where the product fits (several times faster than u128).
        match (c as u64).checked_mul(self.count as u64) {
            Some(x) => (x / self.n as u64) as usize,
            None => (c as u128 * self.count as u128 / self.n as u128) as usize,
        }
    }

    fn len(&self, c: usize) -> usize {
        self.displ(c + 1) - self.displ(c)
    }

    /// (elements, non-empty chunks, the longest chunk) of chunks `range`:
    /// chunks are q or q + 1 long, q = count / n.
    fn over(&self, range: std::ops::Range<usize>) -> (usize, usize, usize) {
        let k = range.len();
        let sum = self.displ(range.end) - self.displ(range.start);
        let q = self.count / self.n;
        let nonzero = if q > 0 { k } else { sum };
        (sum, nonzero, if sum > k * q { q + 1 } else { q })
    }
}

/// `direct::allreduce` (hosts of consecutive ranks, else `None`): to each
/// peer its chunk, from each a contribution to this rank's chunk (the first
/// reduced on arrival, the others folded in), then this rank's finished
/// chunk to every peer and theirs back. Summed host by host, O(hosts).
fn direct_allreduce(
    count: usize,
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> Option<RankLoads> {
    let n = topo.nranks();
    let chunks = Balanced { count, n };
    let own = chunks.len(rank);
    let mut acc = PhaseAcc::new(topo, net, es, rank);
    let mut out = RankLoads::new(rank);
    // Both stages: per host, its peers' chunks one way and this rank's
    // chunk (as many messages as peers there) the other.
    for stage in 0..2 {
        for h in 0..topo.nhosts() {
            let range = topo.host_range(h)?;
            let mut theirs = chunks.over(range.clone());
            let mut peers = range.len();
            if range.contains(&rank) {
                theirs.0 -= own;
                theirs.1 -= usize::from(own > 0);
                peers -= 1;
            }
            if peers == 0 {
                continue;
            }
            let mine = (own * peers, if own > 0 { peers } else { 0 }, own);
            let (send, recv) = if stage == 0 {
                (theirs, mine)
            } else {
                (mine, theirs)
            };
            if send.1 > 0 {
                acc.send(range.start, send.0, send.1, send.2);
            }
            if recv.1 > 0 {
                acc.recv(range.start, recv.0, recv.1, recv.2, false);
            }
        }
        if stage == 0 && own > 0 {
            // The first peer's contribution reduced on arrival, n − 2 folds.
            acc.local(own * (n - 1));
        }
        let phase = acc.take();
        if phase != PhaseLoad::default() {
            out.push(phase, 1);
        }
    }
    Some(out)
}

/// `direct::one_shot_allreduce` (hosts of consecutive ranks, else `None`):
/// the whole input to every peer and theirs into slots (a rank other than
/// 0 copies its own to its slot first), then n − 1 reductions and a copy.
fn one_shot_allreduce(
    count: usize,
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> Option<RankLoads> {
    let n = topo.nranks();
    let mut acc = PhaseAcc::new(topo, net, es, rank);
    let mut out = RankLoads::new(rank);
    if count == 0 {
        return Some(out);
    }
    if rank != 0 {
        acc.local(count);
    }
    for h in 0..topo.nhosts() {
        let range = topo.host_range(h)?;
        let peers = range.len() - usize::from(range.contains(&rank));
        if peers > 0 {
            acc.send(range.start, count * peers, peers, count);
            acc.recv(range.start, count * peers, peers, count, false);
        }
    }
    out.push(acc.take(), 1);
    acc.local(count * n);
    out.push(acc.take(), 1);
    Some(out)
}

fn rooted<'a>(
    args: &CollArgs,
    rank: usize,
    topo: &'a Topology,
    net: Option<&'a Network<'a>>,
    es: usize,
) -> Rooted<'a> {
    Rooted {
        count: args.counts.first().copied().unwrap_or(0),
        root: args.root,
        rank,
        topo,
        acc: PhaseAcc::new(topo, net, es, rank),
        out: RankLoads::new(rank),
    }
}

/// The rooted algorithms whose one rank has O(n) phases (`two_stage.rs`,
/// `pipelined_chain.rs`): rings in virtual-rank order (the root is 0)
/// or along the chain from the root, one message a step each way.
struct Rooted<'a> {
    count: usize,
    root: usize,
    rank: usize,
    topo: &'a Topology,
    acc: PhaseAcc<'a>,
    out: RankLoads,
}

impl Rooted<'_> {
    /// One phase: (peer, elements) to send and to receive (reduced on
    /// arrival or not); nothing to move is no phase.
    fn step(&mut self, send: Option<(usize, usize)>, recv: Option<(usize, usize)>, reduce: bool) {
        let mut any = false;
        if let Some((peer, len)) = send.filter(|s| s.1 > 0) {
            self.acc.send(peer, len, 1, len);
            any = true;
        }
        if let Some((peer, len)) = recv.filter(|r| r.1 > 0) {
            self.acc.recv(peer, len, 1, len, reduce);
            any = true;
        }
        if any {
            let phase = self.acc.take();
            self.out.push(phase, 1);
        }
    }

    /// `two_stage::reduce`: a reduce-scatter pass around the virtual ring,
    /// then every rank's finished chunk to the root.
    fn reduce_scatter_gather(mut self) -> RankLoads {
        let n = self.topo.nranks();
        let (root, v) = (self.root, (self.rank + n - self.root) % n);
        let real = |u: usize| (u % n + root) % n;
        let chunks = Balanced {
            count: self.count,
            n,
        };
        let (next, prev) = (real(v + 1), real(v + n - 1));
        for s in 0..n - 1 {
            let send = chunks.len((v + n - s) % n);
            let recv = chunks.len((v + 2 * n - s - 1) % n);
            self.step(Some((next, send)), Some((prev, recv)), true);
        }
        if v == 0 {
            for u in 1..n {
                let len = chunks.len((u + 1) % n);
                if len > 0 {
                    self.acc.recv(real(u), len, 1, len, false);
                }
            }
            let phase = self.acc.take();
            if phase != PhaseLoad::default() {
                self.out.push(phase, 1);
            }
        } else {
            self.step(Some((real(0), chunks.len((v + 1) % n))), None, false);
        }
        self.out
    }

    /// `two_stage::broadcast`: the root scatters n chunks, then an
    /// allgather pass around the virtual ring (the root only sends, the
    /// last only receives).
    fn scatter_allgather(mut self) -> RankLoads {
        let n = self.topo.nranks();
        let (root, v) = (self.root, (self.rank + n - self.root) % n);
        let real = |u: usize| (u % n + root) % n;
        let chunks = Balanced {
            count: self.count,
            n,
        };
        if v == 0 {
            for u in 1..n {
                let len = chunks.len(u);
                if len > 0 {
                    self.acc.send(real(u), len, 1, len);
                }
            }
            let phase = self.acc.take();
            if phase != PhaseLoad::default() {
                self.out.push(phase, 1);
            }
        } else {
            self.step(None, Some((real(0), chunks.len(v))), false);
        }
        for s in 0..n - 1 {
            let send = (v != n - 1).then(|| (real(v + 1), chunks.len((v + n - s) % n)));
            let recv = (v != 0).then(|| (real(v + n - 1), chunks.len((v + 2 * n - s - 1) % n)));
            self.step(send, recv, false);
        }
        self.out
    }

    /// `pipelined_chain::broadcast`: segments down the chain from the root,
    /// this rank receiving segment j in slot i + j − 1 and passing it on
    /// in slot i + j.
    fn pipelined_chain(mut self) -> RankLoads {
        let n = self.topo.nranks();
        let chain = self.topo.chain(self.root);
        let i = chain.pos(self.rank);
        let (next, prev) = (chain.at((i + 1) % n), chain.at((i + n - 1) % n));
        let s = pipelined_chain::segments_for(self.count, n);
        let segs = Balanced {
            count: self.count,
            n: s.max(1),
        };
        for t in i.saturating_sub(1)..i + s {
            let recv = (i > 0 && t + 1 >= i && t + 1 - i < s).then(|| (prev, segs.len(t + 1 - i)));
            let send = (i + 1 < n && t >= i && t - i < s).then(|| (next, segs.len(t - i)));
            self.step(send, recv, false);
        }
        self.out
    }
}

/// A rank's column (`hierarchical.rs`): the ranks with its local rank,
/// one a host, in the host order, as a ring from this rank.
struct Column<'t> {
    topo: &'t Topology,
    hosts: Vec<usize>,
    at: usize,
    local: usize,
}

impl<'t> Column<'t> {
    fn of(topo: &'t Topology, rank: usize) -> Column<'t> {
        let hosts = topo.host_order();
        let host = topo.host_of(rank);
        let at = hosts
            .iter()
            .position(|&x| x == host)
            .expect("every host is in the host order");
        Column {
            topo,
            hosts,
            at,
            local: topo.local_rank(rank),
        }
    }

    /// The member `k` places after this rank.
    fn member(&self, k: usize) -> usize {
        let nh = self.hosts.len();
        self.topo
            .rank_on(self.hosts[(self.at + k) % nh], self.local)
    }
}

/// Each column's group (`hierarchical::column_group`: the blocks of its
/// ranks, one a host, each its own message on the host's ring): (elements,
/// non-empty blocks, the longest block).
fn column_groups(counts: &[usize], topo: &Topology, l: usize) -> Vec<(usize, usize, usize)> {
    let nh = topo.nhosts();
    let alike = counts.iter().all(|&c| c == counts[0]);
    (0..l)
        .map(|c| {
            if alike {
                let b = counts[0];
                return (nh * b, if b > 0 { nh } else { 0 }, b);
            }
            (0..nh)
                .map(|h| counts[topo.rank_on(h, c)])
                .fold((0, 0, 0), |(s, k, m), b| {
                    (s + b, k + usize::from(b > 0), m.max(b))
                })
        })
        .collect()
}

/// `hierarchical::reduce_scatter` on L ranks a host and H hosts: the host's
/// ring reduce-scatters the column groups (L − 1 steps), then the column's
/// ring across the hosts reduce-scatters the host's partial sums of its
/// column (H − 1 steps, a block each, sliced); with one rank a host only
/// the second, on one host only the first.
fn hierarchical_reduce_scatter(
    counts: &[usize],
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> RankLoads {
    let (nh, r) = (topo.nhosts(), rank);
    let l = topo.uniform_ranks_per_host().unwrap_or(1);
    let me = topo.local_rank(r);
    let host = topo.host_of(r);
    let mut acc = PhaseAcc::new(topo, net, es, r);
    let mut out = RankLoads::new(r);
    // One step: (peer, elements, messages, longest) each way, reduced on
    // arrival; an empty step is no phase.
    let mut step = |send: (usize, usize, usize, usize), recv: (usize, usize, usize, usize)| {
        if send.2 == 0 && recv.2 == 0 {
            return;
        }
        if send.2 > 0 {
            acc.send(send.0, send.1, send.2, send.3);
        }
        if recv.2 > 0 {
            acc.recv(recv.0, recv.1, recv.2, recv.3, true);
        }
        out.push(acc.take(), 1);
    };
    if l > 1 {
        let groups = column_groups(counts, topo, l);
        let (next, prev) = (
            topo.rank_on(host, (me + 1) % l),
            topo.rank_on(host, (me + l - 1) % l),
        );
        for s in 0..l - 1 {
            let (g, h) = (
                groups[(me + 2 * l - s - 1) % l],
                groups[(me + 2 * l - s - 2) % l],
            );
            step((next, g.0, g.1, g.2), (prev, h.0, h.1, h.2));
        }
    }
    if nh > 1 {
        let col = Column::of(topo, r);
        let column = |k: usize| col.member(k);
        let (next, prev) = (column(1), column(nh - 1));
        // A block crossing hosts travels in slices.
        let hop = |peer: usize, len: usize| {
            let k = slice_count(len);
            (peer, len, if len > 0 { k } else { 0 }, len.div_ceil(k))
        };
        for s in 0..nh - 1 {
            let (send, recv) = (
                counts[column(2 * nh - s - 1)],
                counts[column(2 * nh - s - 2)],
            );
            step(hop(next, send), hop(prev, recv));
        }
    }
    out
}

/// `hierarchical::allreduce` on L ranks a host and H hosts, when every
/// segment's column takes the ring across (else `None`: a recursive
/// doubling across hosts has few phases, cheap to build). Each segment is
/// a reduce-scatter pass inside the host over L chunks, a ring allreduce of
/// its chunk over the H hosts, an allgather pass inside the host; segment
/// j's phases are laid from phase 2j(H − 1) on, over the others'.
fn hierarchical_allreduce(
    count: usize,
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> Option<RankLoads> {
    let (h, r) = (topo.nhosts(), rank);
    let l = topo.uniform_ranks_per_host()?;
    let k = hierarchical::segments(l, h, count);
    let me = topo.local_rank(r);
    let host = topo.host_of(r);
    let col = Column::of(topo, r);
    let (at, column) = (col.at, |i: usize| col.member(i));
    // Chunk c of n over the `len` elements.
    let piece = |len: usize, n: usize, c: usize| Balanced { count: len, n }.len(c);
    let mut acc = PhaseAcc::new(topo, net, es, r);
    // Each segment's phases as runs (first phase, phases, load), laid at
    // the segment's offset; summed where they overlap at the end.
    let mut runs: Vec<(usize, usize, RawLoad)> = Vec::new();
    for j in 0..k {
        let len = piece(count, k, j);
        let mut p = j * 2 * (h - 1);
        // `times` equal steps: (peer's host, elements) each way; a hop
        // across hosts in slices.
        let mut step =
            |acc: &mut PhaseAcc, send: (usize, usize), recv: (usize, usize), reduce, times| {
                for ((peer, n), out) in [(send, true), (recv, false)] {
                    if n == 0 {
                        continue;
                    }
                    let (k, longest) = if peer != host {
                        let k = slice_count(n);
                        (k, n.div_ceil(k))
                    } else {
                        (1, n)
                    };
                    if out {
                        acc.send_to_host(peer, n, k, longest);
                    } else {
                        acc.recv_from_host(peer, n, k, longest, reduce);
                    }
                }
                let raw = acc.take_raw();
                match runs.last_mut() {
                    Some((a, n, last)) if *a + *n == p && *last == raw => *n += times,
                    _ => runs.push((p, times, raw)),
                }
                p += times;
            };
        let whole = |c: usize| piece(len, l, c % l);
        let (next, prev) = (host, host);
        let chunk = if l > 1 {
            for s in 0..l - 1 {
                let send = (next, whole(me + l - s));
                let recv = (prev, whole(me + 2 * l - s - 1));
                step(&mut acc, send, recv, true, 1);
            }
            (me + 1) % l
        } else {
            0
        };
        let clen = whole(chunk);
        if clen < hierarchical::CROSS_RING_MIN {
            return None;
        }
        let sub = |c: usize| piece(clen, h, c % h);
        let (cnext, cprev) = (topo.host_of(column(1)), topo.host_of(column(h - 1)));
        if clen.is_multiple_of(h) {
            // Sub-chunks alike: each pass across is one run.
            let each = clen / h;
            step(&mut acc, (cnext, each), (cprev, each), true, h - 1);
            step(&mut acc, (cnext, each), (cprev, each), false, h - 1);
        } else {
            for s in 0..h - 1 {
                let (send, recv) = (sub(at + h - s), sub(at + 2 * h - s - 1));
                step(&mut acc, (cnext, send), (cprev, recv), true, 1);
            }
            for s in 0..h - 1 {
                let (send, recv) = (sub(at + 1 + h - s), sub(at + h - s));
                step(&mut acc, (cnext, send), (cprev, recv), false, 1);
            }
        }
        if l > 1 {
            for s in 0..l - 1 {
                let (send, recv) = (whole(me + 1 + l - s), whole(me + l - s));
                step(&mut acc, (next, send), (prev, recv), false, 1);
            }
        }
    }
    Some(overlaid(&runs, r))
}

/// The loads of runs (first phase, phases, load) laid over each other:
/// each piece between two run boundaries is the sum of the runs over it;
/// phases where nothing moves are dropped, as a built plan drops them.
fn overlaid(runs: &[(usize, usize, RawLoad)], rank: usize) -> RankLoads {
    let mut cuts: Vec<usize> = runs.iter().flat_map(|&(a, n, _)| [a, a + n]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| runs[i].0);
    let (mut active, mut next) = (Vec::new(), 0);
    let mut out = RankLoads::new(rank);
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        while next < order.len() && runs[order[next]].0 <= a {
            active.push(order[next]);
            next += 1;
        }
        active.retain(|&i| runs[i].0 + runs[i].1 > a);
        let mut sum = RawLoad::default();
        for &i in &active {
            sum.add(&runs[i].2);
        }
        if !sum.is_empty() {
            out.push(sum.finish(), b - a);
        }
    }
    out
}

/// `hierarchical::allgather` on L ranks a host and H hosts: the own block
/// copied; H − 1 steps of the column's ring across the hosts (a block each,
/// sliced); then L − 1 steps of the host's ring, each passing a whole
/// column group (H blocks, a message each) to the next local rank.
fn hierarchical_allgather(
    counts: &[usize],
    rank: usize,
    topo: &Topology,
    net: Option<&Network>,
    es: usize,
) -> RankLoads {
    let (nh, r) = (topo.nhosts(), rank);
    let l = topo.uniform_ranks_per_host().unwrap_or(1);
    let me = topo.local_rank(r);
    let col = Column::of(topo, r);
    let mut acc = PhaseAcc::new(topo, net, es, r);
    let mut out = RankLoads::new(r);
    if counts[r] > 0 {
        acc.local(counts[r]);
        out.push(acc.take(), 1);
    }
    // The column ring: in step s the block of the member s back is sent,
    // that of s + 1 back received.
    let column = |k: usize| col.member(k);
    let (next, prev) = (column(1), column(nh - 1));
    let cut = |len: usize| {
        let k = slice_count(len);
        (k, len.div_ceil(k))
    };
    for s in 0..nh - 1 {
        let (send, recv) = (counts[column(nh - s)], counts[column(2 * nh - s - 1)]);
        if send == 0 && recv == 0 {
            continue;
        }
        if send > 0 {
            let (k, longest) = cut(send);
            acc.send(next, send, k, longest);
        }
        if recv > 0 {
            let (k, longest) = cut(recv);
            acc.recv(prev, recv, k, longest, false);
        }
        out.push(acc.take(), 1);
    }
    // The host's ring: column ℓ's group is its H blocks, each a message.
    let groups = column_groups(counts, topo, l);
    let host = topo.host_of(r);
    let (lnext, lprev) = (
        topo.rank_on(host, (me + 1) % l),
        topo.rank_on(host, (me + l - 1) % l),
    );
    for s in 0..l - 1 {
        let (send, recv) = (groups[(me + l - s) % l], groups[(me + 2 * l - s - 1) % l]);
        if send.1 == 0 && recv.1 == 0 {
            continue;
        }
        if send.1 > 0 {
            acc.send(lnext, send.0, send.1, send.2);
        }
        if recv.1 > 0 {
            acc.recv(lprev, recv.0, recv.1, recv.2, false);
        }
        out.push(acc.take(), 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::super::{applicable_on, build_on, Algo, CollArgs, Topology};
    use super::super::Pricing;
    use crate::fabric::pathfind::Fabric;
    use crate::types::CollKind;

    /// Topologies of `n` ranks: one host, hosts of 1, 3 or 8 consecutive
    /// ranks, ranks dealt out to hosts unevenly, and a ring order that is
    /// not the default.
    fn topologies(n: usize) -> Vec<Topology> {
        let mut v = vec![Topology::single_host(n)];
        for per in [1, 3, 8] {
            v.push(Topology::from_hosts(
                &(0..n).map(|r| r / per).collect::<Vec<_>>(),
            ));
        }
        let dealt: Vec<usize> = (0..n).map(|r| (r * 7 + r / 3) % n.div_ceil(2)).collect();
        v.push(Topology::from_hosts(&dealt));
        let t = Topology::from_hosts(&(0..n).map(|r| r / 2).collect::<Vec<_>>());
        let hosts: Vec<usize> = (0..t.nhosts()).rev().collect();
        v.push(t.with_host_order(&hosts).unwrap());
        v
    }

    /// Two racks with uneven rates, so the pair and group terms show.
    fn fabric(nh: usize) -> Fabric {
        Fabric {
            rate: (0..nh)
                .map(|a| {
                    (0..nh)
                        .map(|b| 1e8 * (1 + (a * 3 + b) % 5) as f64)
                        .collect()
                })
                .collect(),
            group_of: (0..nh).map(|h| h % 2).collect(),
            group_out: vec![2e8, 3e8],
            group_in: vec![2.5e8, 1.5e8],
        }
    }

    /// The collectives written down, on `n` ranks with `count` elements
    /// (blocks alike, and blocks of 0 to 2·count for the v-collectives).
    fn cases(n: usize, count: usize, salt: usize) -> Vec<CollArgs> {
        let uneven: Vec<usize> = (0..n)
            .map(|r| (r * 7919 + salt) % (2 * count + 1))
            .collect();
        let args = |kind, counts| CollArgs {
            kind,
            root: 0,
            counts,
        };
        vec![
            args(CollKind::AllReduce, vec![count]),
            args(CollKind::AllGather, vec![count; n]),
            args(CollKind::AllGather, uneven.clone()),
            args(CollKind::ReduceScatter, vec![count; n]),
            args(CollKind::ReduceScatter, uneven),
            CollArgs {
                kind: CollKind::Reduce,
                root: salt % n,
                counts: vec![count],
            },
            CollArgs {
                kind: CollKind::Broadcast,
                root: (salt * 3) % n,
                counts: vec![count],
            },
        ]
    }

    #[test]
    fn written_down_loads_are_the_built_schedules_loads() {
        let (mut checked, mut written) = (0, 0);
        for n in [2usize, 3, 5, 8, 13, 24, 37] {
            // Up to pipelined hierarchical allreduces (3 segments of 1 Mi
            // elements, evenly cut or not).
            let counts = [0, 1, n - 1, n, n + 1, 7 * n + 3, 16_384 + 5, 40_000 * n];
            let counts = counts.into_iter().chain([3 << 20, (3 << 20) + 7]);
            for topo in topologies(n) {
                let f = fabric(topo.nhosts());
                let nets = if topo.nhosts() > 1 {
                    vec![None, Some(&f)]
                } else {
                    vec![None]
                };
                for (net, es) in nets.into_iter().flat_map(|x| [(x, 1), (x, 4)]) {
                    let pricing = Pricing::new(&topo, net, es);
                    for (salt, count) in counts.clone().enumerate() {
                        for args in cases(n, count, salt) {
                            for algo in [
                                Algo::Ring,
                                Algo::Hierarchical,
                                Algo::Direct,
                                Algo::OneShot,
                                Algo::ReduceScatterGather,
                                Algo::ScatterAllgather,
                                Algo::PipelinedChain,
                            ] {
                                if !applicable_on(&args, &topo, algo) {
                                    continue;
                                }
                                for rank in 0..n {
                                    let net_of = pricing.net.as_ref();
                                    written += usize::from(
                                        super::loads(&args, rank, algo, &topo, net_of, es)
                                            .is_some(),
                                    );
                                    let built = build_on(&args, rank, &topo, algo).unwrap();
                                    let want = pricing.loads(&built);
                                    let got = pricing.loads_of(&args, rank, algo).unwrap();
                                    let kind = args.kind;
                                    assert_eq!(
                                        got, want,
                                        "{algo:?} {kind} n {n}, {count}, rank {rank}, {topo:?}"
                                    );
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 25_000 && written > 20_000, "{checked}, {written}");
    }
}
