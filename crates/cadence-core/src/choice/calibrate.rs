//! The start-up calibration of the cost model as a procedure: which rounds
//! to time and what the cost model's parameters are from their times. It
//! times nothing itself: the caller hands it a runner, as `fabric::probe`
//! is handed one, so the same procedure can run over a communicator
//! (`comm/calibrate.rs`) or anything else that can time the rounds.
//!
//! Every rank runs the procedure with the same topology, so every rank asks
//! for the same rounds in the same order. Rank 0 times; the peer of a link
//! round echoes; ranks a round does not involve skip it. Only rank 0's
//! model is meaningful (the runner's caller shares it):
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
//!   well below what a phase costs when every rank is busy. So every rank
//!   then runs a tiny allreduce by recursive doubling, [`LOADED_REPS`] times
//!   back to back after a barrier, and both α's are scaled by the one factor that makes
//!   the model's estimate of that schedule equal rank 0's median time
//!   ([`fit_loaded_alpha`]).

use crate::schedule::{self, Algo, CollArgs, CostModel, LinkCost, Schedule, Topology};
use crate::types::CollKind;

pub const SMALL_REPS: usize = 20;
pub const STREAM_REPS: usize = 3;
pub const WARMUP: usize = 2;
pub const SMALL_BYTES: usize = 8;
pub const STREAM_BYTES: usize = 2 << 20;
pub const GAMMA_BYTES: usize = 1 << 20;
pub const GAMMA_REPS: usize = 3;
pub const LOADED_REPS: usize = 9;
/// float32 elements of the loaded-α probe.
pub const LOADED_ELEMS: usize = 2;
/// The most α's are scaled up by (a sanity bound: a stalled probe must not
/// make every message look like 100 ms).
pub const LOADED_MAX_SCALE: f64 = 50.0;

/// One round to time. The runner returns rank 0's timed samples (seconds,
/// after `warmup` untimed ones); on other ranks, whatever it likes (the
/// model they compute is not used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// Rank 0 sends `bytes` to `peer`, which answers with `bytes`: each
    /// sample is one whole round trip.
    PingPong {
        peer: usize,
        bytes: usize,
        warmup: usize,
        reps: usize,
    },
    /// Rank 0 sends `bytes` to `peer`, which answers with [`SMALL_BYTES`]:
    /// each sample is from the send to the answer.
    Stream {
        peer: usize,
        bytes: usize,
        warmup: usize,
        reps: usize,
    },
    /// Every rank: a barrier, then allreduces of `elems` float32 by
    /// recursive doubling back to back, each timed from the end of the one
    /// before (or of the barrier).
    Loaded {
        elems: usize,
        warmup: usize,
        reps: usize,
    },
    /// Rank 0 alone: a float32 sum of `bytes` into a buffer of its own.
    Reduce { bytes: usize, reps: usize },
}

/// The peers rank 0 measures against: (shared-memory peer, TCP peer).
pub fn peers(topo: &Topology) -> (Option<usize>, Option<usize>) {
    let home = topo.host_of(0);
    let shm = (1..topo.nranks()).find(|&r| topo.host_of(r) == home);
    let tcp = (1..topo.nranks()).find(|&r| topo.host_of(r) != home);
    (shm, tcp)
}

/// The rounds in the order [`measure`] asks for them.
pub fn rounds(topo: &Topology) -> Vec<Round> {
    let (shm, tcp) = peers(topo);
    let mut out = Vec::new();
    for peer in [shm, tcp].into_iter().flatten() {
        out.push(Round::PingPong {
            peer,
            bytes: SMALL_BYTES,
            warmup: WARMUP,
            reps: SMALL_REPS,
        });
        out.push(Round::Stream {
            peer,
            bytes: STREAM_BYTES,
            warmup: 1,
            reps: STREAM_REPS,
        });
    }
    out.push(Round::Loaded {
        elems: LOADED_ELEMS,
        warmup: WARMUP,
        reps: LOADED_REPS,
    });
    out.push(Round::Reduce {
        bytes: GAMMA_BYTES,
        reps: GAMMA_REPS,
    });
    out
}

