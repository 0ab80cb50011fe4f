"""Ring order from a measured topology against rank order, gloo and Open MPI
on an emulated cluster with racks.

Profiles the cluster once (`cadence topo profile`, timed), then for each
collective runs `cadence bench` twice in this one run: cadence with rings in
rank order (CADENCE_TOPO_FILE=none) beside gloo and Open MPI, and cadence
with the profiled file. Prints one line per (collective, algorithm) with the
ratios, and how far each is from what the uplinks allow.

    cadence cluster up --name tr --hosts 4 --racks 2 --uplink-rate 250mbit \\
        --placement interleaved
    .venv/bin/python benchmarks/topology.py --cluster tr --size 64M

--startup measures the other way a job gets its order: no topology file,
so each cadence job profiles at start-up (a fresh cache per collective, so
every one measures); it also times the start-up itself (`cadence.init()` on
every rank) with rings in rank order, with a profile, and with the cached
profile, and prints the cost.

--ranks-per-host 2 runs two ranks per host; `auto` then chooses with the
cost model priced on the measured network (hierarchical, whose cross-host
column rings follow the order, for allreduce there).
--algo picks cadence's algorithm (default: ring at one rank per host, auto
otherwise; the table shows what auto ran).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPS = ("allreduce", "allgather", "reduce_scatter")


def _cadence(*args: str, env: dict | None = None, echo: bool = False) -> None:
    cmd = [sys.executable, "-m", "cadence.cli.main", *args]
    print("$ cadence", " ".join(args), flush=True)
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    if echo:
        print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        sys.exit(f"`cadence {' '.join(args)}` failed ({proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def _bench(cluster: str, rph: int, op: str, size: str, iters: int, backends: str,
           algo: str | None, topo: str, workdir: Path) -> dict[str, float]:
    """{backend: median seconds} of one `cadence bench` run."""
    out = workdir / f"{op}-{topo.replace('/', '_')}-{backends.replace(',', '_')}.json"
    args = ["bench", "--cluster", cluster, "--ranks-per-host", str(rph), "--op", op,
            "-b", size, "-e", size, "-n", str(iters), "-w", "2", "--backends", backends,
            "--json", str(out)]  # fmt: skip
    if algo:
        args += ["--algo", algo]
    _cadence(*args, env=dict(os.environ, CADENCE_TOPO_FILE=topo))
    got = {}
    for rec in json.loads(out.read_text()):
        if rec.get("wrong"):
            sys.exit(f"{rec['backend']} {op}: {rec['wrong']} wrong elements")
        got[rec["backend"]] = rec["time_us"] / 1e6
        if rec["backend"] == "cadence" and rec.get("chosen"):
            got["cadence algo"] = rec["chosen"]  # what auto ran
    return got


INIT = """
import time, cadence
t = time.perf_counter()
comm = cadence.init()
took = time.perf_counter() - t
order = comm.dump_records()["ring_order"]
comm.close()
if comm.rank == 0:
    prof = order.get("profile_seconds")
    print(f"INIT {took:.3f} {prof or 0:.3f} {'/'.join(order['hosts'])} {order['source']}",
          flush=True)  # fmt: skip
