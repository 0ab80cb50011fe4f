use super::*;
use crate::schedule::{build_on, Algo, CollArgs, Phase, Schedule, Span, Step, Topology};
use crate::types::CollKind;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs()
}

fn run(kind: CollKind, algo: Algo, counts: Vec<usize>, model: &Model) -> f64 {
    let args = CollArgs {
        kind,
        root: 0,
        counts,
    };
    let s: Vec<_> = (0..model.topo.nranks())
        .map(|r| build_on(&args, r, &model.topo, algo).unwrap())
        .collect();
    simulate(&s, model, 4).unwrap()
}

#[test]
fn a_channel_with_more_messages_ready_gets_more_of_a_busy_link() {
    // Rank 0 sends rank 1 two messages (A, then B) and rank 2 one (C),
    // all released at once, D bytes each; rank 2 then forwards C to
    // rank 3 over links nobody else uses. A leaves with B ready behind
    // it (weight 2), C alone (1): A at 2/3 of the NIC is done at
    // 1.5 D/r with half of C sent; then B and C split it, and C is done
    // at 2.5 D/r, forwarded by 3.5 D/r. (Equal shares: 3 D/r.)
    let n = 1 << 18;
    let d = (4 * n) as f64;
    let m = Model {
        gamma: 0.0,
        ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e8, 0.0)
    };
    let sched = |rank: usize, phases: Vec<Vec<Step>>| Schedule {
        rank,
        nranks: 4,
        algo: Algo::Direct,
        phases: phases.into_iter().map(|steps| Phase { steps }).collect(),
        scratch_len: 0,
    };
    let send = |peer, off| Step::Send {
        peer,
        src: Span::input(off, n),
    };
    let recv = |peer, off| Step::Recv {
        peer,
        dst: Span::output(off, n),
        reduce_with: None,
    };
    let s = vec![
        sched(0, vec![vec![send(1, 0), send(1, n), send(2, 2 * n)]]),
        sched(1, vec![vec![recv(0, 0), recv(0, n)]]),
        sched(
            2,
            vec![
                vec![recv(0, 0)],
                vec![Step::Send {
                    peer: 3,
                    src: Span::output(0, n),
                }],
            ],
        ),
        sched(3, vec![vec![recv(2, 0)]]),
    ];
    let t = simulate(&s, &m, 4).unwrap();
    let want = 3.5 * d / 1e8;
    assert!(close(t, want, 1e-9), "{t} vs {want}");
}

#[test]
fn one_message_costs_alpha_plus_bytes_over_rate() {
    // A broadcast between two hosts is one message.
    let m = Model {
        gamma: 0.0,
        ..Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6)
    };
    let t = run(CollKind::Broadcast, Algo::BinomialTree, vec![1 << 20], &m);
    let want = 50e-6 + (4 << 20) as f64 / 1.25e8;
    assert!(close(t, want, 1e-9), "{t} vs {want}");
}

#[test]
fn ranks_sharing_cores_share_their_messages_start_up_work() {
    // A ring allgather of 4 bytes a rank on 4 hosts: 3 steps, in each of
    // which every rank starts one message (o = 20 µs, the wire free;
    // the own block's copy adds 1 ns).
    let ring = |shared_cores, loaded_overhead, o| {
        let m = Model {
            tcp_overhead: o,
            shared_cores,
            loaded_overhead,
            ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
        };
        run(CollKind::AllGather, Algo::Ring, vec![1; 4], &m)
    };
    // A core each: a step is one start-up.
    let t = ring(None, 0.0, 20e-6);
    assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
    // Two cores for four ranks: each step's four start-ups take two
    // start-ups' time; one core, four.
    let t = ring(Some(2.0), 0.0, 20e-6);
    assert!(close(t, 3.0 * 40e-6, 1e-4), "{t}");
    let t = ring(Some(1.0), 0.0, 20e-6);
    assert!(close(t, 3.0 * 80e-6, 1e-4), "{t}");
    // Eight cores: no rank waits for one (a core at most per message).
    let t = ring(Some(8.0), 0.0, 20e-6);
    assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
    // A busy machine's floor applies where the transport's own cost is less.
    let t = ring(Some(2.0), 10e-6, 1e-6);
    assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
}

