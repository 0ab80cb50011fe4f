"""Rank-side correctness checks: every collective against a numpy reference.

The inputs, references and comparison live in cadence.reference
(the soak uses them too). Each check returns a list of failure descriptions
(empty when all is well).
"""

from __future__ import annotations

import time

import numpy as np
from cadence.reference import (  # noqa: F401 - re-exported for the tests
    DTYPES,
    FACTOR,
    FLOATS,
    INTS,
    OPS,
    compare,
    empty_user,
    from_user,
    gen,
    ops_for,
    reference,
    to_user,
)
from cadence.reference import split_counts as _counts


def check_reducing(comm, count, dtype, op, failures, algo=None):
    n, r = comm.size, comm.rank
    ins = [gen(q, count, dtype, op, 1) for q in range(n)]
    want = reference(ins, dtype, op)
    kw = {"op": op, "factor": FACTOR if op == "premul_sum" else None, "algo": algo}
    tag = f"{dtype}/{op}/count={count}/n={n}/algo={algo}"

    # allreduce, out of place and in place
    x = to_user(ins[r], dtype)
    out = empty_user(count, dtype)
    comm.allreduce(x, out=out, **kw)
    compare(from_user(out, dtype), want, dtype, op, f"allreduce out-of-place {tag}", failures)
    compare(from_user(x, dtype), ins[r], dtype, "sum", f"allreduce input untouched {tag}", failures)
    y = to_user(ins[r], dtype)
    comm.allreduce(y, **kw)
    compare(from_user(y, dtype), want, dtype, op, f"allreduce in-place {tag}", failures)

    if algo is not None:
        return
    # reduce at a rotating root
    root = count % n
    x = to_user(ins[r], dtype)
    out = empty_user(count, dtype)
    res = comm.reduce(x, root=root, out=out, **kw)
    if r == root:
        compare(from_user(res, dtype), want, dtype, op, f"reduce root={root} {tag}", failures)

    # reduce_scatter on count per block, and reduce_scatterv on irregular counts
    # Rank q's input is n blocks, block b drawn as gen(q, count, ..., (2, b)),
    # so this rank draws its own input and block r of the others' (2n blocks,
    # not n²: at 8 ranks the whole inputs' draws were most of the test's time).
    mine = np.concatenate([gen(r, count, dtype, op, (2, b)) for b in range(n)])
    block_r = [gen(q, count, dtype, op, (2, r)) for q in range(n)]
    out = comm.reduce_scatter(to_user(mine, dtype), **kw)
    compare(from_user(out, dtype), reference(block_r, dtype, op), dtype, op,
            f"reduce_scatter {tag}", failures)
    counts = _counts(n, count, 7)
    v_in = [gen(q, count, dtype, op, 3) for q in range(n)]
    v_want = reference(v_in, dtype, op)
    off = sum(counts[:r])
    out = comm.reduce_scatterv(to_user(v_in[r], dtype), counts, **kw)
    compare(from_user(out, dtype), v_want[off:off + counts[r]], dtype, op,
            f"reduce_scatterv counts={counts} {tag}", failures)


