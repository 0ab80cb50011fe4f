"""What a rank sends in a live diagnosis round, against the job's size: the
summary as the watchdog publishes it now (`live.summary`: messages as
runs, a waiting rank's stuck operations only, every rank listed in rank
0's alone) and as it did before (the last 64 operations with every
message, the list of every rank, the Python stacks), zlib-compressed both.

Starts `--ranks` rank processes on loopback as hosts of `--per-host`
(numpy only). Every rank makes `--calls` ring allreduces of 1 MiB (so the
stuck one has a ring's messages), then every rank but the last enters one
more; the last stays out 3 s (a rank stuck in its own code). Meanwhile each
rank measures both forms of its summary, waiting ranks as waiting.
Prints the median over the waiting ranks, the absent rank's, and rank 0's.

    python benchmarks/round_summary.py --ranks 8,16,32,64
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

RANK = r"""
import json, os, sys, threading, time, zlib
import numpy as np
import cadence
from cadence.diagnosis import live

calls = int(sys.argv[1])
world = cadence.init()
x = np.ones(1 << 18, dtype=np.float32)
for _ in range(calls):
    world.allreduce(x, algo="ring")
world.barrier()
last = world.rank == world.size - 1
sizes = {}

def measure():
    time.sleep(1.5)
    core = world._c
    sizes["now"] = len(live.summary(core, threading.get_ident(), waiting=not last))
    d = json.loads(core.dump_records(live.SUMMARY_OPS))
    d["stack"] = live.python_stacks(threading.get_ident())
    sizes["before"] = len(zlib.compress(json.dumps(d).encode(), 6))

t = threading.Thread(target=measure)
t.start()
if last:
    time.sleep(3.0)
world.allreduce(x, algo="ring")
t.join()
world.barrier()
print(json.dumps({"rank": world.rank, "last": last, **sizes}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(n: int, per_host: int, calls: int) -> list[dict]:
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(n), CADENCE_HOST=f"h{r // per_host}",
                   CADENCE_DIAG_AFTER="off")  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(calls)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    if any(pr.returncode for pr in procs):
        raise SystemExit(f"a rank failed: {[pr.returncode for pr in procs]}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="8,16,32")
    p.add_argument("--per-host", type=int, default=2)
    p.add_argument("--calls", type=int, default=40)
    a = p.parse_args()
    print(f"{'ranks':>6} {'waiting rank now':>17} {'before':>8} {'absent rank now':>16} "
          f"{'before':>8} {'rank 0 now':>11}")
    for n in [int(x) for x in a.ranks.split(",")]:
        res = one(n, a.per_host, a.calls)
        waiting = [r for r in res if not r["last"] and r["rank"] != 0]
        absent = next(r for r in res if r["last"])
        r0 = next(r for r in res if r["rank"] == 0)
        now = statistics.median(r["now"] for r in waiting)
        before = statistics.median(r["before"] for r in waiting)
        print(f"{n:>6} {now:>17,.0f} {before:>8,.0f} {absent['now']:>16,} "
              f"{absent['before']:>8,} {r0['now']:>11,}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
