//! Errors out: the core's errors as Python exceptions, with the culprit rank
//! and the live diagnosis's verdict attached to a `CommError`.

use cadence_core::{CommError as CoreError, ErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

create_exception!(
    _core,
    CommError,
    PyRuntimeError,
    "A collective failed: a peer died, disconnected, mismatched, sent garbage or timed out. \
     The message names the operation and the culprit rank; `culprit` holds that rank (or None)."
);

/// A bad argument becomes a ValueError; anything else a `CommError` whose
/// `culprit` names the rank to blame (or None).
pub(crate) fn to_py_err(py: Python<'_>, e: CoreError) -> PyErr {
    if let ErrorKind::InvalidArgument(_) = e.kind {
        return PyValueError::new_err(e.to_string());
    }
    let err = CommError::new_err(e.to_string());
    let _ = err.value(py).setattr("culprit", e.culprit());
    err
}

/// The live diagnosis of one communicator (python/cadence/diagnosis/live.py
/// fills it): the latest verdict, and until when one is being worked out. A
/// `CommError` raised meanwhile waits for it (bounded by that time), so the
/// error carries the verdict as `e.diagnosis`.
#[derive(Default)]
pub(crate) struct DiagSlot {
    state: Mutex<DiagState>,
    changed: Condvar,
}

#[derive(Default)]
struct DiagState {
    verdict: Option<PyObject>,
    pending_until: Option<Instant>,
}

impl DiagSlot {
    /// Sets the verdict (None clears it) and for how long one is being worked
    /// out (None: nothing pending).
    pub(crate) fn set(&self, verdict: Option<PyObject>, pending: Option<Duration>) {
        let mut st = self.state.lock().unwrap();
        st.verdict = verdict;
        st.pending_until = pending.map(|p| Instant::now() + p);
        self.changed.notify_all();
    }

    /// A verdict is being worked out for `pending`; a verdict already held stays.
    pub(crate) fn pending(&self, pending: Duration) {
        let mut st = self.state.lock().unwrap();
        st.pending_until = Some(Instant::now() + pending);
        self.changed.notify_all();
    }

    /// `to_py_err`, plus `diagnosis` on a CommError: the verdict (or None).
    pub(crate) fn error(&self, py: Python<'_>, e: CoreError) -> PyErr {
        let err = to_py_err(py, e);
        if !err.is_instance_of::<CommError>(py) {
            return err;
        }
        py.allow_threads(|| {
            let mut st = self.state.lock().unwrap();
            while let Some(until) = st.pending_until.filter(|_| st.verdict.is_none()) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = self.changed.wait_timeout(st, left).unwrap().0;
            }
        });
        let verdict = self
            .state
            .lock()
            .unwrap()
            .verdict
            .as_ref()
            .map(|v| v.clone_ref(py));
        let _ = err.value(py).setattr("diagnosis", verdict);
        err
    }
}