def check_moving(comm, count, dtype, failures, algo=None):
    n, r = comm.size, comm.rank
    op = "sum"
    ins = [gen(q, count, dtype, op, 4) for q in range(n)]
    tag = f"{dtype}/count={count}/n={n}"
    root = (count + 1) % n

    b = to_user(ins[r], dtype)
    comm.broadcast(b, root=root)
    compare(from_user(b, dtype), ins[root], dtype, op, f"broadcast root={root} {tag}", failures)

    g = comm.allgather(to_user(ins[r], dtype))
    compare(from_user(g, dtype), np.concatenate(ins), dtype, op, f"allgather {tag}", failures)

    counts = _counts(n, count, 11)
    vin = [gen(q, counts[q], dtype, op, 5) for q in range(n)]
    g = comm.allgatherv(to_user(vin[r], dtype), counts)
    compare(from_user(g, dtype), np.concatenate(vin), dtype, op,
            f"allgatherv counts={counts} {tag}", failures)

    # Rank s's block for d is gen(s, count, ..., (6, d)): drawn block by block
    # as for reduce_scatter, this rank's own and the ones sent to it.
    mine = np.concatenate([gen(r, count, dtype, op, (6, d)) for d in range(n)])
    got = comm.alltoall(to_user(mine, dtype))
    want = np.concatenate([gen(s, count, dtype, op, (6, r)) for s in range(n)])
    compare(from_user(got, dtype), want, dtype, op, f"alltoall {tag}", failures)

    # alltoallv: rank s sends m[s][d] elements to d, drawn as gen(s, m[s][d], ..., (8, d))
    m = [_counts(n, count, 100 + s) for s in range(n)]
    mine = np.concatenate([gen(r, m[r][d], dtype, op, (8, d)) for d in range(n)])
    recv_counts = [m[s][r] for s in range(n)]
    got = comm.alltoallv(to_user(mine, dtype), m[r], recv_counts)
    want = np.concatenate([gen(s, m[s][r], dtype, op, (8, r)) for s in range(n)])
    compare(from_user(got, dtype), want, dtype, op, f"alltoallv {tag}", failures)

    res = comm.gather(to_user(ins[r], dtype), root=root)
    if r == root:
        compare(from_user(res, dtype), np.concatenate(ins), dtype, op, f"gather {tag}", failures)

    src = (np.concatenate([gen(root, count, dtype, op, 9 + q) for q in range(n)])
           if r == root else None)
    out = empty_user(count, dtype)
    comm.scatter(to_user(src, dtype) if r == root else None, out, root=root)
    compare(from_user(out, dtype), gen(root, count, dtype, op, 9 + r), dtype, op,
            f"scatter {tag}", failures)

    if n > 1:  # ring of sends: r -> r+1, async so nobody blocks
        nxt, prv = (r + 1) % n, (r - 1) % n
        out = empty_user(count, dtype)
        w = comm.recv(out, prv, async_op=True)
        comm.send(to_user(ins[r], dtype), nxt)
        w.wait()
        compare(from_user(out, dtype), ins[prv], dtype, op, f"send/recv {tag}", failures)
    comm.barrier()


def check_matrix(comm, counts, dtypes=None, big=()):
    """All collectives × `dtypes` × ops at `counts`; at `big` counts only
    float32 sum / int32 max (memory and time)."""
    failures = []
    for count in counts:
        for dtype in dtypes or DTYPES:
            for op in ops_for(dtype):
                check_reducing(comm, count, dtype, op, failures)
            check_moving(comm, count, dtype, failures)
    for count in big:
        check_reducing(comm, count, "float32", "sum", failures)
        check_reducing(comm, count, "int32", "max", failures)
        check_moving(comm, count, "float32", failures)
    return failures[:30]


def check_algorithms(comm, counts):
    """allreduce with every algorithm, every dtype, sum and max."""
    import cadence

    failures = []
    algos = comm.algorithms("allreduce")
    uniform = len({comm.hosts.count(h) for h in comm.hosts}) == 1
    # Hierarchical schedules apply exactly when every host has as many ranks.
    assert ("hierarchical" in algos) == uniform, (algos, comm.hosts)
    assert set(algos) <= set(cadence.algorithms("allreduce"))
    for algo in algos:
        for count in counts:
            for dtype in DTYPES:
                for op in ("sum", "max"):
                    check_reducing(comm, count, dtype, op, failures, algo=algo)
    return failures[:30]


def check_one_algorithm(comm, algo, count, cases):
    """allreduce by `algo` at `count`, for each (dtype, op) of `cases`."""
    failures = []
    for dtype, op in cases:
        check_reducing(comm, count, dtype, op, failures, algo=algo)
    return failures[:30]


def check_random_floats(comm, count):
    """Continuous random float32/float64 data: sums within tolerance, and
    bitwise identical on every rank (DDP needs identical replicas)."""
    n, r = comm.size, comm.rank
    failures = []
    for dtype in ("float32", "float64"):
        ins = [np.random.default_rng([q, count]).standard_normal(count).astype(dtype)
               for q in range(n)]
        want = np.sum(np.stack(ins).astype(np.float64), axis=0)
        x = ins[r].copy()
        comm.allreduce(x)
        tol = 1e-5 if dtype == "float32" else 1e-12
        if not np.allclose(x, want, rtol=tol, atol=tol * n):
            failures.append(f"random {dtype} allreduce off by {np.max(np.abs(x - want))}")
        everyone = comm.allgather(x)
        if not all(np.array_equal(everyone[q], x) for q in range(n)):
            failures.append(f"random {dtype} allreduce differs across ranks")
    return failures


