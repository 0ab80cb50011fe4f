//! Recorded runs: what they keep of a clean run, and what a rank that
//! stops calling or a hung link leaves behind.

use super::*;
use crate::schedule::{algos_for, applicable_on, build_on, Algo, CollArgs, Topology};
use crate::types::CollKind;

const CALLS: usize = 3;

/// 12 ranks on 3 hosts of 4, and on one host.
fn models() -> [Model; 2] {
    let hosts: Vec<usize> = (0..12).map(|r| r / 4).collect();
    [
        Model::flat(Topology::from_hosts(&hosts), 1.25e9, 20e-6),
        Model::flat(Topology::single_host(12), 1.25e9, 20e-6),
    ]
}

fn args(count: usize) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        root: 0,
        counts: vec![count],
    }
}

fn recorded(m: &Model, algo: Algo, count: usize, fault: Fault) -> Recorded {
    let a = args(count);
    let build = |r| build_on(&a, r, &m.topo, algo).map_err(|e| e.to_string());
    simulate_recorded(build, m, 4, CALLS, fault).unwrap()
}

#[test]
fn a_clean_run_records_every_transfer_done_and_ends_as_the_plain_one() {
    for m in models() {
        for &algo in algos_for(CollKind::AllReduce) {
            if !applicable_on(&args(50_000), &m.topo, algo) {
                continue;
            }
            let a = args(50_000);
            let build = |r| build_on(&a, r, &m.topo, algo).map_err(|e| e.to_string());
            let plain = simulate_calls(build, &m, 4, CALLS).unwrap();
            let rec = recorded(&m, algo, 50_000, Fault::None);
            assert_eq!(rec.seconds, plain.seconds, "{algo:?}");
            assert_eq!(rec.messages, plain.messages, "{algo:?}");
            assert!(rec.stalled_at.is_none() && rec.unfinished.is_empty());
            for (r, rank) in rec.ranks.iter().enumerate() {
                assert!(rank.finished());
                let mut last_end = 0.0;
                for (c, span) in rank.calls.iter().enumerate() {
                    let (e, f) = (span.entered.unwrap(), span.finished.unwrap());
                    assert!(
                        last_end <= e && e <= f,
                        "{algo:?} rank {r} call {c}: {span:?}"
                    );
                    last_end = f;
                    for t in rank.transfers(c) {
                        let done = t.done_at.unwrap();
                        assert_eq!(t.state, XferState::Done);
                        assert!(e <= done && done <= f, "{algo:?} rank {r}: {t:?} {span:?}");
                    }
                }
                assert!(rank.transfers(0).count() > 0);
            }
        }
    }
}

#[test]
fn a_rank_that_stops_calling_leaves_the_others_stalled_in_that_call() {
    for m in models() {
        let rec = recorded(&m, Algo::Ring, 50_000, Fault::Stop { rank: 5, call: 1 });
        let stalled = rec.stalled_at.expect("a stall");
        assert_eq!(
            rec.unfinished,
            (0..12).filter(|&r| r != 5).collect::<Vec<_>>()
        );
        let stopped = &rec.ranks[5];
        assert!(stopped.finished());
        assert!(stopped.calls[0].finished.is_some());
        assert!(stopped.calls[1..].iter().all(|s| s.entered.is_none()));
        assert_eq!(stopped.transfers(1).count(), 0);
        for r in rec.unfinished {
            let calls = &rec.ranks[r].calls;
            assert!(calls[0].finished.unwrap() <= stalled);
            assert!(calls[1].entered.is_some() && calls[1].finished.is_none());
            assert_eq!(calls[2], CallSpan::default());
            let waiting = rec.ranks[r]
                .transfers(1)
                .filter(|t| t.state != XferState::Done)
                .count();
            assert!(waiting > 0, "rank {r} waits on nothing");
        }
        // The ring's neighbours of rank 5 wait on it directly.
        let from_5 = |r: usize| {
            rec.ranks[r]
                .transfers(1)
                .any(|t| t.peer == 5 && !t.send && t.state == XferState::Pending)
        };
        assert!(from_5(6), "rank 6's receive from 5 is not pending");
    }
}

#[test]
fn a_hung_link_leaves_its_send_and_receive_pending() {
    for m in models() {
        // Rank 3's first send of call 1, and the link it takes.
        let clean = recorded(&m, Algo::Ring, 50_000, Fault::None);
        let dst = clean.ranks[3].transfers(1).find(|t| t.send).unwrap().peer;
        let fault = Fault::HungLink {
            src: 3,
            dst,
            call: 1,
        };
        let rec = recorded(&m, Algo::Ring, 50_000, fault);
        assert!(rec.stalled_at.is_some() && !rec.unfinished.is_empty());
        let first = |r: usize, peer: usize, send: bool| {
            rec.ranks[r]
                .transfers(1)
                .find(|t| t.peer == peer && t.send == send)
                .unwrap()
        };
        assert_eq!(first(3, dst, true).state, XferState::Pending);
        assert_eq!(first(dst, 3, false).state, XferState::Pending);
        assert!(first(3, dst, true).done_at.is_none());
        // Call 0 went through on every rank.
        assert!(rec.ranks.iter().all(|k| k.calls[0].finished.is_some()));
        // Later transfers of the hung rank's call are held or pending, never
        // done past what the stall allowed.
        let held = rec.ranks[dst]
            .transfers(1)
            .filter(|t| t.state == XferState::Held)
            .count();
        assert!(held > 0, "rank {dst} has no transfer held");
    }
}

