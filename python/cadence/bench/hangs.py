"""The hang classifier at thousands of ranks, on records the simulator
leaves (`cadence sim --records`), without thousands of processes.

A job of n ranks on hosts of `--per-host` makes `--calls` allreduces of
`--size` bytes (the library's choice of algorithm, its own schedules) on a
modeled cluster; in the last call a fault strikes:

- `none`: nothing (every verdict must be healthy: a false alarm otherwise);
- `stop`: a rank drawn at random never makes the call (it is stuck in its
  own code): `noncomm_hang` naming that rank;
- `hung-link`: data from a rank drawn at random to one of the peers it
  sends to in that call (on another host when it has one) stops:
  `comm_hang` naming that link.

Every rank's record is what the live watchdog's round summary carries
(`live.summary`: the stuck operation with its messages as runs, every rank
listed in rank 0's only), taken the soft deadline after the job stalled.
The classifier (`cadence doctor`'s and the live coordinator's) runs on all
of them; the run says whether each verdict names the fault's class and
culprit, what a rank's record weighs (JSON, and zlib as a round sends it),
and the coordinator's CPU: parsing and judging every rank's record.

    python -m cadence.bench.hangs --ranks 1024,4096 --trials 20
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import zlib
from dataclasses import dataclass, field

from cadence.bench.judge import slope
from cadence.diagnosis.classify import diagnose
from cadence.diagnosis.dumps import parse
from cadence.units import fmt_bytes, format_size, parse_size

FAULTS = ("none", "stop", "hung-link")
#: The soft deadline the records are taken at (live.DEFAULT_DIAG_AFTER).
HANG_AFTER_S = 30.0


@dataclass
class Trial:
    fault: str
    culprit: object
    cls: str
    right: bool
    headline: str


@dataclass
class Figures:
    nranks: int
    size: int
    algo: str = ""
    trials: list[Trial] = field(default_factory=list)
    sim_s: list[float] = field(default_factory=list)
    judge_s: list[float] = field(default_factory=list)
    #: Of the runs that stalled: a rank's record (the median of ranks
    #: 1-64) and rank 0's (it lists every rank), in JSON; a rank's
    #: compressed as a round sends it.
    json_bytes: list[float] = field(default_factory=list)
    rank0_bytes: list[float] = field(default_factory=list)
    zlib_bytes: list[float] = field(default_factory=list)


def cluster(nranks: int, per_host: int):
    from cadence._core import SimCluster

    spec = {"version": 1, "kind": "cadence-cluster",
            "note": f"{nranks} ranks, hosts of {per_host}",
            "hosts": nranks // per_host, "ranks_per_host": per_host,
            "nic": {"count": 1, "rate": "100gbit", "latency_us": 5.0, "overhead_us": 2.0}}
    return SimCluster(json.dumps(spec), "<cadence.bench.hangs>", None)


def draw(rng: random.Random, fault: str, sim, nranks: int, per_host: int, count: int,
         elem: int, call: int) -> tuple[dict | None, object]:
    """A fault of kind `fault` in call `call`, and its culprit."""
    if fault == "none":
        return None, None
    if fault == "stop":
        r = rng.randrange(nranks)
        return {"kind": "stop", "rank": r, "call": call}, r
    # A link between hosts (a network's), when one of 64 ranks drawn sends
    # across hosts; else one inside a host.
    inside = None
    for _ in range(64):
        src = rng.randrange(nranks)
        peers = sim.sends_to("allreduce", count, elem, src)
        away = [p for p in peers if p // per_host != src // per_host]
        if away:
            inside = (src, rng.choice(away))
            break
        if peers and inside is None:
            inside = (src, rng.choice(peers))
    if inside is None:
        raise RuntimeError("no rank of 64 drawn sends to any other")
    src, dst = inside
    return {"kind": "hung-link", "src": src, "dst": dst, "call": call}, (src, dst)


def judged(fault: str, culprit, v) -> bool:
    if fault == "none":
        return v.cls == "healthy"
    if fault == "stop":
        return v.cls == "noncomm_hang" and v.ranks == [culprit]
    return v.cls == "comm_hang" and sorted(map(tuple, v.links)) == [tuple(culprit)]


def run(nranks: int, per_host: int, size: int, calls: int, trials: int, faults, seed: int,
        log=print) -> Figures:
    sim = cluster(nranks, per_host)
    elem = 4
    count = max(1, size // elem)
    rng = random.Random(seed)
    fig = Figures(nranks, size)
    for fault in faults:
        for t in range(trials):
            spec, culprit = draw(rng, fault, sim, nranks, per_host, count, elem, calls - 1)
            t0 = time.perf_counter()
            texts = sim.records("allreduce", count, elem, calls, spec, HANG_AFTER_S)
            t1 = time.perf_counter()
            dumps = [parse(text, f"rank {r}'s record") for r, text in enumerate(texts)]
            v = diagnose(dumps, hang_after=HANG_AFTER_S * 0.9)
            t2 = time.perf_counter()
            fig.sim_s.append(t1 - t0)
            fig.judge_s.append(t2 - t1)
            if spec is not None:  # a round's records: the job stalled
                sample = [x.encode() for x in texts[1:65]]
                fig.json_bytes.append(_median([len(x) for x in sample]))
                fig.zlib_bytes.append(_median([len(zlib.compress(x, 6)) for x in sample]))
                fig.rank0_bytes.append(len(texts[0].encode()))
            fig.algo = fig.algo or (dumps[0].ops[-1].algo if dumps[0].ops else "")
            ok = judged(fault, culprit, v)
            fig.trials.append(Trial(fault, culprit, str(v.cls), ok, v.headline))
            mark = "right" if ok else "WRONG"
            log(f"  n={nranks} {fault:9} #{t + 1:2} culprit {culprit}: {mark}: {v.cls} "
                f"({t1 - t0:.1f}s sim, {t2 - t1:.2f}s judge)")
            if not ok:
                log(f"    {v.headline}")
    return fig


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _bytes(xs: list[float]) -> str:
    return fmt_bytes(_median(xs), short=True) if xs else "-"


def _span(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence.bench.hangs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096", help="job sizes, a comma list (1024,4096)")
    p.add_argument("--per-host", type=int, default=8, help="ranks per host (8)")
    p.add_argument("--size", default="64K,16M",
                   help="bytes per allreduce, a comma list (64K,16M)")
    p.add_argument("--calls", type=int, default=3, help="calls; the fault is in the last (3)")
    p.add_argument("--trials", type=int, default=20, help="faults drawn per class (20)")
    p.add_argument("--fault", default=",".join(FAULTS),
                   help=f"fault classes, a comma list ({','.join(FAULTS)})")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    faults = [f for f in a.fault.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        p.error(f"unknown fault {bad[0]!r} (one of {', '.join(FAULTS)})")
    if a.calls < 2:
        p.error("--calls must be 2 or more: the records need a call before the fault")
    sizes = [int(x) for x in a.ranks.split(",") if x]  # job sizes
    if any(n % a.per_host for n in sizes):
        p.error(f"every --ranks must be a multiple of --per-host {a.per_host}")
    figs = []
    for n in sizes:
        for size in [parse_size(x) for x in a.size.split(",") if x]:
            print(f"n = {n}: {n // a.per_host} hosts of {a.per_host}, allreduce of "
                  f"{format_size(size)} x {a.calls}, {a.trials} trials of {', '.join(faults)}",
                  flush=True)
            figs.append(run(n, a.per_host, size, a.calls, a.trials, faults, a.seed + n + size,
                            log=lambda s: print(s, flush=True)))
    print()
    print(f"{'n':>6} {'size':>6} {'algo':>18} {'right':>8} {'false alarms':>13} "
          f"{'a rank':>8} {'zlib':>6} {'rank 0':>8} {'sim s':>11} {'judge s':>11}")
    wrong = 0
    for f in figs:
        faulty = [t for t in f.trials if t.fault != "none"]
        clean = [t for t in f.trials if t.fault == "none"]
        right = sum(t.right for t in faulty)
        alarms = sum(not t.right for t in clean)
        wrong += len(faulty) - right + alarms
        print(f"{f.nranks:>6} {format_size(f.size):>6} {f.algo:>18} "
              f"{f'{right}/{len(faulty)}':>8} {f'{alarms}/{len(clean)}':>13} "
              f"{_bytes(f.json_bytes):>8} {_bytes(f.zlib_bytes):>6} {_bytes(f.rank0_bytes):>8} "
              f"{_span(f.sim_s):>11} {_span(f.judge_s):>11}")
        for fault in faults:
            ts = [t for t in f.trials if t.fault == fault]
            print(f"{'':>32} {fault}: {sum(t.right for t in ts)}/{len(ts)} right")
    for size in sorted({f.size for f in figs}):
        fs = [f for f in figs if f.size == size]
        if len(fs) > 1 and all(f.json_bytes for f in fs):
            xs = [f.nranks for f in fs]
            print(f"{format_size(size)}: log-log slope against n: a rank's record "
                  f"{slope(xs, [_median(f.json_bytes) for f in fs]):.2f}, the judge's CPU "
                  f"{slope(xs, [_median(f.judge_s) for f in fs]):.2f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
