"""Ray actors' allreduce (`ray.util.collective.allreduce`) over cadence and
over Ray's own CPU backend (gloo through torch), in one Ray instance and one
run.

    .venv/bin/python benchmarks/ray_allreduce.py --nranks 2 3

For each rank count: that many actors (one CPU each) join two groups, one
made with backend "cadence" (cadence.ray_collective), one with "gloo"; for
every size, blocks of back-to-back allreduces of a float32 numpy array on
each group in turn, alternating which goes first, several rounds; prints
the median time per call on rank 0 (after a barrier), gloo's time over
cadence's, and cadence's bus bandwidth (2(n-1)/n · bytes / time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import ray
from cadence.units import format_size, parse_size


@ray.remote(num_cpus=1)
class Member:
    def __init__(self):
        from cadence.ray_collective import register

        register()

    def join(self, n: int, rank: int) -> None:
        import ray.util.collective as col

        col.init_collective_group(n, rank, backend="cadence", group_name="cadence")
        col.init_collective_group(n, rank, backend="gloo", group_name="gloo")

    def time(self, group: str, nbytes: int, calls: int) -> float:
        """Seconds per call, over `calls` back-to-back allreduces."""
        import ray.util.collective as col

        x = np.ones(nbytes // 4, dtype=np.float32)
        col.allreduce(x, group)  # warm (the links, the buffers) and checked
        n = col.get_collective_group_size(group)
        assert (x == n).all(), (group, x[:4], n)
        x[:] = 0  # stays 0: no overflow, whatever the count of calls
        col.barrier(group)
        t0 = time.perf_counter()
        for _ in range(calls):
            col.allreduce(x, group)
        return (time.perf_counter() - t0) / calls


def calls_for(nbytes: int) -> int:
    return max(5, min(2000, (32 << 20) // max(nbytes, 1)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, nargs="+", default=[2, 3])
    p.add_argument("--sizes", default="8K,64K,1M,16M",
                   help="comma-separated sizes in bytes (K/M suffixes)")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ray.init(num_cpus=max(args.nranks), include_dashboard=False, log_to_driver=False,
             object_store_memory=100 << 20, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    print("| ranks | size | cadence µs | gloo µs | gloo/cadence | cadence busbw GB/s |")
    print("|---|---|---|---|---|---|")
    for n in args.nranks:
        members = [Member.remote() for _ in range(n)]
        ray.get([m.join.remote(n, r) for r, m in enumerate(members)], timeout=300)
        for nbytes in sizes:
            got: dict[str, list[float]] = {"cadence": [], "gloo": []}
            for k in range(args.rounds):
                for group in (("cadence", "gloo") if k % 2 == 0 else ("gloo", "cadence")):
                    times = ray.get([m.time.remote(group, nbytes, calls_for(nbytes))
                                     for m in members], timeout=600)
                    got[group].append(times[0])
            c, g = (statistics.median(got[w]) for w in ("cadence", "gloo"))
            busbw = 2 * (n - 1) / n * nbytes / c / 1e9
            print(f"| {n} | {format_size(nbytes)} | {c * 1e6:,.1f} | {g * 1e6:,.1f} | "
                  f"{g / c:.1f} | {busbw:.2f} |", flush=True)
        for m in members:
            ray.kill(m)
    ray.shutdown()


if __name__ == "__main__":
    main()
