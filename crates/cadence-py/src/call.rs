//! One call into the core: the buffers' views checked against each other,
//! the request built, then run to completion (Ctrl-C ending a hung one) or
//! submitted for a `Work`.

use crate::buffers::{view, View};
use crate::communicator::PyComm;
use crate::work::Work;
use cadence_core::comm::{OpRequest, ANY_SOURCE};
use cadence_core::schedule::Algo;
use cadence_core::{CollKind, DType, ErrorKind, RedOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// What one method asks of the core, before the request is built.
pub(crate) struct Call<'py> {
    pub(crate) kind: CollKind,
    /// The buffers and their views (the objects are kept alive for async calls).
    pub(crate) input: Option<(Bound<'py, PyAny>, View)>,
    pub(crate) output: Option<(Bound<'py, PyAny>, View)>,
    pub(crate) op: RedOp,
    pub(crate) root: usize,
    pub(crate) counts: Vec<usize>,
    pub(crate) dtype: Option<DType>,
    pub(crate) algo: Option<Algo>,
    pub(crate) async_op: bool,
    pub(crate) result: PyObject,
}

impl Call<'_> {
    /// A call of `kind` without buffers, summing, with the library's choice
    /// of algorithm; the methods set what differs.
    pub(crate) fn new(
        kind: CollKind,
        root: usize,
        counts: Vec<usize>,
        async_op: bool,
        result: PyObject,
    ) -> Self {
        Call {
            kind,
            input: None,
            output: None,
            op: RedOp::Sum,
            root,
            counts,
            dtype: None,
            algo: None,
            async_op,
            result,
        }
    }
}

/// Elements per block when `total` splits into `n` equal blocks.
pub(crate) fn blocks_of(coll: &str, total: usize, n: usize) -> PyResult<usize> {
    if !total.is_multiple_of(n) {
        return Err(PyValueError::new_err(format!(
            "{coll}: {total} elements do not split into {n} blocks"
        )));
    }
    Ok(total / n)
}

impl PyComm {
    /// A collective from `x` (viewed as `inp`) into `out`, returning `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn collect<'py>(
        &self,
        py: Python<'py>,
        kind: CollKind,
        x: Bound<'py, PyAny>,
        inp: View,
        out: Bound<'py, PyAny>,
        op: RedOp,
        counts: Vec<usize>,
        algo: Option<Algo>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let v = view(py, &out, true, kind.name(), "output")?;
        let result = out.clone().unbind();
        let call = Call::new(kind, 0, counts, async_op, result);
        self.call(
            py,
            Call {
                input: Some((x, inp)),
                output: Some((out, v)),
                op,
                algo,
                ..call
            },
        )
    }

    pub(crate) fn call(&self, py: Python<'_>, c: Call<'_>) -> PyResult<PyObject> {
        let name = c.kind.name();
        let inp = c.input.as_ref().map(|(_, v)| v);
        let out = c.output.as_ref().map(|(_, v)| v);
        let dtype = match (inp, out, c.dtype) {
            (Some(i), Some(o), _) if i.dtype != o.dtype => {
                return Err(PyValueError::new_err(format!(
                    "{name}: input is {} but output is {}",
                    i.dtype, o.dtype
                )))
            }
            (Some(i), _, _) => i.dtype,
            (None, Some(o), _) => o.dtype,
            (None, None, Some(d)) => d,
            (None, None, None) => DType::U8,
        };
        let input = inp.map(|v| (v.ptr as *const u8, v.bytes));
        let output = out.map(|v| (v.ptr, v.bytes));
        let any_source = c.kind == CollKind::Recv && c.root == ANY_SOURCE;
        let plain = OpRequest::new(c.kind, dtype, c.op, c.root, c.counts).with_algo(c.algo);
        let comm = self.comm.clone();
        if c.async_op {
            // The request owns references to the buffer objects until the
            // operation finished (dropped on the progress thread; pyo3 defers
            // the decrement to the next time a thread holds the GIL).
            let owners: Vec<PyObject> = c
                .input
                .into_iter()
                .chain(c.output)
                .map(|(b, _)| b.unbind())
                .collect();
            // SAFETY: `view` took each pointer from its object's buffer
            // (numpy's data, or the buffer protocol), and `owners` holds those
            // objects until the operation finished, so the memory stays
            // allocated. Using it meanwhile is the caller's side of
            // `async_op=True`, as with every CCL's asynchronous calls.
            let req = unsafe { plain.raw_buffers(input, output, Some(Box::new(owners))) };
            let done = comm.submit(req).map_err(|e| self.diag.error(py, e))?;
            let w = Work {
                done,
                result: (!any_source).then_some(c.result),
                diag: self.diag.clone(),
            };
            return Ok(Py::new(py, w)?.into_any());
        }
        // SAFETY: `c.input`/`c.output` hold the buffer objects for this whole
        // (synchronous) call, which returns only after the operation finished.
        let req = unsafe { plain.raw_buffers(input, output, None) };
        let check = self.interrupt.clone();
        let result = py.allow_threads(move || comm.run_interruptible(req, Some(check)));
        match result {
            Ok(Some(source)) if any_source => Ok(source.into_pyobject(py)?.into_any().unbind()),
            Ok(_) => Ok(c.result),
            Err(e) => {
                if e.kind == ErrorKind::Interrupted {
                    // Re-raise what the signal handler raised (KeyboardInterrupt).
                    if let Some(err) = self.signal.lock().unwrap().take() {
                        return Err(err);
                    }
                }
                Err(self.diag.error(py, e))
            }
        }
    }
}
