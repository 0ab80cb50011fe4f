"""What the slowness judge reads, in two steps whose size does not grow with
the job: a rank's summary of a window (`RankSummary`: its collectives and
its timed receives, grouped per collective and sender) and a host's summary
(`HostSummary`: its ranks' collectives, and the receive rates of every unit
whose receiving end is on the host, per collective).

Live (live.py), every rank publishes its `RankSummary`; one leader per host
reduces its ranks' into a `HostSummary`; rank 0 judges the H host summaries
(slow.py). Post-mortem (`cadence doctor`), the same two steps run on the
dumps. Every rate is computed where all of its receives are: a host pair's
(src host -> this host, over TCP) and a rank pair's (into a rank of this
host) at the receiving host's leader, so rank 0 only compares them.

A rank's summary holds, per collective and sender, the bytes, the message
count and the union of the receives' intervals as at most SPAN_CAP spans
(beyond that, the closest spans are joined into one as long as they were
together: the busy time stays exact; a ring of many ranks receives many
chunks from one sender), and
the link counters and hosts of the peers it has links to. A rank with more
than PEER_DETAIL senders (an alltoall) keeps the receives from other hosts
per sending host, and per sender only for those that look slow: its size is
O(collectives x (senders on its host + hosts it hears from)), never O(n)
per collective beyond the hosts.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from cadence.diagnosis.dumps import Dump, MsgState

#: Smaller messages are latency, not rate.
MIN_MSG_BYTES = 64 * 1024
#: Spans kept per collective and sender in a rank's summary.
SPAN_CAP = 32
#: A rank with timed receives from more senders than this (an alltoall)
#: keeps those from other hosts per sending host, and per sender only for
#: the senders that look slow: under SLOW_PEER_SHARE of the median rate of
#: its senders from other hosts over the window.
PEER_DETAIL = 8
SLOW_PEER_SHARE = 0.5
FORMAT = "cadence-window"
VERSION = 1


@dataclass
class CollRow:
    """One collective as one rank ran it (not a point-to-point operation)."""

    seq: int
    sig: str
    collective: str
    dtype: str
    bytes: int
    ok: bool
    start_ns: int
    end_ns: int
    #: start_ns and end_ns on rank 0's clock, seconds since the epoch.
    start: float
    end: float


@dataclass
class Received:
    """A rank's timed receives of one collective from one sender (a rank),
    or from all its senders on one other host (`src` is then the host's
    name)."""

    seq: int
    src: int | str
    bytes: int
    messages: int
    #: The union of their intervals (rank 0's clock, s), sorted.
    spans: list[tuple[float, float]]


@dataclass
class Counters:
    """A rank's counters for one of its links (`LinkCounters`, the fields
    the verdict's evidence reads)."""

    peer: int
    transport: str
    bytes_sent: int
    msgs_sent: int


@dataclass
class RankSummary:
    job: str
    comm: str
    rank: int
    nranks: int
    host: str
    pid: int
    clock_offset_ns: int
    clock_error_ns: int
    colls: list[CollRow]
    #: Per sender, or per sending host (see PEER_DETAIL): what the units'
    #: rates are made of.
    received: list[Received]
    links: list[Counters] | None
    #: rank -> host of the peers the rank knows of (all of them in a dump
    #: written to a file; those it has links to in a live window).
    hosts: dict[int, str] = field(default_factory=dict)
    #: Per sender, for the senders that look slow among those `received`
    #: holds per host only: what names a slow unit's links.
    slow_peers: list[Received] = field(default_factory=list)


@dataclass
class RankInfo:
    """What a host summary keeps of each of its ranks besides its rows."""

    rank: int
    host: str
    pid: int
    clock_offset_ns: int
    clock_error_ns: int
    links: list[Counters] | None
    hosts: dict[int, str]