/// What one run of the procedure found: the model, the factor its α's were
/// scaled by to match the loaded probe, and which link classes it measured
/// (a class the topology lacks keeps its defaults, also unscaled figures a
/// caller should not mistake for measured ones).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    pub model: CostModel,
    /// 1 where the probe was no slower than the ping-pong α's predict.
    pub loaded_scale: f64,
    pub shm_measured: bool,
    pub tcp_measured: bool,
}

/// Runs the procedure: `run` times each round of [`rounds`]; the model
/// from rank 0's samples, starting from `defaults` (a link class the
/// topology lacks keeps its defaults; a round with no samples leaves its
/// parameter as it was).
pub fn measure<E>(
    topo: &Topology,
    defaults: CostModel,
    run: &mut dyn FnMut(&Round) -> Result<Vec<f64>, E>,
) -> Result<CostModel, E> {
    calibrate(topo, defaults, run).map(|c| c.model)
}

/// [`measure`], with the loaded-α scale and the measured link classes.
pub fn calibrate<E>(
    topo: &Topology,
    defaults: CostModel,
    run: &mut dyn FnMut(&Round) -> Result<Vec<f64>, E>,
) -> Result<Calibration, E> {
    let (shm, tcp) = peers(topo);
    let mut model = defaults;
    let mut loaded = None;
    for round in rounds(topo) {
        let samples = run(&round)?;
        let Some(m) = median(samples) else { continue };
        match round {
            Round::PingPong { peer, .. } => link(&mut model, shm == Some(peer)).alpha = m / 2.0,
            Round::Stream { peer, bytes, .. } => {
                let l = link(&mut model, shm == Some(peer));
                // A β of 0 or less would make large messages free.
                l.beta = ((m - 2.0 * l.alpha) / bytes as f64).max(1e-13);
            }
            Round::Loaded { .. } => loaded = Some(m),
            Round::Reduce { bytes, .. } => model.gamma = (m / bytes as f64).max(1e-13),
        }
    }
    let loaded_scale = match loaded {
        // One rank sends nothing: no α to fit.
        Some(seconds) if topo.nranks() > 1 => loaded_scale(&model, topo, seconds),
        _ => 1.0,
    };
    Ok(Calibration {
        model: scale_alpha(&model, loaded_scale),
        loaded_scale,
        shm_measured: shm.is_some(),
        tcp_measured: tcp.is_some(),
    })
}

fn link(model: &mut CostModel, shm: bool) -> &mut LinkCost {
    if shm {
        &mut model.shm
    } else {
        &mut model.tcp
    }
}

/// The middle sample (the upper one of an even count); None for none.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// `model` with both α's scaled by the factor (1 to [`LOADED_MAX_SCALE`])
/// at which its estimate of the probe's schedule is `seconds`; unchanged if
/// the probe was no slower than the ping-pong α's predict.
pub fn fit_loaded_alpha(model: &CostModel, topo: &Topology, seconds: f64) -> CostModel {
    scale_alpha(model, loaded_scale(model, topo, seconds))
}

fn scale_alpha(model: &CostModel, s: f64) -> CostModel {
    let mut m = *model;
    m.shm.alpha *= s;
    m.tcp.alpha *= s;
    m
}

