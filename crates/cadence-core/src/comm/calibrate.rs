//! Start-up calibration of the cost model, for jobs across hosts that no
//! tuning table covers.
//!
//! Link rates between hosts range from 1 to 400 Gbit/s, so a fixed size table
//! cannot know where the ring starts beating recursive doubling; one quick
//! measurement can. Rank 0 measures, the others wait, and rank 0 broadcasts
//! what it found, so every rank chooses with the same numbers (ranks that
//! chose differently would run different schedules and hang):
//!
//! - **α** of each link class: half the round trip of an 8-byte message with
//!   the first other rank on rank 0's host (shared memory) and the first rank
//!   on another host (TCP), median of [`SMALL_REPS`];
//! - **β**: a [`STREAM_BYTES`] one-way stream answered by 8 bytes, so
//!   `(time − 2α) / bytes`, median of [`STREAM_REPS`]. One way rather than a
//!   round trip of large messages: half the bytes for the same accuracy. A
//!   rate limiter's burst (a token bucket) rides under the first part of the
//!   stream; at 2 MiB a 125 kB burst skews β by 6 %.
//! - **γ**: one reduction of [`GAMMA_BYTES`] of float32, median of 3.
//! - **α under load**: a ping-pong while the other ranks sleep measures an α
//!   well below what a phase costs when every rank is busy (8 ranks on 2
//!   cores: several times lower). So every rank then runs a tiny allreduce
//!   by recursive doubling, [`LOADED_REPS`] times from a barrier, and both
//!   α's are scaled by the one factor that makes the model's estimate of
//!   that schedule equal rank 0's median time ([`fit_loaded_alpha`]).
//!
//! At 1 Gbit/s this takes about 60 ms; at 10 Gbit/s and above, a few ms.
//! A tuning table's model for the setting always wins over this one.
//!
//! **On by default** (`CADENCE_CALIBRATE=0`, as rank 0 reads it, turns it
//! off): across hosts it chose near the best algorithm more often than the
//! size table (`benchmarks/calibration_check.sh`).

use super::{Comm, OpRequest};
use crate::error::Result;
use crate::reduce;
use crate::schedule::{self, Algo, CollArgs, CostModel, LinkCost, Schedule, Topology};
use crate::types::{CollKind, DType, ElemOp, RedOp};
use std::time::Instant;

const SMALL_REPS: usize = 20;
const STREAM_REPS: usize = 3;
const WARMUP: usize = 2;
const STREAM_BYTES: usize = 2 << 20;
const GAMMA_BYTES: usize = 1 << 20;
const LOADED_REPS: usize = 9;
/// float32 elements of the loaded-α probe.
const LOADED_ELEMS: usize = 2;
/// The most α's are scaled up by (a sanity bound: a stalled probe must not
/// make every message look like 100 ms).
const LOADED_MAX_SCALE: f64 = 50.0;

/// The peers rank 0 measures against: (shared-memory peer, TCP peer).
pub(super) fn peers(topo: &Topology) -> (Option<usize>, Option<usize>) {
    let home = topo.host_of(0);
    let shm = (1..topo.nranks()).find(|&r| topo.host_of(r) == home);
    let tcp = (1..topo.nranks()).find(|&r| topo.host_of(r) != home);
    (shm, tcp)
}

