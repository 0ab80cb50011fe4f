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
problem was found, 2 the input could not be used (one line on stderr).

examples:
  cadence doctor /tmp/dumps
  cadence doctor /tmp/dumps --json | jq .ranks
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "doctor"
HELP = "diagnose a hung, failed or slow job from its ranks' dumps"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dumpdir", metavar="DUMPDIR",
                   help="directory the ranks dumped into (cadence-<comm>-rank<r>.json files)")
    p.add_argument("--json", action="store_true",
                   help="print the verdict as JSON: class, op, ranks, links, hosts, evidence")
    p.add_argument("--hang-after", type=float, default=10.0, metavar="SECONDS",
                   help="in dumps taken on demand, an operation still running for this long "
                   "counts as stuck (10)")
    p.add_argument("--skip-bad", action="store_true",
                   help="diagnose without dump files that cannot be read, instead of stopping")


def run(args: argparse.Namespace) -> int:
    from cadence.diagnosis import HEALTHY, DumpError, diagnose, load_dir

    try:
        dumps, skipped = load_dir(args.dumpdir, skip_bad=args.skip_bad)
        verdict = diagnose(dumps, hang_after=args.hang_after)
    except DumpError as e:
        print(f"cadence doctor: {e}", file=sys.stderr)
        return 2
    verdict.evidence += [f"skipped: {s}" for s in skipped]
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1))
    else:
        print(verdict.text())
    return 0 if verdict.cls == HEALTHY else 1
