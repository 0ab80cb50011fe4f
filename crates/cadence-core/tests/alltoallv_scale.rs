//! What one alltoallv call costs a rank before any byte moves, against n:
//! its counts (this rank's row and column, not the n × n matrix), the
//! checks, the choice and its schedule. Prints the figures
//! (docs/benchmarks.md, "alltoallv at scale"):
//!
//!     cargo test --release -p cadence-core --test alltoallv_scale -- --nocapture

use cadence_core::choice::{select_algo_on, AlgoOverride, Auto, Why};
use cadence_core::schedule::{self, Algo, CollArgs, Topology};
use cadence_core::CollKind;
use std::time::{Duration, Instant};

/// Rank `r`'s counts in a job of `n`: uneven, some empty.
fn own_counts(r: usize, n: usize) -> (Vec<usize>, Vec<usize>) {
    let c = |s: usize, d: usize| (s * 31 + d * 17) % 7;
    let send = (0..n).map(|d| c(r, d)).collect();
    let recv = (0..n).map(|s| c(s, r)).collect();
    (send, recv)
}

/// The hosts of a job of `n` ranks, 8 to a host.
fn topology(n: usize) -> Topology {
    let hosts: Vec<usize> = (0..n).map(|r| r / 8).collect();
    Topology::from_hosts(&hosts)
}

/// One call's preparation on rank `r`: its arguments, their checks, the
/// choice and the schedule. The median of `reps`.
fn prepare(args: &dyn Fn() -> CollArgs, auto: &Auto, r: usize, reps: usize) -> (Duration, Algo) {
    let mut times = Vec::with_capacity(reps);
    let mut algo = Algo::Pairwise;
    for _ in 0..reps {
        let t = Instant::now();
        let a = args();
        let n = auto.topo.nranks();
        schedule::check_args(&a, n).unwrap();
        let (chosen, _) = select_algo_on(&AlgoOverride::default(), &a, auto, 4, None).unwrap();
        let s = schedule::build_on(&a, r, &auto.topo, chosen).unwrap();
        // Pairwise: a phase a peer, less those with nothing either way.
        assert!(
            s.phases.len() < n && s.phases.len() > n / 2,
            "{}",
            s.phases.len()
        );
        times.push(t.elapsed());
        algo = chosen;
    }
    times.sort();
    (times[reps / 2], algo)
}

fn auto_on(n: usize) -> Auto {
    let mut auto = Auto::flat(n);
    auto.topo = topology(n);
    auto
}

#[test]
fn an_alltoallv_call_costs_a_rank_o_of_n() {
    let sizes = [1024, 4096, 8192];
    let mut figures = Vec::new();
    for &n in &sizes {
        let auto = auto_on(n);
        let r = n / 3;
        let (send, recv) = own_counts(r, n);
        let own = || CollArgs::alltoallv(r, &send, &recv);
        let bytes = own().counts.len() * 8;
        let (t, algo) = prepare(&own, &auto, r, 9);
        // Across hosts the placement's choice, whatever the counts.
        assert_eq!(algo, Algo::Pairwise, "n {n}");
        let (_, why) = select_algo_on(&AlgoOverride::default(), &own(), &auto, 4, None).unwrap();
        assert_eq!(why, Why::Placement);
        println!(
            "alltoallv, n = {n:5}: {bytes:7} bytes of counts a call, {:8.1} µs to check, choose \
             and build rank {r}'s schedule ({})",
            t.as_secs_f64() * 1e6,
            algo.name()
        );
        figures.push((n, bytes, t));
    }
    // The matrix form at the smallest size, for comparison.
    let n = sizes[0];
    let auto = auto_on(n);
    let matrix: Vec<usize> = (0..n * n).map(|i| (i / n * 31 + i % n * 17) % 7).collect();
    let whole = || CollArgs {
        kind: CollKind::AllToAll,
        root: 0,
        counts: matrix.clone(),
    };
    let (t, _) = prepare(&whole, &auto, n / 3, 3);
    println!(
        "the n × n matrix, n = {n}: {} bytes a call, {:.1} µs",
        n * n * 8,
        t.as_secs_f64() * 1e6
    );
    // The counts a call carries: 2n + 1, exactly. The time is printed, not
    // asserted (a loaded machine would fail a timed test): its log-log
    // slope and the figure at 8,192 go to docs/benchmarks.md.
    for &(n, bytes, _) in &figures {
        assert_eq!(bytes, (2 * n + 1) * 8);
    }
    let ((n0, _, t0), (n1, _, t1)) = (figures[0], figures[figures.len() - 1]);
    let slope = (t1.as_secs_f64() / t0.as_secs_f64()).ln() / (n1 as f64 / n0 as f64).ln();
    println!("time against n: log-log slope {slope:.2}");
}
