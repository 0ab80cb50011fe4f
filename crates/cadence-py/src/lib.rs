//! Python bindings: `cadence._core`. Kept thin: buffers in, errors out. The
//! Python package (python/cadence) builds the friendly API on top.

use cadence_core::comm::{
    Bootstrap as CoreBootstrap, Comm, Completion, InterruptCheck, OpRequest, PeerInfo, ANY_SOURCE,
    INTERRUPT_EVERY,
};
use cadence_core::schedule::Algo;
use cadence_core::{CollKind, CommError as CoreError, Config, DType, ErrorKind, JobSecret, RedOp};
use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

create_exception!(
    _core,
    CommError,
    PyRuntimeError,
    "A collective failed: a peer died, disconnected, mismatched, sent garbage or timed out. \
     The message names the operation and the culprit rank; `culprit` holds that rank (or None)."
);

fn to_py_err(py: Python<'_>, e: CoreError) -> PyErr {
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
struct DiagSlot {
    state: Mutex<DiagState>,
    changed: Condvar,
}

#[derive(Default)]
struct DiagState {
    verdict: Option<PyObject>,
    pending_until: Option<Instant>,
}

impl DiagSlot {
    /// `to_py_err`, plus `diagnosis` on a CommError: the verdict (or None).
    fn error(&self, py: Python<'_>, e: CoreError) -> PyErr {
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

/// A borrowed view of a contiguous buffer: pointer, bytes and element type.
#[derive(Clone, Copy)]
struct View {
    ptr: *mut u8,
    bytes: usize,
    dtype: DType,
}

/// What the buffer protocol said: pointer, bytes, and the element type when
/// cadence knows its format (else the format, for the error message).
struct RawView {
    ptr: *mut u8,
    bytes: usize,
    dtype: Result<DType, String>,
}

fn unsupported(fmt: &str) -> PyErr {
    PyValueError::new_err(format!(
        "unsupported element type (buffer format {fmt}); cadence supports float16, bfloat16, \
         float32, float64, int8, uint8, int32, int64"
    ))
}

fn dtype_of_format(fmt: &str, itemsize: usize) -> Option<DType> {
    let f = fmt.trim_start_matches(['@', '=', '<', '!']);
    Some(match (f, itemsize) {
        ("e", 2) => DType::F16,
        ("f", 4) => DType::F32,
        ("d", 8) => DType::F64,
        ("b", 1) => DType::I8,
        ("B", 1) => DType::U8,
        ("i" | "l", 4) => DType::I32,
        ("l" | "q", 8) => DType::I64,
        _ => return None,
    })
}

/// Reads the buffer of `obj` through the buffer protocol; objects that have
/// none (torch tensors, bfloat16) go through `cadence._buffers.as_buffer`,
/// which returns `(array, dtype_name_or_None)`.
/// `coll` and `role` ("allreduce", "input") name the buffer in errors; they
/// are only formatted on failure (this runs on every call).
fn view(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    writable: bool,
    coll: &str,
    role: &str,
) -> PyResult<View> {
    if let Some(v) = ndarray_view(obj, writable) {
        return Ok(v);
    }
    if let Some(v) = tensor_view(obj)? {
        return Ok(v);
    }
    if let Some(v) = raw_view(obj, writable)? {
        let dtype = v.dtype.map_err(|f| unsupported(&f))?;
        return Ok(View {
            ptr: v.ptr,
            bytes: v.bytes,
            dtype,
        });
    }
    let helper = py.import("cadence._buffers")?.getattr("as_buffer")?;
    let res = helper.call1((obj, writable))?;
    let tup = res.downcast::<PyTuple>()?;
    let arr = tup.get_item(0)?;
    let dname: Option<String> = tup.get_item(1)?.extract()?;
    let what = format!("{coll} {role}");
    let v = raw_view(&arr, writable)?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what}: cannot access the buffer of {}",
            obj.get_type()
        ))
    })?;
    let dtype = match dname {
        Some(n) => {
            let d = DType::from_name(&n)
                .ok_or_else(|| PyValueError::new_err(format!("{what}: unsupported dtype {n}")))?;
            if v.bytes % d.size() != 0 {
                return Err(PyValueError::new_err(format!("{what}: bad {n} buffer")));
            }
            d
        }
        None => v.dtype.map_err(|f| unsupported(&f))?,
    };
    Ok(View {
        ptr: v.ptr,
        bytes: v.bytes,
        dtype,
    })
}

static TENSOR_SPAN: pyo3::sync::GILOnceCell<Py<PyAny>> = pyo3::sync::GILOnceCell::new();

/// Fast path for CPU torch tensors (`cadence._buffers.tensor_span`): their
/// address, size and dtype, without the numpy view the general path makes
/// of them (4-6 µs a buffer, more than a small collective takes). `None`
/// for anything else, unusual tensors included: the general path has their
/// errors.
fn tensor_view(obj: &Bound<'_, PyAny>) -> PyResult<Option<View>> {
    let py = obj.py();
    let span = TENSOR_SPAN.get_or_try_init(py, || -> PyResult<_> {
        Ok(py
            .import("cadence._buffers")?
            .getattr("tensor_span")?
            .unbind())
    })?;
    let res = span.bind(py).call1((obj,))?;
    if res.is_none() {
        return Ok(None);
    }
    let (addr, bytes, name): (usize, usize, String) = res.extract()?;
    let Some(dtype) = DType::from_name(&name) else {
        return Ok(None);
    };
    Ok(Some(View {
        // An empty tensor may have no storage at all (address 0).
        ptr: if bytes == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            addr as *mut u8
        },
        bytes,
        dtype,
    }))
}

