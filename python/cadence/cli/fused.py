"""`cadence bench --op <fused operator>`: the operator fused and unfused, the
compute alone and the collective alone, side by side (docs/fused.md).

Runs `python -m cadence.bench.fused` on every rank (locally, or across an
emulated cluster's hosts with --cluster), then prints one table and the
overlap: how much of the shorter of compute and communication the fused path
hid, and how close it came to the bound, max(compute, collective).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cadence.bench.fused import FUSED_DTYPES, FUSED_OPS, VARIANTS
from cadence.cli.launch import Workload, read_records, run_program
from cadence.cli.options import resolve_ranks
from cadence.units import fmt_us_as_ms


def summarize(times: dict[str, float]) -> dict[str, float]:
    """Speed-up, bound and overlap from the variants' medians (µs)."""
    shorter = min(times["compute"], times["collective"])
    bound = max(times["compute"], times["collective"])
    return {
        "speedup": times["unfused"] / times["fused"],
        "bound_us": bound,
        "of_bound": bound / times["fused"],
        # Of the shorter part, the share that ran under the longer one: 0 when
        # fused takes compute + collective, 1 when it takes the longer alone.
        "hidden": (times["compute"] + times["collective"] - times["fused"]) / shorter
        if shorter > 0 else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    spec = FUSED_OPS[args.op]
    try:
        shape = spec.shape(args.shape)
    except ValueError as e:
        print(f"cadence bench: {e}", file=sys.stderr)
        return 2
    if args.dtype not in FUSED_DTYPES:
        print(f"cadence bench: {args.op} runs float32 or bfloat16, not {args.dtype}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        cluster, nranks = resolve_ranks(args)
    except ValueError as e:
        print(f"cadence bench: {e}", file=sys.stderr)
        return 2
    job = Workload(op=args.op, dtype=args.dtype, sizes=[], nranks=nranks, iters=args.iters,
              warmup=max(0, args.warmup_iters), timeout=args.timeout, cluster=cluster,
              ranks_per_host=args.ranks_per_host)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cadence-bench-") as workdir:
        outdir = Path(workdir)
        cmd = [
            sys.executable, "-m", "cadence.bench.fused", "--op", args.op,
            "--shape", ",".join(f"{k}={v}" for k, v in shape.items()),
            "--dtype", args.dtype, "--iters", str(args.iters),
            "--warmup", str(max(0, args.warmup_iters)), "--out", str(outdir),
            *(["--tile-rows", str(args.tile_rows)] if args.tile_rows else []),
        ]  # fmt: skip
        print(f"bench: {args.op} on {nranks} ranks ...", file=sys.stderr, flush=True)
        failure = run_program(job, cmd, outdir)
        records = [rec for r in range(nranks) for rec in read_records(outdir / f"rank{r}.jsonl")]
    if failure:
        print(f"cadence bench: {args.op} failed: {failure}", file=sys.stderr)
        return 1
    times = {v: max(r["time_us"] for r in records if r["algo"] == v) for v in VARIANTS}
    p99s = {v: max(r["p99_us"] for r in records if r["algo"] == v) for v in VARIANTS}
    wrong = sum(r["wrong"] for r in records)
    threads = records[0].get("compute_threads")
    where = (f" on cluster {cluster.name} ({len(cluster.hosts)} hosts x {args.ranks_per_host}, "
             f"{cluster.rate} links)" if cluster else " on one host")  # fmt: skip
    dims = ", ".join(f"{k}={v}" for k, v in shape.items())
    print(f"# cadence bench: {args.op} {args.dtype} ({dims}; {spec.what}), {nranks} ranks"
          f"{where}, {threads} compute thread(s) per rank, {args.iters} iters")  # fmt: skip
    print(f"{'variant':<12}{'median':>14}{'p99':>14}{'vs unfused':>12}")
    for v in VARIANTS:
        ratio = times["unfused"] / times[v]
        print(f"{v:<12}{fmt_us_as_ms(times[v]):>14}{fmt_us_as_ms(p99s[v]):>14}{ratio:>11.2f}x")
    s = summarize(times)
    print(f"# fused is {s['speedup']:.2f}x unfused; bound max(compute, collective) = "
          f"{fmt_us_as_ms(s['bound_us'])}, fused reaches {s['of_bound']:.0%} of it; "
          f"the overlap hid "
          f"{s['hidden']:.0%} of the shorter part; {wrong} element(s) of fused differ from "
          "unfused beyond the tolerance")  # fmt: skip
    if args.json:
        out = [{
            "backend": "cadence", "op": args.op, "dtype": args.dtype, "shape": shape,
            "nranks": nranks, "algo": v, "time_us": times[v], "p99_us": p99s[v],
            "wrong": wrong if v == "fused" else 0,
            **({"cluster": cluster.name, "hosts": len(cluster.hosts),
                "ranks_per_host": args.ranks_per_host, "link_bits": cluster.rate_bits}
               if cluster else {}),
        } for v in VARIANTS]  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if wrong else 0
