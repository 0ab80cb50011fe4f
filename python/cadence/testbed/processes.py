"""The one supervisor of the process groups the tools start (a job's ranks
on the testbed, `cadence bench`'s ranks): wait for them, stop them, and say
in one line how they ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL


def terminate(procs: list[subprocess.Popen], grace: float = KILL_GRACE) -> None:
    """SIGTERM each process group still running, SIGKILL what outlives `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        if not live:
            return
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p.poll() is None for p in live):
            time.sleep(0.05)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


@dataclass
class JobResult:
    status: int  # 0; the first failing rank's status (128+signal if killed); 124 at the deadline
    exits: dict[int, int | None] = field(default_factory=dict)  # rank -> code (None: killed by us)
    reason: str = ""  # one line for the user when status != 0
    first: int | None = None  # the rank that failed first


def supervise(
    procs: dict[int, subprocess.Popen], timeout: float, grace: float, what: str = "rank",
    poll: Callable[[], None] | None = None,
) -> JobResult:
    """Wait for every process; the first failure gives the others `grace`
    seconds to finish or fail on their own (so that their errors are seen),
    then they are killed; so is everything at the deadline. `poll` runs
    before each look at the processes (progress reports)."""
    deadline = time.monotonic() + timeout
    first: tuple[int, int] | None = None
    while True:
        if poll is not None:
            poll()
        codes = {r: p.poll() for r, p in procs.items()}
        if first is None:
            failed = [(r, c) for r, c in codes.items() if c not in (None, 0)]
            if failed:
                first = failed[0]
                deadline = min(deadline, time.monotonic() + grace)
        if all(c is not None for c in codes.values()):
            break
        if time.monotonic() > deadline:
            terminate(list(procs.values()))
            break
        time.sleep(0.05)
    exits = {r: (None if codes[r] is None else p.returncode) for r, p in procs.items()}
    killed = sorted(r for r, c in exits.items() if c is None)
    if first is not None:
        rank, code = first
        why = f"{_who(what, [rank], procs)} {describe_exit(code)}"
        others = sorted(r for r, c in exits.items() if c not in (None, 0) and r != rank)
        if others:
            why += f"; {_who(what, others, procs)} failed too"
        if killed:
            why += f"; {_who(what, killed, procs)} killed {grace:g} s later"
        return JobResult(code if code > 0 else 128 - code, exits, why, first=rank)
    if killed:
        why = f"timed out after {timeout:g} s; killed {_who(what, killed, procs)}"
        return JobResult(124, exits, why)
    return JobResult(0, exits)


def _who(what: str, ranks: list[int], procs: dict) -> str:
    """Who failed, in words: "rank 3", "ranks 0,1", or "mpirun" when it is alone."""
    if len(procs) == 1:
        return what
    return f"{what}{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
