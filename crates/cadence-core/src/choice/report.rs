//! What `CADENCE_DEBUG=INFO` says about the choice: the selection table at
//! communicator creation ([`table_lines`]) and each distinct choice once
//! ([`choice_line`], [`ChoiceLog`]).

use super::defaults::default_table_on;
use super::overrides::{fmt_size, AlgoOverride, AlgoRange};
use super::select::{Auto, Why};
use crate::schedule::Algo;
use crate::types::CollKind;
use std::collections::HashSet;
use std::sync::Mutex;

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
    use crate::choice::defaults::default_table;
    use crate::schedule::CollArgs;

    fn ov(s: &str) -> AlgoOverride {
        AlgoOverride::parse(s).unwrap()
    }

    /// Arguments of `kind` on `nranks` ranks whose full buffer is `bytes` bytes
    /// of one-byte elements, spread as evenly as the counts' shape allows.
    fn args_of_size(kind: CollKind, nranks: usize, bytes: usize) -> CollArgs {
        let len = match kind {
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::Gather
            | CollKind::Scatter => nranks,
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
                            assert_eq!(
                                crate::choice::default_algo(&args, n, 4),
                                a,
                                "{kind} {n} {b}"
                            );
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
}
