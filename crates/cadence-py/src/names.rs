//! The names Python passes for collectives, reductions, algorithms and
//! element types, parsed into the core's types (the core owns every list of
//! names), and the catalogs exposed to Python.

use cadence_core::schedule::Algo;
use cadence_core::{CollKind, DType, RedOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

pub(crate) fn parse_kind(kind: &str) -> PyResult<CollKind> {
    CollKind::from_name(kind)
        .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))
}

pub(crate) fn parse_dtype(dtype: &str) -> PyResult<DType> {
    DType::from_name(dtype).ok_or_else(|| PyValueError::new_err(format!("unknown dtype {dtype:?}")))
}

pub(crate) fn parse_op(op: &str, factor: Option<f64>) -> PyResult<RedOp> {
    RedOp::from_name(op, factor).ok_or_else(|| {
        if op == "premul_sum" {
            PyValueError::new_err("premul_sum needs factor=")
        } else {
            PyValueError::new_err(format!(
                "unknown reduction {op:?} (sum, prod, min, max, avg, premul_sum)"
            ))
        }
    })
}

/// An algorithm by its exact name ("auto" is none).
pub(crate) fn algo_named(name: &str) -> PyResult<Algo> {
    Algo::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown algorithm {name:?}")))
}

/// An algorithm, or None (also for "auto") for the library's own choice.
pub(crate) fn parse_algo(algo: Option<&str>) -> PyResult<Option<Algo>> {
    algo.filter(|&a| a != "auto").map(algo_named).transpose()
}

/// The element type names the core supports, in its order (`_core.DTYPES`).
pub(crate) fn dtype_names(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, DType::ALL.map(DType::name))
}

/// Algorithms applicable to a collective, by name.
#[pyfunction]
pub(crate) fn algorithms(kind: &str) -> PyResult<Vec<&'static str>> {
    let k = parse_kind(kind)?;
    Ok(cadence_core::schedule::algos_for(k)
        .iter()
        .map(|a| a.name())
        .collect())
}
