"""The all-to-all operators: each rank computes, for every other rank, the
rows that rank needs, and sends them as soon as they are computed.

- `embedding_bag_alltoall(tables, indices, offsets, mode)`: the DLRM forward
  exchange. Rank r owns some embedding tables (list of (rows_t, D) arrays),
  gets the indices of its tables for the whole batch of B bags
  (`indices[t]`, 1-D, and `offsets[t]`, B starts as torch's EmbeddingBag
  takes them), pools them ("sum" or "mean"; an empty bag pools to zeros),
  and receives the pooled rows of its own batch slice (B split as
  numpy.array_split does) for every table of every rank: (b_r, T, D),
  tables in rank order.
- `gemm_alltoall(tokens, expert_weights, routing)`: mixture-of-experts.
  tokens (T_r, H) and routing (T_r,), each token's expert in [0, E); rank q
  owns experts [q*E_q, (q+1)*E_q) (expert_weights (E_q, H, H_out), E_q the
  same on every rank). Tokens travel to their experts' ranks, each expert
  multiplies its tokens, and every token's output comes back to its rank, in
  the token's place: (T_r, H_out).

The exchange runs in rounds: in round k rank r sends to r+k and receives from
r-k (mod n), so every link carries one message per round and no rank waits on
a peer that is busy with another. Fused, the payload of round k is computed
just before it is queued, the next one while it travels, peers' rows first
and this rank's own last (it needs no communication). Every rank queues its
rounds in the same order whatever it computes, which is what keeps the
point-to-point messages of a round matched and free of deadlock.
"""

from __future__ import annotations

import numpy as np

from cadence.fused._pipeline import MIN_TILE_BYTES, InFlight, Math, compute_pool
from cadence.fused.matmul import row_blocks

MODES = ("sum", "mean")


def _torch():
    import torch

    return torch


def _rounds_pay(total_bytes: int, n: int) -> bool:
    """Whether rounds beat one all-to-all: from 2 x MIN_TILE_BYTES sent per
    rank on average. Below, a round's fixed costs (a send and a receive on
    the progress thread) outweigh the overlap: measured on 2 ranks, 256 KiB
    per rank 0.97-1.00x, 1 MiB 1.37-1.66x. Every rank decides alike: the
    total is known to all."""
    return n > 1 and total_bytes >= n * 2 * MIN_TILE_BYTES


def _pool_numpy(table, idx, starts, mode: str, out) -> None:
    """out[i] = sum (or mean) of table[idx[starts[i]:starts[i+1]]]; starts
    has one more entry than out (the end)."""
    lengths = np.diff(starts)
    out[...] = 0
    nonempty = lengths > 0
    if idx.size:
        # reduceat sums [starts[i], starts[i+1]) for the non-empty bags only:
        # for an empty one it would return a row instead of zeros.
        rows = table[idx[starts[0]:starts[-1]]]
        sums = np.add.reduceat(rows, (starts[:-1] - starts[0])[nonempty], axis=0)
        out[nonempty] = sums
    if mode == "mean":
        out[nonempty] /= lengths[nonempty, None].astype(out.dtype)


def _pool_numpy_fast(table, idx, starts, mode: str, out) -> None:
    """numpy arrays pooled by torch's embedding_bag kernel when torch is
    installed (zero-copy views; measured 10x faster than reduceat for 8192
    bags of 2 rows of 64 floats), else by `_pool_numpy`."""
    try:
        import torch
    except ImportError:
        return _pool_numpy(table, idx, starts, mode, out)
    _pool_torch(torch.from_numpy(table), torch.from_numpy(idx), starts, mode,
                torch.from_numpy(out))  # fmt: skip


def _pool_torch(table, idx, starts, mode: str, out) -> None:
    torch = _torch()
    seg = idx[starts[0]:starts[-1]]
    offs = torch.as_tensor(starts[:-1] - starts[0], dtype=torch.int64)
    pooled = torch.nn.functional.embedding_bag(seg, table, offs, mode=mode)
    out.copy_(pooled)


