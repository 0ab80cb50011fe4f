//! `SimRecording`: a simulated run kept to be cut into the windows the live
//! slowness judge reads, several ways without running it again.

use cadence_core::sim::windows::{Cut, SimWindows};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A recorded run of `SimCluster.recording`: per window of simulated time,
/// the record each rank would publish (`Comm.dump_window`'s text).
#[pyclass(frozen)]
pub(crate) struct SimRecording {
    pub(crate) run: SimWindows,
}

#[pymethods]
impl SimRecording {
    /// The algorithm the library chose.
    #[getter]
    fn algo(&self) -> &'static str {
        self.run.algo.name()
    }

    /// Simulated seconds until the last rank finished.
    #[getter]
    fn seconds(&self) -> f64 {
        self.run.seconds
    }

    #[getter]
    fn calls(&self) -> usize {
        self.run.calls
    }

    /// count(window_s, phase_s=0.0) -> int: the windows the run's
    /// operations end in, the job starting `phase_s` into window 0.
    #[pyo3(signature = (window_s, phase_s=0.0))]
    fn count(&self, window_s: f64, phase_s: f64) -> PyResult<usize> {
        let cut = Cut {
            phase_s,
            ..Cut::new(window_s, 0)
        };
        self.run.count(&cut).map_err(PyValueError::new_err)
    }

    /// window(k, window_s, phase_s=0.0, min_recv_bytes=65536,
    /// dump_after_s=0.0) -> [str | None]: per rank the JSON text of its
    /// record of window k ([k w - phase, (k + 1) w - phase) in simulated
    /// seconds), taken `dump_after_s` after the window's end; None: it
    /// completed no operation in the window.
    #[pyo3(signature = (k, window_s, phase_s=0.0, min_recv_bytes=65536, dump_after_s=0.0))]
    fn window(
        &self,
        py: Python<'_>,
        k: usize,
        window_s: f64,
        phase_s: f64,
        min_recv_bytes: u64,
        dump_after_s: f64,
    ) -> PyResult<Vec<Option<String>>> {
        let cut = Cut {
            window_s,
            phase_s,
            min_recv_bytes,
            dump_after_s,
        };
        py.allow_threads(|| self.run.window(k, &cut))
            .map_err(PyValueError::new_err)
    }
}