/// The leading fields of numpy's array object (`PyArrayObject_fields`), the
/// same in numpy 1.7+ and 2.x.
#[repr(C)]
struct NpArrayHead {
    ob_refcnt: isize,
    ob_type: *mut std::ffi::c_void,
    data: *mut u8,
    nd: std::ffi::c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut std::ffi::c_void,
    descr: *const NpDescrHead,
    flags: std::ffi::c_int,
}

/// The leading fields of numpy's dtype object (`PyArray_Descr`): identical
/// up to `type_num` in numpy 1.x and 2.x.
#[repr(C)]
struct NpDescrHead {
    ob_refcnt: isize,
    ob_type: *mut std::ffi::c_void,
    typeobj: *mut std::ffi::c_void,
    kind: std::ffi::c_char,
    type_char: std::ffi::c_char,
    byteorder: std::ffi::c_char,
    former_flags: std::ffi::c_char,
    type_num: std::ffi::c_int,
}

const NPY_ARRAY_C_CONTIGUOUS: std::ffi::c_int = 0x0001;
const NPY_ARRAY_WRITEABLE: std::ffi::c_int = 0x0400;

static NDARRAY_TYPE: pyo3::sync::GILOnceCell<Py<pyo3::types::PyType>> =
    pyo3::sync::GILOnceCell::new();

/// Fast path for exact numpy arrays that are C-contiguous, native-endian and
/// of a supported dtype: reads numpy's struct directly. numpy's buffer
/// protocol builds a format description on every export, which costs more
/// than a small collective's data movement. Anything unusual returns `None`
/// and takes the buffer protocol, which also produces the error messages.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn ndarray_view(obj: &Bound<'_, PyAny>, writable: bool) -> Option<View> {
    let py = obj.py();
    let ty = NDARRAY_TYPE
        .get_or_try_init(py, || -> PyResult<_> {
            Ok(py
                .import("numpy")?
                .getattr("ndarray")?
                .downcast_into::<pyo3::types::PyType>()?
                .unbind())
        })
        .ok()?;
    if !obj.get_type().is(ty.bind(py)) {
        return None;
    }
    // SAFETY: `obj`'s type is exactly numpy.ndarray (checked above), so it is
    // laid out as `PyArrayObject_fields`, whose prefix `NpArrayHead` mirrors;
    // its `descr` is a live `PyArray_Descr` whose prefix `NpDescrHead` mirrors,
    // and `dimensions` has `nd` entries. We hold the GIL, so nothing changes
    // underneath; we only read.
    unsafe {
        let a = &*(obj.as_ptr() as *const NpArrayHead);
        let want = NPY_ARRAY_C_CONTIGUOUS | if writable { NPY_ARRAY_WRITEABLE } else { 0 };
        if a.flags & want != want || a.descr.is_null() || a.nd < 0 {
            return None;
        }
        let d = &*a.descr;
        if d.byteorder as u8 == b'>' {
            return None;
        }
        let dtype = match d.type_char as u8 {
            b'e' => DType::F16,
            b'f' => DType::F32,
            b'd' => DType::F64,
            b'b' => DType::I8,
            b'B' => DType::U8,
            b'i' => DType::I32,
            b'l' | b'q' => DType::I64,
            _ => return None,
        };
        let dims = if a.nd == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(a.dimensions, a.nd as usize)
        };
        let count: isize = dims.iter().product();
        Some(View {
            ptr: a.data,
            bytes: count as usize * dtype.size(),
            dtype,
        })
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn ndarray_view(_obj: &Bound<'_, PyAny>, _writable: bool) -> Option<View> {
    None
}

