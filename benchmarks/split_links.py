"""A split against its root: how long the split takes, what it costs in
sockets, and whether its collectives are as fast as the root's.

Starts `--ranks` rank processes as `--hosts` emulated hosts on loopback
(`CADENCE_HOST`), numpy only. Each rank joins the world, splits it into
one communicator of every rank in reverse order (the members' ranks
differ from the root's, so every rank's peers are renumbered), then times
allreduces of each `--sizes` on the world and on the split in turns.
Prints, from rank 0: the split's wall time, the open file descriptors a
rank gained by it, and µs a call on each communicator (median of
`--rounds` rounds of `--calls` calls).

    python benchmarks/split_links.py --ranks 8 --hosts 4
    CADENCE_SPLIT_LINKS=own python benchmarks/split_links.py --ranks 8 --hosts 4

Run with another build first on PYTHONPATH to compare builds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

RANK = r"""
import json, os, statistics, sys, time
import numpy as np
import cadence

sizes, calls, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
world = cadence.init()
fds = lambda: len(os.listdir("/proc/self/fd"))
world.barrier()
before = fds()
t = time.perf_counter()
sub = world.split(0, key=-world.rank)
sub.barrier()
split_s = time.perf_counter() - t
gained = fds() - before
out = {"split_ms": split_s * 1e3, "fds_gained": gained, "us": {}}
for size in sizes:
    x = np.ones(max(size // 4, 1), dtype=np.float32)
    times = {"world": [], "split": []}
    for _ in range(rounds):
        for name, comm in (("world", world), ("split", sub)):
            for _ in range(calls // 10):
                comm.allreduce(x)
            comm.barrier()
            t = time.perf_counter()
            for _ in range(calls):
                comm.allreduce(x)
            times[name].append((time.perf_counter() - t) / calls * 1e6)
    out["us"][size] = {k: statistics.median(v) for k, v in times.items()}
gathered = world.allgather(np.array([gained], dtype=np.int64))
out["fds_gained_max"] = int(gathered.max())
if world.rank == 0:
    print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--sizes", default="8,65536")
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    port = free_port()
    per_host = max(args.ranks // args.hosts, 1)
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(args.ranks), CADENCE_HOST=f"h{r // per_host}")  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK, json.dumps(sizes), str(args.calls), str(args.rounds)],
            env=env, stdout=subprocess.PIPE, text=True))  # fmt: skip
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    if any(pr.returncode for pr in procs):
        print("a rank failed:", [pr.returncode for pr in procs], file=sys.stderr)
        return 1
    res = json.loads(outs[0])
    mode = os.environ.get("CADENCE_SPLIT_LINKS", "share")
    print(f"{args.ranks} ranks as {args.hosts} hosts, CADENCE_SPLIT_LINKS={mode}: "
          f"split {res['split_ms']:.1f} ms, "
          f"fds gained a rank max {res['fds_gained_max']}")  # fmt: skip
    for size, us in res["us"].items():
        w, s = us["world"], us["split"]
        print(f"  {int(size):>8} B allreduce: world {w:.1f} us, split {s:.1f} us "
              f"(split / world {s / w:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
