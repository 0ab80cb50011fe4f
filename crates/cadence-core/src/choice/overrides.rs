//! `CADENCE_ALGO`: what the user forces or excludes, parsed once from the
//! environment (the grammar is on [`AlgoOverride`]).

use crate::schedule::Algo;
use crate::types::CollKind;

/// One `CADENCE_ALGO` entry that forces an algorithm for one collective at
/// the call sizes `lo..=hi` (bytes of the collective's full buffer, as
/// [`super::defaults::default_algo`] counts them; `hi == u64::MAX` is `max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoRange {
    pub kind: CollKind,
    pub algo: Algo,
    pub lo: u64,
    pub hi: u64,
}

impl AlgoRange {
    pub fn contains(&self, bytes: u64) -> bool {
        self.lo <= bytes && bytes <= self.hi
    }
    pub fn all_sizes(&self) -> bool {
        self.lo == 0 && self.hi == u64::MAX
    }
}

impl std::fmt::Display for AlgoRange {
    /// As `CADENCE_ALGO` writes it: `allreduce:ring:8K-max`, or
    /// `allreduce:ring` for all sizes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.algo.name())?;
        if !self.all_sizes() {
            write!(f, ":{}-{}", fmt_size(self.lo), fmt_size(self.hi))?;
        }
        Ok(())
    }
}

/// A byte size as `CADENCE_ALGO` writes it: `max`, `64K`, `1M`, `8193`.
pub fn fmt_size(b: u64) -> String {
    const K: u64 = 1 << 10;
    if b == u64::MAX {
        return "max".into();
    }
    for (unit, m) in [("G", K * K * K), ("M", K * K), ("K", K)] {
        if b > 0 && b.is_multiple_of(m) {
            return format!("{}{unit}", b / m);
        }
    }
    b.to_string()
}

/// `CADENCE_ALGO`: which algorithms the automatic choice may or must use.
///
/// The value is a list of items separated by `;` or `,` (whitespace around
/// items and fields is ignored). Each item is one of:
///
/// | item | meaning |
/// | --- | --- |
/// | `algo` | force `algo` for every call it applies to (elsewhere: the default) |
/// | `^algo` | exclude `algo` from the automatic choice of every collective |
/// | `coll:algo` | force `algo` for every call of `coll` (= `coll:algo:0-max`) |
/// | `coll:^algo` | exclude `algo` from the automatic choice of `coll` |
/// | `coll:algo:lo-hi` | force `algo` for calls of `coll` of `lo..=hi` bytes |
/// | `algo:lo-hi` | the same, for the collective of the item just before |
///
/// So `allreduce:recursive_doubling:0-8K;ring:8193-max;broadcast:binomial_tree`
/// forces two allreduce ranges and every broadcast. The last form continues
/// only a collective named by the item directly before it (any `coll:` form
/// or another continuation); after a bare `algo` or `^algo` it is an error.
///
/// Sizes are bytes of the collective's full buffer, as
/// [`super::defaults::default_algo`] counts them (the vector reduced or
/// broadcast, allgather's gathered output, reduce_scatter's input): a decimal
/// number with an optional suffix `K`, `M` or `G` (KiB, MiB, GiB; either
/// case), or `max` (no upper bound). Both ends are inclusive.
///
/// The grammar is unambiguous without knowing the names: a field that starts
/// with a digit or contains `-` is a size range (no algorithm or collective
/// name does either), one that starts with `^` an exclusion.
///
/// Choice, strongest first: the algorithm a call passes itself; the
/// `coll:` range containing the call's size (an error at call time if it
/// does not apply there); the first bare `algo` that applies; the size-based
/// default, or, if that is excluded, the first algorithm of
/// [`crate::schedule::algos_for`] that is neither excluded nor inapplicable.
/// Exclusions touch only the automatic choice, so `allreduce:ring:0-1M;
/// allreduce:^ring` means "ring up to 1 MiB and never above".
///
/// Errors (all name the offending item): unknown collective or algorithm,
/// an algorithm that is not one of the collective's, a malformed size, `lo >
/// hi`, two ranges of one collective that overlap (`coll:algo` covers all
/// sizes, so it overlaps any other range of `coll`), a range with no
/// collective before it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlgoOverride {
    /// `coll:algo[:lo-hi]` items, in the order given (never overlapping
    /// within one collective).
    pub ranges: Vec<AlgoRange>,
    /// Bare `algo` items, in the order given.
    pub everywhere: Vec<Algo>,
    /// `^algo` (`None`: every collective) and `coll:^algo` items.
    pub excluded: Vec<(Option<CollKind>, Algo)>,
}

