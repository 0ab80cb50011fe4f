//! One collective at one size on a modeled cluster, as the library would
//! run it there: the ring order the library takes from a topology file,
//! `auto` chosen by the library's own selection code (`comm::select`,
//! priced with the cost model a start-up calibration would measure on this
//! cluster), and the schedules from the library's generators.

use super::exec::{simulate_with, Model, Outcome};
use super::spec::Loaded;
use crate::comm::order::choose_by;
use crate::comm::select::{select_algo_on, Auto};
use crate::config::AlgoOverride;
use crate::schedule::{self, Algo, CollArgs, CostModel, LinkCost, Topology};
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
        let mut model = loaded.model;
        let (topo, order, fabric) = match &loaded.topo_file {
            Some(file) if model.topo.nhosts() == file.hosts.len() => {
                // Rank r's host is the file's host of the same index.
                let names: Vec<String> = (0..model.topo.nranks())
                    .map(|r| file.hosts[model.topo.host_of(r)].clone())
                    .collect();
                let (t, choice, fabric) =
                    choose_by(model.topo.clone(), &names, file, "the topology file");
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

    /// Simulates `kind` on a full buffer of `count` elements of
    /// `elem_size` bytes (as `cadence bench` sizes them) with `algo`, or
    /// the library's choice when None; returns what ran and the outcome.
    /// Err: the algorithm does not apply, or the size holds no element.
    pub fn run(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        algo: Option<Algo>,
    ) -> Result<(Algo, Outcome), String> {
        let args = args_for(kind, self.nranks(), count)?;
        let (algo, _) =
            select_algo_on(&AlgoOverride::default(), &args, &self.auto, elem_size, algo)?;
        let topo: &Topology = &self.auto.topo;
        let outcome = simulate_with(
            |r| schedule::build_on(&args, r, topo, algo).map_err(|e| e.to_string()),
            &self.model,
            elem_size,
        )?;
        Ok((algo, outcome))
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
        CollKind::AllToAll => vec![part / n.max(1); n * n],
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
        let (small, o) = c.run(CollKind::AllReduce, 2, 4, None).unwrap();
        assert!(o.seconds > 0.0);
        let (big, _) = c.run(CollKind::AllReduce, 16 << 20, 4, None).unwrap();
        assert_ne!(small, big, "one algorithm for 8 B and 64 MiB");
        let (ring, o) = c
            .run(CollKind::AllReduce, 16 << 20, 4, Some(Algo::Ring))
            .unwrap();
        assert_eq!(ring, Algo::Ring);
        // 2 (n-1)/n of 64 MiB at 1.25 GB/s, at least.
        assert!(
            o.seconds > 2.0 * 7.0 / 8.0 * 64.0 * 1048576.0 / 1.25e9,
            "{o:?}"
        );
        let e = c.run(CollKind::AllGather, 3, 4, None).unwrap_err();
        assert!(e.contains("hold nothing"), "{e}");
    }
}
