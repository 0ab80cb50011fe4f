//! `Comm`, the communicator class: its properties, the collectives with
//! numpy/torch conveniences (in place, outputs made to fit), the generic
//! `_run` the Python API calls, and the hooks for dumps, metrics, profiling
//! and the live diagnosis.

use crate::buffers::{empty_like, shape_of, view};
use crate::call::{blocks_of, Call};
use crate::errors::{to_py_err, DiagSlot};
use crate::names::{parse_algo, parse_dtype, parse_kind, parse_op};
use cadence_core::comm::{Comm, InterruptCheck, ANY_SOURCE};
use cadence_core::{CollKind, RedOp};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A communicator over numpy arrays and CPU torch tensors (see python/cadence).
#[pyclass(module = "cadence._core", name = "Comm", frozen)]
pub(crate) struct PyComm {
    pub(crate) comm: Arc<Comm>,
    /// Runs Python's signal handlers while a blocking call waits, so Ctrl-C
    /// ends a hung collective; what a handler raised is kept in `signal`.
    pub(crate) interrupt: InterruptCheck,
    pub(crate) signal: Arc<Mutex<Option<PyErr>>>,
    pub(crate) diag: Arc<DiagSlot>,
}

impl PyComm {
    pub(crate) fn new(comm: Comm) -> PyComm {
        let signal: Arc<Mutex<Option<PyErr>>> = Arc::default();
        let slot = signal.clone();
        let interrupt: InterruptCheck = Arc::new(move || {
            Python::with_gil(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    *slot.lock().unwrap() = Some(e);
                    true
                }
            })
        });
        PyComm {
            comm: Arc::new(comm),
            interrupt,
            signal,
            diag: Arc::default(),
        }
    }
}

