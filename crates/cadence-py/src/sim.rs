//! `SimCluster`: the cluster model behind `cadence sim`, running the core's
//! schedules on a modeled network instead of sockets.

use crate::names::{algo_named, parse_algo, parse_kind};
use crate::sim_fault::fault_of;
use crate::sim_windows::SimRecording;
use cadence_core::schedule;
use cadence_core::sim::run::{args_for, BenchTiming, Cluster};
use cadence_core::sim::spec;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A modeled cluster for `cadence sim`: a spec or topology file's
/// text (`origin`: its path, for messages and relative files) for `ranks`
/// ranks (None: the spec's own hosts × ranks per host). `profile=False`:
/// as a job with `CADENCE_TOPO_FILE=none` (no start-up profile).
#[pyclass(frozen)]
pub(crate) struct SimCluster {
    cluster: Cluster,
    note: String,
}

#[pymethods]
impl SimCluster {
    #[new]
    #[pyo3(signature = (text, origin, ranks=None, profile=true))]
    fn new(text: &str, origin: &str, ranks: Option<usize>, profile: bool) -> PyResult<SimCluster> {
        let loaded = spec::parse(text, std::path::Path::new(origin), ranks)
            .map_err(|e| PyValueError::new_err(format!("{origin}: {e}")))?;
        let note = loaded.note.clone();
        Ok(SimCluster {
            cluster: Cluster::with_profile(loaded, profile),
            note,
        })
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.cluster.nranks()
    }

    #[getter]
    fn nhosts(&self) -> usize {
        self.cluster.model.topo.nhosts()
    }

    #[getter]
    fn note(&self) -> &str {
        &self.note
    }

    /// One line: how the ring order was chosen.
    #[getter]
    fn order(&self) -> &str {
        &self.cluster.order
    }

