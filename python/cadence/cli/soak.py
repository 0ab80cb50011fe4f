"""Random collectives on an emulated cluster while its links are cut and
throttled, every result checked, for a bounded time (needs root).

Jobs of random operations (every collective, random sizes including 0 and
odd ones, every dtype and op, forced algorithms and auto, sub-communicators
from split, batches of async operations) run one after the other on the
cluster; from outside, at random times, a host's link is cut for a while or
slowed. Expected: no wrong result, no hang, no crash; a cut either passes or
fails the job with a CommError on every rank; a failure only under a cut.
Progress every few seconds; a JSON summary at the end (also in
OUT/summary.json, with each job's output in OUT/job-NNNN.log). Exit status 1
if anything went wrong (see docs/soak.md).

examples:
  cadence soak --duration 300
  cadence soak --duration 1800 --hosts 3 --ranks-per-host 2 --seed 7
  cadence soak --duration 60 --fault-every 0          # no faults
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from cadence import testbed
from cadence.testbed import soak

NAME = "soak"
HELP = "random collectives on an emulated cluster under link faults, every result checked"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = soak.Config()
    p.add_argument("--duration", type=float, default=d.duration,
                   help=f"seconds to run; then the jobs stop and the summary follows "
                   f"({d.duration:g})")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    p.add_argument("--hosts", type=_positive, default=d.hosts, help=f"emulated hosts ({d.hosts})")
    p.add_argument("--ranks-per-host", type=_positive, default=d.ranks_per_host,
                   help=f"ranks per host ({d.ranks_per_host})")
    p.add_argument("--nics", type=_positive, default=d.nics, help=f"NICs per host ({d.nics})")
    p.add_argument("--rate", default=d.rate, help=f"link rate ({d.rate})")
    p.add_argument("--cluster", help="reuse this running cluster (left up at the end) "
                   "instead of making a fresh one")
    p.add_argument("--timeout", type=float, default=d.timeout,
                   help=f"CADENCE_TIMEOUT of the jobs, seconds ({d.timeout:g})")
    p.add_argument("--margin", type=float, default=d.margin,
                   help=f"seconds beyond the timeout before a silent rank is a hang ({d.margin:g})")
    p.add_argument("--startup", type=float, default=d.startup,
                   help=f"seconds a job's ranks may take to start ({d.startup:g})")
    p.add_argument("--fault-every", type=float, default=d.fault_every,
                   help=f"mean seconds between faults; 0: none ({d.fault_every:g})")
    p.add_argument("--first-cut", type=float, default=None, metavar="SECONDS",
                   help="make the first fault a cut past the timeout, this long after the "
                   "first job is running")
    p.add_argument("--slow-rates", default=",".join(d.slow_rates),
                   help=f"rates a slowed link runs at, one drawn per fault "
                   f"({','.join(d.slow_rates)})")  # fmt: skip
    p.add_argument("--max-count", type=_positive, default=d.max_count,
                   help=f"elements in an operation's largest buffer ({d.max_count})")
    p.add_argument("--out", type=Path, default=d.out,
                   help=f"directory for the job logs and summary.json ({d.out})")
    p.add_argument("--progress", type=float, default=d.progress,
                   help=f"seconds between progress lines ({d.progress:g})")
    p.add_argument("--json", type=Path, help="also write the summary here")


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    cfg = soak.Config(
        duration=args.duration, seed=seed, hosts=args.hosts, ranks_per_host=args.ranks_per_host,
        nics=args.nics, rate=args.rate, cluster=args.cluster, timeout=args.timeout,
        margin=args.margin, startup=args.startup, fault_every=args.fault_every,
        first_cut=args.first_cut, max_count=args.max_count, out=args.out,
        slow_rates=tuple(r.strip() for r in args.slow_rates.split(",") if r.strip()),
        progress=args.progress,
    )  # fmt: skip
    # The ranks run in sessions of their own: a SIGTERM (a CI deadline, `kill`)
    # unwinds like Ctrl-C, so that they, the faults and the cluster are cleaned up.
    # (SIGINT too: a shell's background job may have inherited it ignored.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        testbed.check_root()
        summary = soak.run(cfg)
    except testbed.TestbedError as e:
        print(f"cadence soak: {e}", file=sys.stderr)
        return 2
    lists = ("fault_log", "job_log", "wrong", "unexplained", "hung", "crashed")
    brief = {k: v for k, v in summary.items() if k not in lists}
    print(json.dumps(brief, indent=1))
    if summary["wrong"]:
        print("wrong results (first ones):", file=sys.stderr)
        for w in summary["wrong"][:10]:
            print(f"  job {w['job']} rank {w['rank']} step {w['step']}: {w['detail']}",
                  file=sys.stderr)
    for key, what in (("unexplained", "failures no cut explains"), ("hung", "hangs"),
                      ("crashed", "crashes")):  # fmt: skip
        if summary[key]:
            print(f"{what}:", file=sys.stderr)
            for item in summary[key][:10]:
                print(f"  {json.dumps(item)[:600]}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    verdict = "INTERRUPTED" if summary["interrupted"] else ("OK" if summary["ok"] else "FAILED")
    print(f"cadence soak: {verdict} (full summary: {cfg.out / 'summary.json'})")
    if summary["interrupted"]:
        return 130
    return 0 if summary["ok"] else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
