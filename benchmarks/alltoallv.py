"""alltoallv: µs a call with uneven counts (some blocks empty), a rank
program for any launcher:

    torchrun --nproc-per-node 8 benchmarks/alltoallv.py --block 64 --calls 500
    torchrun --nproc-per-node 8 benchmarks/alltoallv.py --backend gloo
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
    p.add_argument("--backend", choices=["cadence", "gloo"], default="cadence")
    args = p.parse_args()
    if args.backend == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        n, r = dist.get_world_size(), dist.get_rank()
    else:
        comm = cadence.init()
        n, r = comm.size, comm.rank
    send = [args.block * ((r + 2 * d) % 4) for d in range(n)]
    recv = [args.block * ((s + 2 * r) % 4) for s in range(n)]
    x = np.arange(sum(send), dtype=np.float32)
    out = np.empty(sum(recv), dtype=np.float32)
    if args.backend == "gloo":
        tx, tout = torch.from_numpy(x), torch.from_numpy(out)
        call = lambda: dist.all_to_all_single(tout, tx, recv, send)  # noqa: E731
        barrier = dist.barrier
        slowest = lambda v: max(_gloo_gather(dist, torch, v))  # noqa: E731
    else:
        call = lambda: comm.alltoallv(x, send, recv, out=out)  # noqa: E731
        barrier = comm.barrier
        slowest = lambda v: float(comm.allgather(np.array([v])).max())  # noqa: E731
    for _ in range(args.calls // 10):
        call()
    rounds = []
    for _ in range(args.rounds):
        barrier()
        t = time.perf_counter()
        for _ in range(args.calls):
            call()
        rounds.append(slowest((time.perf_counter() - t) / args.calls * 1e6))
    if r == 0:
        each = ", ".join(f"{v:.1f}" for v in rounds)
        print(f"alltoallv ({args.backend}), {n} ranks, blocks of up to {3 * args.block} float32: "
              f"{statistics.median(rounds):.1f} us a call (rounds {each})")  # fmt: skip


def _gloo_gather(dist, torch, v: float) -> list[float]:
    got = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(got, torch.tensor([v], dtype=torch.float64))
    return [float(t) for t in got]


if __name__ == "__main__":
    main()
