"""Torch tensors as cadence buffers.

The core takes host memory, contiguous, in one of eight element types. A
tensor that is all three is handed over as it is (no copy). Any other tensor
is *staged*: copied to a contiguous host tensor, viewed or widened to a type
the core handles, and copied back into the user's tensor when the operation
finishes. Terms used below:

- *host*: the contiguous CPU tensor holding the user's values (the tensor
  itself when it already is one);
- *buf*: what the core reads and writes, a view of host or a widened copy;
- *move* operations (broadcast, gathers, scatters, all-to-all, send/recv) only
  copy bytes, so any element type travels as its bytes;
- *reductions* need an element type the core can add.
"""

from __future__ import annotations

import torch
from torch.distributed import ReduceOp

_R = ReduceOp.RedOpType

NATIVE = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int32, torch.int64,
})

# Reduced in a wider type, then narrowed back: integer sums and products wrap
# modulo 2^bits either way, min and max are exact, so the bits match a native
# reduction. float8 sums round once more than a native fp8 sum would.
_WIDER = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
for _name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
              "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _WIDER[getattr(torch, _name)] = torch.float32

_OP_NAMES = {
    _R.SUM: "sum", _R.AVG: "avg", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max",
    _R.PREMUL_SUM: "premul_sum",
}
# NCCL's convention for bool: a sum is a logical or, a product a logical and.
_BOOL_OPS = {_R.SUM: "max", _R.MAX: "max", _R.PRODUCT: "min", _R.MIN: "min"}
BITWISE = frozenset({_R.BAND, _R.BOR, _R.BXOR})
# Ops that act on real and imaginary parts independently.
_COMPLEX_OK = frozenset({_R.SUM, _R.AVG, _R.PREMUL_SUM})


def _premul_factor(op: ReduceOp):
    """PREMUL_SUM's factor: `op.factor` from torch 2.7 on; before, only its
    pickled state (op, factor) carries it."""
    if hasattr(op, "factor"):
        return op.factor
    return op.__getstate__()[1]


class Reduction:
    """A torch ReduceOp, read once: its kind and, for PREMUL_SUM, the factor."""

    __slots__ = ("kind", "factor")

    def __init__(self, op) -> None:
        if isinstance(op, ReduceOp):
            self.kind = op.op
            f = _premul_factor(op) if self.kind == _R.PREMUL_SUM else None
            self.factor = float(f) if f is not None else None
        else:
            self.kind = ReduceOp(op).op
            self.factor = None

    @property
    def name(self) -> str:
        return str(self.kind).rsplit(".", 1)[-1]

    def for_dtype(self, dtype: torch.dtype) -> str:
        """The cadence op name that reduces `dtype` the way torch means it."""
        k = self.kind
        if k in BITWISE:
            raise AssertionError("bitwise reductions are handled by gathering")
        if dtype == torch.bool:
            if k not in _BOOL_OPS:
                raise ValueError(f"cadence: ReduceOp.{self.name} is not defined for bool tensors")
            return _BOOL_OPS[k]
        if dtype.is_complex and k not in _COMPLEX_OK:
            raise ValueError(f"cadence: ReduceOp.{self.name} is not defined for complex tensors")
        if dtype == torch.uint64 and k not in (_R.SUM, _R.PRODUCT):
            raise ValueError(
                f"cadence: ReduceOp.{self.name} on uint64 is not supported (the core has no "
                "unsigned 64-bit type; SUM and PRODUCT work through int64)"
            )
        return _OP_NAMES[k]


