//! Measuring the network between a communicator's hosts the way collectives
//! load it (TCCL's profiler): what `cadence topo profile` writes and what a
//! job without a topology file measures at start-up (`order.rs`).
//!
//! One rank per host, its lowest (its **leader**), sends and receives; the
//! other ranks join the barriers and the exchange of results. Every
//! measurement is a **round**: a barrier, then a pattern of flows at once
//! (each a point-to-point message of the same size, at most one into and
//! one out of each host), then every rank learns when each flow's receive
//! completed. A flow's rate is its size over the time from the barrier to
//! that completion. Which rounds run and what they mean is
//! `fabric::probe` (the simulator runs the same procedure on its model):
//! every pair alone up to `pairs_max` hosts, then rounds of shifted flows
//! where the pairs found no groups or were too many.
//!
//! Every rank ends with the same numbers (they are summed across ranks, each
//! filled in by one), so every rank builds the same file and the same ring
//! order without a further exchange.
//!
//! Cost: rounds of about `seconds` each (the flow size is set by a first
//! transfer so the fastest pair takes about that long): n(n−1) + 2·groups
//! with the pairs (4 hosts ≈ 1–2 s, 8 hosts ≈ 4–5 s at 0.05 s on 1 Gbit/s
//! links), about 2·log2(n) + 4 with the shifts alone.

use super::calibrate::{recv, send};
use super::{Comm, OpRequest};
use crate::error::Result;
use crate::fabric::file::{TopoFile, KIND, VERSION};
use crate::fabric::probe::{self, Flow};
use crate::types::{CollKind, DType, RedOp};
use serde_json::json;
use std::time::Instant;

/// Flow sizes the first transfer may choose from.
const MIN_BYTES: usize = 256 << 10;
const MAX_BYTES: usize = 64 << 20;
/// The first transfer's size.
const PROBE_BYTES: usize = 4 << 20;

/// What a profile measures, and how.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// About how long the fastest pair's flow takes.
    pub seconds: f64,
    /// Also measure the rank-order and the found ring under load.
    pub rings: bool,
    /// Most hosts whose every pair is measured alone; above, shifts only.
    pub pairs_max: usize,
    /// The file's `note`.
    pub note: String,
}

/// Rounds of flows between the leaders.
struct Rounds<'c> {
    comm: &'c Comm,
    /// `leaders[i]`: the lowest rank on host i.
    leaders: Vec<usize>,
    /// This rank's host index when it leads its host.
    me: Option<usize>,
    nbytes: usize,
    send: Vec<u8>,
    recv: Vec<u8>,
}

