"""How fast `cadence sim` simulates at scale (the targets: a 64 MiB
ring allreduce on 1024 ranks in under 10 s, on 4096 in under 60 s).

  python benchmarks/sim_speed.py [--ranks 1024,4096] [--algo ring] [--size 64M]

Wall time of one simulation (building every rank's schedule included) on a
100 Gbit/s fat tree of 16-host leaves at 50 % blocking, one rank per host,
with the messages it moved and the simulated time.
"""

from __future__ import annotations

import argparse
import json
import time

from cadence import _core
from cadence.units import format_size, parse_size

SPEC = {
    "version": 1,
    "kind": "cadence-cluster",
    "note": "sim_speed: 100 Gbit/s fat tree, 16-host leaves, 50 % blocking",
    "nic": {"rate": "100gbit", "latency_us": 2.0, "overhead_us": 1.0},
    "fabric": {"kind": "fat_tree", "hosts_per_leaf": 16, "oversubscription": 2.0,
               "hop_latency_us": 1.0},
}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1024,4096")
    p.add_argument("--algo", default="ring")
    p.add_argument("--op", default="allreduce")
    p.add_argument("--size", default="64M")
    args = p.parse_args()
    nbytes = parse_size(args.size)
    print(f"# {args.op} {args.algo} {format_size(nbytes)} float32 on {SPEC['note']}")
    print(f"# {'ranks':>6} {'wall(s)':>8} {'messages':>10} {'simulated(ms)':>14}")
    for n in (int(x) for x in args.ranks.split(",")):
        model = _core.SimCluster(json.dumps(SPEC), "sim_speed", n)
        t0 = time.perf_counter()
        algo, secs, msgs = model.run(args.op, nbytes // 4, 4, args.algo)
        wall = time.perf_counter() - t0
        print(f"  {n:>6} {wall:>8.2f} {msgs:>10} {secs * 1e3:>14.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
