//! Window records (`sim::windows`): which operations a window holds, the
//! receives they keep, what the message ring forgets, and a slow NIC's
//! receives.

use super::exec::Fault;
use super::run::Cluster;
use super::spec::parse;
use super::windows::{Cut, SimWindows};
use crate::types::CollKind;
use serde_json::Value;
use std::path::Path;

/// 12 ranks on 3 hosts of 4 (10 Gbit/s NICs).
fn cluster() -> Cluster {
    let text = r#"{"version": 1, "kind": "cadence-cluster", "hosts": 3,
        "ranks_per_host": 4, "nic": {"rate": "10gbit", "latency_us": 20}}"#;
    Cluster::new(parse(text, Path::new("s.json"), None).unwrap())
}

/// An allreduce of 4 MiB (receives of 1/12 of it: over 64 KiB).
const COUNT: usize = 1 << 20;

fn run(c: &Cluster, calls: usize, fault: Fault) -> SimWindows {
    c.windows(CollKind::AllReduce, COUNT, 4, calls, fault)
        .unwrap()
}

fn parsed(texts: &[Option<String>]) -> Vec<Option<Value>> {
    let each = texts
        .iter()
        .map(|t| t.as_ref().map(|t| serde_json::from_str(t).unwrap()));
    each.collect()
}

fn ops(dump: &Value) -> &Vec<Value> {
    dump["ops"].as_array().unwrap()
}

#[test]
fn each_call_is_in_the_window_its_end_falls_in_with_its_timed_receives() {
    let c = cluster();
    let w = run(&c, 9, Fault::None);
    let cut = Cut::new(w.seconds / 3.0, 64 * 1024);
    let n = w.count(&cut).unwrap();
    assert!((3..=4).contains(&n), "{n} windows");
    let mut seen = vec![Vec::new(); 12];
    for k in 0..n {
        let (lo, hi) = (
            k as f64 * cut.window_s * 1e9,
            (k + 1) as f64 * cut.window_s * 1e9,
        );
        for (r, dump) in parsed(&w.window(k, &cut).unwrap()).iter().enumerate() {
            let Some(dump) = dump else { continue };
            assert_eq!(dump["rank"], r);
            assert_eq!(dump["reason"], "slowness window");
            assert_eq!(dump["dump_ns"].as_f64().unwrap().round(), hi.round());
            // Only the rank and the peers it has links to are listed.
            let peers: Vec<u64> = dump["peers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["rank"].as_u64().unwrap())
                .collect();
            let links = dump["links"].as_array().unwrap();
            assert!(peers.contains(&(r as u64)) && peers.len() == links.len() + 1);
            for op in ops(dump) {
                let end = op["end_ns"].as_f64().unwrap();
                assert!(lo <= end && end < hi, "rank {r} window {k}: {op}");
                assert_eq!(
                    (&op["status"], &op["messages_state"]),
                    (&"ok".into(), &"final".into())
                );
                seen[r].push(op["seq"].as_u64().unwrap());
                let msgs = op["messages"].as_array().unwrap();
                assert!(!msgs.is_empty(), "rank {r}: no timed receive");
                for m in msgs {
                    assert_eq!((&m["dir"], &m["state"]), (&"recv".into(), &"done".into()));
                    assert!(m["bytes"].as_u64() >= Some(64 * 1024));
                    let (first, last) = (m["first_ns"].as_u64(), m["last_ns"].as_u64());
                    assert!(
                        op["start_ns"].as_u64() <= first
                            && first < last
                            && last <= op["end_ns"].as_u64()
                    );
                }
            }
        }
    }
    // Every call of every rank is in one window, once.
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(*s, (1..=9).collect::<Vec<u64>>(), "rank {r}");
    }
}