    /// The model's numbers, for people and for `--json`.
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = &self.cluster.model;
        let d = PyDict::new(py);
        d.set_item("hosts", m.topo.nhosts())?;
        d.set_item("ranks", m.topo.nranks())?;
        d.set_item("nic_out", m.nic_out.clone())?;
        d.set_item("nic_in", m.nic_in.clone())?;
        d.set_item("group_of", m.group_of.clone())?;
        d.set_item("group_out", m.group_out.clone())?;
        d.set_item("group_in", m.group_in.clone())?;
        d.set_item("tcp_alpha", m.tcp_alpha)?;
        d.set_item("hop_alpha", m.hop_alpha)?;
        d.set_item("shm_alpha", m.shm_alpha)?;
        d.set_item("tcp_overhead", m.tcp_overhead)?;
        d.set_item("shm_overhead", m.shm_overhead)?;
        d.set_item("shm_rate", m.shm_rate)?;
        d.set_item("mem_rate", m.mem_rate)?;
        d.set_item("gamma", m.gamma)?;
        d.set_item("ring_order", m.topo.host_order())?;
        // (burst seconds, peak bytes/s) of shaped links, or None.
        d.set_item("shaper", m.shaper.map(|s| (s.burst, s.peak)))?;
        // Cores every rank shares (None: a core each), a message's floor
        // cost on them, a call's per rank, and their seconds per byte of
        // the network stacks.
        d.set_item("shared_cores", m.shared_cores)?;
        d.set_item("loaded_overhead", m.loaded_overhead)?;
        d.set_item("call_overhead", m.call_overhead)?;
        d.set_item("stack_cost", m.stack_cost)?;
        Ok(d)
    }

    /// The algorithms of `kind` that apply on this cluster, by name.
    fn algorithms(&self, kind: &str) -> PyResult<Vec<&'static str>> {
        let k = parse_kind(kind)?;
        let args = args_for(k, self.cluster.nranks(), 1 << 20).map_err(PyValueError::new_err)?;
        let topo = &self.cluster.auto.topo;
        Ok(schedule::algos_for(k)
            .iter()
            .filter(|&&a| schedule::applicable_on(&args, topo, a))
            .map(|a| a.name())
            .collect())
    }

    /// run(op, count, elem_size, algo=None, calls=1) -> (algo, seconds,
    /// messages): `op` on a full buffer of `count` elements, simulated;
    /// `algo` None runs the library's own choice. `calls` > 1: one call of
    /// samples of that many back to back, as `cadence bench` times them.
    #[pyo3(signature = (op, count, elem_size, algo=None, calls=1))]
    fn run(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        algo: Option<&str>,
        calls: usize,
    ) -> PyResult<(&'static str, f64, u64)> {
        let k = parse_kind(op)?;
        // Unlike elsewhere, "auto" is not a name here: None is the choice.
        let a = algo.map(algo_named).transpose()?;
        let out = py.allow_threads(|| self.cluster.run(k, count, elem_size, a, calls));
        let (algo, o) = out.map_err(PyValueError::new_err)?;
        Ok((algo.name(), o.seconds, o.messages))
    }

    /// run_turns(op, count, elem_size, algos, calls, rounds, warmup) ->
    /// [(algo, seconds)]: `cadence bench --algo A,B,...` simulated as it
    /// times them, the algorithms taking turns sample by sample (None in
    /// `algos`: the library's choice); per algorithm, the median of its
    /// samples' seconds per call.
    #[pyo3(signature = (op, count, elem_size, algos, calls, rounds, warmup))]
    #[allow(clippy::too_many_arguments)]
    fn run_turns(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        algos: Vec<Option<String>>,
        calls: usize,
        rounds: usize,
        warmup: usize,
    ) -> PyResult<Vec<(&'static str, f64)>> {
        let k = parse_kind(op)?;
        let algos = algos
            .iter()
            .map(|a| parse_algo(a.as_deref()))
            .collect::<PyResult<Vec<_>>>()?;
        let timing = BenchTiming {
            calls,
            rounds,
            warmup,
        };
        let out = py.allow_threads(|| self.cluster.run_turns(k, count, elem_size, &algos, timing));
        let ran = out.map_err(PyValueError::new_err)?;
        Ok(ran.into_iter().map(|(a, t)| (a.name(), t)).collect())
    }

    /// records(op, count, elem_size, calls, fault=None, hang_after=30.0)
    /// -> [str]: every rank makes `calls` calls of `op` on a full buffer of
    /// `count` elements (the library's choice of algorithm) with `fault`
    /// injected (a dict: `{"kind": "stop", "rank": 5, "call": 2}`,
    /// `{"kind": "hung-link", "src": 3, "dst": 11, "call": 2}`,
    /// `{"kind": "slow-rank", "rank": 5, "delay": 0.01}`,
    /// `{"kind": "slow-nic", "host": 2, "factor": 0.1}`; None: none).
    /// Returns per rank the JSON text of the dump it would leave, taken
    /// `hang_after` + 1 s after the run stalled (or just after it ended).
    #[pyo3(signature = (op, count, elem_size, calls, fault=None, hang_after=30.0))]
    #[allow(clippy::too_many_arguments)]
    fn records(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Option<&Bound<'_, PyDict>>,
        hang_after: f64,
    ) -> PyResult<Vec<String>> {
        let k = parse_kind(op)?;
        let fault = fault_of(fault)?;
        let out = py.allow_threads(|| {
            self.cluster
                .records(k, count, elem_size, calls, fault, hang_after)
        });
        Ok(out.map_err(PyValueError::new_err)?.texts)
    }

    /// windows(op, count, elem_size, calls, fault=None, window_s=10.0,
    /// min_recv_bytes=65536) -> [[str | None]]: the run `records` makes,
    /// its simulated time cut into windows of `window_s` from the start;
    /// per window, per rank, the JSON text of the record the rank would
    /// publish to the live slowness judge (`Comm.dump_window`: the
    /// operations that completed in the window, their timed receives of at
    /// least `min_recv_bytes`), None when it completed none in it.
    #[pyo3(signature = (op, count, elem_size, calls, fault=None, window_s=10.0, min_recv_bytes=65536))]
    #[allow(clippy::too_many_arguments)]
    fn windows(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Option<&Bound<'_, PyDict>>,
        window_s: f64,
        min_recv_bytes: u64,
    ) -> PyResult<Vec<Vec<Option<String>>>> {
        let k = parse_kind(op)?;
        let fault = fault_of(fault)?;
        let out = py.allow_threads(|| {
            self.cluster
                .window_records(k, count, elem_size, calls, fault, window_s, min_recv_bytes)
        });
        out.map_err(PyValueError::new_err)
    }

    /// recording(op, count, elem_size, calls, fault=None) -> SimRecording:
    /// the run `windows` makes, kept, to be cut into windows several ways.
    #[pyo3(signature = (op, count, elem_size, calls, fault=None))]
    fn recording(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<SimRecording> {
        let k = parse_kind(op)?;
        let fault = fault_of(fault)?;
        let out = py.allow_threads(|| self.cluster.windows(k, count, elem_size, calls, fault));
        Ok(SimRecording {
            run: out.map_err(PyValueError::new_err)?,
        })
    }

    /// sends_to(op, count, elem_size, rank) -> [int]: the ranks `rank`
    /// sends to in one call of `op` (the library's choice), ascending.
    fn sends_to(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        rank: usize,
    ) -> PyResult<Vec<usize>> {
        let k = parse_kind(op)?;
        py.allow_threads(|| self.cluster.sends_to(k, count, elem_size, rank))
            .map_err(PyValueError::new_err)
    }
}
