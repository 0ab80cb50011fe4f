"""One rank of `cadence tune`'s calibration job: measures the cost model.

Launched by `cadence tune` on every rank of the setting being tuned (torchrun's
environment, as the bench worker):

    python -m cadence.bench.calibrate --out DIR --ops allreduce,allgather

The cost model is the core's: every rank calls `Communicator.calibrate()`, the
procedure a job across hosts runs at start-up (α of each link class from an
8-byte ping-pong, β from a one-way 2 MiB stream, γ from the engine's own
reduction kernel, both α's scaled to the time of a loaded recursive-doubling
allreduce), and rank 0's result is what every rank gets. calibrate.json
carries it as `model`; `tune.model_from` turns it into the tuning table's.

Everything else here is for `cadence sim calibrate`, which fits a simulated
cluster rather than a cost model. With cadence's point-to-point
`send`/`recv`, rank 0 plays ping-pong with the same peers (the first other
rank on its host, the first rank on another host, where there are such):
`idle_link` has, per class, α (half the round trip of 8 bytes, median of
50), β ((half the round trip of 4 MiB − α) / 4 MiB, median of 5) and o,
the sender's time per message when messages go back to back ((a burst of
64 8-byte sends answered by one 8-byte reply − 2α) / 64, median of 5).
The other ranks wait at a barrier. Last, every rank at once runs a ring
allgather of 8 bytes a rank (LOADED_CALLS back to back after a barrier,
the slowest rank's median of LOADED_REPS samples): `loaded` is its time
per ring step, when every rank sends and receives a message each step.
Where ranks outnumber the machine's cores (`cores`: rank 0's), that is
what a message costs a busy machine: switching its receiver in and out.
A ring allreduce of 8 bytes a rank, timed alike, is `loaded_allreduce`
(per step, of its 2(n-1)): twice the allgather's steps in the same kind of
call, so the two separate a step's cost from the call's own. The ring
allgather with BULK bytes a rank, in the bench's batch of calls for its
size, is `loaded_bulk`: from it `cadence sim calibrate` fits what the
bytes cost cores that carry every host's network stack.

Rank 0 writes `DIR/calibrate.json`: the setting as cadence sees it (ranks,
hosts, ranks per host, 0 when hosts differ), the algorithms of each of
`--ops` that apply on it (`Communicator.algorithms`), the core's `model`
(`shm`/`tcp` None for a link class the setting lacks; `measured` lists the
classes) and the simulator's `measured` figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SMALL = 8  # bytes: the idle α
LARGE = 4 << 20  # bytes: the idle β
SMALL_REPS, LARGE_REPS, WARMUP = 50, 5, 5
BURST = 64  # messages: o
LOADED_CALLS, LOADED_REPS = 16, 9
BULK = 8 << 10  # bytes a rank: the loaded ring's bulk probe


def half_round_trips(comm, peer: int, nbytes: int, reps: int, lead: bool) -> list[float]:
    """`reps` timed round trips of `nbytes` with `peer` (after WARMUP untimed
    ones), halved; `lead`: this rank sends first and times (the peer echoes)."""
    buf = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for i in range(WARMUP + reps):
        if lead:
            t0 = time.perf_counter()
            comm.send(buf, peer)
            comm.recv(buf, peer)
            if i >= WARMUP:
                times.append((time.perf_counter() - t0) / 2)
        else:
            comm.recv(buf, peer)
            comm.send(buf, peer)
    return times


def bursts(comm, peer: int, reps: int, lead: bool) -> list[float]:
    """`reps` timed bursts (after WARMUP untimed ones): BURST small sends from
    the leader, one small reply; on the leader, each burst's seconds."""
    buf = np.zeros(SMALL, dtype=np.uint8)
    times = []
    for i in range(WARMUP + reps):
        if lead:
            t0 = time.perf_counter()
            for _ in range(BURST):
                comm.send(buf, peer)
            comm.recv(buf, peer)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        else:
            for _ in range(BURST):
                comm.recv(buf, peer)
            comm.send(buf, peer)
    return times


def idle_link(comm, peer: int, lead: bool) -> dict[str, float] | None:
    """The simulator's idle α, β and o of the link between rank 0 and `peer`
    (on rank 0; None elsewhere)."""
    small = half_round_trips(comm, peer, SMALL, SMALL_REPS, lead)
    large = half_round_trips(comm, peer, LARGE, LARGE_REPS, lead)
    burst = bursts(comm, peer, LARGE_REPS, lead)
    if not lead:
        return None
    alpha = statistics.median(small)
    # A β of 0 or less would make large messages free.
    beta = max((statistics.median(large) - alpha) / LARGE, 1e-13)
    overhead = max((statistics.median(burst) - 2 * alpha) / BURST, 0.0)
    return {"alpha": alpha, "beta": beta, "overhead": overhead}