#[pymethods]
impl PyComm {
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.comm.nranks()
    }
    #[getter]
    fn id(&self) -> String {
        self.comm.id().to_string()
    }
    #[getter]
    fn hosts(&self) -> Vec<String> {
        self.comm.hosts()
    }
    #[getter]
    fn timeout(&self) -> f64 {
        self.comm.config().timeout.as_secs_f64()
    }

    /// The cost model `auto` ranks algorithms by, as a dict (seconds per
    /// message `alpha`, seconds per byte `beta`, per link class; `gamma`;
    /// `source`: "start-up" or "tuning table"), or None.
    fn cost_model<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((m, at_start)) = self.comm.cost_model() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (name, l) in [("shm", m.shm), ("tcp", m.tcp)] {
            let link = PyDict::new(py);
            link.set_item("alpha", l.alpha)?;
            link.set_item("beta", l.beta)?;
            d.set_item(name, link)?;
        }
        d.set_item("gamma", m.gamma)?;
        d.set_item("incast", m.incast)?;
        d.set_item("source", if at_start { "start-up" } else { "tuning table" })?;
        Ok(Some(d))
    }

    /// Runs the start-up calibration's procedure now (collective: every
    /// rank calls it) and returns rank 0's result, the same on every rank:
    /// `shm`/`tcp` as `{"alpha", "beta"}` (α already scaled by the loaded
    /// probe), None for a class this job lacks; `gamma`; `loaded_scale`;
    /// `measured`, the link classes measured. Installs nothing.
    fn calibrate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let comm = self.comm.clone();
        let c = py
            .allow_threads(move || comm.calibrate_cost_model())
            .map_err(|e| to_py_err(py, e))?;
        let d = PyDict::new(py);
        let mut measured = Vec::new();
        for (name, l, yes) in [
            ("shm", c.model.shm, c.shm_measured),
            ("tcp", c.model.tcp, c.tcp_measured),
        ] {
            if yes {
                let link = PyDict::new(py);
                link.set_item("alpha", l.alpha)?;
                link.set_item("beta", l.beta)?;
                d.set_item(name, link)?;
                measured.push(name);
            } else {
                d.set_item(name, py.None())?;
            }
        }
        d.set_item("gamma", c.model.gamma)?;
        d.set_item("loaded_scale", c.loaded_scale)?;
        d.set_item("measured", measured)?;
        Ok(d)
    }

    /// The algorithms of `kind` that apply on this communicator's hosts
    /// (hierarchical ones need the same number of ranks on every host).
    fn algorithms(&self, kind: &str) -> PyResult<Vec<&'static str>> {
        let k = parse_kind(kind)?;
        Ok(self
            .comm
            .algorithms_for(k)
            .into_iter()
            .map(|a| a.name())
            .collect())
    }

    /// The algorithm a call of `kind` with `counts` (as `_run` takes them)
    /// of `dtype` would run here, by name, without running it.
    fn choose(
        &self,
        py: Python<'_>,
        kind: &str,
        counts: Vec<usize>,
        dtype: &str,
    ) -> PyResult<&'static str> {
        let k = parse_kind(kind)?;
        let dt = parse_dtype(dtype)?;
        let algo = self
            .comm
            .choose(k, counts, dt)
            .map_err(|e| to_py_err(py, e))?;
        Ok(algo.name())
    }

    /// allreduce(x, out=None, op="sum", factor=None, algo=None, async_op=False)
    ///
    /// Reduces `x` over all ranks. In place when `out` is None; returns the
    /// array holding the result (or a Work when `async_op`).
    #[pyo3(signature = (x, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn allreduce<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, out.is_none(), "allreduce", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let output = match out {
            Some(o) => {
                let v = view(py, &o, true, "allreduce", "output")?;
                (o, v)
            }
            // In place: the same view serves as output.
            None => (x.clone(), inp),
        };
        let result = output.0.clone().unbind();
        let call = Call::new(CollKind::AllReduce, 0, vec![count], async_op, result);
        self.call(
            py,
            Call {
                input: Some((x, inp)),
                output: Some(output),
                op,
                algo,
                ..call
            },
        )
    }

    /// broadcast(x, root=0, algo=None, async_op=False) -> x
    ///
    /// Copies root's `x` into every rank's `x` (in place). Native, as
    /// allreduce: a small call's latency is mostly the path to the engine.
    #[pyo3(signature = (x, root=0, algo=None, async_op=false))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: usize,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let v = view(py, &x, true, "broadcast", "buffer")?;
        let count = v.bytes / v.dtype.size();
        let result = x.clone().unbind();
        let call = Call::new(CollKind::Broadcast, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                output: Some((x, v)),
                algo,
                ..call
            },
        )
    }

    /// reduce(x, root=0, out=None, op="sum", factor=None, algo=None,
    /// async_op=False)
    ///
    /// Reduces to `root`: its result lands in `out` (default: `x`, in
    /// place). Returns the result at the root, None elsewhere.
    #[pyo3(signature = (x, root=0, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: usize,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let at_root = self.comm.rank() == root;
        let in_place = at_root && out.is_none();
        let inp = view(py, &x, in_place, "reduce", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let output = match (at_root, out) {
            (false, _) => None,
            (true, Some(o)) => {
                let v = view(py, &o, true, "reduce", "output")?;
                Some((o, v))
            }
            (true, None) => Some((x.clone(), inp)),
        };
        let result = match &output {
            Some((o, _)) => o.clone().unbind(),
            None => py.None(),
        };
        let call = Call::new(CollKind::Reduce, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                input: Some((x, inp)),
                output,
                op,
                algo,
                ..call
            },
        )
    }

    /// send(x, dst, async_op=False): sends `x` to rank `dst` (matched by a
    /// `recv` there, in order).
    #[pyo3(signature = (x, dst, async_op=false))]
    fn send<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        dst: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let v = view(py, &x, false, "send", "input")?;
        let count = v.bytes / v.dtype.size();
        let call = Call::new(CollKind::Send, dst, vec![count], async_op, py.None());
        self.call(
            py,
            Call {
                input: Some((x, v)),
                ..call
            },
        )
    }

    /// recv(out, src=None, async_op=False): receives into `out` from rank
    /// `src`; returns `out`. With `src=None`, from whichever rank sends to
    /// this one first (a send of `out`'s size), and returns that rank.
    #[pyo3(signature = (out, src=None, async_op=false))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        out: Bound<'py, PyAny>,
        src: Option<usize>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let v = view(py, &out, true, "recv", "output")?;
        let count = v.bytes / v.dtype.size();
        let result = out.clone().unbind();
        let root = src.unwrap_or(ANY_SOURCE);
        let call = Call::new(CollKind::Recv, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                output: Some((out, v)),
                ..call
            },
        )
    }

    /// allgather(x, out=None, algo=None, async_op=False): gathers every
    /// rank's `x` into `out` of shape (size, *x.shape) (made when None).
    #[pyo3(signature = (x, out=None, algo=None, async_op=false))]
    fn allgather<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "allgather", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let out = match out {
            Some(o) => o,
            None => {
                let mut shape = vec![n];
                shape.extend(shape_of(&x)?);
                empty_like(py, &x, shape)?
            }
        };
        self.collect(
            py,
            CollKind::AllGather,
            x,
            inp,
            out,
            RedOp::Sum,
            vec![count; n],
            algo,
            async_op,
        )
    }

    /// reduce_scatter(x, out=None, op="sum", factor=None, algo=None,
    /// async_op=False): reduces `x` over ranks and leaves block `rank` (of
    /// `size` equal blocks) in `out`.
    #[pyo3(signature = (x, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "reduce_scatter", "input")?;
        let total = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let block = blocks_of("reduce_scatter", total, n)?;
        let out = match out {
            Some(o) => o,
            None => {
                let shape = shape_of(&x)?;
                let shape = match shape.split_first() {
                    Some((&first, rest)) if first % n == 0 => {
                        let mut s = vec![first / n];
                        s.extend_from_slice(rest);
                        s
                    }
                    _ => vec![block],
                };
                empty_like(py, &x, shape)?
            }
        };
        self.collect(
            py,
            CollKind::ReduceScatter,
            x,
            inp,
            out,
            op,
            vec![block; n],
            algo,
            async_op,
        )
    }

    /// alltoall(x, out=None, algo=None, async_op=False): block d of `x`
    /// goes to rank d; block s of `out` (x's shape when made) comes from
    /// rank s.
    #[pyo3(signature = (x, out=None, algo=None, async_op=false))]
    fn alltoall<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "alltoall", "input")?;
        let total = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let block = blocks_of("alltoall", total, n)?;
        let out = match out {
            Some(o) => o,
            None => empty_like(py, &x, shape_of(&x)?)?,
        };
        self.collect(
            py,
            CollKind::AllToAll,
            x,
            inp,
            out,
            RedOp::Sum,
            // The row every rank sends (the same everywhere): O(n) a call.
            vec![block; n],
            algo,
            async_op,
        )
    }

    /// barrier(async_op=False): returns when every rank has entered it.
    #[pyo3(signature = (async_op=false))]
    fn barrier(&self, py: Python<'_>, async_op: bool) -> PyResult<PyObject> {
        let call = Call::new(CollKind::Barrier, 0, Vec::new(), async_op, py.None());
        self.call(py, call)
    }

    /// The generic entry point the Python API uses for every collective:
    /// `_run(kind, input, output, op, factor, root, counts, dtype, algo,
    /// async_op, result)`; `counts` as in the schedule layer's table.
    #[pyo3(signature = (kind, input, output, op, factor, root, counts, dtype, algo, async_op, result))]
    #[allow(clippy::too_many_arguments)]
    fn _run<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        input: Option<Bound<'py, PyAny>>,
        output: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        root: usize,
        counts: Vec<usize>,
        dtype: Option<&str>,
        algo: Option<&str>,
        async_op: bool,
        result: PyObject,
    ) -> PyResult<PyObject> {
        let kind = parse_kind(kind)?;
        let name = kind.name();
        let input = match input {
            Some(o) => {
                let v = view(py, &o, false, name, "input")?;
                Some((o, v))
            }
            None => None,
        };
        let output = match output {
            Some(o) => {
                let v = view(py, &o, true, name, "output")?;
                Some((o, v))
            }
            None => None,
        };
        let dtype = dtype.map(parse_dtype).transpose()?;
        self.call(
            py,
            Call {
                kind,
                input,
                output,
                op: parse_op(op, factor)?,
                root,
                counts,
                dtype,
                algo: parse_algo(algo)?,
                async_op,
                result,
            },
        )
    }

    /// Element type cadence sees for `x` ("float32", "bfloat16", ...).
    fn dtype_of(&self, py: Python<'_>, x: Bound<'_, PyAny>) -> PyResult<&'static str> {
        Ok(view(py, &x, false, "dtype_of", "buffer")?.dtype.name())
    }

    /// The flight recorder (last operations and their messages), link
    /// counters and this rank's identity, as JSON (the dump format).
    /// `last`: the newest `last` operations only.
    #[pyo3(signature = (last=None))]
    fn dump_records(&self, py: Python<'_>, last: Option<usize>) -> String {
        let comm = self.comm.clone();
        py.allow_threads(move || match last {
            Some(n) => comm.dump_recent(n),
            None => comm.dump_records(),
        })
    }

    /// `Comm::dump_round`: the newest `last` operations as the live
    /// watchdog sends them in a round (every rank listed in rank 0's only).
    fn dump_round(&self, py: Python<'_>, last: usize) -> String {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.dump_round(last))
    }

    /// The ranks of this rank's host, ascending (the first leads it).
    fn host_ranks(&self) -> Vec<usize> {
        self.comm.host_ranks()
    }

    /// Each host's lowest rank, ascending.
    fn host_leaders(&self) -> Vec<usize> {
        self.comm.host_leaders()
    }

    /// The process id rank `rank` reported at set-up.
    fn peer_pid(&self, rank: usize) -> PyResult<u32> {
        if rank >= self.comm.nranks() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "rank {rank} of {}",
                self.comm.nranks()
            )));
        }
        Ok(self.comm.peer_pid(rank))
    }

    /// The operations that completed in a slowness window (Unix ns, end
    /// excluded), the newest `last`, as a dump with only their timed
    /// receives of at least `min_recv_bytes`; None when there were none.
    fn dump_window(
        &self,
        py: Python<'_>,
        from_unix_ns: u64,
        to_unix_ns: u64,
        last: usize,
        min_recv_bytes: u64,
    ) -> Option<String> {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.dump_window(from_unix_ns, to_unix_ns, last, min_recv_bytes))
    }

    /// Cumulative totals for metrics as JSON: operations, bytes and a
    /// duration histogram per collective kind, every link's counters, the
    /// oldest running operation (cadence.diagnosis.metrics reads it at
    /// scrape time). Never waits for a running operation.
    fn metrics(&self, py: Python<'_>) -> String {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.metrics())
    }

    /// Profiles the network between the communicator's hosts (collective:
    /// every rank calls it) and returns the topology file as JSON text, the
    /// same on every rank. `progress`: rank 0 prints a line per stage with
    /// this prefix (to stdout); `rings`: also measure the rank-order and
    /// the found ring under load; `pairs_max`: most hosts whose every pair
    /// is measured alone (16), beyond that shifted rounds only.
    #[pyo3(signature = (seconds=0.05, rings=true, note=String::new(), progress=None, pairs_max=None))]
    fn profile_topology(
        &self,
        py: Python<'_>,
        seconds: f64,
        rings: bool,
        note: String,
        progress: Option<String>,
        pairs_max: Option<usize>,
    ) -> PyResult<String> {
        use cadence_core::comm::profile::ProfileOptions;
        use std::io::Write;
        if !(seconds > 0.0 && seconds.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "seconds must be positive, not {seconds}"
            )));
        }
        let comm = self.comm.clone();
        let opts = ProfileOptions {
            seconds,
            rings,
            pairs_max: pairs_max.unwrap_or(cadence_core::fabric::probe::PAIRS_MAX),
            note,
        };
        let say = move |m: &str| {
            if let Some(prefix) = &progress {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{prefix}{m}");
                let _ = out.flush();
            }
        };
        let file = py
            .allow_threads(move || comm.profile_topology(&opts, &say))
            .map_err(|e| to_py_err(py, e))?;
        Ok(file.to_text())
    }

    /// Writes the dump into directory `dir`; returns the file's path.
    /// `reason`: what the dump's `reason` says (default "on demand").
    #[pyo3(signature = (dir, reason=None))]
    fn dump(
        &self,
        py: Python<'_>,
        dir: std::path::PathBuf,
        reason: Option<String>,
    ) -> PyResult<String> {
        let comm = self.comm.clone();
        let reason = reason.unwrap_or_else(|| "on demand".to_string());
        let path = py
            .allow_threads(move || comm.dump_to_because(&dir, &reason))
            .map_err(|e| PyOSError::new_err(format!("cannot write the dump: {e}")))?;
        Ok(path.display().to_string())
    }

    #[getter]
    fn job(&self) -> String {
        self.comm.job().to_string()
    }

    /// This rank's wall clock against rank 0's: (offset ns, error ns, method).
    #[getter]
    fn clock_offset(&self) -> (i64, u64, &'static str) {
        let c = self.comm.clock_offset();
        (c.offset_ns, c.error_ns, c.method)
    }

    /// For the live watchdog: (operations started, and the oldest running
    /// one as (seq, collective, seconds it has run) or None).
    fn _progress(&self) -> (u64, Option<(u64, &'static str, f64)>) {
        let p = self.comm.progress();
        let running = p.running.map(|r| {
            let secs = p.now_ns.saturating_sub(r.start_ns) as f64 / 1e9;
            (r.seq, r.collective, secs)
        });
        (p.total_ops, running)
    }

    /// For the live watchdog: the verdict `e.diagnosis` carries (None
    /// clears it), and for how many seconds one is being worked out (an
    /// error raised meanwhile waits for it; None: nothing pending).
    #[pyo3(signature = (verdict, pending_s=None))]
    fn _set_diagnosis(&self, verdict: Option<PyObject>, pending_s: Option<f64>) {
        let pending = pending_s.map(|s| Duration::from_secs_f64(s.max(0.0)));
        self.diag.set(verdict, pending);
    }

    /// For the live watchdog: a round is being worked out for `pending_s`
    /// seconds. Unlike `_set_diagnosis(None, s)` it keeps a verdict already
    /// held: that one is about the hang still going on (the watchdog clears
    /// verdicts on recovery), and an error raised now must not wait for a
    /// second round that another stuck operation opened, whose coordinator
    /// may fail and leave before it publishes.
    fn _diagnosis_pending(&self, pending_s: f64) {
        self.diag
            .pending(Duration::from_secs_f64(pending_s.max(0.0)));
    }

    /// Finishes queued operations and stops the progress thread.
    fn close(&self, py: Python<'_>) {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.close())
    }

    /// Fails the communicator on purpose and tells every peer `reason`.
    fn abort(&self, py: Python<'_>, reason: &str) {
        let comm = self.comm.clone();
        let reason = reason.to_string();
        py.allow_threads(move || comm.abort(&reason))
    }

    /// Test hook: writes garbage bytes on the TCP link to `peer`.
    fn _inject_garbage(&self, py: Python<'_>, peer: usize) -> PyResult<()> {
        self.comm.inject_garbage(peer).map_err(|e| to_py_err(py, e))
    }
}
