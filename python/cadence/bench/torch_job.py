"""One job of torch ranks for the benchmark scripts (benchmarks/torch_*.py,
tp_decode.py): the ranks started by torch's spawn, a deadline on the whole
job, and each rank's results handed back through a file.

A rank's function is `main(rank, n, port, args, outdir)`: it initializes
its process group at `tcp://127.0.0.1:{port}` and ends with
`report(outdir, rank, results)`, before tearing its groups down (gloo's
teardown sometimes aborts a process after a clean run).
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(outdir: str, rank: int, results) -> None:
    """A rank's results, for `run`."""
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(results, f)


def run(main, n: int, args, timeout_s: float) -> list:
    """Runs `main` on `n` ranks; every rank's results, in rank order. A job
    still running after `timeout_s` is killed, and a rank that ended
    without reporting is named: both raise RuntimeError."""
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory(prefix="cadence-bench-") as outdir:
        ctx = tmp.start_processes(main, args=(n, free_port(), args, outdir), nprocs=n,
                                  join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        for p in ctx.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                for q in ctx.processes:
                    q.kill()
                raise RuntimeError(f"{n} ranks: still running after {timeout_s:g} s; killed")
        ranks = []
        for r, p in enumerate(ctx.processes):
            path = os.path.join(outdir, f"rank{r}.pkl")
            if not os.path.exists(path):
                raise RuntimeError(f"{n} ranks: rank {r} failed (exit code {p.exitcode}) "
                                   "before reporting")
            with open(path, "rb") as f:
                ranks.append(pickle.load(f))
        return ranks