fn algo_named(name: &str, item: &str) -> Result<Algo, String> {
    Algo::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
        format!(
            "CADENCE_ALGO: unknown algorithm {name:?} in {item:?} (known: {})",
            known.join(", ")
        )
    })
}

fn algo_of_coll(kind: CollKind, name: &str, item: &str) -> Result<Algo, String> {
    let a = algo_named(name, item)?;
    let takes = crate::schedule::algos_for(kind);
    if !takes.contains(&a) {
        let names: Vec<&str> = takes.iter().map(|a| a.name()).collect();
        return Err(format!(
            "CADENCE_ALGO: {name} is not an algorithm of {kind} in {item:?} (it takes {})",
            names.join(", ")
        ));
    }
    Ok(a)
}

fn coll_named(name: &str, item: &str) -> Result<CollKind, String> {
    CollKind::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = CollKind::ALL.iter().map(|k| k.name()).collect();
        format!(
            "CADENCE_ALGO: unknown collective {name:?} in {item:?} (known: {})",
            known.join(", ")
        )
    })
}

/// Whether an item's field is a size range rather than a name.
fn is_range(field: &str) -> bool {
    field.starts_with(|c: char| c.is_ascii_digit()) || field.contains('-')
}

pub(crate) fn parse_size(s: &str, item: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("max") {
        return Ok(u64::MAX);
    }
    let bad = || {
        format!(
            "CADENCE_ALGO: bad size {s:?} in {item:?} (bytes, optionally with K, M or G, or max)"
        )
    };
    let (digits, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(bad()),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .filter(|&v| v != u64::MAX)
        .ok_or_else(|| format!("CADENCE_ALGO: size {s:?} in {item:?} is too large (use max)"))
}

fn parse_range(r: &str, item: &str) -> Result<(u64, u64), String> {
    let (lo, hi) = r.split_once('-').ok_or_else(|| {
        format!("CADENCE_ALGO: {r:?} in {item:?} is not a size range lo-hi (like 0-64K or 1M-max)")
    })?;
    let (lo, hi) = (parse_size(lo, item)?, parse_size(hi, item)?);
    if lo > hi {
        return Err(format!(
            "CADENCE_ALGO: range {r:?} in {item:?} is empty (lo > hi)"
        ));
    }
    Ok((lo, hi))
}

impl AlgoOverride {
    pub fn parse(s: &str) -> Result<AlgoOverride, String> {
        let mut out = AlgoOverride::default();
        // The item each range came from, for overlap messages.
        let mut sources: Vec<String> = Vec::new();
        // The collective a bare `algo:lo-hi` item continues.
        let mut context: Option<CollKind> = None;
        for item in s.split([';', ',']).map(str::trim).filter(|x| !x.is_empty()) {
            let fields: Vec<&str> = item.split(':').map(str::trim).collect();
            let range = match fields[..] {
                [f] => {
                    context = None;
                    match f.strip_prefix('^') {
                        Some(name) => out.excluded.push((None, algo_named(name.trim(), item)?)),
                        None => out.everywhere.push(algo_named(f, item)?),
                    }
                    None
                }
                [a, r] if is_range(r) => {
                    if CollKind::from_name(a).is_some() {
                        return Err(format!(
                            "CADENCE_ALGO: {item:?} names no algorithm (write {a}:ALGO:{r})"
                        ));
                    }
                    let Some(kind) = context else {
                        return Err(format!(
                            "CADENCE_ALGO: range {item:?} follows no collective \
                             (write COLLECTIVE:{item})"
                        ));
                    };
                    let algo = algo_of_coll(kind, a, item)?;
                    let (lo, hi) = parse_range(r, item)?;
                    Some(AlgoRange { kind, algo, lo, hi })
                }
                [c, a] => {
                    let kind = coll_named(c, item)?;
                    context = Some(kind);
                    match a.strip_prefix('^') {
                        Some(name) => {
                            let algo = algo_of_coll(kind, name.trim(), item)?;
                            out.excluded.push((Some(kind), algo));
                            None
                        }
                        None => Some(AlgoRange {
                            kind,
                            algo: algo_of_coll(kind, a, item)?,
                            lo: 0,
                            hi: u64::MAX,
                        }),
                    }
                }
                [c, a, r] => {
                    let kind = coll_named(c, item)?;
                    context = Some(kind);
                    if a.starts_with('^') {
                        return Err(format!(
                            "CADENCE_ALGO: {item:?}: an exclusion takes no size range"
                        ));
                    }
                    let algo = algo_of_coll(kind, a, item)?;
                    let (lo, hi) = parse_range(r, item)?;
                    Some(AlgoRange { kind, algo, lo, hi })
                }
                _ => {
                    return Err(format!(
                    "CADENCE_ALGO: {item:?} has too many ':' (at most collective:algorithm:lo-hi)"
                ))
                }
            };
            if let Some(r) = range {
                let clash = out
                    .ranges
                    .iter()
                    .position(|o| o.kind == r.kind && o.lo <= r.hi && r.lo <= o.hi);
                if let Some(i) = clash {
                    return Err(format!(
                        "CADENCE_ALGO: {item:?} overlaps {:?} (both cover {} sizes {}-{})",
                        sources[i],
                        r.kind,
                        fmt_size(r.lo.max(out.ranges[i].lo)),
                        fmt_size(r.hi.min(out.ranges[i].hi)),
                    ));
                }
                out.ranges.push(r);
                sources.push(item.to_string());
            }
        }
        Ok(out)
    }

    /// The range entry of `kind` that covers a call of `bytes`.
    pub fn range_for(&self, kind: CollKind, bytes: u64) -> Option<&AlgoRange> {
        self.ranges
            .iter()
            .find(|r| r.kind == kind && r.contains(bytes))
    }

    /// Whether `algo` is excluded from the automatic choice for `kind`.
    pub fn is_excluded(&self, kind: CollKind, algo: Algo) -> bool {
        self.excluded
            .iter()
            .any(|&(k, a)| a == algo && k.is_none_or(|k| k == kind))
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.everywhere.is_empty() && self.excluded.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_override_parses_old_forms() {
        let o = AlgoOverride::parse("allreduce:ring;^direct, recursive_doubling").unwrap();
        assert_eq!(
            o.range_for(CollKind::AllReduce, 12345),
            Some(&AlgoRange {
                kind: CollKind::AllReduce,
                algo: Algo::Ring,
                lo: 0,
                hi: u64::MAX
            })
        );
        assert_eq!(o.range_for(CollKind::AllGather, 0), None);
        assert_eq!(o.everywhere, vec![Algo::RecursiveDoubling]);
        assert_eq!(o.excluded, vec![(None, Algo::Direct)]);
        assert!(o.is_excluded(CollKind::AllGather, Algo::Direct));
        assert_eq!(o.ranges[0].to_string(), "allreduce:ring");
        // The strings the tests and the launcher write.
        let o = AlgoOverride::parse(
            "allgather:ring;reduce_scatter:ring;broadcast:scatter_allgather;\
             reduce:reduce_scatter_gather;alltoall:direct",
        )
        .unwrap();
        assert_eq!(o.ranges.len(), 5);
        assert!(AlgoOverride::parse("").unwrap().is_empty());
        assert!(AlgoOverride::parse(" ; ,").unwrap().is_empty());
    }

    #[test]
    fn algo_override_parses_ranges() {
        let o = AlgoOverride::parse(
            "allreduce:recursive_doubling:0-8192;ring:8193-max, broadcast:^scatter_allgather;\
             allgather : direct : 64k - 1M ; ring:1048577-MAX ; ^pairwise",
        )
        .unwrap();
        let at = |k, b| o.range_for(k, b).map(|r| r.algo);
        use CollKind as K;
        assert_eq!(at(K::AllReduce, 0), Some(Algo::RecursiveDoubling));
        assert_eq!(at(K::AllReduce, 8192), Some(Algo::RecursiveDoubling));
        assert_eq!(at(K::AllReduce, 8193), Some(Algo::Ring));
        assert_eq!(at(K::AllReduce, u64::MAX), Some(Algo::Ring));
        assert_eq!(at(K::AllGather, 65535), None);
        assert_eq!(at(K::AllGather, 65536), Some(Algo::Direct));
        assert_eq!(at(K::AllGather, 1 << 20), Some(Algo::Direct));
        assert_eq!(at(K::AllGather, (1 << 20) + 1), Some(Algo::Ring));
        assert_eq!(at(K::Broadcast, 10), None);
        assert!(o.is_excluded(K::Broadcast, Algo::ScatterAllgather));
        assert!(!o.is_excluded(K::Reduce, Algo::ScatterAllgather));
        assert!(o.is_excluded(K::AllToAll, Algo::Pairwise));
        let shown: Vec<String> = o.ranges.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            shown,
            [
                "allreduce:recursive_doubling:0-8K",
                "allreduce:ring:8193-max",
                "allgather:direct:64K-1M",
                "allgather:ring:1048577-max"
            ]
        );
        // A printed range parses back to itself.
        let again = AlgoOverride::parse(&shown.join(";")).unwrap();
        assert_eq!(again.ranges, o.ranges);
        let o =
            AlgoOverride::parse("reduce:binomial_tree:1G-2g;reduce_scatter_gather:3G-3G").unwrap();
        assert_eq!((o.ranges[0].lo, o.ranges[0].hi), (1 << 30, 2 << 30));
        assert_eq!((o.ranges[1].lo, o.ranges[1].hi), (3 << 30, 3 << 30));
        // Exclusion and forcing of one algorithm: forced below, excluded above.
        let o = AlgoOverride::parse("allreduce:ring:0-1M;allreduce:^ring").unwrap();
        assert!(o.is_excluded(CollKind::AllReduce, Algo::Ring));
        assert_eq!(o.ranges.len(), 1);
    }

    #[test]
    fn algo_override_errors_name_the_item() {
        // (string, pieces the message must contain)
        let cases: &[(&str, &[&str])] = &[
            ("allreduce:rign", &["unknown algorithm", "\"rign\""]),
            ("allredux:ring", &["unknown collective", "\"allredux\""]),
            ("^tree", &["unknown algorithm", "\"tree\""]),
            ("rign", &["unknown algorithm", "\"rign\""]),
            (
                "broadcast:ring",
                &["ring is not an algorithm of broadcast", "binomial_tree"],
            ),
            ("allreduce:^pairwise", &["not an algorithm of allreduce"]),
            (
                "allreduce:ring:0-1K;direct:1025-max;binomial_tree:2M-max",
                &["\"binomial_tree:2M-max\"", "not an algorithm of allreduce"],
            ),
            (
                "allreduce:ring:0-8192;direct:8192-max",
                &[
                    "\"direct:8192-max\" overlaps \"allreduce:ring:0-8192\"",
                    "allreduce sizes 8K-8K",
                ],
            ),
            (
                "allreduce:ring;allreduce:direct:1M-2M",
                &["\"allreduce:direct:1M-2M\" overlaps \"allreduce:ring\""],
            ),
            ("allreduce:ring;allreduce:direct", &["overlaps"]),
            ("allreduce:ring:9K-8K", &["\"9K-8K\"", "lo > hi"]),
            (
                "allreduce:ring:0-12Q",
                &["bad size \"12Q\"", "\"allreduce:ring:0-12Q\""],
            ),
            ("allreduce:ring:x-12", &["bad size \"x\""]),
            ("allreduce:ring:-12", &["bad size \"\""]),
            ("allreduce:ring:1.5K-2K", &["bad size \"1.5K\""]),
            ("allreduce:ring:0-99999999999999999999", &["too large"]),
            ("allreduce:ring:0-16777216T", &["bad size"]),
            ("allreduce:ring:0-17179869184G", &["too large"]),
            ("allreduce:ring:4096", &["\"4096\"", "not a size range"]),
            ("ring:0-8K", &["\"ring:0-8K\" follows no collective"]),
            (
                "allreduce:ring:0-1K;^direct;ring:2K-4K",
                &["follows no collective"],
            ),
            ("allreduce:0-8K", &["names no algorithm"]),
            ("allreduce:^ring:0-8K", &["exclusion takes no size range"]),
            ("allreduce:ring:0-1K:2K", &["too many ':'"]),
        ];
        for (s, pieces) in cases {
            let e = AlgoOverride::parse(s).expect_err(s);
            assert!(e.starts_with("CADENCE_ALGO: "), "{s}: {e}");
            for p in *pieces {
                assert!(e.contains(p), "{s}: {e:?} lacks {p:?}");
            }
        }
    }

    #[test]
    fn sizes_print_as_written() {
        assert_eq!(fmt_size(0), "0");
        assert_eq!(fmt_size(8193), "8193");
        assert_eq!(fmt_size(8192), "8K");
        assert_eq!(fmt_size(3 << 20), "3M");
        assert_eq!(fmt_size(1 << 30), "1G");
        assert_eq!(fmt_size(u64::MAX), "max");
    }
}