def embedding_bag_alltoall(comm, tables, indices, offsets, *, mode="sum", fused=True,
                           rounds=None):  # fmt: skip
    """Pooled embeddings of this rank's batch slice from every rank's tables:
    (b_r, T, D). See the module's docstring. `rounds`: None runs rounds when
    they pay (`_rounds_pay`), True always (with `fused`)."""
    if mode not in MODES:
        raise ValueError(f"cadence embedding_bag_alltoall: mode {mode!r}; choose from {MODES}")
    tables, indices, offsets = list(tables), list(indices), list(offsets)
    if not (len(tables) == len(indices) == len(offsets)):
        raise ValueError(
            f"cadence embedding_bag_alltoall: {len(tables)} tables, {len(indices)} index "
            f"arrays and {len(offsets)} offset arrays; give one of each per table"
        )
    n, r = comm.size, comm.rank
    idx = [np.asarray(i.detach() if hasattr(i, "detach") else i, dtype=np.int64) for i in indices]
    offs = [np.asarray(o.detach() if hasattr(o, "detach") else o, dtype=np.int64) for o in offsets]
    m, problem = None, None
    try:
        m = Math(*tables) if tables else None
        tables = [m.prepare(t) for t in tables] if m else []
        problem = _local_problem(tables, idx, offs)
    except (TypeError, ValueError) as e:
        problem = str(e)
    # Every rank's table count, width, batch size and dtype (tables per rank
    # may differ, the rest may not), and whether its arguments were valid:
    # a rank with bad arguments still takes part, so every rank raises
    # instead of waiting for it.
    mine = np.array([len(tables), -1, -1, -1, int(problem is not None)], dtype=np.int64)
    if problem is None and tables:
        mine[1:4] = tables[0].shape[1], len(offs[0]), _dtype_code(m)
    meta = comm.allgather(mine)
    if problem is not None:
        raise ValueError(f"cadence embedding_bag_alltoall: {problem}")
    _agree(meta)
    per_rank = [int(v) for v in meta[:, 0]]
    width = int(meta[meta[:, 1] >= 0, 1][0]) if (meta[:, 1] >= 0).any() else 0
    batch = int(meta[meta[:, 2] >= 0, 2][0]) if (meta[:, 2] >= 0).any() else 0
    if m is None:  # no tables here: allocate in the others' dtype
        m = _math_like(meta)
    first_table = [sum(per_rank[:q]) for q in range(n)]
    blocks = row_blocks(batch, n)
    first_bag = [sum(blocks[:j]) for j in range(n)]
    pool = _pool_torch if m.torch else _pool_numpy_fast
    ends = [np.append(o, i.size) for o, i in zip(offs, idx, strict=True)]

    def compute(j: int):
        """(b_j, T_r, D): this rank's tables pooled over rank j's bags."""
        buf = m.empty((blocks[j], len(tables), width))
        lo, hi = first_bag[j], first_bag[j] + blocks[j]
        for t, table in enumerate(tables):
            src = idx[t] if not m.torch else _torch().from_numpy(idx[t])
            pool(table, src, ends[t][lo:hi + 1], mode, buf[:, t, :])
        return buf

    out = m.empty((blocks[r], sum(per_rank), width))
    fused = fused and (rounds or _rounds_pay(batch * sum(per_rank) * width * m.itemsize, n))
    with compute_pool(comm, m):
        if not fused:
            sends = [compute(j) for j in range(n)]
            matrix = [blocks[d] * per_rank[s] * width for s in range(n) for d in range(n)]
            shapes = [(blocks[r], per_rank[q], width) for q in range(n)]
            recvs = _exchange_all(comm, sends, shapes, m, matrix)
        else:
            recvs = _rounds(comm, "embedding_bag_alltoall", compute,
                            [(blocks[r], per_rank[q], width) for q in range(n)], m)  # fmt: skip
        for q in range(n):
            out[:, first_table[q]:first_table[q] + per_rank[q], :] = recvs[q]
    return out


_DTYPES = ["float32", "float64", "bfloat16", "float16"]


