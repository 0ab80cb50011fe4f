"""Jobs sharing an ECMP leaf–spine fabric, with and without the path planner
(docs/traffic.md, "Collisions").

Brings up a routed emulated cluster (`--racks` leaves of `--per-rack`
hosts, `--spines` spines, host links and uplinks at `--rate`: 1:1 when
per-rack equals spines), starts `--jobs` jobs at once, each one rank on
each of its hosts (a job takes the i-th host of each rack of a block of
`--span` racks, every rack by default: its ring crosses them all), each
looping `--iters` allreduces of `--size`, and
reads what every uplink carried. Backends, each in turn per trial:
`planned` (cadence with the planner), `cadence` (cadence, ports as the
kernel picks them: plain ECMP), `gloo` (torch's), `mpi` (Open MPI through
mpi4py, its TCP transport). Prints per trial and
backend each job's bus bandwidth (median of its iterations), the
aggregate, fastest / slowest job, and the busiest uplink over the mean;
then each backend's summary over the trials, and the solo figure (one job
alone, planned) that every job is compared with. First (with as many hosts
a rack as spines), one flow from every host at once, each pinned to a
spine so that no two share a link: each should reach the links' payload
limit, or the machine's cores are the limit, not the paths.

With `--cut RACK:SPINE` that uplink is cut when job 0 reports iteration
`--cut-at` (and restored after the run): each job's busbw before and after
the cut, against the ideal after it ((spines - 1) / spines of the solo
figure, 1:1), and how evenly the cut rack's surviving uplinks carried
what they did after it. With `--plot PNG`, each uplink's load over time
in the first trial, a panel per backend (the seed's figure). With `--logs
DIR`, every rank's output, a file per trial, backend, job and rank (with
CADENCE_DEBUG=INFO in the environment: each planned stream's bound port
and any warning that the planner was given up).

    python benchmarks/ecmp.py --trials 10
    python benchmarks/ecmp.py --racks 2 --per-rack 4 --spines 4 --jobs 4 \
        --iters 30 --cut 1:0 --cut-at 5 --plot uplinks.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

#: The share of a link's rate TCP payload can use at MTU 1500 (1448 of
#: every 1514 bytes on the wire, with timestamps).
TCP_PAYLOAD = 0.956

RANK = r"""
import json, os, sys, time
import numpy as np
backend, size, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.ones(size // 4, dtype=np.float32)
if backend == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    y = np.empty_like(x)
    run = lambda: comm.Allreduce(x, y)
    bar = comm.Barrier
    rank, n = comm.rank, comm.size
elif backend == "gloo":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.from_numpy(x)
    run = lambda: dist.all_reduce(t)
    # Left to the interpreter's exit, gloo's teardown sometimes aborts.
    bar = lambda: (dist.barrier(), dist.destroy_process_group()) if done else dist.barrier()
    rank, n = dist.get_rank(), dist.get_world_size()
else:
    import cadence
    c = cadence.init()
    run = lambda: c.allreduce(x)
    bar = c.barrier
    rank, n = c.rank, c.size
done = False
run(); bar()
for i in range(iters):
    t0 = time.time()
    run()
    t1 = time.time()
    if rank == 0:
        busbw = 2 * (n - 1) / n * size / (t1 - t0)
        print("ITER " + json.dumps({"i": i, "t0": t0, "t": t1, "busbw": busbw}), flush=True)
done = True
bar()
"""


def _launch(cluster, hosts, port, backend, size, iters, env_extra):
    """Every rank of one job: one per host of `hosts` (Open MPI's: one
    mpirun, which starts them)."""
    from cadence.testbed import jobs

    sub = replace(cluster, hosts=tuple(hosts))
    cmd = [sys.executable, "-c", RANK, backend, str(size), str(iters)]
    if backend == "mpi":
        work = Path(tempfile.mkdtemp(prefix="ecmp-mpi-"))
        return [subprocess.Popen(jobs.mpirun_command(sub, 1, work) + cmd,
                                 env={**os.environ, **env_extra}, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)]
    procs = []
    for i, h in enumerate(hosts):
        env = jobs.rank_env(sub, jobs.Placement(i, 0, h), 1, port, dict(os.environ))
        env.update(env_extra)
        procs.append(subprocess.Popen(
            jobs.in_host(h, cmd),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))  # fmt: skip
    return procs


class Cut:
    """An uplink cut when job 0's rank 0 reports iteration `at`: when, and
    the uplinks' counters then."""

    def __init__(self, cluster, rack: int, spine: int, at: int):
        self.cluster, self.rack, self.spine, self.at = cluster, rack, spine, at
        self.t: float | None = None
        self.counters: dict | None = None
        #: Each uplink's bytes from the cut until the first job ended.
        self.moved: dict | None = None

    def seen(self, i: int) -> None:
        from cadence import testbed
        from cadence.testbed import fabric

        if i == self.at and self.t is None:
            self.counters = fabric.uplink_counters(self.cluster.fabric)
            testbed.set_uplink(self.cluster, self.rack, self.spine, up=False)
            self.t = time.time()

    def restore(self) -> None:
        from cadence import testbed

        if self.t is not None:
            testbed.set_uplink(self.cluster, self.rack, self.spine, up=True)


class Sampler:
    """Every uplink's bytes sent up it, read every `every` seconds while
    jobs run (for `--plot`): [(time, {(rack, spine): tx_bytes})]."""

    def __init__(self, cluster, every: float):
        self.cluster, self.every = cluster, every
        self.series: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from cadence.testbed import fabric

        while not self._stop.is_set():
            c = fabric.uplink_counters(self.cluster.fabric)
            self.series.append((time.time(), {u: v["tx_bytes"] for u, v in c.items()}))
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def rates(self) -> tuple[list[float], dict]:
        """Seconds since the first reading (interval midpoints), and per
        uplink its MB/s over each interval."""
        s = self.series
        if len(s) < 2:
            return [], {}
        pairs = list(zip(s, s[1:], strict=False))
        t = [(a[0] + b[0]) / 2 - s[0][0] for a, b in pairs]
        return t, {u: [(b[1][u] - a[1][u]) / (b[0] - a[0]) / 1e6 for a, b in pairs]
                   for u in s[0][1]}  # fmt: skip


def plot(path: str, runs: list[tuple[str, Sampler, float | None]], rate: float) -> None:
    """One panel per backend: each uplink's MB/s over the run (the cut, if
    any, marked), against the link's payload limit: the seed's figure of
    per-uplink load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), squeeze=False)
    for ax, (backend, sampler, cut_t) in zip(axes[:, 0], runs, strict=True):
        t, per = sampler.rates()
        for (r, m), ys in sorted(per.items()):
            ax.plot(t, ys, label=f"rack {r} up spine {m}", lw=1.2)
        ax.axhline(rate / 1e6, color="grey", ls=":", lw=1)
        if cut_t is not None and sampler.series:
            ax.axvline(cut_t - sampler.series[0][0], color="red", ls="--", lw=1)
        ax.set_title(backend, fontsize=10, loc="left")
        ax.set_ylabel("MB/s")
        ax.set_ylim(bottom=0)
    axes[-1, 0].set_xlabel("seconds since the jobs started")
    axes[0, 0].legend(fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(0, 1.35),
                      frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"per-uplink load over time: {path}")


def run_jobs(cluster, groups, backend, size, iters, planner_env, algo, cut=None,
             sampler=None, logs=None):
    """The jobs of `groups` (host lists) at once; per job its iterations
    ({i, t, busbw}), and the uplinks' bytes over the run (after the cut,
    with `cut`: in `cut.moved` too, until the first job ended, while every
    job ran). `sampler`, if given, reads the uplinks meanwhile; `logs`,
    a path prefix for each rank's output (`<prefix>job<j>.rank<k>.log`)."""
    from cadence.testbed import fabric

    env = dict(planner_env) if backend == "planned" else {"CADENCE_PLANNER": ""}
    env["CADENCE_TOPO_FILE"] = "none"
    if algo != "auto":
        env["CADENCE_ALGO"] = f"allreduce:{algo}"
    before = fabric.uplink_counters(cluster.fabric)
    jobs = [_launch(cluster, g, 29500 + 10 * j, backend, size, iters, env)
            for j, g in enumerate(groups)]  # fmt: skip
    outs = [[None] * len(p) for p in jobs]
    first_end: list[dict] = []  # the uplinks' counters when a job first ended
    lock = threading.Lock()

    def reap(j, k, p):
        lines = []
        for line in p.stdout:
            lines.append(line)
            if cut is not None and (j, k) == (0, 0) and line.startswith("ITER "):
                cut.seen(json.loads(line[5:])["i"])
        p.wait(timeout=900)
        outs[j][k] = "".join(lines)
        with lock:
            if not first_end and all(q.poll() is not None for q in jobs[j]):
                first_end.append(fabric.uplink_counters(cluster.fabric))

    threads = [threading.Thread(target=reap, args=(j, k, p))
               for j, ps in enumerate(jobs) for k, p in enumerate(ps)]  # fmt: skip
    for t in threads:
        t.start()
    if sampler is not None:
        with sampler:
            for t in threads:
                t.join()
    for t in threads:
        t.join()
    after = fabric.uplink_counters(cluster.fabric)
    if cut is not None and cut.counters is not None:
        before = cut.counters
    moved = {u: after[u]["tx_bytes"] - before[u]["tx_bytes"] for u in after}
    if cut is not None and first_end:
        cut.moved = {u: first_end[0][u]["tx_bytes"] - before[u]["tx_bytes"] for u in after}
    if logs is not None:
        for j, ps in enumerate(outs):
            for k, text in enumerate(ps):
                Path(f"{logs}job{j}.rank{k}.log").write_text(text or "")
    results = []
    for j, ps in enumerate(jobs):
        if any(p.returncode for p in ps):
            text = "\n".join(o or "" for o in outs[j])
            raise RuntimeError(f"job {j} ({backend}) failed:\n{text[-3000:]}")
        iters_ = [json.loads(line[5:]) for line in outs[j][0].splitlines()
                  if line.startswith("ITER ")]  # fmt: skip
        results.append(iters_)
    return results, moved


