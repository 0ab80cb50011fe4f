//! One collective at one size on a modeled cluster, as the library would
//! run it there: the ring order the library takes from a topology file,
//! `auto` chosen by the library's own selection code (`choice`,
//! priced with the cost model a start-up calibration would measure on this
//! cluster), and the schedules from the library's generators.

use super::exec::{simulate_calls, simulate_program, Model, Outcome, Unit};
use super::spec::Loaded;
use crate::choice::{select_algo_on, AlgoOverride, Auto};
use crate::comm::order::choose_by;
use crate::fabric::file::{TopoFile, KIND, VERSION};
use crate::fabric::probe::{self, Flow};
use crate::schedule::{self, Algo, CollArgs, CostModel, LinkCost, Schedule, Topology};
use crate::types::CollKind;
use std::sync::Arc;

/// A modeled cluster ready to run collectives on: the model, in the ring
/// order the library would use, and the library's chooser for it.
pub struct Cluster {
    pub model: Model,
    pub auto: Auto,
    /// How the ring order was chosen (from `comm::order`), for people.
    pub order: String,
}

impl Cluster {
    pub fn new(loaded: Loaded) -> Cluster {
        Cluster::with_profile(loaded, true)
    }

    /// As [`Cluster::new`]; `profile: false` is a job with
    /// `CADENCE_TOPO_FILE=none`: no start-up profile, hosts by lowest rank.
    pub fn with_profile(loaded: Loaded, profile: bool) -> Cluster {
        let mut model = loaded.model;
        // Without a file, a job across 3 hosts or more profiles the network
        // at start-up and orders its ring by what it found (`comm::order`):
        // the same procedure runs here on the model's rates. (Without racks
        // it finds one group and the order stays; skipped for speed.)
        let profiled = loaded.topo_file.clone().or_else(|| {
            let h = model.topo.nhosts();
            let racks = model
                .group_out
                .iter()
                .chain(&model.group_in)
                .any(|c| c.is_finite());
            (profile && racks && h >= 3).then(|| as_profile(&model))
        });
        let (topo, order, fabric) = match &profiled {
            Some(file) if model.topo.nhosts() == file.hosts.len() => {
                // Rank r's host is the file's host of the same index.
                let names: Vec<String> = (0..model.topo.nranks())
                    .map(|r| file.hosts[model.topo.host_of(r)].clone())
                    .collect();
                let source = if loaded.topo_file.is_some() {
                    "the topology file"
                } else {
                    "the start-up profile"
                };
                let (t, choice, fabric) =
                    choose_by(model.topo.clone(), &|r| names[r].as_str(), file, source);
                (t, choice, fabric)
            }
            _ => {
                let choice = crate::comm::order::OrderChoice {
                    why: "hosts by lowest rank (the spec's host order)".into(),
                    ..Default::default()
                };
                (model.topo.clone(), choice, None)
            }
        };
        model.topo = topo.clone();
        let cost = calibrated(&model);
        let why = order.why.clone();
        let auto = Auto {
            topo,
            order,
            fabric: fabric.map(Arc::new),
            tuned: None,
            model: (model.topo.nhosts() > 1).then_some(cost),
            measured_at_start: true,
        };
        Cluster {
            model,
            auto,
            order: why,
        }
    }

    pub fn nranks(&self) -> usize {
        self.model.topo.nranks()
    }

