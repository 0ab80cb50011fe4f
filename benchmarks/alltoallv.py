"""alltoallv: µs a call with uneven counts (some blocks empty), a rank
program for any launcher:

    torchrun --nproc-per-node 8 benchmarks/alltoallv.py --block 64 --calls 500
    PYTHONPATH=/path/to/other/build torchrun --nproc-per-node 8 benchmarks/alltoallv.py

Rank s sends rank d `block * ((s + 2 d) % 4)` elements of float32 (a
quarter of the pairs send nothing). Rank 0 prints the median over
`--rounds` of the slowest rank's µs a call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import cadence
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block", type=int, default=64, help="elements per unit of count")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    comm = cadence.init()
    n, r = comm.size, comm.rank
    send = [args.block * ((r + 2 * d) % 4) for d in range(n)]
    recv = [args.block * ((s + 2 * r) % 4) for s in range(n)]
    x = np.arange(sum(send), dtype=np.float32)
    out = np.empty(sum(recv), dtype=np.float32)
    for _ in range(args.calls // 10):
        comm.alltoallv(x, send, recv, out=out)
    rounds = []
    for _ in range(args.rounds):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(args.calls):
            comm.alltoallv(x, send, recv, out=out)
        mine = (time.perf_counter() - t) / args.calls * 1e6
        rounds.append(float(comm.allgather(np.array([mine])).max()))
    if r == 0:
        each = ", ".join(f"{v:.1f}" for v in rounds)
        print(f"alltoallv, {n} ranks, blocks of up to {3 * args.block} float32: "
              f"{statistics.median(rounds):.1f} us a call (rounds {each})")  # fmt: skip


if __name__ == "__main__":
    main()
