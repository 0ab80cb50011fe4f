//! Start-up calibration of the cost model, for jobs across hosts that no
//! tuning table covers: the procedure of [`crate::choice::calibrate`] run
//! over this communicator.
//!
//! Link rates between hosts range from 1 to 400 Gbit/s, so a fixed size table
//! cannot know where the ring starts beating recursive doubling; one quick
//! measurement can. Rank 0 measures, the others wait (or echo), and rank 0
//! shares what it found, so every rank chooses with the same numbers
//! (ranks that chose differently would run different schedules and hang).
//!
//! At 1 Gbit/s this takes about 60 ms; at 10 Gbit/s and above, a few ms.
//! A tuning table's model for the setting always wins over this one; and
//! `cadence tune` writes that model with the same procedure, on demand
//! ([`Comm::calibrate_cost_model`]).
//!
//! **On by default** (`CADENCE_CALIBRATE=0`, as rank 0 reads it, turns it
//! off): across hosts it chose near the best algorithm more often than the
//! size table (`benchmarks/calibration_check.sh`).

use super::{Comm, OpRequest};
use crate::choice::calibrate::{self as procedure, Calibration, Round, SMALL_BYTES};
use crate::error::Result;
use crate::reduce;
use crate::schedule::{Algo, CostModel};
use crate::types::{CollKind, DType, ElemOp, RedOp};
use std::time::Instant;

/// Runs the calibration on every rank (collective); the model every rank
/// now shares, or `None` where rank 0 chose not to measure.
pub(super) fn run(comm: &Comm, wanted: bool) -> Result<Option<CostModel>> {
    // Rank 0's decision first: every rank must take the same path.
    let mut flag = [u8::from(wanted)];
    comm.run(broadcast(&mut flag))?;
    if flag[0] == 0 {
        return Ok(None);
    }
    Ok(Some(shared(comm)?.model))
}

impl Comm {
    /// The start-up calibration's procedure, run now over this
    /// communicator (collective: every rank calls it); rank 0's result, the
    /// same on every rank. On one host too (no TCP class then). Installs
    /// nothing: `cadence tune` writes it into a tuning table.
    pub fn calibrate_cost_model(&self) -> Result<Calibration> {
        shared(self)
    }
}

/// Measures (rank 0 times) and shares rank 0's calibration.
fn shared(comm: &Comm) -> Result<Calibration> {
    let topo = comm.topology().clone();
    let defaults = CostModel::default();
    let found = procedure::calibrate(&topo, defaults, &mut |round| run_round(comm, round))?;
    // The model, then the loaded-α scale; the measured classes follow from
    // the topology, which every rank shares.
    let mut bytes = [0u8; procedure::ENCODED_LEN + 8];
    if comm.rank() == 0 {
        let (model, scale) = bytes.split_at_mut(procedure::ENCODED_LEN);
        model.copy_from_slice(&procedure::encode(&found.model));
        scale.copy_from_slice(&found.loaded_scale.to_le_bytes());
    }
    comm.run(from_rank0(&mut bytes))?;
    let (model, scale) = bytes.split_at(procedure::ENCODED_LEN);
    Ok(Calibration {
        model: procedure::decode(model.try_into().expect("encoded model"), &defaults),
        loaded_scale: f64::from_le_bytes(scale.try_into().expect("8-byte scale")),
        ..found
    })
}

/// This rank's part of one round: rank 0 times, a link round's peer echoes,
/// the others skip rounds that do not involve them.
fn run_round(comm: &Comm, round: &Round) -> Result<Vec<f64>> {
    let me = comm.rank();
    let mut times = Vec::new();
    match *round {
        Round::PingPong {
            peer,
            bytes,
            warmup,
            reps,
        } => {
            let mut buf = vec![0u8; bytes];
            for i in 0..warmup + reps {
                if me == 0 {
                    let t0 = Instant::now();
                    comm.run(send(&buf, peer))?;
                    comm.run(recv(&mut buf, peer))?;
                    if i >= warmup {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                } else if me == peer {
                    comm.run(recv(&mut buf, 0))?;
                    comm.run(send(&buf, 0))?;
                }
            }
        }
        Round::Stream {
            peer,
            bytes,
            warmup,
            reps,
        } => {
            let mut stream = vec![0u8; bytes];
            let mut small = [0u8; SMALL_BYTES];
            for i in 0..warmup + reps {
                if me == 0 {
                    let t0 = Instant::now();
                    comm.run(send(&stream, peer))?;
                    comm.run(recv(&mut small, peer))?;
                    if i >= warmup {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                } else if me == peer {
                    comm.run(recv(&mut stream, 0))?;
                    comm.run(send(&small, 0))?;
                }
            }
        }
        Round::Loaded {
            elems,
            warmup,
            reps,
        } => {
            // One barrier, then the allreduces back to back: each ends
            // with every rank in step (no rank leaves a recursive-doubling
            // allreduce before every rank has entered it), as a barrier
            // would leave them, at half the cost (a barrier before each
            // was half of the round, ~50 ms of a 64-process start-up on
            // two cores). Only rank 0 keeps its times: the model is rank
            // 0's, and fitting the loaded α (every rank's schedule,
            // estimated again and again) would be wasted on the others.
            let mut x = vec![0u8; elems * 4];
            comm.run(OpRequest::barrier())?;
            for i in 0..warmup + reps {
                let t0 = Instant::now();
                comm.run(probe_allreduce(&mut x))?;
                if i >= warmup && me == 0 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
        }
        Round::Reduce { bytes, reps } if me == 0 => {
            let a = vec![0u8; bytes];
            let mut b = vec![0u8; bytes];
            for _ in 0..reps {
                let t0 = Instant::now();
                reduce::reduce_inplace(DType::F32, ElemOp::Sum, &mut b, &a);
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        Round::Reduce { .. } => {}
    }
    Ok(times)
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

/// Rank 0's `data` into everyone's, where every other rank's is zeros: a
/// byte-wise max by recursive doubling, over the links the loaded round
/// made. A broadcast's tree hands the bytes down log n hops one after
/// another, and ranks that have them go on to their own work while the
/// rest wait: with 64 ranks on 2 cores the last leaf had them 100 ms after
/// the root (its parents scheduled late among busy ranks); here every rank
/// finishes at the last exchange.
fn from_rank0(data: &mut [u8]) -> OpRequest<'_> {
    OpRequest::new(
        CollKind::AllReduce,
        DType::U8,
        RedOp::Max,
        0,
        vec![data.len()],
    )
    .with_algo(Some(Algo::RecursiveDoubling))
    .inout(data)
}

/// Rank 0's `data` into everyone's (in place).
pub(super) fn broadcast(data: &mut [u8]) -> OpRequest<'_> {
    request(CollKind::Broadcast, 0, data.len()).output(data)
}
