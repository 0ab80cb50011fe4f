"""Launches N ranks as local processes, the way a user's job runs: each rank is
its own process, they rendezvous through a torch TCPStore, and `CADENCE_HOST`
decides which ranks share a host (shared memory) and which talk over TCP.

`run_ranks(fn, n, ...)` calls `fn(comm, *args)` on every rank and returns
{rank: ("ok", value) | ("err", text) | ("lost", reason)}. Every launch has a
deadline; stragglers are killed, so a hang fails the test instead of CI.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["numpy", "torch.distributed", "cadence"])


def host_of(rank: int, transport: str) -> str:
    if transport == "shm":
        return "hostA"
    if transport == "tcp":
        return f"host{rank}"
    if transport == "mixed":  # two ranks per host
        return f"host{rank // 2}"
    raise ValueError(transport)


def _child(fn, rank, size, port, env, args, op_timeout, q, pre_init=None):
    os.environ.update(env)
    try:
        if pre_init is not None:
            pre_init(rank)
        from datetime import timedelta

        import cadence
        import torch.distributed as dist

        store = dist.TCPStore(
            "127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=60)
        )
        comm = cadence.init(store=store, rank=rank, world_size=size, timeout=op_timeout)
        res = fn(comm, *args)
        q.put((rank, "ok", res))
        comm.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent verbatim
        q.put((rank, "err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(fn, size, *, transport="shm", env=None, args=(), timeout=120.0, op_timeout=30.0,
              rank_env=None, pre_init=None):
    """`pre_init(rank)`, when given, runs in each rank before `cadence.init`
    (a module-level function: the ranks are started by a forkserver)."""
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, size, is_master=True, timeout=timedelta(seconds=60),
        wait_for_workers=False,
    )
    q = _CTX.Queue()
    procs = []
    for r in range(size):
        e = {"CADENCE_HOST": host_of(r, transport), "OMP_NUM_THREADS": "1"}
        # `make test` runs the fault tests once more with every link made at
        # set-up (CADENCE_CONNECT=eager); the ranks' forkserver started with
        # the environment of the first test, so it is passed on here.
        if os.environ.get("CADENCE_CONNECT"):
            e["CADENCE_CONNECT"] = os.environ["CADENCE_CONNECT"]
        e.update(env or {})
        if rank_env:
            e.update(rank_env(r))
        p = _CTX.Process(target=_child,
                         args=(fn, r, size, server.port, e, args, op_timeout, q, pre_init))
        p.start()
        procs.append(p)
    results = {}
    deadline = time.monotonic() + timeout
    while len(results) < size and time.monotonic() < deadline:
        try:
            rank, status, value = q.get(timeout=0.2)
            results[rank] = (status, value)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, deadline - time.monotonic()) if r not in results else 5)
        if p.is_alive():
            p.kill()
            p.join()
        if r not in results:
            results[r] = ("lost", f"exit code {p.exitcode} (killed at deadline or died)")
    return results


def assert_all_ok(results):
    bad = {r: v for r, v in results.items() if v[0] != "ok"}
    assert not bad, "\n".join(f"rank {r}: {s}: {v}" for r, (s, v) in sorted(bad.items()))
    return {r: v[1] for r, v in results.items()}
