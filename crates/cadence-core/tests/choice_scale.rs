//! What the automatic choice costs a rank for a new call shape when a cost
//! model is installed (the default across hosts: start-up calibration
//! installs one), against n: the wall time of one `select_algo_on` and the
//! peak of the heap it allocates. A measurement, not a check (a loaded
//! machine would fail a timed test): issue 45's item 1 bounds it at 10 ms
//! and 50 MB per shape at 8,192 ranks; docs/benchmarks.md, "The choice at
//! scale", has the figures.
//!
//!     CADENCE_SCALE=1024,4096 cargo test --release -p cadence-core \
//!         --test choice_scale -- --ignored --nocapture
//!
//! (`CADENCE_RACKS=1`: with a measured fabric of racks, as a start-up
//! profile across 3 hosts or more installs.)

use cadence_core::choice::{select_algo_on, AlgoOverride, Auto};
use cadence_core::schedule::{CollArgs, CostModel, Topology};
use cadence_core::CollKind;
use std::time::Instant;

mod common;

#[global_allocator]
static ALLOC: common::CountingAlloc = common::CountingAlloc;

fn sizes() -> Vec<usize> {
    std::env::var("CADENCE_SCALE")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1024, 4096])
}

/// The call shapes a new job meets first: allreduces small to large, an
/// allgather, a broadcast, a reduce-scatter, a reduce.
fn shapes(n: usize) -> Vec<(&'static str, CollArgs)> {
    let one = |kind, count| CollArgs {
        kind,
        root: 0,
        counts: vec![count],
    };
    vec![
        ("allreduce 8 KiB", one(CollKind::AllReduce, 2 << 10)),
        ("allreduce 512 KiB", one(CollKind::AllReduce, 128 << 10)),
        ("allreduce 32 MiB", one(CollKind::AllReduce, 8 << 20)),
        (
            "allgather 4 KiB a rank",
            CollArgs {
                kind: CollKind::AllGather,
                root: 0,
                counts: vec![1 << 10; n],
            },
        ),
        ("broadcast 1 MiB", one(CollKind::Broadcast, 256 << 10)),
        (
            "reduce_scatter 4 KiB",
            CollArgs {
                kind: CollKind::ReduceScatter,
                root: 0,
                counts: vec![1 << 10; n],
            },
        ),
        ("reduce 1 MiB", one(CollKind::Reduce, 256 << 10)),
    ]
}

/// With `CADENCE_RACKS` set, a measured fabric as a start-up profile
/// gives one: hosts at 10 Gbit/s in racks of 32 whose uplinks carry 4
/// hosts' worth (and rings in a found order, not host order).
fn racks_of_32(nh: usize) -> cadence_core::fabric::pathfind::Fabric {
    let nic = 1.25e9;
    cadence_core::fabric::pathfind::Fabric {
        rate: (0..nh)
            .map(|a| (0..nh).map(|b| if a == b { 0.0 } else { nic }).collect())
            .collect(),
        group_of: (0..nh).map(|h| h / 32).collect(),
        group_out: vec![4.0 * nic; nh.div_ceil(32)],
        group_in: vec![4.0 * nic; nh.div_ceil(32)],
    }
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn choice_costs_per_new_shape() {
    let none = AlgoOverride::default();
    let mut rows: Vec<(usize, &str, f64, usize)> = Vec::new();
    for n in sizes() {
        let hosts: Vec<usize> = (0..n).map(|r| r / 8).collect();
        let racks = std::env::var("CADENCE_RACKS").is_ok();
        let mut topo = Topology::from_hosts(&hosts);
        if racks {
            // A found ring order, as the path finder gives: not host order.
            let nh = topo.nhosts();
            let order: Vec<usize> = (0..nh).map(|i| (i * 7) % nh).collect();
            let order = if nh.is_multiple_of(7) {
                (0..nh).rev().collect()
            } else {
                order
            };
            topo = topo.with_host_order(&order).unwrap();
        }
        let auto = Auto {
            topo,
            model: Some(CostModel::default()),
            measured_at_start: true,
            fabric: racks.then(|| std::sync::Arc::new(racks_of_32(n / 8))),
            ..Auto::flat(n)
        };
        for (name, args) in shapes(n) {
            let before = common::CountingAlloc::reset_peak();
            let t = Instant::now();
            let (algo, why) = select_algo_on(&none, &args, &auto, 4, None).unwrap();
            let secs = t.elapsed().as_secs_f64();
            let peak = common::CountingAlloc::peak() - before;
            println!(
                "n = {n:5}, {name:22}: {algo:?} ({why}) in {:9.1} ms, heap peak {:8.1} MiB",
                secs * 1e3,
                peak as f64 / (1 << 20) as f64
            );
            rows.push((n, name, secs, peak));
        }
    }
    let ns: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let (lo, hi) = (ns[0], ns[ns.len() - 1]);
    if lo != hi {
        for (_, name, _) in shapes(lo).iter().map(|(s, a)| (0, *s, a)) {
            let at = |n| rows.iter().find(|r| r.0 == n && r.1 == name).unwrap();
            let (a, b) = (at(lo), at(hi));
            let slope = |x: f64, y: f64| (y / x).ln() / (hi as f64 / lo as f64).ln();
            println!(
                "{name:22}: log-log slope of time {:.2}, of memory {:.2}",
                slope(a.2, b.2),
                slope(a.3.max(1) as f64, b.3.max(1) as f64)
            );
        }
    }
}

/// What one rank's schedule costs to build, per algorithm, at the largest
/// n of `CADENCE_SCALE`: the choice builds the schedules of a few hosts'
/// ranks per candidate, so an algorithm whose one rank costs O(n) (a ring's
/// 2(n − 1) phases) makes the choice O(n) a shape.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn one_ranks_schedule_per_algorithm() {
    use cadence_core::schedule;
    let n = *sizes().last().expect("a size");
    let hosts: Vec<usize> = (0..n).map(|r| r / 8).collect();
    let topo = Topology::from_hosts(&hosts);
    for (name, args) in shapes(n) {
        for &a in schedule::algos_for(args.kind) {
            if !schedule::applicable_on(&args, &topo, a) {
                continue;
            }
            let ranks = [0, 7, n / 2];
            let t = Instant::now();
            let phases: usize = ranks
                .iter()
                .map(|&r| schedule::build_on(&args, r, &topo, a).unwrap().phases.len())
                .sum();
            println!(
                "n = {n:5}, {name:22} {:20}: {:8.3} ms a rank, {:6} phases",
                a.name(),
                t.elapsed().as_secs_f64() * 1e3 / ranks.len() as f64,
                phases / ranks.len()
            );
        }
    }
}