fn raw_view(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Option<RawView>> {
    let mut flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
    if writable {
        flags |= ffi::PyBUF_WRITABLE;
    }
    let mut buf = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: `obj` is a live object (we hold the GIL through `Bound`), `buf`
    // is writable storage for one Py_buffer. On success we read its fields and
    // release it before returning; the caller keeps `obj` alive while the
    // pointer is in use.
    unsafe {
        if ffi::PyObject_GetBuffer(obj.as_ptr(), buf.as_mut_ptr(), flags) != 0 {
            // Remember why (read-only, non-contiguous, no buffer at all).
            let err = PyErr::take(obj.py());
            let has_buffer_protocol = obj.hasattr("__array_interface__").unwrap_or(false)
                || obj.is_instance_of::<pyo3::types::PyByteArray>();
            if let (Some(e), true) = (err, has_buffer_protocol) {
                return Err(PyValueError::new_err(format!(
                    "buffer must be C-contiguous{}: {e}",
                    if writable { " and writable" } else { "" }
                )));
            }
            return Ok(None);
        }
        let b = buf.assume_init_mut();
        // Borrowed, not copied: this runs on every call.
        let fmt: &str = if b.format.is_null() {
            "B"
        } else {
            std::ffi::CStr::from_ptr(b.format).to_str().unwrap_or("?")
        };
        let itemsize = b.itemsize as usize;
        let v = RawView {
            ptr: b.buf as *mut u8,
            bytes: b.len as usize,
            dtype: dtype_of_format(fmt, itemsize)
                .ok_or_else(|| format!("{fmt:?}, itemsize {itemsize}")),
        };
        ffi::PyBuffer_Release(b);
        Ok(Some(v))
    }
}

fn parse_op(op: &str, factor: Option<f64>) -> PyResult<RedOp> {
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

fn parse_algo(algo: Option<&str>) -> PyResult<Option<Algo>> {
    // "auto" is the library's own choice, as no algorithm at all.
    algo.filter(|&a| a != "auto")
        .map(|a| {
            Algo::from_name(a)
                .ok_or_else(|| PyValueError::new_err(format!("unknown algorithm {a:?}")))
        })
        .transpose()
}

/// `x.shape` as sizes (numpy arrays and torch tensors alike).
fn shape_of(x: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    x.getattr("shape")?.extract()
}

/// An uninitialised array or tensor of `shape` with `like`'s kind and dtype
/// (`cadence._buffers.empty`; only when the caller gave no output).
fn empty_like<'py>(
    py: Python<'py>,
    like: &Bound<'py, PyAny>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let shape = PyTuple::new(py, shape)?;
    py.import("cadence._buffers")?
        .getattr("empty")?
        .call1((like, shape))
}

/// An operation in flight. `wait()` returns the operation's result object.
///
/// The buffers are not held here: the request owns references to them
/// (`OpRequest::raw_buffers`' keep-alive), which the communicator drops only
/// after the operation finished. So dropping an unfinished Work, or never
/// waiting on it, cannot free memory the progress thread still writes.
#[pyclass(module = "cadence._core")]
struct Work {
    done: Arc<Completion>,
    /// What `wait()` returns; `None`: the sender's rank (a receive from any
    /// source).
    result: Option<PyObject>,
    diag: Arc<DiagSlot>,
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

/// A communicator over numpy arrays and CPU torch tensors (see python/cadence).
#[pyclass(module = "cadence._core", name = "Comm", frozen)]
struct PyComm {
    comm: Arc<Comm>,
    /// Runs Python's signal handlers while a blocking call waits, so Ctrl-C
    /// ends a hung collective; what a handler raised is kept in `signal`.
    interrupt: InterruptCheck,
    signal: Arc<Mutex<Option<PyErr>>>,
    diag: Arc<DiagSlot>,
}

impl PyComm {
    fn new(comm: Comm) -> PyComm {
        let signal: Arc<Mutex<Option<PyErr>>> = Arc::default();
        let slot = signal.clone();
        let interrupt: InterruptCheck = Arc::new(move || {
            Python::with_gil(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    *slot.lock().unwrap() = Some(e);
                    true
                }
            })
        });
        PyComm {
            comm: Arc::new(comm),
            interrupt,
            signal,
            diag: Arc::default(),
        }
    }
}

