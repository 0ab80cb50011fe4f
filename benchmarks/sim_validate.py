"""Checks `cadence sim` against measurements on the emulated cluster.

Measures with `cadence bench --cluster NAME --algo all --backends cadence`
(or reads records it wrote before, --measured FILE...), simulates every
(collective, algorithm, size) of them on the same cluster's spec (`cadence sim
calibrate`'s when it ran), and prints every cell: measured median, simulated,
error; then the worst error and how many cells are within --within.

Each size is simulated as `cadence bench` timed it: its algorithms (auto as
the one it chose) take turns sample by sample, --iters rounds after --warmup
calls each, so an algorithm's samples start with the link credit the one
before it left (`SimCluster.run_turns`); --alone simulates each algorithm's
samples back to back instead.

  python benchmarks/sim_validate.py --cluster v --ops allreduce,allgather,reduce_scatter \\
      --sizes 64K,1M,64M [--ranks-per-host 2] [--measured v-1-*.json] [--json out.json]
      [--spec saved-spec.json]

Without --measured it runs the benches itself (minutes at 64 MiB on 1 Gbit/s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from cadence import _core
from cadence.bench.common import DTYPES, layout
from cadence.cli.sim import calls_for, cluster_spec
from cadence.units import format_size, parse_size


def measure(cluster: str, rph: int, op: str, sizes: list[int], iters: int, out: Path) -> None:
    lo, hi = min(sizes), max(sizes)
    # One sweep from the smallest to the largest size by x4 covers 64K, 1M, 64M.
    cmd = [
        sys.executable, "-m", "cadence.cli.main", "bench", "--cluster", cluster,
        "--ranks-per-host", str(rph), "--op", op, "--algo", "all", "-b", str(lo), "-e", str(hi),
        "-f", "4", "--backends", "cadence", "-n", str(iters), "-w", "1", "--json", str(out),
    ]  # fmt: skip
    print(f"# measuring: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--spec", help="a spec saved before (`cadence sim calibrate --output`) "
                                  "instead of the cluster's current one")
    p.add_argument("--ranks-per-host", type=int, default=1)
    p.add_argument("--ops", default="allreduce,allgather,reduce_scatter")
    p.add_argument("--sizes", default="64K,1M,64M", help="sizes to compare (others are ignored)")
    p.add_argument("--measured", nargs="*", help="`cadence bench --json` files to compare with")
    p.add_argument("--iters", type=int, default=5, help="samples per algorithm (bench -n)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up calls per algorithm (bench -w)")
    p.add_argument("--alone", action="store_true",
                   help="simulate each algorithm alone, not taking turns with the others")
    p.add_argument("--within", type=float, default=0.15)
    p.add_argument("--json", help="write every cell here")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    records = []
    if args.measured:
        for f in args.measured:
            records += json.loads(Path(f).read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for op in ops:
                out = Path(tmp) / f"{op}.json"
                measure(args.cluster, args.ranks_per_host, op, sizes, args.iters, out)
                if out.exists():
                    records += json.loads(out.read_text())
    if args.spec:
        spec = json.loads(Path(args.spec).read_text())
        spec["ranks_per_host"] = args.ranks_per_host
    else:
        spec = cluster_spec(args.cluster, args.ranks_per_host)
    model = _core.SimCluster(json.dumps(spec), f"cluster {args.cluster}", None)
    print(f"# spec: {json.dumps({k: spec.get(k) for k in ('nic', 'fabric', 'shm', 'cpu')})}")
    print(f"# {'op':<15} {'algo':<20} {'size':>6} {'measured':>10} {'simulated':>10} {'error':>7}")
    cells = []
    # The bench's records of one (collective, size), in the order it ran them.
    runs: dict[tuple[str, int], list[dict]] = {}
    for rec in records:
        if rec["op"] in ops and rec.get("ranks_per_host", 1) == args.ranks_per_host:
            runs.setdefault((rec["op"], rec["bytes"]), []).append(rec)
    simulated: dict[tuple[str, int, str], float] = {}
    for (op, nbytes), recs in runs.items():
        itemsize = DTYPES[recs[0]["dtype"]].itemsize
        lays = [layout(op, s, itemsize, recs[0]["nranks"]) for s in sizes]
        if not any(lay and lay.nbytes == nbytes for lay in lays):
            continue
        count, calls = nbytes // itemsize, calls_for(model, nbytes)
        # auto ran what the bench's record says it chose.
        algos = [r.get("chosen") if r["algo"] == "auto" else r["algo"] for r in recs]
        if args.alone:
            times = [model.run(op, count, itemsize, a, calls)[1] for a in algos]
        else:
            ran = model.run_turns(op, count, itemsize, algos, calls, args.iters, args.warmup)
            times = [t for _, t in ran]
        for r, t in zip(recs, times, strict=True):
            simulated[(op, nbytes, r["algo"])] = t
    for rec in records:
        key = (rec["op"], rec["bytes"], rec["algo"])
        if key not in simulated or rec["algo"] == "auto" or rec.get("wrong"):
            continue
        if rec.get("ranks_per_host", 1) != args.ranks_per_host:
            continue
        secs = simulated[key]
        measured = rec["time_us"] * 1e-6
        err = (secs - measured) / measured
        cells.append({**{k: rec[k] for k in ("op", "algo", "bytes")}, "measured_s": measured,
                      "simulated_s": secs, "error": err})  # fmt: skip
        print(f"  {rec['op']:<15} {rec['algo']:<20} {format_size(rec['bytes']):>6} "
              f"{measured * 1e3:>8.2f}ms {secs * 1e3:>8.2f}ms {err:>+7.1%}")  # fmt: skip
    if not cells:
        print("no cells to compare", file=sys.stderr)
        return 1
    worst = max(cells, key=lambda c: abs(c["error"]))
    inside = sum(abs(c["error"]) <= args.within for c in cells)
    print(f"# {inside} of {len(cells)} cells within {args.within:.0%}; worst {worst['error']:+.1%} "
          f"({worst['op']} {worst['algo']} {format_size(worst['bytes'])})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
