"""The communicator: `init` joins the world, `Communicator` runs the
collectives (on the core, `cadence._core`), splits into sub-communicators
and hands each to the live watchdog. The package root re-exports both."""

from __future__ import annotations

import hmac
import json
import os
import uuid

import numpy as np

from cadence import _buffers
from cadence import fused as _fused
from cadence._core import Bootstrap
from cadence._rendezvous import env_int, host_identity, local_ip, store_from_env
from cadence.diagnosis import live as _live
from cadence.diagnosis import metrics as _metrics

_init_counter = 0
# The most NICs a rank listens on that a split passes on (CADENCE_SOCKET_IFNAME).
_MAX_NICS = 16
# The job this process's communicators belong to, as their dumps name it
# (`cadence doctor` refuses to mix jobs): CADENCE_JOB_ID, else the id of the
# first communicator this process joined (the world, under torchrun).
_job_id: str | None = None


def init(
    store=None,
    rank: int | None = None,
    world_size: int | None = None,
    timeout: float | None = None,
    name: str | None = None,
) -> Communicator:
    """Creates the world communicator.

    With no arguments it reads the launcher's environment (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE) and rendezvouses through cadence's own
    store, which rank 0 serves at MASTER_ADDR:MASTER_PORT (no torch needed;
    under torchrun, its agent's store). A `cadence.Store` or any
    torch.distributed Store works with `store=`, `rank=`, `world_size=`.
    `timeout` (seconds) bounds every operation; default `CADENCE_TIMEOUT` or 300.
    """
    global _init_counter
    rank = env_int("RANK") if rank is None else rank
    world_size = env_int("WORLD_SIZE") if world_size is None else world_size
    if timeout is None:
        raw = os.environ.get("CADENCE_TIMEOUT", "300")
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"CADENCE_TIMEOUT={raw!r} is not a number of seconds") from None
    toward = os.environ.get("MASTER_ADDR")
    store_rank = None
    if store is None:
        store = store_from_env(rank, world_size, timeout)
        # Rank 0 serves it in its process, unless torchrun's agent does.
        store_rank = None if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else 0
    else:
        toward = toward or getattr(store, "host", None)
    if name is None:
        _init_counter += 1
        name = f"init{_init_counter}"
    return _connect(store, f"cadence/{name}", rank, world_size, timeout, toward,
                    store_rank=store_rank)


def _connect(store, prefix, rank, size, timeout, toward, store_rank=None) -> Communicator:
    """Sets up one communicator under the store keys `prefix/...`. Its job
    secret (which keys the handshake every TCP connection must pass) is 32
    random bytes that rank 0 makes and shares under `prefix/hello`, with the
    communicator's id and the job id its dumps carry (CADENCE_JOB_ID, else
    this process's first communicator's, else the new communicator's id).
    Sub-communicators are made without the store (`Communicator.split`)."""
    global _job_id
    # One key from rank 0 says what every rank needs before it can prove
    # membership: the communicator's id, its job, and the job secret.
    hello_key = f"{prefix}/hello"
    if rank == 0:
        comm_id = uuid.uuid4().hex[:16]
        job = os.environ.get("CADENCE_JOB_ID") or _job_id or comm_id
        secret = os.urandom(32)
        store.set(hello_key, json.dumps({"id": comm_id, "job": job, "secret": secret.hex()}))
    else:
        hello = json.loads(bytes(store.get(hello_key)).decode())
        comm_id, job, secret = hello["id"], hello["job"], bytes.fromhex(hello["secret"])
    # The watchdog's Store work before the ranks connect: connecting ends
    # with every rank in step, and nothing slow may come after it.
    watching = _live.prepare(store, prefix, rank, size, timeout, store_rank)
    boot = Bootstrap(comm_id, rank, size, host_identity(), local_ip(toward), timeout,
                     secret=secret, job=job)
    # Two more store operations; the ranks complete the peer table themselves.
    # Ranks may arrive as far apart as the store lets them (a torch store's
    # own timeout can exceed the operations' deadline).
    store_timeout = getattr(store, "timeout", None)
    store_s = store_timeout.total_seconds() if hasattr(store_timeout, "total_seconds") else 0.0
    core = boot.join(store, prefix, wait=max(timeout, store_s))
    if _job_id is None:
        _job_id = job
    return Communicator(core, store, prefix, timeout, toward, secret, watching, store_rank)


