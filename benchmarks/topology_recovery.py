"""Does the profiler find the racks?

For each of --trials random placements (4..8 hosts, 2 racks, or 3 from 6
hosts; hosts dealt to racks at random), brings up an emulated cluster with
host links --rate and uplinks --uplink-rate, runs `cadence topo profile`
from outside, and compares what it inferred with the wiring it was never
told: the groups, and every alone rate and group capacity against the
configured rate. Prints one line per trial and a summary.

    .venv/bin/python benchmarks/topology_recovery.py --trials 10
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cadence.topo import load as load_topology


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--uplink-rate", default="250mbit")
    args = p.parse_args()

    from cadence import testbed
    from cadence.units import parse_rate

    rng = random.Random(args.seed)
    host_bps, up_bps = parse_rate(args.rate) / 8, parse_rate(args.uplink_rate) / 8
    right, worst_rate, worst_cap = 0, 0.0, 0.0
    print("| trial | hosts | racks | placement (rack of each host) | groups found | right "
          "| worst rate error | worst capacity error | profile (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for trial in range(args.trials):
        n = rng.randint(4, 8)
        racks = 3 if n >= 6 and rng.random() < 0.5 else 2
        name = f"rec{os.getpid() % 10000}t{trial}"
        c = testbed.build(name, n, 1, args.rate, racks=racks, uplink_rate=args.uplink_rate,
                          placement="random", seed=rng.randrange(1 << 30))  # fmt: skip
        try:
            testbed.up(c)
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "t.json"
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "cadence.cli.main", "topo", "profile",
                                       "--cluster", name, "-o", str(out)],
                                      capture_output=True, text=True, timeout=600)  # fmt: skip
                took = time.perf_counter() - t0
                if proc.returncode != 0:
                    print(proc.stdout[-2000:], proc.stderr[-2000:])
                    return 1
                doc = load_topology(out)
        finally:
            testbed.down(name)
        want = {}
        for h, r in enumerate(c.rack_of):
            want.setdefault(r, []).append(h)
        ok = doc["groups"] == sorted(want.values())
        right += ok
        rate_err = max(abs(doc["rates"][a][b] / (host_bps if c.rack_of[a] == c.rack_of[b]
                                                 else up_bps) - 1)
                       for a in range(n) for b in range(n) if a != b)  # fmt: skip
        caps = [x for x in doc["group_out"] + doc["group_in"] if x is not None]
        cap_err = max((abs(x / up_bps - 1) for x in caps), default=float("nan"))
        worst_rate = max(worst_rate, rate_err)
        worst_cap = max(worst_cap, cap_err) if caps else worst_cap
        print(f"| {trial} | {n} | {racks} | {''.join(map(str, c.rack_of))} | {doc['groups']} "
              f"| {'yes' if ok else 'NO'} | {rate_err:.1%} | {cap_err:.1%} | "
              f"{doc['profile']['seconds']:.1f} ({took:.0f} with start-up) |", flush=True)
    print(f"\nracks recovered in {right} of {args.trials}; worst alone-rate error "
          f"{worst_rate:.1%}, worst group-capacity error {worst_cap:.1%}")
    return 0 if right == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