def loaded(comm, call, calls: int) -> float:
    """Seconds per call of `call` with every rank busy, timed as `cadence
    bench` times a collective: WARMUP calls, then LOADED_REPS samples of a
    barrier and `calls` calls back to back; the slowest rank's median (with
    more ranks than cores rank 0's own was up to 0.15 ms a call faster)."""
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(LOADED_REPS):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - t0) / calls)
    slowest = np.array([statistics.median(times)])
    comm.allreduce(slowest, op="max")
    return float(slowest[0])


def ring_allgather(comm, per_rank: int):
    """A ring allgather of `per_rank` bytes a rank, as a call."""
    x = np.zeros(per_rank * comm.size, dtype=np.uint8)
    mine = x[comm.rank * per_rank : (comm.rank + 1) * per_rank].copy()
    return lambda: comm.allgather(mine, out=x, algo="ring")


def loaded_step(comm) -> float:
    """Seconds per step of a ring allgather of 8 bytes a rank (n-1 steps),
    LOADED_CALLS calls a sample."""
    return loaded(comm, ring_allgather(comm, SMALL), LOADED_CALLS) / max(comm.size - 1, 1)


def loaded_allreduce_step(comm) -> float:
    """Seconds per step of a ring allreduce of 8 bytes a rank (2(n-1)
    steps), timed as `loaded_step`: against the allgather's n-1 steps it
    separates a step's cost from the call's own."""
    x = np.zeros(2 * comm.size, dtype=np.float32)  # 8 bytes a rank
    per_call = loaded(comm, lambda: comm.allreduce(x, algo="ring"), LOADED_CALLS)
    return per_call / max(2 * (comm.size - 1), 1)


def loaded_bulk(comm) -> dict:
    """A ring allgather of BULK bytes a rank, in the bench's batch of calls
    for its size: seconds per call. Against the 8-byte step it says what
    the bytes cost a machine whose cores carry every host's network stack
    (`cadence sim calibrate` fits that)."""
    from cadence.bench.worker import batch_calls

    calls = batch_calls(BULK * comm.size)
    seconds = loaded(comm, ring_allgather(comm, BULK), calls)
    return {"bytes_per_rank": BULK, "calls": calls, "seconds": seconds}


def peers(hosts: list[str]) -> dict[str, int]:
    """The peers rank 0 measures: the first other rank on its host ("shm") and
    the first rank on another host ("tcp"), where there are such ranks."""
    found: dict[str, int] = {}
    for r in range(1, len(hosts)):
        kind = "shm" if hosts[r] == hosts[0] else "tcp"
        found.setdefault(kind, r)
    return found


def setting(hosts: list[str]) -> dict[str, int]:
    """(nranks, nhosts, ranks_per_host) as the core keys tuning tables: ranks
    per host is 0 when hosts hold different numbers of ranks."""
    counts = {h: hosts.count(h) for h in hosts}
    per_host = set(counts.values())
    return {
        "nranks": len(hosts),
        "nhosts": len(counts),
        "ranks_per_host": per_host.pop() if len(per_host) == 1 else 0,
    }


def main(argv: list[str] | None = None) -> int:
    from cadence.bench.worker import die_with_parent

    die_with_parent()
    p = argparse.ArgumentParser(prog="python -m cadence.bench.calibrate")
    p.add_argument("--out", required=True, help="directory for calibrate.json")
    p.add_argument("--ops", required=True, help="comma-separated collectives")
    args = p.parse_args(argv)
    import cadence

    comm = cadence.init()
    hosts = list(comm.hosts)
    # The core's procedure, the same as a start-up calibration's.
    model = comm.calibrate()
    links = {}
    comm.barrier()
    for kind, peer in peers(hosts).items():
        if comm.rank in (0, peer):
            links[kind] = idle_link(comm, peer if comm.rank == 0 else 0, lead=comm.rank == 0)
        comm.barrier()
    loaded = loaded_step(comm) if comm.size > 1 else None
    loaded_ar = loaded_allreduce_step(comm) if comm.size > 1 else None
    bulk = loaded_bulk(comm) if comm.size > 1 else None
    if comm.rank == 0:
        result = {
            **setting(hosts),
            "hosts": hosts,
            "algorithms": {op: list(comm.algorithms(op)) for op in args.ops.split(",") if op},
            "model": model,
            "measured": {"idle_link": links, "loaded": loaded,
                         "loaded_allreduce": loaded_ar, "loaded_bulk": bulk,
                         "cores": os.cpu_count()},  # fmt: skip
        }
        out = Path(args.out) / "calibrate.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
    comm.barrier()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