@dataclass
class Colls:
    """Collectives as columns, a row per (rank, collective): what the judge
    matches and times without a Python object per row."""

    rank: np.ndarray  # int64
    seq: np.ndarray  # int64
    #: Index into `kinds`: (sig, collective, dtype, bytes).
    kind: np.ndarray  # int64
    ok: np.ndarray  # bool
    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    start: np.ndarray  # float64, rank 0's clock
    end: np.ndarray  # float64
    kinds: list[tuple[str, str, str, int]]

    @staticmethod
    def of(rows: list[tuple[int, CollRow]]) -> Colls:
        kinds: dict[tuple[str, str, str, int], int] = {}
        kind = [kinds.setdefault((c.sig, c.collective, c.dtype, c.bytes), len(kinds))
                for _, c in rows]
        i64 = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
        return Colls(i64([r for r, _ in rows]), i64([c.seq for _, c in rows]), i64(kind),
                     np.array([c.ok for _, c in rows], dtype=bool),
                     i64([c.start_ns for _, c in rows]), i64([c.end_ns for _, c in rows]),
                     np.array([c.start for _, c in rows], dtype=np.float64),
                     np.array([c.end for _, c in rows], dtype=np.float64), list(kinds))

    @staticmethod
    def join(parts: list[Colls]) -> Colls:
        """One table of several (their kinds merged)."""
        kinds: dict[tuple[str, str, str, int], int] = {}
        remapped = []
        for c in parts:
            table = np.array([kinds.setdefault(tuple(k), len(kinds)) for k in c.kinds] or [0],
                             dtype=np.int64)
            remapped.append(table[c.kind] if len(c.kind) else c.kind)
        cat = lambda f: np.concatenate([getattr(c, f) for c in parts])  # noqa: E731
        return Colls(cat("rank"), cat("seq"), np.concatenate(remapped), cat("ok"),
                     cat("start_ns"), cat("end_ns"), cat("start"), cat("end"), list(kinds))

    def sig_ids(self) -> np.ndarray:
        """Each row's signature as a small integer."""
        sigs: dict[str, int] = {}
        table = np.array([sigs.setdefault(k[0], len(sigs)) for k in self.kinds] or [0],
                         dtype=np.int64)
        return table[self.kind] if len(self.kind) else self.kind


@dataclass
class Receipts:
    """Receives per unit and collective, as columns: `keys[unit[i]]` is the
    unit (src, dst, transport) of row i; a row is one collective's bytes,
    messages and covered seconds."""

    keys: list[tuple[int | str, int | str, str]]
    unit: np.ndarray  # int64
    seq: np.ndarray  # int64
    bytes: np.ndarray  # int64
    seconds: np.ndarray  # float64
    messages: np.ndarray  # int64

    @staticmethod
    def join(parts: list[Receipts]) -> Receipts:
        keys, units, at = [], [], 0
        for p in parts:
            keys += p.keys
            units.append(p.unit + at)
            at += len(p.keys)
        cat = lambda f: np.concatenate([getattr(p, f) for p in parts])  # noqa: E731
        return Receipts(keys, np.concatenate(units), cat("seq"), cat("bytes"), cat("seconds"),
                        cat("messages"))