def _local_problem(tables, idx, offs) -> str | None:
    """What is wrong with this rank's own arguments, or None."""
    dims = {int(t.shape[1]) if t.ndim == 2 else -1 for t in tables}
    bags = {len(o) for o in offs}
    if -1 in dims:
        return "every table must be 2-D (rows, D)"
    if len(dims) > 1 or len(bags) > 1:
        return (f"this rank's tables have widths {sorted(dims)} and bag counts "
                f"{sorted(bags)}; every table needs the same D and B")  # fmt: skip
    if tables and str(tables[0].dtype).removeprefix("torch.") not in _DTYPES:
        return f"tables of {tables[0].dtype}; the operator takes {', '.join(_DTYPES)}"
    for t, (table, i, o) in enumerate(zip(tables, idx, offs, strict=True)):
        if i.ndim != 1 or o.ndim != 1:
            return f"indices and offsets of table {t} must be 1-D"
        if i.size and (i.min() < 0 or i.max() >= table.shape[0]):
            return f"table {t} has {table.shape[0]} rows; an index is out of range"
        if o.size and (o[0] != 0 or np.any(np.diff(o) < 0) or o[-1] > i.size):
            return (f"offsets of table {t} must start at 0, not decrease, and stay within "
                    "the indices")  # fmt: skip
    return None


def _dtype_code(m: Math) -> int:
    return _DTYPES.index(str(m.dtype).removeprefix("torch."))


def _math_like(meta) -> Math:
    codes = meta[meta[:, 3] >= 0, 3]
    name = _DTYPES[int(codes[0])] if codes.size else "float32"
    if name == "bfloat16":
        torch = _torch()
        return Math(torch.empty(0, dtype=torch.bfloat16))
    return Math(np.empty(0, dtype=name))


def _agree(meta) -> None:
    """No rank had bad arguments; width, batch and dtype agree across the
    ranks that have tables."""
    bad = [q for q in range(meta.shape[0]) if meta[q, 4]]
    if bad:
        raise ValueError(f"cadence embedding_bag_alltoall: rank {bad[0]} passed invalid "
                         "arguments (its own error says which)")  # fmt: skip
    for col, what in ((1, "table width D"), (2, "batch size B"), (3, "dtype")):
        have = [(q, int(v)) for q, v in enumerate(meta[:, col]) if v >= 0]
        if len({v for _, v in have}) > 1:
            show = (lambda v: _DTYPES[v]) if col == 3 else str
            detail = ", ".join(f"rank {q}: {show(v)}" for q, v in have)
            raise ValueError(f"cadence embedding_bag_alltoall: ranks disagree on the {what} "
                             f"({detail})")  # fmt: skip


def _rounds(comm, op: str, compute, shapes, m: Math, arrived=None) -> list:
    """Round k: compute(dst = r+k), send it there, receive from r-k into a
    buffer of shapes[r-k]; this rank's own part last, without communication.
    Returns the n received (or own) buffers, by source rank. With
    `arrived(src, buffer)`, that is called for the own part, then for each
    received one as soon as it is in (r-1, r-2, ...), while later rounds are
    still on the wire."""
    n, r = comm.size, comm.rank
    got: list = [None] * n
    flight = InFlight(op)
    try:
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            payload = compute(dst)
            got[src] = m.empty(shapes[src])
            flight.add(comm.send(payload, dst, async_op=True), f"round {k}: send to rank {dst}")
            flight.add(comm.recv(got[src], src, async_op=True),
                       f"round {k}: receive from rank {src}")  # fmt: skip
        got[r] = compute(r)
        if arrived is not None:
            arrived(r, got[r])
            for k in range(1, n):
                flight.wait(2 * k - 1)  # round k's receive
                arrived((r - k) % n, got[(r - k) % n])
    except BaseException as e:
        flight.close(e)
    flight.close()
    return got


