"""The machinery the fused operators share: tiles, the compute pool, the
numpy/torch arithmetic, and the queue of collectives in flight.

How the overlap happens. The caller's thread computes the output one tile at
a time with the BLAS it already has (numpy's OpenBLAS, torch's MKL/oneDNN;
both release the GIL), and hands each finished tile to the communicator as an
asynchronous collective. The communicator's progress thread (Rust, no GIL)
runs the queued collectives in issue order, moving tile k across shared memory
or TCP and reducing it as it lands, while the caller computes tile k+1. While
nobody waits on it, the progress thread waits for data without spinning, so it
does not take cycles from the compute. Every rank issues the same collectives
in the same order (the tile plan depends only on shapes every rank shares), so
the collectives match across ranks as any others do, and a rank that passes a
different shape gets the collective's own mismatch error naming the peer.

Why not a kernel of our own in Rust: a hand-written GEMM would lose to the
BLAS the user already has by a wide margin; the core's part is moving and
reducing tiles, which it already does well.
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

# A tile's collective costs a few µs (shared memory) to ~100 µs (TCP) no
# matter its size, and the pipeline hides all but one tile's compute or
# communication: a handful of tiles of at least MIN_TILE_BYTES keeps the fixed
# costs small and the exposed tile short. Below 2 tiles' worth the operator
# runs unfused (one tile is exactly compute-then-communicate).
MIN_TILE_BYTES = 256 << 10
MAX_TILES = 8


def _torch():
    return sys.modules.get("torch")


def is_tensor(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


class Math:
    """matmul into a given output, allocation and copies, for numpy arrays or
    CPU torch tensors alike (all operands of one call are of one kind)."""

    def __init__(self, *operands):
        kinds = {is_tensor(x) for x in operands}
        if len(kinds) != 1:
            raise TypeError("cadence fused: operands must be all numpy arrays or all torch tensors")
        self.torch = kinds.pop()
        dtypes = {x.dtype for x in operands}
        if len(dtypes) != 1:
            raise TypeError(
                f"cadence fused: operands have different dtypes: {', '.join(map(str, dtypes))}"
            )
        self.dtype = dtypes.pop()
        if self.torch:
            for x in operands:
                if x.device.type != "cpu":
                    raise ValueError(
                        f"cadence fused: tensor is on {x.device}; the operators take CPU tensors"
                    )
        self.itemsize = (
            operands[0].element_size() if self.torch else np.dtype(self.dtype).itemsize
        )

    def prepare(self, x):
        """A contiguous operand that autograd does not track (the torch ops
        wrap these functions with their own backward)."""
        if self.torch:
            return x.detach().contiguous()
        return np.ascontiguousarray(x)

    def empty(self, shape):
        if self.torch:
            return _torch().empty(shape, dtype=self.dtype)
        return np.empty(shape, dtype=self.dtype)

    def matmul(self, a, b, out) -> None:
        if self.torch:
            _torch().matmul(a, b, out=out)
        else:
            np.matmul(a, b, out=out)


def tiles(rows: int, row_bytes: int, tile_rows: int | None,
          overlap: bool = True) -> list[tuple[int, int]]:  # fmt: skip
    """Row ranges [start, stop) covering `rows`: `tile_rows` each when given,
    else, when tiles can `overlap` (`can_overlap`), as many tiles as
    MIN_TILE_BYTES and MAX_TILES allow, of equal size; else one."""
    if rows == 0:
        return [(0, 0)]
    if tile_rows is None and not overlap:
        return [(0, rows)]
    if tile_rows is None:
        count = max(1, min(MAX_TILES, rows * row_bytes // MIN_TILE_BYTES, rows))
        tile_rows = math.ceil(rows / count)
    elif tile_rows < 1:
        raise ValueError(f"cadence fused: tile_rows must be at least 1, got {tile_rows}")
    return [(a, min(a + tile_rows, rows)) for a in range(0, rows, tile_rows)]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def can_overlap(comm) -> bool:
    """Whether tiles can overlap at all: across hosts the wire time can hide
    compute; on one host, where moving a tile is itself CPU work, only when
    the host has a core per rank to spare for it. Measured on 2 cores with 2
    and 4 ranks: tiled collectives ran 0.88-1.06x the plain path (no core to
    overlap on, and one collective per tile to pay)."""
    if len(set(comm.hosts)) > 1:
        return True
    return _cores() >= 2 * max(1, comm.local_size)


def compute_threads(comm) -> int:
    """The rank's share of the host's cores: the compute pool's size."""
    cores = _cores()
    env = os.environ.get("CADENCE_COMPUTE_THREADS")
    if env:
        value = int(env)
        if value < 1:
            raise ValueError(f"CADENCE_COMPUTE_THREADS must be at least 1, got {env}")
        return value
    return max(1, cores // max(1, comm.local_size))


_controller = None

# Communicators by id, for the torch ops (cadence/torch/fused.py), whose
# arguments can only be tensors and plain values: they name the communicator.
_communicators: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register(comm) -> None:
    _communicators[comm.id] = comm


def communicator(comm_id: str):
    try:
        return _communicators[comm_id]
    except KeyError:
        raise ValueError(f"cadence: no live communicator {comm_id!r} in this process") from None


@contextmanager
def compute_pool(comm, math_: Math) -> Iterator[None]:
    """Limit the BLAS pool (numpy) or torch's intra-op pool to the rank's
    share of the cores for the duration of one operator, fused or not, so that
    ranks on one host do not oversubscribe it and fused and unfused runs
    compute with the same resources."""
    global _controller
    threads = getattr(comm, "_fused_threads", None)
    if threads is None:
        threads = compute_threads(comm)
        comm._fused_threads = threads
    if math_.torch:
        torch = _torch()
        before = torch.get_num_threads()
        if before != threads:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if before != threads:
                torch.set_num_threads(before)
        return
    from threadpoolctl import ThreadpoolController

    if _controller is None:
        _controller = ThreadpoolController()
    with _controller.limit(limits=threads, user_api="blas"):
        yield


class InFlight:
    """The asynchronous collectives of one operator. `close()` waits for all of
    them even when one failed or the compute raised (their buffers must not be
    reused while the progress thread still writes them), then raises the first
    error, with a note saying which operator and tile it came from."""

    def __init__(self, op: str):
        self.op = op
        self.works: list = []
        self.labels: list[str] = []

    def add(self, work, label: str) -> None:
        self.works.append(work)
        self.labels.append(label)

    def wait(self, index: int):
        try:
            return self.works[index].wait()
        except Exception as e:
            e.add_note(f"in cadence {self.op}, {self.labels[index]}")
            raise

    def close(self, error: BaseException | None = None) -> None:
        for work, label in zip(self.works, self.labels, strict=True):
            try:
                work.wait()
            except BaseException as e:  # noqa: B036 - re-raised below, after every wait
                if error is None:
                    e.add_note(f"in cadence {self.op}, {label}")
                    error = e
        self.works.clear()
        if error is not None:
            raise error