def _algo(algo):
    return None if algo in (None, "auto") else algo


class Communicator:
    """A group of ranks that run collectives together.

    Buffers are contiguous numpy arrays or CPU torch tensors of float16,
    bfloat16 (torch), float32, float64, int8, uint8, int32 or int64. Reductions
    (`op`): sum, prod, min, max, avg, premul_sum (with `factor`). Every call
    takes `async_op=True` and then returns a `Work` whose `wait()` returns the
    result; operations complete in the order they were issued.
    """

    def __init__(self, core, store, prefix, timeout, toward, secret, watching=None,
                 store_rank=None):
        self._c = core
        self._store_rank = store_rank  # the rank serving the Store in-process, if any
        self._secret = secret  # memory only: sub-communicators derive theirs
        self._store = store
        self._prefix = prefix
        self._timeout = timeout
        self._toward = toward
        self._nsplit = 0
        self.rank: int = core.rank
        self.size: int = core.size
        self.id: str = core.id
        _fused._pipeline.register(self)  # the torch ops name communicators by id
        # The native methods directly: no Python frame on the latency path.
        self.allreduce = core.allreduce
        self.broadcast = core.broadcast
        self.reduce = core.reduce
        self.send = core.send
        self.recv = core.recv
        self.allgather = core.allgather
        self.reduce_scatter = core.reduce_scatter
        self.alltoall = core.alltoall
        self.barrier = core.barrier
        # Live diagnosis (CADENCE_DIAG_AFTER): a watchdog thread, off the data
        # path; `watching` is its Store set-up, done before the ranks connected.
        _live.watch(self, watching)
        _metrics.track(self)  # Prometheus: CADENCE_METRICS_PORT

    def __repr__(self) -> str:
        return f"<cadence.Communicator {self.id} rank {self.rank}/{self.size}>"

    @property
    def hosts(self) -> list[str]:
        """Host identity of every rank."""
        return self._c.hosts

    @property
    def cost_model(self) -> dict | None:
        """The α-β-γ model `auto` ranks algorithms by: the tuning table's for
        this setting, else one measured at start-up when the job spans hosts
        (`CADENCE_CALIBRATE=0` turns that off); None when neither (then the
        size table chooses). `{"shm": {"alpha": s, "beta": s/byte}, "tcp":
        {...}, "gamma": s/byte, "incast": k, "source": "start-up" | "tuning
        table"}`."""
        return self._c.cost_model()

    def calibrate(self) -> dict:
        """Measures this job's links and reduction with the core's calibration
        procedure, the one a job across hosts runs at start-up (collective:
        every rank calls it), and returns rank 0's figures, the same on every
        rank: `shm`/`tcp` as {"alpha", "beta"} (None for a link class the job
        lacks), `gamma`, `loaded_scale`, `measured`. Installs nothing:
        `cadence tune` writes them into a tuning table."""
        return self._c.calibrate()

    def algorithms(self, kind: str) -> list[str]:
        """The algorithms of collective `kind` that apply on this
        communicator's hosts (`cadence.algorithms(kind)` lists them all)."""
        return self._c.algorithms(kind)

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its host."""
        hosts = self.hosts
        return [r for r in range(self.size) if hosts[r] == hosts[self.rank]].index(self.rank)

    @property
    def local_size(self) -> int:
        """Number of ranks on this rank's host (they share memory)."""
        hosts = self.hosts
        return hosts.count(hosts[self.rank])

    def _run(self, kind, inp, out, *, op="sum", factor=None, root=0, counts=(), dtype=None,
             algo=None, async_op=False, result=None):
        return self._c._run(kind, inp, out, op, factor, root, list(counts), dtype, _algo(algo),
                            async_op, result)

    # Bound natively in __init__: a small call's latency is mostly the path to
    # the engine, and these cost no Python frame on it (the native docstrings
    # say the same as here).
    # allreduce(x, out=None, op="sum", factor=None, algo=None, async_op=False):
    #     reduces `x` over all ranks, in place when `out` is None.
    # reduce(x, root=0, out=None, op="sum", factor=None, algo=None, async_op=False):
    #     reduces to `root`, into `out` (default: `x`, in place); returns the
    #     result at the root, None elsewhere.
    # broadcast(x, root=0, algo=None, async_op=False): copies root's `x` into
    #     every rank's `x` (in place); returns `x`.
    # allgather(x, out=None, algo=None, async_op=False): gathers every rank's
    #     `x` into `out` of shape (size, *x.shape).
    # reduce_scatter(x, out=None, op="sum", factor=None, algo=None, async_op=False):
    #     reduces `x` over ranks and leaves block `rank` (of `size` equal
    #     blocks) in `out`.
    # alltoall(x, out=None, algo=None, async_op=False): block d of `x` goes to
    #     rank d, block s of `out` comes from rank s.
    # barrier(async_op=False): returns when every rank has entered it.
    # send(x, dst, async_op=False): sends `x` to rank `dst` (matched by a
    #     `recv` there, in order).
    # recv(out, src=None, async_op=False): receives into `out` from rank `src`;
    #     returns `out`. With `src=None`, from whichever rank sends to this one
    #     first (a send of `out`'s size); returns that rank (with `async_op`,
    #     `wait()` returns it, and `Work.source` holds it once known).

    def allgatherv(self, x, counts, out=None, algo=None, async_op=False):
        """Like allgather with `counts[r]` elements from rank r; `out` is flat."""
        counts = [int(c) for c in counts]
        if out is None:
            out = _buffers.empty(x, (sum(counts),))
        return self._run("allgather", x, out, counts=counts, algo=algo, async_op=async_op,
                         result=out)

    def reduce_scatterv(self, x, counts, out=None, op="sum", factor=None, algo=None,
                        async_op=False):
        """Reduce-scatter with `counts[r]` elements going to rank r."""
        counts = [int(c) for c in counts]
        if out is None:
            out = _buffers.empty(x, (counts[self.rank],))
        return self._run("reduce_scatter", x, out, op=op, factor=factor, counts=counts,
                         algo=algo, async_op=async_op, result=out)

    def alltoallv(self, x, send_counts, recv_counts, out=None, algo=None, async_op=False):
        """All-to-all with `send_counts[d]` elements to rank d and
        `recv_counts[s]` from rank s. Each rank passes only its own counts
        (O(size) a call, no exchange first); a message whose length differs
        from what its receiver expects fails the call on both ranks with a
        mismatch naming the other (CommError), not corrupted data. Chosen
        by placement (pairwise across hosts, direct on one), not by size:
        the size differs by rank. `algo="bruck"` needs every rank's counts:
        they are exchanged first (O(size²) a call), as before."""
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        if len(send_counts) != self.size or len(recv_counts) != self.size:
            raise ValueError(f"alltoallv: counts need {self.size} entries")
        if min(send_counts + recv_counts, default=0) < 0:
            raise ValueError("alltoallv: counts cannot be negative")
        if out is None:
            out = _buffers.empty(x, (sum(recv_counts),))
        if algo == "bruck":
            # Bruck forwards other ranks' blocks: it needs the whole matrix.
            counts = self._count_matrix(send_counts, recv_counts)
        else:
            # This rank's row and column of the count matrix, and whose they
            # are (CollArgs::alltoallv in the core).
            counts = send_counts + recv_counts + [self.rank]
        return self._run("alltoall", x, out, counts=counts, algo=algo, async_op=async_op,
                         result=out)

    def _count_matrix(self, send_counts, recv_counts):
        """Every rank's send counts, by an allgather (O(size²) a call), checked
        against this rank's receive counts."""
        matrix = np.empty((self.size, self.size), dtype=np.int64)
        self.allgather(np.asarray(send_counts, dtype=np.int64), out=matrix)
        column = [int(v) for v in matrix[:, self.rank]]
        if column != recv_counts:
            s = next(s for s in range(self.size) if column[s] != recv_counts[s])
            raise ValueError(
                f"alltoallv: rank {s} sends {column[s]} elements to rank {self.rank}, "
                f"which expects {recv_counts[s]}"
            )
        return [int(v) for v in matrix.reshape(-1)]

    def gather(self, x, root=0, out=None, counts=None, algo=None, async_op=False):
        """Gathers every rank's `x` at `root` (shape (size, *x.shape), or flat
        with per-rank `counts`). Returns the result at the root, None elsewhere."""
        if counts is None:
            counts = [_buffers.numel(x)] * self.size
            shape = (self.size, *_buffers.shape(x))
        else:
            counts = [int(c) for c in counts]
            shape = (sum(counts),)
        if self.rank == root and out is None:
            out = _buffers.empty(x, shape)
        dst = out if self.rank == root else None
        return self._run("gather", x, dst, root=root, counts=counts, algo=algo,
                         async_op=async_op, result=dst)

    def scatter(self, x, out, root=0, counts=None, algo=None, async_op=False):
        """Block r of root's `x` lands in rank r's `out` (`x` may be None off
        the root)."""
        if counts is None:
            counts = [_buffers.numel(out)] * self.size
        counts = [int(c) for c in counts]
        src = x if self.rank == root else None
        return self._run("scatter", src, out, root=root, counts=counts, algo=algo,
                         async_op=async_op, result=out)

    # Fused compute + collective operators (cadence.fused, docs/fused.md).

    def gemv_allreduce(self, w_shard, x_shard, *, fused=True, tile_rows=None, algo=None):
        """sum over ranks of w_shard (M, K_r) @ x_shard (K_r,) -> (M,), computed
        in tiles that are reduced while the next is computed."""
        return _fused.gemv_allreduce(self, w_shard, x_shard, fused=fused,
                                     tile_rows=tile_rows, algo=algo)  # fmt: skip

    def gemm_allreduce(self, x_shard, w_shard, *, fused=True, tile_rows=None, algo=None):
        """sum over ranks of x_shard (B, K_r) @ w_shard (K_r, N) -> (B, N)."""
        return _fused.gemm_allreduce(self, x_shard, w_shard, fused=fused,
                                     tile_rows=tile_rows, algo=algo)  # fmt: skip

    def allgather_matmul(self, a_shard, b, *, fused=True, tile_rows=None, algo=None,
                         return_gathered=False):  # fmt: skip
        """Every rank's a_shard (m, K) gathered in rank order, times b (K, N)
        -> (size*m, N); with `return_gathered`, (that, the gathered rows)."""
        return _fused.allgather_matmul(self, a_shard, b, fused=fused, tile_rows=tile_rows,
                                       algo=algo, return_gathered=return_gathered)  # fmt: skip

    def matmul_reduce_scatter(self, a_shard, b_shard, *, fused=True, tile_rows=None,
                              algo=None):  # fmt: skip
        """This rank's block of rows of sum over ranks of a_shard (M, K_r) @
        b_shard (K_r, N), rows split as numpy.array_split does."""
        return _fused.matmul_reduce_scatter(self, a_shard, b_shard, fused=fused,
                                            tile_rows=tile_rows, algo=algo)  # fmt: skip

    def embedding_bag_alltoall(self, tables, indices, offsets, *, mode="sum", fused=True,
                               rounds=None):  # fmt: skip
        """This rank's tables pooled over the whole batch (`indices[t]`,
        `offsets[t]` as torch's EmbeddingBag takes them), exchanged so that
        each rank gets its batch slice from every table: (b_r, T, D).
        `rounds=True`: exchange in rounds whatever the size."""
        return _fused.embedding_bag_alltoall(self, tables, indices, offsets, mode=mode,
                                             fused=fused, rounds=rounds)  # fmt: skip

    def gemm_alltoall(self, tokens, expert_weights, routing, *, fused=True, rounds=None):
        """Mixture of experts: each token (T_r, H) through expert routing[i]
        (rank q owns experts q*E_r..), its output back in place: (T_r, H_out)."""
        return _fused.gemm_alltoall(self, tokens, expert_weights, routing, fused=fused,
                                    rounds=rounds)  # fmt: skip

    def split(self, color: int, key: int | None = None) -> Communicator | None:
        """Collective over this communicator: ranks with the same `color` form
        a new communicator, ordered by (`key`, rank). A negative color opts out
        (returns None).

        No store round trip: the members learn where each listens from an
        allgather over this communicator, take the rest from its peer
        table, and inherit its clock offsets, start-up profile and cost
        model (comm/split.rs). Its TCP links are its root's, shared
        (connecting only to members the root never linked to), unless
        CADENCE_SPLIT_LINKS=own: ranks must then call the communicators
        that share links in the same order."""
        key = self.rank if key is None else int(key)
        table = self.allgather(np.array([int(color), key], dtype=np.int64))
        self._nsplit += 1
        members = sorted(
            (r for r in range(self.size) if color >= 0 and table[r, 0] == color),
            key=lambda r: (int(table[r, 1]), r),
        )
        # Named after this communicator's id (new with every job), so no
        # earlier job's watchdog counters can sit under it.
        prefix = f"{self._prefix}/{self.id}/split{self._nsplit}/c{int(color)}"
        # Every member derives the same secret and id; strangers who only
        # watch the store see neither.
        secret = hmac.digest(self._secret, prefix.encode(), "sha256")
        comm_id = hmac.digest(secret, b"communicator id", "sha256").hex()[:16]
        boot = None
        if color >= 0:
            boot = Bootstrap(comm_id, members.index(self.rank), len(members), host_identity(),
                             local_ip(self._toward), self._timeout, secret=secret,
                             job=self.job)
        # Where each member listens (one port per NIC) and its clock offset to
        # this communicator's rank 0, from everyone (non-members send zeros).
        row = np.zeros(2 + _MAX_NICS + 1, dtype=np.int64)
        if boot is not None:
            ports = boot.ports()
            row[0] = len(ports)
            row[1:1 + len(ports)] = ports
        offset, error, _ = self._c.clock_offset
        row[-2:] = (offset, error)
        rows = self.allgather(row)
        if boot is None:
            return None
        ports = [[int(p) for p in rows[m, 1:1 + int(rows[m, 0])]] for m in members]
        clocks = [(int(rows[m, -2]), int(rows[m, -1])) for m in members]
        served = members.index(self._store_rank) if self._store_rank in members else None
        watching = _live.prepare(self._store, prefix, members.index(self.rank), len(members),
                                 self._timeout, served, fresh=True)
        core = boot.connect_split(self._c, members, ports, clocks)
        return Communicator(core, self._store, prefix, self._timeout, self._toward, secret,
                            watching, served)

    @property
    def job(self) -> str:
        """The job this communicator belongs to, as its dumps name it
        (CADENCE_JOB_ID, else the id of the process's first communicator;
        sub-communicators share their parent's)."""
        return self._c.job

    @property
    def clock_offset(self) -> dict:
        """This rank's wall clock minus rank 0's, measured at start-up:
        `{"offset_ns", "error_ns", "method"}` ("same host", or "same
        machine" for an emulated host on rank 0's machine: one clock, 0;
        "ping-pong": the best of a few round trips to rank 0's host, within
        `error_ns`)."""
        offset, error, method = self._c.clock_offset
        return {"offset_ns": offset, "error_ns": error, "method": method}

    def dump_records(self) -> dict:
        """The flight recorder as a dict: who this rank is (job, host, pid,
        clock), the last operations with timings, status and their messages
        (peer, direction, bytes, first/last progress, done or pending), and
        per-link counters. The format is in docs/diagnosis.md."""
        import json

        return json.loads(self._c.dump_records())

    def dump(self, dir) -> str:
        """Writes `dump_records()` as `cadence-<id>-rank<r>.json` into `dir`
        (created if needed; the same file a failure writes under
        CADENCE_DUMP_DIR) and returns its path. Safe from any thread, also
        while an operation waits (the dump then shows which of its messages
        are pending). `cadence doctor DIR` reads every rank's file."""
        return self._c.dump(os.fspath(dir))

    def close(self) -> None:
        """Waits for queued operations and stops the progress thread."""
        _live.unwatch(self)
        self._c.close()

    def abort(self, reason: str = "aborted by the application") -> None:
        """Fails this communicator on purpose and tells every peer why: their
        pending or next operation raises CommError naming this rank, with
        `reason` in the message (cut to 2 KiB with a "[truncated]" mark).
        Every later operation here raises at once."""
        self._c.abort(reason)

    def _inject_garbage(self, peer: int) -> None:
        """Test hook: write bytes that are not a frame on the TCP link to `peer`."""
        self._c._inject_garbage(peer)
