//! `Bootstrap`: how ranks find each other before a communicator exists.

use crate::communicator::PyComm;
use crate::errors::to_py_err;
use crate::store::{PyObjectStore, PyStore};
use cadence_core::comm::{Bootstrap as CoreBootstrap, PeerInfo};
use cadence_core::{Config, JobSecret};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::net::IpAddr;
use std::time::Duration;

/// Bootstrap: `Bootstrap(comm_id, rank, size, host, ip, timeout, secret=b,
/// job=None)` listens; publish `info()` through the store; `connect([info of
/// every rank])`. `secret` (the job secret, non-empty, the same on every
/// rank) keys the handshake every TCP connection must pass; `job` names the
/// job in dumps (default: the communicator id).
#[pyclass(module = "cadence._core")]
pub(crate) struct Bootstrap {
    inner: Option<CoreBootstrap>,
}

#[pymethods]
impl Bootstrap {
    #[new]
    #[pyo3(signature = (comm_id, rank, size, host, ip, timeout=None, *, secret, job=None))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python signature
    fn new(
        py: Python<'_>,
        comm_id: &str,
        rank: usize,
        size: usize,
        host: &str,
        ip: &str,
        timeout: Option<f64>,
        secret: &[u8],
        job: Option<&str>,
    ) -> PyResult<Bootstrap> {
        let secret = JobSecret::new(secret).map_err(PyValueError::new_err)?;
        let mut cfg = Config::from_env().map_err(PyValueError::new_err)?;
        if let Some(t) = timeout {
            if !(t > 0.0 && t.is_finite()) {
                return Err(PyValueError::new_err(
                    "timeout must be a positive number of seconds",
                ));
            }
            cfg.timeout = Duration::from_secs_f64(t);
        }
        // One address, or one per NIC separated by commas.
        let ips: Vec<IpAddr> = ip
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .map_err(|_| PyValueError::new_err(format!("bad IP address {a:?}")))
            })
            .collect::<PyResult<_>>()?;
        let mut b = CoreBootstrap::with_nics(comm_id, rank, size, host, &ips, cfg, secret)
            .map_err(|e| to_py_err(py, e))?;
        if let Some(job) = job {
            b.set_job(job).map_err(|e| to_py_err(py, e))?;
        }
        Ok(Bootstrap { inner: Some(b) })
    }

    /// This rank's address record (JSON) to publish.
    fn info(&self) -> PyResult<String> {
        let b = self
            .inner
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        Ok(serde_json::to_string(&b.info).expect("serializable"))
    }

    /// Joins through `store` (a `cadence.Store`, or any object with torch
    /// Store's `set`/`get`) under the keys `prefix/...`: two store
    /// operations, the peer table completed among the ranks, then the links.
    /// `wait` (seconds): how long to wait for the other ranks to join
    /// (default: the timeout).
    #[pyo3(signature = (store, prefix, wait=None))]
    fn join(
        &mut self,
        py: Python<'_>,
        store: &Bound<'_, PyAny>,
        prefix: &str,
        wait: Option<f64>,
    ) -> PyResult<PyComm> {
        let b = self
            .inner
            .take()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        let wait = match wait {
            Some(w) if w > 0.0 && w.is_finite() => Duration::from_secs_f64(w),
            Some(_) => return Err(PyValueError::new_err("wait must be a positive number")),
            None => b.config().timeout,
        };
        let prefix = prefix.to_string();
        let comm = if let Ok(s) = store.downcast::<PyStore>() {
            let client = s.get().client.clone();
            py.allow_threads(move || b.join_within(client.as_ref(), &prefix, wait))
        } else {
            let adapter = PyObjectStore(store.clone().unbind());
            py.allow_threads(move || b.join_within(&adapter, &prefix, wait))
        }
        .map_err(|e| to_py_err(py, e))?;
        Ok(PyComm::new(comm))
    }

    /// The ports this rank listens on, one per NIC.
    fn ports(&self) -> PyResult<Vec<u16>> {
        let b = self
            .inner
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        Ok(b.ports())
    }

    /// Sets up a split of `parent` without the store: `members` are the
    /// parent ranks in the new order, `ports[i]` where member i listens,
    /// `clocks[i]` its (offset_ns, error_ns) to the parent's rank 0.
    fn connect_split(
        &mut self,
        py: Python<'_>,
        parent: &PyComm,
        members: Vec<usize>,
        ports: Vec<Vec<u16>>,
        clocks: Vec<(i64, u64)>,
    ) -> PyResult<PyComm> {
        let b = self
            .inner
            .take()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        let parent = parent.comm.clone();
        let comm = py
            .allow_threads(move || b.connect_split(&parent, &members, &ports, &clocks))
            .map_err(|e| to_py_err(py, e))?;
        Ok(PyComm::new(comm))
    }

    /// Connects to every peer; `infos[r]` is rank r's `info()`.
    fn connect(&mut self, py: Python<'_>, infos: Vec<String>) -> PyResult<PyComm> {
        let b = self
            .inner
            .take()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        let parsed = infos
            .iter()
            .map(|s| serde_json::from_str::<PeerInfo>(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(format!("bad peer info: {e}")))?;
        let comm = py
            .allow_threads(move || b.connect(parsed))
            .map_err(|e| to_py_err(py, e))?;
        Ok(PyComm::new(comm))
    }
}