def _exchange_all(comm, sends: list, shapes, m: Math, matrix: list[int]) -> list:
    """The plain path: one all-to-all of everything computed beforehand.
    `matrix[s*n + d]`: elements from s to d, known to every rank (no count
    exchange)."""
    n, r = comm.size, comm.rank
    numel = [int(np.prod(s)) for s in shapes]
    send_counts = [int(np.prod(tuple(x.shape))) for x in sends]
    flat_in = m.empty((sum(send_counts),))
    at = 0
    for x, c in zip(sends, send_counts, strict=True):
        flat_in[at:at + c] = x.reshape(-1)
        at += c
    flat_out = m.empty((sum(numel),))
    comm._run("alltoall", flat_in, flat_out, counts=matrix, result=flat_out)
    parts, at = [], 0
    for q in range(n):
        parts.append(flat_out[at:at + numel[q]].reshape(shapes[q]))
        at += numel[q]
    assert at == flat_out.shape[0], (r, at)
    return parts


def _moe_problem(tokens, weights, routing) -> str | None:
    if tokens.ndim != 2 or weights.ndim != 3 or routing.ndim != 1:
        return (f"tokens {tuple(tokens.shape)} must be (T, H), expert_weights "
                f"{tuple(weights.shape)} (E_r, H, H_out), routing "
                f"{tuple(routing.shape)} (T,)")  # fmt: skip
    if tokens.shape[0] != routing.shape[0]:
        return f"{tokens.shape[0]} tokens but {routing.shape[0]} routing entries"
    if tokens.shape[1] != weights.shape[1]:
        return f"tokens have H={tokens.shape[1]}, the experts take H={weights.shape[1]}"
    if str(tokens.dtype).removeprefix("torch.") not in _DTYPES:
        return f"tokens of {tokens.dtype}; the operator takes {', '.join(_DTYPES)}"
    return None


def gemm_alltoall(comm, tokens, expert_weights, routing, *, fused=True, rounds=None):
    """Every token through its expert, the output back in the token's place:
    (T_r, H_out). See the module's docstring; `rounds` as for
    embedding_bag_alltoall."""
    n, r = comm.size, comm.rank
    route = np.asarray(routing.detach() if hasattr(routing, "detach") else routing,
                       dtype=np.int64)  # fmt: skip
    m, problem = None, None
    try:
        m = Math(tokens, expert_weights)
        x, w = m.prepare(tokens), m.prepare(expert_weights)
        problem = _moe_problem(x, w, route)
    except (TypeError, ValueError) as e:
        problem = str(e)
    mine = np.array([-1, -1, -1, -1, int(problem is not None)], dtype=np.int64)
    if problem is None:
        mine[:4] = w.shape[0], w.shape[1], w.shape[2], _dtype_code(m)
    meta = comm.allgather(mine)
    if problem is not None:
        raise ValueError(f"cadence gemm_alltoall: {problem}")
    bad = [q for q in range(n) if meta[q, 4]]
    if bad:
        raise ValueError(f"cadence gemm_alltoall: rank {bad[0]} passed invalid arguments (its "
                         "own error says which)")  # fmt: skip
    for col, what in ((0, "experts per rank"), (1, "H"), (2, "H_out"), (3, "dtype")):
        if len(set(meta[:, col].tolist())) > 1:
            detail = ", ".join(f"rank {q}: {int(v)}" for q, v in enumerate(meta[:, col]))
            raise ValueError(f"cadence gemm_alltoall: ranks disagree on {what} ({detail})")
    per, hid, hout = int(meta[0, 0]), int(meta[0, 1]), int(meta[0, 2])
    experts = per * n
    out_of_range = bool(route.size) and (route.min() < 0 or route.max() >= experts)
    # Tokens sorted by expert (stable): rank q's part is one contiguous run.
    order = np.argsort(route, kind="stable")
    per_expert = np.bincount(route, minlength=experts) if not out_of_range else None
    counts = np.full(experts, -1, dtype=np.int64) if out_of_range else per_expert.astype(np.int64)
    table = comm.allgather(counts)  # table[s, e]: tokens rank s sends to expert e
    if out_of_range:
        raise ValueError(f"cadence gemm_alltoall: routing names experts outside [0, {experts})")
    if (table < 0).any():
        q = int(np.nonzero((table < 0).any(axis=1))[0][0])
        raise ValueError(f"cadence gemm_alltoall: rank {q}'s routing names an expert outside "
                         f"[0, {experts})")  # fmt: skip
    send_rows = [int(table[r, q * per:(q + 1) * per].sum()) for q in range(n)]
    recv_rows = [int(table[s, r * per:(r + 1) * per].sum()) for s in range(n)]
    first = np.concatenate([[0], np.cumsum(send_rows)]).astype(int)
    mine_sorted = x[order if not m.torch else _torch().from_numpy(order)]

    def expert_out(src: int, got):
        """Outputs for the tokens `got` that rank `src` sent, expert by expert."""
        y = m.empty((got.shape[0], hout))
        at = 0
        for e in range(per):
            c = int(table[src, r * per + e])
            if c:
                m.matmul(got[at:at + c], w[e], y[at:at + c])
            at += c
        return y

    fused = fused and (rounds or _rounds_pay(int(table.sum()) * max(hid, hout) * m.itemsize, n))
    with compute_pool(comm, m):
        if not fused:
            dispatched = _exchange_all(
                comm, [mine_sorted[first[q]:first[q + 1]] for q in range(n)],
                [(recv_rows[s], hid) for s in range(n)], m,
                [int(table[s, d * per:(d + 1) * per].sum()) * hid
                 for s in range(n) for d in range(n)],
            )  # fmt: skip
            outs = [expert_out(s, dispatched[s]) for s in range(n)]
            back = _exchange_all(
                comm, outs, [(send_rows[q], hout) for q in range(n)], m,
                [int(table[d, s * per:(s + 1) * per].sum()) * hout
                 for s in range(n) for d in range(n)],
            )  # fmt: skip
        else:
            back = _moe_rounds(comm, mine_sorted, first, recv_rows, send_rows, hid, hout, m,
                               expert_out)  # fmt: skip
        y_sorted = m.empty((x.shape[0], hout))
        for q in range(n):
            y_sorted[first[q]:first[q + 1]] = back[q]
        out = m.empty((x.shape[0], hout))
        out[order if not m.torch else _torch().from_numpy(order)] = y_sorted
    return out