#[test]
fn a_late_rank_and_a_slow_nic_only_slow_the_run() {
    let m = &models()[0];
    let clean = recorded(m, Algo::Ring, 50_000, Fault::None);
    let late = recorded(
        m,
        Algo::Ring,
        50_000,
        Fault::SlowRank {
            rank: 2,
            delay_s: 0.01,
        },
    );
    assert!(late.stalled_at.is_none());
    assert!(late.seconds > clean.seconds + 3.0 * 0.01 * 0.99);
    let span = late.ranks[2].calls[1];
    let other = late.ranks[7].calls[1];
    assert!(span.entered.unwrap() > other.entered.unwrap() + 0.009);
    let slow = recorded(
        m,
        Algo::Ring,
        1 << 20,
        Fault::SlowNic {
            host: 1,
            factor: 0.1,
        },
    );
    let fast = recorded(m, Algo::Ring, 1 << 20, Fault::None);
    assert!(slow.stalled_at.is_none() && slow.seconds > 3.0 * fast.seconds);
}

#[test]
fn a_fault_naming_what_does_not_exist_is_an_error() {
    let m = &models()[0];
    let bad = [
        (Fault::Stop { rank: 12, call: 0 }, "rank 12"),
        (Fault::Stop { rank: 0, call: 3 }, "call 3"),
        (
            Fault::HungLink {
                src: 1,
                dst: 1,
                call: 0,
            },
            "itself",
        ),
        (
            Fault::SlowNic {
                host: 3,
                factor: 0.5,
            },
            "host 3",
        ),
    ];
    for (fault, says) in bad {
        let a = args(1000);
        let build = |r| build_on(&a, r, &m.topo, Algo::Ring).map_err(|e| e.to_string());
        let e = simulate_recorded(build, m, 4, CALLS, fault).err().unwrap();
        assert!(e.contains(says), "{fault:?}: {e}");
    }
}

#[test]
fn a_receive_is_timed_from_its_first_bytes_to_its_last() {
    // Two hosts of one rank: a ring's messages of 8 MiB are over the eager
    // limit, so each waits for its receive and crosses the NIC alone.
    let hosts = [0, 1];
    let m = Model::flat(Topology::from_hosts(&hosts), 1.25e9, 20e-6);
    let a = args(4 << 20);
    let build = |r| build_on(&a, r, &m.topo, Algo::Ring).map_err(|e| e.to_string());
    let rec = simulate_recorded(build, &m, 4, CALLS, Fault::None).unwrap();
    for (r, rank) in rec.ranks.iter().enumerate() {
        for c in 0..CALLS {
            let entered = rank.calls[c].entered.unwrap();
            let recvs: Vec<Transfer> = rank.transfers(c).filter(|t| !t.send).collect();
            assert!(!recvs.is_empty());
            for t in recvs {
                let (first, last) = (t.first_at.unwrap(), t.done_at.unwrap());
                assert!(entered <= first && first < last, "rank {r}: {t:?}");
                // Its bytes at the NIC's rate (the reduction, at 4 GB/s,
                // keeps up as they land).
                let wire = t.bytes as f64 / 1.25e9;
                assert!((last - first - wire).abs() < 0.01 * wire, "rank {r}: {t:?}");
            }
            // A send's first bytes leave before the peer takes them in.
            let sent = rank.transfers(c).find(|t| t.send).unwrap();
            let got = rec.ranks[1 - r].transfers(c).find(|t| !t.send).unwrap();
            assert!(sent.first_at.unwrap() + 20e-6 <= got.first_at.unwrap() + 1e-12);
        }
    }
}

#[test]
fn a_receive_whose_bytes_were_all_there_shows_no_rate() {
    // Two hosts of one rank, messages of 64 KiB (under the eager limit:
    // they leave without waiting for the receive). Rank 1 enters every call
    // 5 ms late: rank 0's messages wait in its buffer, and the engine reads
    // and reduces each in one go, its first and last progress one moment.
    let hosts = [0, 1];
    let m = Model::flat(Topology::from_hosts(&hosts), 1.25e9, 20e-6);
    let a = args(32 << 10);
    let build = |r| build_on(&a, r, &m.topo, Algo::Ring).map_err(|e| e.to_string());
    let late = Fault::SlowRank {
        rank: 1,
        delay_s: 5e-3,
    };
    let rec = simulate_recorded(build, &m, 4, CALLS, late).unwrap();
    let first_recv = |r: usize, c| rec.ranks[r].transfers(c).find(|t| !t.send).unwrap();
    for c in 0..CALLS {
        let t = first_recv(1, c);
        assert!(t.bytes >= 32 << 10, "{t:?}");
        assert_eq!(t.first_at, t.done_at, "call {c}: {t:?}");
        // Rank 0 waits for rank 1's message, which comes over the wire.
        let t = first_recv(0, c);
        assert!(t.first_at.unwrap() < t.done_at.unwrap(), "call {c}: {t:?}");
    }
}