    /// Rank r's schedule of the library's barrier on this cluster: what
    /// `cadence bench` runs between samples.
    fn barrier(&self) -> Result<impl Fn(usize) -> Result<Schedule, String> + Sync + '_, String> {
        let args = CollArgs {
            kind: CollKind::Barrier,
            root: 0,
            counts: vec![],
        };
        let (algo, _) = select_algo_on(&AlgoOverride::default(), &args, &self.auto, 1, None)?;
        Ok(move |r| schedule::build_on(&args, r, &self.auto.topo, algo).map_err(|e| e.to_string()))
    }

    /// Simulates `kind` on a full buffer of `count` elements of
    /// `elem_size` bytes (as `cadence bench` sizes them) with `algo`, or
    /// the library's choice when None; returns what ran and the outcome.
    ///
    /// `calls` > 1, or shaped links, time it as `cadence bench` does:
    /// samples of a barrier then `calls` calls back to back; `seconds` is
    /// one call of the last sample (from its barrier's end), once shaped
    /// links' buckets have settled into what such samples leave them (8
    /// samples; 2 on links without buckets, where only the first sample
    /// differs). The barrier is the library's own, and it matters on
    /// shaped links: the buckets refill while it runs. Err: the algorithm
    /// does not apply, or the size holds no element.
    pub fn run(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        algo: Option<Algo>,
        calls: usize,
    ) -> Result<(Algo, Outcome), String> {
        let args = args_for(kind, self.nranks(), count)?;
        let (algo, _) =
            select_algo_on(&AlgoOverride::default(), &args, &self.auto, elem_size, algo)?;
        let topo: &Topology = &self.auto.topo;
        let build = |r| schedule::build_on(&args, r, topo, algo).map_err(|e| e.to_string());
        let shaped = self.model.shaper.is_some();
        if calls <= 1 && !shaped {
            return Ok((algo, simulate_calls(build, &self.model, elem_size, 1)?));
        }
        let calls = calls.max(1);
        let samples = if shaped { 8 } else { 2 };
        let sample = std::iter::once(Unit::Gap).chain(std::iter::repeat_n(Unit::Call(0), calls));
        let program: Vec<Unit> = sample.collect::<Vec<_>>().repeat(samples);
        let barrier = self.barrier()?;
        let mut o = simulate_program(|r, _| build(r), barrier, &program, &self.model, elem_size)?;
        let ends = &o.call_ends;
        let last = ends.len() - 1;
        // ends[last - calls]: the last sample's barrier.
        o.seconds = (ends[last] - ends[last - calls]) / calls as f64;
        Ok((algo, o))
    }
}

/// How `cadence bench` times one size: `warmup` calls of each algorithm,
/// then `rounds` samples of each of a barrier and `calls` calls back to back.
#[derive(Clone, Copy, Debug)]
pub struct BenchTiming {
    pub calls: usize,
    pub rounds: usize,
    pub warmup: usize,
}

impl Cluster {
    /// `cadence bench --algo A,B,...` on this cluster, timed as it times
    /// them (`timing`): each algorithm's `warmup` calls (None: the
    /// library's choice), then `rounds` rounds in which each algorithm in turn (round i starts
    /// with algorithm i mod n) runs a sample, the library's barrier then
    /// `calls` calls back to back. Shaped links carry their buckets' state
    /// through all of it, so an algorithm's samples start with what the
    /// one before it left. Returns, per algorithm, what ran and the median
    /// of its samples' seconds per call.
    pub fn run_turns(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        algos: &[Option<Algo>],
        timing: BenchTiming,
    ) -> Result<Vec<(Algo, f64)>, String> {
        let BenchTiming {
            calls,
            rounds,
            warmup,
        } = timing;
        let args = args_for(kind, self.nranks(), count)?;
        let topo: &Topology = &self.auto.topo;
        let chosen: Vec<Algo> = algos
            .iter()
            .map(|&a| select_algo_on(&AlgoOverride::default(), &args, &self.auto, elem_size, a))
            .map(|r| r.map(|(a, _)| a))
            .collect::<Result<_, _>>()?;
        let n = chosen.len();
        if n == 0 || rounds == 0 {
            return Err("no algorithm or no round to time".into());
        }
        let calls = calls.max(1);
        let mut program: Vec<Unit> = (0..n)
            .flat_map(|k| std::iter::repeat_n(Unit::Call(k), warmup))
            .collect();
        // Where each sample starts in the program: (algorithm, index of its Gap).
        let mut samples = Vec::with_capacity(rounds * n);
        for i in 0..rounds {
            for j in 0..n {
                let k = (i + j) % n;
                samples.push((k, program.len()));
                program.push(Unit::Gap);
                program.extend(std::iter::repeat_n(Unit::Call(k), calls));
            }
        }
        let barrier = self.barrier()?;
        let build =
            |r, k: usize| schedule::build_on(&args, r, topo, chosen[k]).map_err(|e| e.to_string());
        let o = simulate_program(build, barrier, &program, &self.model, elem_size)?;
        let ends = &o.call_ends;
        let mut per_algo: Vec<Vec<f64>> = vec![Vec::new(); n];
        for (k, gap) in samples {
            per_algo[k].push((ends[gap + calls] - ends[gap]) / calls as f64);
        }
        Ok(chosen
            .into_iter()
            .zip(per_algo)
            .map(|(a, mut t)| {
                t.sort_by(f64::total_cmp);
                (a, median(&t))
            })
            .collect())
    }
}