@dataclass
class HostSummary:
    host: str
    job: str
    comm: str
    nranks: int
    ranks: list[RankInfo]
    colls: Colls
    #: The units whose receiving end is on this host ...
    units: Receipts
    #: ... and the rank pairs within them (a slow unit's links are named);
    #: `pair_unit[i]`: the index in `units.keys` of pair i's unit.
    pairs: Receipts
    pair_unit: np.ndarray  # int64


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted spans, overlapping or touching ones joined."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if not out or a > out[-1][1]:
            out.append([a, b])
        else:
            out[-1][1] = max(out[-1][1], b)
    return [(a, b) for a, b in out]


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds the spans cover."""
    return sum(b - a for a, b in union(spans))


def _capped(spans: list[tuple[float, float]], cap: int) -> list[tuple[float, float]]:
    """At most `cap` spans holding the same busy time: the spans across the
    shortest gaps are joined into one that starts where the first did and
    lasts as long as they did together (the gaps are not counted busy: a
    pipeline starved upstream receives many short messages far apart, and
    counting its gaps would make its link look slow). Closing one gap leaves
    the others as they were, so the shortest are closed at once, the first
    of equal ones first: O(k log k) for k spans."""
    spans = union(spans)
    extra = len(spans) - cap
    if extra <= 0:
        return spans
    gap = lambda j: spans[j + 1][0] - spans[j][1]  # noqa: E731
    close = set(sorted(range(len(spans) - 1), key=lambda j: (gap(j), j))[:extra])
    out = [list(spans[0])]
    for j in range(len(spans) - 1):
        a, b = spans[j + 1]
        if j in close:
            out[-1][1] += b - a
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def rank_summary(d: Dump, span_cap: int = SPAN_CAP) -> RankSummary:
    """A rank's summary of its dump (a whole one, or a live window)."""
    colls = [CollRow(o.seq, o.sig, o.collective, o.dtype, o.bytes, o.ok, o.start_ns, o.end_ns,
                     d.wall(o.start_ns), d.wall(o.end_ns))
             for o in d.ops if not o.is_p2p]
    groups: dict[tuple[int, int], list] = {}
    base = d.base_unix_ns - d.clock_offset_ns  # d.wall, inlined: once per message
    for o in d.ops:
        if o.is_p2p or not o.ok or not o.messages:
            continue
        for m in o.messages:
            if (m.dir != "recv" or m.state != MsgState.DONE or m.bytes < MIN_MSG_BYTES
                    or m.first_ns is None or m.last_ns is None or m.last_ns <= m.first_ns):
                continue  # moved in one go (it was there already): no rate in it
            g = groups.setdefault((o.seq, m.peer), [0, 0, []])
            g[0] += m.bytes
            g[1] += 1
            g[2].append(((base + m.first_ns) / 1e9, (base + m.last_ns) / 1e9))
    links = None if d.links is None else [
        Counters(c.peer, c.transport, c.bytes_sent, c.msgs_sent) for c in d.links]
    hosts = {int(p["rank"]): str(p["host"]) for p in d.peers if "rank" in p and "host" in p}
    hosts[d.rank] = d.host
    transport = {c.peer: c.transport for c in d.links or ()}
    away = {src for _, src in groups
            if hosts.get(src, "?") != d.host and transport.get(src, "tcp") == "tcp"}
    slow: set[int] = set()
    if len({src for _, src in groups}) > PEER_DETAIL and away:
        slow = _slow_senders(groups, away)
        by_host: dict[tuple[int, str], list] = {}
        for (seq, src), g in list(groups.items()):
            if src in away:
                h = by_host.setdefault((seq, hosts.get(src, "?")), [0, 0, []])
                h[0] += g[0]
                h[1] += g[1]
                h[2] += g[2]
                if src not in slow:
                    del groups[seq, src]
    else:
        by_host, away = {}, set()
    received = [Received(seq, src, b, n, _capped(spans, span_cap))
                for (seq, src), (b, n, spans) in sorted(groups.items()) if src not in away]
    received += [Received(seq, h, b, n, _capped(spans, span_cap))
                 for (seq, h), (b, n, spans) in sorted(by_host.items())]
    slow_peers = [Received(seq, src, b, n, _capped(spans, span_cap))
                  for (seq, src), (b, n, spans) in sorted(groups.items()) if src in slow]
    return RankSummary(d.job, d.comm, d.rank, d.nranks, d.host, d.pid, d.clock_offset_ns,
                       d.clock_error_ns, colls, received, links, hosts, slow_peers)


def _slow_senders(groups: dict, away: set[int]) -> set[int]:
    """The senders among `away` whose rate over the window is under
    SLOW_PEER_SHARE of their median."""
    nbytes: dict[int, int] = {}
    secs: dict[int, float] = {}
    for (_, src), (b, _, spans) in groups.items():
        if src in away:
            nbytes[src] = nbytes.get(src, 0) + b
            secs[src] = secs.get(src, 0.0) + covered(spans)
    rates = {src: nbytes[src] / secs[src] for src in nbytes if secs[src] > 0}
    if not rates:
        return set()
    median = float(np.median(list(rates.values())))
    return {src for src, r in rates.items() if r < SLOW_PEER_SHARE * median}


class Placement:
    """Hosts and transports of the ranks the summaries know of: what a
    receive's unit is (`unit`) and its class (`klass`). `ranks`: their
    RankSummary or RankInfo."""

    def __init__(self, ranks: list):
        self.hosts: dict[int, str] = {}
        for s in ranks:
            for r, h in s.hosts.items():
                self.hosts.setdefault(r, h)
        for s in ranks:
            self.hosts[s.rank] = s.host
        self.transport: dict[tuple[int, int], str] = {}
        self._klass: dict[tuple[int, int], str] = {}
        for s in ranks:
            for c in s.links or ():
                self.transport.setdefault((s.rank, c.peer), c.transport)
                self.transport.setdefault((c.peer, s.rank), c.transport)

    def host(self, r: int) -> str:
        return self.hosts.get(r, "?")

    def klass(self, s: int | str, d: int) -> str:
        """The class a link is compared within (`s` a host's name: the
        rank's receives from that host, over TCP)."""
        if isinstance(s, str):
            return "tcp"
        k = self._klass.get((s, d))
        if k is None:
            cross = self.host(s) != self.host(d)
            t = self.transport.get((s, d)) or ("tcp" if cross else "shm")
            k = self._klass[s, d] = t if cross or t == "shm" else f"{t} within a host"
        return k

    def unit(self, s: int | str, d: int) -> tuple[int | str, int | str]:
        """A host pair across hosts over TCP, else the rank pair."""
        if isinstance(s, str):
            return s, self.host(d)
        if self.klass(s, d) == "tcp":
            return self.host(s), self.host(d)
        return s, d


