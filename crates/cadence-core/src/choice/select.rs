//! The one entry point of the choice: [`select_algo_on`] decides a call's
//! algorithm from (the call's own request, `CADENCE_ALGO`, [`Auto`]).

use super::overrides::{AlgoOverride, AlgoRange};
use super::tuned::Tuned;
use crate::schedule::cost::Pricing;
use crate::schedule::{self, Algo, CollArgs, CostModel, Topology};
use crate::types::CollKind;
use std::fmt;

/// Why [`select_algo_on`] chose what it chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The call passed the algorithm itself.
    Caller,
    /// A `CADENCE_ALGO` entry of this collective covers the call's size.
    Range(AlgoRange),
    /// A bare `CADENCE_ALGO` entry (all collectives it applies to).
    Everywhere,
    /// The tuning table (`cadence tune`) for this setting.
    Tuned,
    /// The cost model's cheapest estimate.
    Model,
    /// The size-based default.
    Default,
    /// The size-based default was this excluded algorithm.
    AfterExclusion(Algo),
    /// By where the ranks are only: the call's size is not the same on
    /// every rank (an alltoall whose counts each rank knows only its own
    /// of), so a choice by size could differ between them.
    Placement,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Caller => write!(f, "forced by the call"),
            Why::Range(r) => write!(f, "forced by CADENCE_ALGO range {r}"),
            Why::Everywhere => write!(f, "forced by CADENCE_ALGO (all collectives)"),
            Why::Tuned => write!(f, "tuning table"),
            Why::Model => write!(f, "cost model"),
            Why::Default => write!(f, "default"),
            Why::Placement => write!(f, "default for the placement (sizes differ by rank)"),
            Why::AfterExclusion(a) => write!(
                f,
                "default after exclusion (CADENCE_ALGO excludes the default {})",
                a.name()
            ),
        }
    }
}

/// The size the size table and `CADENCE_ALGO` ranges speak of:
/// bytes of the collective's full buffer (every rank's blocks, on
/// `nranks` ranks).
pub fn coll_bytes(args: &CollArgs, nranks: usize, elem_size: usize) -> u64 {
    (args.elements(nranks) as u64).saturating_mul(elem_size as u64)
}

/// How a communicator chooses when nothing forces a choice: its tuning
/// table, else its cost model (when parameters were measured for this
/// setting), else the size table of [`super::defaults::default_algo_on`].
pub struct Auto {
    pub topo: Topology,
    /// How `topo`'s ring order was chosen (see `comm::order`).
    pub order: crate::comm::order::OrderChoice,
    /// The measured network between the hosts, when a topology file or the
    /// start-up profile gave one: the model prices algorithms on it.
    pub fabric: Option<std::sync::Arc<crate::fabric::pathfind::Fabric>>,
    pub tuned: Option<Tuned>,
    pub model: Option<CostModel>,
    /// The model was measured at start-up (else it is the tuning table's).
    pub measured_at_start: bool,
}

impl Auto {
    /// The size table only (all ranks on one host).
    pub fn flat(nranks: usize) -> Auto {
        Auto {
            topo: Topology::single_host(nranks),
            order: Default::default(),
            fabric: None,
            tuned: None,
            model: None,
            measured_at_start: false,
        }
    }

    fn choose(
        &self,
        args: &CollArgs,
        es: usize,
        allowed: impl Fn(Algo) -> bool,
    ) -> Option<(Algo, Why)> {
        let bytes = coll_bytes(args, self.topo.nranks(), es);
        if let Some(a) = self.tuned.as_ref().and_then(|t| t.lookup(args.kind, bytes)) {
            if allowed(a) {
                return Some((a, Why::Tuned));
            }
        }
        if let Some(m) = &self.model {
            return self
                .cheapest(m, args, es, &allowed)
                .map(|a| (a, Why::Model));
        }
        let def = super::defaults::default_algo_on(args, &self.topo, es);
        allowed(def).then_some((def, Why::Default))
    }