def _reduce_view(host: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(buf, widened copy or None) for a reduction over `host`."""
    dt = host.dtype
    if dt in NATIVE:
        return host, None
    flat = host.reshape(-1)
    if dt == torch.bool:
        return flat.view(torch.uint8), None
    if dt.is_complex:
        return torch.view_as_real(flat).reshape(-1), None
    if dt == torch.uint64:
        return flat.view(torch.int64), None
    wide = _WIDER.get(dt)
    if wide is None:
        raise TypeError(f"cadence: cannot reduce tensors of {dt}")
    w = flat.to(wide)
    return w, w


def _move_view(host: torch.Tensor) -> torch.Tensor:
    return host if host.dtype in NATIVE else host.reshape(-1).view(torch.uint8)


class Staged:
    """A user tensor and the buffer the core works on in its place."""

    __slots__ = ("orig", "buf", "_back")

    def __init__(self, orig: torch.Tensor, buf: torch.Tensor, back: torch.Tensor | None):
        self.orig = orig
        self.buf = buf
        self._back = back

    @property
    def copied(self) -> bool:
        return self._back is not None

    def restore(self) -> None:
        """Puts the result into the user's tensor if the core wrote elsewhere."""
        if self._back is not None:
            self.orig.copy_(self._back.view(self.orig.shape))


def stage(t: torch.Tensor, *, reduce: bool, read: bool = True) -> Staged:
    """Stages `t` for a reduction (`reduce`) or a move. `read=False` for
    output-only tensors: their current values are not copied in."""
    if t.is_cpu and t.dtype in NATIVE and t.is_contiguous():
        return Staged(t, t, None)  # the common case, kept cheap
    host = t.detach().resolve_conj().resolve_neg()  # lazy conj/neg views: materialize
    copied = host.data_ptr() != t.data_ptr() if host.numel() else False
    if host.device.type != "cpu" or not host.is_contiguous():
        host = host.cpu().contiguous() if read else torch.empty(host.shape, dtype=host.dtype)
        copied = True
    if reduce:
        buf, wide = _reduce_view(host)
    else:
        buf, wide = _move_view(host), None
    back = wide if wide is not None else (host if copied else None)
    return Staged(t, buf, back)


def core(t: torch.Tensor):
    """`t` as handed to the core: a numpy view where numpy has the type (the
    core's quickest way in, a few microseconds less per call than a tensor),
    else the tensor (bfloat16), which the core views itself."""
    if t.dtype == torch.bfloat16:
        return t
    return (t.detach() if t.requires_grad else t).numpy()


def flat_buffer(like: torch.Tensor, numel: int, *, reduce: bool) -> torch.Tensor:
    """A host buffer for `numel` elements of `like`'s type, in the core's type."""
    return stage(torch.empty(numel, dtype=like.dtype), reduce=reduce, read=False).buf


def elements(t: torch.Tensor, *, reduce: bool) -> int:
    """How many core elements `t` occupies once staged."""
    dt = t.dtype
    n = t.numel()
    if dt in NATIVE or (reduce and (dt == torch.bool or dt in _WIDER or dt == torch.uint64)):
        return n
    if reduce and dt.is_complex:
        return 2 * n
    return n * t.element_size()


def concat(tensors, *, reduce: bool) -> torch.Tensor:
    """The tensors' values, staged and laid end to end in one host buffer."""
    parts = [stage(t, reduce=reduce).buf.reshape(-1) for t in tensors]
    if not parts:
        raise ValueError("cadence: empty tensor list")
    return torch.cat(parts)


def unpack(flat: torch.Tensor, tensors, counts) -> None:
    """Copies consecutive pieces of `flat` (`counts` core elements each) into
    `tensors`, undoing the staging view."""
    for t, piece in zip(tensors, flat.split(list(counts)), strict=True):
        t.copy_(_unview(piece, t))


def _unview(piece: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if piece.dtype == like.dtype:
        return piece.view(like.shape)
    if like.dtype.is_complex and piece.dtype != torch.uint8:
        return torch.view_as_complex(piece.view(-1, 2)).view(like.shape)
    if piece.dtype == torch.uint8 or piece.element_size() == like.element_size():
        return piece.view(like.dtype).view(like.shape)
    return piece.view(like.shape)  # widened: copy_ narrows it
