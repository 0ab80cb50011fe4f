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

    # gemv_allreduce: shards of K differ per rank (3 + 2q columns); across
    # hosts 270001 rows are 4 automatic tiles of float32, 2 of bfloat16 (one
    # host with no core to spare runs one tile: see test_tile_plans). The reference
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
        failures += check_alltoall_operators(comm, kind, dtype, seed)
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


def _embedding_reference(tables, indices, offsets, mode):
    """(B, D) per table, pooled in float64."""
    out = []
    for table, idx, off in zip(tables, indices, offsets, strict=True):
        ends = np.append(off[1:], idx.size)
        rows = np.zeros((off.size, table.shape[1]))
        for b, (lo, hi) in enumerate(zip(off, ends, strict=True)):
            if hi > lo:
                rows[b] = table[idx[lo:hi]].sum(axis=0)
                if mode == "mean":
                    rows[b] /= hi - lo
        out.append(rows)
    return out


def check_alltoall_operators(comm, kind: str, dtype: str, seed: int) -> list:
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(seed)
    failures: list[str] = []
    # Embedding bags: rank q owns q % 3 + 1 tables (rank 1 of 5+ ranks none),
    # of 50-ish rows and D = 12; B = 37 bags (not divisible by the ranks),
    # some of them empty.
    width, batch = 12, 37
    owned = [0 if (q == 1 and n >= 5) else q % 3 + 1 for q in range(n)]
    everything = []  # per rank: (tables as float64, indices, offsets, as passed)
    for q in range(n):
        mine = []
        for _ in range(owned[q]):
            rows = int(rng.integers(40, 60))
            lengths = rng.integers(0, 5, batch)
            idx = rng.integers(0, rows, int(lengths.sum()))
            off = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            (table,), (value,) = _shards(kind, dtype, [rng.standard_normal((rows, width))])
            mine.append((table, value, idx, off))
        everything.append(mine)
    slice_r = np.array_split(np.arange(batch), n)[r]
    for mode in ("sum", "mean"):
        want = np.concatenate([
            np.stack(_embedding_reference([v for _, v, _, _ in everything[q]],
                                          [i for _, _, i, _ in everything[q]],
                                          [o for _, _, _, o in everything[q]], mode), axis=1)
            [slice_r] if everything[q] else np.zeros((len(slice_r), 0, width))
            for q in range(n)], axis=1)  # fmt: skip
        scale = np.abs(want) * 4 + 1
        mine = everything[r]
        for v in ({"fused": True}, {"fused": True, "rounds": True}, {"fused": False}):
            tables, idx = [t for t, *_ in mine], [i for *_, i, _ in mine]
            off = [o for *_, o in mine]
            got = comm.embedding_bag_alltoall(tables, idx, off, mode=mode, **v)
            what = f"embedding_bag_alltoall {kind} {dtype} {mode} {v}"
            _check(got, want, scale, 4, dtype, what, failures)

    # Mixture of experts: 2 experts per rank, H = 16, H_out = 24, 0-40 tokens
    # per rank (rank 0 has none when n > 1), routed at random.
    per, hid, hout = 2, 16, 24
    ntok = [0 if (q == 0 and n > 1) else int(rng.integers(1, 40)) for q in range(n)]
    toks = [_shards(kind, dtype, [rng.standard_normal((ntok[q], hid))]) for q in range(n)]
    routes = [rng.integers(0, per * n, ntok[q]) for q in range(n)]
    experts = [_shards(kind, dtype, [rng.standard_normal((per, hid, hout))]) for _ in range(n)]
    ev = np.concatenate([experts[q][1][0] for q in range(n)])  # (E, H, H_out) float64
    xv = toks[r][1][0]
    want = np.stack([xv[i] @ ev[routes[r][i]] for i in range(ntok[r])]) if ntok[r] else \
        np.zeros((0, hout))  # fmt: skip
    scale = np.stack([np.abs(xv[i]) @ np.abs(ev[routes[r][i]]) for i in range(ntok[r])]) \
        if ntok[r] else np.zeros((0, hout))  # fmt: skip
    for v in ({"fused": True}, {"fused": True, "rounds": True}, {"fused": False}):
        got = comm.gemm_alltoall(toks[r][0][0], experts[r][0][0], routes[r], **v)
        _check(got, want, scale, hid, dtype, f"gemm_alltoall {kind} {dtype} {v}", failures)
    return failures


def bad_arguments_on_one_rank(comm):
    """Rank 1 passes an embedding index past its table's end, then a routing
    entry past the last expert: every rank raises, none waits."""
    errors = []
    table = np.ones((10, 4), np.float32)
    idx = np.array([0, 3, 10 if comm.rank == 1 else 9])
    try:
        comm.embedding_bag_alltoall([table], [idx], [np.array([0, 1])])
    except ValueError as e:
        errors.append(str(e))
    route = np.array([0, comm.size * 2 if comm.rank == 1 else 1])
    try:
        comm.gemm_alltoall(np.ones((2, 4), np.float32), np.ones((2, 4, 3), np.float32), route)
    except ValueError as e:
        errors.append(str(e))
    return errors


def test_bad_arguments_on_one_rank_are_an_error_on_every_rank():
    res = assert_all_ok(run_ranks(bad_arguments_on_one_rank, 3, op_timeout=10.0, timeout=60))
    assert "table 0 has 10 rows; an index is out of range" in res[1][0], res[1]
    assert "rank 1's routing names an expert outside [0, 6)" in res[0][1], res[0]
    for rank in (0, 2):
        assert "rank 1 passed invalid arguments" in res[rank][0], res[rank]
        assert "rank 1's routing" in res[rank][1], res[rank]


def test_numpy_pooling_without_torch_matches_the_reference():
    """The numpy path pools with torch's kernel when torch is installed; its
    own reduceat path (no torch) against the float64 reference: empty bags,
    a last bag that runs to the end of the indices, sum and mean."""
    from cadence.fused.alltoall import _pool_numpy

    rng = np.random.default_rng(7)
    table = rng.standard_normal((30, 5)).astype(np.float32)
    lengths = np.array([0, 3, 1, 0, 0, 4, 2, 0])
    idx = rng.integers(0, 30, int(lengths.sum()))
    off = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for mode in ("sum", "mean"):
        (want,) = _embedding_reference([table.astype(np.float64)], [idx], [off], mode)
        out = np.full((8, 5), np.nan, np.float32)
        _pool_numpy(table, idx, np.append(off, idx.size), mode, out)
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
        # A slice of the bags, as one destination's tile pools them.
        part = np.full((3, 5), np.nan, np.float32)
        _pool_numpy(table, idx, np.append(off, idx.size)[2:6], mode, part)
        np.testing.assert_allclose(part, want[2:5], rtol=1e-6, atol=1e-6)


def test_tile_plans():
    """Tiles cover the rows exactly; automatic tiles are at least 256 KiB and
    at most 8, and one tile where they cannot overlap; tile_rows always
    tiles."""
    from cadence.fused._pipeline import tiles

    assert tiles(270001, 4, None) == [(a, min(a + 67501, 270001)) for a in range(0, 270001, 67501)]
    assert len(tiles(270001, 2, None)) == 2
    assert tiles(270001, 4, None, overlap=False) == [(0, 270001)]
    assert tiles(1000, 4, 300, overlap=False) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert len(tiles(1 << 30, 4, None)) == 8
    assert tiles(100, 4, None) == [(0, 100)]  # 400 bytes: one tile
    assert tiles(0, 4, None) == [(0, 0)]
    with pytest.raises(ValueError, match="at least 1"):
        tiles(10, 4, 0)
