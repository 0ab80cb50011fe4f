//! Buffers in: a contiguous numpy array, CPU torch tensor or buffer-protocol
//! object as a pointer, a length in bytes and the core's element type. Small
//! collectives take microseconds, so the common kinds have fast paths that
//! skip the buffer protocol; everything else (and every error message) goes
//! through it, or through `cadence._buffers` for what has no buffer protocol.

use cadence_core::DType;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A borrowed view of a contiguous buffer: pointer, bytes and element type.
#[derive(Clone, Copy)]
pub(crate) struct View {
    pub(crate) ptr: *mut u8,
    pub(crate) bytes: usize,
    pub(crate) dtype: DType,
}

/// What the buffer protocol said: pointer, bytes, and the element type when
/// cadence knows its format (else the format, for the error message).
struct RawView {
    ptr: *mut u8,
    bytes: usize,
    dtype: Result<DType, String>,
}

fn unsupported(fmt: &str) -> PyErr {
    PyValueError::new_err(unsupported_message(fmt))
}

fn unsupported_message(fmt: &str) -> String {
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    format!(
        "unsupported element type (buffer format {fmt}); cadence supports {}",
        names.join(", ")
    )
}

/// The element type of one format character (the struct module's, which
/// numpy's dtypes also carry) at the native sizes of 64-bit Linux.
fn dtype_of_code(code: u8) -> Option<DType> {
    Some(match code {
        b'e' => DType::F16,
        b'f' => DType::F32,
        b'd' => DType::F64,
        b'b' => DType::I8,
        b'B' => DType::U8,
        b'i' => DType::I32,
        b'l' | b'q' => DType::I64,
        _ => return None,
    })
}

/// The element type of a buffer-protocol format whose items take `itemsize`
/// bytes: one format character after an optional native or little-endian
/// byte-order mark. `l` (C long) is 4 bytes on some platforms.
fn dtype_of_format(fmt: &str, itemsize: usize) -> Option<DType> {
    let &[code] = fmt.trim_start_matches(['@', '=', '<', '!']).as_bytes() else {
        return None;
    };
    if code == b'l' && itemsize == 4 {
        return Some(DType::I32);
    }
    dtype_of_code(code).filter(|d| d.size() == itemsize)
}

/// Reads the buffer of `obj` through the buffer protocol; objects that have
/// none (torch tensors, bfloat16) go through `cadence._buffers.as_buffer`,
/// which returns `(array, dtype_name_or_None)`.
/// `coll` and `role` ("allreduce", "input") name the buffer in errors; they
/// are only formatted on failure (this runs on every call).
pub(crate) fn view(
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
/// of them, which costs more than a small collective takes. `None` for
/// anything else, unusual tensors included: the general path has their
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
    Ok(Some(tensor_span_view(addr, bytes, dtype)))
}

/// A tensor's storage as a view, from its address and size.
pub(crate) fn tensor_span_view(addr: usize, bytes: usize, dtype: DType) -> View {
    View {
        // An empty tensor may have no storage at all (address 0).
        ptr: if bytes == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            addr as *mut u8
        },
        bytes,
        dtype,
    }
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
        let dtype = dtype_of_code(d.type_char as u8)?;
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

/// `x.shape` as sizes (numpy arrays and torch tensors alike).
pub(crate) fn shape_of(x: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    x.getattr("shape")?.extract()
}

/// An uninitialised array or tensor of `shape` with `like`'s kind and dtype
/// (`cadence._buffers.empty`; only when the caller gave no output).
pub(crate) fn empty_like<'py>(
    py: Python<'py>,
    like: &Bound<'py, PyAny>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let shape = PyTuple::new(py, shape)?;
    py.import("cadence._buffers")?
        .getattr("empty")?
        .call1((like, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_name_the_core_types() {
        let cases = [
            ("e", 2, Some(DType::F16)),
            ("<f", 4, Some(DType::F32)),
            ("=d", 8, Some(DType::F64)),
            ("b", 1, Some(DType::I8)),
            ("B", 1, Some(DType::U8)),
            ("@i", 4, Some(DType::I32)),
            ("l", 4, Some(DType::I32)),
            ("l", 8, Some(DType::I64)),
            ("q", 8, Some(DType::I64)),
            ("!q", 8, Some(DType::I64)),
            // Sizes that do not fit the code, byte orders and shapes that are not native.
            ("i", 8, None),
            ("q", 4, None),
            ("f", 8, None),
            (">f", 4, None),
            ("2f", 8, None),
            ("ff", 4, None),
            ("", 1, None),
            ("?", 1, None),
            ("h", 2, None),
        ];
        for (fmt, itemsize, want) in cases {
            assert_eq!(dtype_of_format(fmt, itemsize), want, "{fmt:?} {itemsize}");
        }
    }

    #[test]
    fn the_unsupported_message_lists_every_core_type() {
        assert_eq!(
            unsupported_message("'h'"),
            "unsupported element type (buffer format 'h'); cadence supports float16, bfloat16, \
             float32, float64, int8, uint8, int32, int64"
        );
    }
}
