"""What the live slowness judge costs at thousands of ranks, without
thousands of processes: the window summaries a job of n ranks would publish
(summary.py's own format), made up for a ring of collectives on hosts of
`--per-host` ranks, go through the live path's three steps, timed apart:

1. every rank: its summary, encoded (bytes per rank);
2. every host's leader: its ranks' summaries decoded, reduced and encoded
   (CPU per leader, bytes per host);
3. rank 0: the host summaries decoded and judged (CPU per window).

    python -m cadence.bench.judge --ranks 1024,4096,8192
    python -m cadence.bench.judge --ranks 1024 --fault slow_host

Each size runs a healthy window and the `--fault` ones (a host whose NIC is
at a fifth: `slow_host`; a rank late by 30 ms at every collective:
`straggler`) and says whether the verdict names the culprit. Prints the
figures and the log-log slope of each against n.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass

from cadence.diagnosis.summary import (
    CollRow,
    Counters,
    RankSummary,
    Received,
    decode_host,
    decode_rank,
    encode_host,
    encode_rank,
    host_summary,
)

BASE_S = 1_700_000_000.0
GBIT = 1e9 / 8
FAULTS = ("none", "slow_host", "straggler")


@dataclass
class Job:
    nranks: int
    per_host: int
    colls: int = 100
    #: Bytes each rank receives from its ring predecessor per collective,
    #: in `msgs` messages.
    nbytes: int = 4 << 20
    msgs: int = 4
    fault: str = "none"
    #: The host (slow_host) or rank (straggler) at fault.
    culprit: int = 0
    seed: int = 1

    def host(self, r: int) -> str:
        return f"h{r // self.per_host}"


def _rate(job: Job, src: int, dst: int) -> float:
    if job.host(src) == job.host(dst):
        return 40 * GBIT
    slow = job.fault == "slow_host" and f"h{job.culprit}" in (job.host(src), job.host(dst))
    return GBIT / 5 if slow else GBIT


def rank_summaries(job: Job) -> list[RankSummary]:
    """Every rank's summary of one window: `colls` allreduces, one every
    ~20 ms, each receiving from the rank before it in the ring (the last
    rank of the previous host over TCP, else shared memory)."""
    rng = random.Random(job.seed)
    n = job.nranks
    out = []
    slowest = job.nbytes / (GBIT / 5)
    period = 0.005 + slowest + 0.040
    for r in range(n):
        src = (r - 1) % n
        rate = _rate(job, src, r)
        colls, received = [], []
        for k in range(job.colls):
            seq = 100 + k
            start = BASE_S + k * period + rng.uniform(0, 0.002)
            if job.fault == "straggler" and r == job.culprit:
                start += 0.030
            go = BASE_S + k * period + 0.002 + (0.030 if job.fault == "straggler" else 0.0)
            dur = job.nbytes / rate * rng.uniform(0.9, 1.1)
            end = go + slowest + 0.001
            colls.append(CollRow(seq, "00000000000000aa", "allreduce", "float32",
                                 job.nbytes * 2, True, int((start - BASE_S) * 1e9),
                                 int((end - BASE_S) * 1e9), start, end))
            piece = dur / job.msgs
            spans = [(go + i * piece * 1.05, go + i * piece * 1.05 + piece)
                     for i in range(job.msgs)]
            received.append(Received(seq, src, job.nbytes, job.msgs, spans))
        peers = sorted({src, (r + 1) % n})
        links = [Counters(p, "tcp" if job.host(p) != job.host(r) else "shm",
                          job.nbytes * job.colls, job.msgs * job.colls) for p in peers]
        hosts = {p: job.host(p) for p in peers}
        hosts[r] = job.host(r)
        out.append(RankSummary("job1", "c1", r, n, job.host(r), 1000 + r, 0, 20_000, colls,
                               received, links, hosts))
    return out


@dataclass
class Figures:
    nranks: int
    rank_bytes: float
    host_bytes: float
    leader_cpu_s: float
    judge_cpu_s: float
    verdict: str
    right: bool


def run(job: Job) -> Figures:
    from cadence.diagnosis.slow import assess

    ranks = rank_summaries(job)
    blobs = [encode_rank(s) for s in ranks]
    rank_bytes = sum(map(len, blobs)) / len(blobs)
    by_host: dict[str, list[bytes]] = {}
    for s, b in zip(ranks, blobs, strict=True):
        by_host.setdefault(s.host, []).append(b)
    del ranks
    t = time.thread_time()
    host_blobs = [encode_host(host_summary([decode_rank(b) for b in bs]))
                  for bs in by_host.values()]
    leader = (time.thread_time() - t) / len(host_blobs)
    t = time.thread_time()
    v = assess([decode_host(b) for b in host_blobs], warmup=0).verdict
    judge = time.thread_time() - t
    text = "healthy" if v is None else v.headline
    if job.fault == "none":
        right = v is None
    elif job.fault == "slow_host":
        right = v is not None and v.cls == "comm_slow" and v.hosts == [f"h{job.culprit}"]
    else:
        right = v is not None and v.cls == "noncomm_slow" and v.ranks == [job.culprit]
    return Figures(job.nranks, rank_bytes, sum(map(len, host_blobs)) / len(host_blobs),
                   leader, judge, text, right)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-12)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence.bench.judge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096,8192", help="rank counts (comma-separated)")
    p.add_argument("--per-host", type=int, default=8, help="ranks per host")
    p.add_argument("--colls", type=int, default=100, help="collectives per window")
    p.add_argument("--fault", default="none,slow_host,straggler",
                   help=f"faults to run, comma-separated, of {', '.join(FAULTS)}")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",")]
    faults = args.fault.split(",")
    for f in faults:
        if f not in FAULTS:
            p.error(f"--fault {f}: not one of {', '.join(FAULTS)}")
    rows: dict[str, list[Figures]] = {f: [] for f in faults}
    wrong = 0
    for n in sizes:
        hosts = max(1, n // args.per_host)
        for f in faults:
            culprit = hosts // 3 if f == "slow_host" else n // 3 + 1
            fig = run(Job(n, args.per_host, args.colls, fault=f, culprit=culprit))
            rows[f].append(fig)
            wrong += not fig.right
            print(f"n={n:5d} {f:9s}: rank summary {fig.rank_bytes / 1024:6.2f} KiB, host "
                  f"summary {fig.host_bytes / 1024:7.1f} KiB, leader {fig.leader_cpu_s * 1e3:6.1f} "
                  f"ms, rank 0 judge {fig.judge_cpu_s:6.3f} s CPU; "
                  f"{'right' if fig.right else 'WRONG'}: {fig.verdict[:110]}", flush=True)
    if len(sizes) > 1:
        for f, figs in rows.items():
            ns = [float(x.nranks) for x in figs]
            print(f"slopes ({f}): rank summary {slope(ns, [x.rank_bytes for x in figs]):.2f}, "
                  f"leader CPU {slope(ns, [x.leader_cpu_s for x in figs]):.2f}, judge CPU "
                  f"{slope(ns, [x.judge_cpu_s for x in figs]):.2f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
