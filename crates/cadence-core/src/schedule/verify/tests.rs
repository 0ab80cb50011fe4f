use super::super::{algos_for, applicable, Phase};
use super::*;
use crate::schedule::applicable_on;
use crate::schedule::ir::{Buf, Schedule, Span, Step};
use crate::schedule::Topology;

const MAX_N: usize = 32;

fn args(kind: CollKind, root: usize, counts: Vec<usize>) -> CollArgs {
    CollArgs { kind, root, counts }
}

/// The count patterns of the matrix for a collective on n ranks: 0, 1, 7,
/// n-1, 2n+3 everywhere, and for v-collectives irregular counts with
/// zeros.
fn count_patterns(kind: CollKind, n: usize) -> Vec<Vec<usize>> {
    let scalars = [0, 1, 7, n - 1, 2 * n + 3];
    let mut out: Vec<Vec<usize>> = match kind {
        CollKind::AllReduce | CollKind::Reduce | CollKind::Broadcast => {
            scalars.iter().map(|&c| vec![c]).collect()
        }
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::Gather | CollKind::Scatter => {
            let mut v: Vec<Vec<usize>> = scalars.iter().map(|&c| vec![c; n]).collect();
            v.push((0..n).map(|r| (r * 5 + 3) % 4).collect());
            v.push((0..n).map(|r| if r == n - 1 { 9 } else { 0 }).collect());
            v.push((0..n).map(|r| if r % 3 == 1 { 0 } else { r + 2 }).collect());
            v
        }
        CollKind::AllToAll => {
            let mut v: Vec<Vec<usize>> = scalars.iter().map(|&c| vec![c; n * n]).collect();
            v.push(
                (0..n * n)
                    .map(|i| (i / n * 3 + i % n * 5 + 1) % 4)
                    .collect(),
            );
            v.push(
                (0..n * n)
                    .map(|i| if i / n == i % n { 3 } else { 0 })
                    .collect(),
            );
            v
        }
        CollKind::Barrier => vec![vec![]],
        CollKind::Send | CollKind::Recv => vec![vec![0], vec![1], vec![7]],
    };
    out.dedup();
    out
}

fn roots(kind: CollKind, n: usize) -> Vec<usize> {
    let rooted = matches!(
        kind,
        CollKind::Reduce | CollKind::Broadcast | CollKind::Gather | CollKind::Scatter
    );
    match (rooted, n) {
        (false, _) => vec![0],
        (true, 1..=8) => (0..n).collect(),
        (true, _) => vec![0, 1, n / 2, n - 1],
    }
}