    /// The algorithm the model says is fastest, among the allowed ones
    /// (the first of [`schedule::algos_for`]'s order among equal
    /// estimates).
    ///
    /// An estimate over every rank's schedule is O(n²) work for a ring (n
    /// ranks, 2(n − 1) phases each; docs/benchmarks.md, "The choice at
    /// scale"). So each candidate is first bounded from below by a few
    /// ranks' loads ([`sample_ranks`]; an estimate over some ranks never
    /// exceeds the one over all, [`CostModel::estimate_on`]), candidates
    /// are priced in the order of their bounds, and one whose bound
    /// exceeds the best estimate so far cannot win and is not priced
    /// further: the same choice as pricing every candidate. Up to
    /// [`EVERY_RANK_UP_TO`] ranks a candidate is priced on every rank;
    /// beyond, on the ranks of [`representative_hosts`], so a new shape
    /// costs O(n). Loads come from `Pricing::loads_of`: written down for
    /// the algorithms whose one rank has O(n) phases, else built.
    pub fn cheapest(
        &self,
        m: &CostModel,
        args: &CollArgs,
        es: usize,
        allowed: &impl Fn(Algo) -> bool,
    ) -> Option<Algo> {
        self.cheapest_over(m, args, es, allowed, EVERY_RANK_UP_TO)
    }

    /// [`Auto::cheapest`], pricing every rank up to `every_rank_up_to`
    /// ranks and the ranks of [`representative_hosts`] beyond.
    fn cheapest_over(
        &self,
        m: &CostModel,
        args: &CollArgs,
        es: usize,
        allowed: &impl Fn(Algo) -> bool,
        every_rank_up_to: usize,
    ) -> Option<Algo> {
        let topo = &self.topo;
        let priced: Vec<usize> = if topo.nranks() <= every_rank_up_to {
            (0..topo.nranks()).collect()
        } else {
            representative_hosts(topo, args)
                .into_iter()
                .flat_map(|h| topo.ranks_on(h))
                .collect()
        };
        let pricing = Pricing::new(topo, self.fabric.as_deref(), es);
        // Each schedule is read into its loads and dropped (the estimate
        // keeps a few words a phase, not the steps).
        let estimate = |ranks: &mut dyn Iterator<Item = usize>, a: Algo| {
            let loads: Result<Vec<_>, _> = ranks.map(|r| pricing.loads_of(args, r, a)).collect();
            loads.ok().map(|l| m.estimate_loads(&l, &pricing))
        };
        let candidates = schedule::algos_for(args.kind)
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, a)| allowed(a));
        // (bound, place in algos_for, algorithm); a candidate whose sample
        // cannot be built cannot be built for every rank either.
        let mut bounded: Vec<(f64, usize, Algo)> = if m.bounds_hold() {
            let sample = sample_ranks(topo);
            candidates
                .filter_map(|(i, a)| Some((estimate(&mut sample.iter().copied(), a)?, i, a)))
                .collect()
        } else {
            candidates.map(|(i, a)| (0.0, i, a)).collect()
        };
        bounded.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        let mut best: Option<(f64, usize, Algo)> = None;
        for (bound, i, a) in bounded {
            if best.is_some_and(|(e, _, _)| bound > e) {
                break;
            }
            let Some(e) = estimate(&mut priced.iter().copied(), a) else {
                continue;
            };
            let better = |(be, bi, _): (f64, usize, Algo)| {
                e.total_cmp(&be).then(i.cmp(&bi)) == std::cmp::Ordering::Less
            };
            if best.is_none_or(better) {
                best = Some((e, i, a));
            }
        }
        best.map(|(_, _, a)| a)
    }
}

/// Up to this many ranks [`Auto::cheapest`] prices every rank's schedule;
/// beyond, the ranks of [`representative_hosts`].
pub const EVERY_RANK_UP_TO: usize = 256;