def check_matrix_single_copy(comm, counts, dtypes):
    """check_matrix, then how many messages this rank sent by single copy
    (from its shared-memory links' counters)."""
    failures = check_matrix(comm, counts, dtypes)
    links = comm.dump_records()["links"]
    single = sum(link["single_copy_sent"] for link in links if link["transport"] == "shm")
    return failures, single


def single_copies_of(comm, op, count):
    """Runs `op` (reduce, broadcast or allgather) once on `count` random
    float32 per rank, checks it against numpy, and returns (failures, how
    many messages this rank sent by single copy meanwhile)."""
    n, r = comm.size, comm.rank
    ins = [np.random.default_rng([q, count, 5]).standard_normal(count).astype(np.float32)
           for q in range(n)]

    def sent():
        links = comm.dump_records()["links"]
        return sum(link["single_copy_sent"] for link in links if link["transport"] == "shm")

    before, failures = sent(), []
    if op == "reduce":
        out = np.zeros(count, np.float32)
        comm.reduce(ins[r], 0, out)
        want = np.sum(ins, axis=0, dtype=np.float32)
        if r == 0 and not np.allclose(out, want, rtol=1e-5, atol=1e-5 * n):
            failures.append(f"reduce off by {np.max(np.abs(out - want))}")
    elif op == "broadcast":
        x = ins[r].copy()
        comm.broadcast(x, 0)
        if not np.array_equal(x, ins[0]):
            failures.append("broadcast differs from the root's buffer")
    else:
        parts = comm.allgather(ins[r])
        if not all(np.array_equal(parts[q], ins[q]) for q in range(n)):
            failures.append("allgather differs from the inputs")
    return failures, sent() - before


def helped_copies(comm, op, count, calls):
    """Runs `op` (broadcast or allgather) `calls` times on `count` random
    float32 per rank, each result checked against numpy, and returns
    (failures, bytes this rank wrote into its receivers' memory, helping
    their single-copy reads: the links' `single_copy_helped`). Every rank
    but 0 comes to each call 20 ms late, so that rank 0 has stopped
    spinning and yielding and sleeps when its receivers offer it help."""
    n, r = comm.size, comm.rank

    def helped():
        links = comm.dump_records()["links"]
        return sum(link["single_copy_helped"] for link in links if link["transport"] == "shm")

    before, failures = helped(), []
    for k in range(calls):
        ins = [np.random.default_rng([q, count, k, 17]).standard_normal(count).astype(np.float32)
               for q in range(n)]
        comm.barrier()  # after the inputs: only the sleep below sets who is late
        if r != 0:
            time.sleep(0.02)
        if op == "broadcast":
            x = ins[r].copy()
            comm.broadcast(x, 0)
            if not np.array_equal(x, ins[0]):
                failures.append(f"call {k}: broadcast differs from the root's buffer")
        else:
            parts = comm.allgather(ins[r])
            if not all(np.array_equal(parts[q], ins[q]) for q in range(n)):
                failures.append(f"call {k}: allgather differs from the inputs")
    return failures, helped() - before


def check_direct_fold_order(comm, count):
    """Direct allreduce and reduce_scatter on random float32: every element
    of owner r's block must have exactly the bits of adding the
    contributions in peer order, own first, then r+1, r+2, ... (folds run as
    their data lands, chunks arrive out of order over several streams, and
    float addition is not associative: any other order shows)."""
    n, r = comm.size, comm.rank
    failures = []
    ins = [np.random.default_rng([q, count, 11]).standard_normal(count).astype(np.float32)
           for q in range(n)]

    def in_peer_order(owner, lo, hi):
        acc = ins[owner][lo:hi].copy()
        for k in range(1, n):
            acc = acc + ins[(owner + k) % n][lo:hi]
        return acc

    x = ins[r].copy()
    comm.allreduce(x, algo="direct")
    for owner in range(n):
        lo, hi = owner * count // n, (owner + 1) * count // n
        if not np.array_equal(x[lo:hi], in_peer_order(owner, lo, hi)):
            failures.append(f"direct allreduce: block {owner} not summed in peer order")
    counts = _counts(n, count, 5)
    out = comm.reduce_scatterv(ins[r], counts, algo="direct")
    lo = sum(counts[:r])
    if not np.array_equal(out, in_peer_order(r, lo, lo + counts[r])):
        failures.append(f"direct reduce_scatterv counts={counts}: not summed in peer order")
    return failures