def _balance(moved: dict, skip: frozenset = frozenset()) -> float:
    """How evenly each rack spread what it sent over its live uplinks (not
    those of `skip`): the worst rack's busiest uplink over its mean (1.0:
    even). Racks carry different totals (the job's rank 0 sends a little
    more), which is the workload's, not the paths'."""
    worst = 1.0
    for r in {r for r, _ in moved}:
        up = [v for (j, m), v in moved.items() if j == r and v > 0 and (j, m) not in skip]
        if up and statistics.mean(up) > 0:
            worst = max(worst, max(up) / statistics.mean(up))
    return worst


def _after_cut(b, trial, res, moved, cut, healthy, spines) -> dict:
    """One run with an uplink cut: each job's busbw before the cut and
    after it (iterations that started a second after it: the fabric and the
    library have acted by then), against the ideal after it ((spines - 1) /
    spines of `healthy`, what one flow carries on these links); the cut
    rack's surviving uplinks' spread after it."""
    ideal = healthy * (spines - 1) / spines
    if cut.t is None:
        raise RuntimeError(f"{b}: job 0 never reached iteration {cut.at}")
    # Only while every job still runs: the first to finish frees its share.
    end = min(r[-1]["t"] for r in res)
    before = [statistics.median([x["busbw"] for x in r if x["t"] < cut.t] or [0.0]) for r in res]
    after_iters = [[x["busbw"] for x in r if x["t0"] > cut.t + 1.0 and x["t"] <= end]
                   for r in res]  # fmt: skip
    if not all(after_iters):
        raise RuntimeError(f"{b}: a job ran no whole iteration between a second after the "
                           f"cut and the first job's end: more --iters")  # fmt: skip
    after = [statistics.median(x) for x in after_iters]
    def spread(m: dict) -> tuple[float, float]:
        live = [v for (r, s), v in m.items() if r == cut.rack and s != cut.spine]
        return min(live) / statistics.mean(live), max(live) / statistics.mean(live)

    # The uplinks as the busbw: while every job ran (once the first ends,
    # the spine it leaves idles by the workload, not by the paths).
    row = {"before": sum(before), "after": sum(after), "ideal": ideal * len(res),
           "worst_vs_ideal": min(after) / ideal, "jobs_before": before, "jobs_after": after,
           "uplinks": spread(cut.moved or moved), "uplinks_whole": spread(moved)}
    print(f"trial {trial} {b:>8}: jobs before " + " ".join(f"{x / 1e6:.2f}" for x in before) +
          " after " + " ".join(f"{x / 1e6:.2f}" for x in after) +
          f" MB/s; aggregate after {row['after'] / 1e6:.2f} = {row['after'] / row['ideal']:.0%} "
          f"of the ideal {row['ideal'] / 1e6:.2f}, {row['after'] / row['before']:.0%} of before; "
          f"slowest {row['worst_vs_ideal']:.0%}; "
          f"rack {cut.rack}'s live uplinks after the cut {row['uplinks'][0]:.2f}-"
          f"{row['uplinks'][1]:.2f} of their mean while every job ran "
          f"({row['uplinks_whole'][0]:.2f}-{row['uplinks_whole'][1]:.2f} to the last job's "
          f"end)", flush=True)  # fmt: skip
    print("    up MB after the cut by (rack, spine): " + " ".join(
        f"{r}.{m}:{v / 1e6:.1f}" for (r, m), v in sorted(moved.items())))
    return row


