//! The size table: the algorithm each call gets when nothing else decides
//! (no `CADENCE_ALGO` entry, no tuning table, no cost model), as rows of
//! data. The first row that matches a call decides; every collective ends
//! in a row that matches everything, so every call finds one.
//!
//! Sizes are bytes of the collective's full buffer ([`super::coll_bytes`]):
//! the vector reduced or broadcast, allgather's gathered output,
//! reduce_scatter's input, all of all-to-all's input.
//!
//! The rows for calls across hosts come first; where none matches, a call
//! across hosts takes the one-host rows. The measurements behind the rows
//! are in docs/benchmarks.md.

use super::coll_bytes;
use crate::schedule::{Algo, CollArgs, Topology};
use crate::types::CollKind;

/// Where a call's ranks are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every rank on one host.
    OneHost,
    /// Across hosts, every host with the same number (≥ 2) of ranks: the
    /// hierarchical schedules apply.
    Grouped,
    /// Across hosts otherwise: one rank a host, or hosts that differ.
    Ungrouped,
}

impl Placement {
    pub fn of(topo: &Topology) -> Placement {
        if topo.nhosts() < 2 {
            Placement::OneHost
        } else if topo.uniform_ranks_per_host().is_some_and(|l| l > 1) {
            Placement::Grouped
        } else {
            Placement::Ungrouped
        }
    }
}

/// The placements a row covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    Anywhere,
    AcrossHosts,
    Grouped,
    Ungrouped,
}

impl On {
    pub fn covers(self, p: Placement) -> bool {
        match self {
            On::Anywhere => true,
            On::AcrossHosts => p != Placement::OneHost,
            On::Grouped => p == Placement::Grouped,
            On::Ungrouped => p == Placement::Ungrouped,
        }
    }
}

/// One row of the table: calls of `kind` placed as `on`, on a number of
/// ranks in `ranks` and of a size in `bytes` (both inclusive), get `algo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub kind: CollKind,
    pub on: On,
    pub ranks: (usize, usize),
    pub bytes: (u64, u64),
    pub algo: Algo,
    /// Why, in one line.
    pub why: &'static str,
}

