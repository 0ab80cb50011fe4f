"""What the live diagnosis costs: one job runs a loop of allreduces in blocks,
the watchdog on (the defaults: 1 s ticks, 10 s slowness windows) and paused
(`live.pause()`) in alternate blocks, and compares each pair of neighbouring
blocks.

    python -m cadence.bench.overhead --nranks 4 --size 1M --block 5 --pairs 20
    python -m cadence.bench.overhead --cluster tb --ranks-per-host 2 --size 1M

Why inside one job: between jobs, the same loop on this machine differs by
±10 % (where the processes land, what else runs), far more than the 2 % to be
shown; blocks a few seconds apart in one job differ much less, and the order
inside a pair alternates (on-off, off-on) so a drift cancels. Paused, the
watchdog does nothing but wake once a second; every other part of the
diagnosis (the flight recorder, the error's diagnosis slot) is the same in
both blocks, as it is always on.

Each block: a barrier, then `--block` seconds of back-to-back allreduces of
`--size` bytes (float32), timed on every rank; a block's figure is its
slowest rank's mean time per call. Prints every pair, the median and mean
of the paired ratios (on / off) with a 95 % interval of the mean, and the
watchdog's own CPU time per second of run (from `live.cost()`: the thread's
CPU time, its Store calls, dumps and window judgements included), which
bounds what it can take from the ranks.

`--cluster NAME` runs the job on an emulated cluster (`cadence cluster up`)
through `cadence cluster run`, as torchrun would start it (needs root).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cadence.units import parse_size

#: Calls timed to size the blocks.
PROBE_CALLS = 30


def alternate(comm, nbytes: int, block_s: float, pairs: int) -> dict:
    """One rank's part: warm up, size the blocks, run `pairs` pairs of blocks
    (watchdog on and paused, the order alternating), return the timings."""
    import numpy as np

    from cadence.diagnosis import live

    x = np.ones(max(1, nbytes // 4), dtype=np.float32)
    for _ in range(10):
        comm.allreduce(x)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(PROBE_CALLS):
        comm.allreduce(x)
    per_call = np.array([(time.perf_counter() - t0) / PROBE_CALLS])
    comm.allreduce(per_call, op="max")  # every rank sizes the blocks alike
    iters = max(20, int(block_s / per_call[0]))
    blocks = []
    for i in range(pairs):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            live.pause(not on)
            cpu0 = live.cost()["cpu_s"]
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.allreduce(x)
            wall = time.perf_counter() - t0
            blocks.append({"pair": i, "on": on, "per_call": wall / iters, "wall": wall,
                           "watchdog_cpu": live.cost()["cpu_s"] - cpu0})
    live.pause(False)
    comm.barrier()
    return {"rank": comm.rank, "iters": iters, "blocks": blocks}


def _local_rank(rank, size, port, nbytes, block_s, pairs, q):
    os.environ.update({"CADENCE_HOST": "local", "OMP_NUM_THREADS": "1"})
    from datetime import timedelta

    import torch.distributed as dist

    import cadence

    try:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False,
                              timeout=timedelta(seconds=60))
        comm = cadence.init(store=store, rank=rank, world_size=size)
        q.put(alternate(comm, nbytes, block_s, pairs))
        comm.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def run_local(nranks: int, nbytes: int, block_s: float, pairs: int) -> list[dict]:
    """N local ranks (processes, shared memory) and a TCPStore in this
    process, as under torchrun."""
    from datetime import timedelta

    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    server = dist.TCPStore("127.0.0.1", 0, nranks, is_master=True,
                           timeout=timedelta(seconds=60), wait_for_workers=False)
    q = ctx.Queue()
    procs = [ctx.Process(target=_local_rank,
                         args=(r, nranks, server.port, nbytes, block_s, pairs, q))
             for r in range(nranks)]
    for p in procs:
        p.start()
    limit = 120 + 2 * pairs * block_s * 3
    try:
        out = [q.get(timeout=limit) for _ in range(nranks)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def run_cluster(name: str, ranks_per_host: int, nbytes: int, block_s: float,
                pairs: int) -> list[dict]:
    """The same job on an emulated cluster, started by `cadence cluster run`;
    each rank writes its timings to a file here."""
    out = Path(tempfile.mkdtemp(prefix="cadence-overhead-"))
    limit = int(180 + 2 * pairs * block_s * 3)
    cmd = [sys.executable, "-m", "cadence.cli.main", "cluster", "run", "--name", name,
           "--ranks-per-host", str(ranks_per_host), "--timeout", str(limit), "--",
           sys.executable, "-m", "cadence.bench.overhead", "--as-rank", str(out),
           "--size", str(nbytes), "--block", str(block_s), "--pairs", str(pairs)]
    subprocess.run(cmd, check=True)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def as_rank(out_dir: str, nbytes: int, block_s: float, pairs: int) -> int:
    """A rank started as torchrun would (the cluster's runner)."""
    import cadence

    comm = cadence.init()
    res = alternate(comm, nbytes, block_s, pairs)
    Path(out_dir, f"rank{comm.rank}.json").write_text(json.dumps(res))
    comm.close()
    return 0


def report(results: list[dict], label: str) -> dict:
    """Prints the pairs and the summary; returns the summary."""
    errors = [r for r in results if "error" in r]
    if errors:
        raise SystemExit(f"cadence.bench.overhead: {errors}")
    nranks = len(results)
    pairs = max(b["pair"] for b in results[0]["blocks"]) + 1
    per: dict[tuple[int, bool], float] = {}
    for r in results:
        for b in r["blocks"]:
            k = (b["pair"], b["on"])
            per[k] = max(per.get(k, 0.0), b["per_call"])
    ratios = [per[(i, True)] / per[(i, False)] for i in range(pairs)]
    print(f"{label}: {nranks} ranks, {results[0]['iters']} calls per block")
    for i, ratio in enumerate(ratios):
        print(f"  pair {i + 1:2d}: off {per[(i, False)] * 1e6:9.1f} us/call, "
              f"on {per[(i, True)] * 1e6:9.1f} us/call, on/off {ratio:.4f}")
    mean = statistics.fmean(ratios)
    half = 1.96 * statistics.stdev(ratios) / math.sqrt(pairs) if pairs > 1 else math.inf
    on_wall = max(sum(b["wall"] for b in r["blocks"] if b["on"]) for r in results)
    cpu = max(sum(b["watchdog_cpu"] for b in r["blocks"] if b["on"]) for r in results)
    totals = (sum(per[(i, True)] for i in range(pairs))
              / sum(per[(i, False)] for i in range(pairs)))
    summary = {"ranks": nranks, "pairs": pairs, "median": statistics.median(ratios),
               "mean": mean, "ci95": [mean - half, mean + half], "totals": totals,
               "watchdog_cpu_share": cpu / on_wall}
    print(f"  on/off: median of pairs {summary['median']:.4f}, mean {mean:.4f} "
          f"(95 % interval {mean - half:.4f} to {mean + half:.4f}), "
          f"sum over blocks {totals:.4f}")
    print(f"  the watchdog's CPU time, busiest rank: {cpu * 1e3:.1f} ms in {on_wall:.0f} s "
          f"of blocks with it on ({cpu / on_wall * 100:.3f} % of one core)", flush=True)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=4, help="local ranks (4)")
    p.add_argument("--cluster", metavar="NAME",
                   help="run on this emulated cluster instead (needs root)")
    p.add_argument("--ranks-per-host", type=int, default=2, help="with --cluster (2)")
    p.add_argument("--size", default="1M", help="allreduce size in bytes (1M)")
    p.add_argument("--block", type=float, default=5.0, help="seconds per block (5)")
    p.add_argument("--pairs", type=int, default=20, help="pairs of blocks (20)")
    p.add_argument("--json", metavar="FILE", help="also write the summary here")
    p.add_argument("--as-rank", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    nbytes = parse_size(args.size)
    if args.as_rank:
        return as_rank(args.as_rank, nbytes, args.block, args.pairs)
    approx = 2 * args.pairs * args.block
    if args.cluster:
        label = f"cluster {args.cluster}, allreduce {nbytes} B"
        print(f"{label}: {args.pairs} pairs of {args.block:g} s blocks (~{approx:.0f} s)",
              flush=True)
        res = run_cluster(args.cluster, args.ranks_per_host, nbytes, args.block, args.pairs)
    else:
        label = f"{args.nranks} local ranks, allreduce {nbytes} B"
        print(f"{label}: {args.pairs} pairs of {args.block:g} s blocks (~{approx:.0f} s)",
              flush=True)
        res = run_local(args.nranks, nbytes, args.block, args.pairs)
    summary = report(res, label)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
