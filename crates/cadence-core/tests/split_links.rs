//! Splits that use their root's TCP links (`CADENCE_SPLIT_LINKS=share`,
//! the default): in one process, one thread per rank, every rank on a
//! host of its own so that every link is TCP.

use cadence_core::comm::{Bootstrap, Comm, OpRequest};
use cadence_core::{CollKind, CommError, Config, DType, ErrorKind, RedOp};
use std::time::{Duration, Instant};

mod common;

use common::Job;

/// The split of the ranks `members` (in the new order; collective over
/// every rank, as Python's `split` is: the ports and clocks go round by an
/// allgather). None on a rank that is not a member.
fn split(comm: &Comm, job: &Job, name: &str, members: &[usize]) -> Option<Comm> {
    let r = comm.rank();
    let me = members.iter().position(|&q| q == r);
    let boot = me.map(|me| {
        Bootstrap::new(
            &format!("{}-{name}", job.id),
            me,
            members.len(),
            &format!("h{r}"),
            "127.0.0.1".parse().unwrap(),
            comm.config().clone(),
            job.secret.clone(),
        )
        .unwrap()
    });
    common::split_by_allgather(comm, boot, members)
}

/// Every rank on a host of its own.
fn own_host(r: usize) -> String {
    format!("h{r}")
}

fn world<T: Send + 'static>(
    n: usize,
    cfg: Config,
    body: impl Fn(&Comm, &Job) -> T + Send + Sync + 'static,
) -> Vec<T> {
    common::world(n, own_host, cfg, body)
}

fn config(secs: u64) -> Config {
    Config {
        timeout: Duration::from_secs(secs),
        calibrate: false,
        ..Config::default()
    }
}

fn allreduce(comm: &Comm, x: &mut [f64]) -> Result<(), CommError> {
    let n = x.len();
    comm.run(
        OpRequest::new(CollKind::AllReduce, DType::F64, RedOp::Sum, 0, vec![n])
            .inout(bytemuck::cast_slice_mut(x)),
    )
}

/// Rank `r` adds `r + 1`: the sum over `ranks` is known.
fn sum_of(ranks: impl Iterator<Item = usize>) -> f64 {
    ranks.map(|r| r as f64 + 1.0).sum()
}

#[test]
fn a_split_uses_its_roots_links_and_makes_only_the_missing_ones() {
    // Eight ranks, eight hosts; the world's ring links every rank to its
    // neighbours. The split of the even ranks then needs 0-2, 2-4, ...:
    // links its root never made, made once, then used by the root too.
    let out = world(8, config(20), |comm, job| {
        let r = comm.rank();
        let mut x = vec![r as f64 + 1.0; 1000];
        allreduce(comm, &mut x).unwrap();
        assert_eq!(x[0], sum_of(0..8));
        let before = comm.links_open();
        let evens: Vec<usize> = (0..8).step_by(2).collect();
        let sub = split(comm, job, "evens", &evens);
        let last_root_call = || {
            let mut x = vec![r as f64 + 1.0; 7];
            allreduce(comm, &mut x).unwrap();
            assert_eq!(x[6], sum_of(0..8));
        };
        let Some(sub) = sub else {
            last_root_call();
            return (before, comm.links_open(), None);
        };
        for _ in 0..3 {
            let mut y = vec![r as f64 + 1.0; 1001];
            allreduce(&sub, &mut y).unwrap();
            assert_eq!(y[1000], sum_of(evens.iter().copied()), "rank {r}");
        }
        let after_split = comm.links_open();
        assert_eq!(
            sub.links_open(),
            after_split,
            "a split counts its root's links"
        );
        // The root's next collective goes over the same links.
        last_root_call();
        (before, after_split, Some(comm.links_open()))
    });
    for (r, (before, after_split, after_root)) in out.into_iter().enumerate() {
        if r % 2 == 1 {
            continue;
        }
        // A split of its own would have made links to the members it
        // talks to, besides its root's: sharing adds only those the root
        // lacked (at most the two ring neighbours among the evens).
        assert!(
            after_split <= before + 2,
            "rank {r}: {before} links before the split, {after_split} after"
        );
        assert!(after_split > 0);
        assert_eq!(
            after_root,
            Some(after_split),
            "rank {r}: the root made none anew"
        );
    }
}

