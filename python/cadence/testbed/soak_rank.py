"""One rank of a soak job (see cadence.testbed.soak): a random sequence of
collectives, every result checked against a numpy reference.

    python -m cadence.testbed.soak_rank --seed S --job J [--stop-at T] [--max-steps N]

Started by `cadence soak` on every rank of an emulated cluster (torchrun's
environment; the store is served by a process of its own, `--serve-store`,
and the ranks get TORCHELASTIC_USE_AGENT_STORE=True), or by hand under
`cadence cluster run` to replay a job (rank 0 then serves the store): the
sequence depends only on (seed, job) and the world's hosts, so the same
arguments give the same operations.

Every rank draws the same sequence. Step s has a generator of its own,
seeded by (seed, job, s), so what one rank draws beyond the common part (it
is not a member of a sub-communicator, say) cannot shift later steps. A step
is one of:

- **split**: a member group (the world or a sub-communicator) splits into new
  sub-communicators (random colors, some ranks opting out, random keys; or
  by host, or by local rank); at most MAX_SUBS stay open, the oldest closed.
- **ops**: one blocking operation, or a batch of 2..5 issued with
  async_op=True (on one or several communicators) and waited in issue order.
  An operation is a collective (allreduce, reduce, broadcast, allgather(v),
  reduce_scatter(v), alltoall(v), gather(v), scatter(v), barrier) or a
  send/recv pattern (one pair, or a ring shifted by k), with a random count
  (0, odd, up to --max-count elements in the largest buffer), dtype, op
  (avg and premul_sum included where valid) and algorithm (auto, or one of
  `comm.algorithms(kind)`).

Every `--sync-every` steps rank 0 broadcasts (stop?, step) over the world:
the job stops together once the wall clock passes --stop-at.

Output: one JSON line per event on stdout, `{"ev": ...}`:
  ready     the world and the first sub-communicators are up
  progress  {step, ops, checks}: at most every PROGRESS_EVERY s
  wrong     {step, op, detail}: a result differs from the reference (the job goes on)
  error     {kind, msg, culprit (world rank), culprit_comm, group, members, op, step}
  done      {steps, ops, checks}
Exit status: 0 done, 3 after a CommError, 4 after any other exception.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from cadence import reference as ref

MAX_SUBS = 4  # sub-communicators open at once (each has a progress thread and links)
PROGRESS_EVERY = 0.5  # seconds between progress lines
EXIT_COMM_ERROR = 3
EXIT_OTHER_ERROR = 4

# Collectives and how often each is drawn.
KINDS = {
    "allreduce": 4, "reduce": 1, "broadcast": 1, "allgather": 1, "allgatherv": 1,
    "reduce_scatter": 1, "reduce_scatterv": 1, "alltoall": 1, "alltoallv": 1,
    "gather": 1, "scatter": 1, "sendrecv": 1, "barrier": 0.5,
}  # fmt: skip
# The collective whose algorithms apply (comm.algorithms(kind)).
ALGO_KIND = {
    "allreduce": "allreduce", "reduce": "reduce", "broadcast": "broadcast",
    "allgather": "allgather", "allgatherv": "allgather", "reduce_scatter": "reduce_scatter",
    "reduce_scatterv": "reduce_scatter", "alltoall": "alltoall", "alltoallv": "alltoall",
    "gather": "gather", "scatter": "scatter",
}  # fmt: skip
REDUCING = {"allreduce", "reduce", "reduce_scatter", "reduce_scatterv"}


def emit(**event) -> None:
    event.setdefault("t", time.time())
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


@dataclass
class Group:
    """A communicator every rank knows of: its members (world ranks, in the
    communicator's rank order) and, on members, the communicator."""

    name: str
    members: list[int]
    comm: object | None = None

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class Spec:
    """One operation, as drawn: the same on every rank."""

    kind: str
    group: Group
    count: int
    dtype: str
    op: str
    algo_u: float  # picks the algorithm among the communicator's (< AUTO_SHARE: auto)
    root: int
    salt: tuple
    inplace: bool = False
    irregular: bool = False  # gather/scatter with per-rank counts
    pattern: str = "pair"  # sendrecv: "pair" (src -> dst) or "ring" (r -> r + shift)
    src: int = 0
    dst: int = 1
    shift: int = 1
    algo: str | None = None  # resolved on members
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        g = self.group
        parts = [self.kind, f"comm={g.name}{g.members}", f"count={self.count}",
                 f"dtype={self.dtype}"]  # fmt: skip
        if self.kind in REDUCING:
            parts.append(f"op={self.op}")
        if self.kind in ("reduce", "broadcast", "gather", "scatter"):
            parts.append(f"root={self.root}")
        if self.kind == "sendrecv":
            parts.append(f"{self.pattern} {self.src}->{self.dst}" if self.pattern == "pair"
                         else f"ring shift {self.shift}")  # fmt: skip
        if self.irregular:
            parts.append("irregular")
        if self.inplace:
            parts.append("in place")
        parts.append(f"algo={self.algo or 'auto'}")
        return " ".join(parts)


AUTO_SHARE = 0.35


def draw_count(rng, max_count: int) -> int:
    """0, tiny, small, medium or (rarely) large; odd as often as even."""
    u = rng.random()
    if u < 0.08:
        return 0
    if u < 0.35:
        return int(rng.integers(1, 33))
    if u < 0.70:
        return int(rng.integers(33, min(4097, max_count + 1)))
    if u < 0.94:
        return int(rng.integers(1, min(65537, max_count + 1)))
    return int(rng.integers(1, max_count + 1))


def draw_spec(rng, groups: list[Group], salt: tuple, max_count: int) -> Spec:
    # The world half the time, else a sub-communicator.
    group = groups[0] if len(groups) == 1 or rng.random() < 0.5 else \
        groups[int(rng.integers(1, len(groups)))]  # fmt: skip
    names = list(KINDS)
    weights = np.array([KINDS[k] for k in names], dtype=float)
    kind = names[int(rng.choice(len(names), p=weights / weights.sum()))]
    n = group.size
    if kind == "sendrecv" and n < 2:
        kind = "allreduce"
    dtype = ref.DTYPES[int(rng.integers(len(ref.DTYPES)))]
    ops = ref.ops_for(dtype)
    op = ops[int(rng.integers(len(ops)))] if kind in REDUCING else "sum"
    count = draw_count(rng, max_count)
    # Kinds whose largest buffer holds n blocks: keep that buffer under max_count.
    if kind in ("allgather", "gather", "reduce_scatter", "alltoall", "scatter"):
        count //= n
    spec = Spec(kind=kind, group=group, count=count, dtype=dtype, op=op,
                algo_u=float(rng.random()), root=int(rng.integers(n)), salt=salt,
                inplace=bool(rng.random() < 0.5), irregular=bool(rng.random() < 0.5))  # fmt: skip
    if kind == "sendrecv":
        if rng.random() < 0.5:
            spec.pattern = "pair"
            spec.src = int(rng.integers(n))
            spec.dst = (spec.src + int(rng.integers(1, n))) % n
        else:
            spec.pattern = "ring"
            spec.shift = int(rng.integers(1, n))
    return spec


def resolve_algo(spec: Spec) -> None:
    kind = ALGO_KIND.get(spec.kind)
    if kind is None or spec.algo_u < AUTO_SHARE:
        spec.algo = None
        return
    algos = spec.group.comm.algorithms(kind)
    u = (spec.algo_u - AUTO_SHARE) / (1 - AUTO_SHARE)
    spec.algo = algos[min(int(u * len(algos)), len(algos) - 1)]


# ---------------------------------------------------------------- operations
# issue(spec, r, async_op) starts the operation on this rank (comm rank r)
# and returns (handle, check); check(result) appends failures to a list.
# handle is the blocking call's return value, or a Work.


def _issue(spec: Spec, r: int, async_op: bool):
    comm, n, dt, op = spec.group.comm, spec.group.size, spec.dtype, spec.op
    k, c, salt, algo = spec.kind, spec.count, spec.salt, spec.algo
    factor = ref.FACTOR if op == "premul_sum" else None
    what = spec.describe()
    user, back = ref.to_user, ref.from_user

    if k == "allreduce":
        ins = [ref.gen(q, c, dt, op, salt) for q in range(n)]
        want = ref.reference(ins, dt, op)
        x = user(ins[r], dt)
        out = None if spec.inplace else ref.empty_user(c, dt)
        h = comm.allreduce(x, out=out, op=op, factor=factor, algo=algo, async_op=async_op)

        def check(res, fails):
            ref.compare(back(res, dt), want, dt, op, what, fails)
            if out is not None:
                ref.compare(back(x, dt), ins[r], dt, "sum", f"{what}: input changed", fails)
        return h, check

    if k == "reduce":
        ins = [ref.gen(q, c, dt, op, salt) for q in range(n)]
        x = user(ins[r], dt)
        out = None if spec.inplace else ref.empty_user(c, dt)
        h = comm.reduce(x, root=spec.root, out=out, op=op, factor=factor, algo=algo,
                        async_op=async_op)  # fmt: skip

        def check(res, fails):
            if r == spec.root:
                ref.compare(back(res, dt), ref.reference(ins, dt, op), dt, op, what, fails)
            elif res is not None:
                fails.append(f"{what}: returned {type(res).__name__} off the root")
        return h, check

    if k == "broadcast":
        ins = [ref.gen(q, c, dt, op, salt) for q in range(n)]
        x = user(ins[r], dt)
        h = comm.broadcast(x, root=spec.root, algo=algo, async_op=async_op)
        return h, lambda res, fails: ref.compare(back(res, dt), ins[spec.root], dt, op, what,
                                                 fails)  # fmt: skip

    if k in ("allgather", "allgatherv"):
        counts = [c] * n if k == "allgather" else ref.split_counts(n, c, salt)
        ins = [ref.gen(q, counts[q], dt, op, salt) for q in range(n)]
        x = user(ins[r], dt)
        if k == "allgather":
            h = comm.allgather(x, algo=algo, async_op=async_op)
        else:
            h = comm.allgatherv(x, counts, algo=algo, async_op=async_op)
        want = ref.allgather(ins)
        return h, lambda res, fails: ref.compare(back(res, dt), want, dt, op,
                                                 f"{what} counts={counts}", fails)  # fmt: skip

    if k in ("reduce_scatter", "reduce_scatterv"):
        counts = [c] * n if k == "reduce_scatter" else ref.split_counts(n, c, salt)
        total = sum(counts)
        ins = [ref.gen(q, total, dt, op, salt) for q in range(n)]
        want = ref.reduce_scatter(ins, counts, r, dt, op)
        x = user(ins[r], dt)
        if k == "reduce_scatter":
            h = comm.reduce_scatter(x, op=op, factor=factor, algo=algo, async_op=async_op)
        else:
            h = comm.reduce_scatterv(x, counts, op=op, factor=factor, algo=algo,
                                     async_op=async_op)  # fmt: skip
        return h, lambda res, fails: ref.compare(back(res, dt), want, dt, op,
                                                 f"{what} counts={counts}", fails)  # fmt: skip

    if k in ("alltoall", "alltoallv"):
        if k == "alltoall":
            matrix = [[c] * n for _ in range(n)]
        else:
            matrix = [ref.split_counts(n, c, (*salt, s)) for s in range(n)]
        ins = [ref.gen(q, sum(matrix[q]), dt, op, salt) for q in range(n)]
        want = ref.alltoall(ins, matrix, r)
        x = user(ins[r], dt)
        if k == "alltoall":
            h = comm.alltoall(x, algo=algo, async_op=async_op)
        else:
            recv = [matrix[s][r] for s in range(n)]
            h = comm.alltoallv(x, matrix[r], recv, algo=algo, async_op=async_op)
        return h, lambda res, fails: ref.compare(back(res, dt), want, dt, op,
                                                 f"{what} matrix={matrix}", fails)  # fmt: skip

    if k == "gather":
        counts = ref.split_counts(n, c * n, salt) if spec.irregular else [c] * n
        ins = [ref.gen(q, counts[q], dt, op, salt) for q in range(n)]
        x = user(ins[r], dt)
        h = comm.gather(x, root=spec.root, counts=counts if spec.irregular else None,
                        algo=algo, async_op=async_op)  # fmt: skip
        want = ref.allgather(ins)

        def check(res, fails):
            if r == spec.root:
                ref.compare(back(res, dt), want, dt, op, f"{what} counts={counts}", fails)
            elif res is not None:
                fails.append(f"{what}: returned {type(res).__name__} off the root")
        return h, check

    if k == "scatter":
        counts = ref.split_counts(n, c * n, salt) if spec.irregular else [c] * n
        src = ref.gen(spec.root, sum(counts), dt, op, salt)
        out = ref.empty_user(counts[r], dt)
        h = comm.scatter(user(src, dt) if r == spec.root else None, out, root=spec.root,
                         counts=counts if spec.irregular else None, algo=algo,
                         async_op=async_op)  # fmt: skip
        want = ref.scatter(src, counts, r)
        return h, lambda res, fails: ref.compare(back(res, dt), want, dt, op,
                                                 f"{what} counts={counts}", fails)  # fmt: skip

    if k == "barrier":
        return comm.barrier(async_op=async_op), lambda res, fails: None

    if k == "sendrecv":
        return _issue_p2p(spec, r, async_op, what)
    raise AssertionError(k)


def _issue_p2p(spec: Spec, r: int, async_op: bool, what: str):
    """A pair (src sends to dst) or a ring (r sends to r + shift): receives
    are posted first, asynchronously, so that no blocking send waits on a
    rank that is itself blocked in a send."""
    comm, n, dt, c = spec.group.comm, spec.group.size, spec.dtype, spec.count
    if spec.pattern == "pair":
        sends = [spec.dst] if r == spec.src else []
        recvs = [spec.src] if r == spec.dst else []
    else:
        sends, recvs = [(r + spec.shift) % n], [(r - spec.shift) % n]
    works, checks = [], []
    for src in recvs:
        out = ref.empty_user(c, dt)
        want = ref.gen(src, c, dt, "sum", spec.salt)
        w = comm.recv(out, src, async_op=async_op or bool(sends))
        works.append(w)
        checks.append((out, want))
    for dst in sends:
        works.append(comm.send(ref.to_user(ref.gen(r, c, dt, "sum", spec.salt), dt), dst,
                               async_op=async_op))  # fmt: skip

    class Multi:
        """Waits for every part (in issue order)."""

        def wait(self):
            for w in works:
                if hasattr(w, "wait"):
                    w.wait()

    def check(_res, fails):
        for out, want in checks:
            ref.compare(ref.from_user(out, dt), want, dt, "sum", what, fails)

    multi = Multi()
    if not async_op:
        multi.wait()
        return None, check
    return multi, check


# ---------------------------------------------------------------- the job


class SoakRank:
    def __init__(self, world, args):
        self.world = world
        self.args = args
        self.me = world.rank
        self.hosts = list(world.hosts)
        self.groups = [Group("world", list(range(world.size)), world)]
        self.nsplit = 0
        self.ops = 0  # operations this rank took part in and checked
        self.checks = 0
        self.step = 0
        self.current: Spec | None = None
        self.last_progress = 0.0

    def rng(self, step: int):
        # (step -1: the first split)
        return np.random.default_rng([self.args.seed, self.args.job, step + 1])

    # --- split

    def split(self, rng) -> None:
        parents = [g for g in self.groups if g.size > 1]
        parent = parents[int(rng.integers(len(parents)))]
        n = parent.size
        how = ["random", "random", "host", "local"][int(rng.integers(4))]
        if how == "host":
            uniq = sorted(set(self.hosts))
            colors = [uniq.index(self.hosts[w]) for w in parent.members]
        elif how == "local":
            colors = [sum(1 for v in parent.members[:i] if self.hosts[v] == self.hosts[w])
                      for i, w in enumerate(parent.members)]  # fmt: skip
        else:
            k = int(rng.integers(1, 4))
            colors = [int(c) for c in rng.integers(0, k, n)]
            for i in range(n):
                if rng.random() < 0.15:
                    colors[i] = -1
        keys = [int(v) for v in rng.permutation(n)] if rng.random() < 0.5 else list(range(n))
        self.nsplit += 1
        new = []
        for color in sorted(set(colors) - {-1}):
            idx = sorted((i for i in range(n) if colors[i] == color), key=lambda i: (keys[i], i))
            new.append(Group(f"s{self.nsplit}.{color}", [parent.members[i] for i in idx]))
        mine = None
        if self.me in parent.members:
            i = parent.members.index(self.me)
            self.current = Spec("split", parent, 0, "int64", "sum", 0.0, 0, ())
            mine = parent.comm.split(colors[i], keys[i])
            self.current = None
        for g in new:
            if self.me in g.members:
                g.comm = mine
                if mine is None or mine.size != g.size or mine.rank != g.members.index(self.me):
                    raise RuntimeError(f"split {g.name}: got {mine!r}, expected rank "
                                       f"{g.members.index(self.me)} of {g.size}")  # fmt: skip
        self.groups.extend(new)
        while len(self.groups) > 1 + MAX_SUBS:
            old = self.groups.pop(1)
            if old.comm is not None:
                old.comm.close()

    # --- operations

    def run_ops(self, rng, step: int) -> None:
        batch = 1 if rng.random() < 0.6 else int(rng.integers(2, 6))
        async_op = batch > 1 or rng.random() < 0.15
        specs = [draw_spec(rng, self.groups, (self.args.seed, self.args.job, step, i),
                           self.args.max_count) for i in range(batch)]  # fmt: skip
        pending = []
        for spec in specs:
            if self.me not in spec.group.members:
                continue
            r = spec.group.members.index(self.me)
            resolve_algo(spec)
            self.current = spec
            handle, check = _issue(spec, r, async_op)
            pending.append((spec, handle, check))
            if not async_op:
                self.finish(spec, handle, check, waited=True)
                pending.pop()
        for spec, handle, check in pending:
            self.current = spec
            self.finish(spec, handle, check, waited=False)
        self.current = None

    def finish(self, spec, handle, check, waited: bool) -> None:
        res = handle if waited else handle.wait()
        fails: list[str] = []
        check(res, fails)
        self.ops += 1
        self.checks += 1
        for f in fails:
            emit(ev="wrong", step=self.step, op=spec.describe(), detail=f,
                 async_op=not waited)  # fmt: skip

    # --- sync

    def sync(self) -> bool:
        """Rank 0 says whether to stop; every rank checks it is at the same step."""
        stop = self.args.stop_at and time.time() >= self.args.stop_at
        stop = stop or (self.args.max_steps and self.step >= self.args.max_steps)
        flag = np.array([int(bool(stop)), self.step], dtype=np.int64)
        self.current = Spec("broadcast", self.groups[0], 2, "int64", "sum", 0.0, 0, ())
        self.world.broadcast(flag, root=0)
        self.current = None
        if int(flag[1]) != self.step:
            emit(ev="wrong", step=self.step, op="sync broadcast",
                 detail=f"rank 0 is at step {int(flag[1])}")  # fmt: skip
        return bool(flag[0])

    def run(self) -> None:
        # A first split, so that sub-communicators exist from the start.
        self.split(self.rng(-1))
        emit(ev="ready", hosts=len(set(self.hosts)), size=self.world.size)
        while True:
            if self.step % self.args.sync_every == 0 and self.sync():
                break
            rng = self.rng(self.step)
            if rng.random() < 0.03:
                self.split(rng)
            else:
                self.run_ops(rng, self.step)
            self.step += 1
            now = time.monotonic()
            if now - self.last_progress >= PROGRESS_EVERY:
                self.last_progress = now
                emit(ev="progress", step=self.step, ops=self.ops, checks=self.checks)
        for g in self.groups[1:]:
            if g.comm is not None:
                g.comm.close()
        # Together to the end: no rank leaves while another still works.
        self.current = Spec("barrier", self.groups[0], 0, "int64", "sum", 0.0, 0, ())
        self.world.barrier()
        self.current = None
        emit(ev="done", steps=self.step, ops=self.ops, checks=self.checks)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m cadence.testbed.soak_rank")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--job", type=int, default=0)
    p.add_argument("--stop-at", type=float, default=0.0, help="wall-clock time to stop at")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    p.add_argument("--max-count", type=int, default=1 << 18,
                   help="elements in an operation's largest buffer (262144)")  # fmt: skip
    p.add_argument("--sync-every", type=int, default=16)
    p.add_argument("--serve-store", action="store_true",
                   help="serve the job's TCPStore at MASTER_ADDR:MASTER_PORT until killed "
                   "(as torchrun's agent does), instead of running a rank")  # fmt: skip
    return p.parse_args(argv)