def _receipts(place: Placement, ranks: list[RankSummary], key, pairs: bool) -> Receipts:
    """The receives of `ranks` per unit `key(src, dst)`, per collective:
    bytes, messages, and the time their intervals cover together (ranks of
    one host that receive from another at once share its NIC: their
    overlapping messages count once). `pairs`: those of single senders,
    for rank pairs (else every one, for units)."""
    acc: dict = {}
    for s in ranks:
        groups = ([g for g in s.received if not isinstance(g.src, str)] + s.slow_peers
                  if pairs else s.received)
        for g in groups:
            k = key(g.src, s.rank)
            per_seq = acc.setdefault(k, (place.klass(g.src, s.rank), {}))[1]
            p = per_seq.setdefault(g.seq, [0, 0, []])
            p[0] += g.bytes
            p[1] += g.messages
            p[2] += g.spans
    keys, rows = [], []
    for k, (klass, per_seq) in sorted(acc.items(), key=lambda kv: (str(kv[0][0]),
                                                                   str(kv[0][1]))):
        for seq, (b, n, spans) in sorted(per_seq.items()):
            rows.append((len(keys), seq, b, covered(spans), n))
        keys.append((k[0], k[1], klass))
    col = lambda i, t: np.array([r[i] for r in rows], dtype=t)  # noqa: E731
    return Receipts(keys, col(0, np.int64), col(1, np.int64), col(2, np.int64),
                    col(3, np.float64), col(4, np.int64))


def host_summary(ranks: list[RankSummary]) -> HostSummary:
    """One host's summary of its ranks' (the leader's reduction)."""
    place = Placement(ranks)
    ranks = sorted(ranks, key=lambda s: s.rank)
    first = ranks[0]
    units = _receipts(place, ranks, place.unit, False)
    pairs = _receipts(place, ranks, lambda s, d: (s, d), True)
    where = {(k[0], k[1]): i for i, k in enumerate(units.keys)}
    pair_unit = np.array([where[place.unit(int(k[0]), int(k[1]))] for k in pairs.keys],
                         dtype=np.int64)
    return HostSummary(first.host, first.job, first.comm, first.nranks,
                       [RankInfo(s.rank, s.host, s.pid, s.clock_offset_ns, s.clock_error_ns,
                                 s.links, s.hosts) for s in ranks],
                       Colls.of([(s.rank, c) for s in ranks for c in s.colls]), units, pairs,
                       pair_unit)


def host_summaries(dumps: list[Dump]) -> list[HostSummary]:
    """The host summaries of dumps of one communicator (post-mortem)."""
    by_host: dict[str, list[RankSummary]] = {}
    for d in dumps:
        by_host.setdefault(d.host, []).append(rank_summary(d))
    return [host_summary(rs) for _, rs in sorted(by_host.items())]


# --- the wire (the live watchdog's Store values) -------------------------------


def _links_json(links: list[Counters] | None):
    return None if links is None else [[c.peer, c.transport, c.bytes_sent, c.msgs_sent]
                                       for c in links]


def _links_of(v) -> list[Counters] | None:
    return None if v is None else [Counters(int(c[0]), str(c[1]), int(c[2]), int(c[3]))
                                   for c in v]


def _received_json(gs: list[Received]) -> list:
    return [[g.seq, g.src, g.bytes, g.messages, [x for sp in g.spans for x in sp]] for g in gs]


def _received_of(v) -> list[Received]:
    return [Received(int(g[0]), g[1] if isinstance(g[1], str) else int(g[1]), int(g[2]),
                     int(g[3]), [(float(g[4][i]), float(g[4][i + 1]))
                                 for i in range(0, len(g[4]), 2)]) for g in v]