struct Call<'py> {
    kind: CollKind,
    /// The buffers and their views (the objects are kept alive for async calls).
    input: Option<(Bound<'py, PyAny>, View)>,
    output: Option<(Bound<'py, PyAny>, View)>,
    op: RedOp,
    root: usize,
    counts: Vec<usize>,
    dtype: Option<DType>,
    algo: Option<Algo>,
    async_op: bool,
    result: PyObject,
}

impl Call<'_> {
    /// A call of `kind` without buffers, summing, with the library's choice
    /// of algorithm; the methods set what differs.
    fn new(
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
fn blocks_of(coll: &str, total: usize, n: usize) -> PyResult<usize> {
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
    fn collect<'py>(
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

    fn call(&self, py: Python<'_>, c: Call<'_>) -> PyResult<PyObject> {
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

#[pymethods]
impl PyComm {
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.comm.nranks()
    }
    #[getter]
    fn id(&self) -> String {
        self.comm.id().to_string()
    }
    #[getter]
    fn hosts(&self) -> Vec<String> {
        self.comm.hosts.clone()
    }
    #[getter]
    fn timeout(&self) -> f64 {
        self.comm.config().timeout.as_secs_f64()
    }

    /// The cost model `auto` ranks algorithms by, as a dict (seconds per
    /// message `alpha`, seconds per byte `beta`, per link class; `gamma`;
    /// `source`: "start-up" or "tuning table"), or None.
    fn cost_model<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((m, at_start)) = self.comm.cost_model() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (name, l) in [("shm", m.shm), ("tcp", m.tcp)] {
            let link = PyDict::new(py);
            link.set_item("alpha", l.alpha)?;
            link.set_item("beta", l.beta)?;
            d.set_item(name, link)?;
        }
        d.set_item("gamma", m.gamma)?;
        d.set_item("incast", m.incast)?;
        d.set_item("source", if at_start { "start-up" } else { "tuning table" })?;
        Ok(Some(d))
    }

    /// The algorithms of `kind` that apply on this communicator's hosts
    /// (hierarchical ones need the same number of ranks on every host).
    fn algorithms(&self, kind: &str) -> PyResult<Vec<&'static str>> {
        let k = CollKind::from_name(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))?;
        Ok(self
            .comm
            .algorithms_for(k)
            .into_iter()
            .map(|a| a.name())
            .collect())
    }

    /// The algorithm a call of `kind` with `counts` (as `_run` takes them)
    /// of `dtype` would run here, by name, without running it.
    fn choose(
        &self,
        py: Python<'_>,
        kind: &str,
        counts: Vec<usize>,
        dtype: &str,
    ) -> PyResult<&'static str> {
        let k = CollKind::from_name(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))?;
        let dt = DType::from_name(dtype)
            .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {dtype:?}")))?;
        let algo = self
            .comm
            .choose(k, counts, dt)
            .map_err(|e| to_py_err(py, e))?;
        Ok(algo.name())
    }

    /// allreduce(x, out=None, op="sum", factor=None, algo=None, async_op=False)
    ///
    /// Reduces `x` over all ranks. In place when `out` is None; returns the
    /// array holding the result (or a Work when `async_op`).
    #[pyo3(signature = (x, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn allreduce<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, out.is_none(), "allreduce", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let output = match out {
            Some(o) => {
                let v = view(py, &o, true, "allreduce", "output")?;
                (o, v)
            }
            // In place: the same view serves as output.
            None => (x.clone(), inp),
        };
        let result = output.0.clone().unbind();
        let call = Call::new(CollKind::AllReduce, 0, vec![count], async_op, result);
        self.call(
            py,
            Call {
                input: Some((x, inp)),
                output: Some(output),
                op,
                algo,
                ..call
            },
        )
    }

    /// broadcast(x, root=0, algo=None, async_op=False) -> x
    ///
    /// Copies root's `x` into every rank's `x` (in place). Native, as
    /// allreduce: a small call's latency is mostly the path to the engine.
    #[pyo3(signature = (x, root=0, algo=None, async_op=false))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: usize,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let v = view(py, &x, true, "broadcast", "buffer")?;
        let count = v.bytes / v.dtype.size();
        let result = x.clone().unbind();
        let call = Call::new(CollKind::Broadcast, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                output: Some((x, v)),
                algo,
                ..call
            },
        )
    }

    /// reduce(x, root=0, out=None, op="sum", factor=None, algo=None,
    /// async_op=False)
    ///
    /// Reduces to `root`: its result lands in `out` (default: `x`, in
    /// place). Returns the result at the root, None elsewhere.
    #[pyo3(signature = (x, root=0, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: usize,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let at_root = self.comm.rank() == root;
        let in_place = at_root && out.is_none();
        let inp = view(py, &x, in_place, "reduce", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let output = match (at_root, out) {
            (false, _) => None,
            (true, Some(o)) => {
                let v = view(py, &o, true, "reduce", "output")?;
                Some((o, v))
            }
            (true, None) => Some((x.clone(), inp)),
        };
        let result = match &output {
            Some((o, _)) => o.clone().unbind(),
            None => py.None(),
        };
        let call = Call::new(CollKind::Reduce, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                input: Some((x, inp)),
                output,
                op,
                algo,
                ..call
            },
        )
    }

    /// send(x, dst, async_op=False): sends `x` to rank `dst` (matched by a
    /// `recv` there, in order).
    #[pyo3(signature = (x, dst, async_op=false))]
    fn send<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        dst: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let v = view(py, &x, false, "send", "input")?;
        let count = v.bytes / v.dtype.size();
        let call = Call::new(CollKind::Send, dst, vec![count], async_op, py.None());
        self.call(
            py,
            Call {
                input: Some((x, v)),
                ..call
            },
        )
    }

    /// recv(out, src=None, async_op=False): receives into `out` from rank
    /// `src`; returns `out`. With `src=None`, from whichever rank sends to
    /// this one first (a send of `out`'s size), and returns that rank.
    #[pyo3(signature = (out, src=None, async_op=false))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        out: Bound<'py, PyAny>,
        src: Option<usize>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let v = view(py, &out, true, "recv", "output")?;
        let count = v.bytes / v.dtype.size();
        let result = out.clone().unbind();
        let root = src.unwrap_or(ANY_SOURCE);
        let call = Call::new(CollKind::Recv, root, vec![count], async_op, result);
        self.call(
            py,
            Call {
                output: Some((out, v)),
                ..call
            },
        )
    }

    /// allgather(x, out=None, algo=None, async_op=False): gathers every
    /// rank's `x` into `out` of shape (size, *x.shape) (made when None).
    #[pyo3(signature = (x, out=None, algo=None, async_op=false))]
    fn allgather<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "allgather", "input")?;
        let count = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let out = match out {
            Some(o) => o,
            None => {
                let mut shape = vec![n];
                shape.extend(shape_of(&x)?);
                empty_like(py, &x, shape)?
            }
        };
        self.collect(
            py,
            CollKind::AllGather,
            x,
            inp,
            out,
            RedOp::Sum,
            vec![count; n],
            algo,
            async_op,
        )
    }

    /// reduce_scatter(x, out=None, op="sum", factor=None, algo=None,
    /// async_op=False): reduces `x` over ranks and leaves block `rank` (of
    /// `size` equal blocks) in `out`.
    #[pyo3(signature = (x, out=None, op="sum", factor=None, algo=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = parse_op(op, factor)?;
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "reduce_scatter", "input")?;
        let total = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let block = blocks_of("reduce_scatter", total, n)?;
        let out = match out {
            Some(o) => o,
            None => {
                let shape = shape_of(&x)?;
                let shape = match shape.split_first() {
                    Some((&first, rest)) if first % n == 0 => {
                        let mut s = vec![first / n];
                        s.extend_from_slice(rest);
                        s
                    }
                    _ => vec![block],
                };
                empty_like(py, &x, shape)?
            }
        };
        self.collect(
            py,
            CollKind::ReduceScatter,
            x,
            inp,
            out,
            op,
            vec![block; n],
            algo,
            async_op,
        )
    }

    /// alltoall(x, out=None, algo=None, async_op=False): block d of `x`
    /// goes to rank d; block s of `out` (x's shape when made) comes from
    /// rank s.
    #[pyo3(signature = (x, out=None, algo=None, async_op=false))]
    fn alltoall<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        algo: Option<&str>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let algo = parse_algo(algo)?;
        let inp = view(py, &x, false, "alltoall", "input")?;
        let total = inp.bytes / inp.dtype.size();
        let n = self.comm.nranks();
        let block = blocks_of("alltoall", total, n)?;
        let out = match out {
            Some(o) => o,
            None => empty_like(py, &x, shape_of(&x)?)?,
        };
        self.collect(
            py,
            CollKind::AllToAll,
            x,
            inp,
            out,
            RedOp::Sum,
            vec![block; n * n],
            algo,
            async_op,
        )
    }

    /// barrier(async_op=False): returns when every rank has entered it.
    #[pyo3(signature = (async_op=false))]
    fn barrier(&self, py: Python<'_>, async_op: bool) -> PyResult<PyObject> {
        let call = Call::new(CollKind::Barrier, 0, Vec::new(), async_op, py.None());
        self.call(py, call)
    }

    /// The generic entry point the Python API uses for every collective:
    /// `_run(kind, input, output, op, factor, root, counts, dtype, algo,
    /// async_op, result)`; `counts` as in the schedule layer's table.
    #[pyo3(signature = (kind, input, output, op, factor, root, counts, dtype, algo, async_op, result))]
    #[allow(clippy::too_many_arguments)]
    fn _run<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        input: Option<Bound<'py, PyAny>>,
        output: Option<Bound<'py, PyAny>>,
        op: &str,
        factor: Option<f64>,
        root: usize,
        counts: Vec<usize>,
        dtype: Option<&str>,
        algo: Option<&str>,
        async_op: bool,
        result: PyObject,
    ) -> PyResult<PyObject> {
        let kind = CollKind::from_name(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))?;
        let name = kind.name();
        let input = match input {
            Some(o) => {
                let v = view(py, &o, false, name, "input")?;
                Some((o, v))
            }
            None => None,
        };
        let output = match output {
            Some(o) => {
                let v = view(py, &o, true, name, "output")?;
                Some((o, v))
            }
            None => None,
        };
        let dtype = dtype
            .map(|d| {
                DType::from_name(d)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {d:?}")))
            })
            .transpose()?;
        self.call(
            py,
            Call {
                kind,
                input,
                output,
                op: parse_op(op, factor)?,
                root,
                counts,
                dtype,
                algo: parse_algo(algo)?,
                async_op,
                result,
            },
        )
    }

    /// Element type cadence sees for `x` ("float32", "bfloat16", ...).
    fn dtype_of(&self, py: Python<'_>, x: Bound<'_, PyAny>) -> PyResult<&'static str> {
        Ok(view(py, &x, false, "dtype_of", "buffer")?.dtype.name())
    }

    /// The flight recorder (last operations and their messages), link
    /// counters and this rank's identity, as JSON (the dump format).
    /// `last`: the newest `last` operations only.
    #[pyo3(signature = (last=None))]
    fn dump_records(&self, py: Python<'_>, last: Option<usize>) -> String {
        let comm = self.comm.clone();
        py.allow_threads(move || match last {
            Some(n) => comm.dump_recent(n),
            None => comm.dump_records(),
        })
    }

    /// The operations that completed in a slowness window (Unix ns, end
    /// excluded), the newest `last`, as a dump with only their timed
    /// receives of at least `min_recv_bytes`; None when there were none.
    fn dump_window(
        &self,
        py: Python<'_>,
        from_unix_ns: u64,
        to_unix_ns: u64,
        last: usize,
        min_recv_bytes: u64,
    ) -> Option<String> {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.dump_window(from_unix_ns, to_unix_ns, last, min_recv_bytes))
    }

    /// Cumulative totals for metrics as JSON: operations, bytes and a
    /// duration histogram per collective kind, every link's counters, the
    /// oldest running operation (cadence.diagnosis.metrics reads it at
    /// scrape time). Never waits for a running operation.
    fn metrics(&self, py: Python<'_>) -> String {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.metrics())
    }

    /// Profiles the network between the communicator's hosts (collective:
    /// every rank calls it) and returns the topology file as JSON text, the
    /// same on every rank. `progress`: rank 0 prints a line per stage with
    /// this prefix (to stdout); `rings`: also measure the rank-order and
    /// the found ring under load; `pairs_max`: most hosts whose every pair
    /// is measured alone (16), beyond that shifted rounds only.
    #[pyo3(signature = (seconds=0.05, rings=true, note=String::new(), progress=None, pairs_max=None))]
    fn profile_topology(
        &self,
        py: Python<'_>,
        seconds: f64,
        rings: bool,
        note: String,
        progress: Option<String>,
        pairs_max: Option<usize>,
    ) -> PyResult<String> {
        use cadence_core::comm::profile::ProfileOptions;
        use std::io::Write;
        if !(seconds > 0.0 && seconds.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "seconds must be positive, not {seconds}"
            )));
        }
        let comm = self.comm.clone();
        let opts = ProfileOptions {
            seconds,
            rings,
            pairs_max: pairs_max.unwrap_or(cadence_core::fabric::probe::PAIRS_MAX),
            note,
        };
        let say = move |m: &str| {
            if let Some(prefix) = &progress {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{prefix}{m}");
                let _ = out.flush();
            }
        };
        let file = py
            .allow_threads(move || comm.profile_topology(&opts, &say))
            .map_err(|e| to_py_err(py, e))?;
        Ok(file.to_text())
    }

    /// Writes the dump into directory `dir`; returns the file's path.
    fn dump(&self, py: Python<'_>, dir: std::path::PathBuf) -> PyResult<String> {
        let comm = self.comm.clone();
        let path = py
            .allow_threads(move || comm.dump_to(&dir))
            .map_err(|e| PyOSError::new_err(format!("cannot write the dump: {e}")))?;
        Ok(path.display().to_string())
    }

    #[getter]
    fn job(&self) -> String {
        self.comm.job().to_string()
    }

    /// This rank's wall clock against rank 0's: (offset ns, error ns, method).
    #[getter]
    fn clock_offset(&self) -> (i64, u64, &'static str) {
        let c = self.comm.clock_offset();
        (c.offset_ns, c.error_ns, c.method)
    }

    /// For the live watchdog: (operations started, and the oldest running
    /// one as (seq, collective, seconds it has run) or None).
    fn _progress(&self) -> (u64, Option<(u64, &'static str, f64)>) {
        let p = self.comm.progress();
        let running = p.running.map(|r| {
            let secs = p.now_ns.saturating_sub(r.start_ns) as f64 / 1e9;
            (r.seq, r.collective, secs)
        });
        (p.total_ops, running)
    }

    /// For the live watchdog: the verdict `e.diagnosis` carries (None
    /// clears it), and for how many seconds one is being worked out (an
    /// error raised meanwhile waits for it; None: nothing pending).
    #[pyo3(signature = (verdict, pending_s=None))]
    fn _set_diagnosis(&self, verdict: Option<PyObject>, pending_s: Option<f64>) {
        let mut st = self.diag.state.lock().unwrap();
        st.verdict = verdict;
        st.pending_until = pending_s.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        self.diag.changed.notify_all();
    }

    /// For the live watchdog: a round is being worked out for `pending_s`
    /// seconds. Unlike `_set_diagnosis(None, s)` it keeps a verdict already
    /// held: that one is about the hang still going on (the watchdog clears
    /// verdicts on recovery), and an error raised now must not wait for a
    /// second round that another stuck operation opened, whose coordinator
    /// may fail and leave before it publishes.
    fn _diagnosis_pending(&self, pending_s: f64) {
        let mut st = self.diag.state.lock().unwrap();
        st.pending_until = Some(Instant::now() + Duration::from_secs_f64(pending_s.max(0.0)));
        self.diag.changed.notify_all();
    }

    /// Finishes queued operations and stops the progress thread.
    fn close(&self, py: Python<'_>) {
        let comm = self.comm.clone();
        py.allow_threads(move || comm.close())
    }

    /// Fails the communicator on purpose and tells every peer `reason`.
    fn abort(&self, py: Python<'_>, reason: &str) {
        let comm = self.comm.clone();
        let reason = reason.to_string();
        py.allow_threads(move || comm.abort(&reason))
    }

    /// Test hook: writes garbage bytes on the TCP link to `peer`.
    fn _inject_garbage(&self, py: Python<'_>, peer: usize) -> PyResult<()> {
        self.comm.inject_garbage(peer).map_err(|e| to_py_err(py, e))
    }
}

