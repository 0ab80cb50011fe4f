"""The tensor-parallel fused operators: a matrix product overlapped with
the allreduce, allgather or reduce-scatter that moves it (docs/fused.md).

Each operator is also a method of `cadence.Communicator` (`comm.gemv_allreduce(
w, x)`), takes numpy arrays or CPU torch tensors (float32, float64, bfloat16,
float16), and has a plain path behind `fused=False`: compute everything, then
run one collective. The fused path computes the output in tiles and hands each
finished tile to the communicator while the next one is computed (see
`_pipeline`); `tile_rows` overrides the automatic tile size, and outputs
smaller than two tiles of 256 KiB run unfused by themselves (a single tile is
the plain path). `algo` picks the collective's algorithm, as for any
collective.

Shapes (r: this rank, n ranks; `_shard` operands differ per rank):

- `gemv_allreduce(w_shard (M, K_r), x_shard (K_r,))` -> (M,): sum over ranks
  of w_r @ x_r, the row-parallel linear layer of tensor-parallel decoding.
- `gemm_allreduce(x_shard (B, K_r), w_shard (K_r, N))` -> (B, N): the same for
  a batch.
- `allgather_matmul(a_shard (m, K), b (K, N))` -> (n*m, N): the rows of every
  rank's a_shard, in rank order, times b (the column-parallel input side of
  async tensor parallelism); `return_gathered=True` also returns the gathered
  (n*m, K) matrix (the backward pass needs it).
- `matmul_reduce_scatter(a_shard (M, K_r), b_shard (K_r, N))` -> (m_r, N):
  rank r's block of the rows of sum over ranks of a_r @ b_r, with the M rows
  split as numpy.array_split does (the first M % n ranks get one more row).
"""

from __future__ import annotations

from cadence.fused._pipeline import InFlight, Math, can_overlap, compute_pool, tiles

__all__ = ["allgather_matmul", "gemm_allreduce", "gemv_allreduce", "matmul_reduce_scatter"]


def _tile_algo(comm, algo, kind: str, counts: list[int], like) -> str | None:
    """The algorithm for every tile: the caller's; across hosts, ring; else
    the one the library picks for the whole output (tiles run back to back,
    like one transfer of the whole size).

    Why ring across hosts: the choice for one collective prices it alone, and
    back to back an algorithm whose peers change from step to step lets a
    rank that runs ahead send its next tile into a host that still receives
    the last one, two flows on one link. Measured on 4 hosts at 1 Gbit/s, 8
    allgathers of 2 MiB back to back: recursive doubling (auto's pick) 168-183
    ms, ring 105 ms, the same as apart; ring's ranks only ever receive from
    one neighbour."""
    if algo not in (None, "auto") or comm.size == 1:
        return algo
    if len(set(comm.hosts)) > 1 and "ring" in comm.algorithms(kind):
        return "ring"
    return comm._c.choose(kind, counts, comm._c.dtype_of(like))


def _shape_error(op: str, detail: str) -> ValueError:
    return ValueError(f"cadence {op}: {detail}")


def _run_tiles(op: str, plan, compute, communicate) -> None:
    """compute(t) then communicate(t, async_op) for each tile t of `plan`, in
    order; waits for every collective before returning or raising. A single
    tile (the plain path) runs its collective inline, on this thread: no
    hand-off to the progress thread and back (measured: 0.1 ms a call)."""
    if len(plan) == 1:
        compute(0)
        communicate(0, False)
        return
    flight = InFlight(op)
    try:
        for t, (lo, hi) in enumerate(plan):
            compute(t)
            flight.add(communicate(t, True), f"tile {t + 1} of {len(plan)} (rows {lo}..{hi})")
    except BaseException as e:
        flight.close(e)
    flight.close()