/// The factor of [`fit_loaded_alpha`].
pub fn loaded_scale(model: &CostModel, topo: &Topology, seconds: f64) -> f64 {
    let args = CollArgs {
        kind: CollKind::AllReduce,
        root: 0,
        counts: vec![LOADED_ELEMS],
    };
    let schedules: Vec<Schedule> = (0..topo.nranks())
        .filter_map(|r| schedule::build_on(&args, r, topo, Algo::RecursiveDoubling).ok())
        .collect();
    let estimate = |s: f64| scale_alpha(model, s).estimate(&schedules, topo, 4);
    if schedules.len() != topo.nranks() || estimate(1.0) >= seconds {
        return 1.0;
    }
    if estimate(LOADED_MAX_SCALE) <= seconds {
        return LOADED_MAX_SCALE;
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
    0.5 * (lo + hi)
}

/// The measured fields of a model as bytes, for rank 0 to share.
pub const ENCODED_LEN: usize = 5 * 8;

pub fn encode(m: &CostModel) -> [u8; ENCODED_LEN] {
    let mut out = [0u8; ENCODED_LEN];
    let vals = [m.shm.alpha, m.shm.beta, m.tcp.alpha, m.tcp.beta, m.gamma];
    for (chunk, v) in out.chunks_exact_mut(8).zip(vals) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The measured fields from `b`; the others (incast, serial share) from
/// `rest`.
pub fn decode(b: &[u8; ENCODED_LEN], rest: &CostModel) -> CostModel {
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

    #[test]
    fn the_model_follows_rank_0s_samples() {
        let topo = Topology::from_hosts(&[0, 0, 1, 1]);
        assert_eq!(peers(&topo), (Some(1), Some(2)));
        // Round trips of 4 µs (shm) and 100 µs (tcp); streams of 2 MiB at
        // 5 GB/s and 0.1 GB/s after 2α; a slow loaded probe; 1 ms of sum.
        let mut asked = Vec::new();
        let mut run = |r: &Round| -> Result<Vec<f64>, ()> {
            asked.push(*r);
            Ok(match *r {
                Round::PingPong { peer: 1, reps, .. } => vec![4e-6; reps],
                Round::PingPong { reps, .. } => vec![100e-6; reps],
                Round::Stream { peer: 1, bytes, .. } => vec![4e-6 + bytes as f64 / 5e9; 3],
                Round::Stream { bytes, .. } => vec![100e-6 + bytes as f64 / 1e8; 3],
                Round::Loaded { .. } => vec![1.0],
                Round::Reduce { .. } => vec![1e-3, 2e-3, 0.5e-3],
            })
        };
        let m = measure(&topo, CostModel::default(), &mut run).unwrap();
        assert_eq!(asked, rounds(&topo));
        assert_eq!(asked.len(), 6);
        let scale = m.shm.alpha / 2e-6;
        assert!((m.tcp.alpha / 50e-6 / scale - 1.0).abs() < 1e-9, "{m:?}");
        assert_eq!(scale, LOADED_MAX_SCALE, "a 1 s probe is a stall: capped");
        assert!((m.shm.beta * 5e9 - 1.0).abs() < 1e-9, "{m:?}");
        assert!((m.tcp.beta * 1e8 - 1.0).abs() < 1e-9, "{m:?}");
        assert_eq!(m.gamma, 1e-3 / GAMMA_BYTES as f64);
        // A rank whose runner times nothing keeps the defaults.
        let none = measure(&topo, CostModel::default(), &mut |_| Ok::<_, ()>(vec![])).unwrap();
        assert_eq!(none, CostModel::default());
    }

    #[test]
    fn a_calibration_says_what_it_measured_and_by_what_scale() {
        // One host: no TCP round, so the TCP class is the default, scaled
        // along with shm's α but reported as not measured.
        let topo = Topology::single_host(4);
        let mut run = |r: &Round| -> Result<Vec<f64>, ()> {
            Ok(match *r {
                Round::PingPong { reps, .. } => vec![4e-6; reps],
                Round::Stream { bytes, .. } => vec![4e-6 + bytes as f64 / 5e9; 3],
                Round::Loaded { .. } => vec![1.0],
                Round::Reduce { .. } => vec![1e-3],
            })
        };
        let c = calibrate(&topo, CostModel::default(), &mut run).unwrap();
        assert!(c.shm_measured && !c.tcp_measured, "{c:?}");
        assert_eq!(c.loaded_scale, LOADED_MAX_SCALE);
        assert_eq!(c.model.shm.alpha, 2e-6 * LOADED_MAX_SCALE);
        assert_eq!(
            c.model,
            measure(&topo, CostModel::default(), &mut run).unwrap()
        );
        // One rank sends nothing: nothing to fit.
        let alone = calibrate(&Topology::single_host(1), CostModel::default(), &mut run).unwrap();
        assert_eq!(alone.loaded_scale, 1.0);
        assert!(!alone.shm_measured && !alone.tcp_measured);
    }
}