#[test]
fn a_later_phase_moves_calls_into_later_windows_and_none_is_lost() {
    let c = cluster();
    let w = run(&c, 6, Fault::None);
    let count_ops = |cut: &Cut| -> usize {
        (0..w.count(cut).unwrap())
            .map(|k| {
                let texts = w.window(k, cut).unwrap();
                parsed(&texts)
                    .iter()
                    .flatten()
                    .map(|d| ops(d).len())
                    .sum::<usize>()
            })
            .sum()
    };
    let plain = Cut::new(w.seconds / 2.5, 64 * 1024);
    let phased = Cut {
        phase_s: 0.7 * plain.window_s,
        ..plain
    };
    assert_eq!(count_ops(&plain), 6 * 12);
    assert_eq!(count_ops(&phased), 6 * 12);
    assert_eq!(w.count(&phased).unwrap(), w.count(&plain).unwrap() + 1);
    assert!(w
        .count(&Cut {
            phase_s: plain.window_s,
            ..plain
        })
        .is_err());
}

#[test]
fn the_message_ring_keeps_the_newest_calls_messages_only() {
    // The ring of 4096 messages holds the last 4096 / (a call's transfers)
    // calls' messages; a window shows the newest 128 calls.
    let c = cluster();
    let calls = 128;
    let w = run(&c, calls, Fault::None);
    let r = (0..12).max_by_key(|&r| w.transfer_count(r, 0)).unwrap();
    let kept = 4096 / w.transfer_count(r, 0);
    assert!(kept < calls, "{kept} calls kept");
    let cut = Cut::new(2.0 * w.seconds, 0);
    let dump = parsed(&w.window(0, &cut).unwrap())[r].take().unwrap();
    let states: Vec<&str> = ops(&dump)
        .iter()
        .map(|o| o["messages_state"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), calls);
    assert!(
        states[..calls - kept].iter().all(|&s| s == "dropped"),
        "{states:?}"
    );
    assert!(
        states[calls - kept..].iter().all(|&s| s == "final"),
        "{states:?}"
    );
    // Taken later, after more calls ended, the ring holds fewer of them.
    let late = Cut {
        window_s: 0.25 * w.seconds,
        dump_after_s: 0.8 * w.seconds,
        ..cut
    };
    let dump = parsed(&w.window(0, &late).unwrap())[r].take().unwrap();
    assert!(ops(&dump).iter().all(|o| o["messages_state"] == "dropped"));
}

/// Per rank, the bytes and the time (s) of its timed receives from other
/// hosts over a whole run.
fn away_rates(w: &SimWindows) -> Vec<f64> {
    let cut = Cut::new(2.0 * w.seconds, 64 * 1024);
    let dumps = parsed(&w.window(0, &cut).unwrap());
    dumps
        .iter()
        .enumerate()
        .map(|(r, d)| {
            let d = d.as_ref().unwrap();
            let (mut bytes, mut secs) = (0.0, 0.0);
            for op in ops(d) {
                for m in op["messages"].as_array().unwrap() {
                    if m["peer"].as_u64().unwrap() as usize / 4 != r / 4 {
                        bytes += m["bytes"].as_f64().unwrap();
                        secs += (m["last_ns"].as_f64().unwrap() - m["first_ns"].as_f64().unwrap())
                            / 1e9;
                    }
                }
            }
            if secs > 0.0 {
                bytes / secs
            } else {
                f64::NAN
            }
        })
        .collect()
}

#[test]
fn a_slow_nic_slows_the_receives_across_it_only() {
    let c = cluster();
    let clean = away_rates(&run(&c, 3, Fault::None));
    let slow = away_rates(&run(
        &c,
        3,
        Fault::SlowNic {
            host: 1,
            factor: 0.1,
        },
    ));
    for r in 0..12 {
        if clean[r].is_nan() {
            continue; // no receive from another host
        }
        let ratio = slow[r] / clean[r];
        match r / 4 {
            1 => assert!(ratio < 0.2, "rank {r} on the slow host: {ratio}"),
            _ => assert!(ratio > 0.1, "rank {r}: {ratio}"),
        }
    }
    assert!(
        (4..8).any(|r| !clean[r].is_nan()),
        "host 1 receives from no other host"
    );
}
