"""The live slowness judge at thousands of ranks, on the window records the
simulator leaves, without thousands of processes.

A job of n ranks on hosts of `--per-host` makes `--calls` allreduces of
`--size` bytes back to back (the library's choice of algorithm, its own
schedules) on a modeled cluster, with a fault from the start:

- `none`: nothing (every verdict must be healthy: a false alarm otherwise);
- `slow-nic`: a host drawn at random whose NIC passes 1/4 to 1/8 of its
  rate both ways: `comm_slow` naming that host's NIC, and nothing that does
  not touch it;
- `slow-rank`: a rank drawn at random that enters every call late by a
  fifth to a third of a clean call's simulated time: `noncomm_slow` naming
  that rank alone.

The run's simulated time is cut into windows (`SimRecording.window`: per
rank what `Comm.dump_window` would return), each of `--window-calls` to
+2 calls' time with the job starting at a random point of the first, so
that the first window holds the judge's warm-up and 10 collectives after
it, and the second 10 more: what SlowWatch needs to report (PERSIST_WINDOWS
windows in a row with MIN_COLLECTIVES each). Every window then goes through
the live path's steps (live.py `_windows`):

1. every rank: `encode_rank(rank_summary(parse(record)))` (bytes per rank;
   `--jobs` processes run the ranks' steps, as the ranks run them at once);
2. every host's leader: its ranks' summaries decoded, `host_summary`,
   `encode_host` (CPU per leader, bytes per host);
3. rank 0: the host summaries decoded and fed to one `SlowWatch` per job,
   a window skipped where some rank published nothing (CPU per window).

The verdict in force after the last window is judged. The simulator has no
noise: the clean runs differ only in where the windows cut the one clean
run of each size (it is simulated once).

    python -m cadence.bench.sim_slowness --ranks 1024,4096 --trials 20
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from cadence.bench.judge import slope
from cadence.diagnosis.dumps import parse
from cadence.diagnosis.slow import SlowWatch
from cadence.diagnosis.summary import (
    MIN_MSG_BYTES,
    decode_host,
    decode_rank,
    encode_host,
    encode_rank,
    host_summary,
    rank_summary,
)
from cadence.units import fmt_bytes, format_size, parse_size

FAULTS = ("none", "slow-nic", "slow-rank")
#: A slow NIC passes this share of its rate (drawn uniformly).
NIC_SHARE = (1 / 8, 1 / 4)
#: A late rank's delay before each call, as a share of a clean call's time.
LATE_SHARE = (1 / 5, 1 / 3)
#: Calls' time the first window holds after the job's start, at least: the
#: judge's 5 warm-up collectives and 10 more, and half a call so that no
#: call ends on a window's edge.
FIRST_WINDOW_CALLS = 15.5


@dataclass
class Window:
    """One window rank 0 judged: a rank's summary (the median of the
    ranks'), a host's (median), a leader's CPU (median), rank 0's CPU, the
    collectives in it."""

    rank_bytes: float
    host_bytes: float
    leader_s: float
    judge_s: float
    colls: int


@dataclass
class Trial:
    fault: str
    culprit: object
    right: bool
    verdict: str
    sim_s: float
    windows: list[Window]


@dataclass
class Figures:
    nranks: int
    algo: str = ""
    call_ms: float = 0.0
    trials: list[Trial] = field(default_factory=list)

    def of(self, fault: str | None = None) -> tuple[list[Trial], list[Window]]:
        ts = [t for t in self.trials if fault is None or t.fault == fault]
        return ts, [w for t in ts for w in t.windows]


def cluster(nranks: int, per_host: int, nic: str):
    from cadence._core import SimCluster

    spec = {"version": 1, "kind": "cadence-cluster",
            "note": f"{nranks} ranks, hosts of {per_host}",
            "hosts": nranks // per_host, "ranks_per_host": per_host,
            "nic": {"count": 1, "rate": nic, "latency_us": 5.0, "overhead_us": 2.0}}
    return SimCluster(json.dumps(spec), "<cadence.bench.sim_slowness>", None)


def draw(rng: random.Random, fault: str, nranks: int, nhosts: int, call_s: float):
    """(the fault's dict for the simulator, its culprit)."""
    if fault == "slow-nic":
        host = rng.randrange(nhosts)
        return {"kind": "slow-nic", "host": host, "factor": rng.uniform(*NIC_SHARE)}, f"h{host}"
    if fault == "slow-rank":
        rank = rng.randrange(nranks)
        return {"kind": "slow-rank", "rank": rank,
                "delay": rng.uniform(*LATE_SHARE) * call_s}, rank
    return None, None


def judged(fault: str, culprit, v, per_host: int) -> bool:
    """Whether the verdict names the fault's class and culprit, and blames
    nothing else: for a slow NIC, no other host's side (its ranks) and no
    link that does not touch the host."""
    if fault == "none":
        return v is None
    if v is None:
        return False
    if fault == "slow-rank":
        return v.cls == "noncomm_slow" and v.ranks == [culprit]
    h = int(culprit[1:])
    mine = list(range(h * per_host, (h + 1) * per_host))
    touches = all(a // per_host == h or b // per_host == h for a, b in v.links)
    return v.cls == "comm_slow" and v.ranks == mine and touches


def publish(item: tuple[int, str]) -> tuple[str, bytes]:
    """A rank's step: its window record summarized and encoded, and its host."""
    r, text = item
    s = rank_summary(parse(text, f"rank {r}'s window"))
    return s.host, encode_rank(s)


def live_path(rec, nranks: int, window_s: float, phase_s: float, dump_after_s: float,
              pool=None):
    """Every window of the recording through the live path's three steps
    (the ranks' own in `pool`'s processes, as every rank runs it at once):
    the verdict in force after the last, and the windows judged."""
    watch = SlowWatch()
    judged = []
    for k in range(rec.count(window_s, phase_s)):
        texts = rec.window(k, window_s, phase_s, MIN_MSG_BYTES, dump_after_s)
        # A rank that completed nothing in the window publishes nothing.
        mine = [(r, t) for r, t in enumerate(texts) if t is not None]
        del texts
        done = pool.imap(publish, mine, chunksize=64) if pool else map(publish, mine)
        blobs: dict[str, list[bytes]] = {}
        sizes = []
        for host, b in done:
            sizes.append(len(b))
            blobs.setdefault(host, []).append(b)
        del mine
        leaders, host_blobs = [], []
        for bs in blobs.values():
            t = time.thread_time()
            host_blobs.append(encode_host(host_summary([decode_rank(b) for b in bs])))
            leaders.append(time.thread_time() - t)
        if len(sizes) < nranks:
            continue  # as rank 0 does: a rank with nothing in the window
        t = time.thread_time()
        hosts = [decode_host(b) for b in host_blobs]
        watch.feed(hosts)
        judge_s = time.thread_time() - t
        judged.append(Window(statistics.median(sizes), statistics.median(map(len, host_blobs)),
                             statistics.median(leaders), judge_s,
                             len({s for h in hosts for s in h.colls.seq.tolist()})))
    return watch.current, judged


def run(nranks: int, a, log=print) -> Figures:
    """Every fault's trials on a job of `nranks` ranks."""
    sim = cluster(nranks, a.per_host, a.nic)
    nhosts = nranks // a.per_host
    count = max(1, a.size // 4)
    rng = random.Random(a.seed + nranks)
    fig = Figures(nranks)

    def record(fault):
        t = time.perf_counter()
        rec = sim.recording("allreduce", count, 4, a.calls, fault)
        return rec, time.perf_counter() - t

    clean, clean_s = record(None)
    fig.algo = clean.algo
    call_s = clean.seconds / a.calls
    fig.call_ms = call_s * 1e3
    plan = [(f, *draw(rng, f, nranks, nhosts, call_s)) for f in a.faults
            for _ in range(a.trials)]
    # The next run is simulated (the GIL let go) while this one is judged.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ahead = None
        for i, (fault, spec, culprit) in enumerate(plan):
            if fault == "none":
                rec, sim_s = clean, clean_s
            else:
                rec, sim_s = (ahead or pool.submit(record, spec)).result()
            ahead = next((pool.submit(record, s) for f, s, _ in plan[i + 1:i + 2]
                          if f != "none"), None)
            call = rec.seconds / a.calls
            calls = rng.uniform(FIRST_WINDOW_CALLS, FIRST_WINDOW_CALLS + 2.0)
            window_s = calls * call
            phase_s = rng.uniform(0.0, (calls - FIRST_WINDOW_CALLS) * call)
            v, windows = live_path(rec, nranks, window_s, phase_s, a.dump_after, a.pool)
            del rec
            ok = judged(fault, culprit, v, a.per_host)
            text = "healthy" if v is None else v.headline
            fig.trials.append(Trial(fault, culprit, ok, text, sim_s, windows))
            log(f"  n={nranks} {fault:9} #{i % a.trials + 1:2} culprit {culprit}: "
                f"{'right' if ok else 'WRONG'}: {text[:160]} ({sim_s:.1f}s sim)")
    return fig


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(figs: list[Figures], faults: list[str]) -> int:
    """Prints a row per size and fault; returns the wrong verdicts."""
    print(f"{'n':>6} {'algo':>13} {'call':>8} {'fault':>9} {'right':>6} {'rank sum.':>10} "
          f"{'host sum.':>10} {'leader':>8} {'judge/window':>15} {'colls':>6} {'sim/run':>8}",
          flush=True)
    wrong = 0
    for f in figs:
        for fault in faults:
            ts, ws = f.of(fault)
            right = sum(t.right for t in ts)
            wrong += len(ts) - right
            what = f"{right}/{len(ts)}" if fault != "none" else f"{len(ts) - right} FA"
            judge = [w.judge_s for w in ws]
            print(f"{f.nranks:>6} {f.algo:>13} {f.call_ms:>6.1f}ms {fault:>9} {what:>6} "
                  f"{fmt_bytes(_med([w.rank_bytes for w in ws]), short=True):>10} "
                  f"{fmt_bytes(_med([w.host_bytes for w in ws]), short=True):>10} "
                  f"{_med([w.leader_s for w in ws]) * 1e3:>6.1f}ms "
                  f"{_med(judge):>6.3f}s ({max(judge, default=0):.3f}) "
                  f"{_med([w.colls for w in ws]):>6.0f} {_med([t.sim_s for t in ts]):>7.1f}s",
                  flush=True)
    return wrong


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence.bench.sim_slowness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1024,4096", help="job sizes, a comma list (1024,4096)")
    p.add_argument("--per-host", type=int, default=8, help="ranks per host (8)")
    p.add_argument("--nic", default="100gbit", help="every host's NIC rate (100gbit)")
    p.add_argument("--size", default="64M", help="bytes per allreduce (64M)")
    p.add_argument("--calls", type=int, default=30, help="calls per run (30)")
    p.add_argument("--trials", type=int, default=20, help="runs per fault class (20)")
    p.add_argument("--fault", default=",".join(FAULTS),
                   help=f"fault classes, a comma list ({','.join(FAULTS)})")
    p.add_argument("--dump-after", type=float, default=0.0,
                   help="seconds after a window's end its records are taken (0)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes for the ranks' own step (this machine's cores)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    a.faults = [f for f in a.fault.split(",") if f]
    bad = [f for f in a.faults if f not in FAULTS]
    if bad:
        p.error(f"unknown fault {bad[0]!r} (one of {', '.join(FAULTS)})")
    a.size = parse_size(a.size)
    sizes = [int(x) for x in a.ranks.split(",") if x]
    if any(n % a.per_host for n in sizes):
        p.error(f"every --ranks must be a multiple of --per-host {a.per_host}")
    least = int(FIRST_WINDOW_CALLS + 2 + 11.5)
    if a.calls < least:
        p.error(f"--calls must be ≥ {least}: two windows of 10 collectives after the judge's "
                "warm-up, and a call to spare in the second")
    t0 = time.perf_counter()
    figs = []
    # Forked before any run is recorded: the workers hold no recording.
    workers = multiprocessing.get_context("fork").Pool(a.jobs) if a.jobs > 1 else None
    with workers or contextlib.nullcontext() as a.pool:
        for n in sizes:
            print(f"n = {n}: {n // a.per_host} hosts of {a.per_host}, {a.nic} NICs, allreduce "
                  f"of {format_size(a.size)} x {a.calls}, {a.trials} trials of "
                  f"{', '.join(a.faults)}", flush=True)
            figs.append(run(n, a, log=lambda s: print(s, flush=True)))
            table(figs[-1:], a.faults)
    print()
    wrong = table(figs, a.faults)
    if len(figs) > 1:
        xs = [f.nranks for f in figs]
        ws = [f.of()[1] for f in figs]
        med = lambda attr: [_med([getattr(w, attr) for w in x]) for x in ws]  # noqa: E731
        print(f"log-log slope against n: a rank's summary {slope(xs, med('rank_bytes')):.2f}, "
              f"a host's {slope(xs, med('host_bytes')):.2f}, a leader's CPU "
              f"{slope(xs, med('leader_s')):.2f}, rank 0's CPU per window "
              f"{slope(xs, med('judge_s')):.2f}")
    print(f"(FA: false alarms among the clean runs; judge: rank 0's CPU per window, median "
          f"(max); colls: collectives per window (median); sim: a run's simulation, beside "
          f"the judging of the one before; {(time.perf_counter() - t0) / 60:.1f} min in all)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
