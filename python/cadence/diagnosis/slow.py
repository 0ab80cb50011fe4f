"""Slowness: a job whose operations complete, but slower than they should,
because of a link (`comm_slow`) or a rank (`noncomm_slow`). Over the dumps of
one communicator — a whole post-mortem dump, or a live window of the last
operations (`SlowWatch`).

`noncomm_slow`: a straggler. Collectives are matched across ranks by
(seq, sig); each rank's arrival is its start on rank 0's clock
(`Dump.wall`, offsets applied); its lateness at one collective is its
arrival minus the median arrival of the other ranks. A rank that is late at
most of them by a stable amount, and whose lateness summed costs the job at
least STRAGGLER_SHARE of the window's time, is named with its average
lateness. It must also spend that time itself: its own gap between leaving
one collective and entering the next (one clock, no offsets) exceeds the
others' gaps by at least half its lateness. A rank that arrives late only
because it leaves the previous collective late (its transfers finish last)
is not a straggler.

`comm_slow`: a rate matrix. Every timed receive of a collective (a message
of at least MIN_MSG_BYTES whose first and last progress differ) gives an
interval on the receiver's clock and its bytes. A receive measures the link
and the sender together (the receiver cannot read faster than the sender
writes); a send is not used, since it completes once the transport took it
(a socket buffer holds megabytes), and is bounded by the receiver's reading
too. Rates are bytes over the *union* of the intervals of concurrent
messages, per collective and summed: ranks of one host that send to another
host at once share its NIC, and their overlapping messages count once.

The units compared: over TCP between hosts, the host pair (hA -> hB: what a
NIC or path carries; ranks of one host share it); over shared memory (or
TCP within a host), the rank pair. Units of one class (tcp across hosts,
shm, ...) are compared with each other only: the reference is an upper
quantile of the class's rates, so that one slow host, which slows half of
the pairs of a 4-host job, does not drag the reference down. A unit is slow
when both its rate over the window and its median rate per collective are
under SLOW_RATIO of the reference. When a unit is slow and most of a row it
is in (everything a host sends) or column (everything it receives) is well
under the reference (SIDE_RATIO), the verdict names the host (its NIC) and
its ranks, not each link; remaining slow units are named as links
`src->dst` between ranks.

The per-link counters (`links`: bytes, busy time per peer since creation)
give each link's transport class, and the bytes in the evidence. Their
`busy_ns` is not a rate: a phase's whole duration, waits on other ranks
included, is charged to every peer of the phase, so it measures the
algorithm's dependencies (on a healthy job it differs 10x between links that
carry the same bytes).

Both can be found at once (a straggler and a slow link): the verdict's class
is the one that cost more time over the window, and the other follows in its
headline and evidence.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from cadence.diagnosis.dumps import Dump
from cadence.diagnosis.summary import (
    MIN_MSG_BYTES,
    Colls,
    HostSummary,
    Placement,
    Receipts,
    host_summaries,
)
from cadence.diagnosis.verdict import COMM_SLOW, NONCOMM_SLOW, Verdict, ranks_text
from cadence.units import fmt_mbit, fmt_ms, fmt_rate

# --- thresholds ---------------------------------------------------------------
# Chosen from real runs on the emulated cluster (4 hosts x 2 ranks, 1 Gbit/s
# links, on a 2-core machine shared with other jobs; docs/diagnosis.md):
# healthy lateness has a median within 1 ms and a 90th percentile of 3-27 ms;
# healthy host-pair rates stay above 0.49x of the reference (0.46x beside a
# straggler); a host cut to 200 Mbit/s gives 0.09-0.17x; a rank sleeping
# 100 ms before every collective is 100 ms late in 93% of them.

#: The collectives of the communicator's own set-up are skipped: a job
#: across hosts calibrates its cost model at start-up (barriers, broadcasts
#: of bytes, 11 allreduces of 8 bytes: 26 collectives; rank 0 measures
#: links while the others wait in a barrier, 70 ms "late"). They are the
#: leading run from #1 of such collectives (at most SETUP_MAX), up to its
#: last broadcast (set-up's last collective is one). Then the next
#: WARMUP_COLLECTIVES are skipped too: ranks reach the first ones at
#: different times and new TCP connections are still in slow start.
#: Point-to-point operations (the clock ping-pongs of set-up among them)
#: never count.
WARMUP_COLLECTIVES = 5
SETUP_MAX = 64

#: Fewer collectives matched on every rank than this: too little to judge
#: anything (the tail of a job, a quiet window): a rank consistently late,
#: or which links are typical (in a window of 5 collectives, most pairs with
#: enough data were those of the slow host, and the reference sank with them).
MIN_COLLECTIVES = 10

#: A straggler costs the job at least this share of its time over the
#: window: its lateness summed over the matched collectives, over the time
#: from the first one's first arrival to the last one's end. Whatever the
#: straggler's size, this is what makes it worth naming: 20 ms late at
#: collectives of 100 ms is a straggler, 20 ms late once a second is not.
STRAGGLER_SHARE = 0.10
#: ... with a median lateness of at least this: below it, lateness is the
#: scheduler's (a wake-up on shared cores takes a few ms; healthy medians
#: stayed within 1 ms, also with 8 ranks on 2 cores) ...
STRAGGLER_MIN_S = 0.003
#: ... and late by at least half its median lateness in this share of the
#: collectives ("consistently", not a few long pauses).
STRAGGLER_FRACTION = 0.6
#: Its own gap between collectives must exceed the others' by this share of
#: its lateness: the time is spent outside communication.
GAP_SHARE = 0.5

#: A unit (host pair, rank pair) needs this many timed messages and bytes in
#: the window to be compared at all.
MIN_UNIT_MESSAGES = 8
MIN_UNIT_BYTES = 1 << 20
#: The reference of a class: this quantile of its units' rates (an upper
#: one: a slow host slows half the host pairs of 4 hosts).
REFERENCE_QUANTILE = 0.75
#: Slow: under this share of the reference, over the window and in the
#: median collective (healthy units stay above 0.49x; a 5x slower link is at
#: 0.09-0.17x).
SLOW_RATIO = 0.3
#: Once some unit is slow, a host's (or rank's) sending or receiving side is
#: named instead of its links when two or more of its units, and at least
#: SIDE_FRACTION of them, are under SIDE_RATIO of the reference: a NIC cut to
#: 400 of 1000 Mbit/s gives its pairs 0.2-0.4x (where they cross the SLOW_RATIO
#: bar unevenly), and no healthy side had all its units under 0.5x.
SIDE_FRACTION = 0.75
SIDE_RATIO = 0.5

#: Rows of a class's rate matrix a verdict's evidence shows at most (those
#: with a slow unit first): a job of thousands of hosts has as many rows.
MATRIX_ROWS = 16

#: SlowWatch: windows in a row that must show the same finding before it is
#: reported (one window can be one bad stretch of a shared machine).
PERSIST_WINDOWS = 2


# --- matching collectives ------------------------------------------------------


def _is_setup(kind: tuple[str, str, str, int]) -> bool:
    _, collective, dtype, nbytes = kind
    return (collective == "barrier" or (collective == "broadcast" and dtype == "uint8")
            or (collective == "allreduce" and nbytes <= 16))


Summaries = list[Dump] | list[HostSummary]


def _hosts_of(given: Summaries) -> list[HostSummary]:
    """Host summaries, made from dumps when dumps are given."""
    if given and isinstance(given[0], Dump):
        return host_summaries(given)
    return list(given)


def setup_collectives(given: Summaries) -> int:
    """How many collectives the communicator's set-up ran (#1 to #n), as far
    as the records show (0 when #1 is no longer in them)."""
    return _setup(Colls.join([h.colls for h in _hosts_of(given)]))


def _setup(c: Colls) -> int:
    # Only ranks whose records reach back to #1 say anything.
    early = np.flatnonzero(c.seq <= SETUP_MAX)
    by_rank: dict[int, dict[int, int]] = {}
    for i in early.tolist():
        by_rank.setdefault(int(c.rank[i]), {})[int(c.seq[i])] = int(c.kind[i])
    n = 0
    for by in by_rank.values():
        k = end = 0
        while k < SETUP_MAX and k + 1 in by and _is_setup(c.kinds[by[k + 1]]):
            k += 1
            if c.kinds[by[k]][1] == "broadcast":
                end = k  # set-up ends with one (the model, or "no calibration")
        n = max(n, end)
    return n


class _Table:
    """The collectives every rank completed after #`after` with one
    signature, as matrices: a row per rank (`ranks`), a column per
    collective (`seqs`)."""

    def __init__(self, c: Colls, ranks: list[int], after: int):
        self.ranks = ranks
        nr = len(ranks)
        ri = np.searchsorted(np.array(ranks, dtype=np.int64), c.rank)
        take = c.ok & (c.seq > after)
        seq, sig, row = c.seq[take], c.sig_ids()[take], ri[take]
        useq, inv, cnt = np.unique(seq, return_inverse=True, return_counts=True)
        lo = np.full(len(useq), np.iinfo(np.int64).max)
        hi = np.full(len(useq), -1)
        np.minimum.at(lo, inv, sig)
        np.maximum.at(hi, inv, sig)
        good = (cnt == nr) & (lo == hi)
        self.seqs: list[int] = useq[good].tolist()
        col = np.full(len(useq), -1)
        col[good] = np.arange(int(good.sum()))
        at = col[inv]
        keep = at >= 0
        shape = (nr, len(self.seqs))
        self.start = np.zeros(shape)
        self.end = np.zeros(shape)
        self.start_ns = np.zeros(shape, dtype=np.int64)
        idx = (row[keep], at[keep])
        self.start[idx] = c.start[take][keep]
        self.end[idx] = c.end[take][keep]
        self.start_ns[idx] = c.start_ns[take][keep]
        # Each rank's gap before each collective: from the end of its own
        # #k-1 (completed, whatever its signature), when it has one.
        ok = np.flatnonzero(c.ok)
        key = ri[ok] * (1 << 40) + c.seq[ok]
        order = np.argsort(key, kind="stable")
        key, ends = key[order], c.end_ns[ok][order]
        want = (np.arange(nr)[:, None] * (1 << 40) + np.array(self.seqs, dtype=np.int64) - 1)
        pos = np.clip(np.searchsorted(key, want, side="right") - 1, 0, max(0, len(key) - 1))
        self.has_prev = (key[pos] == want) if len(key) else np.zeros(shape, dtype=bool)
        self.gaps = (self.start_ns - ends[pos]) / 1e9 if len(key) else np.zeros(shape)


# --- arrivals -----------------------------------------------------------------


@dataclass
class Lateness:
    """One rank's arrival at the matched collectives, next to the others."""

    rank: int
    #: Arrival minus the median arrival of the other ranks, per collective (s).
    late_s: list[float] = field(default_factory=list)
    #: Its own time from leaving one collective to entering the next (s).
    gaps_s: list[float] = field(default_factory=list)
    #: The median of late_s, when worked out for every rank at once.
    median: float | None = None

    @property
    def median_s(self) -> float:
        return self.median if self.median is not None else statistics.median(self.late_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.late_s)

    def share_late(self, by_s: float) -> float:
        return sum(x >= by_s for x in self.late_s) / len(self.late_s)

    @functools.cached_property
    def gap_s(self) -> float | None:
        # Cached: a straggler's gap is compared with every other rank's.
        return statistics.median(self.gaps_s) if self.gaps_s else None


def medians_of_others(values: np.ndarray) -> np.ndarray:
    """For each row of `values` (ranks x collectives), the median of the
    other rows, per column: `statistics.median` of the column without that
    row, bit for bit, in O(n log n) a column (a sort, then each rank's
    median is one of two places in it)."""
    n = values.shape[0]
    order = np.argsort(values, axis=0, kind="stable")
    srt = np.take_along_axis(values, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n)[:, None], axis=0)

    def kth_without(k: int) -> np.ndarray:
        # The k-th smallest of the others: index k of the sorted column,
        # or k + 1 where the rank itself sits at or before k.
        idx = np.where(pos <= k, k + 1, k)
        return np.take_along_axis(srt, idx, axis=0)

    m = n - 1
    if m % 2 == 1:
        return kth_without(m // 2)
    return (kth_without(m // 2 - 1) + kth_without(m // 2)) / 2


def arrivals(given: Summaries, warmup: int = WARMUP_COLLECTIVES
             ) -> tuple[list[int], dict[int, Lateness], float]:
    """(matched collectives, each rank's lateness, the median time the
    collectives took after their last rank arrived, s)."""
    job = _Job(_hosts_of(given))
    t = _Table(job.colls, sorted(job.by_rank), _setup(job.colls) + warmup)
    return _arrivals(t)


def _arrivals(t: _Table) -> tuple[list[int], dict[int, Lateness], float]:
    out = {r: Lateness(r) for r in t.ranks}
    if len(t.ranks) < 2 or not t.seqs:
        return t.seqs, out, 0.0
    late = t.start - medians_of_others(t.start)
    # statistics.median of every rank's end, per collective, and of every
    # rank's lateness (np.median takes the same elements and the same mean
    # of the middle two).
    tails = np.maximum(0.0, np.median(t.end, axis=0) - t.start.max(axis=0)).tolist()
    meds = np.median(late, axis=1).tolist()
    for i, r in enumerate(t.ranks):
        out[r].late_s = late[i].tolist()
        out[r].median = meds[i]
        out[r].gaps_s = t.gaps[i][t.has_prev[i]].tolist()
    return t.seqs, out, statistics.median(tails)


def window_span(t: _Table) -> float:
    """Seconds from the first arrival at the first matched collective to
    the last end of the last (rank 0's clock): the job's time the window
    covers."""
    if not t.seqs:
        return 0.0
    return max(0.0, float(t.end[:, -1].max()) - float(t.start[:, 0].min()))


def lost_share(x: Lateness, span_s: float) -> float:
    """The share of the window's time the job waited for this rank."""
    return sum(max(0.0, v) for v in x.late_s) / span_s if span_s > 0 else 0.0


def _stragglers(late: dict[int, Lateness], span_s: float, n: int) -> list[int]:
    """The ranks consistently late by their own time, at a cost of at least
    STRAGGLER_SHARE of the window."""
    if n < MIN_COLLECTIVES:
        return []
    out = []
    for r, x in sorted(late.items()):
        med = x.median_s
        if (med < STRAGGLER_MIN_S or x.share_late(med / 2) < STRAGGLER_FRACTION
                or lost_share(x, span_s) < STRAGGLER_SHARE):
            continue
        others = [y.gap_s for j, y in late.items() if j != r and y.gap_s is not None]
        if x.gap_s is not None and others and x.gap_s - statistics.median(others) < GAP_SHARE * med:
            continue  # late because it leaves late: not its own time
        out.append(r)
    return out


# --- rates --------------------------------------------------------------------


@dataclass
class LinkRate:
    """Data moved over one unit: a rank pair, or a host pair (src/dst are
    then host names), from its timed receives."""

    src: int | str
    dst: int | str
    transport: str
    bytes: int = 0
    seconds: float = 0.0
    messages: int = 0
    #: Per collective: seq, bytes, seconds (columns).
    ops: tuple = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    #: The unit's index in its Receipts.
    index: int = -1

    @property
    def per_op(self) -> list[tuple[int, int, float]]:
        return list(zip(*(a.tolist() for a in self.ops), strict=True))

    @property
    def rate(self) -> float:
        """Bytes per second (inf when nothing took time)."""
        return self.bytes / self.seconds if self.seconds > 0 else math.inf

    def _op_rates(self) -> np.ndarray:
        _, b, s = self.ops
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s > 0, b / np.where(s > 0, s, 1.0), np.inf)

    @property
    def op_median(self) -> float:
        return float(np.median(self._op_rates())) if len(self.ops[0]) else math.inf

    def slow_ops(self, below: float) -> int:
        return int(np.count_nonzero((self.ops[2] > 0) & (self._op_rates() < below)))

    @property
    def enough(self) -> bool:
        return (self.messages >= MIN_UNIT_MESSAGES and self.bytes >= MIN_UNIT_BYTES
                and self.seconds > 0)


class _Job:
    """The ranks of one communicator, from its host summaries."""

    def __init__(self, hosts: list[HostSummary]):
        self.by_rank = {r.rank: r for h in hosts for r in h.ranks}
        self.nranks = hosts[0].nranks
        self.comm = hosts[0].comm
        self.place = Placement(sorted(self.by_rank.values(), key=lambda r: r.rank))
        self.hosts = self.place.hosts
        self.colls = Colls.join([h.colls for h in hosts])
        self.units = Receipts.join([h.units for h in hosts])
        self.pairs = Receipts.join([h.pairs for h in hosts])
        # Pair i's unit, as an index into the joined units.
        at = np.cumsum([0] + [len(h.units.keys) for h in hosts[:-1]])
        self.pair_unit = np.concatenate([h.pair_unit + a for h, a in zip(hosts, at,
                                                                         strict=True)])

    def host(self, r: int) -> str:
        return self.place.host(r)

    def unit(self, s: int, d: int) -> tuple[int | str, int | str]:
        return self.place.unit(s, d)

    def ranks_of(self, host: str) -> list[int]:
        return sorted(r for r, h in self.hosts.items() if h == host)

    def who(self, r: int) -> str:
        d = self.by_rank.get(r)
        pid = d.pid if d is not None else "?"
        return f"rank {r} ({self.host(r)}, pid {pid})"


def _rates(rc: Receipts, after: int, which: np.ndarray | None = None) -> list[LinkRate]:
    """LinkRates of the units of `rc` (only `which` of them, when given),
    over the collectives after #`after`."""
    take = rc.seq > after
    if which is not None:
        take &= np.isin(rc.unit, which)
    idx = np.flatnonzero(take)
    idx = idx[np.argsort(rc.unit[idx], kind="stable")]
    if not len(idx):
        return []
    unit = rc.unit[idx]
    cut = np.flatnonzero(np.diff(unit)) + 1
    starts = np.concatenate([[0], cut])
    sums = lambda a: np.add.reduceat(a[idx], starts)  # noqa: E731
    nbytes, secs, msgs = sums(rc.bytes), sums(rc.seconds), sums(rc.messages)
    out = []
    for j, (a, b) in enumerate(zip(starts, np.concatenate([cut, [len(idx)]]), strict=True)):
        src, dst, transport = rc.keys[int(unit[a])]
        rows = idx[a:b]
        out.append(LinkRate(src, dst, transport, int(nbytes[j]), float(secs[j]), int(msgs[j]),
                            ops=(rc.seq[rows], rc.bytes[rows], rc.seconds[rows]),
                            index=int(unit[a])))
    return out


def link_rates(given: Summaries, warmup: int = WARMUP_COLLECTIVES
               ) -> dict[tuple[int, int], LinkRate]:
    """The rank-pair rate matrix, src -> dst, from the timed receives (for a
    heatmap; the classifier compares host pairs across hosts)."""
    job = _Job(_hosts_of(given))
    return {(lr.src, lr.dst): lr for lr in _rates(job.pairs, _setup(job.colls) + warmup)}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


@dataclass
class _Side:
    end: int | str  # host name or rank
    out: bool  # its sending side (row) or receiving side (column)
    units: list[LinkRate]
    slow: list[LinkRate]  # those under SIDE_RATIO of the reference

    @property
    def rate(self) -> float:
        b = sum(u.bytes for u in self.units)
        s = sum(u.seconds for u in self.units)
        return b / s if s > 0 else math.inf


@dataclass
class _CommFinding:
    sides: list[_Side]
    links: list[tuple[int, int]]
    link_units: list[tuple[LinkRate, list[LinkRate]]]  # slow unit, its rank links named
    refs: dict[str, float]
    #: Transfer time beyond what the reference rate would have taken.
    lost_s: float


def _comm_slow(job: _Job, after: int, spared: set = frozenset()
               ) -> tuple[_CommFinding | None, list[str]]:
    """(finding, evidence lines: each class's reference and matrix), from the
    collectives with seq above `after`; the ends in `spared` (hosts and
    ranks of stragglers) are not named slow both ways."""
    units = [u for u in _rates(job.units, after) if u.enough]
    classes: dict[str, list[LinkRate]] = {}
    for u in units:
        classes.setdefault(u.transport, []).append(u)
    evidence: list[str] = []
    refs: dict[str, float] = {}
    slow: list[LinkRate] = []
    for klass, us in sorted(classes.items()):
        finite = [u.rate for u in us if not math.isinf(u.rate)]
        if len(us) < 2 or len(finite) < 2:
            continue
        ref = _quantile(finite, REFERENCE_QUANTILE)
        refs[klass] = ref
        bar = SLOW_RATIO * ref
        mine = [u for u in us if u.rate < bar and u.op_median < bar]
        mine += _slow_both_ways(us, SIDE_RATIO * ref, spared, {id(u) for u in mine})
        slow += mine
        what = "host -> host" if klass == "tcp" else "rank -> rank"
        msgs = sum(u.messages for u in us)
        evidence.append(
            f"{klass} links ({what}), from {msgs} timed receives of ≥ {MIN_MSG_BYTES // 1024} KiB: "
            f"reference (p{int(REFERENCE_QUANTILE * 100)}) {fmt_rate(ref)}; slow below "
            f"{SLOW_RATIO:g}x = {fmt_rate(bar)}" + ("; matrix in Mbit/s, * slow:" if mine or
                                                    klass == "tcp" else ", none slower"))
        if mine or klass == "tcp":  # the network's matrix, and any with a finding
            evidence += _matrix_lines(us, set(map(id, mine)))
    if not slow:
        return None, evidence

    # Sides: a host's (or rank's) row or column mostly well under the
    # reference, about an end that some slow unit touches. A side of one unit
    # counts when all of that end's units, both ways, are under it (a window
    # of ring algorithms gives each host one peer each way).
    touched = {u.src for u in slow} | {u.dst for u in slow}
    candidates: list[_Side] = []
    for klass in refs:
        us = classes[klass]
        under = SIDE_RATIO * refs[klass]
        for e in sorted(touched & ({u.src for u in us} | {u.dst for u in us}), key=str):
            outs = [u for u in us if u.src == e]
            ins = [u for u in us if u.dst == e]
            out_bad = [u for u in outs if u.rate < under]
            in_bad = [u for u in ins if u.rate < under]
            o, i = _mostly(outs, out_bad), _mostly(ins, in_bad)
            out_all = bool(outs) and len(out_bad) == len(outs)
            in_all = bool(ins) and len(in_bad) == len(ins)
            if not (o or i or (out_all and in_all)):
                continue
            if o or out_all:
                candidates.append(_Side(e, True, outs, out_bad))
            if i or in_all:
                candidates.append(_Side(e, False, ins, in_bad))
    sides = _fewest_sides(candidates, {id(u) for u in slow})
    explained = {id(u) for sd in sides for u in sd.units}
    links: list[tuple[int, int]] = []
    link_units = []
    left = [u for u in slow if id(u) not in explained]
    # The rank pairs of the slow units left: their links are named.
    pairs = np.flatnonzero(np.isin(job.pair_unit, [u.index for u in left]))
    by_unit: dict[int, list[LinkRate]] = {}
    for lr in _rates(job.pairs, after, pairs):
        by_unit.setdefault(int(job.pair_unit[lr.index]), []).append(lr)
    for u in sorted(left, key=lambda u: (str(u.src), str(u.dst))):
        inside = by_unit.get(u.index, [])
        ref = refs[u.transport]
        named = [lr for lr in inside if lr.rate < SLOW_RATIO * ref] or inside
        named.sort(key=lambda lr: (lr.src, lr.dst))
        links += [(int(lr.src), int(lr.dst)) for lr in named]
        link_units.append((u, named))
    lost = sum(u.seconds * (1 - u.rate / refs[u.transport]) for u in slow)
    return _CommFinding(sides, sorted(set(links)), link_units, refs, lost), evidence


def _slow_both_ways(us: list[LinkRate], under: float, spared: set, slow: set[int]
                    ) -> list[LinkRate]:
    """The units of the ends (hosts, ranks) whose every unit both ways is
    under the side bar, over the window and in the median collective, while
    none of its units is under the slow bar: a NIC at a fifth of its rate
    where the links only carry half of it (short messages of a job of
    thousands) reads a third of the others, and is only seen as a whole. Not
    an end in `spared`: the links beside a straggler wait on it."""
    outs: dict = {}
    ins: dict = {}
    for u in us:
        outs.setdefault(u.src, []).append(u)
        ins.setdefault(u.dst, []).append(u)
    found: dict[int, LinkRate] = {}
    for e in sorted(outs.keys() & ins.keys() - spared, key=str):
        mine = outs[e] + ins[e]
        if (all(u.rate < under and u.op_median < under for u in mine)
                and not any(id(u) in slow for u in mine)):
            found.update((id(u), u) for u in mine)  # a unit between two such ends once
    return list(found.values())


def _fewest_sides(candidates: list[_Side], slow: set[int]) -> list[_Side]:
    """The sides that explain the slow units, slowest first: a side is kept
    when its units not explained by a side kept before still qualify, and
    one of them is slow or the other side of its end was kept (a NIC cut to
    0.4 may leave one way under the side bar only). A slow NIC drags the
    units of its neighbours (the receiver that waits on it, a ring behind
    it) under the side bar too; the NIC itself is the slowest side, and once
    it is named a neighbour's side is left with the units it explains
    alone."""
    kept: list[_Side] = []
    explained: set[int] = set()
    for sd in sorted(candidates, key=lambda sd: (sd.rate, str(sd.end), not sd.out)):
        rest = [u for u in sd.units if id(u) not in explained]
        bad = [u for u in sd.slow if id(u) not in explained]
        named = any(k.end == sd.end for k in kept)
        if not bad or not (named or any(id(u) in slow for u in bad)):
            continue
        if len(rest) < len(sd.units) and not (_mostly(rest, bad) or len(bad) == len(rest)):
            continue
        kept.append(sd)
        explained |= {id(u) for u in sd.units}
    return sorted(kept, key=lambda sd: (str(sd.end), not sd.out))


def _mostly(mine: list, bad: list) -> bool:
    return len(mine) >= 2 and len(bad) >= 2 and len(bad) >= SIDE_FRACTION * len(mine)


def _matrix_lines(us: list[LinkRate], slow_ids: set[int]) -> list[str]:
    """The matrix, a row per sender: every row up to MATRIX_ROWS of them,
    else the rows with a slow unit and the first others up to that many."""
    rows: dict = {}
    for u in us:
        rows.setdefault(u.src, []).append(u)
    srcs = sorted(rows, key=str)
    if len(srcs) > MATRIX_ROWS:
        bad = [s for s in srcs if any(id(u) in slow_ids for u in rows[s])]
        keep = set(bad) | set([s for s in srcs if s not in bad][:max(0, MATRIX_ROWS - len(bad))])
        shown = [s for s in srcs if s in keep]
    else:
        shown = srcs
    out = []
    for src in shown:
        cells = ", ".join(f"{u.dst} {fmt_mbit(u.rate)}{'*' if id(u) in slow_ids else ''}"
                          for u in sorted(rows[src], key=lambda u: str(u.dst)))
        out.append(f"  {src} -> {cells}")
    if len(shown) < len(srcs):
        out.append(f"  ({len(srcs) - len(shown)} more rows, none with a slow link)")
    return out


# --- the verdict --------------------------------------------------------------


@dataclass
class Assessment:
    """What one look at a window found (SlowWatch keeps these)."""

    verdict: Verdict | None
    #: Whether the window held enough to judge (MIN_COLLECTIVES matched
    #: collectives); a window without it neither raises nor clears.
    enough: bool


def assess(given: Summaries, warmup: int = WARMUP_COLLECTIVES) -> Assessment:
    """`diagnose_slow`, and whether the dumps (or host summaries) held
    enough to judge."""
    if not given:
        return Assessment(None, False)
    comms: dict[str, list] = {}
    for d in given:
        comms.setdefault(d.comm, []).append(d)
    found, enough = [], False
    for _, ds in sorted(comms.items()):
        a = _assess_comm(_hosts_of(ds), warmup)
        enough |= a.enough
        if a.verdict is not None:
            found.append(a.verdict)
    if not found:
        return Assessment(None, enough)
    first = found[0]
    for other in found[1:]:
        first.evidence.append(f"also, comm {other.comm}: {other.headline}")
    return Assessment(first, enough)


def diagnose_slow(given: Summaries, warmup: int = WARMUP_COLLECTIVES) -> Verdict | None:
    """`comm_slow` / `noncomm_slow` over the dumps of one communicator (a
    whole dump or a window of its last operations; or the host summaries
    of a window, summary.py), or None when neither
    applies (healthy, or too little to tell). Operations not completed are
    left out: hangs are `diagnose`'s. The communicator's set-up collectives
    and the `warmup` after them are not looked at."""
    return assess(given, warmup).verdict


def _assess_comm(hosts: list[HostSummary], warmup: int) -> Assessment:
    job = _Job(hosts)
    setup = _setup(job.colls)
    table = _Table(job.colls, sorted(job.by_rank), setup + warmup)
    seqs, late, tail = _arrivals(table)
    if len(seqs) < MIN_COLLECTIVES:
        return Assessment(None, False)
    span = window_span(table)
    stragglers = _stragglers(late, span, len(seqs))
    spared = {*stragglers, *(job.host(r) for r in stragglers)}
    comm, rate_lines = _comm_slow(job, setup + warmup, spared)
    if not stragglers and comm is None:
        return Assessment(None, True)

    window = _window_line(job, seqs, setup, warmup)
    straggler_lost = sum(max(0.0, x) for r in stragglers for x in late[r].late_s)
    parts: list[tuple[float, str, list[str]]] = []
    v = Verdict(COMM_SLOW, "", comm=job.comm, job=hosts[0].job)
    if stragglers:
        head, ev = _straggler_text(job, late, stragglers, tail, span)
        parts.append((straggler_lost, NONCOMM_SLOW, [head, *ev]))
        v.ranks += stragglers
        v.hosts += [job.host(r) for r in stragglers]
    if comm is not None:
        head, ev = _comm_text(job, comm)
        parts.append((comm.lost_s, COMM_SLOW, [head, *ev, *rate_lines]))
        for sd in comm.sides:
            if isinstance(sd.end, str):
                v.ranks += job.ranks_of(sd.end)
                v.hosts.append(sd.end)
            else:
                v.ranks.append(int(sd.end))
                v.hosts.append(job.host(int(sd.end)))
        v.links = comm.links
        v.hosts += [job.host(r) for link in comm.links for r in link]
        v.hosts += [str(e) for u, named in comm.link_units if not named for e in (u.src, u.dst)]
    parts.sort(key=lambda p: -p[0])
    v.cls = parts[0][1]
    v.ranks = sorted(set(v.ranks))
    v.hosts = sorted(set(v.hosts))
    v.headline = f"{v.cls} (comm {job.comm}): {parts[0][2][0]}"
    for _, cls, lines in parts[1:]:
        v.headline += f"; also {cls}: {lines[0]}"
    v.evidence.append(window)
    clock = _clock_line(job)
    if clock:
        v.evidence.append(clock)
    for _, _, lines in parts:
        v.evidence += lines[1:]
    return Assessment(v, True)


def _window_line(job: _Job, seqs: list[int], setup: int, warmup: int) -> str:
    skipped = ""
    if setup:
        skipped = f"; set-up's #1-#{setup} and the next {warmup} skipped"
    elif warmup and seqs[0] == warmup + 1:
        skipped = f"; #1-#{warmup} skipped as warm-up"
    c, first = job.colls, min(job.by_rank)
    mine = np.flatnonzero(c.rank == first)
    ops = {int(c.seq[i]): (int(c.start_ns[i]), int(c.end_ns[i])) for i in mine.tolist()}
    span = (ops[seqs[-1]][1] - ops[seqs[0]][0]) / 1e9
    return (f"window: collectives #{seqs[0]}-#{seqs[-1]} ({len(seqs)} completed by all "
            f"{len(job.by_rank)} ranks that dumped, {span:.1f}s{skipped})")


def _clock_line(job: _Job) -> str | None:
    hosts = {d.host for d in job.by_rank.values()}
    if len(hosts) < 2:
        return None
    offs = max(abs(d.clock_offset_ns) for d in job.by_rank.values()) / 1e6
    err = max(d.clock_error_ns for d in job.by_rank.values()) / 1e3
    return (f"clocks: {len(hosts)} hosts; arrivals on rank 0's clock (offsets applied, largest "
            f"{offs:.3f} ms, within {err:.0f} µs)")


def _straggler_text(job, late, stragglers, tail, span):
    names = []
    ev = []
    for r in stragglers:
        x = late[r]
        names.append(f"{job.who(r)} arrives {fmt_ms(x.mean_s)} late on average over "
                     f"{len(x.late_s)} collectives")
        p90 = sorted(x.late_s)[int(0.9 * (len(x.late_s) - 1))]
        others = [y.gap_s for j, y in late.items() if j != r and y.gap_s is not None]
        gap = ""
        if x.gap_s is not None and others:
            gap = (f"; its own time between collectives: median {fmt_ms(x.gap_s)} vs "
                   f"{fmt_ms(statistics.median(others))} for the others")
        ev.append(f"{job.who(r)}: lateness vs the median arrival of the others: median "
                  f"{fmt_ms(x.median_s)}, mean {fmt_ms(x.mean_s)}, p90 {fmt_ms(p90)}; late by ≥ "
                  f"{fmt_ms(x.median_s / 2)} in {x.share_late(x.median_s / 2):.0%} of "
                  f"{len(x.late_s)} collectives; the job waited for it "
                  f"{lost_share(x, span):.0%} of {span:.1f}s{gap}")
    rest = [r for r in sorted(late) if r not in stragglers]
    if rest:
        meds = [late[r].median_s for r in rest]
        ev.append(f"ranks {ranks_text(rest)}: median lateness between {fmt_ms(min(meds))} and "
                  f"{fmt_ms(max(meds))}")
    ev.append(f"a collective took {fmt_ms(tail)} (median) after its last rank arrived; "
              f"a straggler costs the job ≥ {STRAGGLER_SHARE:.0%} of the window, with a median "
              f"lateness ≥ {fmt_ms(STRAGGLER_MIN_S)}, late by ≥ half of it in ≥ "
              f"{STRAGGLER_FRACTION:.0%} of the collectives")
    return "; ".join(names), ev


def _end_name(job: _Job, e) -> str:
    if isinstance(e, str):
        rs = job.ranks_of(e)
        return f"host {e} (rank{'s' if len(rs) > 1 else ''} {ranks_text(rs)})"
    return f"rank {e} ({job.host(e)})"


def _comm_text(job: _Job, f: _CommFinding):
    parts, ev = [], []
    by_end: dict = {}
    for sd in f.sides:
        by_end.setdefault(sd.end, {})[sd.out] = sd
    for e, sds in sorted(by_end.items(), key=lambda kv: str(kv[0])):
        ref = f.refs[next(iter(sds.values())).units[0].transport]
        kind = "NIC" if isinstance(e, str) else "transfers"
        if len(sds) == 2:
            parts.append(f"{_end_name(job, e)} {kind} slow both ways: sends at "
                         f"{fmt_rate(sds[True].rate)}, receives at {fmt_rate(sds[False].rate)} "
                         f"(others: {fmt_rate(ref)})")
        else:
            (out, sd), = sds.items()
            parts.append(f"{_end_name(job, e)} {kind} slow {'sending' if out else 'receiving'}: "
                         f"{fmt_rate(sd.rate)} (others: {fmt_rate(ref)})")
        for out, sd in sorted(sds.items(), reverse=True):
            cells = ", ".join(f"{u.dst if out else u.src} {fmt_rate(u.rate)}"
                              for u in sorted(sd.units, key=lambda u: str(u.dst if out else u.src)))
            ev.append(f"{_end_name(job, e)}: {len(sd.slow)} of {len(sd.units)} links "
                      f"{'out of' if out else 'into'} it under {SIDE_RATIO:g}x ({cells}), "
                      f"{sum(u.bytes for u in sd.units) / 2**20:.1f} MiB in "
                      f"{sum(u.seconds for u in sd.units):.2f}s")
    for u, named in f.link_units:
        ref = f.refs[u.transport]
        if named:
            names = ", ".join(f"{lr.src}->{lr.dst}" for lr in named)
            plural = "s" if len(named) > 1 else ""
            what = (f"link{plural} {names} ({job.host(int(named[0].src))} -> "
                    f"{job.host(int(named[0].dst))})")
        else:  # no rank pair of it stood out where it was received
            what = f"the links {u.src} -> {u.dst}"
        parts.append(f"{what} at {fmt_rate(u.rate)} (others: {fmt_rate(ref)})")
        slow_ops = u.slow_ops(SLOW_RATIO * ref)
        ev.append(f"{what}: {fmt_rate(u.rate)} over {u.messages} timed "
                  f"receives, {u.bytes / 2**20:.1f} MiB in {u.seconds:.2f}s; slow in {slow_ops} "
                  f"of {len(u.per_op)} collectives")
        for lr in named:
            c = _counter(job, int(lr.src), int(lr.dst))
            if c:
                ev.append(c)
    return "; ".join(parts), ev


def _counter(job: _Job, s: int, d: int) -> str | None:
    summary = job.by_rank.get(s)
    for c in (summary.links or ()) if summary is not None else ():
        if c.peer == d:
            return (f"rank {s}'s counters for rank {d}: {c.transport}, {c.bytes_sent / 2**20:.1f} "
                    f"MiB in {c.msgs_sent} messages sent since the start")
    return None


# --- live ---------------------------------------------------------------------


class SlowWatch:
    """Slowness over successive windows of a running job.

        watch = SlowWatch()
        every ~10 s: verdict = watch.feed(dumps_of_the_last_window)

    `feed(dumps) -> Verdict | None` returns the slowness verdict in force:
    one found in `persist` windows in a row (the same class naming an
    overlapping culprit), until a window with enough evidence finds none (or
    another one). A window without enough evidence (a quiet stretch, the
    job's first collectives) neither raises nor clears it. Pure: no threads,
    no clock; the caller decides what a window is."""

    def __init__(self, persist: int = PERSIST_WINDOWS, warmup: int = WARMUP_COLLECTIVES):
        self.persist = max(1, persist)
        self.warmup = warmup
        self.windows = 0
        #: Consecutive windows that showed the candidate finding.
        self.streak = 0
        self.candidate: Verdict | None = None
        self.current: Verdict | None = None

    def feed(self, given: Summaries) -> Verdict | None:
        self.windows += 1
        a = assess(given, self.warmup)
        if not a.enough:
            return self.current
        v = a.verdict
        if v is None:
            self.streak, self.candidate, self.current = 0, None, None
            return None
        if self.candidate is not None and _same(self.candidate, v):
            self.streak += 1
        else:
            self.streak = 1
        self.candidate = v
        if self.streak >= self.persist:
            self.current = v
        elif self.current is not None and not _same(self.current, v):
            self.current = None
        return self.current


def _same(a: Verdict, b: Verdict) -> bool:
    if a.cls != b.cls:
        return False
    return bool(set(a.ranks) & set(b.ranks) or set(a.links) & set(b.links)
                or set(a.hosts) & set(b.hosts))