#[test]
fn shared_cores_carry_the_network_stacks_bytes_after_the_start_ups() {
    // The same ring with 10 kB a rank (2 500 floats; wire free): each step's four
    // start-ups (20 µs each) and four messages' bytes at 1 µs a kB of
    // core time share two cores, so a step takes (4 × 20 + 4 × 10) / 2
    // = 60 µs: the sum, not the larger of the two.
    let ring = |stack_cost| {
        let m = Model {
            tcp_overhead: 20e-6,
            shared_cores: Some(2.0),
            stack_cost,
            gamma: 0.0,
            ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
        };
        run(CollKind::AllGather, Algo::Ring, vec![2_500; 4], &m)
    };
    let t = ring(0.0);
    assert!(close(t, 3.0 * 40e-6, 1e-3), "{t}");
    let t = ring(1e-9);
    assert!(close(t, 3.0 * 60e-6, 1e-3), "{t}");
    // Messages on one host do not cross the stacks.
    let m = Model {
        tcp_overhead: 20e-6,
        shm_overhead: 20e-6,
        shared_cores: Some(2.0),
        stack_cost: 1e-9,
        gamma: 0.0,
        shm_rate: 1e15,
        shm_alpha: 0.0,
        mem_rate: f64::INFINITY,
        ..Model::flat(Topology::from_hosts(&[0, 0, 0, 0]), 1e15, 0.0)
    };
    let t = run(CollKind::AllGather, Algo::Ring, vec![2_500; 4], &m);
    assert!(close(t, 3.0 * 40e-6, 1e-2), "{t}");
}

#[test]
fn each_rank_works_on_a_call_before_its_first_message_on_shared_cores() {
    // The 4-rank ring of 4 bytes a rank, 20 µs a message: 3 steps of
    // 40 µs on 2 cores. With 30 µs of work per rank on each call, the
    // four ranks' 120 µs first take 60 µs of the two cores.
    let m = |call_overhead, shared_cores| Model {
        tcp_overhead: 20e-6,
        shared_cores,
        call_overhead,
        ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
    };
    let t = run(
        CollKind::AllGather,
        Algo::Ring,
        vec![1; 4],
        &m(0.0, Some(2.0)),
    );
    assert!(close(t, 3.0 * 40e-6, 1e-4), "{t}");
    let t = run(
        CollKind::AllGather,
        Algo::Ring,
        vec![1; 4],
        &m(30e-6, Some(2.0)),
    );
    assert!(close(t, 60e-6 + 3.0 * 40e-6, 1e-4), "{t}");
    // Calls back to back: each one pays it (3 calls, a rank starting
    // the next as soon as its part of the one before is done).
    let topo = Topology::from_hosts(&[0, 1, 2, 3]);
    let b = |r: usize| {
        let args = CollArgs {
            kind: CollKind::AllGather,
            root: 0,
            counts: vec![1; 4],
        };
        build_on(&args, r, &topo, Algo::Ring).map_err(|e| e.to_string())
    };
    let one = simulate_calls(b, &m(30e-6, Some(2.0)), 4, 1)
        .unwrap()
        .seconds;
    let three = simulate_calls(b, &m(30e-6, Some(2.0)), 4, 3)
        .unwrap()
        .seconds;
    assert!(close(three, 3.0 * one, 0.05), "{one} {three}");
    // A core per rank (a real cluster): the spec's number does not apply.
    let t = run(CollKind::AllGather, Algo::Ring, vec![1; 4], &m(30e-6, None));
    assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
}

#[test]
fn a_shaped_link_passes_its_burst_at_peak_then_its_rate() {
    // 1 ms of a 125 MB/s link's credit (125 kB) passed at 1.5 GB/s: it
    // drains at 1.375 GB/s, so for 125e3 / 1.375e9 s at the peak, then
    // the rest of 4 MiB at the rate.
    let m = Model {
        gamma: 0.0,
        shaper: Some(Shaper {
            burst: 1e-3,
            peak: 1.5e9,
        }),
        ..Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6)
    };
    let t = run(CollKind::Broadcast, Algo::BinomialTree, vec![1 << 20], &m);
    let t1 = 125e3 / (1.5e9 - 1.25e8);
    let want = 50e-6 + t1 + ((4 << 20) as f64 - 1.5e9 * t1) / 1.25e8;
    assert!(close(t, want, 1e-9), "{t} vs {want}");
    // Back to back the root's next message leaves as the last one has
    // left (α overlaps it): the link never idles, so once the credit is
    // spent each call is the bytes at the rate.
    let o = simulate_calls(
        |r| {
            let args = CollArgs {
                kind: CollKind::Broadcast,
                root: 0,
                counts: vec![1 << 20],
            };
            build_on(&args, r, &m.topo, Algo::BinomialTree).map_err(|e| e.to_string())
        },
        &m,
        4,
        40,
    )
    .unwrap();
    let last = o.call_ends[39] - o.call_ends[38];
    let want = (4 << 20) as f64 / 1.25e8;
    assert!(close(last, want, 1e-9), "{last} vs {want}");
    assert!(o.call_ends[0] < t * 1.001 && o.call_ends[0] > t * 0.999);
    // With a barrier before each call (as the bench's samples have),
    // the link idles while it runs (the broadcast's last α, then the
    // barrier's round trip) and the bucket gets some credit back: each
    // call after a barrier beats the rate, by at most a full bucket.
    let barrier = |r| {
        let args = CollArgs {
            kind: CollKind::Barrier,
            root: 0,
            counts: vec![],
        };
        build_on(&args, r, &m.topo, Algo::Dissemination).map_err(|e| e.to_string())
    };
    let bcast = |r| {
        let args = CollArgs {
            kind: CollKind::Broadcast,
            root: 0,
            counts: vec![1 << 20],
        };
        build_on(&args, r, &m.topo, Algo::BinomialTree).map_err(|e| e.to_string())
    };
    let program = [Unit::Gap, Unit::Call(0)].repeat(20);
    let o = simulate_program(|r, _| bcast(r), barrier, &program, &m, 4).unwrap();
    assert_eq!(o.call_ends.len(), 40);
    let timed = o.call_ends[39] - o.call_ends[38];
    assert!(
        timed < want * 0.999 && timed > want - 1e-3,
        "{timed} vs {want}"
    );
    assert!(o.call_ends[38] - o.call_ends[37] >= 50e-6 * 0.999);
}