def gemv_allreduce(comm, w_shard, x_shard, *, fused=True, tile_rows=None, algo=None):
    """sum over ranks of w_shard @ x_shard: (M, K_r) @ (K_r,) -> (M,) on every rank."""
    m = Math(w_shard, x_shard)
    w, x = m.prepare(w_shard), m.prepare(x_shard)
    if w.ndim != 2 or x.ndim != 1 or w.shape[1] != x.shape[0]:
        raise _shape_error("gemv_allreduce", f"w_shard {tuple(w.shape)} and x_shard "
                           f"{tuple(x.shape)} do not multiply as (M, K) @ (K,)")  # fmt: skip
    y = m.empty((w.shape[0],))
    return _allreduce_rows(comm, m, "gemv_allreduce", y,
                           lambda lo, hi: m.matmul(w[lo:hi], x, y[lo:hi]),
                           fused, tile_rows, algo)  # fmt: skip


def gemm_allreduce(comm, x_shard, w_shard, *, fused=True, tile_rows=None, algo=None):
    """sum over ranks of x_shard @ w_shard: (B, K_r) @ (K_r, N) -> (B, N) on every
    rank. Tiles are blocks of output rows."""
    m = Math(x_shard, w_shard)
    x, w = m.prepare(x_shard), m.prepare(w_shard)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise _shape_error("gemm_allreduce", f"x_shard {tuple(x.shape)} and w_shard "
                           f"{tuple(w.shape)} do not multiply as (B, K) @ (K, N)")  # fmt: skip
    y = m.empty((x.shape[0], w.shape[1]))
    return _allreduce_rows(comm, m, "gemm_allreduce", y,
                           lambda lo, hi: m.matmul(x[lo:hi], w, y[lo:hi]),
                           fused, tile_rows, algo)  # fmt: skip


def _allreduce_rows(comm, m: Math, op: str, y, product, fused, tile_rows, algo):
    """y, computed a block of rows at a time by product(lo, hi), each block
    summed over ranks while the next is computed."""
    rows = y.shape[0]
    row_bytes = (y.shape[1] if y.ndim == 2 else 1) * m.itemsize
    plan = tiles(rows, row_bytes, tile_rows, can_overlap(comm)) if fused else [(0, rows)]
    if len(plan) > 1:
        algo = _tile_algo(comm, algo, "allreduce", [y.numel() if m.torch else y.size], y)
    with compute_pool(comm, m):
        _run_tiles(
            op, plan,
            lambda t: product(*plan[t]),
            lambda t, a: comm.allreduce(y[slice(*plan[t])], algo=algo, async_op=a),
        )  # fmt: skip
    return y


def allgather_matmul(comm, a_shard, b, *, fused=True, tile_rows=None, algo=None,
                     return_gathered=False):  # fmt: skip
    """The gathered rows of every rank's a_shard (m, K), in rank order, times
    b (K, N) -> (n*m, N). Every rank's a_shard has the same shape.

    Fused: every tile of a_shard's rows is gathered by its own collective, all
    issued at once; the local block is multiplied first (it needs nothing),
    then each tile's peer rows as soon as that tile has arrived."""
    m = Math(a_shard, b)
    a_, b_ = m.prepare(a_shard), m.prepare(b)
    if a_.ndim != 2 or b_.ndim != 2 or a_.shape[1] != b_.shape[0]:
        raise _shape_error("allgather_matmul", f"a_shard {tuple(a_.shape)} and b "
                           f"{tuple(b_.shape)} do not multiply as (m, K) @ (K, N)")  # fmt: skip
    n, r = comm.size, comm.rank
    rows, k, cols = a_.shape[0], a_.shape[1], b_.shape[1]
    out = m.empty((n * rows, cols))
    # Where tiles cannot overlap (one host, no core to spare) the plain path
    # is the fastest: one collective, one product.
    fused = fused and (tile_rows is not None or can_overlap(comm))
    gathered = m.empty((n, rows, k)) if return_gathered or not fused else None
    with compute_pool(comm, m):
        if not fused:
            comm.allgather(a_, out=gathered, algo=algo)
            m.matmul(gathered.reshape(n * rows, k), b_, out)
            return (out, gathered.reshape(n * rows, k)) if return_gathered else out
        plan = tiles(rows, k * m.itemsize, tile_rows)
        algo = _tile_algo(comm, algo, "allgather", [rows * k] * n, a_)
        bufs = [m.empty((n, hi - lo, k)) for lo, hi in plan]
        flight = InFlight("allgather_matmul")
        try:
            for t, ((lo, hi), buf) in enumerate(zip(plan, bufs, strict=True)):
                work = comm.allgather(a_[lo:hi], out=buf, algo=algo, async_op=True)
                flight.add(work, f"tile {t + 1} of {len(plan)} (rows {lo}..{hi})")
            m.matmul(a_, b_, out[r * rows:(r + 1) * rows])
            for t, ((lo, hi), buf) in enumerate(zip(plan, bufs, strict=True)):
                flight.wait(t)
                for s in ((r + j) % n for j in range(1, n)):
                    m.matmul(buf[s], b_, out[s * rows + lo:s * rows + hi])
                if gathered is not None:
                    gathered[:, lo:hi] = buf
        except BaseException as e:
            flight.close(e)
        flight.close()
    if return_gathered:
        return out, gathered.reshape(n * rows, k)
    return out


