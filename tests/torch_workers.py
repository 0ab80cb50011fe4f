"""Rank functions for test_torch_backend.py: every torch.distributed op on a
cadence group against a reference computed locally, DDP and FSDP2 training
against references, and a rank killed mid-training.

Each function runs on every rank as `fn(rank, n, outdir, ...)` (see
torch_launch.py) and returns what the test asserts on; failures of the op
checks are collected, not raised, so one run reports all of them.

Run as a script by torchrun: `torch_workers.py OUTDIR ddp`.
"""

from __future__ import annotations

import copy
import functools
import os
import signal
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

RO = dist.ReduceOp

# What torch itself allows a Python backend, by release (README.md, "torch versions"). The
# tests hold each release to what it allows: where a feature is impossible,
# the check is that it fails cleanly instead.
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
# A Python subclass of c10d.Backend is constructible: cadence can serve one
# device of a group ("cpu:cadence,cuda:nccl").
PY_BACKEND = TORCH >= (2, 14)
# init_process_group(device_id=torch.device("cpu", 0)); before: accelerators only.
CPU_DEVICE_ID = TORCH >= (2, 15)
# split_group of a cadence world on CPU: needs a Python Backend and, before
# 2.15, a world bound to an accelerator (2.6/2.7: NCCL only).
SPLIT_GROUP = TORCH >= (2, 15)
# dist.monitored_barrier on a non-gloo group; before, torch refuses any
# backend not named gloo, and only the group's own method can be called.
MONITORED_BARRIER = TORCH >= (2, 14)
# FSDP2 (fully_shard) on CPU tensors, whatever the backend: torch 2.6's FSDP2
# calls torch.cpu.Stream.record_event, which torch added in 2.7
# (pytorch/pytorch#145935); on 2.6 it fails with gloo too (measured).
FSDP2_CPU = TORCH >= (2, 7)


def monitored_barrier(c, group=None, **kwargs):
    """dist.monitored_barrier, or where torch refuses it (checked), the
    group's own monitored_barrier: the same code in cadence."""
    if MONITORED_BARRIER:
        return dist.monitored_barrier(group=group, **kwargs)
    c.raises("dist.monitored_barrier refused by torch", ValueError, "GLOO",
             lambda: dist.monitored_barrier(group=group, **kwargs))
    g = group if group is not None else dist.distributed_c10d._get_default_group()
    return g.monitored_barrier(kwargs.get("timeout"),
                               wait_all_ranks=kwargs.get("wait_all_ranks", False))

# Element types torch can compute a reference for on CPU, per kind of op.
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
REDUCE_DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
# Types torch cannot add on CPU still travel (moves) and reduce through
# cadence's widening; their references are computed widened.
EXOTIC = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn]
MOVE_DTYPES = REDUCE_DTYPES + [torch.complex128] + EXOTIC

_WIDE = {torch.uint16: torch.int64, torch.uint32: torch.int64, torch.uint64: torch.int64,
         torch.float8_e4m3fn: torch.float32}


def value(rank: int, dtype: torch.dtype, shape=(3, 4), salt: int = 0, small=False):
    """Rank's deterministic input: small integers, exact in every type."""
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) * 7 + salt + 3 * rank) % (2 if small else 9)
    if small:
        base = base + 1  # 1 or 2: products stay exact
    if dtype == torch.bool:
        t = base % 2 == 1
    elif dtype.is_complex:
        t = torch.complex(base.double(), -base.double() - rank).to(dtype)
    else:
        t = base.to(dtype)
    return t.reshape(shape)


def same(a: torch.Tensor, b: torch.Tensor, tol: float = 0.0) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype in EXOTIC:
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    if tol and (a.is_floating_point() or a.is_complex()):
        return torch.allclose(a.to(torch.complex128 if a.is_complex() else torch.float64),
                              b.to(torch.complex128 if b.is_complex() else torch.float64),
                              rtol=tol, atol=tol)
    return torch.equal(a, b)


def _tol(dtype) -> float:
    return {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6,
            torch.complex64: 1e-6}.get(dtype, 1e-12)


