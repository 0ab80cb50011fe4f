"""What the live slowness judge costs at thousands of ranks, and whether
it names the culprit there, without thousands of processes: the window
summaries a job of n ranks would publish (summary.py's own format), made up
for a ring of allreduces on hosts of `--per-host` ranks, go through the
live path's three steps, timed apart:

1. every rank: its summary, encoded (bytes per rank);
2. every host's leader: its ranks' summaries decoded, reduced and encoded
   (CPU per leader, bytes per host);
3. rank 0: the host summaries decoded and judged (CPU per window).

    python -m cadence.bench.judge --ranks 1024,4096,8192
    python -m cadence.bench.judge --ranks 1024,4096 --trials 20 --noise

Faults (`--fault`, each run `--trials` times with a culprit drawn at
random): `none`; `slow_link`, one host's TCP link to the next at a fourth
to an eighth of the others' rate (the classifier's bar is 0.3x: a link
slowed by less than ~2.5x is not named, docs/diagnosis.md); `slow_host`,
a host whose NIC is at that share both ways; `straggler`, a rank that
arrives 30-60 ms late at every collective (a fifth to a third of the job's
time). `--noise`: every
message's time varies by ±30 %, every arrival by 0-3 ms, and a rank pauses
30 ms before 5 % of its collectives. Says whether each verdict names the
fault's class and culprit, and prints the log-log slope of each figure
against n.
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
FAULTS = ("none", "slow_link", "slow_host", "straggler")


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
    #: The host (slow_link: the sending end; slow_host) or the rank
    #: (straggler) at fault, how slow (a share of the rate), how late (s).
    culprit: int = 0
    share: float = 0.2
    late_s: float = 0.03
    noise: bool = False
    seed: int = 1

    def host(self, r: int) -> str:
        return f"h{r // self.per_host}"


def _rate(job: Job, src: int, dst: int) -> float:
    hs, hd = job.host(src), job.host(dst)
    if hs == hd:
        return 40 * GBIT
    bad = f"h{job.culprit}"
    slow = ((job.fault == "slow_host" and bad in (hs, hd))
            or (job.fault == "slow_link" and hs == bad))
    return GBIT * job.share if slow else GBIT


def rank_summaries(job: Job) -> list[RankSummary]:
    """Every rank's summary of one window: `colls` allreduces, each
    receiving from the rank before it in the ring (the last rank of the
    previous host over TCP, else shared memory); a collective starts once
    its last rank arrived and ends when its slowest link is done."""
    rng = random.Random(job.seed)
    n = job.nranks
    out = []
    slowest = max(job.nbytes / _rate(job, (r - 1) % n, r) for r in range(0, n, job.per_host))
    late = job.late_s if job.fault == "straggler" else 0.0
    period = 0.005 + late + slowest * 1.3 + 0.040
    for r in range(n):
        src = (r - 1) % n
        rate = _rate(job, src, r)
        colls, received = [], []
        for k in range(job.colls):
            seq = 100 + k
            start = BASE_S + k * period + rng.uniform(0, 0.003 if job.noise else 0.002)
            if job.noise and rng.random() < 0.05:
                start += 0.030
            if r == job.culprit and job.fault == "straggler":
                start += late
            go = BASE_S + k * period + 0.002 + late + (0.030 if job.noise else 0.0)
            jitter = rng.uniform(0.7, 1.3) if job.noise else rng.uniform(0.9, 1.1)
            dur = job.nbytes / rate * jitter
            end = go + slowest * 1.3 + 0.001
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
    bad = f"h{job.culprit}"
    if job.fault == "none":
        right = v is None
    elif job.fault == "slow_link":
        last = (job.culprit + 1) * job.per_host - 1  # sends across to the next host
        right = (v is not None and v.cls == "comm_slow"
                 and v.links == [(last, (last + 1) % job.nranks)])
    elif job.fault == "slow_host":
        right = v is not None and v.cls == "comm_slow" and v.hosts == [bad]
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
    p.add_argument("--fault", default=",".join(FAULTS),
                   help=f"faults to run, comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--trials", type=int, default=1, help="trials per size and fault, each "
                   "with its own culprit and seed (1: the culprit a third of the way in)")
    p.add_argument("--noise", action="store_true", help="noisy rates and arrivals, pauses")
    p.add_argument("--seed", type=int, default=1)
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
            rng = random.Random(f"{args.seed}/{n}/{f}")
            figs = []
            for t in range(args.trials):
                job = Job(n, args.per_host, args.colls, fault=f, noise=args.noise,
                          seed=rng.randrange(1 << 30))
                if f in ("slow_link", "slow_host"):
                    job.culprit = hosts // 3 if args.trials == 1 else rng.randrange(hosts)
                    job.share = 0.2 if args.trials == 1 else rng.choice([0.25, 0.2, 0.125])
                elif f == "straggler":
                    job.culprit = n // 3 + 1 if args.trials == 1 else rng.randrange(n)
                    job.late_s = 0.03 if args.trials == 1 else rng.uniform(0.03, 0.06)
                fig = run(job)
                figs.append(fig)
                if not fig.right or args.trials == 1:
                    print(f"n={n:5d} {f:9s} #{t}: {'right' if fig.right else 'WRONG'}: "
                          f"{fig.verdict[:120]}", flush=True)
            right = sum(x.right for x in figs)
            wrong += len(figs) - right
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            fig = Figures(n, med([x.rank_bytes for x in figs]), med([x.host_bytes for x in figs]),
                          med([x.leader_cpu_s for x in figs]), med([x.judge_cpu_s for x in figs]),
                          "", right == len(figs))
            rows[f].append(fig)
            print(f"n={n:5d} {f:9s}: {right}/{len(figs)} right; rank summary "
                  f"{fig.rank_bytes / 1024:.2f} KiB, host summary {fig.host_bytes / 1024:.1f} KiB, "
                  f"leader {fig.leader_cpu_s * 1e3:.1f} ms, rank 0 judge {fig.judge_cpu_s:.3f} s "
                  f"CPU (medians)", flush=True)
    if len(sizes) > 1:
        for f, figs in rows.items():
            ns = [float(x.nranks) for x in figs]
            print(f"slopes ({f}): rank summary {slope(ns, [x.rank_bytes for x in figs]):.2f}, "
                  f"leader CPU {slope(ns, [x.leader_cpu_s for x in figs]):.2f}, judge CPU "
                  f"{slope(ns, [x.judge_cpu_s for x in figs]):.2f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