/// The hosts whose ranks stand for all in [`Auto::cheapest`] beyond
/// [`EVERY_RANK_UP_TO`] ranks: where the generators' ranks differ. The
/// hosts of ranks 0, 1, the root, n − 2 and n − 1 (roots of trees, the
/// ends of rank order); of n/4, n/2 and 3n/4 (inner nodes and the second
/// tree of a double binary tree); of the rank with the largest block
/// (v-collectives); of the largest power of two below n and its partners
/// (the ranks a recursive halving or doubling folds in); of the first and
/// last ranks of the ring order and the host after the first (where rings
/// and chains cross hosts). A host's estimate needs all its ranks (they
/// share its NIC), so all are priced. A slower rank elsewhere, or a group
/// (rack) whose other hosts add to its uplink's load, is not seen: the
/// choice is the model's on these hosts
/// (`representative_hosts_choose_as_pricing_every_rank_does` measures
/// how often that differs).
fn representative_hosts(topo: &Topology, args: &CollArgs) -> Vec<usize> {
    let n = topo.nranks();
    let root = args.root;
    // The rank with the largest block, when blocks differ by rank.
    let largest = (args.counts.len() == n)
        .then(|| (0..n).max_by_key(|&r| (args.counts[r], std::cmp::Reverse(r))))
        .flatten();
    let p2 = 1usize << n.ilog2();
    let ring_first = topo.ring_rank(0);
    let after_first = (1..n)
        .map(|i| topo.ring_rank(i))
        .find(|&r| topo.host_of(r) != topo.host_of(ring_first));
    let ranks = [
        Some(0),
        Some(root.min(n - 1)),
        Some(n - 1),
        Some(1.min(n - 1)),
        Some(n / 4),
        Some(n / 2),
        Some(3 * n / 4),
        Some(n.saturating_sub(2)),
        largest,
        Some(p2 - 1),
        Some(p2 % n),
        Some(n - p2),
        Some(ring_first),
        Some(topo.ring_rank(n - 1)),
        after_first,
    ];
    let mut hosts: Vec<usize> = ranks
        .into_iter()
        .flatten()
        .map(|r| topo.host_of(r))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// The ranks whose schedules bound a candidate's estimate from below in
/// [`Auto::cheapest`]: rank 0 (the root of trees), the last rank of its
/// host (the one whose ring neighbour is on another host) and the last
/// rank. The bound is only as good as the slowest rank among them.
fn sample_ranks(topo: &Topology) -> Vec<usize> {
    let n = topo.nranks();
    let home = topo.host_of(0);
    let edge = (1..n)
        .find(|&r| topo.host_of(r) != home)
        .map_or(0, |r| r - 1);
    let mut ranks = vec![0, edge, n.saturating_sub(1)];
    ranks.dedup();
    ranks.retain(|&r| r < n);
    ranks
}

/// Chooses the algorithm for a call (see [`AlgoOverride`] for the order of
/// precedence; after it, [`Auto`]). `caller` is the algorithm the call itself
/// asked for. The error is the message of an `InvalidArgument`.
pub fn select_algo_on(
    ov: &AlgoOverride,
    args: &CollArgs,
    auto: &Auto,
    elem_size: usize,
    caller: Option<Algo>,
) -> Result<(Algo, Why), String> {
    let kind = args.kind;
    let nranks = auto.topo.nranks();
    let applicable = |a: Algo| schedule::applicable_on(args, &auto.topo, a);
    if let Some(a) = caller {
        if !applicable(a) {
            return Err(format!(
                "algorithm {} does not apply to {kind} here",
                a.name()
            ));
        }
        return Ok((a, Why::Caller));
    }
    if args.own_alltoall(nranks).is_some() {
        return by_placement(ov, args, auto, applicable);
    }
    let bytes = coll_bytes(args, nranks, elem_size);
    if let Some(r) = ov.range_for(kind, bytes) {
        if !applicable(r.algo) {
            return Err(format!(
                "CADENCE_ALGO forces {} for {kind} of {bytes} bytes ({r}), which does not apply \
                 (nranks {nranks}, counts {:?})",
                r.algo.name(),
                args.counts
            ));
        }
        return Ok((r.algo, Why::Range(*r)));
    }
    if let Some(a) = ov.everywhere.iter().copied().find(|&a| applicable(a)) {
        return Ok((a, Why::Everywhere));
    }
    let allowed = |a: Algo| !ov.is_excluded(kind, a) && applicable(a);
    if let Some(choice) = auto.choose(args, elem_size, allowed) {
        return Ok(choice);
    }
    let def = super::defaults::default_algo_on(args, &auto.topo, elem_size);
    after_exclusion(kind, def, allowed)
}

/// The first algorithm `allowed` when the default `def` was excluded.
fn after_exclusion(
    kind: CollKind,
    def: Algo,
    allowed: impl Fn(Algo) -> bool,
) -> Result<(Algo, Why), String> {
    schedule::algos_for(kind)
        .iter()
        .copied()
        .find(|&a| allowed(a))
        .map(|a| (a, Why::AfterExclusion(def)))
        .ok_or_else(|| format!("CADENCE_ALGO excludes every algorithm for {kind}"))
}

/// The choice for a call whose size differs by rank (each rank knows only
/// its own counts): the bare `CADENCE_ALGO` entries, then the size table's
/// choice for the placement at size 0, the same on every rank; the tuning
/// table, size ranges and the cost model, which go by size, are not asked.
fn by_placement(
    ov: &AlgoOverride,
    args: &CollArgs,
    auto: &Auto,
    applicable: impl Fn(Algo) -> bool,
) -> Result<(Algo, Why), String> {
    let kind = args.kind;
    if let Some(a) = ov.everywhere.iter().copied().find(|&a| applicable(a)) {
        return Ok((a, Why::Everywhere));
    }
    let allowed = |a: Algo| !ov.is_excluded(kind, a) && applicable(a);
    let same_everywhere = CollArgs {
        kind,
        root: args.root,
        counts: vec![0; auto.topo.nranks()],
    };
    let def = super::defaults::default_algo_on(&same_everywhere, &auto.topo, 1);
    if allowed(def) {
        return Ok((def, Why::Placement));
    }
    after_exclusion(kind, def, allowed)
}

/// [`select_algo_on`] with the size table on one host.
#[cfg(test)]
pub fn select_algo(
    ov: &AlgoOverride,
    args: &CollArgs,
    nranks: usize,
    elem_size: usize,
    caller: Option<Algo>,
) -> Result<(Algo, Why), String> {
    select_algo_on(ov, args, &Auto::flat(nranks), elem_size, caller)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::LinkCost;
    use crate::types::CollKind;

    fn ar(count: usize) -> CollArgs {
        CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![count],
        }
    }

    fn ov(s: &str) -> AlgoOverride {
        AlgoOverride::parse(s).unwrap()
    }

    #[test]
    fn an_alltoall_of_own_counts_is_chosen_the_same_whatever_the_counts() {
        // A range forcing bruck for every size would split the ranks (each
        // judges its own size) and bruck cannot run on own counts anyway:
        // the placement decides, alike on every rank.
        let o = ov("alltoall:bruck:0-1G");
        let own = |r: usize, each: usize| CollArgs::alltoallv(r, &[each; 4], &[each; 4]);
        for (r, each) in [(0, 0), (1, 5), (2, 1 << 20), (3, 7)] {
            assert_eq!(
                select_algo(&o, &own(r, each), 4, 4, None).unwrap(),
                (Algo::Direct, Why::Placement),
                "rank {r}"
            );
        }
        // The same counts as a matrix: the range applies.
        let whole = CollArgs {
            kind: CollKind::AllToAll,
            root: 0,
            counts: vec![5; 16],
        };
        assert_eq!(select_algo(&o, &whole, 4, 4, None).unwrap().0, Algo::Bruck);
        // Bare entries and the caller still decide; bruck is refused.
        let bare = ov("pairwise");
        assert_eq!(
            select_algo(&bare, &own(1, 5), 4, 4, None).unwrap(),
            (Algo::Pairwise, Why::Everywhere)
        );
        let e = select_algo(&o, &own(1, 5), 4, 4, Some(Algo::Bruck)).unwrap_err();
        assert!(e.contains("bruck does not apply"), "{e}");
    }

    #[test]
    fn ranges_force_by_size_and_the_rest_is_default() {
        let o = ov("allreduce:recursive_doubling:0-8K;ring:8193-64K");
        let pick = |count, es| select_algo(&o, &ar(count), 4, es, None).unwrap();
        // 2048 f32 = 8 KiB: the first range's last size.
        let (a, why) = pick(2048, 4);
        assert_eq!(a, Algo::RecursiveDoubling);
        assert_eq!(why, Why::Range(o.ranges[0]));
        assert_eq!(
            why.to_string(),
            "forced by CADENCE_ALGO range allreduce:recursive_doubling:0-8K"
        );
        // 8193 bytes of u8: the second range (ring, where the default would be
        // recursive doubling).
        assert_eq!(pick(8193, 1).0, Algo::Ring);
        assert_eq!(pick(16384, 4).0, Algo::Ring);
        // Past 64 KiB no range applies: the default (direct on 4 ranks).
        assert_eq!(pick(16385, 4), (Algo::Direct, Why::Default));
        assert_eq!(pick(1 << 20, 4), (Algo::Ring, Why::Default));
        // Other collectives: untouched.
        let bc = CollArgs {
            kind: CollKind::Broadcast,
            root: 1,
            counts: vec![10],
        };
        assert_eq!(
            select_algo(&o, &bc, 4, 4, None).unwrap(),
            (Algo::Direct, Why::Default)
        );
        // The call's own choice beats everything.
        assert_eq!(
            select_algo(&o, &ar(10), 4, 4, Some(Algo::Direct)).unwrap(),
            (Algo::Direct, Why::Caller)
        );
        let e = select_algo(&o, &ar(10), 4, 4, Some(Algo::Pairwise)).unwrap_err();
        assert_eq!(e, "algorithm pairwise does not apply to allreduce here");
    }

    #[test]
    fn exclusions_and_bare_entries() {
        // Default for 1 MiB + 4 bytes allreduce on 4 ranks is ring; excluded for
        // allreduce only, the next of algos_for that is not excluded.
        let o = ov("allreduce:^ring;allreduce:^recursive_doubling");
        assert_eq!(
            select_algo(&o, &ar((1 << 18) + 1), 4, 4, None).unwrap(),
            (Algo::Direct, Why::AfterExclusion(Algo::Ring))
        );
        assert_eq!(
            Why::AfterExclusion(Algo::Ring).to_string(),
            "default after exclusion (CADENCE_ALGO excludes the default ring)"
        );
        // Not excluded for allgather.
        let ag = CollArgs {
            kind: CollKind::AllGather,
            root: 0,
            counts: vec![1 << 18; 4],
        };
        assert_eq!(
            select_algo(&o, &ag, 4, 4, None).unwrap(),
            (Algo::Ring, Why::Default)
        );
        // Forced in a range, excluded elsewhere.
        let o = ov("allreduce:ring:0-1K;allreduce:^ring");
        assert_eq!(select_algo(&o, &ar(4), 4, 4, None).unwrap().0, Algo::Ring);
        assert_eq!(
            select_algo(&o, &ar(1 << 20), 4, 4, None).unwrap().0,
            Algo::RecursiveDoubling
        );
        // A bare entry applies where it can; a collective's range beats it.
        let o = ov("pairwise;ring;allreduce:direct:0-max");
        assert_eq!(
            select_algo(&o, &ag, 4, 4, None).unwrap(),
            (Algo::Ring, Why::Everywhere)
        );
        assert_eq!(select_algo(&o, &ar(4), 4, 4, None).unwrap().0, Algo::Direct);
        let bc = CollArgs {
            kind: CollKind::Broadcast,
            root: 0,
            counts: vec![4],
        };
        assert_eq!(
            select_algo(&o, &bc, 4, 4, None).unwrap(),
            (Algo::Direct, Why::Default)
        );
        // Everything excluded.
        let all: Vec<String> = schedule::algos_for(CollKind::AllReduce)
            .iter()
            .map(|a| format!("^{}", a.name()))
            .collect();
        let o = ov(&all.join(";"));
        assert_eq!(
            select_algo(&o, &ar(4), 4, 4, None).unwrap_err(),
            "CADENCE_ALGO excludes every algorithm for allreduce"
        );
    }

    #[test]
    fn a_forced_range_that_does_not_apply_is_an_error() {
        // The allgather counts' shape is wrong for 4 ranks: nothing applies.
        let o = ov("allgather:ring:0-1K");
        let bad = CollArgs {
            kind: CollKind::AllGather,
            root: 0,
            counts: vec![1, 2, 3],
        };
        let e = select_algo(&o, &bad, 4, 4, None).unwrap_err();
        assert!(
            e.starts_with(
                "CADENCE_ALGO forces ring for allgather of 24 bytes (allgather:ring:0-1K), \
                 which does not apply (nranks 4"
            ),
            "{e}"
        );
    }

    #[test]
    fn auto_takes_the_tuning_table_then_the_model() {
        let topo = Topology::from_hosts(&[0, 0, 1, 1]);
        let tuned = Tuned {
            choices: vec![(CollKind::AllReduce, 0, 1023, Algo::Direct)],
            model: None,
            note: String::new(),
        };
        let auto = Auto {
            topo: topo.clone(),
            order: Default::default(),
            fabric: None,
            tuned: Some(tuned.clone()),
            model: None,
            measured_at_start: false,
        };
        let none = AlgoOverride::default();
        assert_eq!(
            select_algo_on(&none, &ar(8), &auto, 4, None).unwrap(),
            (Algo::Direct, Why::Tuned)
        );
        // Past the table: the size table on this topology.
        assert_eq!(
            select_algo_on(&none, &ar(1 << 20), &auto, 4, None).unwrap(),
            (Algo::Hierarchical, Why::Default)
        );
        // An excluded tuned choice falls through.
        let no_direct = ov("^direct");
        assert_ne!(
            select_algo_on(&no_direct, &ar(8), &auto, 4, None)
                .unwrap()
                .0,
            Algo::Direct
        );
        // With a model, sizes the table does not cover go to the cheapest.
        let auto = Auto {
            topo,
            order: Default::default(),
            fabric: None,
            tuned: Some(tuned),
            model: Some(CostModel::default()),
            measured_at_start: false,
        };
        let (a, why) = select_algo_on(&none, &ar(16 << 20), &auto, 4, None).unwrap();
        assert_eq!(why, Why::Model);
        let m = CostModel::default();
        let cheapest = auto.cheapest(&m, &ar(16 << 20), 4, &|_| true).unwrap();
        assert_eq!(a, cheapest);
    }

    /// Pricing every allowed candidate for every rank: the choice
    /// [`Auto::cheapest`] must make.
    fn priced_in_full(auto: &Auto, m: &CostModel, args: &CollArgs, es: usize) -> Option<Algo> {
        let n = auto.topo.nranks();
        schedule::algos_for(args.kind)
            .iter()
            .copied()
            .filter(|&a| schedule::applicable_on(args, &auto.topo, a))
            .filter_map(|a| {
                let all: Result<Vec<_>, _> = (0..n)
                    .map(|r| schedule::build_on(args, r, &auto.topo, a))
                    .collect();
                all.ok().map(|s| {
                    let e = m.estimate_on(&s, &auto.topo, auto.fabric.as_deref(), es);
                    (e, a)
                })
            })
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .map(|(_, a)| a)
    }

    /// A random case of the choice: `n` ranks (2..=64 when `n` is None) on
    /// hosts of consecutive or dealt-out ranks, a fabric with groups now
    /// and then, a model with random parameters, a collective with a
    /// choice, sizes from 0 to 16 MiB a block (odd ones among them).
    fn random_case(
        case: usize,
        ranks: Option<usize>,
        next: &mut dyn FnMut(usize) -> usize,
    ) -> (Auto, CostModel, CollArgs, usize, Vec<usize>) {
        use crate::fabric::pathfind::Fabric;
        // The collectives with a choice to make.
        let kinds: Vec<CollKind> = CollKind::ALL
            .into_iter()
            .filter(|&k| schedule::algos_for(k).len() > 1)
            .collect();
        let n = ranks.unwrap_or_else(|| 2 + next(63));
        let per = 1 + next(8);
        // Hosts of `per` consecutive ranks, or ranks dealt out.
        let hosts: Vec<usize> = if case % 3 == 2 {
            (0..n).map(|_| next(n.div_ceil(per))).collect()
        } else {
            (0..n).map(|r| r / per).collect()
        };
        let topo = Topology::from_hosts(&hosts);
        let nh = topo.nhosts();
        let fabric = (case % 4 == 3 && nh > 1).then(|| {
            let ngroups = 1 + next(nh.min(3));
            let group_of: Vec<usize> = (0..nh).map(|h| h % ngroups).collect();
            let rate = (0..nh)
                .map(|a| {
                    (0..nh)
                        .map(|b| {
                            if a == b {
                                0.0
                            } else {
                                1e8 * (1 + next(20)) as f64
                            }
                        })
                        .collect()
                })
                .collect();
            let mut cap = |_| 1e8 * (1 + next(10)) as f64;
            let group_out = (0..ngroups).map(&mut cap).collect();
            let group_in = (0..ngroups).map(&mut cap).collect();
            Fabric {
                rate,
                group_of,
                group_out,
                group_in,
            }
        });
        let scale = |x: f64, k: usize| x * (1 + k) as f64 / 4.0;
        let d = CostModel::default();
        let m = CostModel {
            shm: LinkCost {
                alpha: scale(d.shm.alpha, next(200)),
                beta: scale(d.shm.beta, next(16)),
            },
            tcp: LinkCost {
                alpha: scale(d.tcp.alpha, next(40)),
                beta: scale(d.tcp.beta, next(16)),
            },
            gamma: scale(d.gamma, next(16)),
            incast: scale(d.incast, next(8)),
            tcp_serial: scale(d.tcp_serial, next(5)).min(1.0),
        };
        let auto = Auto {
            topo,
            order: Default::default(),
            fabric: fabric.map(std::sync::Arc::new),
            tuned: None,
            model: Some(m),
            measured_at_start: true,
        };
        let kind = kinds[case % kinds.len()];
        // Sizes from 0 to 16 MiB a block, odd ones among them.
        let size = |next: &mut dyn FnMut(usize) -> usize| match next(4) {
            0 => next(3),
            1 => next(1 << 10),
            2 => next(1 << 16) | 1,
            _ => next(1 << 22),
        };
        let counts: Vec<usize> = match kind {
            CollKind::AllReduce | CollKind::Reduce | CollKind::Broadcast => {
                vec![size(next)]
            }
            CollKind::AllToAll => {
                let block = size(next) >> 6;
                vec![block; n * n]
            }
            _ => (0..n).map(|_| size(next) >> 4).collect(),
        };
        let args = CollArgs {
            kind,
            root: next(n),
            counts,
        };
        let es = [1, 2, 4, 8][next(4)];
        (auto, m, args, es, hosts)
    }

    #[test]
    fn bounding_candidates_chooses_as_pricing_every_rank_does() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below.max(1) as u64) as usize
        };
        let mut pruned = 0;
        for case in 0..240 {
            let (auto, m, args, es, hosts) = random_case(case, None, &mut next);
            let (n, kind) = (auto.topo.nranks(), args.kind);
            let chosen = auto.cheapest(&m, &args, es, &|a| {
                schedule::applicable_on(&args, &auto.topo, a)
            });
            let full = priced_in_full(&auto, &m, &args, es);
            assert_eq!(
                chosen,
                full,
                "case {case}: {kind} of {:?}.. on {n} ranks, hosts {hosts:?}",
                &args.counts[..args.counts.len().min(4)]
            );
            // Count the cases where bounds spared some candidate's full
            // pricing (so the test sees the pruning, not only its absence).
            let sample = sample_ranks(&auto.topo);
            let bounds = schedule::algos_for(kind).iter().filter(|&&a| {
                let s: Result<Vec<_>, _> = sample
                    .iter()
                    .map(|&r| schedule::build_on(&args, r, &auto.topo, a))
                    .collect();
                let chosen_full: Vec<_> = (0..n)
                    .map(|r| schedule::build_on(&args, r, &auto.topo, full.unwrap()).unwrap())
                    .collect();
                let best = m.estimate_on(&chosen_full, &auto.topo, auto.fabric.as_deref(), es);
                s.is_ok_and(|s| m.estimate_on(&s, &auto.topo, auto.fabric.as_deref(), es) > best)
            });
            pruned += usize::from(bounds.count() > 0);
        }
        assert!(
            pruned > 120,
            "bounds spared pricing in only {pruned} of 240 cases"
        );
    }

    /// Beyond [`EVERY_RANK_UP_TO`] ranks the choice prices the ranks of
    /// [`representative_hosts`] only: on random cases (forced to that path)
    /// it must pick what pricing every rank picks, or one the full pricing
    /// puts within 1 % of it.
    #[test]
    fn representative_hosts_choose_as_pricing_every_rank_does() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below.max(1) as u64) as usize
        };
        let (mut same, mut close, mut total) = (0, 0, 0);
        let mut worst = 1.0f64;
        for case in 0..300 {
            let n = 2 + next(95);
            let (auto, m, args, es, hosts) = random_case(case, Some(n), &mut next);
            let allowed = |a| schedule::applicable_on(&args, &auto.topo, a);
            let chosen = auto.cheapest_over(&m, &args, es, &allowed, 0);
            let full = priced_in_full(&auto, &m, &args, es);
            total += 1;
            if chosen == full {
                same += 1;
                continue;
            }
            let price = |a: Algo| {
                let s: Vec<_> = (0..n)
                    .map(|r| schedule::build_on(&args, r, &auto.topo, a).unwrap())
                    .collect();
                m.estimate_on(&s, &auto.topo, auto.fabric.as_deref(), es)
            };
            let ratio = price(chosen.unwrap()) / price(full.unwrap());
            worst = worst.max(ratio);
            if ratio <= 1.01 {
                close += 1;
            } else {
                println!(
                    "case {case}: {} of {:?}.. on {n} ranks, hosts {:?}..: {chosen:?} at {ratio:.3}x of {full:?} (fabric {})",
                    args.kind,
                    &args.counts[..args.counts.len().min(3)],
                    &hosts[..hosts.len().min(12)],
                    auto.fabric.is_some()
                );
            }
        }
        println!("{same} of {total} the same, {close} within 1 %, worst {worst:.3}x");
        // Misses were uneven blocks (the slowest rank of a recursive
        // doubling or bruck is not where the largest block is) and racks
        // (other hosts' traffic on an uplink); at most 1.29x off.
        assert!(same + close >= 290, "{same} + {close} of {total}");
        assert!(worst < 1.35, "worst {worst:.3}x");
    }

    /// At 1,024 ranks (hosts of 8, and of 1) the representative hosts make
    /// the choice pricing every rank makes, for the shapes a job meets
    /// first (`tests/choice_scale.rs`) and odd sizes of them.
    #[test]
    fn representative_hosts_choose_as_every_rank_at_1024() {
        let n = 1024;
        for per in [8, 1] {
            let hosts: Vec<usize> = (0..n).map(|r| r / per).collect();
            let auto = Auto {
                topo: Topology::from_hosts(&hosts),
                model: Some(CostModel::default()),
                measured_at_start: true,
                ..Auto::flat(n)
            };
            let m = CostModel::default();
            let mut shapes: Vec<CollArgs> = Vec::new();
            for count in [2 << 10, (128 << 10) + 3, 8 << 20] {
                shapes.push(ar(count));
                for kind in [CollKind::Broadcast, CollKind::Reduce] {
                    shapes.push(CollArgs {
                        kind,
                        root: 5,
                        counts: vec![count],
                    });
                }
            }
            for each in [1 << 10, 777] {
                for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
                    shapes.push(CollArgs {
                        kind,
                        root: 0,
                        counts: vec![each; n],
                    });
                }
            }
            for args in shapes {
                let allowed = |a| schedule::applicable_on(&args, &auto.topo, a);
                let reps = auto.cheapest_over(&m, &args, 4, &allowed, EVERY_RANK_UP_TO);
                let full = auto.cheapest_over(&m, &args, 4, &allowed, usize::MAX);
                assert_eq!(
                    reps,
                    full,
                    "{} of {:?}.. on hosts of {per}",
                    args.kind,
                    &args.counts[..1]
                );
            }
        }
    }
}