/// Bootstrap: `Bootstrap(comm_id, rank, size, host, ip, timeout, secret=b,
/// job=None)` listens; publish `info()` through the store; `connect([info of
/// every rank])`. `secret` (the job secret, non-empty, the same on every
/// rank) keys the handshake every TCP connection must pass; `job` names the
/// job in dumps (default: the communicator id).
#[pyclass(module = "cadence._core")]
struct Bootstrap {
    inner: Option<CoreBootstrap>,
}

#[pymethods]
impl Bootstrap {
    #[new]
    #[pyo3(signature = (comm_id, rank, size, host, ip, timeout=None, *, secret, job=None))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python signature
    fn new(
        py: Python<'_>,
        comm_id: &str,
        rank: usize,
        size: usize,
        host: &str,
        ip: &str,
        timeout: Option<f64>,
        secret: &[u8],
        job: Option<&str>,
    ) -> PyResult<Bootstrap> {
        let secret = JobSecret::new(secret).map_err(PyValueError::new_err)?;
        let mut cfg = Config::from_env().map_err(PyValueError::new_err)?;
        if let Some(t) = timeout {
            if !(t > 0.0 && t.is_finite()) {
                return Err(PyValueError::new_err(
                    "timeout must be a positive number of seconds",
                ));
            }
            cfg.timeout = Duration::from_secs_f64(t);
        }
        // One address, or one per NIC separated by commas.
        let ips: Vec<IpAddr> = ip
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .map_err(|_| PyValueError::new_err(format!("bad IP address {a:?}")))
            })
            .collect::<PyResult<_>>()?;
        let mut b = CoreBootstrap::with_nics(comm_id, rank, size, host, &ips, cfg, secret)
            .map_err(|e| to_py_err(py, e))?;
        if let Some(job) = job {
            b.set_job(job).map_err(|e| to_py_err(py, e))?;
        }
        Ok(Bootstrap { inner: Some(b) })
    }

    /// This rank's address record (JSON) to publish.
    fn info(&self) -> PyResult<String> {
        let b = self
            .inner
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        Ok(serde_json::to_string(&b.info).expect("serializable"))
    }

    /// Connects to every peer; `infos[r]` is rank r's `info()`.
    fn connect(&mut self, py: Python<'_>, infos: Vec<String>) -> PyResult<PyComm> {
        let b = self
            .inner
            .take()
            .ok_or_else(|| PyValueError::new_err("bootstrap already used"))?;
        let parsed = infos
            .iter()
            .map(|s| serde_json::from_str::<PeerInfo>(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(format!("bad peer info: {e}")))?;
        let comm = py
            .allow_threads(move || b.connect(parsed))
            .map_err(|e| to_py_err(py, e))?;
        Ok(PyComm::new(comm))
    }
}

