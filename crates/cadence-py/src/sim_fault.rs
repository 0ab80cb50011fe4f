//! The fault of `SimCluster.records` from its Python form: a dict naming
//! its kind and its arguments, or None.

use cadence_core::sim::exec::Fault;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The kinds and the keys each takes, for the message of a bad one.
const KINDS: &str = "stop {rank, call}, hung-link {src, dst, call}, \
                     slow-rank {rank, delay}, slow-nic {host, factor}";

/// `{"kind": "stop", "rank": 5, "call": 2}`,
/// `{"kind": "hung-link", "src": 3, "dst": 11, "call": 2}`,
/// `{"kind": "slow-rank", "rank": 5, "delay": 0.01}` (seconds) or
/// `{"kind": "slow-nic", "host": 2, "factor": 0.1}`; None: no fault.
pub(crate) fn fault_of(d: Option<&Bound<'_, PyDict>>) -> PyResult<Fault> {
    let Some(d) = d else {
        return Ok(Fault::None);
    };
    let kind: String = need(d, "kind")?;
    let (fault, keys): (Fault, &[&str]) = match kind.as_str() {
        "stop" => (
            Fault::Stop {
                rank: need(d, "rank")?,
                call: need(d, "call")?,
            },
            &["rank", "call"],
        ),
        "hung-link" => (
            Fault::HungLink {
                src: need(d, "src")?,
                dst: need(d, "dst")?,
                call: need(d, "call")?,
            },
            &["src", "dst", "call"],
        ),
        "slow-rank" => (
            Fault::SlowRank {
                rank: need(d, "rank")?,
                delay_s: need(d, "delay")?,
            },
            &["rank", "delay"],
        ),
        "slow-nic" => (
            Fault::SlowNic {
                host: need(d, "host")?,
                factor: need(d, "factor")?,
            },
            &["host", "factor"],
        ),
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown fault kind {kind:?} (kinds: {KINDS})"
            )))
        }
    };
    // A misspelt key would otherwise be ignored silently.
    for key in d.keys() {
        let key: String = key.extract()?;
        if key != "kind" && !keys.contains(&key.as_str()) {
            return Err(PyValueError::new_err(format!(
                "a {kind} fault takes {}, not {key:?}",
                keys.join(", ")
            )));
        }
    }
    Ok(fault)
}

fn need<'py, T: FromPyObject<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    let v = d
        .get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("a fault needs {key:?} ({KINDS})")))?;
    v.extract()
        .map_err(|e| PyValueError::new_err(format!("fault {key:?}: {e}")))
}
