"""Each rank's own time against the span across ranks, for every collective.

`cadence bench` times a sample on every rank from its own barrier exit and
shows the slowest rank's median (`--timing rank`, as nccl-tests and OSU do).
With more ranks than cores a rank that leaves the barrier late finds its
data waiting and times itself short; `--timing span` times each sample from
the first rank's start to the last rank's end instead. Every record carries
both medians of the same samples, so one run per collective compares them:

    python benchmarks/span_timing.py --nranks 4 --rounds 3

runs `cadence bench --op OP --nranks N -b 8 -e 64M -f 8 --backends
cadence,gloo,mpi --rounds R --timing span --json ...` for each collective
and prints one markdown table: per size, cadence's and each peer's median
in both timings (µs) and the peer's time over cadence's in both (above 1:
cadence faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cadence.bench.common import OPS
from cadence.units import format_size

PEERS = ("mpi", "gloo")


def run_op(op: str, a: argparse.Namespace, where: Path) -> list[dict]:
    out = where / f"{op}.json"
    cmd = [
        sys.executable, "-m", "cadence.cli.main", "bench", "--nranks", str(a.nranks),
        "--op", op, "-b", a.min, "-e", a.max, "-f", str(a.factor),
        "--backends", a.backends, "--rounds", str(a.rounds), "--timing", "span",
        "--json", str(out),
    ]  # fmt: skip
    print(f"# {op}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"span_timing: cadence bench --op {op} failed:\n{proc.stdout[-3000:]}")
    return json.loads(out.read_text())


def rows(op: str, records: list[dict]) -> list[str]:
    by: dict[int, dict[str, dict]] = {}
    for r in records:
        by.setdefault(r["bytes"], {})[r["backend"]] = r
    lines = []
    for nbytes, backends in sorted(by.items()):
        cad = backends.get("cadence")
        if cad is None:
            continue
        cells = [op, format_size(nbytes)]
        cells += [f"{cad['rank_time_us']:.1f}", f"{cad['span_time_us']:.1f}"]
        for peer in PEERS:
            theirs = backends.get(peer)
            if theirs is None:
                cells += ["-"] * 4
                continue
            cells += [
                f"{theirs['rank_time_us']:.1f}",
                f"{theirs['span_time_us']:.1f}",
                f"{theirs['rank_time_us'] / cad['rank_time_us']:.2f}",
                f"{theirs['span_time_us'] / cad['span_time_us']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated collectives (all)")
    ap.add_argument("-b", dest="min", default="8")
    ap.add_argument("-e", dest="max", default="64M")
    ap.add_argument("-f", dest="factor", type=int, default=8)
    ap.add_argument("--backends", default="cadence,gloo,mpi")
    a = ap.parse_args()
    head = ["op", "size", "cadence rank", "cadence span"]
    for peer in PEERS:
        head += [f"{peer} rank", f"{peer} span", f"{peer}/cadence rank", f"{peer}/cadence span"]
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    with tempfile.TemporaryDirectory(prefix="span-timing-") as tmp:
        for op in a.ops.split(","):
            table += rows(op, run_op(op, a, Path(tmp)))
    print(f"# {a.nranks} ranks on {os.cpu_count()} CPUs, medians over {a.rounds} rounds (µs)")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
