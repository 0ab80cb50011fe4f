"""One rank of `cadence bench --op <fused operator>`: times the operator fused,
unfused (compute, then one collective), the compute alone and the collective
alone, on the same buffers, samples taking turns (see worker.time_ops).

    python -m cadence.bench.fused --op gemv_allreduce --shape M=4194304,K=8 --out DIR

Each rank appends one JSON line per variant to `<out>/rank<R>.jsonl`: median
and p99 seconds, and for `fused` the number of elements that differ from the
unfused result by more than the dtype's tolerance (the two sum in different
orders). The launcher (cli/fused.py) takes the max of the ranks' medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cadence.bench.common import p99
from cadence.bench.worker import time_ops


@dataclass(frozen=True)
class FusedOp:
    name: str
    dims: tuple[str, ...]  # shape parameters, in the order --shape lists them
    default: dict[str, int]  # the documented shape (docs/fused.md)
    what: str  # one line for --help and the table's title

    def shape(self, text: str | None) -> dict[str, int]:
        """--shape "M=...,K=..." over the defaults; raises ValueError."""
        shape = dict(self.default)
        for part in (text or "").split(","):
            if not part.strip():
                continue
            key, _, value = part.partition("=")
            key = key.strip()
            if key not in self.dims or not value.strip().isdigit():
                raise ValueError(
                    f"--shape {text!r}: {self.name} takes {','.join(d + '=N' for d in self.dims)}"
                )
            shape[key] = int(value)
        return shape


# The element types the fused operators' benchmark runs (the default first).
FUSED_DTYPES = ("float32", "bfloat16")

# The documented shapes put compute and communication of the same order on
# two local ranks of a 2-core machine (docs/fused.md has the measurements).
FUSED_OPS = {
    op.name: op
    for op in (
        FusedOp("gemv_allreduce", ("M", "K"), {"M": 4 << 20, "K": 8},
                "(M, K) @ (K,) per rank, summed over ranks"),
        FusedOp("gemm_allreduce", ("B", "K", "N"), {"B": 4096, "K": 32, "N": 1024},
                "(B, K) @ (K, N) per rank, summed over ranks"),
        FusedOp("allgather_matmul", ("m", "K", "N"), {"m": 2048, "K": 512, "N": 128},
                "gather every rank's (m, K), times (K, N)"),
        FusedOp("matmul_reduce_scatter", ("M", "K", "N"), {"M": 8192, "K": 32, "N": 512},
                "(M, K) @ (K, N) per rank, summed, each rank keeps M/n rows"),
        FusedOp("embedding_bag_alltoall", ("T", "R", "D", "B", "L"),
                {"T": 8, "R": 100000, "D": 64, "B": 8192, "L": 2},
                "T tables of (R, D) per rank, B bags of L indices, sum-pooled, each rank "
                "gets its B/n bags of every table"),
        FusedOp("gemm_alltoall", ("T", "H", "O", "E"), {"T": 4096, "H": 256, "O": 256, "E": 2},
                "T tokens of H per rank to E experts per rank (H, O), uniform routing, "
                "outputs back"),
    )
}  # fmt: skip
VARIANTS = ("fused", "unfused", "compute", "collective")


def _operands(op: str, shape: dict[str, int], rank: int, nranks: int, dtype: str):
    rng = np.random.default_rng(1000 + rank)

    def mat(*dims):
        a = rng.standard_normal(dims, dtype=np.float32)
        if dtype == "bfloat16":
            import torch

            return torch.from_numpy(a).to(torch.bfloat16)
        return a

    s = shape
    if op == "embedding_bag_alltoall":
        tables = [mat(s["R"], s["D"]) for _ in range(s["T"])]
        idx = [rng.integers(0, s["R"], s["B"] * s["L"]) for _ in range(s["T"])]
        offs = [np.arange(0, s["B"] * s["L"], s["L"]) for _ in range(s["T"])]
        return tables, idx, offs
    if op == "gemm_alltoall":
        experts = mat(s["E"], s["H"], s["O"])
        return mat(s["T"], s["H"]), experts, rng.integers(0, s["E"] * nranks, s["T"])
    return {
        "gemv_allreduce": lambda: (mat(s["M"], s["K"]), mat(s["K"])),
        "gemm_allreduce": lambda: (mat(s["B"], s["K"]), mat(s["K"], s["N"])),
        "allgather_matmul": lambda: (mat(s["m"], s["K"]), mat(s["K"], s["N"])),
        "matmul_reduce_scatter": lambda: (mat(s["M"], s["K"]), mat(s["K"], s["N"])),
    }[op]()


def bind(comm, op: str, operands, tile_rows: int | None) -> dict[str, Callable[[], object]]:
    """The four variants of `op` on its operands, as calls."""
    if op in ("embedding_bag_alltoall", "gemm_alltoall"):
        return _bind_alltoall(comm, op, operands)
    from cadence import fused
    from cadence.fused._pipeline import Math, compute_pool

    a, b = operands
    m = Math(a, b)
    run = getattr(comm, op)
    n = comm.size

    def in_pool(fn):
        def call():
            with compute_pool(comm, m):
                return fn()

        return call

    if op == "gemv_allreduce":
        y = m.empty((a.shape[0],))
        compute = in_pool(lambda: m.matmul(a, b, y))
        collective = lambda: comm.allreduce(y)  # noqa: E731
    elif op == "gemm_allreduce":
        y = m.empty((a.shape[0], b.shape[1]))
        compute = in_pool(lambda: m.matmul(a, b, y))
        collective = lambda: comm.allreduce(y)  # noqa: E731
    elif op == "allgather_matmul":
        g = m.empty((n, *a.shape))
        y = m.empty((n * a.shape[0], b.shape[1]))
        compute = in_pool(lambda: m.matmul(g.reshape(n * a.shape[0], a.shape[1]), b, y))
        collective = lambda: comm.allgather(a, out=g)  # noqa: E731
    else:
        y = m.empty((a.shape[0], b.shape[1]))
        counts = [c * b.shape[1] for c in fused.row_blocks(a.shape[0], n)]
        out = m.empty((counts[comm.rank],))
        compute = in_pool(lambda: m.matmul(a, b, y))
        collective = lambda: comm.reduce_scatterv(y, counts, out=out)  # noqa: E731
    return {
        "fused": lambda: run(a, b, tile_rows=tile_rows),
        "unfused": lambda: run(a, b, fused=False),
        "compute": compute,
        "collective": collective,
    }


def _bind_alltoall(comm, op: str, operands) -> dict[str, Callable[[], object]]:
    """The all-to-all operators. Compute alone: the operator on a
    communicator of this rank alone (the same lookups or expert GEMMs, no
    exchange); collective alone: the operator's all-to-all(s) of the same
    sizes on ready data."""
    from cadence import fused
    from cadence.fused._pipeline import Math, compute_threads

    n, r = comm.size, comm.rank
    solo = comm.split(color=r)
    # Alone on its communicator the rank would take the host's every core:
    # give it its share, as on the full communicator.
    solo._fused_threads = compute_threads(comm)
    run = getattr(comm, op)
    if op == "embedding_bag_alltoall":
        tables, idx, offs = operands
        m = Math(*tables)
        width, batch = tables[0].shape[1], len(offs[0])
        blocks = fused.row_blocks(batch, n)
        matrix = [blocks[d] * len(tables) * width for _ in range(n) for d in range(n)]
        exchanges = [matrix]
        compute = lambda: solo.embedding_bag_alltoall(tables, idx, offs)  # noqa: E731
    else:
        tokens, experts, route = operands
        m = Math(tokens, experts)
        per, hid, hout = experts.shape
        table = comm.allgather(np.bincount(route, minlength=per * n).astype(np.int64))
        to = [[int(table[s_, d * per:(d + 1) * per].sum()) for d in range(n)] for s_ in range(n)]
        exchanges = [[to[s_][d] * hid for s_ in range(n) for d in range(n)],
                     [to[d][s_] * hout for s_ in range(n) for d in range(n)]]  # fmt: skip
        compute = lambda: solo.gemm_alltoall(tokens, experts, route % per)  # noqa: E731
    bufs = []
    for matrix in exchanges:
        sent = sum(matrix[r * n:(r + 1) * n])
        got = sum(matrix[s_ * n + r] for s_ in range(n))
        bufs.append((m.empty((sent,)), m.empty((got,)), matrix))

    def collective():
        for flat_in, flat_out, matrix in bufs:
            comm._run("alltoall", flat_in, flat_out, counts=matrix, result=flat_out)

    return {
        "fused": lambda: run(*operands),
        "unfused": lambda: run(*operands, fused=False),
        "compute": compute,
        "collective": collective,
    }


def _differ(got, want, dtype: str) -> int:
    """Elements of `got` farther from `want` than summation order explains."""
    if not isinstance(got, np.ndarray):
        import torch

        got, want = got.to(torch.float32).numpy(), want.to(torch.float32).numpy()
    tol = 5e-2 if dtype == "bfloat16" else 1e-4
    scale = np.abs(want).max() if want.size else 0.0
    return int(np.count_nonzero(np.abs(got - want) > tol * max(scale, 1e-30)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cadence.bench.fused")
    p.add_argument("--op", choices=list(FUSED_OPS), required=True)
    p.add_argument("--shape", default="")
    p.add_argument("--dtype", choices=list(FUSED_DTYPES), default="float32")
    p.add_argument("--tile-rows", type=int)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import cadence

    comm = cadence.init()
    spec = FUSED_OPS[args.op]
    shape = spec.shape(args.shape)
    operands = _operands(args.op, shape, comm.rank, comm.size, args.dtype)
    calls = bind(comm, args.op, operands, args.tile_rows)
    names = list(calls)
    times = time_ops([calls[k] for k in names], args.iters, args.warmup, comm.barrier)
    wrong = _differ(calls["fused"](), calls["unfused"](), args.dtype)
    path = Path(args.out) / f"rank{comm.rank}.jsonl"
    with path.open("a") as f:
        for name, timed in zip(names, times, strict=True):
            samples = timed.per_call
            f.write(json.dumps({
                "op": args.op, "algo": name, "shape": shape, "dtype": args.dtype,
                "rank": comm.rank, "nranks": comm.size,
                "time_us": statistics.median(samples) * 1e6, "p99_us": p99(samples) * 1e6,
                "wrong": wrong if name == "fused" else 0,
                "compute_threads": comm._fused_threads,
            }) + "\n")  # fmt: skip
    comm.barrier()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
