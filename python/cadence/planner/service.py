"""The planner service: one process per cluster, shared by every job on it
(protocol.py says what it answers). It keeps every job's streams and the
spine each takes, places new ones where the busiest uplink stays lowest
(assign.py), lays each connection's streams out over the spines and says
which of them carry (layout.py), finds source ports the fabric hashes onto
the chosen spine (asking the leaf's kernel, `fabric.next_spines`), watches
the uplinks, and when one goes down (or comes back) or a rack end fills,
holds and releases streams and tells the jobs at both ends of each. Every
decision is logged. A job's lease is its connection: when it closes, the
job's streams are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from cadence import testbed
from cadence.planner import assign, layout
from cadence.planner.protocol import MAX_LINE, VERSION, Address, encode
from cadence.testbed import fabric

log = logging.getLogger("cadence.planner")

#: Source ports handed out: below Linux's ephemeral range (32768-60999), so
#: a planned port never collides with one the kernel picked for a connect.
PORT_LO, PORT_HI = 20000, 32767
#: Ports offered per stream, all landing on its spine: the first, and one
#: for when the first is busy (another program bound it, or the same
#: connection's last incarnation lingers in TIME_WAIT); past them the
#: library lets the kernel pick. Each costs lookups: the search for them is
#: most of a request's cost.
PORTS_PER_STREAM = 2
#: How often the uplinks' states are read.
WATCH_S = 0.5
#: How often a connection whose request waits behind others is told so.
QUEUED_EVERY = 1.0
#: Connections not yet accepted that the listener keeps: every rank of a
#: job connects at once when it starts, and past the backlog a connect is
#: refused (asyncio's default is 100; the kernel caps it at somaxconn).
BACKLOG = 4096


class Refused(Exception):
    """A request the planner answers with an error (and, `close`, hangs up on)."""

    def __init__(self, message: str, close: bool = False):
        super().__init__(message)
        self.close = close


@dataclass
class Conn:
    """One connection of a job: its ends, and per stream its two
    directions: what the dialing side sends (`streams`, src's rack to dst's)
    and what the accepting side sends back on it (`back`). The switches hash
    each direction's 5-tuple on its own, so both are placed, and a source
    port is one that lands both where they were placed."""

    id: object
    src: str
    dst: str
    dport: int
    streams: list[assign.Stream]
    back: list[assign.Stream]
    sports: list[list[int]] = field(default_factory=list)
    #: Whom to tell when a stream is held or released, and how each names
    #: it: [{job, peer, streams}] (`streams[k]`: that job's name for stream
    #: k of this connection on its link to `peer`).
    notify: list[dict] = field(default_factory=list)
    #: Per stream: why it is held (it carries nothing), or None.
    held: list[str | None] = field(default_factory=list)
    #: The spine a laid-out connection carries on while it has one to itself
    #: (layout.py); None: not laid out, every stream live carries.
    home: int | None = None
    #: Whether it carries on one stream a live spine (layout.py).
    spread: bool = False
    #: Per stream: the spines its two directions count at in the loads.
    counted: list[tuple[int | None, int | None]] = field(default_factory=list)

    def both(self) -> list[assign.Stream]:
        return self.streams + self.back


@dataclass
class Job:
    name: str
    writer: asyncio.StreamWriter
    conns: dict = field(default_factory=dict)
    since: float = field(default_factory=time.time)

    def streams(self) -> list[assign.Stream]:
        return [s for c in self.conns.values() for s in c.both()]


class Planner:
    def __init__(self, cluster: testbed.Cluster, token: str, excluded: set | None = None,
                 seed: int = 0):
        if cluster.fabric is None:
            raise testbed.TestbedError(f"cluster {cluster.name} is not a routed fabric "
                                       "(cluster up --spines): nothing to plan")  # fmt: skip
        self.cluster = cluster
        self.f = cluster.fabric
        self.token = token
        self.excluded = set(excluded or ())
        self.down: set[tuple[int, int]] = set()
        self.model = assign.Fabric(cluster.racks, cluster.spines, set(self.excluded))
        #: The load of every stream planned and not held, kept as streams
        #: come and go: a request costs what it plans, not what every job
        #: planned before it (docs/traffic.md, "The planner at scale").
        self.loads = assign.Loads(self.model)
        self.jobs: dict[str, Job] = {}
        self.rng = random.Random(seed)
        #: Cluster address → (host, rack, the leaf's port it arrives on).
        self.where = {n.address: (h.index, cluster.rack_of[h.index], n.port)
                      for h in cluster.hosts for n in h.nics}  # fmt: skip
        #: Source ports handed out, per source address.
        self.taken: dict[str, set[int]] = {}
        #: Per rack end (rack, UP|DOWN): the connections that weigh
        #: something there (held or not), by id(): more of them than live
        #: spines and they all spread (layout.py).
        self.crowd: dict[tuple[int, int], dict[int, Conn]] = {}
        #: Per job name: the connections that name it in `notify` (a lease
        #: opened late is told what its streams already hold).
        self.notified: dict[str, dict[int, Conn]] = {}
        #: Holds and releases decided and not yet sent: job → verb → peer
        #: → streams; and why, for the events.
        self.tell: dict[str, dict[str, dict]] = {}
        self.why: list[str] = []
        #: Events for jobs other than the asker's answer, sent by the
        #: service after each request.
        self.outbox: list[tuple[Job, dict]] = []

    # ------------------------------------------------------------ requests

    def handle(self, job: Job | None, req: dict, writer) -> tuple[dict, Job | None]:
        if not isinstance(req, dict):
            raise Refused("a request is a JSON object", close=True)
        if req.get("v") != VERSION:
            raise Refused(f"protocol version {req.get('v')!r}; this planner speaks {VERSION}",
                          close=True)  # fmt: skip
        if not hmac.compare_digest(str(req.get("token", "")), self.token):
            raise Refused("unauthenticated: wrong or missing cluster token", close=True)
        op = req.get("op")
        if op not in ("hello", "plan", "unplan", "release", "status"):
            raise Refused(f"unknown op {op!r} (hello, plan, unplan, release, status)")
        if op == "hello":
            name = _text(req, "job")
            if job is None:
                if name in self.jobs:
                    raise Refused(f"job {name!r} already holds a lease on another connection")
                job = Job(name, writer)
                self.jobs[name] = job
                log.info("job %s: lease opened", name)
                self._tell_held(name)
            return {"ok": True, "planner": str(self.f.prefix), "racks": self.cluster.racks,
                    "spines": self.cluster.spines,
                    "excluded": sorted(map(list, self.excluded))}, job  # fmt: skip
        if op == "status":
            return self.status(), job
        if job is None:
            raise Refused(f"{op!r} before hello: say which job first")
        if op == "plan":
            return {"ok": True, "paths": self.plan(job, req.get("connections"))}, job
        if op == "unplan":
            self.unplan(job, req.get("ids"))
            return {"ok": True}, job
        self.release(job)
        return {"ok": True}, job

    def plan(self, job: Job, conns) -> list[dict]:
        if not isinstance(conns, list) or not conns:
            raise Refused("plan needs connections: a non-empty list")
        new: list[Conn] = []
        for i, c in enumerate(conns):
            if not isinstance(c, dict):
                raise Refused(f"connection {i} is not an object")
            src, dst = _text(c, "src"), _text(c, "dst")
            for a in (src, dst):
                if a not in self.where:
                    raise Refused(f"connection {i}: {a} is no address of cluster "
                                  f"{self.cluster.name}")  # fmt: skip
            dport, count = _int(c, "dport", 1, 65535), _int(c, "streams", 1, 64)
            weight = _int(c, "weight", 0, 1000) if "weight" in c else 1
            back_weight = _int(c, "back_weight", 0, 1000) if "back_weight" in c else weight
            cid = c.get("id", i)
            if cid in job.conns or any(x.id == cid for x in new):
                raise Refused(f"connection id {cid!r} planned twice for job {job.name}")
            notify = _notify(c, i, job.name, count)
            rs, rd = self.where[src][1], self.where[dst][1]
            streams = [assign.Stream((job.name, cid, k), rs, rd, weight) for k in range(count)]
            back = [assign.Stream((job.name, cid, k, "back"), rd, rs, back_weight)
                    for k in range(count)]
            new.append(Conn(cid, src, dst, dport, streams, back, notify=notify,
                            held=[None] * count, counted=[(None, None)] * count))
        fresh = [s for c in new for s in c.both()]
        try:
            assign.place(self.model, fresh, loads=self.loads)
        except ValueError as e:
            raise Refused(str(e)) from None
        # Taken out while the layout and the ports may still move a stream;
        # back in as `_settle` counts them.
        self._count(fresh, -1)
        for c in new:
            self._lay_out(c)
        done: list[Conn] = []
        try:
            for c in new:
                # A direction that counts nothing follows the other onto its
                # spine: one source port must land both where they were put,
                # and a symmetric hash (the kernel's here) offers no other pair.
                for s, b in zip(c.streams, c.back, strict=True):
                    if s.spine is None:
                        continue
                    if b.weight == 0:
                        b.spine = s.spine
                    elif s.weight == 0:
                        s.spine = b.spine
                c.sports = self._ports(c, job)
                done.append(c)
        except Exception:
            for c in done:  # a request that fails plans nothing
                self.taken.get(c.src, set()).difference_update(p for ps in c.sports for p in ps)
            raise
        for c in new:
            job.conns[c.id] = c
            for n in c.notify:
                self.notified.setdefault(n["job"], {})[id(c)] = c
        moved = self._enter(new)
        for c in new:
            self._settle(c)
        if any(any(c.held) for c in new):
            self.why.append("new connections carry on their home spines; the others stand by")
        for c in moved.values():
            self._settle(c)
        self.outbox.extend(self._events([]))
        log.info("job %s: planned %d connections, %d streams each way; busiest uplink now %d "
                 "streams", job.name, len(new), len(fresh) // 2, self.loads.worst())
        for c in new:
            log.debug("job %s: %s -> %s:%d weight %d: spines %s, back %s, home %s%s, ports %s",
                      job.name, c.src, c.dst, c.dport, c.streams[0].weight,
                      [s.spine for s in c.streams], [s.spine for s in c.back], c.home,
                      " (spread)" if c.spread else "", [ps[:1] for ps in c.sports])
        return [self._path(c) for c in new]

    def _lay_out(self, c: Conn) -> None:
        """One stream of `c` on every live spine between its racks and the
        rest on its home (where `place` put the heavier direction), both
        directions alike (layout.py); a connection inside a rack, one that
        weighs nothing, or one with fewer streams than spines is not laid
        out."""
        s0, b0 = c.streams[0], c.back[0]
        if s0.src == s0.dst or not (s0.weight or b0.weight):
            return
        lead = c.streams if s0.weight >= b0.weight else c.back
        home = Counter(s.spine for s in lead).most_common(1)[0][0]
        spines = layout.lay_out(len(c.streams), home, self.model.spines_for(s0.src, s0.dst))
        if spines is None:
            return
        c.home = home
        for s, b, m in zip(c.streams, c.back, spines, strict=True):
            s.spine = b.spine = m

    @staticmethod
    def _ends(c: Conn) -> list[tuple[int, int]]:
        """The rack ends (rack, UP|DOWN) where `c` weighs something."""
        s0, b0 = c.streams[0], c.back[0]
        if s0.src == s0.dst:
            return []
        return ([(s0.src, assign.UP), (s0.dst, assign.DOWN)] if s0.weight else []) + (
            [(b0.src, assign.UP), (b0.dst, assign.DOWN)] if b0.weight else [])

    def _live(self, rack: int) -> int:
        return sum(self.model.live(rack, m) for m in range(self.model.spines))

    def _crowded(self, end: tuple[int, int]) -> bool:
        """More connections weigh at `end` than its rack has live spines."""
        return len(self.crowd.get(end, ())) > self._live(end[0])

    def _enter(self, conns: list[Conn], sign: int = 1) -> dict[int, Conn]:
        """Adds `conns` to the rack ends they weigh at (sign -1: takes them
        out); returns the other connections at every end that became
        crowded or stopped being so (they spread, or go home: `_settle`)."""
        ends = {e for c in conns for e in self._ends(c)}
        before = {e: self._crowded(e) for e in ends}
        for c in conns:
            for e in self._ends(c):
                at = self.crowd.setdefault(e, {})
                if sign > 0:
                    at[id(c)] = c
                else:
                    at.pop(id(c), None)
        moved: dict[int, Conn] = {}
        for e in sorted(ends):
            if self._crowded(e) != before[e]:
                n, live = len(self.crowd.get(e, ())), self._live(e[0])
                self.why.append(
                    f"rack {e[0]} {'sends' if e[1] == assign.UP else 'receives'} "
                    f"{n} connections over {live} live spines: each carries on " + (
                        "one stream a spine" if n > live else "a spine of its own"))
                moved.update(self.crowd.get(e, {}))
        gone = {id(c) for c in conns} if sign < 0 else set()
        return {k: c for k, c in moved.items() if k not in gone}

    def _settle(self, c: Conn) -> None:
        """Which of `c`'s streams carry now (layout.py), given the uplinks
        down and how crowded its ends are; the loads count what carries
        (a connection together: all of it at its home, which moves when
        its home's uplink is down), and the holds and releases that
        changes make are queued for the jobs (`_events`)."""
        dead = self.model.dead
        pairs = list(zip(c.streams, c.back, strict=True))
        for (s, b), (ms, mb) in zip(pairs, c.counted, strict=True):
            if ms is not None:
                self.loads.add(s, ms, -1)
            if mb is not None:
                self.loads.add(b, mb, -1)
        cut = [_crosses(s, dead) or _crosses(b, dead) for s, b in pairs]
        spines = [s.spine for s in c.streams]
        if c.home is None:
            held = [layout.CUT if x else None for x in cut]
            counted = [(None, None) if x else (s.spine, b.spine) for x, (s, b) in zip(
                cut, pairs, strict=True)]
        else:
            was_spread, c.spread = c.spread, any(self._crowded(e) for e in self._ends(c))
            live = {m for m, x in zip(spines, cut, strict=True) if not x}
            # A home is chosen again where the old one is down, and when
            # the connection comes back from spread: it was chosen in a
            # crowd, where homes could not all differ.
            if not c.spread and (was_spread or c.home not in live) and live:
                unit = assign.Stream(None, c.streams[0].src, c.streams[0].dst,
                                     sum(s.weight for s in c.streams))
                c.home = min(sorted(live), key=lambda m: (self.loads.after(unit, m), m))
                log.debug("%s -> %s:%d: home spine now %d", c.src, c.dst, c.dport, c.home)
            held = layout.carrying(spines, cut, c.home, c.spread)
            if c.spread or c.home not in live:
                counted = [(None, None) if h else (m, m) for h, m in zip(held, spines,
                                                                          strict=True)]
            else:
                counted = [(c.home, c.home)] * len(pairs)
        for (s, b), (ms, mb) in zip(pairs, counted, strict=True):
            if ms is not None:
                self.loads.add(s, ms)
            if mb is not None:
                self.loads.add(b, mb)
        c.counted = counted
        for k, h in enumerate(held):
            if bool(h) != bool(c.held[k]):
                self._tell(c, k, "hold" if h else "release")
            c.held[k] = h

    def _tell(self, c: Conn, k: int, verb: str, only: str | None = None) -> None:
        """Queues `verb` for stream k of `c` to every job it names (or
        `only` that one)."""
        for n in c.notify:
            if only is None or n["job"] == only:
                self._queue(n["job"], verb, n["peer"], n["streams"][k])

    def _queue(self, job: str, verb: str, peer, stream: int) -> None:
        """Queues `verb` (hold or release) of one stream for `job`; the
        latest word on a stream replaces an earlier one not yet sent (the
        library applies an event's holds before its releases)."""
        verbs = self.tell.setdefault(job, {})
        other = verbs.get("release" if verb == "hold" else "hold", {}).get(peer)
        if other is not None and stream in other:
            other.remove(stream)
        queued = verbs.setdefault(verb, {}).setdefault(peer, [])
        if stream not in queued:
            queued.append(stream)

    def _held_by_another(self, job: str, peer, stream: int) -> bool:
        """Whether a connection still kept holds `job`'s stream `stream` to
        `peer` (`notified`: the connections naming `job`)."""
        return any(n["job"] == job and n["peer"] == peer and c.held[k]
                   for c in self.notified.get(job, {}).values()
                   for n in c.notify for k, s in enumerate(n["streams"]) if s == stream)

    def _retell(self, gone: Conn) -> None:
        """The streams a forgotten connection named, as the connections
        kept that name them say. Two connections can name one link's
        streams: both ranks of a pair ask for the link they share (a job of
        two ranks, whose next rank is also the one before), and the one
        whose dial lost is forgotten; a library keeps one hold a stream, so
        the last word either gave stands until it is told again."""
        for n in gone.notify:
            for k, stream in enumerate(n["streams"]):
                if self._held_by_another(n["job"], n["peer"], stream):
                    self._queue(n["job"], "hold", n["peer"], stream)
                elif gone.held[k]:
                    self._queue(n["job"], "release", n["peer"], stream)
        gone.held = [None] * len(gone.held)

    def _tell_held(self, name: str) -> None:
        """A lease opened: the streams it names that are already held."""
        for c in self.notified.get(name, {}).values():
            for k, h in enumerate(c.held):
                if h:
                    self._tell(c, k, "hold", only=name)
        if self.tell:
            self.why.append("streams held before this lease opened")
            self.outbox.extend(self._events([]))

    def _events(self, changed: list[dict]) -> list[tuple[Job, dict]]:
        """The queued holds and releases as one event per job with a lease
        (a job without one is told when it opens it), and why."""
        events = []
        why = "; ".join(dict.fromkeys(self.why))
        for name, verbs in self.tell.items():
            job = self.jobs.get(name)
            if job is None:
                continue
            event = {"event": "links", "changed": changed}
            if why:
                event["why"] = why
            for verb in ("hold", "release"):
                event[verb] = [{"peer": p, "streams": sorted(ss)}
                               for p, ss in sorted(verbs.get(verb, {}).items(), key=str)]
            events.append((job, event))
        if self.tell:
            log.info("%s: %d streams held, %d released", why or "links changed",
                     sum(len(ss) for v in self.tell.values() for ss in v.get("hold", {}).values()),
                     sum(len(ss) for v in self.tell.values()
                         for ss in v.get("release", {}).values()))  # fmt: skip
        self.tell, self.why = {}, []
        return events

    def _count(self, streams: list[assign.Stream], sign: int) -> None:
        """Adds `streams` to the kept loads (sign 1) or takes them out (-1)."""
        for s in streams:
            if s.spine is not None:
                self.loads.add(s, s.spine, sign)

    def _forget(self, gone: list[Conn]) -> None:
        """Frees connections' ports and takes their load out; connections
        at ends they leave uncrowded go home (`_settle`)."""
        for c in gone:
            self.taken.get(c.src, set()).difference_update(p for ps in c.sports for p in ps)
            for (s, b), (ms, mb) in zip(zip(c.streams, c.back, strict=True), c.counted,
                                        strict=True):  # fmt: skip
                if ms is not None:
                    self.loads.add(s, ms, -1)
                if mb is not None:
                    self.loads.add(b, mb, -1)
            c.counted = [(None, None)] * len(c.streams)
            for n in c.notify:
                named = self.notified.get(n["job"], {})
                named.pop(id(c), None)
                if not named:
                    self.notified.pop(n["job"], None)
        for c in gone:
            self._retell(c)
        for c in self._enter(gone, -1).values():
            self._settle(c)
        self.outbox.extend(self._events([]))

    def unplan(self, job: Job, ids) -> None:
        if not isinstance(ids, list):
            raise Refused("unplan needs ids: a list of connection ids")
        gone = [job.conns.pop(i) for i in ids if isinstance(i, str | int) and i in job.conns]
        self._forget(gone)
        log.info("job %s: forgot %d connections (%d asked)", job.name, len(gone), len(ids))

    def release(self, job: Job) -> None:
        self._forget(list(job.conns.values()))
        n = len(job.conns)
        job.conns.clear()
        log.info("job %s: released %d connections", job.name, n)

    def status(self) -> dict:
        loads = self.loads
        uplinks = [{"rack": r, "spine": m, "up": loads.of(r, m, assign.UP),
                    "down": loads.of(r, m, assign.DOWN),
                    "state": ("excluded" if (r, m) in self.excluded else
                              "down" if (r, m) in self.down else "up")}
                   for r in range(self.cluster.racks) for m in range(self.cluster.spines)]
        jobs = [{"job": j.name, "connections": len(j.conns), "streams": len(j.streams()) // 2,
                 "held": sum(bool(h) for c in j.conns.values() for h in c.held),
                 "spread": sum(c.spread for c in j.conns.values()), "since": j.since}
                for j in self.jobs.values()]  # fmt: skip
        return {"ok": True, "cluster": self.cluster.name, "jobs": jobs, "uplinks": uplinks,
                "excluded": sorted(map(list, self.excluded))}

    def forget(self, job: Job) -> None:
        # Out of `jobs` first: a lease that ends is told nothing more.
        self.jobs.pop(job.name, None)
        self.release(job)
        log.info("job %s: lease ended", job.name)

    # ------------------------------------------------------------- paths

    def _path(self, c: Conn) -> dict:
        return {"id": c.id, "src": c.src, "dst": c.dst, "dport": c.dport,
                "streams": [{"spine": s.spine, "back": b.spine, "sports": ps}
                            for s, b, ps in zip(c.streams, c.back, c.sports, strict=True)]}

    def _ports(self, c: Conn, job: Job) -> list[list[int]]:
        """Per stream of `c`, source ports that put its two directions on
        their spines. A stream inside a rack needs none. Where no port
        gives a stream's pair of spines (a symmetric hash gives none that
        differ), the heavier direction keeps its spine and the other goes
        where the ports found take it (the stream then counts there).
        A stream that counts nothing either way goes where its first port
        takes it: it is not worth a search."""
        _host, rack, port = self.where[c.src]
        _host, back_rack, back_port = self.where[c.dst]
        taken = self.taken.setdefault(c.src, set())
        lk = [k for k, (s, b) in enumerate(zip(c.streams, c.back, strict=True))
              if s.spine is not None and s.weight == b.weight == 0]  # fmt: skip
        pool = self._free_ports(taken, PORTS_PER_STREAM * len(lk))
        light = {k: pool[i * PORTS_PER_STREAM:(i + 1) * PORTS_PER_STREAM]
                 for i, k in enumerate(lk)}  # fmt: skip
        if light:
            firsts = [ps[0] for ps in light.values()]
            there = fabric.next_spines(self.f, rack, port, c.src, c.dst,
                                       [(p, c.dport) for p in firsts])  # fmt: skip
            back = fabric.next_spines(self.f, back_rack, back_port, c.dst, c.src,
                                      [(c.dport, p) for p in firsts])  # fmt: skip
            for k, m, mb in zip(light, there, back, strict=True):
                c.streams[k].spine, c.back[k].spine = m, mb
                taken.update(light[k])
        pairs = [(s, b) for k, (s, b) in enumerate(zip(c.streams, c.back, strict=True))
                 if s.spine is not None and k not in light]  # fmt: skip
        need: dict[tuple, int] = {}
        for s, b in pairs:
            need[(s.spine, b.spine)] = need.get((s.spine, b.spine), 0) + PORTS_PER_STREAM
        # Where every stream's way there weighs at least its way back (the
        # library's), the way back is asked only of ports whose way there
        # is one some stream wants: a fallback keeps the way there.
        ups = None if any(b.weight > s.weight for s, b in pairs) else {w[0] for w in need}
        spines = self.cluster.spines
        found: dict[tuple, list[int]] = {}
        tried = 0
        for _ in range(64):
            missing = {w: n - len(found.get(w, ())) for w, n in need.items()
                       if len(found.get(w, ())) < n}  # fmt: skip
            # A pair no port gave in many tries is one the hash never gives
            # (a symmetric hash: both directions on one spine).
            if not missing or (tried >= 64 * spines ** 2
                               and not any(found.get(w) for w in missing)):
                break
            # As many tries as the pairs' share of ports so far says the
            # most missing needs (at first: as if one way chose the spine).
            share = {w: max(len(found.get(w, ())) / tried, spines ** -2) if tried else 1 / spines
                     for w in missing}  # fmt: skip
            size = min(4096, 16 + math.ceil(1.3 * max(n / share[w] for w, n in missing.items())))
            tries = [p for p in self.rng.sample(range(PORT_LO, PORT_HI + 1), size)
                     if p not in taken]  # fmt: skip
            there = fabric.next_spines(self.f, rack, port, c.src, c.dst,
                                       [(p, c.dport) for p in tries])  # fmt: skip
            asked = [p for p, m in zip(tries, there, strict=True) if ups is None or m in ups]
            back = dict(zip(asked, fabric.next_spines(
                self.f, back_rack, back_port, c.dst, c.src, [(c.dport, p) for p in asked]),
                strict=True))  # fmt: skip
            tried += len(tries)
            cap = max(need.values())
            for p, m in zip(tries, there, strict=True):
                w = (m, back.get(p))
                if p in back and len(found.setdefault(w, [])) < need.get(w, cap):
                    found[w].append(p)
        out = []
        for k, (s, b) in enumerate(zip(c.streams, c.back, strict=True)):
            if s.spine is None or k in light:
                out.append(light.get(k, []))
                continue
            pair = (s.spine, b.spine)
            if not found.get(pair):
                pair = self._nearest_pair(found, s, b)
                log.info("job %s: %s -> %s:%d stream %d: no source port takes it over spine %s "
                         "and back over %s; %s instead", job.name, c.src, c.dst, c.dport, k,
                         s.spine, b.spine, pair)  # fmt: skip
                if pair is None:
                    raise Refused(f"no source port of {c.src} reaches {c.dst}:{c.dport} over "
                                  f"spine {s.spine}")  # fmt: skip
                s.spine, b.spine = pair
            ps = found[pair][:PORTS_PER_STREAM]
            del found[pair][:PORTS_PER_STREAM]
            taken.update(ps)
            out.append(ps)
        return out

    def _free_ports(self, taken: set[int], n: int) -> list[int]:
        """`n` random planned source ports not in `taken`."""
        pool = [p for p in self.rng.sample(range(PORT_LO, PORT_HI + 1), 2 * n + 16)
                if p not in taken][:n]  # fmt: skip
        if len(pool) < n:  # most are taken: draw from the free ones
            free = [p for p in range(PORT_LO, PORT_HI + 1) if p not in taken]
            if len(free) < n:
                raise Refused(f"{len(taken)} of the {PORT_HI - PORT_LO + 1} planned source "
                              f"ports of this address are taken")  # fmt: skip
            pool = self.rng.sample(free, n)
        return pool

    @staticmethod
    def _nearest_pair(found: dict[tuple, list[int]], s: assign.Stream,
                      b: assign.Stream) -> tuple[int, int] | None:
        """Of the spine pairs some port gives, one where the heavier of the
        stream's two directions keeps its spine (the most ports first)."""
        heavy = 0 if s.weight >= b.weight else 1
        spine = (s.spine, b.spine)[heavy]
        pairs = [w for w, ps in found.items()
                 if ps and None not in w and w[heavy] == spine]  # fmt: skip
        return max(pairs, key=lambda w: len(found[w]), default=None)

    # -------------------------------------------------------------- links

    def links_changed(self, down: set[tuple[int, int]]) -> list[tuple[Job, dict]]:
        """The uplinks now down: every stream that crosses one, either way,
        is held (it carries nothing and counts nothing until every uplink
        it crosses is back; the fabric may have rehashed it onto a live
        spine, where it would crowd the streams planned there), laid-out
        connections spread or go home as their ends' live spines say
        (layout.py), and the jobs that know each stream are told which to
        hold and which to release. Streams planned while an uplink is down
        avoid it."""
        gone, back = down - self.down, self.down - down
        self.down = set(down)
        self.model.dead = set(self.excluded) | self.down
        if not gone and not back:
            return []
        changed = [{"rack": r, "spine": m, "state": "down" if (r, m) in gone else "up"}
                   for r, m in sorted(gone | back)]  # fmt: skip
        for ch in changed:
            log.warning("uplink rack %d spine %d %s", ch["rack"], ch["spine"], ch["state"])
        for job in self.jobs.values():
            for c in job.conns.values():
                self._settle(c)
        return self._events(changed)


def _crosses(s: assign.Stream, down: set[tuple[int, int]]) -> bool:
    """Whether stream direction `s` leaves or enters its rack on an uplink
    in `down`."""
    return s.spine is not None and ((s.src, s.spine) in down or (s.dst, s.spine) in down)


def _text(obj: dict, key: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not v:
        raise Refused(f"{key!r} must be a non-empty string")
    return v


def _notify(c: dict, i: int, job: str, count: int) -> list[dict]:
    """A connection's `notify` (default: the job that plans it, naming the
    connection by its id and its streams 0..count-1), checked."""
    if "notify" not in c:
        return [{"job": job, "peer": c.get("id", i), "streams": list(range(count))}]
    got = c["notify"]
    if not isinstance(got, list) or not got or len(got) > 2:
        raise Refused(f"connection {i}: notify must be a list of one or two ends")
    out = []
    for n in got:
        if not isinstance(n, dict):
            raise Refused(f"connection {i}: a notify entry is not an object")
        streams = n.get("streams")
        if (not isinstance(streams, list) or len(streams) != count
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 4096
                           for x in streams)):  # fmt: skip
            raise Refused(f"connection {i}: notify streams must be {count} stream numbers")
        out.append({"job": _text(n, "job"), "peer": _int(n, "peer", 0, 1 << 30),
                    "streams": streams})  # fmt: skip
    return out


def _int(obj: dict, key: str, lo: int, hi: int) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise Refused(f"{key!r} must be an integer {lo}..{hi}, not {v!r}")
    return v


# ---------------------------------------------------------------- serving


async def serve(planner: Planner, address: Address, ready=None) -> None:
    """Serves until cancelled; `ready()` is called once listening.

    Requests are answered one at a time, in the order they came (one
    worker, one request a turn of the loop): between two, the loop reads
    new requests and the ticker tells every connection whose request has
    waited QUEUED_EVERY or more how many are ahead of it (`queued` events),
    so that a rank behind a burst of thousands waits for a planner it
    hears from, and gives up only one that says nothing (`ANSWER_WITHIN` in
    the library)."""

    clients: set[asyncio.Task] = set()
    queue: asyncio.Queue = asyncio.Queue()
    waiting: dict[asyncio.StreamWriter, float] = {}  # in the queue's order

    async def work() -> None:
        while True:
            job, req, writer, done = await queue.get()
            waiting.pop(writer, None)
            try:
                reply, job = planner.handle(job, req, writer)
                close = False
            except Refused as e:
                reply, close = {"ok": False, "error": str(e)}, e.close
            except testbed.TestbedError as e:
                reply, close = {"ok": False, "error": str(e)}, False
            except Exception as e:  # noqa: BLE001 - one request's bug stops no other
                log.exception("answering %s", str(req)[:200])
                reply, close = {"ok": False, "error": f"planner error: {e!r}"}, False
            _send(planner.outbox)
            if not done.done():  # its connection may be gone
                done.set_result((reply, job, close))
            # One request a turn of the loop: between two, new requests are
            # read and the ticker runs.
            await asyncio.sleep(0)

    async def answer(job: Job | None, req, writer) -> tuple[dict, Job | None, bool]:
        done = asyncio.get_running_loop().create_future()
        waiting[writer] = time.monotonic()
        queue.put_nowait((job, req, writer, done))
        try:
            return await done
        finally:
            waiting.pop(writer, None)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        job: Job | None = None
        clients.add(asyncio.current_task())
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    writer.write(encode({"ok": False, "error": f"request over {MAX_LINE} B"}))
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                except ValueError:
                    writer.write(encode({"ok": False, "error": "not a JSON line"}))
                    break
                reply, job, close = await answer(job, req, writer)
                writer.write(encode(reply))
                if close:
                    break
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            clients.discard(asyncio.current_task())
            if job is not None:
                planner.forget(job)
                _send(planner.outbox)
            writer.close()

    async def tick() -> None:
        while True:
            await asyncio.sleep(QUEUED_EVERY)
            now = time.monotonic()
            for ahead, (w, since) in enumerate(list(waiting.items())):
                if now - since >= QUEUED_EVERY:
                    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                        w.write(encode({"event": "queued", "ahead": ahead}))

    if address.kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address.path)
        server = await asyncio.start_unix_server(client, address.path, limit=MAX_LINE,
                                                 backlog=BACKLOG)  # fmt: skip
        os.chmod(address.path, 0o666)  # the token, not the path, guards it
    else:
        server = await asyncio.start_server(client, address.host, address.port, limit=MAX_LINE,
                                            backlog=BACKLOG)  # fmt: skip
    watcher = asyncio.create_task(_watch(planner))
    ticker = asyncio.create_task(tick())
    worker = asyncio.create_task(work())
    log.info("planner for cluster %s listening on %s (%d racks x %d spines%s)",
             planner.cluster.name, address, planner.cluster.racks, planner.cluster.spines,
             f", excluded {sorted(planner.excluded)}" if planner.excluded else "")
    if ready is not None:
        ready()
    try:
        async with server:
            await server.serve_forever()
    finally:
        for task in (watcher, ticker, worker, *clients):  # stopping: every connection closes
            task.cancel()
        await asyncio.gather(watcher, ticker, worker, *clients, return_exceptions=True)
        if address.kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address.path)


def _send(events: list[tuple[Job, dict]]) -> None:
    """Writes each event to its job's connection (one that is gone hears
    nothing; its lease ends with it) and empties the list."""
    for job, event in events:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            job.writer.write(encode(event))
    events.clear()


async def _watch(planner: Planner) -> None:
    """Reads the uplinks' states every WATCH_S and acts on changes."""
    while True:
        try:
            states = await asyncio.to_thread(testbed.uplink_states, planner.cluster)
            down = {(s.uplink.rack, s.uplink.nic) for s in states if s.state != "up"}
            for job, event in planner.links_changed(down):
                with contextlib.suppress(ConnectionError, OSError):
                    job.writer.write(encode(event))
                    await job.writer.drain()
        except testbed.TestbedError as e:
            log.warning("reading the uplinks failed: %s", e)
        await asyncio.sleep(WATCH_S)
