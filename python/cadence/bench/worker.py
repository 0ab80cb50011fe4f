"""One rank of `cadence bench`: times a collective over a sweep of sizes.

Launched by the `cadence bench` command, N times per backend:

    python -m cadence.bench.worker --backend {cadence,gloo} ...   (torchrun's env)
    mpirun -np N python -m cadence.bench.worker --backend mpi ...

For each size: `--warmup` untimed iterations (of a batch of calls each, as
a sample has), then `--iters` timed samples, each a barrier and then a batch
of back-to-back calls (16 for messages up to
16 KiB, fewer above, one from 256 KiB) timed together with
time.perf_counter; a sample is the batch's time per call, and the rank keeps
the median. The barrier puts every sample on the same start (no rank still
finishing the previous call), and the batch amortizes the barrier's own skew
between ranks. Each record also carries every sample's start and end on the
host's monotonic clock, so that the launcher can time a sample from the first
rank's start to the last rank's end (`cadence bench --timing span`). Then a
correctness check on fresh data: every
rank fills its input with small integers that depend on (rank, index), runs the
collective once and counts the elements that differ from the result computed
locally. Each rank appends one JSON line per size to `<out>/rank<R>.jsonl`; the
launcher takes the max of the ranks' medians and the sum of their wrong counts.

allreduce and broadcast run in place, the other collectives out of place (gloo's
reduce, which is in place only, copies the input into the output first).

cadence takes `--algos auto,ring,...` (`algo=` per call; `auto` is the
library's own choice): at each size, on the same buffers, every algorithm is
warmed up, then the timed samples take turns (rounds of auto, ring, ...,
each algorithm in every position and after every other one: `turn_rounds`)
so that drift, interference and what one call leaves for the next hit them
all alike, then each is checked.
Its records carry "algo" and "chosen": the algorithm the flight recorder says
the check call ran (for `auto`, what the library picked; a call's choice
depends only on its shape, so the timed calls ran the same).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path

import numpy as np

from cadence import reference as ref
from cadence.bench.common import (
    DTYPES,
    IN_PLACE_OPS,
    OPS,
    PAGE,
    ROOT,
    DType,
    Layout,
    layout,
    p99,
    pattern_modulus,
)

# A buffer is a numpy array, or a CPU torch tensor for bfloat16 (numpy has none).
Buffer = object


class Backend:
    """A communication library as the benchmark loop sees it."""

    name = ""
    rank = 0
    size = 1

    def unsupported(self, dtype: DType) -> str | None:
        """Why this backend cannot run `dtype`, or None if it can."""
        return None

    def bind(
        self, op: str, inp: Buffer, out: Buffer | None, algo: str | None = None
    ) -> Callable[[], object]:
        """A call that runs `op` once on these buffers (conversions done here,
        outside the timed loop), with algorithm `algo` (None: the backend's own
        choice; only cadence takes one)."""
        raise NotImplementedError

    def ran(self, op: str, ncalls: int) -> list[str] | None:
        """The algorithm each of the last `ncalls` calls of `op` ran, oldest
        first, if the backend says (None: it does not, or no longer knows)."""
        return None

    def barrier(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class CadenceBackend(Backend):
    name = "cadence"

    def __init__(self, args: argparse.Namespace):
        import cadence

        self.comm = cadence.init()
        self.rank, self.size = self.comm.rank, self.comm.size

    def bind(self, op, inp, out, algo=None):
        c = self.comm
        algo = None if algo == "auto" else algo  # the native allreduce knows no "auto"
        # Positional arguments only, for every backend: a partial with
        # keywords builds a dict on every call (0.25-0.4 µs of Python here,
        # a fifth of a small call), which no training loop pays.
        return {
            "allreduce": partial(c.allreduce, inp, None, "sum", None, algo),
            "broadcast": partial(c.broadcast, inp, ROOT, algo),
            "reduce": partial(c.reduce, inp, ROOT, out, "sum", None, algo),
            "allgather": partial(c.allgather, inp, out, algo),
            "reduce_scatter": partial(c.reduce_scatter, inp, out, "sum", None, algo),
            "alltoall": partial(c.alltoall, inp, out, algo),
        }[op]

    def ran(self, op, ncalls):
        # The flight recorder names the algorithm of every operation it keeps.
        ops = [r for r in self.comm.dump_records()["ops"] if r.get("collective") == op]
        if len(ops) < ncalls:
            return None  # older calls fell out of the recorder's ring
        return [str(r.get("algo")) for r in ops[len(ops) - ncalls :]]

    def barrier(self):
        self.comm.barrier()

    def waits(self) -> dict:
        """How this rank's waits went over the whole run (the engine's
        counters: sleeps, late wake-ups, waits on a shared core, the longest
        idle stretch), and the futex wake-ups it sent its shared-memory
        peers (`doorbells_rung`)."""
        rec = self.comm.dump_records()
        waits = dict(rec["waits"])
        waits["doorbells_rung"] = sum(link.get("doorbells_rung", 0) for link in rec["links"])
        return waits

    def links(self) -> list[dict]:
        """Each TCP link's per-path traffic over the whole run (`--paths`)."""
        from cadence.diagnosis.metrics import snapshot

        return [
            {"peer": link["peer"], "peer_host": link["peer_host"], "paths": link["paths"]}
            for link in snapshot(self.comm)["links"]
            if link["transport"] == "tcp" and link.get("paths")
        ]

    def close(self):
        self.comm.close()