def _moe_rounds(comm, mine_sorted, first, recv_rows, send_rows, hid, hout, m, expert_out):
    """Dispatch in rounds (all queued at once: the tokens are ready), then,
    round by round as each peer's tokens arrive, its experts' outputs,
    computed and sent back while the next peer's are computed; this rank's
    own tokens last."""
    n, r = comm.size, comm.rank
    flight = InFlight("gemm_alltoall")
    got: list = [None] * n
    back: list = [None] * n
    arrived: dict[int, int] = {}
    try:
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            got[src] = m.empty((recv_rows[src], hid))
            flight.add(comm.send(mine_sorted[first[dst]:first[dst + 1]], dst, async_op=True),
                       f"dispatch round {k}: send to rank {dst}")  # fmt: skip
            arrived[src] = len(flight.works)
            flight.add(comm.recv(got[src], src, async_op=True),
                       f"dispatch round {k}: receive from rank {src}")  # fmt: skip
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            flight.wait(arrived[src])
            y = expert_out(src, got[src])
            back[dst] = m.empty((send_rows[dst], hout))
            flight.add(comm.send(y, src, async_op=True), f"return round {k}: send to rank {src}")
            flight.add(comm.recv(back[dst], dst, async_op=True),
                       f"return round {k}: receive from rank {dst}")  # fmt: skip
        back[r] = expert_out(r, mine_sorted[first[r]:first[r + 1]])
    except BaseException as e:
        flight.close(e)
    flight.close()
    return back


# ------------------------------------------------- backward passes (torch)


