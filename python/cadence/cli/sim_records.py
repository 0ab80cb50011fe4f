"""`cadence sim --records DIR`: the dumps a job would leave when a fault hits,
from a simulation, for `cadence doctor DIR`.

  cadence sim --topology spec.json --ranks 4096 -b 64K --records /tmp/d --fault stop:5@1
  cadence doctor /tmp/d

Every rank makes `--calls` calls (3) of the library's choice; the fault
(`--fault`) is one of

  stop:RANK@CALL          RANK makes calls 0..CALL-1 only (stuck in its own code)
  hung-link:SRC-DST@CALL  from call CALL on, nothing from SRC reaches DST
  slow-rank:RANK=SECONDS  RANK enters every call SECONDS late
  slow-nic:HOST=FACTOR    host HOST's NICs pass FACTOR of their rate

A run that stalls is dumped as the live diagnosis would dump it, 31 s after
the stall (stuck for `cadence doctor`'s --hang-after up to 30); a clean one
just after its end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from cadence.bench.common import DTYPES, layout
from cadence.units import format_size

DEFAULT_CALLS = 3
#: The simulated job's communicator, as its dumps are named.
COMM = "sim0"
#: A cadence dump's file name (`diagnosis.dumps.NAME`'s pattern).
_DUMP_NAME = re.compile(r"^cadence-[A-Za-z0-9_-]+-rank\d+\.json$")

_FAULTS = (
    (re.compile(r"^stop:(?P<rank>\d+)@(?P<call>\d+)$"), "stop"),
    (re.compile(r"^hung-link:(?P<src>\d+)-(?P<dst>\d+)@(?P<call>\d+)$"), "hung-link"),
    (re.compile(r"^slow-rank:(?P<rank>\d+)=(?P<delay>[0-9.eE+-]+)$"), "slow-rank"),
    (re.compile(r"^slow-nic:(?P<host>\d+)=(?P<factor>[0-9.eE+-]+)$"), "slow-nic"),
)
FAULT_SYNTAX = ("stop:RANK@CALL, hung-link:SRC-DST@CALL, slow-rank:RANK=SECONDS or "
                "slow-nic:HOST=FACTOR")  # fmt: skip


def parse_fault(text: str | None) -> dict | None:
    """`--fault`'s text as `SimCluster.records` takes it; ValueError if malformed."""
    if text is None:
        return None
    for pattern, kind in _FAULTS:
        m = pattern.match(text)
        if m:
            fault: dict = {"kind": kind}
            for key, value in m.groupdict().items():
                fault[key] = float(value) if key in ("delay", "factor") else int(value)
            return fault
    raise ValueError(f"--fault {text}: expected {FAULT_SYNTAX}")


def prepare_dir(path: Path) -> None:
    """Creates `path`, or empties it of an earlier run's dumps; ValueError
    when it holds anything else (a dump directory is read whole)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--records {path}: not a directory")
    path.mkdir(parents=True, exist_ok=True)
    names = os.listdir(path)
    foreign = [n for n in names if not _DUMP_NAME.match(n)]
    if foreign:
        raise ValueError(f"--records {path}: holds {len(foreign)} entries that are not cadence "
                         f"dumps ({', '.join(sorted(foreign)[:3])}); give an empty directory")
    for n in names:
        (path / n).unlink()


def check_args(args: argparse.Namespace) -> None:
    """What --records does not go with; ValueError naming it."""
    if args.maxbytes is not None and args.maxbytes != args.minbytes:
        raise ValueError("--records runs one size: give it with -b, without -e")
    if args.algo != "auto":
        raise ValueError("--records runs the library's choice: leave out --algo")
    if args.json:
        raise ValueError("--records writes dumps, not `cadence bench` records: leave out --json")


def run(model, args: argparse.Namespace) -> int:
    """Writes every rank's dump into `args.records`; prints one line."""
    try:
        check_args(args)
        fault = parse_fault(args.fault)
    except ValueError as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    n = model.nranks
    itemsize = DTYPES[args.dtype].itemsize
    lay = layout(args.op, args.minbytes, itemsize, n)
    if lay is None:
        print(f"cadence sim: {format_size(args.minbytes)} holds no element of {args.op} on "
              f"{n} ranks", file=sys.stderr)  # fmt: skip
        return 2
    calls = args.calls or DEFAULT_CALLS
    try:
        texts = model.records(args.op, lay.count, itemsize, calls, fault)
    except ValueError as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    out = Path(args.records)
    try:
        prepare_dir(out)
        written = 0
        for rank, text in enumerate(texts):
            (out / f"cadence-{COMM}-rank{rank}.json").write_text(text)
            written += len(text)
    except (OSError, ValueError) as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    said, what = summary(texts), args.fault or "none"
    if fault and fault["kind"] == "hung-link" and said.endswith(CLEAN):
        # Every message went through, so none took that link.
        what += f" (rank {fault['src']} sends rank {fault['dst']} nothing from call " \
                f"{fault['call']} on)"
    print(f"cadence sim: {n} ranks, {args.op} {format_size(lay.nbytes)} x{calls} ({said}); "
          f"fault {what}; wrote {len(texts)} dumps, {written} bytes, to {out}")  # fmt: skip
    return 0


CLEAN = "clean: every rank finished"


def summary(texts: list[str]) -> str:
    """The algorithm, and which call stalled on how many ranks (or clean)."""
    algo, stalled_in, running = "", None, 0
    for text in texts:
        ops = json.loads(text)["ops"]
        if ops:
            algo = ops[-1]["algo"]
        live = [o for o in ops if o["status"] == "running"]
        if live:
            running += 1
            stalled_in = live[0]["id"] if stalled_in is None else min(stalled_in, live[0]["id"])
    if stalled_in is None:
        return f"{algo}, {CLEAN}"
    return f"{algo}, stalled in call {stalled_in} on {running} ranks"