/// The median of sorted `t` (the mean of the middle two for an even count,
/// as Python's `statistics.median`, which `cadence bench` reports).
fn median(t: &[f64]) -> f64 {
    let m = t.len() / 2;
    if t.len() % 2 == 1 {
        t[m]
    } else {
        (t[m - 1] + t[m]) / 2.0
    }
}

/// What a start-up profile finds on `m`: the library's procedure
/// (`fabric::probe`, with its start-up default of pairs up to 4 hosts) with each
/// round's rates from the model (max-min fair shares of the NICs and the
/// groups' uplinks).
fn as_profile(m: &Model) -> TopoFile {
    let h = m.topo.nhosts();
    let opts = probe::Options {
        pairs_max: probe::STARTUP_PAIRS_MAX,
        rings: false,
    };
    let mut run = |flows: &[Flow]| -> Result<Vec<f64>, ()> { Ok(m.host_flow_rates(flows)) };
    let found = probe::profile(h, opts, &mut run, &|_| {}).expect("the model never fails");
    TopoFile {
        version: VERSION,
        kind: KIND.into(),
        note: format!(
            "what a start-up profile ({}) finds on the model",
            found.method
        ),
        hosts: (0..h).map(|i| format!("h{i}")).collect(),
        rates: found.rates,
        host_rates: found.host_rates,
        groups: found.groups,
        group_out: found.group_out,
        group_in: found.group_in,
        patterns: serde_json::Value::Null,
        profile: serde_json::Value::Null,
    }
}

/// The cost model a start-up calibration would measure on `m`: α and β of
/// each transport, γ (the fabric, when measured, prices the rest).
fn calibrated(m: &Model) -> CostModel {
    let slowest_nic = m
        .nic_out
        .iter()
        .chain(&m.nic_in)
        .copied()
        .fold(f64::INFINITY, f64::min);
    CostModel {
        shm: LinkCost {
            alpha: m.shm_alpha,
            beta: 1.0 / m.shm_rate.min(m.mem_rate),
        },
        tcp: LinkCost {
            alpha: m.tcp_alpha,
            beta: 1.0 / slowest_nic,
        },
        gamma: m.gamma,
        ..CostModel::default()
    }
}