/// Algorithms applicable to a collective, by name.
#[pyfunction]
fn algorithms(kind: &str) -> PyResult<Vec<&'static str>> {
    let k = CollKind::from_name(kind)
        .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))?;
    Ok(cadence_core::schedule::algos_for(k)
        .iter()
        .map(|a| a.name())
        .collect())
}

/// The path finder on a topology file's text (`cadence topo show`, the
/// profiler): for `hosts` (names in the file; default all of them, in file
/// order), the widest ring's host order (indices into `hosts`), its
/// bottleneck and that of `hosts`' own order (bytes/s per flow with every
/// ring edge busy), and the chain from host 0.
#[pyfunction]
#[pyo3(signature = (text, hosts=None))]
fn topo_ring(py: Python<'_>, text: &str, hosts: Option<Vec<String>>) -> PyResult<PyObject> {
    use cadence_core::fabric::{file::TopoFile, pathfind};
    let file =
        TopoFile::parse(text, std::path::Path::new("<text>")).map_err(PyValueError::new_err)?;
    let hosts = hosts.unwrap_or_else(|| file.hosts.clone());
    let fabric = file.fabric_for(&hosts).map_err(PyValueError::new_err)?;
    let (order, chain) = py.allow_threads(|| {
        (
            pathfind::widest_ring(&fabric),
            pathfind::widest_chain(&fabric, 0),
        )
    });
    let natural: Vec<usize> = (0..hosts.len()).collect();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("score", fabric.ring_score(&order))?;
    d.set_item("default_score", fabric.ring_score(&natural))?;
    d.set_item("order", order)?;
    d.set_item("chain", chain)?;
    Ok(d.into_any().unbind())
}