/// Every applicable algorithm × nranks 1..=MAX_N × count patterns × roots.
fn verify_matrix(kind: CollKind) {
    let mut runs = 0;
    for n in 1..=MAX_N {
        for counts in count_patterns(kind, n) {
            for root in roots(kind, n) {
                let a = args(kind, root, counts.clone());
                for &algo in algos_for(kind) {
                    assert!(applicable(&a, n, algo));
                    if let Err(e) = verify(&a, n, algo) {
                        panic!("{e}");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 0);
}

/// Worlds beyond the matrix, up to the verifier's limit, with fewer
/// counts and roots: folds, uneven chunks and wrap-around at scale.
fn verify_large_world(n: usize) {
    for kind in CollKind::ALL {
        if matches!(kind, CollKind::Send | CollKind::Recv) {
            continue;
        }
        let patterns = count_patterns(kind, n);
        // 2n+3 everywhere and the first irregular pattern; for alltoall
        // (n² blocks) only the irregular one.
        let chosen = match kind {
            CollKind::Barrier => &patterns[..],
            CollKind::AllToAll => &patterns[5..6],
            _ => &patterns[4..patterns.len().min(6)],
        };
        // The first and last root (just 0 when unrooted).
        let mut ends = roots(kind, n);
        if ends.len() > 2 {
            ends.drain(1..ends.len() - 1);
        }
        for counts in chosen {
            for &root in &ends {
                let a = args(kind, root, counts.clone());
                for &algo in algos_for(kind) {
                    if let Err(e) = verify(&a, n, algo) {
                        panic!("{e}");
                    }
                }
            }
        }
    }
}

// The matrix covers 1..=MAX_N (32) in full; these go beyond it.
#[test]
fn large_worlds_33_to_40() {
    for n in [33, 37, 40] {
        verify_large_world(n);
    }
}

#[test]
fn large_worlds_48_and_63() {
    verify_large_world(48);
    verify_large_world(63);
}

#[test]
fn large_world_64() {
    verify_large_world(64);
}

/// Host layouts: contiguous and interleaved (rank r on host r mod H, so
/// the ring order differs from rank order), uniform and not.
fn topologies() -> Vec<Topology> {
    let mut out = Vec::new();
    for (hosts, per) in [
        (2, 1),
        (2, 2),
        (3, 2),
        (2, 3),
        (4, 2),
        (3, 3),
        (4, 4),
        (5, 3),
        (8, 4),
    ] {
        let n = hosts * per;
        out.push(Topology::from_hosts(
            &(0..n).map(|r| r / per).collect::<Vec<_>>(),
        ));
        out.push(Topology::from_hosts(
            &(0..n).map(|r| r % hosts).collect::<Vec<_>>(),
        ));
    }
    out.push(Topology::from_hosts(&[0, 1, 1, 1]));
    out.push(Topology::from_hosts(&[0, 0, 1, 2, 2, 2, 0]));
    out
}

#[test]
fn every_algorithm_on_multi_host_topologies() {
    let mut runs = 0;
    for topo in topologies() {
        let n = topo.nranks();
        for kind in CollKind::ALL {
            if matches!(kind, CollKind::Send | CollKind::Recv) {
                continue;
            }
            let patterns = count_patterns(kind, n);
            let chosen = match kind {
                CollKind::AllToAll => &patterns[5..6],
                CollKind::Barrier => &patterns[..],
                _ => &patterns[..],
            };
            for counts in chosen {
                let a = args(kind, n - 1, counts.clone());
                for &algo in algos_for(kind) {
                    let ok = applicable_on(&a, &topo, algo);
                    let uniform = topo.uniform_ranks_per_host().is_some();
                    assert_eq!(ok, uniform || algo != Algo::Hierarchical);
                    if !ok {
                        continue;
                    }
                    if let Err(e) = verify_on(&a, &topo, algo) {
                        panic!("{e} on hosts {topo:?}");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 100);
}

/// A deterministic shuffle (splitmix64), for the random ring orders.
fn shuffled(mut v: Vec<usize>, seed: u64) -> Vec<usize> {
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        v.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    v
}

#[test]
fn every_algorithm_under_random_ring_orders() {
    // A topology file can give rings any order: a host order from the
    // path finder, or (the generators must not care) any permutation of
    // the ranks. Large counts too, so ring steps are sliced across hosts.
    let mut runs = 0;
    for (t, topo) in topologies().into_iter().enumerate() {
        let n = topo.nranks();
        let hosts = shuffled((0..topo.nhosts()).collect(), t as u64);
        let orders = [
            topo.clone().with_host_order(&hosts).unwrap(),
            topo.clone()
                .with_order(shuffled((0..n).collect(), 100 + t as u64))
                .unwrap(),
        ];
        for topo in orders {
            for kind in CollKind::ALL {
                if matches!(kind, CollKind::Send | CollKind::Recv) {
                    continue;
                }
                let patterns = count_patterns(kind, n);
                let big = 2 * 16 * 1024 * n + 5;
                let extra = match kind {
                    CollKind::AllReduce | CollKind::Broadcast => vec![vec![big]],
                    CollKind::AllGather | CollKind::ReduceScatter => vec![vec![big / n; n]],
                    _ => vec![],
                };
                let extra = if n <= 4 { extra } else { vec![] };
                let chosen: Vec<Vec<usize>> = match kind {
                    CollKind::AllToAll => patterns[5..6].to_vec(),
                    _ => patterns
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| [0, 2, 4, 5, 6, 7].contains(i))
                        .map(|(_, c)| c.clone())
                        .chain(extra)
                        .collect(),
                };
                for counts in chosen {
                    let a = args(kind, n / 2, counts);
                    for &algo in algos_for(kind) {
                        if !applicable_on(&a, &topo, algo) {
                            continue;
                        }
                        if let Err(e) = verify_on(&a, &topo, algo) {
                            panic!("{e} on hosts {topo:?}");
                        }
                        runs += 1;
                    }
                }
            }
        }
    }
    assert!(runs > 300, "{runs}");
}

#[test]
fn sliced_ring_steps() {
    // Chunks of two and three slices (and a ragged one), flat and across
    // hosts: the slices of a message line up on both ends.
    let slice = 16 * 1024;
    for topo in [
        Topology::single_host(3),
        Topology::from_hosts(&[0, 1, 0, 1]),
        Topology::from_hosts(&[0, 0, 1, 1, 2, 2]),
    ] {
        let n = topo.nranks();
        for count in [2 * slice * n + 5, 3 * slice * n - 1] {
            for (kind, counts) in [
                (CollKind::AllReduce, vec![count]),
                (CollKind::AllGather, vec![count / n; n]),
                (CollKind::ReduceScatter, vec![count / n; n]),
            ] {
                let a = args(kind, 0, counts);
                for &algo in algos_for(kind) {
                    if matches!(algo, Algo::Ring | Algo::Hierarchical)
                        && applicable_on(&a, &topo, algo)
                    {
                        if let Err(e) = verify_on(&a, &topo, algo) {
                            panic!("{e} on hosts {topo:?}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rings_cross_each_host_boundary_once() {
    // Ranks interleaved over 2 hosts: a rank-order ring would cross
    // between hosts at every hop.
    let topo = Topology::from_hosts(&[0, 1, 0, 1, 0, 1]);
    let a = args(CollKind::AllReduce, 0, vec![60]);
    let mut crossing = 0;
    for r in 0..6 {
        let s = build_on(&a, r, &topo, Algo::Ring).unwrap();
        let peers: std::collections::BTreeSet<usize> = s
            .phases
            .iter()
            .flat_map(|p| &p.steps)
            .filter_map(|st| match st {
                Step::Send { peer, .. } => Some(*peer),
                _ => None,
            })
            .collect();
        assert_eq!(peers.len(), 1, "rank {r} sends to one next rank");
        let next = *peers.iter().next().unwrap();
        crossing += usize::from(topo.host_of(next) != topo.host_of(r));
    }
    assert_eq!(crossing, 2);
}

#[test]
fn hierarchical_sends_only_same_local_rank_across_hosts() {
    let topo = Topology::from_hosts(&[0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    // Small: the columns exchange whole chunks (1/3 of the buffer) by
    // recursive doubling; large: ring sub-chunks, 1/(3·4) of it.
    for (count, most) in [(1000, 1000 / 3 + 1), (120_000, 120_000 / 12 + 1)] {
        let a = args(CollKind::AllReduce, 0, vec![count]);
        for r in 0..12 {
            let s = build_on(&a, r, &topo, Algo::Hierarchical).unwrap();
            for st in s.phases.iter().flat_map(|p| &p.steps) {
                if let Step::Send { peer, src } = st {
                    if topo.host_of(*peer) != topo.host_of(r) {
                        assert_eq!(topo.local_rank(*peer), topo.local_rank(r));
                        assert!(src.len <= most, "{count}: {src:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn pipelined_hierarchical_allreduce() {
    // From 2 Mi elements the segments' stages are laid over each other:
    // 2 and 3 segments (odd lengths), hosts contiguous and interleaved.
    let seg = 1 << 20;
    for topo in [
        Topology::from_hosts(&[0, 0, 1, 1]),
        Topology::from_hosts(&[0, 1, 2, 0, 1, 2]),
    ] {
        let (h, l) = (topo.nhosts(), 2);
        for k in [2, 3] {
            let count = k * seg + 5;
            let a = args(CollKind::AllReduce, 0, vec![count]);
            if let Err(e) = verify_on(&a, &topo, Algo::Hierarchical) {
                panic!("{e} on hosts {topo:?}, {k} segments");
            }
            // One stage 2 after another, the local stages beside them.
            let s = build_on(&a, 0, &topo, Algo::Hierarchical).unwrap();
            assert_eq!(s.phases.len(), k * 2 * (h - 1) + 2 * (l - 1));
        }
    }
}

#[test]
fn hierarchical_gathers_cross_hosts_once_per_block() {
    // 3 hosts × 2 ranks, interleaved: a host's NIC carries each block of
    // the other hosts' ranks once (allgather: in, reduce_scatter: out, as
    // partial sums), and only between ranks with the same local rank.
    let topo = Topology::from_hosts(&[0, 1, 2, 0, 1, 2]);
    let counts: Vec<usize> = (0..6).map(|r| 100 + r).collect();
    for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
        let a = args(kind, 0, counts.clone());
        let mut nic = [0usize; 3];
        for r in 0..6 {
            let s = build_on(&a, r, &topo, Algo::Hierarchical).unwrap();
            for st in s.phases.iter().flat_map(|p| &p.steps) {
                if let Step::Send { peer, src } = st {
                    if topo.host_of(*peer) != topo.host_of(r) {
                        assert_eq!(topo.local_rank(*peer), topo.local_rank(r), "{kind}");
                        let h = if kind == CollKind::AllGather {
                            *peer
                        } else {
                            r
                        };
                        nic[topo.host_of(h)] += src.len;
                    }
                }
            }
        }
        for (h, carried) in nic.iter().enumerate() {
            let own: usize = topo.ranks_on(h).iter().map(|&r| counts[r]).sum();
            let others = counts.iter().sum::<usize>() - own;
            assert_eq!(*carried, others, "{kind} host {h}");
        }
    }
}

#[test]
fn allreduce_matrix() {
    verify_matrix(CollKind::AllReduce);
}

#[test]
fn reduce_matrix() {
    verify_matrix(CollKind::Reduce);
}

#[test]
fn broadcast_matrix() {
    verify_matrix(CollKind::Broadcast);
}

#[test]
fn allgather_matrix() {
    verify_matrix(CollKind::AllGather);
}

#[test]
fn reduce_scatter_matrix() {
    verify_matrix(CollKind::ReduceScatter);
}

#[test]
fn alltoall_matrix() {
    verify_matrix(CollKind::AllToAll);
}

#[test]
fn gather_matrix() {
    verify_matrix(CollKind::Gather);
}

#[test]
fn scatter_matrix() {
    verify_matrix(CollKind::Scatter);
}

#[test]
fn barrier_matrix() {
    verify_matrix(CollKind::Barrier);
}

#[test]
fn send_recv_pairs() {
    for n in 2..=6 {
        for count in [0, 1, 7] {
            for src in 0..n {
                for dst in (0..n).filter(|&d| d != src) {
                    verify_p2p(count, src, dst, n).unwrap();
                }
            }
            for root in 0..n {
                for kind in [CollKind::Send, CollKind::Recv] {
                    verify(&args(kind, root, vec![count]), n, Algo::P2p).unwrap();
                }
            }
        }
    }
}

// ---- The verifier catches bugs. ----

fn schedules(a: &CollArgs, n: usize, algo: Algo) -> Vec<Schedule> {
    (0..n).map(|r| build(a, r, n, algo).unwrap()).collect()
}

/// Where the `nth` step matching `pred` is in rank r's schedule.
fn find(s: &Schedule, nth: usize, pred: impl Fn(&Step) -> bool) -> (usize, usize) {
    s.phases
        .iter()
        .enumerate()
        .flat_map(|(q, p)| p.steps.iter().enumerate().map(move |(i, st)| (q, i, st)))
        .filter(|(_, _, st)| pred(st))
        .map(|(q, i, _)| (q, i))
        .nth(nth)
        .expect("no such step")
}

fn is_recv(s: &Step) -> bool {
    matches!(s, Step::Recv { .. })
}

fn is_send(s: &Step) -> bool {
    matches!(s, Step::Send { .. })
}

#[test]
fn catches_a_dropped_recv() {
    let a = args(CollKind::AllReduce, 0, vec![8]);
    let mut s = schedules(&a, 4, Algo::Ring);
    let (q, i) = find(&s[2], 1, is_recv);
    s[2].phases[q].steps.remove(i);
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(
            e.fault,
            Fault::Unmatched { from: 1, to: 2, .. } | Fault::Deadlock { .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("rank 1 phase"), "{e}");
}

#[test]
fn catches_a_deadlock() {
    // Both ranks send in phase 0 and receive in phase 1: each send waits
    // for the other rank to reach its receive, which waits for the send.
    let a = args(CollKind::AllGather, 0, vec![1, 1]);
    let s: Vec<Schedule> = (0..2)
        .map(|r| Schedule {
            rank: r,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![
                Phase {
                    steps: vec![
                        Step::Copy {
                            src: Span::input(0, 1),
                            dst: Span::output(r, 1),
                        },
                        Step::Send {
                            peer: 1 - r,
                            src: Span::input(0, 1),
                        },
                    ],
                },
                Phase {
                    steps: vec![Step::Recv {
                        peer: 1 - r,
                        dst: Span::output(1 - r, 1),
                        reduce_with: None,
                    }],
                },
            ],
            scratch_len: 0,
        })
        .collect();
    let e = verify_schedules(&a, &s).unwrap_err();
    let Fault::Deadlock { waits } = &e.fault else {
        panic!("{e}")
    };
    assert_eq!(waits.len(), 2);
    assert_eq!(
        waits[0],
        Wait {
            at: At {
                rank: 0,
                phase: 0,
                step: 1
            },
            peer: 1,
            peer_phase: 1,
            peer_now: Some(0)
        }
    );
    assert!(
        e.to_string()
            .contains("rank 0 phase 0 step 1 waits for rank 1 to reach phase 1"),
        "{e}"
    );
}

fn is_fold(s: &Step) -> bool {
    matches!(s, Step::Fold { .. })
}

#[test]
fn applies_folds_after_the_receives_of_their_phase() {
    // Direct allreduce folds n-2 contributions per owner; without the
    // last of them rank 1's block misses a rank.
    let a = args(CollKind::AllReduce, 0, vec![10]);
    let mut s = schedules(&a, 4, Algo::Direct);
    assert!(verify_schedules(&a, &s).is_ok());
    let (q, i) = find(&s[1], 1, is_fold);
    s[1].phases[q].steps.remove(i);
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(matches!(e.fault, Fault::WrongResult { .. }), "{e}");
}

#[test]
fn catches_a_fold_that_no_receive_lands() {
    let a = args(CollKind::AllReduce, 0, vec![10]);
    let mut s = schedules(&a, 4, Algo::Direct);
    let (q, i) = find(&s[2], 0, is_fold);
    if let Step::Fold { src, .. } = &mut s[2].phases[q].steps[i] {
        src.off += 1;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        e.to_string()
            .contains("no Recv of its phase lands exactly that span"),
        "{e}"
    );
}

#[test]
fn catches_a_fold_into_what_a_receive_writes_meanwhile() {
    // Rank 0's first fold (from the first slot) into the second slot,
    // which a receive of the same phase lands.
    let a = args(CollKind::AllReduce, 0, vec![12]);
    let mut s = schedules(&a, 4, Algo::Direct);
    let (q, i) = find(&s[0], 0, is_fold);
    if let Step::Fold { src, dst } = &mut s[0].phases[q].steps[i] {
        *dst = Span::scratch(src.off + src.len, src.len);
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::Overlap { at, .. } if at == At { rank: 0, phase: q, step: i }),
        "{e}"
    );
    assert!(e.to_string().contains("which runs meanwhile"), "{e}");
}

#[test]
fn catches_a_double_count() {
    let a = args(CollKind::AllReduce, 0, vec![6]);
    let mut s = schedules(&a, 3, Algo::Ring);
    s[0].phases.push(Phase {
        steps: vec![Step::Reduce {
            src: Span::input(0, 6),
            dst: Span::output(0, 6),
        }],
    });
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(matches!(e.fault, Fault::DoubleCount { both: 1, .. }), "{e}");
    assert_eq!(e.layout, Some(Layout::Distinct));
}

#[test]
fn catches_a_write_to_input() {
    let a = args(CollKind::AllReduce, 0, vec![8]);
    let mut s = schedules(&a, 4, Algo::Ring);
    let (q, i) = find(&s[1], 0, is_recv);
    if let Step::Recv { dst, .. } = &mut s[1].phases[q].steps[i] {
        dst.buf = Buf::Input;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::WritesInput { at } if at == At { rank: 1, phase: q, step: i }),
        "{e}"
    );
}

#[test]
fn catches_a_non_root_writing_its_reduce_output() {
    // In an in-place reduce a non-root's Output is the user's tensor.
    let a = args(CollKind::Reduce, 0, vec![4]);
    let mut s = schedules(&a, 2, Algo::BinomialTree);
    s[1].phases.push(Phase {
        steps: vec![Step::Copy {
            src: Span::input(0, 4),
            dst: Span::output(0, 4),
        }],
    });
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::WritesNonRootOutput { at } if at.rank == 1),
        "{e}"
    );
}

#[test]
fn catches_mismatched_lengths() {
    let a = args(CollKind::AllGather, 0, vec![3; 4]);
    let mut s = schedules(&a, 4, Algo::Ring);
    let (q, i) = find(&s[3], 2, is_send);
    if let Step::Send { src, .. } = &mut s[3].phases[q].steps[i] {
        src.len -= 1;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::TransferLenMismatch { send_len: 2, recv_len: 3, send, .. } if send.rank == 3),
        "{e}"
    );
}

/// A two-rank allreduce that is right out of place and wrong in place: it
/// overwrites Output with the peer's data, then reads Input.
#[test]
fn catches_an_in_place_hazard() {
    let a = args(CollKind::AllReduce, 0, vec![4]);
    let whole = |buf| Span::new(buf, 0, 4);
    let s: Vec<Schedule> = (0..2)
        .map(|r| Schedule {
            rank: r,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![
                Phase {
                    steps: vec![
                        Step::Send {
                            peer: 1 - r,
                            src: whole(Buf::Input),
                        },
                        Step::Recv {
                            peer: 1 - r,
                            dst: whole(Buf::Scratch),
                            reduce_with: None,
                        },
                    ],
                },
                Phase {
                    steps: vec![Step::Copy {
                        src: whole(Buf::Scratch),
                        dst: whole(Buf::Output),
                    }],
                },
                Phase {
                    steps: vec![Step::Reduce {
                        src: whole(Buf::Input),
                        dst: whole(Buf::Scratch),
                    }],
                },
                Phase {
                    steps: vec![Step::Copy {
                        src: whole(Buf::Scratch),
                        dst: whole(Buf::Output),
                    }],
                },
            ],
            scratch_len: 4,
        })
        .collect();
    let e = verify_schedules(&a, &s).unwrap_err();
    assert_eq!(e.layout, Some(Layout::InPlace), "{e}");
    assert!(matches!(e.fault, Fault::DoubleCount { .. }), "{e}");
}

/// Receiving into Output while sending Input in the same phase is fine
/// out of place and a race in place.
#[test]
fn catches_an_in_place_race() {
    let a = args(CollKind::AllReduce, 0, vec![4]);
    let whole = |buf| Span::new(buf, 0, 4);
    let s: Vec<Schedule> = (0..2)
        .map(|r| Schedule {
            rank: r,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![Phase {
                steps: vec![
                    Step::Send {
                        peer: 1 - r,
                        src: whole(Buf::Input),
                    },
                    Step::Recv {
                        peer: 1 - r,
                        dst: whole(Buf::Output),
                        reduce_with: Some(whole(Buf::Input)),
                    },
                ],
            }],
            scratch_len: 0,
        })
        .collect();
    let e = verify_schedules(&a, &s).unwrap_err();
    assert_eq!(e.layout, Some(Layout::InPlace), "{e}");
    assert!(matches!(e.fault, Fault::Overlap { .. }), "{e}");
}

#[test]
fn catches_different_operand_orders() {
    // Each rank receives both peers' inputs and reduces them into its own
    // in the order r+1, r+2: ((0+1)+2), ((1+2)+0), ((2+0)+1).
    let a = args(CollKind::AllReduce, 0, vec![1]);
    let one = |buf, off| Span::new(buf, off, 1);
    let s: Vec<Schedule> = (0..3)
        .map(|r| {
            let (p1, p2) = ((r + 1) % 3, (r + 2) % 3);
            Schedule {
                rank: r,
                nranks: 3,
                algo: Algo::Direct,
                phases: vec![
                    Phase {
                        steps: vec![
                            Step::Send {
                                peer: p1,
                                src: one(Buf::Input, 0),
                            },
                            Step::Send {
                                peer: p2,
                                src: one(Buf::Input, 0),
                            },
                            Step::Recv {
                                peer: p1,
                                dst: one(Buf::Output, 0),
                                reduce_with: Some(one(Buf::Input, 0)),
                            },
                            Step::Recv {
                                peer: p2,
                                dst: one(Buf::Scratch, 0),
                                reduce_with: None,
                            },
                        ],
                    },
                    Phase {
                        steps: vec![Step::Reduce {
                            src: one(Buf::Scratch, 0),
                            dst: one(Buf::Output, 0),
                        }],
                    },
                ],
                scratch_len: 1,
            }
        })
        .collect();
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::NotBitwiseIdentical { index: 0, .. }),
        "{e}"
    );
}

#[test]
fn catches_an_incomplete_barrier() {
    // One ring round: everybody hears only from the rank below.
    let a = args(CollKind::Barrier, 0, vec![]);
    let nothing = Span::output(0, 0);
    let s: Vec<Schedule> = (0..4)
        .map(|r| Schedule {
            rank: r,
            nranks: 4,
            algo: Algo::Dissemination,
            phases: vec![Phase {
                steps: vec![
                    Step::Send {
                        peer: (r + 1) % 4,
                        src: nothing,
                    },
                    Step::Recv {
                        peer: (r + 3) % 4,
                        dst: nothing,
                        reduce_with: None,
                    },
                ],
            }],
            scratch_len: 0,
        })
        .collect();
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(
            e.fault,
            Fault::BarrierIncomplete {
                rank: 0,
                missing: 0b0110
            }
        ),
        "{e}"
    );
}

#[test]
fn catches_misplaced_data() {
    let a = args(CollKind::AllGather, 0, vec![2; 3]);
    let mut s = schedules(&a, 3, Algo::Direct);
    let steps = &mut s[0].phases[0].steps;
    let dsts: Vec<usize> = (0..steps.len()).filter(|&i| is_recv(&steps[i])).collect();
    let dst_of = |st: &Step| match st {
        Step::Recv { dst, .. } => *dst,
        _ => unreachable!(),
    };
    let (d0, d1) = (dst_of(&steps[dsts[0]]), dst_of(&steps[dsts[1]]));
    for (i, d) in [(dsts[0], d1), (dsts[1], d0)] {
        if let Step::Recv { dst, .. } = &mut steps[i] {
            *dst = d;
        }
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(matches!(e.fault, Fault::WrongResult { rank: 0, .. }), "{e}");
}

#[test]
fn catches_overlapping_recvs_bounds_and_bad_peers() {
    let a = args(CollKind::AllGather, 0, vec![2; 3]);
    let base = schedules(&a, 3, Algo::Direct);
    let recvs: Vec<usize> = (0..base[0].phases[0].steps.len())
        .filter(|&i| is_recv(&base[0].phases[0].steps[i]))
        .collect();

    let mut s = base.clone();
    let first = s[0].phases[0].steps[recvs[0]].clone();
    if let (Step::Recv { dst: d0, .. }, Step::Recv { dst, .. }) =
        (first, &mut s[0].phases[0].steps[recvs[1]])
    {
        *dst = d0;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::Overlap { at, .. } if at.rank == 0),
        "{e}"
    );

    let mut s = base.clone();
    if let Step::Recv { dst, .. } = &mut s[0].phases[0].steps[recvs[0]] {
        dst.off = 5;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(
        matches!(e.fault, Fault::OutOfBounds { buf_len: 6, .. }),
        "{e}"
    );

    let mut s = base;
    if let Step::Recv { peer, .. } = &mut s[0].phases[0].steps[recvs[0]] {
        *peer = 0;
    }
    let e = verify_schedules(&a, &s).unwrap_err();
    assert!(matches!(e.fault, Fault::BadPeer { peer: 0, .. }), "{e}");
}

#[test]
fn refuses_what_it_cannot_cover() {
    let a = args(CollKind::AllReduce, 0, vec![1]);
    let e = verify(&a, 65, Algo::Ring).unwrap_err();
    assert!(matches!(e.fault, Fault::TooManyRanks { nranks: 65 }));
    let e = verify(&a, 4, Algo::Pairwise).unwrap_err();
    assert!(matches!(
        e.fault,
        Fault::BadArgs(ScheduleError::NotApplicable { .. })
    ));
    let e = verify(&args(CollKind::Send, 0, vec![1]), 1, Algo::P2p).unwrap_err();
    assert!(matches!(
        e.fault,
        Fault::Build {
            error: ScheduleError::SelfPeer { .. },
            ..
        }
    ));
}
