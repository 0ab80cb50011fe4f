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
//!
//! At 1 Gbit/s this takes about 60 ms; at 10 Gbit/s and above, a few ms.
//! A tuning table's model for the setting always wins over this one.
//!
//! **Off by default** (`CADENCE_CALIBRATE=1`, as rank 0 reads it, turns it
//! on). On the emulated cluster (4 hosts × 2 ranks on 2 cores, allreduce
//! 16 B–64 MiB) auto chose within 10 % of the best algorithm at 9 of 12 sizes
//! with this model against 11 of 12 with the size table: a ping-pong between
//! two ranks while the others sleep measures an α well below what a phase
//! costs when every rank is busy, so the model underrates schedules with more
//! phases at 1–16 KiB. Measuring α under load (timing a small collective of
//! every rank) is the next step; until then the model serves where it ranks
//! well (64 KiB and up, where it matched the best within 3 %).

use super::{Comm, OpRequest};
use crate::engine::Buffers;
use crate::error::Result;
use crate::reduce;
use crate::schedule::{CostModel, LinkCost, Topology};
use crate::types::{CollKind, DType, ElemOp, RedOp};
use std::time::Instant;

const SMALL_REPS: usize = 20;
const STREAM_REPS: usize = 3;
const WARMUP: usize = 2;
const STREAM_BYTES: usize = 2 << 20;
const GAMMA_BYTES: usize = 1 << 20;

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
    if me == 0 {
        model.gamma = measure_gamma();
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

fn request(kind: CollKind, root: usize, bufs: Buffers, len: usize) -> OpRequest {
    OpRequest {
        kind,
        dtype: DType::U8,
        op: RedOp::Sum,
        root,
        counts: vec![len],
        has_input: !bufs.input.is_null(),
        has_output: !bufs.output.is_null(),
        bufs,
        algo: None,
    }
}

fn send(data: &[u8], peer: usize) -> OpRequest {
    let bufs = Buffers {
        input: data.as_ptr(),
        input_bytes: data.len(),
        output: std::ptr::null_mut(),
        output_bytes: 0,
    };
    request(CollKind::Send, peer, bufs, data.len())
}

fn recv(data: &mut [u8], peer: usize) -> OpRequest {
    let bufs = Buffers {
        input: std::ptr::null(),
        input_bytes: 0,
        output: data.as_mut_ptr(),
        output_bytes: data.len(),
    };
    request(CollKind::Recv, peer, bufs, data.len())
}

/// Rank 0's `data` into everyone's (in place).
fn broadcast(data: &mut [u8]) -> OpRequest {
    let bufs = Buffers {
        input: std::ptr::null(),
        input_bytes: 0,
        output: data.as_mut_ptr(),
        output_bytes: data.len(),
    };
    request(CollKind::Broadcast, 0, bufs, data.len())
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
    fn rank_0_measures_the_first_peer_of_each_link_class() {
        let topo = Topology::from_hosts(&["b", "a", "a", "b", "c"].map(String::from));
        assert_eq!(peers(&topo), (Some(3), Some(1)));
        let one_host = Topology::single_host(3);
        assert_eq!(peers(&one_host), (Some(1), None));
        let one_each = Topology::from_hosts(&["x", "y"].map(String::from));
        assert_eq!(peers(&one_each), (None, Some(1)));
    }
}