/// The call's arguments for a full buffer of `count` elements on `n`
/// ranks, laid out as `cadence bench` lays them out.
pub fn args_for(kind: CollKind, n: usize, count: usize) -> Result<CollArgs, String> {
    let part = count / n.max(1);
    let counts = match kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => vec![count],
        CollKind::AllGather | CollKind::ReduceScatter => vec![part; n],
        // `count`: one rank's input, `part` of it to each rank.
        CollKind::AllToAll => vec![part; n * n],
        _ => return Err(format!("the simulator does not run {kind}")),
    };
    if counts.iter().all(|&c| c == 0) {
        return Err(format!(
            "{count} elements hold nothing to send for {kind} on {n} ranks"
        ));
    }
    Ok(CollArgs {
        kind,
        root: 0,
        counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::spec::parse;
    use std::path::Path;

    #[test]
    fn auto_runs_what_the_library_would_choose_and_algorithms_run_by_name() {
        let text = r#"{"version": 1, "kind": "cadence-cluster", "hosts": 8,
            "nic": {"rate": "10gbit", "latency_us": 20}}"#;
        let c = Cluster::new(parse(text, Path::new("s.json"), None).unwrap());
        assert!(c.order.contains("hosts by lowest rank"), "{}", c.order);
        let (small, o) = c.run(CollKind::AllReduce, 2, 4, None, 1).unwrap();
        assert!(o.seconds > 0.0);
        let (big, _) = c.run(CollKind::AllReduce, 16 << 20, 4, None, 1).unwrap();
        assert_ne!(small, big, "one algorithm for 8 B and 64 MiB");
        let (ring, o) = c
            .run(CollKind::AllReduce, 16 << 20, 4, Some(Algo::Ring), 1)
            .unwrap();
        assert_eq!(ring, Algo::Ring);
        // 2 (n-1)/n of 64 MiB at 1.25 GB/s, at least.
        assert!(
            o.seconds > 2.0 * 7.0 / 8.0 * 64.0 * 1048576.0 / 1.25e9,
            "{o:?}"
        );
        let e = c.run(CollKind::AllGather, 3, 4, None, 1).unwrap_err();
        assert!(e.contains("hold nothing"), "{e}");
    }

    #[test]
    fn algorithms_in_turns_time_as_alone_where_links_keep_no_credit() {
        // Unshaped links carry nothing from one sample to the next: each
        // algorithm's median sample in turns is its time alone (a barrier,
        // then the calls), which checks which sample is whose.
        let text = r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4,
            "nic": {"rate": "10gbit", "latency_us": 20}}"#;
        let c = Cluster::new(parse(text, Path::new("s.json"), None).unwrap());
        let algos = [Some(Algo::Ring), Some(Algo::Direct), None];
        let timing = BenchTiming {
            calls: 2,
            rounds: 5,
            warmup: 1,
        };
        let turns = c
            .run_turns(CollKind::AllGather, 1 << 16, 4, &algos, timing)
            .unwrap();
        assert_eq!(turns.len(), 3);
        for (&a, &(ran, t)) in algos.iter().zip(&turns) {
            let (alone_ran, o) = c.run(CollKind::AllGather, 1 << 16, 4, a, 2).unwrap();
            assert_eq!(ran, alone_ran);
            assert!(
                (t - o.seconds).abs() <= 1e-9 * o.seconds,
                "{ran:?}: {t} vs {o:?}"
            );
        }
        assert!(
            turns[0].1 != turns[1].1,
            "ring and direct took the same time"
        );
        let e = c.run_turns(CollKind::AllGather, 1 << 16, 4, &[], timing);
        assert!(e.is_err());
    }

    #[test]
    fn interleaved_racks_are_ordered_as_the_start_up_profile_would() {
        let text = r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4,
            "nic": {"rate": "1gbit"},
            "fabric": {"kind": "racks", "rack_of": [0, 1, 0, 1], "uplink": "250mbit"}}"#;
        let c = Cluster::new(parse(text, Path::new("s.json"), None).unwrap());
        let order = c.model.topo.host_order();
        assert!(
            order == [0, 2, 1, 3] || order == [0, 2, 3, 1],
            "{order:?}: {}",
            c.order
        );
        assert!(c.auto.fabric.is_some());
        // The found ring crosses each uplink once a step: 3 steps of a
        // 16 MiB block at 31.25 MB/s, about.
        let (_, o) = c
            .run(CollKind::AllGather, 4 << 22, 4, Some(Algo::Ring), 1)
            .unwrap();
        let want = 3.0 * (16 << 20) as f64 / 31.25e6;
        assert!(
            (o.seconds - want).abs() < 0.02 * want,
            "{} vs {want}",
            o.seconds
        );
    }
}