#[test]
fn operations_on_a_root_and_its_split_run_in_the_order_issued_even_queued() {
    // Every rank queues root, split, root, split operations on their
    // progress threads at once: each communicator's thread would race
    // the other's for the links; the order of issue holds them apart.
    let out = world(4, config(20), |comm, job| {
        let r = comm.rank();
        let all: Vec<usize> = (0..4).rev().collect();
        let sub = split(comm, job, "rev", &all).unwrap();
        let mut bufs: Vec<Vec<f64>> = (0..6).map(|i| vec![(r + i) as f64; 257]).collect();
        let mut done = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            let on = if i % 2 == 0 { comm } else { &sub };
            let (n, bytes) = (b.len(), b.len() * 8);
            let p = b.as_mut_ptr() as *mut u8;
            // SAFETY: every buffer outlives its completion, waited for
            // below, and nothing else touches it meanwhile.
            let req =
                unsafe {
                    OpRequest::new(CollKind::AllReduce, DType::F64, RedOp::Sum, 0, vec![n])
                        .raw_buffers(Some((p, bytes)), Some((p, bytes)), None)
                };
            done.push(on.submit(req).unwrap());
        }
        for d in done {
            d.wait(None).unwrap().unwrap();
        }
        bufs.iter().map(|b| b[0]).collect::<Vec<_>>()
    });
    for got in out {
        let want: Vec<f64> = (0..6)
            .map(|i| (0..4).map(|r| (r + i) as f64).sum())
            .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn calling_a_root_and_its_split_in_different_orders_is_an_error_naming_both() {
    let start = Instant::now();
    let out = world(2, config(4), |comm, job| {
        let r = comm.rank();
        let sub = split(comm, job, "both", &[0, 1]).unwrap();
        let mut x = vec![1.0; 16];
        // Rank 0: root then split; rank 1: split then root.
        let first = if r == 0 {
            allreduce(comm, &mut x)
        } else {
            allreduce(&sub, &mut x)
        };
        let second = if r == 0 {
            allreduce(&sub, &mut x)
        } else {
            allreduce(comm, &mut x)
        };
        (first.err(), second.err())
    });
    let errors: Vec<CommError> = out
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .flatten()
        .collect();
    assert!(!errors.is_empty(), "mixed orders cannot both succeed");
    let named = errors.iter().any(|e| {
        matches!(e.kind, ErrorKind::Mismatch { .. })
            && e.to_string().contains("another communicator")
    });
    assert!(named, "{errors:?}");
    assert!(start.elapsed() < Duration::from_secs(15), "no hang");
}

#[test]
fn a_rank_aborting_a_split_fails_its_peers_root_operations() {
    // Rank 3 aborts the split of {1, 2, 3}; rank 0, not a member, then
    // waits on rank 3 in a root collective: it must hear of it too, as
    // must the split's members in either communicator.
    let start = Instant::now();
    let out = world(4, config(6), move |comm, job| {
        let r = comm.rank();
        let sub = split(comm, job, "three", &[1, 2, 3]);
        let mut x = vec![1.0; 8];
        allreduce(comm, &mut x).unwrap();
        // Rank 3 leaving a second call means every rank finished the first
        // (it entered the second): the abort cannot reach a rank still in
        // the first. The second may be the call that fails on the others.
        let mut z = vec![1.0; 8];
        let early = allreduce(comm, &mut z).err();
        if r == 3 {
            sub.as_ref().unwrap().abort("rank 3 gives up");
        }
        let mut y = vec![1.0; 8];
        let e = early.or_else(|| allreduce(comm, &mut y).err());
        (e, start.elapsed())
    });
    for (r, (e, took)) in out.into_iter().enumerate() {
        let e = e.unwrap_or_else(|| panic!("rank {r} succeeded"));
        assert!(took < Duration::from_secs(6 + 5), "rank {r} took {took:?}");
        if r != 3 {
            assert_eq!(e.culprit(), Some(3), "rank {r}: {e}");
        }
    }
}