impl<'c> Rounds<'c> {
    fn new(comm: &'c Comm, leaders: &[usize], nbytes: usize) -> Rounds<'c> {
        let me = leaders.iter().position(|&r| r == comm.rank());
        let buf = |n: usize| {
            if me.is_some() {
                vec![1u8; n]
            } else {
                Vec::new()
            }
        };
        Rounds {
            comm,
            leaders: leaders.to_vec(),
            me,
            nbytes,
            send: buf(nbytes),
            recv: buf(nbytes),
        }
    }

    /// Rates (bytes/s) of `flows` (pairs of host indices) run at once; the
    /// same on every rank.
    fn run(&mut self, flows: &[(usize, usize)]) -> Result<Vec<f64>> {
        let comm = self.comm;
        comm.run(OpRequest::barrier())?;
        let started = Instant::now();
        let mut took = vec![0.0f64; flows.len()];
        if let Some(me) = self.me {
            // The patterns put at most one flow into and one out of a host,
            // so no NIC carries two flows of a round.
            let incoming = flows.iter().position(|&(_, d)| d == me);
            let outgoing = flows.iter().position(|&(s, _)| s == me);
            debug_assert!(flows.iter().filter(|&&(_, d)| d == me).count() <= 1);
            debug_assert!(flows.iter().filter(|&&(s, _)| s == me).count() <= 1);
            let from = incoming.map(|i| self.leaders[flows[i].0]);
            let to = outgoing.map(|i| self.leaders[flows[i].1]);
            match (from, to) {
                (Some(from), Some(to)) => {
                    // Both at once (a ring): receive first, so its time is
                    // seen as soon as it completes.
                    let t =
                        comm.run_together(vec![recv(&mut self.recv, from), send(&self.send, to)])?;
                    took[incoming.unwrap()] = t[0].as_secs_f64();
                }
                (Some(from), None) => {
                    comm.run(recv(&mut self.recv, from))?;
                    took[incoming.unwrap()] = started.elapsed().as_secs_f64();
                }
                (None, Some(to)) => comm.run(send(&self.send, to))?,
                (None, None) => {}
            }
        }
        // Each flow's time was filled in by its receiver only.
        let mut bytes: Vec<u8> = took.iter().flat_map(|t| t.to_le_bytes()).collect();
        comm.run(
            OpRequest::new(
                CollKind::AllReduce,
                DType::F64,
                RedOp::Sum,
                0,
                vec![flows.len()],
            )
            .inout(&mut bytes),
        )?;
        Ok(bytes
            .chunks_exact(8)
            .map(|b| {
                let t = f64::from_le_bytes(b.try_into().expect("8 bytes"));
                if t > 0.0 {
                    self.nbytes as f64 / t
                } else {
                    0.0
                }
            })
            .collect())
    }
}

/// A flow size the fastest pair moves in about `seconds`: measured on host
/// 0 → 1, then rounded up to a power of two, within bounds.
fn choose_bytes(comm: &Comm, leaders: &[usize], seconds: f64) -> Result<usize> {
    let mut probe = Rounds::new(comm, leaders, PROBE_BYTES);
    probe.run(&[(0, 1)])?; // warms the connection
    let rate = probe.run(&[(0, 1)])?[0];
    let want = (rate * seconds).max(1.0) as usize;
    Ok(want.next_power_of_two().clamp(MIN_BYTES, MAX_BYTES))
}

impl Comm {
    /// Profiles the network between this communicator's hosts (collective
    /// over every rank) and returns the topology file, the same on every
    /// rank. Rank 0 hands `say` a line per stage.
    pub fn profile_topology(&self, opts: &ProfileOptions, say: &dyn Fn(&str)) -> Result<TopoFile> {
        let say = |m: &str| {
            if self.rank() == 0 {
                say(m)
            }
        };
        let started = Instant::now();
        // Hosts by lowest rank, whatever ring order is in force.
        let peers = &self.shared.peers;
        let topo = peers.topology();
        let n = topo.nhosts();
        let hosts: Vec<String> = (0..n)
            .map(|h| peers.host(topo.leader(h)).to_string())
            .collect();
        let leaders: Vec<usize> = (0..n).map(|h| topo.leader(h)).collect();
        let mut file = TopoFile {
            version: VERSION,
            kind: KIND.into(),
            note: opts.note.clone(),
            hosts,
            rates: vec![vec![0.0; n]; n],
            host_rates: None,
            groups: vec![(0..n).collect()],
            group_out: vec![None],
            group_in: vec![None],
            patterns: serde_json::Value::Null,
            profile: serde_json::Value::Null,
        };
        let mut nbytes = 0;
        let mut method = String::new();
        let mut patterns = Vec::new();
        if n >= 2 {
            nbytes = choose_bytes(self, &leaders, opts.seconds)?;
            let mut rounds = Rounds::new(self, &leaders, nbytes);
            let plan = if n <= opts.pairs_max {
                format!("{} pairs alone", n * (n - 1))
            } else {
                "rounds of shifted flows".to_string()
            };
            say(&format!(
                "profiling {n} hosts: {plan}, {} KiB per flow",
                nbytes >> 10
            ));
            let popts = probe::Options {
                pairs_max: opts.pairs_max,
                rings: opts.rings,
            };
            let found = probe::profile(n, popts, &mut |f: &[Flow]| rounds.run(f), &say)?;
            file.rates = found.rates;
            file.host_rates = found.host_rates;
            file.groups = found.groups;
            file.group_out = found.group_out;
            file.group_in = found.group_in;
            method = found.method;
            for r in found.rounds {
                let flows: Vec<_> = r
                    .flows
                    .iter()
                    .zip(&r.rates)
                    .map(|(&(a, b), &x)| json!([a, b, x]))
                    .collect();
                patterns.push(json!({"name": r.name, "flows": flows}));
            }
            let mbit = |c: &[Option<f64>]| -> String {
                let each: Vec<String> = c
                    .iter()
                    .map(|c| c.map_or("-".into(), |c| format!("{:.0}", c * 8.0 / 1e6)))
                    .collect();
                each.join(", ")
            };
            say(&format!(
                "groups {:?}; bottlenecks (Mbit/s, -: not shared): out [{}], in [{}]",
                file.groups,
                mbit(&file.group_out),
                mbit(&file.group_in)
            ));
        }
        let took = started.elapsed().as_secs_f64();
        say(&format!("profiled in {took:.1} s"));
        file.patterns = serde_json::Value::Array(patterns);
        file.profile = json!({
            "bytes_per_flow": nbytes,
            "method": method,
            "seconds": (took * 1000.0).round() / 1000.0,
            "ranks": self.nranks(),
        });
        Ok(file)
    }
}