def _pack(meta: dict, arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """zlib's fastest over: the header's length (4 bytes), the header (JSON,
    naming the arrays), the arrays' bytes. A summary goes out every window,
    and rank 0 reads one per host: columns decode without a Python object
    per value."""
    chunks = []
    if arrays is not None:
        meta["arrays"] = []
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            meta["arrays"].append([name, a.dtype.str, len(a)])
            chunks.append(a.tobytes())
    head = json.dumps(meta, separators=(",", ":")).encode()
    return zlib.compress(struct.pack("<I", len(head)) + head + b"".join(chunks), 1)


def _unpack(blob: bytes, kind: str, where: str) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        raw = zlib.decompress(blob)
        (n,) = struct.unpack_from("<I", raw)
        meta = json.loads(raw[4:4 + n].decode())
    except (zlib.error, struct.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: not a window summary ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("kind") != kind:
        raise ValueError(f"{where}: not a {kind} window summary")
    if meta.get("version") != VERSION:
        raise ValueError(f"{where}: window summary version {meta.get('version')} (this cadence "
                         f"reads {VERSION})")
    arrays, at = {}, 4 + n
    try:
        for name, dtype, length in meta.get("arrays") or ():
            dt = np.dtype(dtype)
            arrays[name] = np.frombuffer(raw, dtype=dt, count=length, offset=at)
            at += dt.itemsize * length
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: a window summary's columns are cut short ({e})") from None
    return meta, arrays


def encode_rank(s: RankSummary) -> bytes:
    return _pack({
        "format": FORMAT, "version": VERSION, "kind": "rank", "job": s.job, "comm": s.comm,
        "nranks": s.nranks, "rank": s.rank, "host": s.host, "pid": s.pid,
        "offset_ns": s.clock_offset_ns, "error_ns": s.clock_error_ns,
        "colls": [[c.seq, c.sig, c.collective, c.dtype, c.bytes, int(c.ok), c.start_ns,
                   c.end_ns, c.start, c.end] for c in s.colls],
        "recv": _received_json(s.received), "slow_peers": _received_json(s.slow_peers),
        "links": _links_json(s.links), "hosts": [[r, h] for r, h in sorted(s.hosts.items())],
    })


def decode_rank(blob: bytes, where: str = "a rank's window summary") -> RankSummary:
    o, _ = _unpack(blob, "rank", where)
    try:
        colls = [CollRow(int(c[0]), str(c[1]), str(c[2]), str(c[3]), int(c[4]), bool(c[5]),
                         int(c[6]), int(c[7]), float(c[8]), float(c[9])) for c in o["colls"]]
        return RankSummary(str(o["job"]), str(o["comm"]), int(o["rank"]), int(o["nranks"]),
                           str(o["host"]), int(o["pid"]), int(o["offset_ns"]),
                           int(o["error_ns"]), colls, _received_of(o["recv"]),
                           _links_of(o.get("links")),
                           {int(r): str(h) for r, h in o.get("hosts") or ()},
                           _received_of(o.get("slow_peers") or ()))
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: a malformed window summary ({e!r})") from None


def encode_host(h: HostSummary) -> bytes:
    c, u, p = h.colls, h.units, h.pairs
    return _pack({
        "format": FORMAT, "version": VERSION, "kind": "host", "host": h.host, "job": h.job,
        "comm": h.comm, "nranks": h.nranks,
        "ranks": [[r.rank, r.host, r.pid, r.clock_offset_ns, r.clock_error_ns,
                   _links_json(r.links), [[k, v] for k, v in sorted(r.hosts.items())]]
                  for r in h.ranks],
        "kinds": c.kinds, "units": u.keys, "pairs": p.keys,
    }, {
        "rank": c.rank, "seq": c.seq, "kind": c.kind, "ok": c.ok, "start_ns": c.start_ns,
        "end_ns": c.end_ns, "start": c.start, "end": c.end,
        "u.unit": u.unit, "u.seq": u.seq, "u.bytes": u.bytes, "u.seconds": u.seconds,
        "u.messages": u.messages,
        "p.unit": p.unit, "p.seq": p.seq, "p.bytes": p.bytes, "p.seconds": p.seconds,
        "p.messages": p.messages, "pair_unit": h.pair_unit,
    })


def decode_host(blob: bytes, where: str = "a host's window summary") -> HostSummary:
    o, a = _unpack(blob, "host", where)
    try:
        ranks = [RankInfo(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]),
                          _links_of(r[5]), {int(k): str(v) for k, v in r[6]})
                 for r in o["ranks"]]
        colls = Colls(a["rank"], a["seq"], a["kind"], a["ok"], a["start_ns"], a["end_ns"],
                      a["start"], a["end"], [tuple(k) for k in o["kinds"]])
        recv = lambda x, keys: Receipts(  # noqa: E731
            [tuple(k) for k in keys], a[f"{x}.unit"], a[f"{x}.seq"], a[f"{x}.bytes"],
            a[f"{x}.seconds"], a[f"{x}.messages"])
        return HostSummary(str(o["host"]), str(o["job"]), str(o["comm"]), int(o["nranks"]),
                           ranks, colls, recv("u", o["units"]), recv("p", o["pairs"]),
                           a["pair_unit"])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: a malformed window summary ({e!r})") from None
