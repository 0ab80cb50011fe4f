"""Definitions shared by the `cadence bench` launcher and its workers.

Sizes follow nccl-tests: a size is the bytes of the *full* buffer of the
collective (allgather: the gathered output; reduce-scatter and all-to-all: the
full input), and

    algbw = bytes / time,    busbw = algbw * factor(op, nranks)

This module must stay cheap to import: the workers import it before torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence import _dtypes as dtypes
from cadence.units import format_size, parse_size  # noqa: F401 - their old home

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "reduce")
REDUCING_OPS = frozenset({"allreduce", "reduce_scatter", "reduce"})
# Collectives that work on one buffer in place; the others read `inp`, write `out`.
IN_PLACE_OPS = frozenset({"allreduce", "broadcast"})
ROOT = 0
# The page size that `cadence bench --offset` places buffers against.
PAGE = 4096


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    # Every integer in [0, max_exact] is represented exactly, so sums of the
    # check pattern stay exact (no rounding, no overflow).
    max_exact: int


_SPECS = {
    d.name: d
    for d in (
        DType("float16", 2, 2**11),
        DType("bfloat16", 2, 2**8),
        DType("float32", 4, 2**24),
        DType("float64", 8, 2**53),
        DType("int8", 1, 2**7 - 1),
        DType("uint8", 1, 2**8 - 1),
        DType("int32", 4, 2**31 - 1),
        DType("int64", 8, 2**63 - 1),
    )
}
# Every type the core takes, the default (float32) first: the order `--dtype`
# lists its choices in.
DTYPES: dict[str, DType] = {
    name: _SPECS[name] for name in ("float32", *(n for n in dtypes.NAMES if n != "float32"))
}

def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """minbytes, minbytes*factor, ... while <= maxbytes (as nccl-tests' -b/-e/-f)."""
    if factor < 2:
        raise ValueError("the step factor must be at least 2")
    if minbytes > maxbytes:
        raise ValueError(f"min size {minbytes} is larger than max size {maxbytes}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


def busbw_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: what each rank must move, relative to
    the buffer, for an optimal algorithm."""
    n = nranks
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "allgather", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


@dataclass(frozen=True)
class Layout:
    """Element counts of one collective at one size."""

    in_count: int  # elements of the input (of the one buffer, for in-place ops)
    out_count: int  # elements of the output (0 for in-place ops)
    nbytes: int  # the full buffer, as reported (may be below the requested size)

    @property
    def count(self) -> int:
        """Elements of the full buffer (the table's `count` column)."""
        return max(self.in_count, self.out_count)


def layout(op: str, nbytes: int, itemsize: int, nranks: int) -> Layout | None:
    """Buffers for `op` on a full buffer of at most `nbytes` bytes, or None when
    the size holds no element (per rank, for the ops that split the buffer)."""
    count = nbytes // itemsize
    if op in IN_PLACE_OPS:
        return Layout(count, 0, count * itemsize) if count else None
    if op == "reduce":
        return Layout(count, count, count * itemsize) if count else None
    part = count // nranks
    if not part:
        return None
    full = part * nranks
    if op == "allgather":
        return Layout(part, full, full * itemsize)
    if op == "reduce_scatter":
        return Layout(full, part, full * itemsize)
    if op == "alltoall":
        return Layout(full, full, full * itemsize)
    raise ValueError(f"unknown op {op!r}")


def pattern_modulus(dtype: DType, nranks: int) -> int:
    """Check values lie in [0, modulus): small integers whose sum over all ranks
    is exact in `dtype`."""
    return max(1, min(97, dtype.max_exact // nranks))


def p99(samples: list[float]) -> float:
    """The 99th percentile of the samples (linear interpolation between the
    two nearest, numpy's default): with the default 20 samples it sits
    between the largest two, so one stalled sample shows."""
    import numpy as np  # here, not at the top: this module stays cheap to import

    return float(np.percentile(samples, 99))
