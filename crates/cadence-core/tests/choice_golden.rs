//! The automatic algorithm choice over a wide grid, against a golden file:
//! every collective × every rank count 1..=64 × sizes from 0 to past 1 GiB
//! (0, 1, powers of two and their odd neighbours) × one host or several
//! (1, 2, 4 or 8 ranks a host, or uneven hosts) × every element size; plus
//! the size tables `CADENCE_DEBUG=INFO` prints, and the cost model's
//! choices on a smaller grid. Any change to a decision shows up as a diff.
//!
//! To accept a deliberate change: `CADENCE_BLESS=1 cargo test -p
//! cadence-core --release --test choice_golden`, then review the diff of
//! `tests/data/choice_golden.txt`.

use cadence_core::choice::AlgoOverride;
use cadence_core::choice::{default_table_on, select_algo_on, Auto};
use cadence_core::schedule::{CollArgs, CostModel, Topology};
use cadence_core::types::{CollKind, DType};
use std::fmt::Write;
use std::path::PathBuf;

const MAX_RANKS: usize = 64;

/// Element counts of the full buffer: 0, 1, then 2^k - 1, 2^k, 2^k + 1 up to
/// 2^30 + 1 (1 GiB of bytes and beyond, by element size).
fn counts_grid() -> Vec<usize> {
    let mut v = vec![0, 1];
    for k in 1..=30 {
        let p = 1usize << k;
        v.extend([p - 1, p, p + 1]);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Arguments of `kind` on `n` ranks whose full buffer holds `count`
/// elements, spread as evenly as the counts' shape allows.
fn args_of(kind: CollKind, n: usize, count: usize) -> CollArgs {
    let len = match kind {
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::Gather | CollKind::Scatter => n,
        CollKind::AllToAll => n * n,
        CollKind::Barrier => 0,
        _ => 1,
    };
    let counts = if len == 0 {
        vec![]
    } else {
        (0..len)
            .map(|i| count / len + usize::from(i < count % len))
            .collect()
    };
    CollArgs {
        kind,
        root: 0,
        counts,
    }
}

/// The placements of `n` ranks the grid covers, by name.
fn layouts(n: usize) -> Vec<(&'static str, Topology)> {
    let mut out = vec![("one-host", Topology::single_host(n))];
    for (name, per) in [("1/host", 1), ("2/host", 2), ("4/host", 4), ("8/host", 8)] {
        if n.is_multiple_of(per) && n / per >= 2 {
            let hosts: Vec<usize> = (0..n).map(|r| r / per).collect();
            out.push((name, Topology::from_hosts(&hosts)));
        }
    }
    if n >= 3 {
        // Host 0 holds two ranks, every other host one.
        let hosts: Vec<usize> = (0..n).map(|r| r.saturating_sub(1)).collect();
        out.push(("uneven", Topology::from_hosts(&hosts)));
    }
    out
}

fn elem_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = DType::ALL.iter().map(|d| d.size()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Runs of rank counts (consecutive in `per_n`, which skips the counts a
/// placement does not take) with the same text, as `n=4..64/2: text`.
fn grouped(lines: &mut String, prefix: &str, per_n: &[(usize, String)]) {
    let mut i = 0;
    while i < per_n.len() {
        let step = per_n.get(i + 1).map_or(1, |next| next.0 - per_n[i].0);
        let mut j = i;
        while j + 1 < per_n.len()
            && per_n[j + 1].1 == per_n[i].1
            && per_n[j + 1].0 == per_n[j].0 + step
        {
            j += 1;
        }
        let (a, b) = (per_n[i].0, per_n[j].0);
        let ns = match (a == b, step) {
            (true, _) => format!("{a}"),
            (false, 1) => format!("{a}..{b}"),
            (false, s) => format!("{a}..{b}/{s}"),
        };
        writeln!(lines, "{prefix} n={ns}: {}", per_n[i].1).unwrap();
        i = j + 1;
    }
}

fn choices_text() -> String {
    let none = AlgoOverride::default();
    let grid = counts_grid();
    let mut out = String::new();
    out.push_str("# The default choice: per (collective, placement, element size) and rank\n");
    out.push_str("# counts, each algorithm @ the first grid size (bytes) where it is chosen.\n");
    for kind in CollKind::ALL {
        for layout in ["one-host", "1/host", "2/host", "4/host", "8/host", "uneven"] {
            for es in elem_sizes() {
                let mut per_n = Vec::new();
                for n in 1..=MAX_RANKS {
                    let Some((_, topo)) = layouts(n).into_iter().find(|(l, _)| *l == layout) else {
                        continue;
                    };
                    let auto = Auto::flat(n);
                    let auto = Auto { topo, ..auto };
                    let mut runs: Vec<String> = Vec::new();
                    let mut last = None;
                    for &c in &grid {
                        let args = args_of(kind, n, c);
                        let got = match select_algo_on(&none, &args, &auto, es, None) {
                            Ok((a, why)) => format!("{}({why})", a.name()),
                            Err(e) => format!("error({e})"),
                        };
                        if last.as_ref() != Some(&got) {
                            runs.push(format!("{got}@{}", c * es));
                            last = Some(got);
                        }
                    }
                    per_n.push((n, runs.join(" ")));
                }
                grouped(
                    &mut out,
                    &format!("choice {} {layout} es={es}", kind.name()),
                    &per_n,
                );
            }
        }
    }
    out.push_str("# The size tables CADENCE_DEBUG=INFO prints.\n");
    for kind in CollKind::ALL {
        for layout in ["one-host", "1/host", "2/host", "4/host", "8/host", "uneven"] {
            let mut per_n = Vec::new();
            for n in 1..=MAX_RANKS {
                let Some((_, topo)) = layouts(n).into_iter().find(|(l, _)| *l == layout) else {
                    continue;
                };
                let t: Vec<String> = default_table_on(kind, &topo)
                    .iter()
                    .map(|(lo, hi, a)| format!("{}:{lo}-{hi}", a.name()))
                    .collect();
                per_n.push((n, t.join(",")));
            }
            grouped(&mut out, &format!("table {} {layout}", kind.name()), &per_n);
        }
    }
    out.push_str("# The cost model's choice (default parameters), float32.\n");
    for n in [2, 3, 4, 8, 16] {
        for (layout, topo) in layouts(n) {
            let auto = Auto {
                topo,
                model: Some(CostModel::default()),
                ..Auto::flat(n)
            };
            for kind in CollKind::ALL {
                if matches!(kind, CollKind::Send | CollKind::Recv) {
                    continue;
                }
                let mut runs: Vec<String> = Vec::new();
                let mut last = None;
                for c in std::iter::once(0).chain((0..=24).step_by(2).map(|k| 1usize << k)) {
                    let args = args_of(kind, n, c);
                    let got = match select_algo_on(&none, &args, &auto, 4, None) {
                        Ok((a, why)) => format!("{}({why})", a.name()),
                        Err(e) => format!("error({e})"),
                    };
                    if last.as_ref() != Some(&got) {
                        runs.push(format!("{got}@{}", c * 4));
                        last = Some(got);
                    }
                }
                writeln!(
                    out,
                    "model {} {layout} n={n}: {}",
                    kind.name(),
                    runs.join(" ")
                )
                .unwrap();
            }
        }
    }
    out
}

#[test]
fn choices_match_the_golden_file() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/choice_golden.txt");
    let got = choices_text();
    if std::env::var_os("CADENCE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (CADENCE_BLESS=1 writes it)", path.display()));
    if got != want {
        let first = got
            .lines()
            .zip(want.lines())
            .position(|(g, w)| g != w)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        let actual = std::env::temp_dir().join("choice_golden.actual.txt");
        std::fs::write(&actual, &got).unwrap();
        panic!(
            "the choices differ from {} at line {}:\n  want: {}\n  got:  {}\n(all of it: {})",
            path.display(),
            first + 1,
            want.lines().nth(first).unwrap_or("<end>"),
            got.lines().nth(first).unwrap_or("<end>"),
            actual.display()
        );
    }
}
