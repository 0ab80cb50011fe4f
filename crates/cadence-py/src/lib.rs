//! Python bindings: `cadence._core`. Kept thin: buffers in, errors out. The
//! Python package (python/cadence) builds the friendly API on top.

mod bootstrap;
mod buffers;
mod call;
mod communicator;
mod errors;
mod names;
mod sim;
mod sim_fault;
mod sim_windows;
mod store;
mod topo;
mod torch_fast;
mod work;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CommError", m.py().get_type::<errors::CommError>())?;
    m.add_class::<communicator::PyComm>()?;
    m.add_class::<work::Work>()?;
    m.add_class::<torch_fast::TorchFast>()?;
    m.add_class::<bootstrap::Bootstrap>()?;
    m.add_class::<store::PyStore>()?;
    m.add_function(wrap_pyfunction!(names::algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(topo::topo_ring, m)?)?;
    m.add_function(wrap_pyfunction!(topo::topo_rates, m)?)?;
    m.add_function(wrap_pyfunction!(topo::topo_groups, m)?)?;
    m.add_class::<sim::SimCluster>()?;
    m.add_class::<sim_windows::SimRecording>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ANY_SOURCE", cadence_core::comm::ANY_SOURCE)?;
    m.add("DTYPES", names::dtype_names(m.py())?)?;
    Ok(())
}
