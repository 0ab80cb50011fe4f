"""Diagnoses a hung, failed or slow job from the dumps its ranks wrote: on
failure with CADENCE_DUMP_DIR=DIR, or on demand with Communicator.dump(DIR).

Matches every collective across ranks by (communicator, collective sequence
number, argument signature), finds the first one not completed by every
rank and says why:

  noncomm_hang  some ranks never entered it (or only after the others gave up)
  comm_hang     every rank entered, data stopped on some links (or on one rank)
  mismatch      the ranks called different operations

When everything completed, it looks at how fast:

  comm_slow     a link, or a host's NIC, moves data far slower than its peers
  noncomm_slow  a rank consistently arrives late at collectives (a straggler)
  healthy       none of the above

The verdict comes first, then its evidence. Exit status: 0 healthy, 1 a
problem was found, 2 the input could not be used or an output could not be
written (one line on stderr).

Reports, besides the text (docs/diagnosis.md, "Reports"):

  --trace FILE         Chrome/Perfetto trace: a track per rank (grouped by
                       host), a slice per operation and per message, on rank
                       0's clock; open it in ui.perfetto.dev or chrome://tracing
  --html FILE          one self-contained page: the verdict, the link matrix of
                       the stuck operation as a heatmap, the ranks' arrival
                       timeline of the last collectives, the evidence
  --exclude-file FILE  the culprit machines' host names, one per line (empty
                       when healthy, and for a mismatch), for the launcher

examples:
  cadence doctor /tmp/dumps
  cadence doctor /tmp/dumps --json | jq .ranks
  cadence doctor /tmp/dumps --html report.html --trace trace.json
  cadence doctor /tmp/dumps --exclude-file bad-hosts
  srun --exclude="$(paste -sd, bad-hosts)" ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys

NAME = "doctor"
HELP = "diagnose a hung, failed or slow job from its ranks' dumps"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dumpdir", metavar="DUMPDIR", nargs="?",
                   help="directory the ranks dumped into (cadence-<comm>-rank<r>.json files)")
    p.add_argument("--store", metavar="HOST:PORT",
                   help="ask a running job instead: the job's Store (MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--cluster", metavar="NAME",
                   help="ask a job started by `cadence cluster run` on emulated cluster NAME "
                   "(its store: host 0's address, --master-port; root)")
    p.add_argument("--master-port", type=int, default=29500,
                   help="with --cluster: the job's MASTER_PORT (29500, as cluster run uses)")
    p.add_argument("--prefix", default="cadence/init1",
                   help="with --store: the communicator's store prefix (cadence/init1: the "
                   "job's first cadence.init(); cadence/<name> for init(name=...))")
    p.add_argument("--gather", type=float, default=5.0, metavar="SECONDS",
                   help="with --store: how long to wait for the ranks' summaries (5)")
    p.add_argument("--json", action="store_true",
                   help="print the verdict as JSON: class, op, ranks, links, hosts, evidence")
    p.add_argument("--hang-after", type=float, default=10.0, metavar="SECONDS",
                   help="in dumps taken on demand, an operation still running for this long "
                   "counts as stuck (10)")
    p.add_argument("--skip-bad", action="store_true",
                   help="diagnose without dump files that cannot be read, instead of stopping")
    p.add_argument("--trace", metavar="FILE",
                   help="write a Chrome/Perfetto trace (JSON) of every rank's operations and "
                   "messages (open in ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML report: verdict, link matrix heatmap, "
                   "arrival timeline of the last collectives, evidence")
    p.add_argument("--exclude-file", metavar="FILE",
                   help="write the culprit machines' host names, one per line, for a launcher "
                   "to leave out on restart (empty when nothing is to blame)")


def _check_output(flag: str, path: str) -> str | None:
    """Why `path` cannot be written, before any work is done (None: it can)."""
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory; give a file name"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{flag} {path}: no such directory {parent}"
    if not os.access(parent, os.W_OK):
        return f"{flag} {path}: cannot write into {parent}"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{flag} {path}: not writable"
    return None


def run(args: argparse.Namespace) -> int:
    from cadence.diagnosis import HEALTHY, DumpError, diagnose, load_dir

    outputs = [(flag, path) for flag, path in (("--trace", args.trace), ("--html", args.html),
                                               ("--exclude-file", args.exclude_file)) if path]
    if outputs and (args.store or args.cluster):
        print(f"cadence doctor: {outputs[0][0]} reads a dump directory, not --store/--cluster "
              "(have the ranks dump with comm.dump(DIR) or CADENCE_DUMP_DIR)", file=sys.stderr)
        return 2
    for flag, path in outputs:
        err = _check_output(flag, path)
        if err is not None:
            print(f"cadence doctor: {err}", file=sys.stderr)
            return 2
    if args.cluster:
        return _ask_cluster(args)
    if args.store:
        return _ask_store(args)
    if not args.dumpdir:
        print("cadence doctor: give DUMPDIR, or --store HOST:PORT to ask a running job",
              file=sys.stderr)
        return 2
    try:
        dumps, skipped = load_dir(args.dumpdir, skip_bad=args.skip_bad)
        verdict = diagnose(dumps, hang_after=args.hang_after)
    except DumpError as e:
        print(f"cadence doctor: {e}", file=sys.stderr)
        return 2
    verdict.evidence += [f"skipped: {s}" for s in skipped]
    if outputs and not _write_reports(args, dumps, verdict):
        return 2
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1))
    else:
        print(verdict.text())
    return 0 if verdict.cls == HEALTHY else 1


def _write_reports(args: argparse.Namespace, dumps, verdict) -> bool:
    """Writes the files asked for; on failure, one line on stderr."""
    from cadence.diagnosis import exclude, report_html, trace

    try:
        if args.trace:
            trace.write(args.trace, dumps, verdict)
        if args.html:
            report_html.write(args.html, dumps, verdict, source=args.dumpdir)
        if args.exclude_file:
            exclude.write(args.exclude_file, exclude.exclusion_hosts(verdict, dumps))
    except OSError as e:
        print(f"cadence doctor: cannot write {e.filename or 'a report'}: {e.strerror or e}",
              file=sys.stderr)
        return False
    return True


def _ask_store(args: argparse.Namespace) -> int:
    """`--store`: a verdict from a running job's live watchdogs."""
    from datetime import timedelta

    from cadence.diagnosis import VerdictClass, live

    host, _, port = args.store.rpartition(":")
    if not host or not port.isdigit():
        print(f"cadence doctor: --store wants HOST:PORT, not {args.store!r}", file=sys.stderr)
        return 2
    import os
    import socket

    from cadence._core import Store

    try:  # a plain connect first: a clear error at once, not torch's retries
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        print(f"cadence doctor: cannot reach the store at {args.store}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 2
    timeout = max(5.0, args.gather + 5)
    try:
        # cadence's own store (what `cadence.init()` serves), else a torch
        # TCPStore (torchrun's agent, or one the application made).
        try:
            # Briefly: a torch TCPStore never answers the greeting.
            store = Store(host, int(port), timeout=2.0)
            store.set_timeout(timeout)
        except RuntimeError:  # it answered, in another protocol
            # torch's C++ side would print its own multi-line report of a failure.
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
            import torch.distributed as dist

            store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=timeout))
        verdict = live.ask(store, args.prefix, args.gather, args.hang_after)
    except (LookupError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"cadence doctor: {args.store}: {first}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in verdict.items() if k != "text"}, indent=1))
    else:
        print(verdict["text"])
    return 0 if verdict["class"] == VerdictClass.HEALTHY else 1


def _ask_cluster(args: argparse.Namespace) -> int:
    """`--cluster`: `--store` from inside host 0 of the emulated cluster (its
    addresses are reachable only from the cluster's namespaces)."""
    import subprocess

    from cadence.testbed import cluster as tb
    from cadence.testbed import jobs
    from cadence.testbed.iproute import TestbedError

    try:
        c = tb.require(args.cluster)
    except TestbedError as e:
        print(f"cadence doctor: {e}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "cadence.cli.main", "doctor", "--store",
           f"{c.master_addr}:{args.master_port}", "--prefix", args.prefix,
           "--gather", f"{args.gather:g}", "--hang-after", f"{args.hang_after:g}"]
    if args.json:
        cmd.append("--json")
    return subprocess.run(jobs.in_host(c.hosts[0], cmd)).returncode