def _cut_table(summary: dict) -> None:
    print("| backend | aggregate after the cut / ideal, mean (worst) | after / before, mean | "
          "slowest job / its ideal, worst | live uplinks min-max / mean while every job ran, "
          "worst | the same to the last job's end |")
    print("|---|---|---|---|---|---|")
    for b, rows in summary.items():
        got = [r["after"] / r["ideal"] for r in rows]
        kept = statistics.mean(r["after"] / r["before"] for r in rows)
        print(f"| {b} | {statistics.mean(got):.0%} ({min(got):.0%}) | {kept:.0%} | "
              f"{min(r['worst_vs_ideal'] for r in rows):.0%} | "
              f"{min(r['uplinks'][0] for r in rows):.2f}-"
              f"{max(r['uplinks'][1] for r in rows):.2f} | "
              f"{min(r['uplinks_whole'][0] for r in rows):.2f}-"
              f"{max(r['uplinks_whole'][1] for r in rows):.2f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--racks", type=int, default=4)
    p.add_argument("--per-rack", type=int, default=2, help="hosts per rack (2)")
    p.add_argument("--spines", type=int, default=2)
    p.add_argument("--rate", default="100mbit", help="host links and uplinks (100mbit)")
    p.add_argument("--jobs", type=int, default=2,
                   help="concurrent jobs (at most --per-rack x --racks / --span)")
    p.add_argument("--span", type=int,
                   help="racks a job spans, one rank in each (default: all)")
    p.add_argument("--size", default="8M")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--backends", default="planned,cadence,gloo,mpi")
    p.add_argument("--algo", default="ring",
                   help="cadence's allreduce algorithm (ring: as gloo's at these sizes, and "
                        "one peer a rank: every stream busy at once)")
    p.add_argument("--bad-uplink", metavar="RACK:SPINE",
                   help="that uplink at a tenth of --rate from the start (before the planner "
                        "probes)")
    p.add_argument("--cut", metavar="RACK:SPINE",
                   help="cut that uplink when job 0 reports iteration --cut-at")
    p.add_argument("--cut-at", type=int, default=5)
    p.add_argument("--json", metavar="FILE", help="every run's figures, for later tables")
    p.add_argument("--plot", metavar="PNG",
                   help="each uplink's load over time in the first trial, a panel per "
                        "backend (uplinks read every 0.5 s)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    p.add_argument("--logs", metavar="DIR",
                   help="write each rank's output there, a file per trial, backend, job "
                        "and rank (with CADENCE_DEBUG=INFO: each planned stream's port)")
    a = p.parse_args()

    from cadence import testbed
    from cadence.cli import planner as planner_cli
    from cadence.units import parse_rate, parse_size

    size = parse_size(a.size)
    backends = a.backends.split(",")
    name = f"ecmp{os.getpid() % 10000}"
    hosts = a.racks * a.per_rack
    cluster = testbed.build(name, hosts, 1, a.rate, racks=a.racks, spines=a.spines,
                            uplink_rate=a.rate, placement="blocked")  # fmt: skip
    testbed.up(cluster)
    rate = parse_rate(a.rate) / 8
    if a.bad_uplink:
        r, m = map(int, a.bad_uplink.split(":"))
        testbed.set_uplink(cluster, r, m, rate=str(parse_rate(a.rate) // 10))
    try:
        planner = None
        if "planned" in backends:
            planner_cli.start(name)
            planner = {"CADENCE_PLANNER": f"unix:{testbed.cluster.planner_socket(name)}",
                       "CADENCE_PLANNER_TOKEN_FILE": str(testbed.cluster.planner_token(name))}
        racks = [cluster.rack_hosts(r) for r in range(a.racks)]
        span = a.span or a.racks
        if a.racks % span:
            raise SystemExit(f"--span {span} does not divide --racks {a.racks}")
        # Job (i, b): host i of each rack of block b (racks b*span ...).
        groups = [[racks[b * span + r][i] for r in range(span)]
                  for i in range(a.per_rack) for b in range(a.racks // span)]  # fmt: skip
        if a.jobs > len(groups):
            raise SystemExit(f"at most {len(groups)} jobs of {span} racks fit")
        groups = groups[:a.jobs]
        bad = f"; uplink {a.bad_uplink} at a tenth" if a.bad_uplink else ""
        print(f"{hosts} hosts in {a.racks} racks x {a.spines} spines at {a.rate} (uplinks "
              f"too){bad}; {a.jobs} jobs of {span} ranks (one a rack), allreduce "
              f"{a.size} x {a.iters} ({a.algo}); the links' payload limit "
              f"{rate / 1e6:.1f} MB/s", flush=True)  # fmt: skip
        # What one flow carries on these links: TCP's payload at MTU 1500,
        # or, where they can be measured alone, the disjoint flows' median.
        healthy = rate * TCP_PAYLOAD
        if a.per_rack == a.spines:
            from cadence.planner import probe

            flows = probe.disjoint_flows(cluster)
            healthy = statistics.median(x.rate for x in flows)
            worst = min(x.rate / rate for x in flows)
            print(f"{len(flows)} pinned disjoint flows at once: each "
                  f"{min(x.rate for x in flows) / 1e6:.2f}-{max(x.rate for x in flows) / 1e6:.2f}"
                  f" MB/s, the slowest {worst:.0%} of the payload limit", flush=True)
        solo, _ = run_jobs(cluster, groups[:1], backends[0], size, a.iters, planner, a.algo)
        solo_bw = statistics.median(x["busbw"] for x in solo[0])
        print(f"solo ({backends[0]}): {solo_bw / 1e6:.2f} MB/s busbw "
              f"({solo_bw / rate:.0%} of the link)", flush=True)
        # A bad uplink is no uplink to balance over; with two racks the
        # other rack's uplink to that spine leads only to it (the planner
        # leaves both idle).
        skip: frozenset = frozenset()
        if a.bad_uplink:
            r, m = map(int, a.bad_uplink.split(":"))
            skip = frozenset({(r, m), (1 - r, m)} if a.racks == 2 else {(r, m)})
        summary: dict[str, list] = {b: [] for b in backends}
        plotted: list[tuple[str, Sampler, float | None]] = []
        for trial in range(a.trials):
            for k in range(len(backends)):
                b = backends[(trial + k) % len(backends)]
                cut = None
                if a.cut:
                    cut = Cut(cluster, *map(int, a.cut.split(":")), a.cut_at)
                sampler = Sampler(cluster, 0.5) if a.plot and trial == 0 else None
                logs = None
                if a.logs:
                    Path(a.logs).mkdir(parents=True, exist_ok=True)
                    logs = Path(a.logs) / f"trial{trial}.{b}."
                try:
                    res, moved = run_jobs(cluster, groups, b, size, a.iters, planner, a.algo,
                                          cut, sampler, logs)  # fmt: skip
                finally:
                    if cut is not None:
                        cut.restore()
                if sampler is not None:
                    plotted.append((b, sampler, cut.t if cut is not None else None))
                if cut is not None:
                    summary[b].append(_after_cut(b, trial, res, moved, cut, healthy, a.spines))
                    continue
                per_job = [statistics.median(x["busbw"] for x in r) for r in res]
                row = {"jobs": per_job, "aggregate": sum(per_job),
                       "spread": max(per_job) / min(per_job), "uplink": _balance(moved, skip),
                       "worst_vs_solo": min(per_job) / solo_bw}
                # With a bad uplink: each job's first iteration against the
                # ideal without it ((spines - 1) / spines of a healthy flow).
                ideal = healthy * (a.spines - 1) / a.spines
                row["first_vs_ideal"] = min(r[0]["busbw"] for r in res) / ideal
                row["vs_ideal"] = min(per_job) / ideal
                summary[b].append(row)
                first = (f"; slowest job / ideal {row['vs_ideal']:.0%}; first iterations / ideal "
                         + " ".join(f"{r[0]['busbw'] / ideal:.0%}" for r in res)
                         if a.bad_uplink else "")
                print(f"trial {trial} {b:>8}: jobs " +
                      " ".join(f"{x / 1e6:.2f}" for x in per_job) +
                      f" MB/s; aggregate {row['aggregate'] / 1e6:.2f}; fastest/slowest "
                      f"{row['spread']:.2f}; uplink max/mean {row['uplink']:.2f}; slowest/solo "
                      f"{row['worst_vs_solo']:.0%}{first}", flush=True)  # fmt: skip
                print("    up MB by (rack, spine): " + " ".join(
                    f"{r}.{m}:{v / 1e6:.0f}" for (r, m), v in sorted(moved.items())))
        print()
        if plotted:
            plot(a.plot, sorted(plotted, key=lambda x: backends.index(x[0])), rate * TCP_PAYLOAD)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"args": vars(a), "healthy": healthy, "solo": solo_bw,
                           "runs": summary}, fh, indent=1)  # fmt: skip
        if a.cut:
            _cut_table(summary)
            return 0
        if a.bad_uplink:
            print("| backend | slowest job / ideal, worst | its first iteration / ideal, worst |")
            print("|---|---|---|")
            for b, rows in summary.items():
                print(f"| {b} | {min(r['vs_ideal'] for r in rows):.0%} | "
                      f"{min(r['first_vs_ideal'] for r in rows):.0%} |")
            print()
        print("| backend | aggregate MB/s (mean) | slowest job / solo (worst) | fastest/slowest "
              "(worst) | uplink max/mean (worst) |")
        print("|---|---|---|---|---|")
        for b, rows in summary.items():
            print(f"| {b} | {statistics.mean(r['aggregate'] for r in rows) / 1e6:.2f} | "
                  f"{min(r['worst_vs_solo'] for r in rows):.0%} | "
                  f"{max(r['spread'] for r in rows):.2f} | "
                  f"{max(r['uplink'] for r in rows):.2f} |")
        if "planned" in summary and "gloo" in summary:
            ratio = (statistics.mean(r["aggregate"] for r in summary["planned"]) /
                     statistics.mean(r["aggregate"] for r in summary["gloo"]))
            print(f"planned aggregate / gloo's: {ratio:.2f}x")
    finally:
        if not a.keep:
            planner_cli.stop(name, forget=True)
            testbed.down(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
