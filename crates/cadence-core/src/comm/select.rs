//! Algorithm choice as a pure function of (`CADENCE_ALGO`, call, nranks,
//! element size), plus what `CADENCE_DEBUG=INFO` says about it: the
//! selection table at communicator creation and each distinct choice once.

use crate::config::{fmt_size, AlgoOverride, AlgoRange};
use crate::schedule::{self, Algo, CollArgs, CostModel, Topology};
use crate::tuning::Tuned;
use crate::types::CollKind;
use std::collections::HashSet;
use std::fmt;
use std::sync::Mutex;

/// Why [`select_algo`] chose what it chose.
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
            Why::AfterExclusion(a) => write!(
                f,
                "default after exclusion (CADENCE_ALGO excludes the default {})",
                a.name()
            ),
        }
    }
}

/// The size [`schedule::default_algo`] and `CADENCE_ALGO` ranges speak of:
/// bytes of the collective's full buffer (the sum of the counts).
pub fn coll_bytes(args: &CollArgs, elem_size: usize) -> u64 {
    let count: usize = args.counts.iter().sum();
    (count as u64).saturating_mul(elem_size as u64)
}

/// How a communicator chooses when nothing forces a choice: its tuning
/// table, else its cost model (when parameters were measured for this
/// setting), else the size table of [`schedule::default_algo_on`].
pub struct Auto {
    pub topo: Topology,
    /// How `topo`'s ring order was chosen (see `order.rs`).
    pub order: super::order::OrderChoice,
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
        let bytes = coll_bytes(args, es);
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
        let def = schedule::default_algo_on(args, &self.topo, es);
        allowed(def).then_some((def, Why::Default))
    }

    /// The algorithm the model says is fastest, among the allowed ones.
    pub fn cheapest(
        &self,
        m: &CostModel,
        args: &CollArgs,
        es: usize,
        allowed: &impl Fn(Algo) -> bool,
    ) -> Option<Algo> {
        let n = self.topo.nranks();
        schedule::algos_for(args.kind)
            .iter()
            .copied()
            .filter(|&a| allowed(a))
            .filter_map(|a| {
                let all: Result<Vec<_>, _> = (0..n)
                    .map(|r| schedule::build_on(args, r, &self.topo, a))
                    .collect();
                all.ok()
                    .map(|s| (m.estimate_on(&s, &self.topo, self.fabric.as_deref(), es), a))
            })
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .map(|(_, a)| a)
    }
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
    let bytes = coll_bytes(args, elem_size);
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
    let def = schedule::default_algo_on(args, &auto.topo, elem_size);
    schedule::algos_for(kind)
        .iter()
        .copied()
        .find(|&a| allowed(a))
        .map(|a| (a, Why::AfterExclusion(def)))
        .ok_or_else(|| format!("CADENCE_ALGO excludes every algorithm for {kind}"))
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

/// Arguments of `kind` on `nranks` ranks whose full buffer is `bytes` bytes
/// of one-byte elements, spread as evenly as the counts' shape allows.
fn args_of_size(kind: CollKind, nranks: usize, bytes: usize) -> CollArgs {
    let len = match kind {
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::Gather | CollKind::Scatter => {
            nranks
        }
        CollKind::AllToAll => nranks * nranks,
        CollKind::Barrier => 0,
        _ => 1,
    };
    let counts = (0..len)
        .map(|i| bytes / len + usize::from(i < bytes % len))
        .collect();
    CollArgs {
        kind,
        root: 0,
        counts,
    }
}

/// Sizes up to which [`default_table`] looks (above it, the last choice).
pub const TABLE_MAX_BYTES: usize = 64 << 20;

/// The size-based default of `kind` on `nranks` ranks as ranges of bytes
/// `(lo, hi, algo)` (inclusive, `hi == u64::MAX` for the last): sampled at
/// every power of two up to [`TABLE_MAX_BYTES`], and each switch located
/// exactly by bisection (the default is a step function of the size).
#[cfg(test)]
pub fn default_table(kind: CollKind, nranks: usize) -> Vec<(u64, u64, Algo)> {
    default_table_on(kind, &Topology::single_host(nranks))
}