/// A topology file's alone rates, as the core reads them: the file's
/// matrix, or the one its `host_rates` give (a profile by shifted rounds).
#[pyfunction]
fn topo_rates(text: &str) -> PyResult<Vec<Vec<f64>>> {
    use cadence_core::fabric::file::TopoFile;
    let file =
        TopoFile::parse(text, std::path::Path::new("<text>")).map_err(PyValueError::new_err)?;
    Ok(file.rates)
}

/// Groups of hosts that share a bottleneck, from the alone rates the
/// profiler measured (`rates[a][b]`, bytes/s; what `cadence topo profile`
/// infers).
#[pyfunction]
fn topo_groups(rates: Vec<Vec<f64>>) -> PyResult<Vec<Vec<usize>>> {
    if rates.iter().any(|row| row.len() != rates.len()) {
        return Err(PyValueError::new_err("rates must be a square matrix"));
    }
    Ok(cadence_core::fabric::infer::groups_from_rates(&rates))
}

/// A modeled cluster for `cadence sim` (issue 15): a spec or topology file's
/// text (`origin`: its path, for messages and relative files) for `ranks`
/// ranks (None: the spec's own hosts × ranks per host). `profile=False`:
/// as a job with `CADENCE_TOPO_FILE=none` (no start-up profile).
#[pyclass(frozen)]
struct SimCluster {
    cluster: cadence_core::sim::run::Cluster,
    note: String,
}

#[pymethods]
impl SimCluster {
    #[new]
    #[pyo3(signature = (text, origin, ranks=None, profile=true))]
    fn new(text: &str, origin: &str, ranks: Option<usize>, profile: bool) -> PyResult<SimCluster> {
        let loaded = cadence_core::sim::spec::parse(text, std::path::Path::new(origin), ranks)
            .map_err(|e| PyValueError::new_err(format!("{origin}: {e}")))?;
        let note = loaded.note.clone();
        Ok(SimCluster {
            cluster: cadence_core::sim::run::Cluster::with_profile(loaded, profile),
            note,
        })
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.cluster.nranks()
    }

    #[getter]
    fn nhosts(&self) -> usize {
        self.cluster.model.topo.nhosts()
    }

    #[getter]
    fn note(&self) -> &str {
        &self.note
    }