def embedding_bag_backward(comm, dout, shapes, indices, offsets, mode: str,
                           fused: bool = True, rounds: bool | None = None) -> list:  # fmt: skip
    """Gradients of this rank's tables (shapes[t]) from the gradient of its
    output slice dout (b_r, T, D): the reverse all-to-all brings every rank's
    gradient for this rank's tables, each pooled row's gradient goes to the
    rows it pooled. Fused, the exchange runs in rounds and each rank's block
    is added into the tables as it arrives, this rank's own first (it needs
    nothing). Both paths add the blocks in the same order (own, then r-1,
    r-2, ...), so they give the same bits. `rounds` as for the forward."""
    torch = _torch()
    n, r = comm.size, comm.rank
    m = Math(dout)
    mine = np.array([len(shapes), dout.shape[0]], dtype=np.int64)
    meta = comm.allgather(mine)  # table counts and bag-slice sizes per rank
    per_rank, blocks = [int(v) for v in meta[:, 0]], [int(v) for v in meta[:, 1]]
    first = [sum(per_rank[:q]) for q in range(n)]
    first_bag = [sum(blocks[:q]) for q in range(n)]
    width = dout.shape[2]
    idx = [i.to(torch.int64) for i in indices]
    ends = [torch.cat([o.to(torch.int64), torch.tensor([i.numel()])]) for o, i in
            zip(offsets, idx, strict=True)]  # fmt: skip
    lengths = [torch.diff(e) for e in ends]
    grads = [torch.zeros(shape, dtype=dout.dtype) for shape in shapes]

    def add(src: int, block) -> None:
        """Rank src's bags' gradients (b_src, T_r, D) into the tables."""
        lo, hi = first_bag[src], first_bag[src] + blocks[src]
        for t in range(len(shapes)):
            a, b = int(ends[t][lo]), int(ends[t][hi])
            if a == b:
                continue
            bag_of = torch.repeat_interleave(torch.arange(hi - lo), lengths[t][lo:hi])
            contrib = block[bag_of, t, :]
            if mode == "mean":
                contrib = contrib / lengths[t][lo:hi][bag_of].unsqueeze(1).to(contrib.dtype)
            grads[t].index_add_(0, idx[t][a:b], contrib)

    sends = [dout[:, first[q]:first[q] + per_rank[q], :].contiguous() for q in range(n)]
    shapes_in = [(blocks[q], per_rank[r], width) for q in range(n)]
    order = [(r - k) % n for k in range(n)]  # own first, then r-1, r-2, ...
    total = sum(blocks) * sum(per_rank) * width * m.itemsize
    if not (fused and (rounds or _rounds_pay(total, n))):
        matrix = [blocks[s] * per_rank[d] * width for s in range(n) for d in range(n)]
        got = _exchange_all(comm, sends, shapes_in, m, matrix)
        for q in order:
            add(q, got[q])
        return grads
    _rounds(comm, "embedding_bag_alltoall backward", lambda dst: sends[dst], shapes_in, m,
            arrived=add)  # fmt: skip
    return grads


def expert_weight_grads(comm, tokens, dy, routing, shape):
    """dW_e = x_e^T @ dy_e over every token routed to local expert e, on any
    rank: tokens and their output gradients dispatched as the forward pass
    dispatched the tokens."""
    torch = _torch()
    n, r = comm.size, comm.rank
    per, hid, hout = shape
    m = Math(tokens)
    route = routing.to(torch.int64).numpy()
    order = torch.from_numpy(np.argsort(route, kind="stable"))
    table = comm.allgather(np.bincount(route, minlength=per * n).astype(np.int64))
    to = [[int(table[s, d * per:(d + 1) * per].sum()) for d in range(n)] for s in range(n)]
    first = np.concatenate([[0], np.cumsum(to[r])]).astype(int)
    got = []
    for rows, width in ((tokens[order], hid), (dy[order], hout)):
        sends = [rows[first[q]:first[q + 1]].contiguous() for q in range(n)]
        matrix = [to[s][d] * width for s in range(n) for d in range(n)]
        got.append(_exchange_all(comm, sends, [(to[s][r], width) for s in range(n)], m, matrix))
    grad = torch.zeros(shape, dtype=tokens.dtype)
    for s in range(n):
        at = 0
        for e in range(per):
            c = int(table[s, r * per + e])
            if c:
                grad[e] += got[0][s][at:at + c].t() @ got[1][s][at:at + c]
            at += c
    return grad