def reference(op, xs: list[torch.Tensor], factor=None) -> torch.Tensor:
    """What reducing `xs` (one tensor per rank) with `op` gives."""
    dt = xs[0].dtype
    if dt in _WIDE:
        return reference(op, [x.to(_WIDE[dt]) for x in xs], factor).to(dt)
    if op == RO.SUM:
        return functools.reduce(torch.add, xs)
    if op == RO.PRODUCT:
        return functools.reduce(torch.mul, xs)
    if op == RO.MIN:
        return functools.reduce(torch.minimum, xs)
    if op == RO.MAX:
        return functools.reduce(torch.maximum, xs)
    if op == RO.AVG:
        if dt.is_floating_point or dt.is_complex:
            wide = torch.complex128 if dt.is_complex else torch.float64
            return (sum(x.to(wide) for x in xs) / len(xs)).to(dt)
        return torch.div(sum(x.to(torch.int64) for x in xs), len(xs),
                         rounding_mode="trunc").to(dt)
    if op == RO.PREMUL_SUM:
        wide = torch.complex128 if dt.is_complex else torch.float64
        return sum(x.to(wide) * factor for x in xs).to(dt)
    fold = {RO.BAND: torch.bitwise_and, RO.BOR: torch.bitwise_or, RO.BXOR: torch.bitwise_xor}
    return functools.reduce(fold[op], xs)


def ops_for(dtype) -> list:
    """(torch op, factor) pairs defined for `dtype`."""
    if dtype.is_complex:
        return [(RO.SUM, None), (RO.AVG, None), (RO.PREMUL_SUM, 0.5)]
    ops = [(RO.SUM, None), (RO.MIN, None), (RO.MAX, None)]
    if dtype in EXOTIC:
        return ops if dtype != torch.uint64 else [(RO.SUM, None)]
    ops.append((RO.PRODUCT, None))
    if dtype == torch.bool:
        return ops + [(RO.BAND, None), (RO.BOR, None), (RO.BXOR, None)]
    if dtype.is_floating_point:
        return ops + [(RO.AVG, None), (RO.PREMUL_SUM, 0.25)]
    return ops + [(RO.AVG, None), (RO.BAND, None), (RO.BOR, None), (RO.BXOR, None)]


def _torch_op(op, factor):
    if op != RO.PREMUL_SUM:
        return op
    try:
        return RO.PREMUL_SUM(factor)
    except TypeError:  # torch 2.6: ReduceOp.PREMUL_SUM is not callable
        return dist._make_nccl_premul_sum(factor)


class Checker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def eq(self, what: str, got, want, tol: float = 0.0) -> None:
        self.count += 1
        if not same(got, want, tol):
            self.failures.append(f"rank {self.rank}: {what}: got {got!r}, want {want!r}")

    def true(self, what: str, cond: bool) -> None:
        self.count += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}")

    def raises(self, what: str, exc_type, needle: str, fn) -> None:
        self.count += 1
        try:
            fn()
        except exc_type as e:
            if needle not in str(e):
                self.failures.append(f"rank {self.rank}: {what}: message {e!r} lacks {needle!r}")
            return
        except Exception as e:  # noqa: BLE001 - reported as a failure
            self.failures.append(f"rank {self.rank}: {what}: raised {type(e).__name__}: {e}")
            return
        self.failures.append(f"rank {self.rank}: {what}: did not raise")


def _run(async_op: bool, fn, *args, **kwargs):
    """Calls a dist op synchronously or asynchronously (then waits)."""
    w = fn(*args, async_op=async_op, **kwargs)
    if async_op:
        w.wait()
        return w
    return None


