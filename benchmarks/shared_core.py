"""Two ranks on one core: the spin budget fixed at 50 µs against the adaptive one.

With as many ranks as cores and one more busy task, the scheduler can put two
ranks on one core; a rank that spins there keeps the rank it waits for off the
core (docs/benchmarks.md). This reproduces that on any machine with
two CPUs: each job runs 2 ranks (torchrun), which pin themselves after
`cadence.init` (so the engine has chosen the policy of ranks with a core each)
to the CPUs a placement names:

- `paired`: both ranks on the first CPU, a busy process on the second;
- `apart`: one rank on each CPU, nothing else.

Per placement and size, jobs with `CADENCE_SPIN_US=50` ("fixed": the budget
before it adapted; setting it turns adaptation off) and without ("adaptive")
take turns for `--rounds` rounds. A job times back-to-back allreduces: 2 000 to
warm up, then 5 runs of 200 after a barrier; it prints the min and median of
the runs' µs a call (rank 0's).

    python benchmarks/shared_core.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

JOB = r"""
import os, sys, time, numpy as np, cadence
cpus = [int(c) for c in sys.argv[1].split(",")]
sizes = [int(s) for s in sys.argv[2].split(",")]
comm = cadence.init()
os.sched_setaffinity(0, {cpus[comm.rank]})
out = []
for nbytes in sizes:
    x = np.ones(max(nbytes // 4, 1), np.float32)
    for _ in range(2000):
        comm.allreduce(x)
    runs = []
    for _ in range(5):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(200):
            comm.allreduce(x)
        runs.append((time.perf_counter() - t) / 200 * 1e6)
    runs.sort()
    out.append(f"{nbytes}={runs[0]:.2f}/{runs[2]:.2f}")
if comm.rank == 0:
    print("RESULT " + " ".join(out), flush=True)
"""

HOG = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def job(script: str, cpus: list[int], sizes: str, fixed: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CADENCE_SPIN_US", None)
    if fixed:
        env["CADENCE_SPIN_US"] = "50"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", script, ",".join(map(str, cpus)), sizes]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"job failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return dict(kv.split("=") for kv in lines[-1].split()[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sizes", default="8,4096,262144", help="bytes, comma-separated")
    args = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("needs two CPUs")
    first, second = allowed[:2]
    placements = {"paired": [first, first], "apart": [first, second]}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
    results: dict[tuple[str, bool], list[dict[str, str]]] = {}
    try:
        for name, cpus in placements.items():
            hog = None
            if name == "paired":
                hog = subprocess.Popen([sys.executable, "-c", HOG, str(second)])
            try:
                for i in range(args.rounds):
                    for fixed in (True, False) if i % 2 == 0 else (False, True):
                        got = job(f.name, cpus, args.sizes, fixed)
                        results.setdefault((name, fixed), []).append(got)
                        label = "fixed 50 us" if fixed else "adaptive"
                        print(f"round {i + 1} {name} {label}: "
                              + " ".join(f"{k} B {v}" for k, v in got.items()), flush=True)
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    finally:
        os.unlink(f.name)
    print("# µs a call, min/median of 5 runs, one entry per round")
    print("| placement | size | fixed 50 µs | adaptive |\n| --- | --- | --- | --- |")
    for name in placements:
        for size in args.sizes.split(","):
            cells = [", ".join(r[size] for r in results[(name, fixed)]) for fixed in (True, False)]
            print(f"| {name} | {size} B | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
