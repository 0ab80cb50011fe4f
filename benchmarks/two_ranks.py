"""Two ranks on one host: allreduce algorithms back to back, each job
labelled with whether the two cores shared a cache while it ran.

Each round times the two cores' 256 KiB handover (`cadence.cli.bench.
handover_us`), runs one 2-rank job (torchrun) that times every algorithm at
every size in turns (5 rounds of a barrier then back-to-back calls; the
median round), and times the handover again. On a machine whose hypervisor
moves its vCPUs between cores that share a cache and cores that do not,
this separates the two cases (docs/benchmarks.md, "Two vCPUs that share a
cache, or not").

    python benchmarks/two_ranks.py --rounds 8 --sizes 512K,2M,8M \\
        --algos ring,direct,double_binary_tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from cadence.cli.bench import handover_us
from cadence.units import parse_size

JOB = r"""
import sys, time, numpy as np, cadence
c = cadence.init()
sizes = [int(s) for s in sys.argv[1].split(",")]
algos = sys.argv[2].split(",")
out = []
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    reps = max(20, min(400, (64 << 20) // nbytes))
    times = {a: [] for a in algos}
    for a in algos:
        for _ in range(5):
            c.allreduce(x, algo=a)
    for _ in range(5):
        for a in algos:
            c.barrier()
            t = time.perf_counter()
            for _ in range(reps):
                c.allreduce(x, algo=a)
            times[a].append((time.perf_counter() - t) / reps * 1e6)
    out.append(f"{nbytes >> 10}K " + " ".join(f"{a}={sorted(v)[2]:.0f}" for a, v in times.items()))
if c.rank == 0:
    print(" | ".join(out), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--sizes", default="512K,2M,8M")
    ap.add_argument("--algos", default="ring,direct,double_binary_tree")
    args = ap.parse_args()
    sizes = ",".join(str(parse_size(s)) for s in args.sizes.split(","))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
    try:
        print("# handover before/after (µs), then per size each algorithm's µs a call", flush=True)
        for i in range(args.rounds):
            before = handover_us()
            t0 = time.time()
            out = subprocess.run(
                [torchrun, "--nproc-per-node", "2", f.name, sizes, args.algos],
                capture_output=True, text=True, timeout=600,
            )
            after = handover_us()
            line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else out.stderr[-300:]
            print(f"{i + 1} handover {before:.0f}/{after:.0f} ({time.time() - t0:.0f} s) :: {line}",
                  flush=True)
    finally:
        os.unlink(f.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