def _strided(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous (transposed) copy of the 2-D tensor `t`."""
    holder = torch.empty(t.shape[::-1], dtype=t.dtype).t()
    holder.copy_(t)
    return holder


# -- every op --------------------------------------------------------------

def check_reductions(c: Checker, group, n: int, me: int, shape_is_pg: bool) -> None:
    for i, dt in enumerate(REDUCE_DTYPES + EXOTIC):
        xs = [value(r, dt) for r in range(n)]
        for j, (op, factor) in enumerate(ops_for(dt)):
            if op == RO.PRODUCT:
                xs_op = [value(r, dt, small=True) for r in range(n)]
            else:
                xs_op = xs
            want = reference(op, xs_op, factor)
            tag = f"{dt} {op}"
            tol = _tol(dt) if op in (RO.AVG, RO.PREMUL_SUM) else 0.0
            a = (i + j) % 2 == 1
            top = _torch_op(op, factor)

            t = xs_op[me].clone()
            w = _run(a, dist.all_reduce, t, op=top, group=group)
            c.eq(f"all_reduce {tag} async={a}", t, want, tol)
            if w is not None and shape_is_pg:
                c.true(f"all_reduce {tag}: is_completed after wait", w.is_completed())

            t = xs_op[me].clone()
            root = (i + j) % n
            _run(not a, dist.reduce, t, dst=dist.get_global_rank(group, root)
                 if group is not None else root, op=top, group=group)
            if me == root:
                c.eq(f"reduce {tag} root {root}", t, want, tol)
            else:
                c.eq(f"reduce {tag}: non-root input untouched", t, xs_op[me])

            # reduce_scatter_tensor: rank r keeps rows r*2 .. r*2+1 of the reduction.
            big = [torch.cat([value(r, dt, (2, 4), salt=k) for k in range(n)])
                   if op != RO.PRODUCT else
                   torch.cat([value(r, dt, (2, 4), salt=k, small=True) for k in range(n)])
                   for r in range(n)]
            want_rs = reference(op, big, factor)[me * 2:(me + 1) * 2]
            out = torch.empty((2, 4), dtype=dt)
            _run(a, dist.reduce_scatter_tensor, out, big[me].clone(), op=top, group=group)
            c.eq(f"reduce_scatter_tensor {tag}", out, want_rs, tol)

            # reduce_scatter (list): blocks of different sizes, block k has k+1 rows.
            ins = [value(me, dt, (k + 1, 3), salt=k, small=op == RO.PRODUCT) for k in range(n)]
            want_l = reference(op, [value(r, dt, (me + 1, 3), salt=me,
                                          small=op == RO.PRODUCT) for r in range(n)], factor)
            out = torch.empty((me + 1, 3), dtype=dt)
            _run(not a, dist.reduce_scatter, out, ins, op=top, group=group)
            c.eq(f"reduce_scatter (uneven) {tag}", out, want_l, tol)

    # Non-contiguous and 0-dim tensors, coalesced reductions.
    x = _strided(value(me, torch.float32, (4, 5)))
    dist.all_reduce(x, group=group)
    c.eq("all_reduce non-contiguous", x.contiguous(),
         reference(RO.SUM, [value(r, torch.float32, (4, 5)) for r in range(n)]))
    x = torch.tensor(float(me + 1))
    dist.all_reduce(x, op=RO.MAX, group=group)
    c.eq("all_reduce 0-dim", x, torch.tensor(float(n)))
    ts = [value(me, dt, (2, 3), salt=k) for k, dt in enumerate(
        [torch.float32, torch.int64, torch.float32, torch.bfloat16])]
    wants = [reference(RO.SUM, [value(r, t.dtype, (2, 3), salt=k) for r in range(n)])
             for k, t in enumerate(ts)]
    ts[2] = _strided(ts[2].clone())
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, group=group)
    cm.wait()
    for k, (t, want) in enumerate(zip(ts, wants, strict=True)):
        c.eq(f"coalesced all_reduce #{k}", t.contiguous(), want)
    outs = [torch.empty(2 * n, 3), torch.empty(n, 5, dtype=torch.int32)]
    ins = [value(me, torch.float32, (2, 3)), value(me, torch.int32, (1, 5))]
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for o, i in zip(outs, ins, strict=True):
            dist.all_gather_into_tensor(o, i, group=group)
    cm.wait()
    c.eq("coalesced all_gather_into_tensor", outs[0],
         torch.cat([value(r, torch.float32, (2, 3)) for r in range(n)]))
    c.eq("coalesced all_gather_into_tensor int32", outs[1],
         torch.cat([value(r, torch.int32, (1, 5)) for r in range(n)]))
    outs = [torch.empty(2, 3), torch.empty(1, 4)]
    ins = [value(me, torch.float32, (2 * n, 3)), value(me, torch.float32, (n, 4))]
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for o, i in zip(outs, ins, strict=True):
            dist.reduce_scatter_tensor(o, i, op=RO.AVG, group=group)
    cm.wait()
    c.eq("coalesced reduce_scatter_tensor AVG", outs[0], reference(
        RO.AVG, [value(r, torch.float32, (2 * n, 3)) for r in range(n)])[me * 2:me * 2 + 2],
        1e-6)


def check_moves(c: Checker, group, n: int, me: int) -> None:
    g = dist.get_global_rank if group is not None else (lambda _g, r: r)
    for i, dt in enumerate(MOVE_DTYPES):
        a = i % 2 == 1
        root = i % n
        groot = g(group, root)

        t = value(me, dt)
        _run(a, dist.broadcast, t, src=groot, group=group)
        c.eq(f"broadcast {dt} root {root}", t, value(root, dt))

        # all_gather: rank r contributes r+1 rows (uneven sizes).
        outs = [torch.empty((r + 1, 2), dtype=dt) for r in range(n)]
        _run(a, dist.all_gather, outs, value(me, dt, (me + 1, 2)), group=group)
        for r in range(n):
            c.eq(f"all_gather {dt} from {r}", outs[r], value(r, dt, (r + 1, 2)))

        out = torch.empty((n * 3, 4), dtype=dt)
        _run(not a, dist.all_gather_into_tensor, out, value(me, dt), group=group)
        c.eq(f"all_gather_into_tensor {dt}", out, torch.cat([value(r, dt) for r in range(n)]))

        gl = [torch.empty((3, 4), dtype=dt) for _ in range(n)] if me == root else None
        _run(a, dist.gather, value(me, dt), gl, dst=groot, group=group)
        if me == root:
            for r in range(n):
                c.eq(f"gather {dt} from {r}", gl[r], value(r, dt))

        out = torch.empty((3, 4), dtype=dt)
        sl = [value(r, dt, salt=root) for r in range(n)] if me == root else None
        _run(not a, dist.scatter, out, sl, src=groot, group=group)
        c.eq(f"scatter {dt}", out, value(me, dt, salt=root))

        # all_to_all (list): rank s sends s+d+1 elements to rank d.
        ins = [value(me, dt, (me + d + 1,), salt=d) for d in range(n)]
        outs = [torch.empty((s + me + 1,), dtype=dt) for s in range(n)]
        _run(a, dist.all_to_all, outs, ins, group=group)
        for s in range(n):
            c.eq(f"all_to_all {dt} from {s}", outs[s], value(s, dt, (s + me + 1,), salt=me))

        # all_to_all_single: equal blocks, then split sizes with empty splits.
        src = value(me, dt, (2 * n, 3))
        out = torch.empty((2 * n, 3), dtype=dt)
        _run(not a, dist.all_to_all_single, out, src, group=group)
        want = torch.cat([value(s, dt, (2 * n, 3))[2 * me:2 * me + 2] for s in range(n)])
        c.eq(f"all_to_all_single {dt}", out, want)

        def split(s, d):  # rows rank s sends to rank d; zero when s == d
            return 0 if s == d else s + d

        in_splits = [split(me, d) for d in range(n)]
        out_splits = [split(s, me) for s in range(n)]
        src = value(me, dt, (sum(in_splits), 2))
        out = torch.empty((sum(out_splits), 2), dtype=dt)
        _run(a, dist.all_to_all_single, out, src, out_splits, in_splits, group=group)
        pieces = []
        for s in range(n):
            theirs = value(s, dt, (sum(split(s, d) for d in range(n)), 2))
            lo = sum(split(s, d) for d in range(me))
            pieces.append(theirs[lo:lo + split(s, me)])
        c.eq(f"all_to_all_single splits {dt}", out, torch.cat(pieces))

        # point to point around the ring: plain, then batched.
        right, left = (me + 1) % n, (me - 1) % n
        got = torch.empty((3, 4), dtype=dt)
        if me % 2 == 0:
            dist.send(value(me, dt), g(group, right), group=group)
            dist.recv(got, g(group, left), group=group)
        else:
            dist.recv(got, g(group, left), group=group)
            dist.send(value(me, dt), g(group, right), group=group)
        c.eq(f"send/recv {dt}", got, value(left, dt))
        got = _strided(torch.empty((4, 3), dtype=dt))
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.irecv, got, g(group, left), group=group),
            dist.P2POp(dist.isend, value(me, dt, (4, 3), salt=5), g(group, right), group=group),
        ])
        for q in reqs:
            q.wait()
        c.eq(f"batch_isend_irecv {dt} into non-contiguous", got.contiguous(),
             value(left, dt, (4, 3), salt=5))

    # Non-contiguous outputs and objects.
    out = _strided(torch.empty((n * 3, 4)))
    dist.all_gather_into_tensor(out, value(me, torch.float32), group=group)
    c.eq("all_gather_into_tensor non-contiguous output", out.contiguous(),
         torch.cat([value(r, torch.float32) for r in range(n)]))
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me, "s": "x" * me}, group=group)
    c.true(f"all_gather_object {objs}", objs == [{"rank": r, "s": "x" * r} for r in range(n)])
    lst = [me, "payload", [1, 2]] if me == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=g(group, 0), group=group)
    c.true(f"broadcast_object_list {lst}", lst == [0, "payload", [1, 2]])
    gathered = [None] * n if me == 0 else None
    dist.gather_object(("r", me), gathered, dst=g(group, 0), group=group)
    if me == 0:
        c.true(f"gather_object {gathered}", gathered == [("r", r) for r in range(n)])
    got = [None]
    dist.scatter_object_list(got, [{"to": r} for r in range(n)] if me == 0 else None,
                             src=g(group, 0), group=group)
    c.true(f"scatter_object_list {got}", got == [{"to": me}])


def check_async(c: Checker, group, n: int, me: int, shape_is_pg: bool) -> None:
    """Several operations in flight at once; futures; barriers."""
    xs = [torch.full((1000 + k,), float(me + k)) for k in range(6)]
    works = [dist.all_reduce(x, async_op=True, group=group) for x in xs]
    futs = [w.get_future() for w in works[::2]]
    chained = futs[0].then(lambda f: f.value()[0] * 2)
    for k, w in enumerate(works):
        w.wait()
        c.eq(f"async all_reduce #{k}", xs[k],
             torch.full((1000 + k,), float(sum(r + k for r in range(n)))))
        if shape_is_pg:
            c.true(f"async all_reduce #{k} is_completed", w.is_completed())
    c.eq("future value", futs[1].wait()[0], xs[2])
    c.eq("chained future", chained.wait(), xs[0] * 2)
    w = dist.barrier(async_op=True, group=group)
    w.wait()
    # A synchronous call's Work (the core's fast path where torch says it
    # waits itself): finished, and its future holds the result.
    pg = group or dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    x = torch.full((7,), float(me))
    w = pg.allreduce([x], opts)
    w.wait()
    c.eq("synchronous allreduce", x, torch.full((7,), float(sum(range(n)))))
    c.eq("synchronous allreduce's future", w.get_future().wait()[0], x)
    if shape_is_pg:
        from cadence.torch._work import FAST_SYNC

        c.true("synchronous allreduce is_completed", w.is_completed())
        c.true(f"synchronous allreduce ran on the core's fast path: {type(w).__name__}",
               type(w).__name__ == ("DoneWork" if FAST_SYNC else "CadenceWork"))
    _check_small_async(c, group, n, me, shape_is_pg)
    dist.barrier(group=group)
    monitored_barrier(c, group=group, timeout=timedelta(seconds=30))


def _check_small_async(c: Checker, group, n: int, me: int, shape_is_pg: bool) -> None:
    """Asynchronous collectives of small tensors run at once and return
    finished (where torch reaches a finished Work), queued behind a large one
    still in flight; functional collectives take the same path."""
    import torch.distributed._functional_collectives as funcol
    from cadence._core import TorchFast
    from cadence.torch._work import FAST_SYNC

    big = torch.full((TorchFast.INLINE_ASYNC_BYTES // 4 + 1,), float(me))
    small = torch.full((5,), float(me + 1))
    gathered = torch.empty(3 * n)
    w_big = dist.all_reduce(big, async_op=True, group=group)
    w_small = dist.all_reduce(small, async_op=True, group=group)
    w_gather = dist.all_gather_into_tensor(gathered, torch.full((3,), float(me)),
                                           async_op=True, group=group)
    if shape_is_pg and FAST_SYNC:
        c.true("a small asynchronous allreduce returns finished", w_small.is_completed())
        c.true("a small asynchronous all_gather_into_tensor returns finished",
               w_gather.is_completed())
    for w in (w_small, w_gather, w_big):
        w.wait()
    c.eq("large async all_reduce before small ones", big,
         torch.full_like(big, float(sum(range(n)))))
    c.eq("small async all_reduce behind a large one", small,
         torch.full((5,), float(sum(r + 1 for r in range(n)))))
    c.eq("small async all_gather_into_tensor", gathered,
         torch.arange(n, dtype=torch.float32).repeat_interleave(3))
    pg = group or dist.group.WORLD
    x = torch.full((9,), float(me))
    y = funcol.wait_tensor(funcol.all_reduce(x, "sum", pg))
    c.eq("functional all_reduce", y, torch.full((9,), float(sum(range(n)))))
    c.eq("functional all_reduce leaves its input", x, torch.full((9,), float(me)))


def _transport(rank: int, transport: str) -> None:
    """"tcp": every rank its own emulated host, so cadence talks TCP."""
    if transport == "tcp":
        os.environ["CADENCE_HOST"] = f"host{rank}"


def check_deprecated_and_new_apis(c: Checker, n: int, me: int, is_pg: bool) -> None:
    """all_gather_coalesced (deprecated, still routed to the group) and
    gather_single (new in torch 2.15; torch routes it to Python process
    groups only, not to Python backends inside its own ProcessGroup)."""
    ins = [value(me, torch.int64, (2, 2)), value(me, torch.int64, (3,), salt=1)]
    outs = [[torch.empty((2, 2), dtype=torch.int64), torch.empty(3, dtype=torch.int64)]
            for _ in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced(outs, ins)
    for r in range(n):
        c.eq(f"all_gather_coalesced from {r} #0", outs[r][0], value(r, torch.int64, (2, 2)))
        c.eq(f"all_gather_coalesced from {r} #1", outs[r][1],
             value(r, torch.int64, (3,), salt=1))
    if is_pg and hasattr(dist, "gather_single"):
        out = torch.empty((n * 2, 3)) if me == 1 else None
        dist.gather_single(value(me, torch.float32, (2, 3)), out, dst=1)
        if me == 1:
            c.eq("gather_single", out, torch.cat([value(r, torch.float32, (2, 3))
                                                 for r in range(n)]))


def check_group_timeout(c: Checker, n: int, me: int) -> None:
    """A group's timeout is every operation's deadline: rank 1 does not join
    an all_reduce for longer than the timeout, the others raise in time."""
    timeout_s = 2.0
    g = dist.new_group(timeout=timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(1), group=g)  # the group works
    if me == 1:
        time.sleep(timeout_s + 2)
    t = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=g)
        err = None
    except RuntimeError as e:
        err = e
    took = time.monotonic() - t
    dist.barrier()  # the world group is unaffected; realign the ranks
    if me == 1:
        return  # what the late rank sees is the core's business (see the report)
    c.true(f"all_reduce with rank 1 absent raised DistBackendError: {err!r}",
           isinstance(err, dist.DistBackendError))
    c.true(f"...naming rank 1: {err}", err is not None and "rank 1" in str(err))
    c.true(f"...within the timeout + 5 s (took {took:.1f} s)", took <= timeout_s + 5)
    c.true(f"...not before the timeout (took {took:.1f} s)", took >= timeout_s - 0.5)


def ops_worker(rank, n, outdir, backend="cadence", transport="shm", device_id=None):
    """Every op on the world group and on sub-groups (new_group over a
    subset, split_group), sync and async, then the error paths."""
    _transport(rank, transport)
    import cadence  # noqa: F401 - registers the backend

    dist.init_process_group(backend, rank=rank, world_size=n,
                            timeout=timedelta(seconds=60), device_id=device_id)
    c = Checker(rank)
    is_pg = backend == "cadence"
    c.true(f"default group type {type(dist.group.WORLD).__name__}",
           not is_pg or type(dist.group.WORLD).__name__ == "ProcessGroupCadence")
    check_reductions(c, None, n, rank, is_pg)
    check_moves(c, None, n, rank)
    check_async(c, None, n, rank, is_pg)

    # A sub-group over ranks {n-1, 0}: group ranks differ from global ranks.
    members = [n - 1, 0] if n > 2 else [1, 0]
    sub = dist.new_group(members)
    if rank in members:
        me = dist.get_rank(sub)
        c.true("new_group rank order", me == sorted(members).index(rank))
        check_reductions(c, sub, len(members), me, is_pg)
        check_moves(c, sub, len(members), me)
    # split_group: {0, 1} and the rest.
    parts = [[0, 1]] + ([list(range(2, n))] if n > 2 else [])
    if SPLIT_GROUP:
        split = dist.split_group(split_ranks=parts)
        mine = next(p for p in parts if rank in p)
        x = torch.full((5,), float(rank))
        dist.all_reduce(x, group=split)
        c.eq("split_group all_reduce", x, torch.full((5,), float(sum(mine))))
        y = torch.empty(len(mine) * 2)
        dist.all_gather_into_tensor(y, torch.full((2,), float(rank)), group=split)
        c.eq("split_group all_gather", y,
             torch.tensor([float(r) for r in mine for _ in (0, 1)]))
    else:  # torch refuses before creating anything: no rank is left waiting
        c.raises(f"split_group on torch {torch.__version__}", RuntimeError,
                 "not safe to split",
                 lambda: dist.split_group(split_ranks=parts))
        dist.barrier()

    check_deprecated_and_new_apis(c, n, rank, is_pg)
    check_group_timeout(c, n, rank)

    # Receive from any source: every other rank sends its rank to rank 0,
    # which learns each sender from dist.recv's return value. Only where the
    # group is cadence's own: in a mixed group torch's C++ asks the Work's
    # sourceRank(), which pybind does not forward to Python (known gap).
    if is_pg and rank == 0:
        got = set()
        for _ in range(n - 1):
            t = torch.empty(3)
            src = dist.recv(t)
            c.eq(f"recv from any source (sender {src})", t, torch.full((3,), float(src)))
            got.add(src)
        c.true("recv from any source: every sender once", got == set(range(1, n)))
    elif is_pg:
        dist.send(torch.full((3,), float(rank)), 0)
    dist.barrier()

    # Errors that leave the group usable.
    if is_pg:
        # torch routes _set_pg_timeout to the group's set_timeout (refused), or
        # (before 2.14) only to gloo and nccl backends, warning it did nothing.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                dist.distributed_c10d._set_pg_timeout(timedelta(seconds=5))
                err = None
            except RuntimeError as e:
                err = e
        ignored = any("only supported for either nccl or gloo" in str(m.message)
                      for m in caught)
        c.true(f"set_timeout refused ({err}) or ignored by torch ({ignored})",
               (err is not None and "fixed" in str(err)) or (err is None and ignored))
    c.raises("all_reduce MIN on complex", ValueError, "complex",
             lambda: dist.distributed_c10d._get_default_group().allreduce(
                 [torch.ones(2, dtype=torch.complex64)], RO.MIN))
    # monitored_barrier names the rank that does not arrive in time.
    late = n - 1
    if rank == late:
        time.sleep(2.0)
    if rank == 0:
        c.raises("monitored_barrier with a late rank", RuntimeError,
                 f"Rank {late} failed to pass monitoredBarrier",
                 lambda: monitored_barrier(c, timeout=timedelta(seconds=0.5),
                                                wait_all_ranks=True))
    elif rank == late:
        c.raises("monitored_barrier after rank 0 gave up", RuntimeError, "did not release",
                 lambda: monitored_barrier(c, timeout=timedelta(seconds=0.5)))
    else:
        c.raises("monitored_barrier after rank 0 gave up", RuntimeError, "did not release",
                 lambda: monitored_barrier(c, timeout=timedelta(seconds=3)))
    x = torch.ones(3)
    dist.all_reduce(x)
    c.eq("all_reduce after the error paths", x, torch.full((3,), float(n)))
    dist.destroy_process_group()
    return {"failures": c.failures, "checks": c.count}


def mixed_refused_worker(rank, n, outdir):
    """On a torch without Python c10d.Backend constructors: what
    init_process_group("cpu:cadence,cuda:gloo") raises, and that plain
    "cadence" still works in the same process afterwards."""
    import cadence  # noqa: F401

    try:
        dist.init_process_group("cpu:cadence,cuda:gloo", rank=rank, world_size=n,
                                timeout=timedelta(seconds=60))
        err = None
    except RuntimeError as e:
        err = str(e)
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"error": err}


# -- training --------------------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.bn(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _hook_allreduce_then_divide(state, bucket):
    """A DDP communication hook that uses Work.get_future(): sum, then divide
    in the continuation (the default hook divides first)."""
    state["calls"] += 1
    world = dist.get_world_size()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def ddp_train(rank, steps: int, group, hook: bool):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    # Small buckets: several allreduces per step, overlapping backward.
    ddp = DDP(SmallCNN(), process_group=group, bucket_cap_mb=0.002)
    state = {"calls": 0}
    if hook:
        ddp.register_comm_hook(state, _hook_allreduce_then_divide)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    losses, params = [], []
    for _ in range(steps):
        x = torch.randn(8, 3, 12, 12, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        params.append(_flat_params(ddp.module))
    return losses, params, state["calls"]


def ddp_worker(rank, n, outdir, steps=20, init=None):
    """The same DDP training on cadence, on gloo, and on cadence with a
    communication hook, in one job (gloo is a new_group of the world)."""
    import cadence  # noqa: F401

    if init == "env":  # torchrun: everything from the environment
        dist.init_process_group("cadence")
    else:
        dist.init_process_group("cadence", init_method=f"tcp://127.0.0.1:{init}", rank=rank,
                                world_size=n)
    out = {"backend": dist.get_backend()}
    out["cadence"] = ddp_train(rank, steps, None, hook=False)
    gloo = dist.new_group(backend="gloo")
    out["gloo"] = ddp_train(rank, steps, gloo, hook=False)
    out["hook"] = ddp_train(rank, steps, None, hook=True)
    dist.destroy_process_group()
    return out


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, d=32, heads=4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def fsdp_worker(rank, n, outdir, steps=10, divide_factor=None):
    """fully_shard training vs the same model unsharded on the whole batch.
    With `divide_factor` FSDP2 reduces gradients with PREMUL_SUM(1/factor)
    (else AVG); the reference scales its loss to match."""
    import cadence  # noqa: F401
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("cadence", init_method=f"file://{outdir}/store", rank=rank,
                            world_size=n)
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(32, 1))
    ref = copy.deepcopy(model)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    if divide_factor is not None:
        for module in (*model, model):  # each fully_shard unit keeps its own factor
            if hasattr(module, "set_gradient_divide_factor"):
                module.set_gradient_divide_factor(float(divide_factor))
    scale = n / divide_factor if divide_factor else 1.0
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(7)
    per_rank = 2
    losses, ref_losses = [], []
    for _ in range(steps):
        x = torch.randn(n * per_rank, 6, 32, generator=gen)
        y = torch.randn(n * per_rank, 6, 1, generator=gen)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        try:
            out = model(x[mine])
        except AttributeError as e:
            if FSDP2_CPU:
                raise
            dist.destroy_process_group()
            return {"torch_refused": str(e)}
        loss = F.mse_loss(out, y[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole, op=RO.AVG)
        losses.append(whole.item())
        ref_loss = F.mse_loss(ref(x), y)
        ref_opt.zero_grad()
        (ref_loss * scale).backward()
        ref_opt.step()
        ref_losses.append(ref_loss.item())
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    diff = max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    dist.destroy_process_group()
    return {"losses": losses, "ref_losses": ref_losses, "max_param_diff": diff}


def kill_worker(rank, n, outdir, transport, port, victim, die_at, timeout_s):
    """DDP training in which `victim` kills itself (SIGKILL) at step
    `die_at`; the others report what they raised and when it died."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    _transport(rank, transport)

    import cadence  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, n, is_master=rank == 0,
                          timeout=timedelta(seconds=30))
    dist.init_process_group("cadence", store=store, rank=rank, world_size=n,
                            timeout=timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(1000):
        if rank == victim and step == die_at:
            with open(os.path.join(outdir, "death"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss = ddp(torch.randn(8, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dist.all_reduce(torch.zeros(1))
        except Exception as e:  # noqa: BLE001 - what the test inspects
            at = time.time()
            with open(os.path.join(outdir, "death")) as f:
                death = float(f.read())
            return {"step": step, "at": at, "death": death, "type": type(e).__name__,
                    "is_runtime_error": isinstance(e, RuntimeError), "message": str(e)}
    return {"step": None}


def cuda_worker(rank, n, outdir, port):
    """CUDA tensors on a cadence group (staged through host memory): the
    main ops, then a few DDP steps of a CUDA model against gloo."""
    import cadence  # noqa: F401

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("cadence", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    c = Checker(rank)
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        xs = [value(r, dt).to(dev) for r in range(n)]
        t = xs[rank].clone()
        dist.all_reduce(t)
        c.eq(f"cuda all_reduce {dt}", t.cpu(), reference(RO.SUM, [x.cpu() for x in xs]))
        t = _strided(xs[rank].cpu()).to(dev)
        dist.all_reduce(t, op=RO.MAX, async_op=True).wait()
        c.eq(f"cuda all_reduce non-contiguous {dt}", t.cpu(),
             reference(RO.MAX, [x.cpu() for x in xs]))
        t = xs[rank].clone()
        dist.broadcast(t, src=n - 1)
        c.eq(f"cuda broadcast {dt}", t.cpu(), xs[n - 1].cpu())
        out = torch.empty((n * 3, 4), dtype=dt, device=dev)
        dist.all_gather_into_tensor(out, xs[rank])
        c.eq(f"cuda all_gather_into_tensor {dt}", out.cpu(), torch.cat([x.cpu() for x in xs]))
        out = torch.empty((1, 4), dtype=dt, device=dev)
        dist.reduce_scatter_tensor(out, xs[rank][:n])
        c.eq(f"cuda reduce_scatter_tensor {dt}", out.cpu(),
             reference(RO.SUM, [x.cpu()[:n] for x in xs])[rank:rank + 1])
        got = torch.empty((3, 4), dtype=dt, device=dev)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.irecv, got, (rank - 1) % n),
            dist.P2POp(dist.isend, xs[rank], (rank + 1) % n)])
        for q in reqs:
            q.wait()
        c.eq(f"cuda isend/irecv {dt}", got.cpu(), xs[(rank - 1) % n].cpu())
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(SmallCNN().to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(3):
        loss = ddp(torch.randn(4, 3, 12, 12, device=dev)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = _flat_params(ddp.module).cpu()
    ps = [torch.empty_like(p) for _ in range(n)]
    dist.all_gather(ps, p)
    c.true("cuda DDP parameters identical on all ranks", all(torch.equal(q, p) for q in ps))
    dist.destroy_process_group()
    return {"failures": c.failures}


if __name__ == "__main__":  # torchrun entry: torch_workers.py OUTDIR ddp
    import torch_launch

    outdir, what = sys.argv[1], sys.argv[2]
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    try:
        result = {"ddp": lambda: ddp_worker(rank, n, outdir, init="env")}[what]()
        torch_launch.save_result(outdir, rank, "ok", result)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        import traceback

        torch_launch.save_result(outdir, rank, "err", f"{e!r}\n{traceback.format_exc()}")
        raise
