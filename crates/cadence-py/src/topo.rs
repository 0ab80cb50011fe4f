//! The topology tools on a topology file (`cadence topo`, the profiler):
//! the path finder, the alone rates and the bottleneck groups.

use cadence_core::fabric::file::TopoFile;
use cadence_core::fabric::{infer, pathfind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A topology file from its text (named "<text>" in messages).
fn parse(text: &str) -> PyResult<TopoFile> {
    TopoFile::parse(text, std::path::Path::new("<text>")).map_err(PyValueError::new_err)
}

/// The path finder on a topology file's text (`cadence topo show`, the
/// profiler): for `hosts` (names in the file; default all of them, in file
/// order), the widest ring's host order (indices into `hosts`), its
/// bottleneck and that of `hosts`' own order (bytes/s per flow with every
/// ring edge busy), and the chain from host 0.
#[pyfunction]
#[pyo3(signature = (text, hosts=None))]
pub(crate) fn topo_ring(
    py: Python<'_>,
    text: &str,
    hosts: Option<Vec<String>>,
) -> PyResult<PyObject> {
    let file = parse(text)?;
    let hosts = hosts.unwrap_or_else(|| file.hosts.clone());
    let fabric = file.fabric_for(&hosts).map_err(PyValueError::new_err)?;
    let (order, chain) = py.allow_threads(|| {
        (
            pathfind::widest_ring(&fabric),
            pathfind::widest_chain(&fabric, 0),
        )
    });
    let natural: Vec<usize> = (0..hosts.len()).collect();
    let d = PyDict::new(py);
    d.set_item("score", fabric.ring_score(&order))?;
    d.set_item("default_score", fabric.ring_score(&natural))?;
    d.set_item("order", order)?;
    d.set_item("chain", chain)?;
    Ok(d.into_any().unbind())
}

/// A topology file's alone rates, as the core reads them: the file's
/// matrix, or the one its `host_rates` give (a profile by shifted rounds).
#[pyfunction]
pub(crate) fn topo_rates(text: &str) -> PyResult<Vec<Vec<f64>>> {
    let file = parse(text)?;
    Ok(file.rates)
}

/// Groups of hosts that share a bottleneck, from the alone rates the
/// profiler measured (`rates[a][b]`, bytes/s; what `cadence topo profile`
/// infers).
#[pyfunction]
pub(crate) fn topo_groups(rates: Vec<Vec<f64>>) -> PyResult<Vec<Vec<usize>>> {
    if rates.iter().any(|row| row.len() != rates.len()) {
        return Err(PyValueError::new_err("rates must be a square matrix"));
    }
    Ok(infer::groups_from_rates(&rates))
}
