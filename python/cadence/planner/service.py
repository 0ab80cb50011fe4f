"""The planner service: one process per cluster, shared by every job on it
(protocol.py says what it answers). It keeps every job's streams and the
spine each takes, places new ones where the busiest uplink stays lowest
(assign.py), finds source ports the fabric hashes onto the chosen spine
(asking the leaf's kernel, `fabric.next_spines`), watches the uplinks, and
when one goes down (or comes back) holds the streams that cross it (and
releases them) and tells the jobs at both ends of each. Every decision is
logged. A job's lease is its connection: when it closes, the job's streams
are forgotten.
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
from dataclasses import dataclass, field

from cadence import testbed
from cadence.planner import assign
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
    #: Per stream: held (an uplink it crosses is down).
    held: list[bool] = field(default_factory=list)

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
                            held=[False] * count))
        fresh = [s for c in new for s in c.both()]
        try:
            worst = assign.place(self.model, fresh, loads=self.loads)
        except ValueError as e:
            raise Refused(str(e)) from None
        # Taken out while the ports may still move a direction; back in
        # with the spines the ports give.
        self._count(fresh, -1)
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
            self._count(c.both(), 1)
        log.info("job %s: planned %d connections, %d streams each way; busiest uplink now %d "
                 "streams", job.name, len(new), len(fresh) // 2, worst)
        for c in new:
            log.debug("job %s: %s -> %s:%d weight %d: spines %s, back %s, ports %s", job.name,
                      c.src, c.dst, c.dport, c.streams[0].weight, [s.spine for s in c.streams],
                      [s.spine for s in c.back], [ps[:1] for ps in c.sports])
        return [self._path(c) for c in new]

    def _count(self, streams: list[assign.Stream], sign: int) -> None:
        """Adds `streams` to the kept loads (sign 1) or takes them out (-1)."""
        for s in streams:
            if s.spine is not None:
                self.loads.add(s, s.spine, sign)

    def _forget(self, c: Conn) -> None:
        """Frees a connection's ports and takes its live streams' load out."""
        self.taken.get(c.src, set()).difference_update(p for ps in c.sports for p in ps)
        for k, pair in enumerate(zip(c.streams, c.back, strict=True)):
            if not c.held[k]:
                self._count(list(pair), -1)

    def unplan(self, job: Job, ids) -> None:
        if not isinstance(ids, list):
            raise Refused("unplan needs ids: a list of connection ids")
        gone = [job.conns.pop(i) for i in ids if isinstance(i, str | int) and i in job.conns]
        for c in gone:
            self._forget(c)
        log.info("job %s: forgot %d connections (%d asked)", job.name, len(gone), len(ids))

    def release(self, job: Job) -> None:
        for c in job.conns.values():
            self._forget(c)
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
                 "held": sum(sum(c.held) for c in j.conns.values()), "since": j.since}
                for j in self.jobs.values()]  # fmt: skip
        return {"ok": True, "cluster": self.cluster.name, "jobs": jobs, "uplinks": uplinks,
                "excluded": sorted(map(list, self.excluded))}

    def forget(self, job: Job) -> None:
        self.release(job)
        self.jobs.pop(job.name, None)
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
        spine, where it would crowd the streams planned there), and the
        jobs that know it are told which to hold and which to release.
        Streams planned while an uplink is down avoid it."""
        gone, back = down - self.down, self.down - down
        self.down = set(down)
        self.model.dead = set(self.excluded) | self.down
        if not gone and not back:
            return []
        changed = [{"rack": r, "spine": m, "state": "down" if (r, m) in gone else "up"}
                   for r, m in sorted(gone | back)]  # fmt: skip
        tell: dict[str, dict[str, dict]] = {}
        counts = {"hold": 0, "release": 0}
        for job in self.jobs.values():
            for c in job.conns.values():
                for k, (s, b) in enumerate(zip(c.streams, c.back, strict=True)):
                    held = _crosses(s, self.down) or _crosses(b, self.down)
                    if held == c.held[k]:
                        continue
                    c.held[k] = held
                    # A held stream counts nothing until it is released.
                    self._count([s, b], -1 if held else 1)
                    verb = "hold" if held else "release"
                    counts[verb] += 1
                    for n in c.notify:
                        peers = tell.setdefault(n["job"], {}).setdefault(verb, {})
                        peers.setdefault(n["peer"], []).append(n["streams"][k])
        for ch in changed:
            log.warning("uplink rack %d spine %d %s", ch["rack"], ch["spine"], ch["state"])
        log.info("%d streams held, %d released", counts["hold"], counts["release"])
        events = []
        for name, verbs in tell.items():
            job = self.jobs.get(name)
            if job is None:
                continue  # that end holds no lease: nothing to tell it
            event = {"event": "links", "changed": changed}
            for verb in ("hold", "release"):
                event[verb] = [{"peer": p, "streams": sorted(ss)}
                               for p, ss in sorted(verbs.get(verb, {}).items(), key=str)]
            events.append((job, event))
        return events


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