def serve_store() -> int:
    """The job's store, in a process of its own (torchrun's agent store): a
    rank that fails, rank 0 included, does not take the store with it, so
    the others still meet in `split` and fail with cadence's error."""
    from datetime import timedelta

    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))  # fmt: skip
    emit(ev="store", port=store.port)
    while True:
        time.sleep(3600)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve_store:
        return serve_store()
    import cadence

    job = None
    try:
        world = cadence.init(name=f"soak{args.job}")
        job = SoakRank(world, args)
        job.run()
        world.close()
        return 0
    except cadence.CommError as e:
        report(job, e, "CommError", getattr(e, "culprit", None))
        return EXIT_COMM_ERROR
    except Exception as e:  # noqa: BLE001 - every other failure is reported as such
        report(job, e, type(e).__name__, None, traceback.format_exc())
        return EXIT_OTHER_ERROR


def report(job, e, kind, culprit_comm, tb=None) -> None:
    spec = job.current if job else None
    members = spec.group.members if spec else None
    culprit = None
    if culprit_comm is not None:
        culprit = members[culprit_comm] if members and culprit_comm < len(members) else \
            culprit_comm  # fmt: skip
    emit(ev="error", kind=kind, msg=str(e), culprit=culprit, culprit_comm=culprit_comm,
         group=spec.group.name if spec else None, members=members,
         op=spec.describe() if spec else None, step=job.step if job else None,
         traceback=tb)  # fmt: skip


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # A failed communicator cannot be closed cleanly, and the interpreter's
    # teardown (torch's atexit hooks) must not hang a failed rank.
    os._exit(code)