#[test]
fn a_ring_allgather_on_a_uniform_network_is_its_closed_form() {
    // n hosts, each step every host sends one block to the next.
    // Unsliced (a block under the ring's slice size is one message), a
    // step forwards what the last one delivered: (n - 1) (α + b / rate).
    // Sliced, the look-ahead forwards slice k while later ones arrive:
    // the links never idle, and only the last slice's α shows:
    // (n - 1) b / rate + α.
    for n in [3usize, 5, 8] {
        let hosts: Vec<usize> = (0..n).collect();
        let m = Model {
            gamma: 0.0,
            ..Model::flat(Topology::from_hosts(&hosts), 1.25e8, 50e-6)
        };
        let step = |block: usize| (block * 4) as f64 / 1.25e8;
        let t = run(CollKind::AllGather, Algo::Ring, vec![1000; n], &m);
        let want = (n - 1) as f64 * (50e-6 + step(1000));
        assert!(close(t, want, 1e-9), "n={n} whole: {t} vs {want}");
        let block = 1usize << 18;
        let t = run(CollKind::AllGather, Algo::Ring, vec![block; n], &m);
        let want = (n - 1) as f64 * step(block) + 50e-6;
        assert!(close(t, want, 1e-9), "n={n} sliced: {t} vs {want}");
    }
}

#[test]
fn an_oversubscribed_uplink_is_shared_by_the_flows_crossing_it() {
    // Racks {0, 2} and {1, 3} (interleaved), 1 Gbit/s hosts, 250 Mbit/s
    // uplinks: the ring in rank order crosses each uplink with two
    // flows a step, the found order with one: twice as fast.
    let (fast, slow) = (1.25e8, 3.125e7);
    let racks = |topo: Topology| Model {
        group_of: vec![0, 1, 0, 1],
        group_out: vec![slow; 2],
        group_in: vec![slow; 2],
        gamma: 0.0,
        ..Model::flat(topo, fast, 0.0)
    };
    let rank_order = Topology::from_hosts(&[0, 1, 2, 3]);
    let found = rank_order.clone().with_host_order(&[0, 2, 1, 3]).unwrap();
    let block = 1usize << 20;
    let slow_t = run(
        CollKind::AllGather,
        Algo::Ring,
        vec![block; 4],
        &racks(rank_order),
    );
    let fast_t = run(
        CollKind::AllGather,
        Algo::Ring,
        vec![block; 4],
        &racks(found),
    );
    let want = 3.0 * (block * 4) as f64 / slow;
    assert!(close(fast_t, want, 1e-6), "{fast_t} vs {want}");
    assert!(
        close(slow_t, 2.0 * want, 1e-6),
        "{slow_t} vs {}",
        2.0 * want
    );
}

#[test]
fn schedules_that_do_not_match_up_are_an_error() {
    use crate::schedule::{Phase, Span};
    let m = Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6);
    let sched = |rank: usize, steps: Vec<Step>| Schedule {
        rank,
        nranks: 2,
        algo: Algo::Direct,
        phases: vec![Phase { steps }],
        scratch_len: 0,
    };
    let send = Step::Send {
        peer: 1,
        src: Span::input(0, 8),
    };
    let e = simulate(&[sched(0, vec![send]), sched(1, vec![])], &m, 4).unwrap_err();
    assert!(
        e.contains("from rank 0 to rank 1 has no matching receive"),
        "{e}"
    );
    let e = simulate(&[sched(0, vec![])], &m, 4).unwrap_err();
    assert!(e.contains("1 schedules for 2 ranks"), "{e}");
}

#[test]
fn every_algorithm_finishes_on_mixed_hosts() {
    // No cyclic wait and a positive time for every allreduce algorithm
    // on 3 hosts x 2 ranks: the executor's matching agrees with the
    // generators'.
    let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2]);
    let m = Model::flat(t.clone(), 1.25e8, 50e-6);
    let args = CollArgs {
        kind: CollKind::AllReduce,
        root: 0,
        counts: vec![100_003],
    };
    for &a in crate::schedule::algos_for(CollKind::AllReduce) {
        if !crate::schedule::applicable_on(&args, &t, a) {
            continue;
        }
        let secs = run(CollKind::AllReduce, a, vec![100_003], &m);
        assert!(secs > 0.0 && secs.is_finite(), "{a:?}: {secs}");
    }
}