"""


def _startup_cost(cluster, rph: int, workdir: Path) -> list[tuple[str, str]]:
    """(case, what rank 0 saw) for rank order, a profile at start-up, and the
    profile read from the cache: seconds in cadence.init() (which includes
    waiting for the last rank to start), seconds the profile took, the
    order and where it came from."""
    import io

    from cadence import testbed

    script = workdir / "init.py"
    script.write_text(INIT)
    cache = workdir / "startup-cache"
    rows = []
    for case, topo in (("rank order (CADENCE_TOPO_FILE=none)", "none"),
                       ("profile at start-up", ""), ("cached profile", "")):  # fmt: skip
        out = io.BytesIO()
        env = dict(os.environ, CADENCE_TOPO_FILE=topo, CADENCE_TOPO_CACHE=str(cache))
        res = testbed.jobs.run(cluster, rph, [sys.executable, str(script)], timeout=300,
                               env=env, out=out)  # fmt: skip
        text = out.getvalue().decode(errors="replace")
        line = next((ln for ln in text.splitlines() if "INIT " in ln), None)
        if res.status or line is None:
            sys.exit(f"start-up job ({case}) failed: {res.reason}\n{text[-3000:]}")
        took, prof, hosts, source = line.split("INIT ", 1)[1].split(" ", 3)
        what = f"{float(took):.2f} s (profile {float(prof):.2f} s), order {hosts} by {source}"
        rows.append((case, what))
        print(f"start-up, {case}: {what}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", required=True)
    p.add_argument("--ranks-per-host", type=int, default=1)
    p.add_argument("--size", default="64M")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--algo", help="cadence's algorithm (default: ring at 1 rank per host)")
    p.add_argument("--topo", help="use this topology file instead of profiling")
    p.add_argument("--peers", default="gloo,mpi", help="peers to run beside cadence")
    p.add_argument("--startup", action="store_true",
                   help="no file: each cadence job profiles at start-up (and time start-up)")
    args = p.parse_args()

    from cadence import testbed
    from cadence.units import format_rate

    cluster = testbed.require(args.cluster)
    # auto by name, so the records say what it ran.
    algo = args.algo or ("ring" if args.ranks_per_host == 1 else "auto")
    with tempfile.TemporaryDirectory(prefix="cadence-topo-") as tmp:
        workdir = Path(tmp)
        topo = args.topo
        startup = []
        if args.startup:
            startup = _startup_cost(cluster, args.ranks_per_host, workdir)
        elif topo is None:
            topo = str(workdir / "topo.json")
            t0 = time.perf_counter()
            _cadence("topo", "profile", "--cluster", cluster.name, "-o", topo)
            took = time.perf_counter() - t0
            doc = json.loads(Path(topo).read_text())
            print(f"profile: {took:.1f} s for the whole job (start-up included), "
                  f"{doc['profile']['seconds']:.1f} s measuring", flush=True)
        if topo is not None:
            _cadence("topo", "show", topo, echo=True)
        rows = []
        for op in args.ops.split(","):
            if args.startup:  # unset: profile at start-up, into a cache of its own
                os.environ["CADENCE_TOPO_CACHE"] = str(workdir / f"cache-{op}")
                topo = ""
            plain = _bench(cluster.name, args.ranks_per_host, op, args.size, args.iters,
                           ",".join(["cadence", *filter(None, args.peers.split(","))]),
                           algo, "none", workdir)  # fmt: skip
            found = _bench(cluster.name, args.ranks_per_host, op, args.size, args.iters,
                           "cadence", algo, topo, workdir)  # fmt: skip
            rows.append((op, plain, found))
    uplink = cluster.uplink_bits or cluster.rate_bits
    print(f"\n# {cluster.name}: {len(cluster.hosts)} hosts x {args.ranks_per_host}, "
          f"{cluster.racks} racks ({cluster.placement}), host links {cluster.rate}, "
          f"uplinks {format_rate(uplink)}; {args.size}, cadence algo {algo or 'auto'}")  # fmt: skip
    found_by = "start-up profile" if args.startup else "topology file"
    print(f"(found order: by {found_by})")
    for case, what in startup:
        print(f"start-up (cadence.init on rank 0), {case}: {what}")
    print("| collective | cadence algo (rank order / found) | rank order (s) | found order (s) "
          "| found/rank order | gloo (s) | Open MPI (s) | found vs gloo | found vs Open MPI |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, plain, got in rows:
        found = got["cadence"]
        algos = f"{plain.get('cadence algo', '?')} / {got.get('cadence algo', '?')}"
        secs = {k: f"{plain[k]:.3f}" if k in plain else "n/a" for k in ("gloo", "mpi")}
        vs = {k: f"{plain[k] / found:.2f}x" if k in plain else "n/a" for k in ("gloo", "mpi")}
        print(f"| {op} | {algos} | {plain['cadence']:.3f} | {found:.3f} "
              f"| {plain['cadence'] / found:.2f}x | {secs['gloo']} | {secs['mpi']} "
              f"| {vs['gloo']} | {vs['mpi']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
