"""The fused compute + collective operators (cadence.fused) against a float64
numpy reference: numpy float32, torch float32 and bfloat16, fused (with and
without forced small tiles) and unfused, shapes that divide neither by the
ranks nor by the tiles, 1-8 ranks on shared memory, TCP and a mix.

Tolerance: a result may differ from the float64 reference by
C * eps * (|terms| summed): the products' and the reduction's rounding. eps
is float32's 2^-24 or bfloat16's 2^-8 (torch's bfloat16 matmul rounds its
fp32 accumulation once, then each reduction step rounds again), C covers
the summation order (K terms in the product, n in the reduction). A wrong
tile, a tile reduced twice or left out shifts a result by whole terms and
fails by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_all_ok, run_ranks

EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8}


def _shards(kind: str, dtype: str, arrays):
    """The rank's operands as the user would hold them, and their float64
    values after conversion (bfloat16 rounds the inputs)."""
    if kind == "numpy":
        out = [a.astype(np.float32) for a in arrays]
        return out, [a.astype(np.float64) for a in out]
    import torch

    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    out = [torch.from_numpy(a).to(tdt) for a in arrays]
    return out, [t.to(torch.float64).numpy() for t in out]


def _value(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    import torch

    return x.to(torch.float64).numpy()


def _check(got, want, scale, terms: int, dtype: str, what: str, failures: list) -> None:
    got = _value(got)
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape}, want {want.shape}")
        return
    bound = (4 * terms + 8) * EPS[dtype] * scale + 1e-30
    err = np.abs(got - want)
    if not np.all(err <= bound):
        i = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        failures.append(f"{what}: at {i} got {got[i]!r}, want {want[i]!r} (bound {bound[i]:.3g})")


def check_operators(comm, kind: str, dtype: str, seed: int) -> list:
    """Every operator, fused (automatic and forced small tiles) and unfused."""
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(seed)
    failures: list[str] = []
    variants = [{"fused": True}, {"fused": True, "tile_rows": 37}, {"fused": False}]

    # gemv_allreduce: shards of K differ per rank (3 + 2q columns); 270001
    # rows are 4 automatic tiles of float32, 2 of bfloat16. The reference
    # adds one rank's product at a time (8 ranks' matrices at once would not
    # fit a small CI machine 8 times over).
    rows = 270001
    want, scale, mine = np.zeros(rows), np.zeros(rows), None
    for q in range(n):
        k = 3 + 2 * q
        ops, (wv, xv) = _shards(kind, dtype, [rng.standard_normal((rows, k)),
                                              rng.standard_normal(k)])  # fmt: skip
        want += wv @ xv
        scale += np.abs(wv) @ np.abs(xv)
        mine = ops if q == r else mine
    for v in variants:
        got = comm.gemv_allreduce(*mine, **v)
        _check(got, want, scale, 3 + 2 * n + n, dtype, f"gemv_allreduce {kind} {dtype} {v}",
               failures)  # fmt: skip

    # gemm_allreduce: 203 x 301 outputs, K_r = 19.
    xs, xv = _shards(kind, dtype, [rng.standard_normal((203, 19)) for _ in range(n)])
    ws, wv = _shards(kind, dtype, [rng.standard_normal((19, 301)) for _ in range(n)])
    want = sum(xv[q] @ wv[q] for q in range(n))
    scale = sum(np.abs(xv[q]) @ np.abs(wv[q]) for q in range(n))
    for v in variants:
        got = comm.gemm_allreduce(xs[r], ws[r], **v)
        _check(got, want, scale, 19 + n, dtype, f"gemm_allreduce {kind} {dtype} {v}", failures)

    # allgather_matmul: 111 rows per rank, K = 23, N = 45.
    a_s, a_v = _shards(kind, dtype, [rng.standard_normal((111, 23)) for _ in range(n)])
    (b,), (bv,) = _shards(kind, dtype, [rng.standard_normal((23, 45))])
    full = np.concatenate(a_v)
    want, scale = full @ bv, np.abs(full) @ np.abs(bv)
    for v in variants:
        got, gathered = comm.allgather_matmul(a_s[r], b, return_gathered=True, **v)
        _check(got, want, scale, 23, dtype, f"allgather_matmul {kind} {dtype} {v}", failures)
        _check(gathered, full, np.abs(full), 0, dtype, f"allgather_matmul gathered {v}",
               failures)  # fmt: skip
        plain = comm.allgather_matmul(a_s[r], b, **v)
        _check(plain, want, scale, 23, dtype, f"allgather_matmul {kind} {dtype} {v}", failures)

    # matmul_reduce_scatter: 1001 rows (not divisible by 2, 3, 4, 5, 8), K_r = 13.
    a_s, a_v = _shards(kind, dtype, [rng.standard_normal((1001, 13)) for _ in range(n)])
    b_s, b_v = _shards(kind, dtype, [rng.standard_normal((13, 65)) for _ in range(n)])
    want = np.array_split(sum(a_v[q] @ b_v[q] for q in range(n)), n)[r]
    scale = np.array_split(sum(np.abs(a_v[q]) @ np.abs(b_v[q]) for q in range(n)), n)[r]
    for v in variants:
        got = comm.matmul_reduce_scatter(a_s[r], b_s[r], **v)
        _check(got, want, scale, 13 + n, dtype, f"matmul_reduce_scatter {kind} {dtype} {v}",
               failures)  # fmt: skip
    return failures


def check_all_kinds(comm, seed: int) -> list:
    failures = []
    for kind, dtype in [("numpy", "float32"), ("torch", "float32"), ("torch", "bfloat16")]:
        failures += check_operators(comm, kind, dtype, seed)
    return failures


@pytest.mark.parametrize(
    "n,transport",
    [(1, "shm"), (2, "shm"), (3, "shm"), (5, "shm"), (8, "shm"), (2, "tcp"), (3, "tcp"),
     (4, "mixed")],
)  # fmt: skip
def test_fused_operators_match_the_reference(n, transport):
    res = assert_all_ok(run_ranks(check_all_kinds, n, transport=transport, args=(n,),
                                  timeout=300))  # fmt: skip
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


def mismatched_rows(comm):
    """Rank 1 passes 10 more rows than rank 0: the tiles' collectives differ."""
    import cadence

    w = np.ones((1000 + 10 * comm.rank, 4), np.float32)
    try:
        comm.gemv_allreduce(w, np.ones(4, np.float32), tile_rows=300)
    except cadence.CommError as e:
        return " | ".join([str(e), *getattr(e, "__notes__", [])])
    return "no error"


def test_a_shape_that_differs_across_ranks_is_an_error_naming_the_peer():
    res = assert_all_ok(run_ranks(mismatched_rows, 2, op_timeout=10.0, timeout=60))
    for rank, text in res.items():
        assert f"mismatch with rank {1 - rank}" in text, text
        assert "count=100, float32" in text and "count=110, float32" in text, text
        assert "in cadence gemv_allreduce, tile 4 of 4 (rows 900..10" in text, text
