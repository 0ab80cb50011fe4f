"""A host nobody can hear: when every rank of a host is silent (left no dump,
sent no summary to a live round) while the others wait in the stuck
operation, the fault is the network's (the host's only link is cut, or the
machine is down), not its processes': a rank stuck in its own code still
answers, since its watchdog thread runs and reaches the Store.

Two shapes, from where the Store is:

- one host silent (or a few), the rest answering: those hosts are
  unreachable;
- only the ranks of one host answering, and two or more other hosts
  silent: that host is the one cut off (the job's Store is reachable from it,
  so the Store is on it or on a network of its own), not the rest of the
  cluster at once.

A probe can tell a cut from a frozen host: the live coordinator tries a TCP
connection to a silent host's listener address from set-up (`reach.py`). A
host whose kernel answers (accepted or refused) is reachable: its processes
are stopped or cannot reach the Store, and the verdict is left to the
usual rules. Post-mortem there is no probe, and the rule above stands alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Silence:
    """The hosts to name and why."""

    #: The hosts at fault.
    hosts: list[str]
    #: True: only the named host answered (it is the one cut off); False:
    #: the named hosts are the silent ones.
    cut_off: bool
    #: The hosts that said nothing (all of their ranks silent).
    silent: list[str]
    evidence: list[str] = field(default_factory=list)


def silent_hosts(host_of: dict[int, str], missing: list[int]) -> tuple[list[str], list[str]]:
    """(hosts all of whose ranks are in `missing`, hosts with a rank that
    answered)."""
    gone = set(missing)
    ranks: dict[str, list[int]] = {}
    for r, h in host_of.items():
        ranks.setdefault(h, []).append(r)
    silent = sorted(h for h, rs in ranks.items() if all(r in gone for r in rs))
    answered = sorted(h for h in ranks if h not in silent)
    return silent, answered


def probe_lines(reach: dict[str, bool | None] | None) -> list[str]:
    """The evidence lines of the coordinator's probes."""
    reach = reach or {}
    heard = sorted(h for h, ok in reach.items() if ok is True)
    unheard = sorted(h for h, ok in reach.items() if ok is False)
    ev = []
    if heard:
        ev.append(f"host(s) {', '.join(heard)} answered a TCP connection to their set-up "
                  "address: reachable; their processes are stopped or cannot reach the Store")
    if unheard:
        ev.append(f"host(s) {', '.join(unheard)}: a TCP connection to their set-up address "
                  "got no answer (no route, or timed out): unreachable")
    return ev


def judge(host_of: dict[int, str], missing: list[int],
          reach: dict[str, bool | None] | None = None) -> Silence | None:
    """The unreachable host(s), or None when the silence is not a whole
    host's (a rank of a host that answered is missing too) or a probe
    found the silent hosts reachable."""
    if not missing:
        return None
    silent, answered = silent_hosts(host_of, missing)
    if not silent or not answered:
        return None
    in_silent = {r for r, h in host_of.items() if h in silent}
    if any(r not in in_silent for r in missing):
        return None  # a rank missing beside others of its host that answered
    reach = reach or {}
    heard = [h for h in silent if reach.get(h) is True]
    ev = probe_lines(reach)
    if len(answered) == 1 and len(silent) >= 2:
        if heard:
            return None
        return Silence(answered, True, silent, ev)
    named = [h for h in silent if h not in heard]
    if not named:
        return None
    return Silence(named, False, silent, ev)