/// [`default_table`] on a topology ([`schedule::default_algo_on`]).
pub fn default_table_on(kind: CollKind, topo: &Topology) -> Vec<(u64, u64, Algo)> {
    let nranks = topo.nranks();
    let at = |b: usize| schedule::default_algo_on(&args_of_size(kind, nranks, b), topo, 1);
    if kind == CollKind::Barrier {
        return vec![(0, u64::MAX, at(0))];
    }
    let mut out: Vec<(u64, u64, Algo)> = vec![(0, 0, at(0))];
    let mut prev = 0usize;
    let mut b = 1usize;
    while b <= TABLE_MAX_BYTES {
        let a = at(b);
        if a != out.last().unwrap().2 {
            // The first size in (prev, b] where the choice differs.
            let (mut lo, mut hi) = (prev, b);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if at(mid) == out.last().unwrap().2 {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            out.last_mut().unwrap().1 = lo as u64;
            out.push((hi as u64, hi as u64, at(hi)));
        }
        prev = b;
        b *= 2;
    }
    out.last_mut().unwrap().1 = u64::MAX;
    out
}

/// Ranges as `CADENCE_ALGO` writes them: `ring:0-32767,direct:32K-1M`.
fn ranges_text(ranges: impl IntoIterator<Item = (u64, u64, Algo)>) -> String {
    ranges
        .into_iter()
        .map(|(lo, hi, a)| format!("{}:{}-{}", a.name(), fmt_size(lo), fmt_size(hi)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What `CADENCE_DEBUG=INFO` prints once at communicator creation (without
/// the `cadence rank R INFO: ` prefix): the `CADENCE_ALGO` overrides in
/// force, then the default for every collective on `nranks` ranks.
pub fn table_lines(ov: &AlgoOverride, auto: &Auto, tuning: Option<&str>) -> Vec<String> {
    let topo = &auto.topo;
    let nranks = topo.nranks();
    let mut lines = vec![format!(
        "algorithm selection over {nranks} ranks on {} hosts (sizes: bytes of the collective's \
         full buffer; CADENCE_ALGO first, then the tuning table, then the cost model (the \
         table's, else one measured at start-up across hosts), else the default)",
        topo.nhosts()
    )];
    if ov.is_empty() {
        lines.push("CADENCE_ALGO: none".into());
    }
    for kind in CollKind::ALL {
        let mine: Vec<&AlgoRange> = ov.ranges.iter().filter(|r| r.kind == kind).collect();
        if !mine.is_empty() {
            let mut mine = mine;
            mine.sort_by_key(|r| r.lo);
            let text = mine
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(";");
            lines.push(format!("CADENCE_ALGO {kind} forced: {text}"));
        }
    }
    if !ov.everywhere.is_empty() {
        let names: Vec<&str> = ov.everywhere.iter().map(|a| a.name()).collect();
        lines.push(format!(
            "CADENCE_ALGO forced wherever it applies: {}",
            names.join(", ")
        ));
    }
    for (k, a) in &ov.excluded {
        match k {
            None => lines.push(format!("CADENCE_ALGO excludes {} everywhere", a.name())),
            Some(k) => lines.push(format!("CADENCE_ALGO excludes {} for {k}", a.name())),
        }
    }
    match (tuning, &auto.tuned) {
        (None, _) => lines.push("tuning table: none (run `cadence tune`)".into()),
        (Some(path), None) => lines.push(format!(
            "tuning table {path}: nothing for this setting ({} ranks, {} hosts, {} per host)",
            nranks,
            topo.nhosts(),
            topo.uniform_ranks_per_host().unwrap_or(0)
        )),
        (Some(path), Some(t)) => {
            lines.push(format!("tuning table {path}: {}", t.note));
            for kind in CollKind::ALL {
                let mine: Vec<_> = t.choices.iter().filter(|c| c.0 == kind).collect();
                if !mine.is_empty() {
                    let text = ranges_text(mine.iter().map(|c| (c.1, c.2, c.3)));
                    lines.push(format!("tuned {kind}: {text}"));
                }
            }
        }
    }
    if let Some(m) = &auto.model {
        lines.push(format!(
            "cost model ({}): shm α {:.1} µs, {:.2} GB/s; tcp α {:.1} µs, {:.3} GB/s; γ {:.2} GB/s",
            if auto.measured_at_start {
                "measured at start-up"
            } else {
                "tuning table"
            },
            m.shm.alpha * 1e6,
            1e-9 / m.shm.beta,
            m.tcp.alpha * 1e6,
            1e-9 / m.tcp.beta,
            1e-9 / m.gamma
        ));
    }
    for kind in CollKind::ALL {
        if matches!(kind, CollKind::Send | CollKind::Recv) {
            continue;
        }
        lines.push(format!(
            "default {kind}: {}",
            ranges_text(default_table_on(kind, topo))
        ));
    }
    lines
}

/// The line `CADENCE_DEBUG=INFO` prints for a choice (without the prefix).
pub fn choice_line(kind: CollKind, bytes: u64, nranks: usize, algo: Algo, why: &Why) -> String {
    format!(
        "chose {} for {kind} of {bytes} bytes over {nranks} ranks: {why}",
        algo.name()
    )
}

/// Remembers which (collective, bytes, algorithm) choices were announced.
#[derive(Default)]
pub struct ChoiceLog {
    seen: Mutex<HashSet<(CollKind, u64, Algo)>>,
}

impl ChoiceLog {
    /// Whether this is the first time the choice is made.
    pub fn first(&self, kind: CollKind, bytes: u64, algo: Algo) -> bool {
        let mut seen = self.seen.lock().unwrap();
        if seen.len() >= 1 << 16 {
            // A program of ever-new sizes: start over rather than grow.
            seen.clear();
        }
        seen.insert((kind, bytes, algo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::Tuned;

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
    fn the_default_table_finds_exact_switches() {
        let t = default_table(CollKind::AllReduce, 4);
        assert_eq!(
            t,
            vec![
                (0, 4 * 1024 - 1, Algo::OneShot),
                (4 * 1024, 32 * 1024 - 1, Algo::RecursiveDoubling),
                (32 * 1024, 1 << 20, Algo::Direct),
                ((1 << 20) + 1, u64::MAX, Algo::Ring)
            ]
        );
        assert_eq!(
            ranges_text(t),
            "one_shot:0-4095,recursive_doubling:4K-32767,direct:32K-1M,ring:1048577-max"
        );
        // With 16 ranks the medium range goes to rabenseifner.
        assert_eq!(
            default_table(CollKind::AllReduce, 16),
            vec![
                (0, 32 * 1024 - 1, Algo::RecursiveDoubling),
                (32 * 1024, 1 << 20, Algo::Rabenseifner),
                ((1 << 20) + 1, u64::MAX, Algo::Ring)
            ]
        );
        assert_eq!(
            default_table(CollKind::Barrier, 3),
            vec![(0, u64::MAX, Algo::Dissemination)]
        );
        // Every table agrees with default_algo at sizes around its switches,
        // whatever the element size.
        for n in [1, 2, 3, 8, 9] {
            for kind in CollKind::ALL {
                let t = default_table(kind, n);
                for &(lo, hi, a) in &t {
                    for b in [lo, hi.min(1 << 27)] {
                        if b % 4 == 0 && kind != CollKind::Barrier {
                            let args = args_of_size(kind, n, b as usize / 4);
                            assert_eq!(schedule::default_algo(&args, n, 4), a, "{kind} {n} {b}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn info_lines() {
        let o = ov("allreduce:ring:8193-max;recursive_doubling:0-8K;^direct;broadcast:^scatter_allgather;pairwise");
        let lines = table_lines(&o, &Auto::flat(4), None);
        let has = |l: &str| lines.iter().any(|x| x == l);
        assert!(
            lines[0].starts_with("algorithm selection over 4 ranks"),
            "{lines:?}"
        );
        assert!(
            has("CADENCE_ALGO allreduce forced: allreduce:recursive_doubling:0-8K;allreduce:ring:8193-max"),
            "{lines:?}"
        );
        assert!(has("CADENCE_ALGO forced wherever it applies: pairwise"));
        assert!(has("CADENCE_ALGO excludes direct everywhere"));
        assert!(has("CADENCE_ALGO excludes scatter_allgather for broadcast"));
        assert!(has(
            "default allreduce: one_shot:0-4095,recursive_doubling:4K-32767,direct:32K-1M,ring:1048577-max"
        ));
        assert!(has(
            "default broadcast: direct:0-32767,binomial_tree:32K-262143,scatter_allgather:256K-max"
        ));
        assert!(has("default barrier: dissemination:0-max"));
        assert!(!lines.iter().any(|l| l.contains("send")));
        let empty = table_lines(&AlgoOverride::default(), &Auto::flat(2), None);
        assert_eq!(empty[1], "CADENCE_ALGO: none");
        assert!(empty.contains(&"default broadcast: binomial_tree:0-max".to_string()));
        assert_eq!(
            choice_line(CollKind::AllReduce, 128, 4, Algo::Ring, &Why::Default),
            "chose ring for allreduce of 128 bytes over 4 ranks: default"
        );
        let log = ChoiceLog::default();
        assert!(log.first(CollKind::AllReduce, 128, Algo::Ring));
        assert!(!log.first(CollKind::AllReduce, 128, Algo::Ring));
        assert!(log.first(CollKind::AllReduce, 128, Algo::Direct));
        assert!(log.first(CollKind::AllReduce, 256, Algo::Ring));
        assert!(log.first(CollKind::AllGather, 128, Algo::Ring));
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
}
