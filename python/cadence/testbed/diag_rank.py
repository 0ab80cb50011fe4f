"""One rank of a diagnosis trial (`cadence.testbed.diag_campaign`), and the
in-process fault injectors it uses.

The rank runs a loop of mixed collectives (allreduce, allgather, alltoall of
4 KiB–4 MiB, the same sequence on every rank from a shared seed) with the
live watchdog on, and writes what it saw as JSON lines into
`OUT/rank<R>.jsonl`: `{"ev": "ready"}`, `{"ev": "fault", ...}` when it injected
one, and `{"ev": "verdict", "t": wall, "verdict": {...}}` for every verdict
the watchdog delivered. Faults a rank injects on itself (`--fault`, only on
`--culprit`, from step `--at`):

- `hold`: stays out of the next collective, stuck in "compute"
  (`data_loader_stall`, a sleep) — a noncomm_hang;
- `freeze`: stops its own process (SIGSTOP) once it is inside a collective,
  so its transfers stop mid-operation — a comm_hang of that rank;
- `straggle`: sleeps `--delay` seconds of "compute" before every collective
  — a noncomm_slow straggler.

Link faults (cut, slowed) are applied from outside by the campaign driver
with `cadence.testbed.cluster.set_link`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

import numpy as np

SIZES = [4 << 10, 64 << 10, 512 << 10, 4 << 20]  # bytes
OPS = ["allreduce", "allgather", "alltoall"]


def data_loader_stall(seconds: float) -> None:
    """Stands for compute or data loading that hangs (its name shows in
    the verdict's stack of this rank)."""
    time.sleep(seconds)


def freeze_inside(comm, min_inside_s: float = 0.02) -> threading.Thread:
    """Stops this process (SIGSTOP) as soon as it has been inside a
    collective for `min_inside_s`: a rank frozen mid-operation."""

    def run():
        while True:
            _total, running = comm._c._progress()
            if running is not None and running[2] >= min_inside_s:
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            time.sleep(0.002)

    t = threading.Thread(target=run, name="freeze-inside", daemon=True)
    t.start()
    return t


class _Verdicts(logging.Handler):
    def __init__(self, out):
        super().__init__()
        self.out = out

    def emit(self, record):
        self.out(ev="log", t=time.time(), line=record.getMessage())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--fault", choices=["none", "hold", "freeze", "straggle"], default="none")
    p.add_argument("--culprit", type=int, default=-1)
    p.add_argument("--at", type=int, default=20, help="step at which the fault starts")
    p.add_argument("--delay", type=float, default=0.2, help="straggle: seconds per step")
    p.add_argument("--compute", type=float, default=0.0,
                   help="seconds of \"compute\" (a sleep) every rank spends between collectives")
    p.add_argument("--stop-at", type=float, default=0.0, help="wall-clock time to stop at")
    p.add_argument("--dump", default=None, help="write this rank's dump here when it stops")
    args = p.parse_args(argv)

    import cadence
    from cadence.diagnosis import live

    rank = int(os.environ["RANK"])
    path = os.path.join(args.out, f"rank{rank}.jsonl")
    f = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()

    def out(**ev):
        with lock:
            f.write(json.dumps(ev) + "\n")

    logging.getLogger("cadence").addHandler(_Verdicts(out))
    live.add_listener(lambda _comm, v: out(ev="verdict", t=time.time(), verdict=v))
    comm = cadence.init(name="diag")
    out(ev="ready", t=time.time(), pid=os.getpid(), host=comm.hosts[rank])
    rng = np.random.default_rng(args.seed)
    culprit = rank == args.culprit
    bufs = {n: np.ones(n // 4, dtype=np.float32) for n in SIZES}
    try:
        for step in range(args.steps):
            if args.stop_at and time.time() > args.stop_at:
                break
            kind = OPS[rng.integers(len(OPS))]
            nbytes = SIZES[rng.integers(len(SIZES))]
            if culprit and step == args.at:
                out(ev="fault", t=time.time(), kind=args.fault, step=step)
                if args.fault == "hold":
                    data_loader_stall(3600)
                elif args.fault == "freeze":
                    freeze_inside(comm)
            if args.compute:
                time.sleep(args.compute)
            if culprit and args.fault == "straggle" and step >= args.at:
                data_loader_stall(args.delay)
            x = bufs[nbytes]
            if kind == "allreduce":
                comm.allreduce(x)
            elif kind == "allgather":
                comm.allgather(x[: max(1, x.size // comm.size)])
            else:
                comm.alltoall(x[: x.size - x.size % comm.size])
            if step % 50 == 0:
                out(ev="step", t=time.time(), step=step)
    except cadence.CommError as e:
        out(ev="error", t=time.time(), error=str(e), diagnosis=getattr(e, "diagnosis", None))
        return 1
    if args.dump:
        comm.dump(args.dump)
    out(ev="done", t=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
