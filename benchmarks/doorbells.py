"""Wake-ups a small-message loop costs: futex wakes sent per call, and time.

With more ranks than cores, a rank that waits long sleeps on its inbox's
doorbell, and whoever publishes to it while it sleeps wakes it with a futex
system call (docs/architecture.md). This runs N ranks on this host (the tests'
launcher: local processes rendezvousing through a TCPStore), each timing
samples of a barrier then a batch of back-to-back calls of 8 bytes, and prints
the slowest rank's median µs a call and the doorbells all ranks rang (the
links' `doorbells_rung`) per call.

    python benchmarks/doorbells.py --nranks 4 --op broadcast

Compare builds by running it with each in turn (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness import assert_all_ok, run_ranks  # noqa: E402


def _rung(comm) -> int:
    return sum(link["doorbells_rung"] for link in comm.dump_records()["links"])


def _loop(comm, op: str, samples: int, batch: int):
    x = np.ones(2, np.float32)
    if op == "broadcast":
        def call():
            comm.broadcast(x, root=0)
    else:
        def call():
            comm.allreduce(x)
    for _ in range(200):
        call()
    before = _rung(comm)
    per_call = []
    for _ in range(samples):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(batch):
            call()
        per_call.append((time.perf_counter() - t) / batch * 1e6)
    return float(np.median(per_call)), _rung(comm) - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nranks", type=int, default=4)
    ap.add_argument("--op", choices=["broadcast", "allreduce"], default="broadcast")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16, help="calls per sample")
    a = ap.parse_args()
    res = assert_all_ok(run_ranks(_loop, a.nranks, args=(a.op, a.samples, a.batch),
                                  timeout=600))
    median = max(v[0] for v in res.values())
    rung = sum(v[1] for v in res.values())
    calls = a.samples * a.batch
    print(f"{a.op}, {a.nranks} ranks, 8 B: slowest rank's median {median:.2f} µs a call; "
          f"doorbells rung {rung} ({rung / calls:.2f} a call)")


if __name__ == "__main__":
    main()