class GlooBackend(Backend):
    name = "gloo"

    def __init__(self, args: argparse.Namespace):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def _tensor(self, buf):
        # A view of the numpy array: no copy, inside or outside the timed loop.
        return self.torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf

    def bind(self, op, inp, out, algo=None):
        dist = self.dist
        t_in = self._tensor(inp)
        t_out = None if out is None else self._tensor(out)
        if op == "reduce":

            def reduce_out_of_place():
                t_out.copy_(t_in)
                dist.reduce(t_out, dst=ROOT)

            return reduce_out_of_place
        return {
            "allreduce": partial(dist.all_reduce, t_in),
            "broadcast": partial(dist.broadcast, t_in, ROOT),
            "allgather": partial(dist.all_gather_into_tensor, t_out, t_in),
            "reduce_scatter": partial(dist.reduce_scatter_tensor, t_out, t_in),
            "alltoall": partial(dist.all_to_all_single, t_out, t_in),
        }[op]

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self, args: argparse.Namespace):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def unsupported(self, dtype):
        if dtype.name in ("float16", "bfloat16"):
            return f"MPI has no {dtype.name} datatype"
        return None

    def bind(self, op, inp, out, algo=None):
        c, MPI = self.comm, self.MPI
        return {
            "allreduce": partial(c.Allreduce, MPI.IN_PLACE, inp, MPI.SUM),
            "broadcast": partial(c.Bcast, inp, ROOT),
            "reduce": partial(c.Reduce, inp, out, MPI.SUM, ROOT),
            "allgather": partial(c.Allgather, inp, out),
            "reduce_scatter": partial(c.Reduce_scatter_block, inp, out, MPI.SUM),
            "alltoall": partial(c.Alltoall, inp, out),
        }[op]

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass  # mpi4py finalizes MPI at exit


BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (CadenceBackend, GlooBackend, MpiBackend)}


# ---------------------------------------------------------------- buffers


