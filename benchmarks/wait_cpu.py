"""CPU a rank burns while its collective waits on a slow link (docs/benchmarks.md,
"CPU while a link is slow").

Brings up an emulated cluster of 2 hosts with links at `--rate`, runs a job
of 2 ranks (one a host) looping `--iters` allreduces of `--size` on each
backend, and prints each rank's CPU time over the loop as a share of one
core (user + system, from getrusage), with its voluntary and involuntary
context switches. The wire, not the CPU, is the limit here: a rank that
waits well costs close to nothing.

    python benchmarks/wait_cpu.py
    python benchmarks/wait_cpu.py --rate 200mbit --size 8M
"""

from __future__ import annotations

import argparse
import os
import sys

RANK = r"""
import resource, sys, time
import numpy as np
backend, size, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.ones(size // 4, dtype=np.float32)
if backend == "gloo":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.from_numpy(x)
    run, rank = (lambda: dist.all_reduce(t)), dist.get_rank()
else:
    import cadence
    c = cadence.init()
    run, rank = (lambda: c.allreduce(x)), c.rank
run()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
for _ in range(iters):
    run()
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.time()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(f"CPU {rank} {cpu / (t1 - t0):.4f} {t1 - t0:.2f} {r1.ru_nvcsw - r0.ru_nvcsw} "
      f"{r1.ru_nivcsw - r0.ru_nivcsw}", flush=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="50mbit")
    p.add_argument("--size", default="2M")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    a = p.parse_args()

    import io

    from cadence import testbed
    from cadence.testbed import jobs
    from cadence.units import parse_size

    name = f"wcpu{os.getpid() % 10000}"
    cluster = testbed.build(name, 2, 1, a.rate)
    testbed.up(cluster)
    runs = [("cadence, 1 stream", "cadence", {"CADENCE_NSTREAMS": "1"}),
            ("cadence, 4 streams", "cadence", {"CADENCE_NSTREAMS": "4"}),
            ("gloo", "gloo", {})]  # fmt: skip
    print(f"2 hosts at {a.rate}, allreduce {a.size} x {a.iters}: each rank's CPU over the loop")
    print("| backend | CPU, share of a core (per rank) | loop s | voluntary / involuntary "
          "switches (per rank) |")
    print("|---|---|---|---|")
    try:
        for label, backend, extra in runs:
            out = io.BytesIO()
            env = {**os.environ, "CADENCE_TOPO_FILE": "none", **extra}
            res = jobs.run(cluster, 1, [sys.executable, "-c", RANK, backend,
                                        str(parse_size(a.size)), str(a.iters)],
                           timeout=300, out=out, env=env)  # fmt: skip
            rows = sorted(line.split("CPU ", 1)[1].split() for line in
                          out.getvalue().decode().splitlines() if "CPU " in line)  # fmt: skip
            if res.status != 0 or len(rows) != 2:
                print(out.getvalue().decode()[-2000:])
                raise SystemExit(f"{label}: the job failed ({res.reason})")
            print(f"| {label} | {' / '.join(f'{float(r[1]):.1%}' for r in rows)} | "
                  f"{max(float(r[2]) for r in rows):.1f} | "
                  f"{' / '.join(f'{r[3]} / {r[4]}' for r in rows)} |", flush=True)
    finally:
        if not a.keep:
            testbed.down(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
