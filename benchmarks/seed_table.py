"""Which allreduce wins at which scale: ring, 2D torus, direct and `auto`
side by side by host count, one rank per host, on emulated clusters at
1 Gbit/s (a table in the shape of the study behind cadence, which found
direct best at 16–128 nodes, ring at 256 and 2D torus from 512).

    .venv/bin/python benchmarks/seed_table.py --hosts 2 3 4 5 6 7 8 --sizes 64K 1M 16M

For each host count it brings up a cluster named `seed` (root), runs
`cadence bench --algo ring,torus2d,direct,auto` once per size list, takes the
cluster down, and prints one row per (hosts, size): each algorithm's time in
ms, the fastest, and auto's ratio to it. JSON records go to
bench-results/seed-<hosts>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ALGOS = ("ring", "torus2d", "direct", "auto")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    p.add_argument("--sizes", nargs="+", default=["64K", "1M", "16M"])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=3)
    args = p.parse_args(argv)
    cadence = str(Path(sys.executable).with_name("cadence"))
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    rows = []
    for h in args.hosts:
        subprocess.run([cadence, "cluster", "up", "--name", "seed", "--hosts", str(h),
                        "--nics", "1", "--rate", args.rate], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            path = out / f"seed-{h}.json"
            for size in args.sizes:
                one = out / f"seed-{h}-{size}.json"
                subprocess.run([cadence, "bench", "--cluster", "seed", "--ranks-per-host", "1",
                                "--op", "allreduce", "-b", size, "-e", size,
                                "-n", str(args.iters), "-w", str(args.warmup),
                                "--backends", "cadence", "--algo", ",".join(ALGOS),
                                "--json", str(one)], check=True, stdout=subprocess.DEVNULL)
            records = [r for size in args.sizes
                       for r in json.loads((out / f"seed-{h}-{size}.json").read_text())]
            path.write_text(json.dumps(records))
        finally:
            subprocess.run([cadence, "cluster", "down", "--name", "seed"], check=False,
                           stdout=subprocess.DEVNULL)
        by = {}
        for r in records:
            by.setdefault(r["bytes"], {})[r["algo"]] = r
        for size, recs in sorted(by.items()):
            t = {a: recs[a]["time_us"] / 1e3 for a in ALGOS if a in recs}
            flat = {a: v for a, v in t.items() if a != "auto"}
            best = min(flat, key=flat.get)
            rows.append((h, size, t, best, recs.get("auto", {}).get("chosen")))
            print(f"{h} hosts {size:>9} B: " + "  ".join(f"{a} {t[a]:.2f}" for a in t)
                  + f" ms; best {best}", flush=True)
    print()
    print("| hosts | size | " + " | ".join(f"{a} (ms)" for a in ALGOS)
          + " | fastest | auto chose | auto / fastest |")
    print("| --- " * (len(ALGOS) + 5) + "|")
    for h, size, t, best, chosen in rows:
        cells = " | ".join(f"{t[a]:.2f}" if a in t else "-" for a in ALGOS)
        ratio = t[best] / t["auto"] if "auto" in t else float("nan")
        print(f"| {h} | {size >> 10} KiB | {cells} | {best} | {chosen} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