impl Row {
    pub fn matches(&self, kind: CollKind, p: Placement, nranks: usize, bytes: u64) -> bool {
        self.kind == kind
            && self.on.covers(p)
            && (self.ranks.0..=self.ranks.1).contains(&nranks)
            && (self.bytes.0..=self.bytes.1).contains(&bytes)
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const MAX: u64 = u64::MAX;
const ANY_RANKS: (usize, usize) = (0, usize::MAX);
const ALL_SIZES: (u64, u64) = (0, MAX);

/// Sizes below `b` bytes.
const fn below(b: u64) -> (u64, u64) {
    (0, b - 1)
}

/// Sizes of `b` bytes and more.
const fn from(b: u64) -> (u64, u64) {
    (b, MAX)
}

const fn row(
    kind: CollKind,
    on: On,
    ranks: (usize, usize),
    bytes: (u64, u64),
    algo: Algo,
    why: &'static str,
) -> Row {
    Row {
        kind,
        on,
        ranks,
        bytes,
        algo,
        why,
    }
}

use Algo::*;
use CollKind::{
    AllGather, AllReduce, AllToAll, Barrier, Broadcast, Gather, Recv, Reduce, ReduceScatter,
    Scatter, Send,
};

/// The table, first match wins.
#[rustfmt::skip]
pub const TABLE: &[Row] = &[
    // Across hosts.
    row(AllReduce, On::Grouped, ANY_RANKS, from(8 * KIB), Hierarchical,
        "TCP between host columns plus shared memory within hosts wins from a few KiB"),
    row(AllGather, On::Grouped, ANY_RANKS, from(64 * KIB), Hierarchical,
        "hierarchical wins from 64 KiB; below, recursive doubling's log2(n) rounds"),
    row(ReduceScatter, On::Grouped, ANY_RANKS, from(64 * KIB), Hierarchical,
        "hierarchical wins from 64 KiB; below, recursive halving's log2(n) rounds"),
    row(ReduceScatter, On::Grouped, ANY_RANKS, ALL_SIZES, RecursiveHalving,
        "latency-bound across hosts: log2(n) rounds"),
    row(AllReduce, On::Ungrouped, ANY_RANKS, from(32 * KIB), Ring,
        "one rank a host: direct's n-1 concurrent flows would share one NIC"),
    row(AllToAll, On::AcrossHosts, ANY_RANKS, ALL_SIZES, Pairwise,
        "one peer a round, so no NIC takes n-1 senders at once (direct not measured across)"),
    row(Broadcast, On::AcrossHosts, (3, 8), below(32 * KIB), BinomialTree,
        "the tree crosses each host once; direct's gain is ranks sharing one host's cores"),
    row(AllReduce, On::AcrossHosts, (3, 8), below(4 * KIB), RecursiveDoubling,
        "one_shot's n-1 messages a rank were measured on one host only"),
    // On one host, and across hosts where no row above matched.
    row(AllReduce, On::Anywhere, (3, 8), below(4 * KIB), OneShot,
        "tiny buffers on few ranks: one exchange of whole buffers, then a local reduction"),
    row(AllReduce, On::Anywhere, ANY_RANKS, below(32 * KIB), RecursiveDoubling,
        "latency-bound: log2(n) rounds beat the ring's 2(n-1) steps"),
    row(AllReduce, On::Anywhere, (0, 8), (0, MIB), Direct,
        "two phases of n-1 concurrent messages; few enough not to flood a rank's links"),
    row(AllReduce, On::Anywhere, ANY_RANKS, (0, MIB), Rabenseifner,
        "beyond 8 ranks: the ring's bytes in 2·log2(n) rounds"),
    row(AllReduce, On::Anywhere, ANY_RANKS, ALL_SIZES, Ring,
        "bandwidth-bound: every link busy, the minimum 2(n-1)/n of the buffer a rank"),
    row(Broadcast, On::Anywhere, (3, 8), below(32 * KIB), Direct,
        "one phase from the root; no leaf waits on a forwarding rank not yet run"),
    row(Broadcast, On::Anywhere, ANY_RANKS, below(256 * KIB), BinomialTree,
        "latency-bound: log2(n) levels"),
    row(Broadcast, On::Anywhere, (0, 2), ALL_SIZES, BinomialTree,
        "with 2 ranks there is nothing to scatter"),
    row(Broadcast, On::Anywhere, ANY_RANKS, ALL_SIZES, ScatterAllgather,
        "scattering first halves the root's traffic"),
    row(Reduce, On::Anywhere, (0, 4), below(16 * KIB), Direct,
        "one phase to the root; no inner rank waits on a child not yet run"),
    row(Reduce, On::Anywhere, ANY_RANKS, below(256 * KIB), BinomialTree,
        "latency-bound: log2(n) levels"),
    row(Reduce, On::Anywhere, (0, 4), ALL_SIZES, BinomialTree,
        "large reduces stream through shared memory, and then the tree led on few ranks"),
    row(Reduce, On::Anywhere, ANY_RANKS, ALL_SIZES, ReduceScatterGather,
        "the two stages spread the reduction over the ranks"),
    row(AllGather, On::Anywhere, (0, 4), below(64 * KIB), Direct,
        "one phase of n-1 small messages beats recursive doubling's rounds on few ranks"),
    row(AllGather, On::Anywhere, ANY_RANKS, below(64 * KIB), RecursiveDoubling,
        "latency-bound: log2(n) rounds; it folds, so any counts and any n"),
    row(AllGather, On::Anywhere, ANY_RANKS, below(MIB), Direct,
        "one phase of concurrent messages"),
    row(AllGather, On::Anywhere, ANY_RANKS, ALL_SIZES, Ring,
        "bandwidth-bound: every link busy"),
    row(ReduceScatter, On::Anywhere, ANY_RANKS, below(MIB), Direct,
        "one phase of concurrent messages"),
    row(ReduceScatter, On::Anywhere, ANY_RANKS, ALL_SIZES, Ring,
        "bandwidth-bound: every link busy"),
    row(AllToAll, On::Anywhere, ANY_RANKS, ALL_SIZES, Direct,
        "on one host each message has its own ring, and one wait beats n-1 rounds of waits"),
    row(Gather, On::Anywhere, ANY_RANKS, ALL_SIZES, Direct, "the only one"),
    row(Scatter, On::Anywhere, ANY_RANKS, ALL_SIZES, Direct, "the only one"),
    row(Barrier, On::Anywhere, ANY_RANKS, ALL_SIZES, Dissemination, "the only one"),
    row(Send, On::Anywhere, ANY_RANKS, ALL_SIZES, P2p, "the only one"),
    row(Recv, On::Anywhere, ANY_RANKS, ALL_SIZES, P2p, "the only one"),
];

/// The first row of [`TABLE`] that matches.
pub fn lookup(kind: CollKind, p: Placement, nranks: usize, bytes: u64) -> &'static Row {
    TABLE
        .iter()
        .find(|r| r.matches(kind, p, nranks, bytes))
        .expect("every collective ends in a row that matches every call")
}

/// The size-based choice with every rank on one host.
pub fn default_algo(args: &CollArgs, nranks: usize, elem_size: usize) -> Algo {
    lookup(
        args.kind,
        Placement::OneHost,
        nranks,
        coll_bytes(args, nranks, elem_size),
    )
    .algo
}

/// The size-based choice on a topology.
pub fn default_algo_on(args: &CollArgs, topo: &Topology, elem_size: usize) -> Algo {
    let bytes = coll_bytes(args, topo.nranks(), elem_size);
    lookup(args.kind, Placement::of(topo), topo.nranks(), bytes).algo
}

/// The table of `kind` on `topo` as byte ranges `(lo, hi, algo)`
/// (inclusive, `hi == u64::MAX` for the last), read off the rows.
pub fn default_table_on(kind: CollKind, topo: &Topology) -> Vec<(u64, u64, Algo)> {
    let (p, n) = (Placement::of(topo), topo.nranks());
    // The choice can change only where a row that applies starts or ends.
    let mut starts = vec![0u64];
    for r in TABLE.iter().filter(|r| r.kind == kind && r.on.covers(p)) {
        if (r.ranks.0..=r.ranks.1).contains(&n) {
            starts.push(r.bytes.0);
            if r.bytes.1 != MAX {
                starts.push(r.bytes.1 + 1);
            }
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let mut out: Vec<(u64, u64, Algo)> = Vec::new();
    for b in starts {
        let a = lookup(kind, p, n, b).algo;
        match out.last_mut() {
            Some(last) if last.2 == a => {}
            Some(last) => {
                last.1 = b - 1;
                out.push((b, MAX, a));
            }
            None => out.push((b, MAX, a)),
        }
    }
    out
}

/// [`default_table_on`] with every rank on one host.
pub fn default_table(kind: CollKind, nranks: usize) -> Vec<(u64, u64, Algo)> {
    default_table_on(kind, &Topology::single_host(nranks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::algos_for;

    fn args(kind: CollKind, root: usize, counts: Vec<usize>) -> CollArgs {
        CollArgs { kind, root, counts }
    }

    #[test]
    fn every_collective_ends_in_a_row_for_every_call() {
        for kind in CollKind::ALL {
            let last = TABLE.iter().rfind(|r| r.kind == kind).unwrap();
            assert_eq!(
                (last.on, last.ranks, last.bytes),
                (On::Anywhere, ANY_RANKS, ALL_SIZES),
                "{kind}"
            );
            assert!(algos_for(kind).contains(&last.algo), "{kind}");
        }
        for r in TABLE {
            assert!(algos_for(r.kind).contains(&r.algo), "{r:?}");
            assert!(r.ranks.0 <= r.ranks.1 && r.bytes.0 <= r.bytes.1, "{r:?}");
        }
    }

    #[test]
    fn default_algo_follows_the_size_table() {
        let ar = |count| args(CollKind::AllReduce, 0, vec![count]);
        assert_eq!(default_algo(&ar(1024), 8, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(1023), 8, 4), Algo::OneShot);
        assert_eq!(default_algo(&ar(2), 3, 4), Algo::OneShot);
        assert_eq!(default_algo(&ar(2), 2, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(2), 9, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ar(8192), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&ar(1 << 18), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&ar(8192), 16, 4), Algo::Rabenseifner);
        assert_eq!(default_algo(&ar(1 << 18), 12, 4), Algo::Rabenseifner);
        assert_eq!(default_algo(&ar(1 << 19), 16, 4), Algo::Ring);
        assert_eq!(default_algo(&ar(1 << 20), 4, 4), Algo::Ring);
        let bc = |count| args(CollKind::Broadcast, 0, vec![count]);
        assert_eq!(default_algo(&bc(1000), 8, 4), Algo::Direct);
        assert_eq!(default_algo(&bc(8192), 8, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1000), 2, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1000), 9, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&bc(1 << 20), 8, 4), Algo::ScatterAllgather);
        assert_eq!(default_algo(&bc(1 << 20), 2, 4), Algo::BinomialTree);
        let rd = |count| args(CollKind::Reduce, 0, vec![count]);
        assert_eq!(default_algo(&rd(1000), 8, 4), Algo::BinomialTree);
        assert_eq!(default_algo(&rd(1 << 20), 8, 4), Algo::ReduceScatterGather);
        let ag = |each| args(CollKind::AllGather, 0, vec![each; 4]);
        assert_eq!(default_algo(&ag(1000), 4, 4), Algo::Direct);
        let ag8 = |each| args(CollKind::AllGather, 0, vec![each; 8]);
        assert_eq!(default_algo(&ag8(100), 8, 4), Algo::RecursiveDoubling);
        assert_eq!(default_algo(&ag(10_000), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&ag(1 << 20), 4, 4), Algo::Ring);
        let rs = |each| args(CollKind::ReduceScatter, 0, vec![each; 4]);
        assert_eq!(default_algo(&rs(1000), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&rs(1 << 20), 4, 4), Algo::Ring);
        let a2a = |each| args(CollKind::AllToAll, 0, vec![each; 16]);
        assert_eq!(default_algo(&a2a(16), 4, 4), Algo::Direct);
        assert_eq!(default_algo(&a2a(1 << 20), 4, 4), Algo::Direct);
        // Whatever the size, the default is always one the call may use.
        for kind in CollKind::ALL {
            let a = args(kind, 0, vec![]);
            assert!(algos_for(kind).contains(&default_algo(&a, 4, 4)));
        }
    }

    #[test]
    fn across_hosts_the_table_goes_hierarchical() {
        let two_each = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]);
        let one_each = Topology::from_hosts(&[0, 1, 2, 3]);
        let at = |kind, topo: &Topology, bytes: usize| {
            let n = topo.nranks();
            let counts = match kind {
                CollKind::AllReduce => vec![bytes / 4],
                _ => vec![bytes / 4 / n; n],
            };
            default_algo_on(&args(kind, 0, counts), topo, 4)
        };
        use Algo::*;
        use CollKind::*;
        assert_eq!(at(AllReduce, &two_each, 4096), RecursiveDoubling);
        assert_eq!(at(AllReduce, &two_each, 64), RecursiveDoubling);
        assert_eq!(at(AllReduce, &two_each, 8192), Hierarchical);
        assert_eq!(at(ReduceScatter, &two_each, 16 << 10), RecursiveHalving);
        assert_eq!(at(ReduceScatter, &two_each, 64 << 10), Hierarchical);
        assert_eq!(at(AllGather, &two_each, 32 << 10), RecursiveDoubling);
        assert_eq!(at(AllGather, &two_each, 64 << 10), Hierarchical);
        assert_eq!(at(AllReduce, &one_each, 64 << 10), Ring);
        assert_eq!(at(AllGather, &one_each, 64 << 20), Ring);
        // All-to-all goes one peer per round across hosts.
        let a2a = |topo: &Topology| {
            let n = topo.nranks();
            default_algo_on(&args(AllToAll, 0, vec![4; n * n]), topo, 4)
        };
        assert_eq!(a2a(&two_each), Pairwise);
        assert_eq!(a2a(&one_each), Pairwise);
        assert_eq!(a2a(&Topology::single_host(4)), Direct);
        // Broadcast keeps the flat table, but for direct, which is for
        // ranks sharing one host's cores: across hosts the tree.
        assert_eq!(at(Broadcast, &two_each, 64 << 20), ScatterAllgather);
        assert_eq!(at(Broadcast, &two_each, 64), BinomialTree);
        let bc = |bytes: usize| args(Broadcast, 0, vec![bytes / 4]);
        assert_eq!(
            default_algo_on(&bc(64), &Topology::single_host(8), 4),
            Direct
        );
    }
}
