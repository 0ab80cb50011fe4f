"""The fused operators as torch ops (`torch.ops.cadence.*`): gradients.

On one rank every op passes torch.autograd.gradcheck in float64. On several
ranks gradcheck cannot apply (it perturbs one process's inputs while the
output depends on every rank's), so each rank builds the whole computation
from every rank's operands as plain torch code, backpropagates the sum of
every rank's loss through it, and checks that the distributed backward gave
each rank the gradients of its own operands. Replicated outputs (the
allreduce ops) carry the same gradient on every rank and count once, as in
tensor parallelism. Also: the layers, and torch.compile treating the ops as
opaque.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_all_ok, run_ranks


def _rand(gen, *shape):
    import torch

    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def gradchecks(comm):
    import torch
    from torch.autograd import gradcheck

    ops, cid = torch.ops.cadence, comm.id
    gen = torch.Generator().manual_seed(3)
    req = {"requires_grad": True}
    results = {}
    w, x = _rand(gen, 7, 5).requires_grad_(), _rand(gen, 5).requires_grad_()
    results["gemv"] = gradcheck(lambda w, x: ops.gemv_allreduce(w, x, cid, True), (w, x))
    a, b = _rand(gen, 6, 4).requires_grad_(), _rand(gen, 4, 3).requires_grad_()
    results["gemm"] = gradcheck(lambda a, b: ops.gemm_allreduce(a, b, cid, True), (a, b))
    results["ag"] = gradcheck(lambda a, b: ops.allgather_matmul(a, b, cid, True)[0], (a, b))
    results["rs"] = gradcheck(lambda a, b: ops.matmul_reduce_scatter(a, b, cid, True), (a, b))
    t1, t2 = _rand(gen, 9, 3).requires_grad_(), _rand(gen, 5, 3).requires_grad_()
    idx = [torch.tensor([0, 8, 2, 2, 5]), torch.tensor([4, 1])]
    off = [torch.tensor([0, 2, 2]), torch.tensor([0, 1, 2])]
    for mode in ("sum", "mean"):
        results[f"eb {mode}"] = gradcheck(
            lambda t1, t2, mode=mode: ops.embedding_bag_alltoall([t1, t2], idx, off, cid, 2, mode,
                                                                 True), (t1, t2))  # fmt: skip
    tok = _rand(gen, 5, 4).requires_grad_()
    experts = torch.randn(3, 4, 2, dtype=torch.float64, **req)
    route = torch.tensor([2, 0, 2, 1, 0])
    results["moe"] = gradcheck(lambda t, e: ops.gemm_alltoall(t, e, route, cid, True),
                               (tok, experts))  # fmt: skip
    return results


def test_every_op_passes_gradcheck_on_one_rank():
    res = assert_all_ok(run_ranks(gradchecks, 1, timeout=300))
    assert all(res[0].values()), res[0]


def distributed_gradients(comm, fused: bool) -> list[str]:
    import torch

    n, r, cid = comm.size, comm.rank, comm.id
    ops = torch.ops.cadence
    gen = torch.Generator().manual_seed(11)  # the same on every rank: everyone's operands
    failures: list[str] = []

    def leaf(t):
        return t.clone().requires_grad_()

    def same(what, got, want):
        if got is None or not torch.allclose(got, want, rtol=1e-9, atol=1e-9):
            err = None if got is None else float((got - want).abs().max())
            failures.append(f"{what}: max error {err}")

    # gemm_allreduce (replicated output, one cotangent for all).
    xs = [_rand(gen, 6, 2 + q) for q in range(n)]
    ws = [_rand(gen, 2 + q, 5) for q in range(n)]
    g = _rand(gen, 6, 5)
    ref = [leaf(t) for t in xs], [leaf(t) for t in ws]
    (sum(x @ w for x, w in zip(*ref, strict=True)) * g).sum().backward()
    x, w = leaf(xs[r]), leaf(ws[r])
    ops.gemm_allreduce(x, w, cid, fused).backward(g)
    same("gemm_allreduce dx", x.grad, ref[0][r].grad)
    same("gemm_allreduce dw", w.grad, ref[1][r].grad)

    # gemv_allreduce.
    ws = [_rand(gen, 9, 1 + q) for q in range(n)]
    xs = [_rand(gen, 1 + q) for q in range(n)]
    g = _rand(gen, 9)
    ref = [leaf(t) for t in ws], [leaf(t) for t in xs]
    (sum(w @ x for w, x in zip(*ref, strict=True)) * g).sum().backward()
    w, x = leaf(ws[r]), leaf(xs[r])
    ops.gemv_allreduce(w, x, cid, fused).backward(g)
    same("gemv_allreduce dw", w.grad, ref[0][r].grad)
    same("gemv_allreduce dx", x.grad, ref[1][r].grad)

    # allgather_matmul: B and the cotangent differ per rank.
    a_s = [_rand(gen, 4, 3) for _ in range(n)]
    b_s = [_rand(gen, 3, 5) for _ in range(n)]
    gs = [_rand(gen, 4 * n, 5) for _ in range(n)]
    ref = [leaf(t) for t in a_s], [leaf(t) for t in b_s]
    full = torch.cat(ref[0])
    sum(((full @ ref[1][q]) * gs[q]).sum() for q in range(n)).backward()
    a, b = leaf(a_s[r]), leaf(b_s[r])
    out, _ = ops.allgather_matmul(a, b, cid, fused)
    out.backward(gs[r])
    same("allgather_matmul da", a.grad, ref[0][r].grad)
    same("allgather_matmul db", b.grad, ref[1][r].grad)

    # matmul_reduce_scatter: 10 rows (uneven blocks for n = 3, 4) and 4 * n (even).
    for rows in (10, 4 * n):
        a_s = [_rand(gen, rows, 2) for _ in range(n)]
        b_s = [_rand(gen, 2, 3) for _ in range(n)]
        blocks = [len(p) for p in np.array_split(np.arange(rows), n)]
        gs = [_rand(gen, blocks[q], 3) for q in range(n)]
        ref = [leaf(t) for t in a_s], [leaf(t) for t in b_s]
        total = sum(p @ q for p, q in zip(*ref, strict=True))
        (total * torch.cat(gs)).sum().backward()
        a, b = leaf(a_s[r]), leaf(b_s[r])
        ops.matmul_reduce_scatter(a, b, cid, fused).backward(gs[r])
        same(f"matmul_reduce_scatter da rows={rows}", a.grad, ref[0][r].grad)
        same(f"matmul_reduce_scatter db rows={rows}", b.grad, ref[1][r].grad)

    # embedding_bag_alltoall: rank q owns q % 2 + 1 tables of width 3; 7 bags.
    batch, width = 7, 3
    owned = [q % 2 + 1 for q in range(n)]
    tables = [[_rand(gen, 6, width) for _ in range(owned[q])] for q in range(n)]
    lengths = [[torch.randint(0, 3, (batch,), generator=gen) for _ in range(owned[q])]
               for q in range(n)]  # fmt: skip
    idx = [[torch.randint(0, 6, (int(ln.sum()),), generator=gen) for ln in lengths[q]]
           for q in range(n)]  # fmt: skip
    off = [[torch.cumsum(ln, 0) - ln for ln in lengths[q]] for q in range(n)]
    slices = [torch.from_numpy(s) for s in np.array_split(np.arange(batch), n)]
    gs = [_rand(gen, len(slices[q]), sum(owned), width) for q in range(n)]
    for mode in ("sum", "mean"):
        ref = [[leaf(t) for t in tq] for tq in tables]
        pooled = torch.cat([
            torch.stack([torch.nn.functional.embedding_bag(i, t, o, mode=mode)
                         for t, i, o in zip(ref[q], idx[q], off[q], strict=True)], dim=1)
            for q in range(n)], dim=1)  # fmt: skip
        sum((pooled[slices[q]] * gs[q]).sum() for q in range(n)).backward()
        mine = [leaf(t) for t in tables[r]]
        out = ops.embedding_bag_alltoall(mine, idx[r], off[r], cid, sum(owned), mode, fused)
        out.backward(gs[r])
        for t in range(owned[r]):
            same(f"embedding_bag_alltoall {mode} table {t}", mine[t].grad, ref[r][t].grad)

    # gemm_alltoall: 2 experts per rank.
    per = 2
    toks = [_rand(gen, 3 + q, 4) for q in range(n)]
    routes = [torch.randint(0, per * n, (3 + q,), generator=gen) for q in range(n)]
    experts = [_rand(gen, per, 4, 5) for _ in range(n)]
    gs = [_rand(gen, 3 + q, 5) for q in range(n)]
    ref = [leaf(t) for t in toks], [leaf(e) for e in experts]
    every = torch.cat(ref[1])
    sum(((torch.einsum("th,tho->to", ref[0][q], every[routes[q]])) * gs[q]).sum()
        for q in range(n)).backward()  # fmt: skip
    t, e = leaf(toks[r]), leaf(experts[r])
    ops.gemm_alltoall(t, e, routes[r], cid, fused).backward(gs[r])
    same("gemm_alltoall dx", t.grad, ref[0][r].grad)
    same("gemm_alltoall dw", e.grad, ref[1][r].grad)
    return failures


@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "shm"), (4, "mixed"), (3, "tcp")])
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_on_many_ranks_match_the_whole_computation(n, transport, fused):
    res = assert_all_ok(run_ranks(distributed_gradients, n, transport=transport, args=(fused,),
                                  timeout=300))  # fmt: skip
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


def _dlrm():
    from scripts import load_script

    return load_script("examples/dlrm.py", "dlrm_example")


def train_both_ways(comm, steps: int):
    import torch

    torch.set_num_threads(1)
    dlrm = _dlrm()
    return dlrm.train(comm, steps, fused=True), dlrm.train(comm, steps, fused=False)


@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "mixed")])
def test_the_dlrm_example_learns_with_identical_losses_fused_and_unfused(n, transport):
    res = assert_all_ok(run_ranks(train_both_ways, n, transport=transport, args=(40,),
                                  timeout=300))  # fmt: skip
    fused, unfused = res[0]
    assert fused == unfused, (fused, unfused)
    assert all(res[q] == res[0] for q in res), "ranks disagree on the losses"
    first, last = np.mean(fused[:5]), np.mean(fused[-5:])
    assert last < 0.8 * first, fused


def layers_and_compile(comm):
    import torch
    from cadence.torch.layers import RowParallelLinear

    n, r = comm.size, comm.rank
    torch.manual_seed(5 + r)
    layer = RowParallelLinear(comm, 3 + r, 7).double()
    x = torch.randn(4, 2, 3 + r, dtype=torch.float64)
    y = layer(x)
    # Every rank's x @ W, summed: gather the pieces to compare.
    parts = [torch.zeros(4, 2, 7, dtype=torch.float64) for _ in range(n)]
    mine = (x @ layer.weight).detach()
    for q in range(n):
        piece = mine.clone() if q == r else parts[q]
        comm.broadcast(piece, root=q)
        parts[q] = piece
    want = sum(parts) + layer.bias.detach()
    ok_layer = torch.allclose(y, want, atol=1e-12)

    def f(a, b):
        return torch.ops.cadence.gemm_allreduce(a * 2, b, comm.id, True).relu().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    got = compiled(a, b)
    got.backward()
    grads = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    f(a, b).backward()
    ok_compile = torch.allclose(got, f(a, b)) and all(
        torch.allclose(g, h) for g, h in zip(grads, (a.grad, b.grad), strict=True))
    return ok_layer, ok_compile


def test_row_parallel_linear_and_the_ops_under_torch_compile():
    res = assert_all_ok(run_ranks(layers_and_compile, 2, timeout=300))
    assert all(all(v) for v in res.values()), res


def embedding_backward_both_ways(comm):
    """The embedding backward in rounds (forced: these shapes are small) and
    as one all-to-all give the same bits; the plain path is checked against
    the whole computation above."""
    import torch
    from cadence.fused.alltoall import embedding_bag_backward

    n, r = comm.size, comm.rank
    gen = torch.Generator().manual_seed(21)
    owned = [q % 3 for q in range(n)]  # rank 0 owns no table
    batch, width = 11, 4
    lengths = [torch.randint(0, 4, (batch,), generator=gen) for _ in range(owned[r])]
    idx = [torch.randint(0, 9, (int(ln.sum()),), generator=gen) for ln in lengths]
    off = [torch.cumsum(ln, 0) - ln for ln in lengths]
    b_r = len(np.array_split(np.arange(batch), n)[r])
    dout = torch.randn(b_r, sum(owned), width, generator=gen, dtype=torch.float64)
    same = []
    for mode in ("sum", "mean"):
        plain = embedding_bag_backward(comm, dout, [(9, width)] * owned[r], idx, off, mode,
                                       fused=False)  # fmt: skip
        fused = embedding_bag_backward(comm, dout, [(9, width)] * owned[r], idx, off, mode,
                                       fused=True, rounds=True)  # fmt: skip
        same.append(all(torch.equal(p, f) for p, f in zip(plain, fused, strict=True)))
        same.append(all(p.abs().sum() > 0 for p in plain))  # the test sees real gradients
    return same


@pytest.mark.parametrize("n,transport", [(3, "shm"), (4, "mixed")])
def test_the_embedding_backward_in_rounds_gives_the_plain_paths_bits(n, transport):
    res = assert_all_ok(run_ranks(embedding_backward_both_ways, n, transport=transport))
    assert all(all(v) for v in res.values()), res