def alloc(count: int, dtype: DType, offset: int | None = None) -> Buffer:
    """A zero-filled buffer whose pages are all touched (np.zeros would map
    the shared zero page lazily, and reading that is unrealistically fast);
    with `offset`, starting that many bytes past a page boundary."""
    if offset is None:
        if dtype.name == "bfloat16":
            import torch

            return torch.zeros(count, dtype=torch.bfloat16)
        buf = np.empty(count, dtype=dtype.name)
        buf.fill(0)
        return buf
    nbytes = count * dtype.itemsize
    raw = np.empty(nbytes + 2 * PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE + offset
    view = raw[start : start + nbytes]
    view.fill(0)
    if dtype.name == "bfloat16":
        import torch

        return torch.from_numpy(view.view(np.int16)).view(torch.bfloat16)
    return view.view(dtype.name)


def fill(buf: Buffer, values: np.ndarray) -> None:
    if isinstance(buf, np.ndarray):
        buf[...] = values
    else:
        import torch

        buf.copy_(torch.from_numpy(values))


def count_wrong(buf: Buffer, expected: np.ndarray) -> int:
    if isinstance(buf, np.ndarray):
        return int(np.count_nonzero(buf != expected.astype(buf.dtype)))
    import torch

    return int((buf != torch.from_numpy(expected).to(buf.dtype)).sum().item())


# ---------------------------------------------------------------- the check


def pattern(rank, index: np.ndarray, modulus: int) -> np.ndarray:
    """The check value of element `index` of `rank`'s input (int64, in [0, modulus))."""
    return (index * 31 + np.asarray(rank, dtype=np.int64) * 17 + 1) % modulus


def expected_result(
    op: str, lay: Layout, rank: int, nranks: int, modulus: int
) -> np.ndarray | None:
    """What `rank` must hold after `op` on pattern inputs; None if nothing (reduce off-root).

    The reductions and the gather are cadence.reference's; the inputs go in
    as generators or only in the part `rank` gets, since at the largest
    sizes every rank's whole input at once would not fit."""
    n = nranks
    part = lay.in_count // n if op in ("reduce_scatter", "alltoall") else lay.in_count

    def summed(idx):
        return ref.reference((pattern(s, idx, modulus) for s in range(n)), "int64", "sum")

    if op in ("allreduce", "reduce"):
        if op == "reduce" and rank != ROOT:
            return None
        return summed(np.arange(lay.in_count, dtype=np.int64))
    if op == "broadcast":
        return pattern(ROOT, np.arange(lay.in_count, dtype=np.int64), modulus)
    if op == "allgather":
        return ref.allgather([pattern(s, np.arange(part, dtype=np.int64), modulus)
                              for s in range(n)])  # fmt: skip
    if op == "reduce_scatter":
        return summed(rank * part + np.arange(part, dtype=np.int64))
    if op == "alltoall":
        idx = np.arange(lay.out_count, dtype=np.int64)
        return pattern(idx // part, rank * part + idx % part, modulus)
    raise ValueError(f"unknown op {op!r}")


def check(
    backend: Backend,
    op: str,
    dtype: DType,
    lay: Layout,
    inp: Buffer,
    out: Buffer | None,
    algo: str | None = None,
) -> int:
    """Run `op` once on fresh pattern data; the number of wrong elements on this rank."""
    modulus = pattern_modulus(dtype, backend.size)
    fill(inp, pattern(backend.rank, np.arange(lay.in_count, dtype=np.int64), modulus))
    if out is not None:
        # A value no correct result takes (results are <= nranks * (modulus - 1)).
        fill(out, np.full(lay.out_count, dtype.max_exact, dtype=np.int64))
    backend.bind(op, inp, out, algo)()
    expected = expected_result(op, lay, backend.rank, backend.size, modulus)
    if expected is None:
        return 0
    return count_wrong(inp if op in IN_PLACE_OPS else out, expected)


# ---------------------------------------------------------------- the loop


@dataclass
class Samples:
    """One call's timed samples: each batch's start and end, in seconds on
    time.perf_counter (the host's monotonic clock, one for every process on
    it), and the calls a batch made."""

    batch: int
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    @property
    def per_call(self) -> list[float]:
        """Each sample's seconds per call, as this rank saw it."""
        return [(e - s) / self.batch for s, e in zip(self.starts, self.ends, strict=True)]


def time_ops(
    fns: list[Callable[[], object]],
    iters: int,
    warmup: int,
    barrier: Callable[[], None],
    batch: int = 1,
) -> list[Samples]:
    """Each call's `iters` samples. A sample is a barrier,
    then `batch` calls back to back timed together: every sample starts with
    all ranks in step, so an algorithm is not charged for the skew its
    predecessor left (a slow ring's stragglers would otherwise be timed as the
    next call's). With several calls (one per algorithm) the samples take
    turns, so that drift or interference while they run hits them all alike,
    in rounds where each call has every position and every predecessor (see
    `turn_rounds`)."""
    # Warm-up in the samples' unit (a batch): 5 single calls of a sweep's
    # first size left a library's first size measured cold, before the
    # kernel's scheduler had seen the ranks busy.
    for fn in fns:
        for _ in range(warmup * batch):
            fn()
    samples = [Samples(batch) for _ in fns]
    gc.disable()  # a collection inside the loop would be timed as communication
    try:
        for k in turns(len(fns), iters):
            fn = fns[k]
            barrier()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            t1 = time.perf_counter()
            samples[k].starts.append(t0)
            samples[k].ends.append(t1)
    finally:
        gc.enable()
    return samples


def batch_calls(nbytes: int) -> int:
    """Calls per timed sample: enough that small messages run ~16 deep, so the
    barrier's exit skew (one message latency) is a small share of a sample;
    one call from 256 KiB, where a call is long against that skew. The same on
    every rank (it depends on the size only), as the call count must be."""
    return max(1, min(16, (256 * 1024) // max(nbytes, 1)))


def turn_rounds(n: int) -> list[list[int]]:
    """Rounds of n calls in which every call takes every position, and every
    call follows every other one equally often (a Williams design, as
    crossover trials use against carry-over): n rounds for even n, 2n for
    odd n (the rounds and their mirror images).

    The predecessor matters: a call can leave the caches in a state that
    taxes the next one (hierarchical allgather sends from the output, which
    the next call writes first, and the peer's core holds those lines). With
    a fixed successor, as the rotation 0..n-1, 1..n-1,0, ... had, that tax
    fell on one algorithm every time: the call after hierarchical took 1.3-2x
    its time in `--algo all` at 1-16 MiB on 2 ranks, and `auto/best` read
    0.56-0.79 where auto and the best were level."""
    if n <= 1:
        return [[0] * n]
    # 0, 1, n-1, 2, n-2, ...: the successive differences are 1, -2, 3, -4,
    # ..., all distinct mod n for even n, so shifting the row by i covers
    # every ordered pair once.
    first = [0 if j == 0 else (j + 1) // 2 if j % 2 else n - j // 2 for j in range(n)]
    rounds = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rounds += [r[::-1] for r in rounds]
    return rounds


def turns(n: int, iters: int) -> list[int]:
    """The order in which n calls take their `iters` timed turns each:
    `turn_rounds(n)` one after the other, over again."""
    rounds = turn_rounds(n)
    return [k for i in range(iters) for k in rounds[i % len(rounds)]]


def chosen_algos(backend: Backend, op: str, algos: list[str]) -> list[str | None]:
    """For each algorithm, the one its last call (the check, which follows the
    timed calls, one per algorithm in order) ran, from the backend's record."""
    names = backend.ran(op, len(algos))
    return [None] * len(algos) if names is None else list(names)


def run_size(
    backend: Backend,
    op: str,
    dtype: DType,
    size: int,
    iters: int,
    warmup: int,
    algos: list[str | None],
    offset: int | None = None,
) -> Iterator[dict]:
    """One record per algorithm (None: the backend's own, no "algo" key), as
    each finishes; the algorithms one after the other on the same buffers."""
    lay = layout(op, size, dtype.itemsize, backend.size)
    if lay is None:
        for algo in algos:
            named = {} if algo is None else {"algo": algo}
            yield {"size": size, **named, "skipped": "no element per rank at this size"}
        return
    inp = alloc(lay.in_count, dtype, offset)
    out = None if op in IN_PLACE_OPS else alloc(lay.out_count, dtype, offset)
    fns = [backend.bind(op, inp, out, algo) for algo in algos]
    all_samples = time_ops(fns, iters, warmup, backend.barrier, batch_calls(lay.nbytes))
    wrongs = [check(backend, op, dtype, lay, inp, out, algo) for algo in algos]
    named_algos = [a for a in algos if a is not None]
    chosen = chosen_algos(backend, op, named_algos) if named_algos else [None]
    for algo, samples, wrong, ran in zip(algos, all_samples, wrongs, chosen, strict=True):
        named = {} if algo is None else {"algo": algo, "chosen": ran}
        times = samples.per_call
        yield {
            "size": size,
            **named,
            "bytes": lay.nbytes,
            "count": lay.count,
            "time_us": statistics.median(times) * 1e6,
            "p99_us": p99(times) * 1e6,
            "min_us": min(times) * 1e6,
            "wrong": wrong,
            "batch": samples.batch,
            "starts": samples.starts,
            "ends": samples.ends,
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cadence.bench.worker", description=__doc__.split("\n")[0]
    )
    p.add_argument("--backend", choices=sorted(BACKENDS), required=True)
    p.add_argument("--op", choices=OPS, required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True, help="directory for rank<R>.jsonl")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds, for gloo's init")
    p.add_argument("--algos", help="cadence: comma-separated algorithms, auto for its own choice")
    p.add_argument("--offset", type=int, help="buffers start this many bytes past a page")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.algos = [a for a in (args.algos or "").split(",") if a] or None
    if args.algos and args.backend != "cadence":
        p.error("--algos is for --backend cadence")
    return args


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when its launcher (or mpirun) dies, so a
    killed `cadence bench` leaves no rank behind, even a hung one."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    args = parse_args(argv)
    backend = BACKENDS[args.backend](args)
    dtype = DTYPES[args.dtype]
    path = Path(args.out) / f"rank{backend.rank}.jsonl"
    with path.open("w") as log:

        def emit(record: dict) -> None:
            log.write(json.dumps({"rank": backend.rank, "nranks": backend.size, **record}) + "\n")
            log.flush()

        reason = backend.unsupported(dtype)
        if reason:
            emit({"na": reason})
        else:
            algos = args.algos or [None]
            for size in args.sizes:
                for record in run_size(
                    backend, args.op, dtype, size, args.iters, args.warmup, algos, args.offset
                ):
                    emit(record)
            if isinstance(backend, CadenceBackend):
                emit({"links": backend.links()})
                emit({"waits": backend.waits()})
    backend.barrier()  # nobody tears down while a peer still reads from it
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