/// Runs the calibration on every rank (collective); the model every rank
/// now shares, or `None` where rank 0 chose not to measure.
pub(super) fn run(comm: &Comm, wanted: bool) -> Result<Option<CostModel>> {
    let topo = comm.topology().clone();
    let me = comm.rank();
    // Rank 0's decision first: every rank must take the same path.
    let mut flag = [u8::from(wanted)];
    comm.run(broadcast(&mut flag))?;
    if flag[0] == 0 {
        return Ok(None);
    }
    let (shm_peer, tcp_peer) = peers(&topo);
    let defaults = CostModel::default();
    let mut model = defaults;
    for (peer, slot) in [(shm_peer, &mut model.shm), (tcp_peer, &mut model.tcp)] {
        let Some(peer) = peer else { continue };
        if me == 0 {
            *slot = measure_link(comm, peer)?;
        } else if me == peer {
            echo_link(comm, 0)?;
        }
    }
    let loaded = time_loaded(comm)?;
    if me == 0 {
        model.gamma = measure_gamma();
        model = fit_loaded_alpha(&model, &topo, loaded);
    }
    let mut bytes = encode(&model);
    comm.run(broadcast(&mut bytes))?;
    Ok(Some(decode(&bytes, &defaults)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rank 0's side: α and β of the link to `peer`.
fn measure_link(comm: &Comm, peer: usize) -> Result<LinkCost> {
    let mut small = [0u8; 8];
    let mut halves = Vec::with_capacity(SMALL_REPS);
    for i in 0..WARMUP + SMALL_REPS {
        let t0 = Instant::now();
        comm.run(send(&small, peer))?;
        comm.run(recv(&mut small, peer))?;
        if i >= WARMUP {
            halves.push(t0.elapsed().as_secs_f64() / 2.0);
        }
    }
    let alpha = median(halves);
    let stream = vec![0u8; STREAM_BYTES];
    let mut times = Vec::with_capacity(STREAM_REPS);
    for i in 0..1 + STREAM_REPS {
        let t0 = Instant::now();
        comm.run(send(&stream, peer))?;
        comm.run(recv(&mut small, peer))?;
        if i >= 1 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    // A β of 0 or less would make large messages free.
    let beta = ((median(times) - 2.0 * alpha) / STREAM_BYTES as f64).max(1e-13);
    Ok(LinkCost { alpha, beta })
}

/// The peer's side of [`measure_link`].
fn echo_link(comm: &Comm, lead: usize) -> Result<()> {
    let mut small = [0u8; 8];
    for _ in 0..WARMUP + SMALL_REPS {
        comm.run(recv(&mut small, lead))?;
        comm.run(send(&small, lead))?;
    }
    let mut stream = vec![0u8; STREAM_BYTES];
    for _ in 0..1 + STREAM_REPS {
        comm.run(recv(&mut stream, lead))?;
        comm.run(send(&small, lead))?;
    }
    Ok(())
}

/// Every rank: the loaded-α probe (see the module comment); rank 0's median
/// seconds per call (the others' times are not used).
fn time_loaded(comm: &Comm) -> Result<f64> {
    let mut x = [0u8; LOADED_ELEMS * 4];
    let mut times = Vec::with_capacity(LOADED_REPS);
    for i in 0..WARMUP + LOADED_REPS {
        comm.run(OpRequest::barrier())?;
        let t0 = Instant::now();
        comm.run(probe_allreduce(&mut x))?;
        if i >= WARMUP {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

/// `model` with both α's scaled by the factor (1 to [`LOADED_MAX_SCALE`])
/// at which its estimate of the probe's schedule is `seconds`; unchanged if
/// the probe was no slower than the ping-pong α's predict.
pub(super) fn fit_loaded_alpha(model: &CostModel, topo: &Topology, seconds: f64) -> CostModel {
    let args = CollArgs {
        kind: CollKind::AllReduce,
        root: 0,
        counts: vec![LOADED_ELEMS],
    };
    let schedules: Vec<Schedule> = (0..topo.nranks())
        .filter_map(|r| schedule::build_on(&args, r, topo, Algo::RecursiveDoubling).ok())
        .collect();
    let scaled = |s: f64| {
        let mut m = *model;
        m.shm.alpha *= s;
        m.tcp.alpha *= s;
        m
    };
    let estimate = |s: f64| scaled(s).estimate(&schedules, topo, 4);
    if schedules.len() != topo.nranks() || estimate(1.0) >= seconds {
        return *model;
    }
    if estimate(LOADED_MAX_SCALE) <= seconds {
        return scaled(LOADED_MAX_SCALE);
    }
    // The estimate grows with the scale: bisect.
    let (mut lo, mut hi) = (1.0, LOADED_MAX_SCALE);
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if estimate(mid) < seconds {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    scaled(0.5 * (lo + hi))
}

/// Seconds per byte of a float32 sum.
fn measure_gamma() -> f64 {
    let a = vec![0u8; GAMMA_BYTES];
    let mut b = vec![0u8; GAMMA_BYTES];
    let times = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            reduce::reduce_inplace(DType::F32, ElemOp::Sum, &mut b, &a);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    (median(times) / GAMMA_BYTES as f64).max(1e-13)
}

const FIELDS: usize = 5;

fn encode(m: &CostModel) -> [u8; FIELDS * 8] {
    let mut out = [0u8; FIELDS * 8];
    let vals = [m.shm.alpha, m.shm.beta, m.tcp.alpha, m.tcp.beta, m.gamma];
    for (chunk, v) in out.chunks_exact_mut(8).zip(vals) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The measured fields from `b`; the others (incast, serial share) from
/// `rest`.
fn decode(b: &[u8; FIELDS * 8], rest: &CostModel) -> CostModel {
    let v: Vec<f64> = b
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect();
    CostModel {
        shm: LinkCost {
            alpha: v[0],
            beta: v[1],
        },
        tcp: LinkCost {
            alpha: v[2],
            beta: v[3],
        },
        gamma: v[4],
        ..*rest
    }
}

fn request(kind: CollKind, root: usize, len: usize) -> OpRequest<'static> {
    OpRequest::new(kind, DType::U8, RedOp::Sum, root, vec![len])
}

pub(super) fn send(data: &[u8], peer: usize) -> OpRequest<'_> {
    request(CollKind::Send, peer, data.len()).input(data)
}

pub(super) fn recv(data: &mut [u8], peer: usize) -> OpRequest<'_> {
    request(CollKind::Recv, peer, data.len()).output(data)
}

/// The loaded-α probe: a float32 sum by recursive doubling, in place.
fn probe_allreduce(data: &mut [u8]) -> OpRequest<'_> {
    OpRequest::new(
        CollKind::AllReduce,
        DType::F32,
        RedOp::Sum,
        0,
        vec![data.len() / 4],
    )
    .with_algo(Some(Algo::RecursiveDoubling))
    .inout(data)
}

/// Rank 0's `data` into everyone's (in place).
pub(super) fn broadcast(data: &mut [u8]) -> OpRequest<'_> {
    request(CollKind::Broadcast, 0, data.len()).output(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_survives_its_broadcast_encoding() {
        let m = CostModel {
            shm: LinkCost {
                alpha: 1.5e-6,
                beta: 1.0 / 7e9,
            },
            tcp: LinkCost {
                alpha: 42e-6,
                beta: 1.0 / 1.1e8,
            },
            gamma: 2.5e-10,
            ..CostModel::default()
        };
        assert_eq!(decode(&encode(&m), &CostModel::default()), m);
    }

    #[test]
    fn loaded_alpha_is_fitted_to_the_probe() {
        let topo = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]);
        let base = CostModel::default();
        let truth = {
            let mut m = base;
            m.shm.alpha *= 3.0;
            m.tcp.alpha *= 3.0;
            m
        };
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![LOADED_ELEMS],
        };
        let scheds: Vec<Schedule> = (0..8)
            .map(|r| schedule::build_on(&args, r, &topo, Algo::RecursiveDoubling).unwrap())
            .collect();
        let took = truth.estimate(&scheds, &topo, 4);
        let fit = fit_loaded_alpha(&base, &topo, took);
        assert!(
            (fit.tcp.alpha / truth.tcp.alpha - 1.0).abs() < 1e-6,
            "{fit:?}"
        );
        assert!(
            (fit.shm.alpha / truth.shm.alpha - 1.0).abs() < 1e-6,
            "{fit:?}"
        );
        assert_eq!(fit.tcp.beta, base.tcp.beta);
        // Faster than the ping-pong predicts: unchanged; a stall: capped.
        assert_eq!(fit_loaded_alpha(&base, &topo, took / 100.0), base);
        let capped = fit_loaded_alpha(&base, &topo, 10.0);
        assert_eq!(capped.tcp.alpha, base.tcp.alpha * LOADED_MAX_SCALE);
    }

    #[test]
    fn rank_0_measures_the_first_peer_of_each_link_class() {
        let topo = Topology::from_hosts(&["b", "a", "a", "b", "c"].map(String::from));
        assert_eq!(peers(&topo), (Some(3), Some(1)));
        let one_host = Topology::single_host(3);
        assert_eq!(peers(&one_host), (Some(1), None));
        let one_each = Topology::from_hosts(&["x", "y"].map(String::from));
        assert_eq!(peers(&one_each), (None, Some(1)));
    }
}