def row_blocks(total: int, n: int) -> list[int]:
    """Rows of each rank's block, as numpy.array_split splits `total`."""
    q, extra = divmod(total, n)
    return [q + (j < extra) for j in range(n)]


def matmul_reduce_scatter(comm, a_shard, b_shard, *, fused=True, tile_rows=None, algo=None):
    """Rank r's block of the rows of sum over ranks of a_shard @ b_shard:
    (M, K_r) @ (K_r, N) -> (m_r, N), the M rows split as numpy.array_split
    does.

    Fused: tile t holds rows [lo, hi) of every rank's block; its products are
    computed peers' blocks first, this rank's last, and reduce-scattered as
    one collective while tile t+1 is computed."""
    m = Math(a_shard, b_shard)
    a_, b_ = m.prepare(a_shard), m.prepare(b_shard)
    if a_.ndim != 2 or b_.ndim != 2 or a_.shape[1] != b_.shape[0]:
        raise _shape_error("matmul_reduce_scatter", f"a_shard {tuple(a_.shape)} and b_shard "
                           f"{tuple(b_.shape)} do not multiply as (M, K) @ (K, N)")  # fmt: skip
    n, r = comm.size, comm.rank
    total, cols = a_.shape[0], b_.shape[1]
    blocks = row_blocks(total, n)
    starts = [sum(blocks[:j]) for j in range(n)]
    out = m.empty((blocks[r], cols))
    fused = fused and (tile_rows is not None or can_overlap(comm))  # as in allgather_matmul
    with compute_pool(comm, m):
        if not fused:
            full = m.empty((total, cols))
            m.matmul(a_, b_, full)
            comm.reduce_scatterv(full, [c * cols for c in blocks], out=out, algo=algo)
            return out
        plan = tiles(blocks[0], n * cols * m.itemsize, tile_rows)
        algo = _tile_algo(comm, algo, "reduce_scatter", [c * cols for c in blocks], a_)
        order = [(r + j) % n for j in range(1, n)] + [r]

        def piece(lo: int, hi: int) -> list[int]:
            return [max(0, min(hi, blocks[j]) - lo) for j in range(n)]

        bufs = [m.empty((sum(piece(lo, hi)), cols)) for lo, hi in plan]

        def compute(t: int) -> None:
            lo, hi = plan[t]
            sizes = piece(lo, hi)
            at = [sum(sizes[:j]) for j in range(n)]
            for j in order:
                if sizes[j]:
                    src = a_[starts[j] + lo:starts[j] + lo + sizes[j]]
                    m.matmul(src, b_, bufs[t][at[j]:at[j] + sizes[j]])

        def communicate(t: int, async_op: bool):
            lo, hi = plan[t]
            sizes = piece(lo, hi)
            dst = out[lo:lo + sizes[r]]
            return comm.reduce_scatterv(bufs[t], [c * cols for c in sizes], out=dst,
                                        algo=algo, async_op=async_op)  # fmt: skip

        _run_tiles("matmul_reduce_scatter", plan, compute, communicate)
    return out
