//! The torch backend's synchronous fast path: `dist.all_reduce(t)` on one
//! contiguous CPU tensor reaches the core without a Python frame of ours in
//! between. At decode sizes the collective takes a few microseconds, and
//! each Python step of the general path (options objects, staging, a Work
//! with its lock) cost about as much again; here the tensor and options are
//! read through the C API and the Work is the plain finished one.
//!
//! An asynchronous call (`asyncOp`: functional collectives, DTensor,
//! `torch.compile`d graphs) of a small tensor takes the path too and returns
//! finished: handing it to the progress thread and waking the caller again
//! costs far more than the collective (see [`INLINE_ASYNC_BYTES`]).
//!
//! Anything the path does not take (several tensors, a larger asynchronous
//! call, another reduction, a tensor to stage) returns None, and the Python
//! backend runs its general path, where every error message is.

use crate::buffers::{tensor_span_view, View};
use crate::call::Call;
use crate::communicator::PyComm;
use cadence_core::{CollKind, DType, RedOp};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

/// The largest asynchronous allreduce run on the caller's thread. Below it
/// the collective takes tens of microseconds and the hand-off to the
/// progress thread and back several hundred (docs/benchmarks.md, "The torch
/// path"); above it a caller may have work to overlap with the collective.
/// Order is kept: [`Comm::run`](cadence_core::comm::Comm::run) queues behind
/// any asynchronous operation still in flight.
pub(crate) const INLINE_ASYNC_BYTES: usize = 256 * 1024;

#[pyclass(module = "cadence._core", name = "TorchFast", frozen)]
pub(crate) struct TorchFast {
    comm: Py<PyComm>,
    /// cadence.torch._work.DoneWork: what a finished call returns.
    done: PyObject,
    /// torch's AllreduceOptions: older callers pass a bare ReduceOp instead.
    options: Py<PyType>,
    /// torch.dtype -> the core's element type code, for the types it reduces.
    dtypes: Py<PyDict>,
    /// torch's ReduceOp.RedOpType values -> the core's reductions, those
    /// that need no factor.
    ops: Vec<(i64, RedOp)>,
}

#[pymethods]
impl TorchFast {
    #[new]
    fn new(
        comm: Py<PyComm>,
        done: PyObject,
        options: Py<PyType>,
        dtypes: Bound<'_, PyDict>,
        ops: Vec<(i64, String)>,
    ) -> PyResult<Self> {
        for (_, code) in dtypes.iter() {
            let c: u8 = code.extract()?;
            DType::from_code(c)
                .ok_or_else(|| PyValueError::new_err(format!("no element type {c}")))?;
        }
        let ops = ops
            .into_iter()
            .map(|(k, name)| {
                RedOp::from_name(&name, None)
                    .map(|op| (k, op))
                    .ok_or_else(|| PyValueError::new_err(format!("no reduction {name}")))
            })
            .collect::<PyResult<_>>()?;
        Ok(TorchFast {
            comm,
            done,
            options,
            dtypes: dtypes.unbind(),
            ops,
        })
    }

    /// The largest asynchronous collective the backend runs on the caller's
    /// thread (bytes of its larger side).
    #[classattr]
    const INLINE_ASYNC_BYTES: usize = INLINE_ASYNC_BYTES;

    /// allreduce(tensors, opts) -> DoneWork or None: runs the call when it
    /// is the common one, else returns None without doing anything.
    fn allreduce<'py>(
        &self,
        py: Python<'py>,
        tensors: Bound<'py, PyAny>,
        opts: Bound<'py, PyAny>,
    ) -> PyResult<Option<PyObject>> {
        let Ok(list) = tensors.downcast::<PyList>() else {
            return Ok(None);
        };
        if list.len() != 1 || !opts.get_type().is(self.options.bind(py)) {
            return Ok(None);
        }
        let asynchronous = opts.getattr(intern!(py, "asyncOp"))?.is_truthy()?;
        let kind: i64 = opts
            .getattr(intern!(py, "reduceOp"))?
            .getattr(intern!(py, "op"))?
            .call_method0(intern!(py, "__int__"))?
            .extract()?;
        let Some(&(_, op)) = self.ops.iter().find(|(k, _)| *k == kind) else {
            return Ok(None);
        };
        let t = list.get_item(0)?;
        let Some(view) = self.view(py, &t)? else {
            return Ok(None);
        };
        if asynchronous && view.bytes > INLINE_ASYNC_BYTES {
            return Ok(None);
        }
        let count = view.bytes / view.dtype.size();
        let call = Call::new(
            CollKind::AllReduce,
            0,
            vec![count],
            false,
            t.clone().unbind(),
        );
        self.comm.get().call(
            py,
            Call {
                input: Some((t.clone(), view)),
                output: Some((t, view)),
                op,
                ..call
            },
        )?;
        Ok(Some(self.done.call1(py, (list,))?))
    }
}

impl TorchFast {
    /// A contiguous CPU tensor of a type the core reduces, as a view; None
    /// for any other tensor.
    fn view(&self, py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<Option<View>> {
        let dtype = t.getattr(intern!(py, "dtype"))?;
        let Some(code) = self.dtypes.bind(py).get_item(dtype)? else {
            return Ok(None);
        };
        let Some(dtype) = DType::from_code(code.extract()?) else {
            return Ok(None); // checked when made: not reached
        };
        if !t.getattr(intern!(py, "is_cpu"))?.is_truthy()?
            || !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()?
        {
            return Ok(None);
        }
        let bytes: usize = t.getattr(intern!(py, "nbytes"))?.extract()?;
        let addr: usize = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok(Some(tensor_span_view(addr, bytes, dtype)))
    }
}
