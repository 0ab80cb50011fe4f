//! `Store`: the core's own rendezvous store for Python (`cadence.Store`),
//! with the methods of torch's `Store` that cadence uses, and the adapter
//! that lets the core's bootstrap use any torch `Store` a user passes.

use cadence_core::rendezvous::{Store as CoreStore, StoreClient, StoreError, StoreServer};
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn store_err(e: StoreError) -> PyErr {
    match e {
        StoreError::Timeout { .. } => PyTimeoutError::new_err(e.to_string()),
        StoreError::Unreachable { .. } => PyConnectionError::new_err(e.to_string()),
        StoreError::Protocol(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Seconds from a float or a `datetime.timedelta`.
fn seconds(t: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let s: f64 = match t.call_method0("total_seconds") {
        Ok(v) => v.extract()?,
        Err(_) => t.extract()?,
    };
    if !(s >= 0.0 && s.is_finite()) {
        return Err(PyValueError::new_err(
            "a timeout is a non-negative number of seconds",
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn bytes_of(v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.downcast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    v.extract::<Vec<u8>>()
}

/// Store(host, port, *, is_server=False, timeout=300.0)
///
/// A key-value store for rendezvous: `is_server=True` serves it in this
/// process (on every address, at `port`; 0 picks one) and connects to it;
/// otherwise it connects to the server at `host:port`, waiting up to
/// `timeout` seconds for it to listen. Values are bytes; `get` and `wait`
/// wait up to the timeout for keys to be set.
#[pyclass(module = "cadence._core", name = "Store", frozen)]
pub(crate) struct PyStore {
    pub(crate) client: Arc<StoreClient>,
    /// Kept alive while any handle on it lives.
    server: Option<Arc<StoreServer>>,
    #[pyo3(get)]
    host: String,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (host, port, *, is_server=false, timeout=None))]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        is_server: bool,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStore> {
        let timeout = match timeout {
            Some(t) => seconds(t)?,
            None => Duration::from_secs(300),
        };
        let (server, port) = if is_server {
            let bind: SocketAddr = SocketAddr::from(([0, 0, 0, 0], port));
            let s = StoreServer::start(bind).map_err(|e| {
                PyConnectionError::new_err(format!("cannot serve the Store on port {port}: {e}"))
            })?;
            let p = s.addr().port();
            (Some(Arc::new(s)), p)
        } else {
            (None, port)
        };
        let log = std::env::var("CADENCE_DEBUG")
            .map(|v| v.eq_ignore_ascii_case("info") || v.eq_ignore_ascii_case("trace"))
            .unwrap_or(false)
            .then(|| format!("cadence pid {}", std::process::id()));
        let h = host.to_string();
        let client = py
            .allow_threads(move || StoreClient::connect(&h, port, timeout, log.as_deref()))
            .map_err(store_err)?;
        Ok(PyStore {
            client: Arc::new(client),
            server,
            host: host.to_string(),
            port,
        })
    }

    /// Another handle on the same connection with its own `timeout`
    /// (seconds): the watchdog's. Its requests are short and take turns
    /// with the application's; a rank holds one connection to the store,
    /// so the server (rank 0) holds one per rank.
    fn client(&self, timeout: f64) -> PyStore {
        let t = Duration::from_secs_f64(timeout.max(0.0));
        PyStore {
            client: Arc::new(self.client.with_timeout(t)),
            server: self.server.clone(),
            host: self.host.clone(),
            port: self.port,
        }
    }

    /// Whether this process serves the store.
    #[getter]
    fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// How long `get` and `wait` wait (a `datetime.timedelta`, as torch's).
    #[getter]
    fn timeout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let td = py.import("datetime")?.getattr("timedelta")?;
        td.call1((0, self.client.timeout().as_secs_f64()))
    }

    fn set_timeout(&self, timeout: &Bound<'_, PyAny>) -> PyResult<()> {
        self.client.set_timeout(seconds(timeout)?);
        Ok(())
    }

    fn set(&self, py: Python<'_>, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = bytes_of(value)?;
        let c = self.client.clone();
        py.allow_threads(move || c.set(key, &v)).map_err(store_err)
    }

    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.client.clone();
        let t = c.timeout();
        let v = py.allow_threads(move || c.get(key, t)).map_err(store_err)?;
        Ok(PyBytes::new(py, &v))
    }

    fn add(&self, py: Python<'_>, key: &str, amount: i64) -> PyResult<i64> {
        let c = self.client.clone();
        py.allow_threads(move || c.add(key, amount))
            .map_err(store_err)
    }

    fn check(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<bool> {
        let c = self.client.clone();
        py.allow_threads(move || {
            let k: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.check(&k)
        })
        .map_err(store_err)
    }

    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        expected: &Bound<'py, PyAny>,
        desired: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (e, d) = (bytes_of(expected)?, bytes_of(desired)?);
        let c = self.client.clone();
        let v = py
            .allow_threads(move || c.compare_set(key, &e, &d))
            .map_err(store_err)?;
        Ok(PyBytes::new(py, &v))
    }

    fn delete_key(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        let c = self.client.clone();
        py.allow_threads(move || c.delete(key)).map_err(store_err)
    }

    #[pyo3(signature = (keys, timeout=None))]
    fn wait(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let t = match timeout {
            Some(t) => seconds(t)?,
            None => self.client.timeout(),
        };
        let c = self.client.clone();
        py.allow_threads(move || {
            let k: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.wait(&k, t)
        })
        .map_err(store_err)
    }

    fn num_keys(&self, py: Python<'_>) -> PyResult<u64> {
        let c = self.client.clone();
        py.allow_threads(move || c.num_keys()).map_err(store_err)
    }

    fn __repr__(&self) -> String {
        let role = if self.server.is_some() {
            ", serving"
        } else {
            ""
        };
        format!("cadence.Store({}:{}{role})", self.host, self.port)
    }
}

/// Any Python object with torch's `Store` methods (`set`, `get`), as the
/// core's bootstrap sees a store. Each call takes the GIL.
pub(crate) struct PyObjectStore(pub(crate) PyObject);

impl CoreStore for PyObjectStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Python::with_gil(|py| {
            self.0
                .call_method1(py, "set", (key, PyBytes::new(py, value)))
                .map(drop)
                .map_err(|e| py_store_err(py, e, key))
        })
    }
    /// torch's `get` waits for the key up to the store's own timeout.
    fn get(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>, StoreError> {
        Python::with_gil(|py| {
            let v = self
                .0
                .call_method1(py, "get", (key,))
                .map_err(|e| py_store_err(py, e, key))?;
            v.extract::<Vec<u8>>(py)
                .map_err(|e| StoreError::Protocol(format!("get({key:?}) returned {e}")))
        })
    }
}

fn py_store_err(py: Python<'_>, e: PyErr, key: &str) -> StoreError {
    let text = e.to_string();
    if e.is_instance_of::<PyTimeoutError>(py) || text.to_ascii_lowercase().contains("timeout") {
        StoreError::Timeout {
            key: key.to_string(),
            secs: 0.0,
        }
    } else {
        StoreError::Unreachable {
            addr: "given to cadence".into(),
            detail: format!("failed: {text}"),
        }
    }
}
