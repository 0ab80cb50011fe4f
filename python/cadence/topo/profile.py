"""`cadence topo profile` inside a job: measure the network between the
job's hosts the way collectives load it, and write a topology file.

One rank per host (the host's lowest, its **leader**) takes part; the others
wait at the end. Every measurement is a **round**: a barrier among the
leaders, then a pattern of flows at once (each a point-to-point message of
`nbytes`), then the leaders share when each of their receives completed.
A flow's rate is `nbytes` over the time from the barrier to its receive's
completion. Rounds:

1. **pairs**: every ordered pair alone, one round each: alone rates.
2. **groups** from the alone rates (`infer.groups_from_rates`).
3. **out of / into each group**: one flow from each of its hosts to a
   distinct host outside (and back), all at once: a group's shared
   bottleneck (`infer.capacity`).
4. **ring**: the rank-order ring and the found ring (`fabric::pathfind`,
   the library's own) under load, for the record and for `topo show`: what
   the finder predicted against what the ring got.

Cost: n(n-1) + 2·groups + 2 rounds of about `seconds` each (the message
size is set from a first transfer so the fastest pair takes about that
long): 4 hosts ≈ 1 s, 8 hosts ≈ 4 s at the default 0.05 s.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Sequence

import numpy as np

from cadence.topo import infer

VERSION = 1
KIND = "cadence-topology"
#: Message sizes the first transfer may choose from.
MIN_BYTES = 256 << 10
MAX_BYTES = 64 << 20


class Rounds:
    """Runs rounds of flows among the leaders' communicator."""

    def __init__(self, leaders, nbytes: int) -> None:
        self.comm = leaders
        self.nbytes = nbytes
        self.send = np.ones(nbytes, dtype=np.uint8)
        self.recv: list[np.ndarray] = []

    def run(self, flows: Sequence[tuple[int, int]]) -> list[float]:
        """Rates (bytes/s) of `flows` (pairs of leader indices) run at once."""
        me = self.comm.rank
        incoming = [i for i, (_, d) in enumerate(flows) if d == me]
        while len(self.recv) < len(incoming):
            self.recv.append(np.empty(self.nbytes, dtype=np.uint8))
        self.comm.barrier()
        t0 = time.perf_counter()
        works = [(i, self.comm.recv(self.recv[k], flows[i][0], async_op=True))
                 for k, i in enumerate(incoming)]  # fmt: skip
        sends = [self.comm.send(self.send, d, async_op=True) for s, d in flows if s == me]
        took = np.zeros(len(flows), dtype=np.float64)
        for i, w in works:
            w.wait()
            took[i] = time.perf_counter() - t0
        for w in sends:
            w.wait()
        self.comm.allreduce(took)  # each flow's time is filled in by its receiver only
        return [self.nbytes / t if t > 0 else 0.0 for t in took.tolist()]


def _choose_bytes(leaders, seconds: float) -> int:
    """A message size the fastest pair moves in about `seconds`: measured
    on leader 0 → 1 (then rounded to a power of two, bounded)."""
    probe = Rounds(leaders, 4 << 20)
    probe.run([(0, 1)])  # warm the connection
    rate = probe.run([(0, 1)])[0]
    want = int(rate * seconds)
    nbytes = 1 << max(want, 1).bit_length()
    return int(min(max(nbytes, MIN_BYTES), MAX_BYTES))


def profile(comm, seconds: float = 0.05, note: str = "",
            progress: Callable[[str], None] | None = None) -> dict | None:
    """Profiles the network between `comm`'s hosts (collective over every
    rank of `comm`); returns the topology file's contents on rank 0, None
    elsewhere. `progress` receives a line per stage (rank 0)."""
    say = progress if (progress and comm.rank == 0) else (lambda _m: None)
    hosts_of_rank = comm.hosts
    leaders = comm.split(0 if comm.local_rank == 0 else -1)
    result = None
    if leaders is not None:
        try:
            result = _profile_leaders(leaders, hosts_of_rank, comm, seconds, note, say)
        finally:
            leaders.close()
    comm.barrier()
    return result if comm.rank == 0 else None


def _profile_leaders(leaders, hosts_of_rank, comm, seconds, note, say) -> dict:
    started = time.perf_counter()
    # Leaders are ordered by rank: leader i is the i-th host by lowest rank.
    hosts = list(dict.fromkeys(hosts_of_rank))
    n = leaders.size
    assert len(hosts) == n, (hosts, n)
    patterns: list[dict] = []

    def record(name: str, flows, rates) -> None:
        patterns.append({"name": name, "flows": [[a, b, r] for (a, b), r in zip(flows, rates,
                                                                                 strict=True)]})

    if n < 2:
        rates = [[0.0]]
        groups = [[0]]
        caps_out: list[float | None] = [None]
        caps_in: list[float | None] = [None]
        nbytes = 0
    else:
        nbytes = _choose_bytes(leaders, seconds)
        rounds = Rounds(leaders, nbytes)
        say(f"profiling {n} hosts: {n * (n - 1)} pairs alone, {nbytes >> 10} KiB per flow")
        rates = [[0.0] * n for _ in range(n)]
        pair_flows = [(a, b) for a in range(n) for b in range(n) if a != b]
        for a, b in pair_flows:
            rates[a][b] = rounds.run([(a, b)])[0]
        record("pairs alone", pair_flows, [rates[a][b] for a, b in pair_flows])
        groups = infer.groups_from_rates(rates)
        say(f"groups from the alone rates: {groups}")
        caps_out, caps_in = [], []
        for g, members in enumerate(groups):
            outside = [h for h in range(n) if h not in members]
            caps = []
            for name, flows in (("out of", infer.spread_flows(members, outside)),
                                ("into", infer.spread_flows(outside, members))):
                got = rounds.run(flows) if flows else []
                if flows:
                    record(f"{name} group {g}", flows, got)
                caps.append(infer.capacity(got, [rates[a][b] for a, b in flows]))
            caps_out.append(caps[0])
            caps_in.append(caps[1])
        say("group bottlenecks (bytes/s, None: not shared): out "
            f"{_fmt_caps(caps_out)}, in {_fmt_caps(caps_in)}")
        for name, order in (("ring in rank order", list(range(n))),
                            ("ring in found order", _found_order(hosts, rates, groups,
                                                                 caps_out, caps_in))):
            flows = infer.ring_flows(order)
            record(name, flows, rounds.run(flows))
    took = time.perf_counter() - started
    say(f"profiled in {took:.1f} s")
    return {
        "version": VERSION,
        "kind": KIND,
        "note": note or f"cadence topo profile, {datetime.date.today().isoformat()}",
        "hosts": hosts,
        "rates": rates,
        "groups": groups,
        "group_out": caps_out,
        "group_in": caps_in,
        "patterns": patterns,
        "profile": {"bytes_per_flow": nbytes, "seconds": round(took, 3),
                    "ranks": comm.size},
    }  # fmt: skip


def _fmt_caps(caps) -> str:
    return "[" + ", ".join("None" if c is None else f"{c:.3g}" for c in caps) + "]"


def _found_order(hosts, rates, groups, caps_out, caps_in) -> list[int]:
    """The widest ring the library will use, by its own path finder."""
    from cadence import _core

    doc = {"version": VERSION, "kind": KIND, "hosts": hosts, "rates": rates,
           "groups": groups, "group_out": caps_out, "group_in": caps_in}  # fmt: skip
    return list(_core.topo_ring(json.dumps(doc), hosts)["order"])