    /// One line: how the ring order was chosen.
    #[getter]
    fn order(&self) -> &str {
        &self.cluster.order
    }

    /// The model's numbers, for people and for `--json`.
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = &self.cluster.model;
        let d = PyDict::new(py);
        d.set_item("hosts", m.topo.nhosts())?;
        d.set_item("ranks", m.topo.nranks())?;
        d.set_item("nic_out", m.nic_out.clone())?;
        d.set_item("nic_in", m.nic_in.clone())?;
        d.set_item("group_of", m.group_of.clone())?;
        d.set_item("group_out", m.group_out.clone())?;
        d.set_item("group_in", m.group_in.clone())?;
        d.set_item("tcp_alpha", m.tcp_alpha)?;
        d.set_item("hop_alpha", m.hop_alpha)?;
        d.set_item("shm_alpha", m.shm_alpha)?;
        d.set_item("tcp_overhead", m.tcp_overhead)?;
        d.set_item("shm_overhead", m.shm_overhead)?;
        d.set_item("shm_rate", m.shm_rate)?;
        d.set_item("mem_rate", m.mem_rate)?;
        d.set_item("gamma", m.gamma)?;
        d.set_item("ring_order", m.topo.host_order())?;
        // (burst seconds, peak bytes/s) of shaped links, or None.
        d.set_item("shaper", m.shaper.map(|s| (s.burst, s.peak)))?;
        // Cores every rank shares (None: a core each), a message's floor
        // cost on them, a call's per rank, and their seconds per byte of
        // the network stacks.
        d.set_item("shared_cores", m.shared_cores)?;
        d.set_item("loaded_overhead", m.loaded_overhead)?;
        d.set_item("call_overhead", m.call_overhead)?;
        d.set_item("stack_cost", m.stack_cost)?;
        Ok(d)
    }

    /// The algorithms of `kind` that apply on this cluster, by name.
    fn algorithms(&self, kind: &str) -> PyResult<Vec<&'static str>> {
        let k = CollKind::from_name(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {kind:?}")))?;
        let args = cadence_core::sim::run::args_for(k, self.cluster.nranks(), 1 << 20)
            .map_err(PyValueError::new_err)?;
        let topo = &self.cluster.auto.topo;
        Ok(cadence_core::schedule::algos_for(k)
            .iter()
            .filter(|&&a| cadence_core::schedule::applicable_on(&args, topo, a))
            .map(|a| a.name())
            .collect())
    }

    /// run(op, count, elem_size, algo=None, calls=1) -> (algo, seconds,
    /// messages): `op` on a full buffer of `count` elements, simulated;
    /// `algo` None runs the library's own choice. `calls` > 1: one call of
    /// samples of that many back to back, as `cadence bench` times them.
    #[pyo3(signature = (op, count, elem_size, algo=None, calls=1))]
    fn run(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        algo: Option<&str>,
        calls: usize,
    ) -> PyResult<(&'static str, f64, u64)> {
        let k = CollKind::from_name(op)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {op:?}")))?;
        let a = match algo {
            None => None,
            Some(name) => Some(
                Algo::from_name(name)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown algorithm {name:?}")))?,
            ),
        };
        let out = py.allow_threads(|| self.cluster.run(k, count, elem_size, a, calls));
        let (algo, o) = out.map_err(PyValueError::new_err)?;
        Ok((algo.name(), o.seconds, o.messages))
    }

    /// run_turns(op, count, elem_size, algos, calls, rounds, warmup) ->
    /// [(algo, seconds)]: `cadence bench --algo A,B,...` simulated as it
    /// times them, the algorithms taking turns sample by sample (None in
    /// `algos`: the library's choice); per algorithm, the median of its
    /// samples' seconds per call.
    #[pyo3(signature = (op, count, elem_size, algos, calls, rounds, warmup))]
    #[allow(clippy::too_many_arguments)]
    fn run_turns(
        &self,
        py: Python<'_>,
        op: &str,
        count: usize,
        elem_size: usize,
        algos: Vec<Option<String>>,
        calls: usize,
        rounds: usize,
        warmup: usize,
    ) -> PyResult<Vec<(&'static str, f64)>> {
        let k = CollKind::from_name(op)
            .ok_or_else(|| PyValueError::new_err(format!("unknown collective {op:?}")))?;
        let algos = algos
            .iter()
            .map(|a| match a.as_deref() {
                None | Some("auto") => Ok(None),
                Some(name) => Algo::from_name(name)
                    .map(Some)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown algorithm {name:?}"))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let timing = cadence_core::sim::run::BenchTiming {
            calls,
            rounds,
            warmup,
        };
        let out = py.allow_threads(|| self.cluster.run_turns(k, count, elem_size, &algos, timing));
        let ran = out.map_err(PyValueError::new_err)?;
        Ok(ran.into_iter().map(|(a, t)| (a.name(), t)).collect())
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CommError", m.py().get_type::<CommError>())?;
    m.add_class::<PyComm>()?;
    m.add_class::<Work>()?;
    m.add_class::<Bootstrap>()?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(topo_ring, m)?)?;
    m.add_function(wrap_pyfunction!(topo_rates, m)?)?;
    m.add_function(wrap_pyfunction!(topo_groups, m)?)?;
    m.add_class::<SimCluster>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ANY_SOURCE", ANY_SOURCE)?;
    Ok(())
}
