"""Buffer adapters for objects without a usable buffer protocol (torch tensors,
bfloat16). The Rust core calls `as_buffer`; the Python API uses the helpers to
allocate outputs of the same kind as the input."""

from __future__ import annotations

import sys

import numpy as np

from cadence._dtypes import NAMES


def _torch():
    return sys.modules.get("torch")


def is_tensor(obj) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


# torch dtype -> cadence dtype name, built when a tensor first comes by.
_TENSOR_DTYPES: dict = {}


def tensor_span(obj):
    """(address, bytes, dtype name) of a contiguous CPU tensor of a supported
    dtype; None for anything else (which then takes `as_buffer`, where the
    errors are). About 1 µs a tensor, where the numpy view `as_buffer` makes
    costs 4-6 µs, more than a small collective takes."""
    torch = _torch()
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if not _TENSOR_DTYPES:
        for name in NAMES:
            _TENSOR_DTYPES[getattr(torch, name)] = name
    name = _TENSOR_DTYPES.get(obj.dtype)
    if name is None or not obj.is_cpu or not obj.is_contiguous():
        return None
    return obj.data_ptr(), obj.nbytes, name


def as_buffer(obj, writable: bool):
    """Returns (numpy view sharing obj's memory, dtype name override or None)."""
    if is_tensor(obj):
        torch = _torch()
        if obj.device.type != "cpu":
            raise ValueError(
                f"cadence: tensor is on {obj.device}; this communicator takes CPU tensors"
            )
        if not obj.is_contiguous():
            raise ValueError("cadence: tensor must be contiguous (call .contiguous())")
        t = obj.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy(), "bfloat16"
        if t.dtype == torch.bool:
            raise ValueError("cadence: bool tensors are not supported; use uint8")
        return t.numpy(), None
    if isinstance(obj, np.ndarray):
        raise ValueError(
            f"cadence: numpy array must be C-contiguous{' and writable' if writable else ''}"
        )
    raise TypeError(
        f"cadence: expected a numpy array or a CPU torch tensor, got {type(obj).__name__}"
    )


def numel(x) -> int:
    return int(x.numel()) if is_tensor(x) else int(np.asarray(x).size)


def shape(x) -> tuple:
    return tuple(x.shape)


def empty(like, shape) -> object:
    """An uninitialised array/tensor of `shape` with `like`'s kind and dtype."""
    if is_tensor(like):
        return _torch().empty(shape, dtype=like.dtype)
    return np.empty(shape, dtype=like.dtype)
