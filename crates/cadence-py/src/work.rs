//! `Work`: an operation started with `async_op=True`, waited on from Python.

use crate::errors::DiagSlot;
use cadence_core::comm::{Completion, INTERRUPT_EVERY};
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An operation in flight. `wait()` returns the operation's result object.
///
/// The buffers are not held here: the request owns references to them
/// (`OpRequest::raw_buffers`' keep-alive), which the communicator drops only
/// after the operation finished. So dropping an unfinished Work, or never
/// waiting on it, cannot free memory the progress thread still writes.
#[pyclass(module = "cadence._core")]
pub(crate) struct Work {
    pub(crate) done: Arc<Completion>,
    /// What `wait()` returns; `None`: the sender's rank (a receive from any
    /// source).
    pub(crate) result: Option<PyObject>,
    pub(crate) diag: Arc<DiagSlot>,
}

#[pymethods]
impl Work {
    /// Blocks until the operation finishes (or `timeout` seconds pass, which
    /// raises TimeoutError); returns its result; raises CommError on failure.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyObject> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t));
        loop {
            // Wait in slices so that Ctrl-C (signal handlers) gets through.
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(INTERRUPT_EVERY),
                None => INTERRUPT_EVERY,
            };
            let done = self.done.clone();
            match py.allow_threads(move || done.wait(Some(slice))) {
                Some(Ok(())) => {
                    return Ok(match &self.result {
                        Some(r) => r.clone_ref(py),
                        None => self.done.source().into_pyobject(py)?.into_any().unbind(),
                    })
                }
                Some(Err(e)) => return Err(self.diag.error(py, e)),
                None => {}
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(PyTimeoutError::new_err(format!(
                    "operation still running after {:.3}s",
                    timeout.unwrap_or(0.0)
                )));
            }
        }
    }

    fn is_completed(&self) -> bool {
        self.done.is_done()
    }

    /// For a receive from any source: the rank it received from, once known
    /// (else None).
    #[getter]
    fn source(&self) -> Option<usize> {
        self.done.source()
    }
}
