"""numpy references for every collective: seeded inputs, expected results and
the comparison, shared by the test suite (tests/checks.py), the soak
(cadence.testbed.soak_rank) and the benchmark's check (cadence.bench.worker).

Each rank regenerates every rank's input deterministically, computes the
expected result with numpy, runs cadence and compares. Data are random small
integers (and, for prod, random powers of two) stored in the tested dtype, so
sums, products, min and max are exact in every dtype and a comparison can be
exact; `avg` and continuous random floats are compared within the dtype's
tolerance.

bfloat16 exists only as a torch dtype: its buffers are torch tensors, its
numpy values float32 numbers that bfloat16 represents exactly. torch is
imported only when a bfloat16 buffer is made.
"""

from __future__ import annotations

import numpy as np

from cadence import _dtypes as dtypes

FLOATS = list(dtypes.FLOATS)
INTS = list(dtypes.INTS)
# In the core's order; the inputs' seeds count on it (`gen`).
DTYPES = list(dtypes.NAMES)
OPS = ["sum", "prod", "min", "max", "avg", "premul_sum"]
FACTOR = 0.5


def ops_for(dtype):
    """The reductions that apply to `dtype` (premul_sum: floats only)."""
    return OPS if dtype in FLOATS else OPS[:5]


def np_dtype(dtype):
    return np.dtype(np.float32) if dtype == "bfloat16" else np.dtype(dtype)


def gen(rank, count, dtype, op, salt):
    """Rank `rank`'s input: exact-arithmetic-friendly random values (as numpy;
    bfloat16 as float32 values that bfloat16 represents exactly). `salt` is an
    int or a sequence of ints (e.g. seed, job, step)."""
    salt = [int(s) for s in salt] if isinstance(salt, (tuple, list)) else [int(salt)]
    rng = np.random.default_rng([rank, count, *salt, DTYPES.index(dtype), OPS.index(op)])
    if op == "prod":
        if dtype in FLOATS:
            v = np.ldexp(1.0, rng.integers(-1, 2, count)) * rng.choice([-1.0, 1.0], count)
        else:
            v = rng.integers(1, 4, count) * rng.choice([-1, 1], count)
            if dtype == "uint8":
                v = np.abs(v)
    else:
        lo = 0 if dtype == "uint8" else -20
        v = rng.integers(lo, 21, count)
    return v.astype(np_dtype(dtype))


def to_user(a, dtype):
    """The buffer handed to cadence: numpy, or a torch tensor for bfloat16."""
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return np.array(a, copy=True, order="C")


def from_user(x, dtype):
    if dtype == "bfloat16":
        import torch

        return x.to(torch.float32).numpy()
    return np.asarray(x)


def empty_user(count, dtype):
    return to_user(np.zeros(count, dtype=np_dtype(dtype)), dtype)


def reference(inputs, dtype, op, factor=FACTOR):
    """Element-wise reduction of the ranks' inputs, in the dtype's arithmetic
    (integers wrap like fixed-width hardware). `inputs` may be any iterable:
    a generator keeps only two arrays alive, where a list of large inputs
    would hold them all."""
    inputs = iter(inputs)
    if op == "premul_sum":
        inputs = (a * np_dtype(dtype).type(factor) for a in inputs)
    acc = next(inputs).copy()
    n = 1
    with np.errstate(over="ignore"):
        for a in inputs:
            n += 1
            if op in ("sum", "avg", "premul_sum"):
                acc = acc + a
            elif op == "prod":
                acc = acc * a
            elif op == "min":
                acc = np.minimum(acc, a)
            elif op == "max":
                acc = np.maximum(acc, a)
    acc = acc.astype(np_dtype(dtype))
    if op == "avg":
        if dtype in FLOATS:
            acc = (acc.astype(np.float64) / n).astype(np_dtype(dtype))
        else:  # truncating division, exact in integers
            q = acc // n
            q[(acc % n != 0) & (acc < 0)] += 1
            acc = q.astype(acc.dtype)
    return acc


def compare(got, want, dtype, op, what, failures):
    """Appends a description to `failures` unless `got` is `want` (exactly,
    or within the dtype's tolerance for a floating-point avg)."""
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape} != {want.shape}")
        return
    if op == "avg" and dtype in FLOATS:
        tol = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6, "float64": 1e-12}[dtype]
        ok = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = got == want
    if not ok.all():
        idx = np.flatnonzero(~ok)
        i = idx[0]
        failures.append(
            f"{what}: {idx.size} of {got.size} wrong, first at {i}: got {got[i]!r} want {want[i]!r}"
        )


def split_counts(n, total, salt):
    """Irregular per-rank counts (some zero) summing to `total`."""
    salt = [int(s) for s in salt] if isinstance(salt, (tuple, list)) else [int(salt)]
    rng = np.random.default_rng([n, total, *salt])
    cuts = np.sort(rng.integers(0, total + 1, n - 1)) if n > 1 else np.array([], dtype=int)
    edges = np.concatenate([[0], cuts, [total]])
    return [int(v) for v in np.diff(edges)]


# ---------------------------------------------------------------- expected results
# `ins[q]` is rank q's input (numpy); each returns what rank `r` must hold.


def allgather(ins):
    """allgather and allgatherv: every rank's block, in rank order (flat)."""
    return np.concatenate([a.reshape(-1) for a in ins]) if ins else np.array([])


def reduce_scatter(ins, counts, r, dtype, op, factor=FACTOR):
    """Block r (counts[r] elements at offset sum(counts[:r])) of the reduction."""
    off = sum(counts[:r])
    return reference(ins, dtype, op, factor)[off:off + counts[r]]


def alltoall(ins, matrix, r):
    """alltoall(v): matrix[s][d] elements go from rank s to rank d, each
    sender's blocks laid out in destination order; rank r gets the blocks
    bound for it, in source order."""
    parts = []
    for s, a in enumerate(ins):
        off = sum(matrix[s][:r])
        parts.append(a[off:off + matrix[s][r]])
    return np.concatenate(parts)


def scatter(root_input, counts, r):
    """Block r of the root's input."""
    off = sum(counts[:r])
    return root_input[off:off + counts[r]]
