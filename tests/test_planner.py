"""The path planner (C4P, docs/traffic.md): the assignment of streams to
spines (optimal on small cases, at the lower bound with every uplink
live), the protocol (authenticated, one-line errors, a lease per
connection), and on a routed emulated cluster (root): planned source ports
land on their spines, a cut uplink holds the streams that cross it and tells
the jobs at both ends, a
planner that dies leaves its clients an error, not a hang."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import socket
import sys
import threading
import time

import pytest
from cadence import testbed
from cadence.planner import assign
from cadence.planner.protocol import Client, PlannerError, encode
from cadence.planner.service import Planner, Refused, serve
from clusters import why_no_clusters

WHY_NO_CLUSTERS = why_no_clusters()
needs_clusters = pytest.mark.skipif(WHY_NO_CLUSTERS is not None, reason=str(WHY_NO_CLUSTERS))
TOKEN = "t0ken"


# ------------------------------------------------------------- assignment


def _brute_force(f: assign.Fabric, streams: list[assign.Stream]) -> int:
    cross = [s for s in streams if s.src != s.dst]
    best = 0 if not cross else None
    for combo in itertools.product(*(f.spines_for(s.src, s.dst) for s in cross)):
        loads = assign.Loads(f)
        for s, m in zip(cross, combo, strict=True):
            loads.add(s, m)
        best = loads.worst() if best is None else min(best, loads.worst())
    return best


def test_the_assignment_is_optimal_on_small_cases():
    rng = random.Random(7)
    checked = 0
    for _ in range(400):
        racks, spines = rng.randint(2, 4), rng.randint(1, 3)
        dead = {(rng.randrange(racks), rng.randrange(spines))
                for _ in range(rng.choice((0, 0, 1, 2)))}  # fmt: skip
        f = assign.Fabric(racks, spines, dead)
        streams = [assign.Stream(i, rng.randrange(racks), rng.randrange(racks))
                   for i in range(rng.randint(1, 8))]  # fmt: skip
        if any(not f.spines_for(s.src, s.dst) for s in streams if s.src != s.dst):
            with pytest.raises(ValueError, match="no live spine"):
                assign.place(f, streams)
            continue
        assert assign.place(f, streams) == _brute_force(f, streams), (racks, spines, dead)
        checked += 1
    assert checked > 250


def test_with_every_uplink_live_the_busiest_is_the_lower_bound():
    rng = random.Random(8)
    for _ in range(200):
        racks, spines = rng.randint(2, 8), rng.randint(1, 8)
        f = assign.Fabric(racks, spines)
        streams = [assign.Stream(i, rng.randrange(racks), rng.randrange(racks))
                   for i in range(rng.randint(1, 200))]  # fmt: skip
        cross = [s for s in streams if s.src != s.dst]
        want = assign.lower_bound(f, cross) if cross else 0
        assert assign.place(f, streams) == want
        assert all((s.spine is None) == (s.src == s.dst) for s in streams)


def test_other_jobs_streams_stay_and_a_dead_uplink_carries_nothing():
    f = assign.Fabric(2, 2)
    first = [assign.Stream(("a", k), 0, 1) for k in range(4)]
    assign.place(f, first)
    where = [s.spine for s in first]
    second = [assign.Stream(("b", k), 0, 1) for k in range(4)]
    assert assign.place(f, second, fixed=first) == 4
    assert [s.spine for s in first] == where
    f.dead = {(1, 0)}
    assert assign.place(f, first + second, rebalance=True) == 8
    assert {s.spine for s in first + second} == {1}


def test_a_connections_streams_go_together_while_each_can_have_a_spine():
    """A connection's streams (keys (job, connection, k)) take one spine
    while its rack ends have a spine for each connection; past that they
    spread, so that sharing is even."""
    f = assign.Fabric(2, 2)

    def conn(job, n=2, weight=1):
        return [assign.Stream((job, "c", k), 0, 1, weight) for k in range(n)]

    a = conn("a")
    assign.place(f, a)
    assert len({s.spine for s in a}) == 1
    b = conn("b")
    assign.place(f, b, fixed=a)
    assert len({s.spine for s in b}) == 1 and b[0].spine != a[0].spine
    c = conn("c")
    assert assign.place(f, c, fixed=a + b) == 3
    assert sorted(s.spine for s in c) == [0, 1]
    # A connection that carries nothing (a set-up barrier's) takes no room:
    # the second of two that do still gets a spine of its own.
    f = assign.Fabric(2, 2)
    w = conn("w", weight=0)
    assign.place(f, w)
    a = conn("a")
    assign.place(f, a, fixed=w)
    d = conn("d", 4)
    assign.place(f, d, fixed=w + a)
    assert len({s.spine for s in d}) == 1 and d[0].spine != a[0].spine
    # One spine of four excluded, four connections of four streams: three
    # take a spine each, the fourth spreads over them (the lower bound, 6).
    f = assign.Fabric(2, 4, {(1, 0)})
    placed: list[assign.Stream] = []
    for job in "abcd":
        streams = conn(job, 4)
        worst = assign.place(f, streams, fixed=placed)
        placed += streams
    assert worst == 6 == assign.lower_bound(f, placed)
    assert [len({s.spine for s in placed[4 * j:4 * j + 4]}) for j in range(4)] == [1, 1, 1, 3]


def _hashed(spines: int):
    """A leaf kernel's stand-in: a 5-tuple hash, not symmetric."""
    import zlib

    def next_spines(_f, _rack, _port, src, dst, ports):
        return [zlib.crc32(f"{src} {dst} {sp} {dp}".encode()) % spines for sp, dp in ports]

    return next_spines


def test_a_request_costs_what_it_plans_not_what_was_planned_before(monkeypatch):
    """256 ranks (each its own lease, as the library opens them) plan their
    ring link and a light link: the loads a request touches and the ports
    it has looked up do not grow with the leases before it (they did: every
    request rebuilt every job's loads, and a burst of n ranks cost the
    planner O(n^2)). The loads kept across requests stay what a rebuild
    from every lease gives, through plans, unplans, releases, a cut and a
    restore."""
    from cadence.testbed import fabric

    monkeypatch.setattr(fabric, "next_spines", _hashed(4))
    asked = []
    real_next = fabric.next_spines
    monkeypatch.setattr(fabric, "next_spines",
                        lambda *a: asked.append(len(a[-1])) or real_next(*a))  # fmt: skip
    adds = []
    real_add = assign.Loads.add
    monkeypatch.setattr(assign.Loads, "add", lambda *a, **k: adds.append(1) or real_add(*a, **k))
    cluster = testbed.build("plcost", 32, 1, "100mbit", racks=8, spines=4)
    p = Planner(cluster, TOKEN, seed=3)
    ok = {"v": 1, "token": TOKEN}
    n = 256
    addr = [cluster.hosts[r % 32].nics[0].address for r in range(n)]
    cost = []
    for r in range(n):
        _, job = p.handle(None, {**ok, "op": "hello", "job": f"j/r{r}"}, None)
        adds.clear(), asked.clear()
        conns = [{"id": f"{(r + d) % n}/0", "src": addr[r], "dst": addr[(r + d) % n],
                  "dport": 20000 + (r + d) % n, "streams": 4, "weight": w, "back_weight": 0}
                 for d, w in ((1, 1), (2, 0))]  # fmt: skip
        answer, _ = p.handle(job, {**ok, "op": "plan", "connections": conns}, None)
        assert answer["ok"], answer
        cost.append((len(adds), sum(asked)))
    # 16 streams both ways a request: each is added a few times (as its
    # connection, alone, without and with its ports' spines) and may move
    # in the balance; the leases before it weigh nothing (the old planner
    # added every one of them: some 3,000 by the last request).
    assert max(a for a, _ in cost) <= 16 * 16, cost
    first, last = cost[: n // 4], cost[-n // 4:]
    for i in (0, 1):
        assert sum(c[i] for c in last) <= 2 * sum(c[i] for c in first), (first, last)

    def rebuilt() -> dict:
        loads = assign.Loads(p.model)
        for j in p.jobs.values():
            for c in j.conns.values():
                for k, pair in enumerate(zip(c.streams, c.back, strict=True)):
                    for s in pair:
                        if s.spine is not None and not c.held[k]:
                            real_add(loads, s, s.spine)
        return {k: v for k, v in loads.w.items() if v}

    def kept() -> dict:
        return {k: v for k, v in p.loads.w.items() if v}

    assert kept() == rebuilt() and kept()
    p.handle(p.jobs["j/r5"], {**ok, "op": "unplan", "ids": ["6/0"]}, None)
    p.forget(p.jobs["j/r9"])
    assert kept() == rebuilt()
    p.links_changed({(1, 2), (4, 0)})
    assert kept() == rebuilt() and not any(k[:2] in {(1, 2), (4, 0)} for k in kept())
    p.links_changed(set())
    assert kept() == rebuilt()


def test_a_crowded_rack_end_spreads_every_connection_and_a_cut_moves_only_holds(monkeypatch):
    """Laid out (layout.py): a connection has a stream on every spine and
    carries on its home's while each has a spine of its own; when a rack
    end has more connections than live spines (a cut, a fifth job), every
    connection there carries on one stream a live spine, so every job gets
    the same share; back home when the end empties or the uplink returns.
    Only holds and releases move, and every job hears of its own."""
    from cadence.testbed import fabric

    monkeypatch.setattr(fabric, "next_spines", _hashed(4))
    cluster = testbed.build("pllay", 8, 1, "100mbit", racks=2, spines=4)
    p = Planner(cluster, TOKEN, seed=5)
    ok = {"v": 1, "token": TOKEN}
    addr = [h.nics[0].address for h in cluster.hosts]  # 0-3 rack 0, 4-7 rack 1

    def lease(name: str):
        return p.handle(None, {**ok, "op": "hello", "job": name}, None)[1]

    def plan(job, src: int, dst: int) -> dict:
        conn = {"id": "c", "src": addr[src], "dst": addr[dst], "dport": 30000,
                "streams": 4, "back_weight": 0}  # fmt: skip
        answer, _ = p.handle(job, {**ok, "op": "plan", "connections": [conn]}, None)
        assert answer["ok"], answer
        return answer["paths"][0]

    def events() -> dict[str, dict]:
        out = {j.name: e for j, e in p.outbox}
        p.outbox.clear()
        return out

    def carrying(name: str) -> list[int]:
        c = p.jobs[name].conns["c"]
        return sorted(s.spine for s, h in zip(c.streams, c.held, strict=True) if not h)

    def up_loads() -> list[int]:
        return [p.loads.of(0, m, assign.UP) for m in range(4)]

    jobs = [lease(f"j{i}") for i in range(4)]
    homes = []
    for i, job in enumerate(jobs):
        path = plan(job, i, 4 + i)
        # One stream on every spine, both ways alike, the first on its home.
        assert sorted(s["spine"] for s in path["streams"]) == [0, 1, 2, 3]
        assert all(s["spine"] == s["back"] for s in path["streams"])
        homes.append(path["streams"][0]["spine"])
        assert carrying(f"j{i}") == [homes[-1]]
        # Its three others stand by: the job is told to hold them.
        assert events()[f"j{i}"]["hold"] == [{"peer": "c", "streams": [1, 2, 3]}]
    assert sorted(homes) == [0, 1, 2, 3]
    assert up_loads() == [4, 4, 4, 4]  # a connection weighs its 4 at home
    st = p.status()
    assert [j["held"] for j in st["jobs"]] == [3] * 4 and not any(j["spread"] for j in st["jobs"])

    # Rack 1's uplink to j0's home is cut: 4 connections, 3 live spines.
    cut = homes[0]
    by_name = {j.name: e for j, e in p.links_changed({(1, cut)})}
    assert set(by_name) == {f"j{i}" for i in range(4)}
    for i in range(4):
        assert carrying(f"j{i}") == sorted(set(range(4)) - {cut}), i
    assert up_loads() == [0 if m == cut else 4 for m in range(4)]
    assert by_name["j0"]["hold"] == [{"peer": "c", "streams": [0]}]
    assert len(by_name["j0"]["release"][0]["streams"]) == 3
    assert by_name["j1"]["hold"] == [] and len(by_name["j1"]["release"][0]["streams"]) == 2
    assert p.status()["jobs"][1]["spread"] == 1
    def alone() -> bool:
        """Every connection on a spine of its own, and nothing else."""
        on = [carrying(f"j{i}") for i in range(4)]
        return all(len(c) == 1 for c in on) and sorted(c[0] for c in on) == [0, 1, 2, 3]

    # Restored: each alone on a home again (chosen anew: homes chosen in a
    # crowd could not all differ).
    p.links_changed(set())
    assert alone() and up_loads() == [4, 4, 4, 4]

    # A fifth connection at rack 0's end: every one spreads; it goes, and
    # they go home. The events say why.
    j4 = lease("j4")
    plan(j4, 0, 5)
    sent = events()  # j4 holds nothing: it carries on every spine at once
    assert set(sent) == {f"j{i}" for i in range(4)}
    assert "5 connections over 4 live spines" in sent["j1"]["why"], sent["j1"]
    assert all(carrying(f"j{i}") == [0, 1, 2, 3] for i in range(5))
    p.forget(j4)
    sent = events()
    assert set(sent) == {f"j{i}" for i in range(4)}
    assert alone() and all(e["hold"][0]["streams"] for e in sent.values())

    # A connection's other end whose lease opens late hears what it holds
    # (with j3 gone, the new one has a spine of its own: three stand by).
    p.forget(jobs[3])
    notify = [{"job": "j0", "peer": 1, "streams": [0, 1, 2, 3]},
              {"job": "late", "peer": 0, "streams": [0, 1, 2, 3]}]
    conn = {"id": "d", "src": addr[1], "dst": addr[6], "dport": 30001, "streams": 4,
            "notify": notify}  # fmt: skip
    assert p.handle(jobs[0], {**ok, "op": "plan", "connections": [conn]}, None)[0]["ok"]
    assert "late" not in events()
    lease("late")
    held = events()["late"]["hold"]
    assert held == [{"peer": 0, "streams": [k for k, h in enumerate(
        p.jobs["j0"].conns["d"].held) if h]}] and held[0]["streams"]


def test_the_connection_a_pair_forgets_leaves_its_streams_as_the_one_kept_says(monkeypatch):
    """Both ranks of a two-rank job ask for the one link they share (the
    next rank is also the one before); the dial that loses is forgotten.
    The two connections name the same streams of that link with different
    homes, and a library keeps one hold a stream (the last word), so the
    forgotten one's holds stayed: every stream held, the link kept one
    that was no home and ran on another job's spine (2 of 15 trials of
    `benchmarks/ecmp.py` with two racks and four spines). Now, forgotten,
    its streams are told again as the kept one says."""
    from cadence.testbed import fabric

    monkeypatch.setattr(fabric, "next_spines", _hashed(4))
    cluster = testbed.build("plpair", 8, 1, "100mbit", racks=2, spines=4)
    p = Planner(cluster, TOKEN, seed=3)
    ok = {"v": 1, "token": TOKEN}
    addr = [h.nics[0].address for h in cluster.hosts]  # 0-3 rack 0, 4-7 rack 1
    tables: dict[str, dict] = collections.defaultdict(dict)  # a library's: (peer, stream)

    def deliver() -> None:
        """The events sent so far, applied as the library does: an event's
        holds, then its releases."""
        for job, e in p.outbox:
            for verb in ("hold", "release"):
                for entry in e.get(verb, []):
                    for k in entry["streams"]:
                        tables[job.name][entry["peer"], k] = verb == "hold"
        p.outbox.clear()

    ranks = {name: p.handle(None, {**ok, "op": "hello", "job": name}, None)[1]
             for name in ("r0", "r1")}

    def plan(name: str, src: int, dst: int, me: int, peer: int) -> None:
        notify = [{"job": name, "peer": peer, "streams": [0, 1, 2, 3]},
                  {"job": f"r{peer}", "peer": me, "streams": [0, 1, 2, 3]}]
        conn = {"id": "ring", "src": addr[src], "dst": addr[dst], "dport": 30000 + me,
                "streams": 4, "notify": notify}  # fmt: skip
        answer, _ = p.handle(ranks[name], {**ok, "op": "plan", "connections": [conn]}, None)
        assert answer["ok"], answer
        deliver()

    def other(i: int):
        job = p.handle(None, {**ok, "op": "hello", "job": f"x{i}"}, None)[1]
        conn = {"id": "x", "src": addr[i], "dst": addr[4 + i], "dport": 31000, "streams": 4}
        assert p.handle(job, {**ok, "op": "plan", "connections": [conn]}, None)[0]["ok"]
        deliver()
        return job

    x1, _ = other(1), other(2)  # two jobs, each alone on a spine
    plan("r0", 0, 4, 0, 1)  # rank 0 (rack 0) dials rank 1 (rack 1)
    plan("r1", 4, 0, 1, 0)  # and rank 1 dials rank 0 at once
    a, b = p.jobs["r0"].conns["ring"], p.jobs["r1"].conns["ring"]
    assert [s.spine for s in a.streams].index(a.home) == 0 == [
        s.spine for s in b.streams].index(b.home)  # fmt: skip
    # A fifth connection crowds the rack ends: every one spreads; the first
    # job leaves, and the rest choose their homes again, in turn.
    other(3)
    assert a.spread and b.spread
    p.forget(x1)
    deliver()
    assert not a.spread and not b.spread
    # The pair's two connections now carry on different streams: together
    # they held every stream of the link.
    assert [s.spine for s in a.streams].index(a.home) != [s.spine for s in b.streams].index(b.home)
    assert all(tables["r0"].get((1, k)) for k in range(4)), tables
    # Rank 0's dial lost: its connection is forgotten; rank 1's is the link.
    assert p.handle(ranks["r0"], {**ok, "op": "unplan", "ids": ["ring"]}, None)[0]["ok"]
    deliver()
    kept = [bool(h) for h in b.held]
    assert kept.count(False) == 1 and b.streams[kept.index(False)].spine == b.home
    assert [tables["r0"].get((1, k), False) for k in range(4)] == kept, tables
    assert [tables["r1"].get((0, k), False) for k in range(4)] == kept, tables
    # A lease that ends is told nothing more; its peer hears what is left.
    p.forget(ranks["r1"])
    assert [j.name for j, _ in p.outbox] == ["r0"]


# ---------------------------------------------------------------- protocol


def _routed(name: str = "pl") -> testbed.Cluster:
    return testbed.build(name, 4, 1, "100mbit", racks=2, spines=2)


def test_requests_are_authenticated_and_refusals_are_one_line():
    p = Planner(_routed(), TOKEN)
    ok = {"v": 1, "token": TOKEN}
    cases = [
        ({**ok, "token": "wrong", "op": "status"}, "unauthenticated", True),
        ({"v": 1, "op": "status"}, "unauthenticated", True),
        ({**ok, "v": 9, "op": "status"}, "protocol version", True),
        ([1, 2], "JSON object", True),
        ({**ok, "op": "plan", "connections": []}, "before hello", False),
        ({**ok, "op": "frobnicate"}, "unknown op", False),
        ({**ok, "op": "hello"}, "'job'", False),
    ]
    for req, words, close in cases:
        with pytest.raises(Refused, match=words) as e:
            p.handle(None, req, None)
        assert e.value.close == close and "\n" not in str(e.value)
    assert p.handle(None, {**ok, "op": "status"}, None)[0]["ok"]
    _, job = p.handle(None, {**ok, "op": "hello", "job": "j"}, None)
    bad = [([], "non-empty list"), ([{"src": "10.77.0.1", "dst": "10.9.9.9", "dport": 1,
                                     "streams": 1}], "no address of cluster"),
           ([{"src": "10.77.0.1", "dst": "10.77.0.3", "dport": 0, "streams": 1}], "'dport'"),
           ([{"src": "10.77.0.1", "dst": "10.77.0.3", "dport": 5, "streams": 99}], "'streams'"),
           ([{"src": "10.77.0.1", "dst": "10.77.0.3", "dport": 5, "streams": 2,
              "notify": [{"job": "j", "peer": 1, "streams": [0]}]}], "notify streams"),
           ([{"src": "10.77.0.1", "dst": "10.77.0.3", "dport": 5, "streams": 1,
              "notify": "everyone"}], "notify must be")]
    for conns, words in bad:
        with pytest.raises(Refused, match=words):
            p.handle(job, {**ok, "op": "plan", "connections": conns}, None)
    with pytest.raises(Refused, match="unplan needs ids"):
        p.handle(job, {**ok, "op": "unplan", "ids": "all"}, None)
    with pytest.raises(Refused, match="already holds a lease"):
        p.handle(None, {**ok, "op": "hello", "job": "j"}, None)


class _Served:
    """A planner served on a Unix socket by a thread of its own."""

    def __init__(self, cluster: testbed.Cluster, path: str):
        self.address = f"unix:{path}"
        self.planner = Planner(cluster, TOKEN)
        self.loop = asyncio.new_event_loop()
        up = threading.Event()
        from cadence.planner.protocol import Address

        self.task = None

        def run():
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(serve(self.planner, Address.parse(self.address),
                                                    ready=up.set))
            try:
                self.loop.run_until_complete(self.task)
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopped by the test
                pass
            self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert up.wait(10), "the planner did not start"

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.task.cancel)
            self.thread.join(10)


def test_garbage_on_the_socket_gets_one_line_and_the_connection_closed(tmp_path):
    served = _Served(_routed("pg"), str(tmp_path / "p.sock"))
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(str(tmp_path / "p.sock"))
        s.sendall(b"\x00\xffnot json\n")
        assert s.recv(1000) == b'{"ok":false,"error":"not a JSON line"}\n'
        assert s.recv(1000) == b""
        with Client(served.address, "wrong") as c, pytest.raises(PlannerError, match="unauth"):
            c.request("status")
        with Client(served.address, TOKEN) as c:
            assert c.request("hello", job="j")["spines"] == 2
            assert [j["job"] for j in c.request("status")["jobs"]] == ["j"]
        # The lease ended with the connection.
        with Client(served.address, TOKEN) as c:
            for _ in range(50):
                if not c.request("status")["jobs"]:
                    break
                time.sleep(0.05)
            assert c.request("status")["jobs"] == []
    finally:
        served.stop()


def test_a_request_behind_a_burst_hears_it_is_queued_until_it_is_answered(tmp_path):
    """30 leases say hello at once to a planner that takes 0.1 s a request:
    each is answered, in the order sent, and every one that waited a second
    or more was told so each second, with fewer ahead each time (a rank of
    the library waits while it hears this, and gives up a planner silent
    for 5 s)."""
    served = _Served(_routed("pq"), str(tmp_path / "p.sock"))
    real = served.planner.handle

    def slow(*a):
        time.sleep(0.1)
        return real(*a)

    served.planner.handle = slow
    try:
        socks = []
        for i in range(30):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(str(tmp_path / "p.sock"))
            s.sendall(encode({"v": 1, "token": TOKEN, "op": "hello", "job": f"j{i}"}))
            socks.append(s)
            time.sleep(0.002)  # sent in this order
        heard = []
        for s in socks:
            lines = []
            with s.makefile("rb") as f:
                while not lines or "event" in lines[-1]:
                    lines.append(json.loads(f.readline()))
            heard.append(lines)
        assert all(lines[-1]["ok"] for lines in heard)
        aheads = [[m["ahead"] for m in lines if m.get("event") == "queued"] for lines in heard]
        assert not aheads[0] and len(aheads[-1]) >= 2, aheads
        for a in aheads:
            assert a == sorted(a, reverse=True) and len(set(a)) == len(a), aheads
        # The last sent waited behind all the others.
        assert aheads[-1][0] >= 10, aheads
        # A request the planner fails on (a bug, not a refusal) gets one
        # line, and the next request is answered.
        served.planner.handle = lambda *a: 1 / 0
        with Client(served.address, TOKEN) as c, pytest.raises(PlannerError,
                                                               match="ZeroDivision"):
            c.request("status")
        served.planner.handle = real
        with Client(served.address, TOKEN) as c:
            assert c.request("status")["ok"]
    finally:
        served.stop()


# ------------------------------------------------------- on a routed cluster


@pytest.fixture
def routed(tmp_path):
    name = f"pl{random.randrange(1 << 20):05x}"
    cluster = testbed.build(name, 4, 1, "200mbit", racks=2, spines=2, placement="interleaved")
    testbed.up(cluster)
    served = _Served(cluster, str(tmp_path / "planner.sock"))
    yield cluster, served
    served.stop()
    testbed.down(name)


@needs_clusters
def test_a_connections_back_direction_counts_its_own_weight(routed):
    """`back_weight`: what the other direction of a connection counts (0 for
    a ring's link, whose data flows one way); by default `weight`."""
    cluster, served = routed
    p = served.planner
    ok = {"v": 1, "token": TOKEN}
    a, b = (h.nics[0].address for h in cluster.hosts[:2])
    _, job = p.handle(None, {**ok, "op": "hello", "job": "j"}, None)
    from cadence.testbed import ecmp_check

    d = ecmp_check.DPORTS
    conns = [{"id": "ring", "src": a, "dst": b, "dport": d[0], "streams": 2, "weight": 1,
              "back_weight": 0},
             {"id": "both", "src": a, "dst": b, "dport": d[1], "streams": 1, "weight": 1},
             {"id": "light", "src": b, "dst": a, "dport": d[2], "streams": 1, "weight": 0}]
    p.handle(job, {**ok, "op": "plan", "connections": conns}, None)
    got = {cid: ([s.weight for s in c.streams], [s.weight for s in c.back])
           for cid, c in job.conns.items()}
    assert got == {"ring": ([1, 1], [0, 0]), "both": ([1], [1]), "light": ([0], [0])}, got
    bad = {**conns[0], "id": "bad", "back_weight": -1}
    with pytest.raises(Refused, match="'back_weight'"):
        p.handle(job, {**ok, "op": "plan", "connections": [bad]}, None)


def test_a_stream_goes_where_some_port_takes_it_both_ways(monkeypatch):
    """On a symmetric hash (the kernel's: a connection's two directions on
    one spine), no port gives a stream different spines up and back. Two
    rings across 4 racks, as the library plans them (each rank's link to the
    next counts one way, its set-up barrier's link to r + 2 nothing): every
    request is answered (none refused: a refusal sends the rank back to
    plain ECMP), every stream's two directions are on one spine, and the
    links that carry the rings are spread evenly."""
    import zlib

    from cadence.testbed import fabric

    def symmetric(_f, _rack, _port, src, dst, ports):
        return [zlib.crc32(repr((sorted((src, dst)), sorted(pp))).encode()) % 2
                for pp in ports]  # fmt: skip

    monkeypatch.setattr(fabric, "next_spines", symmetric)
    cluster = testbed.build("plsym", 8, 1, "100mbit", racks=4, spines=2)
    by_rack = {}
    for h in cluster.hosts:
        by_rack.setdefault(cluster.rack_of[h.index], []).append(h.nics[0].address)
    ok = {"v": 1, "token": TOKEN}
    for seed in range(20):
        # The ranks ask in any order (they start at once).
        p = Planner(cluster, TOKEN, seed=seed)
        order = [(j, r) for j in range(2) for r in range(4)]
        random.Random(seed).shuffle(order)
        for j, r in order:
            ranks = [by_rack[k][j] for k in range(4)]
            _, job = p.handle(None, {**ok, "op": "hello", "job": f"j{j}/r{r}"}, None)
            for d in (1, 2):
                if d == 2 and r >= 2:
                    continue  # rank r + 2's link to r (the barrier's)
                conn = {"id": f"{(r + d) % 4}/0", "src": ranks[r], "dst": ranks[(r + d) % 4],
                        "dport": 30000 + 10 * j + (r + d) % 4, "streams": 1,
                        "weight": int(d == 1), "back_weight": 0}  # fmt: skip
                answer, _ = p.handle(job, {**ok, "op": "plan", "connections": [conn]}, None)
                assert answer["ok"], (seed, answer)
                st = answer["paths"][0]["streams"][0]
                assert st["spine"] == st["back"] and st["sports"], (seed, answer)
        ring = [u["up"] for u in p.status()["uplinks"]]
        assert ring == [1] * 8, (seed, p.status()["uplinks"])


@needs_clusters
def test_planned_ports_land_on_their_spines_and_a_cut_uplink_holds_them(routed):
    from cadence.testbed import ecmp_check

    cluster, served = routed
    src, dst = cluster.hosts[0].nics[0].address, cluster.hosts[1].nics[0].address
    with Client(served.address, TOKEN) as c, Client(served.address, TOKEN) as other:
        c.request("hello", job="train/rank0")
        other.request("hello", job="train/rank1")
        conns = [{"id": k, "src": src, "dst": dst, "dport": ecmp_check.DPORTS[k % 4],
                  "streams": 2} for k in range(6)]  # fmt: skip
        # The last one names both its ends, as the library does.
        conns[5]["notify"] = [{"job": "train/rank0", "peer": 1, "streams": [1, 3]},
                              {"job": "train/rank1", "peer": 0, "streams": [1, 3]}]
        paths = c.request("plan", connections=conns)["paths"]
        streams = [(p["dport"], s) for p in paths for s in p["streams"]]
        assert sorted(s["spine"] for _, s in streams) == [0] * 6 + [1] * 6
        flows = ecmp_check.check(cluster, 0, src=0, dst=1,
                                 ports=[(s["sports"][0], d) for d, s in streams])
        assert [f.seen for f in flows] == [s["spine"] for _, s in streams]
        st = c.request("status")
        assert max(u["up"] for u in st["uplinks"]) == 6
        # Host 1 is in rack 1: cut its uplink to the spine of the last
        # connection's first stream. Every stream that crosses it, either
        # way, is held; both ends hear of theirs.
        cut = paths[5]["streams"][0]["spine"]
        on_cut = {(p["id"], k) for p in paths for k, s in enumerate(p["streams"])
                  if cut in (s["spine"], s["back"])}  # fmt: skip
        assert (5, 0) in on_cut
        testbed.set_uplink(cluster, 1, cut, up=False)
        event = c.next_event(5.0)
        assert event is not None and event["changed"] == [
            {"rack": 1, "spine": cut, "state": "down"}], event
        held = {(h["peer"], k) for h in event["hold"] for k in h["streams"]}
        named = {(i, k) if i < 5 else (1, [1, 3][k]) for i, k in on_cut}
        assert held == named and event["release"] == [], (event, on_cut)
        theirs = other.next_event(5.0)
        assert theirs is not None and theirs["hold"] == [{"peer": 0, "streams": sorted(
            [1, 3][k] for i, k in on_cut if i == 5)}], theirs
        st = c.request("status")
        assert {j["job"]: j["held"] for j in st["jobs"]} == {
            "train/rank0": len(on_cut), "train/rank1": 0}
        assert all(u["up"] == 0 and u["down"] == 0 for u in st["uplinks"] if u["spine"] == cut)
        # Restored: the same streams released, and counted again.
        testbed.set_uplink(cluster, 1, cut, up=True)
        event = c.next_event(5.0)
        assert event is not None and event["changed"][0]["state"] == "up"
        assert {(h["peer"], k) for h in event["release"] for k in h["streams"]} == named
        assert event["hold"] == []
        assert max(u["up"] for u in c.request("status")["uplinks"]) == 6
        # A connection unplanned (its dial lost to its peer's) counts nothing
        # (each stream goes up one uplink each way).
        assert sum(u["up"] for u in c.request("status")["uplinks"]) == 24
        c.request("unplan", ids=[0, 99])
        st = c.request("status")
        assert st["jobs"][0]["streams"] == 10
        assert sum(u["up"] for u in st["uplinks"]) == 20
    served.stop()
    with pytest.raises(PlannerError, match="unreachable"):
        Client(served.address, TOKEN, timeout=2.0)


def test_a_planner_that_dies_leaves_its_client_an_error_not_a_hang(tmp_path):
    served = _Served(_routed("pd"), str(tmp_path / "p.sock"))
    c = Client(served.address, TOKEN, timeout=3.0)
    c.request("hello", job="j")
    served.stop()
    t = time.monotonic()
    with pytest.raises(PlannerError):
        c.request("status")
    assert time.monotonic() - t < 3.5
    c.close()
    with pytest.raises(PlannerError, match="unreachable"):
        Client(served.address, TOKEN, timeout=1.0)


def test_encode_is_one_line():
    assert encode({"a": "x\ny"}).count(b"\n") == 1


@needs_clusters
def test_planner_start_status_stop_and_cluster_down_stops_it(capsys):
    from cadence.cli import planner as planner_cli
    from cadence.cli.main import main as cli

    name = f"pc{random.randrange(1 << 20):05x}"
    testbed.up(testbed.build(name, 4, 1, "100mbit", racks=2, spines=2))
    try:
        assert cli(["planner", "start", "--cluster", name]) == 0
        pid = planner_cli._running(name)
        assert pid is not None
        assert cli(["planner", "start", "--cluster", name]) == 0  # already running: kept
        assert planner_cli._running(name) == pid
        assert cli(["planner", "status", "--cluster", name]) == 0
        out = capsys.readouterr().out
        assert "0 job(s)" in out and "rack  1 spine  1" in out, out
        assert cli(["planner", "serve", "--cluster", name, "--exclude", "9:0",
                    "--listen", "unix:/tmp/x.sock"]) == 1
        assert "racks 0..1" in capsys.readouterr().err
    finally:
        assert cli(["cluster", "down", "--name", name]) == 0
    assert "its planner stopped" in capsys.readouterr().out
    assert planner_cli._running(name) is None
    assert not list(testbed.cluster.STATE_DIR.glob(f"{name}*"))


_JOB = r"""
import json, sys, time
import numpy as np, cadence
c = cadence.init()
for _ in range(3):
    y = c.allreduce(np.ones(1 << 16, dtype=np.float32))
    assert (y == c.size).all()
c.barrier()
def hexaddr(h):
    ip, port = h.split(":")
    return ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0)), int(port, 16)
conns = []
with open("/proc/net/tcp") as f:
    for line in list(f)[1:]:
        parts = line.split()
        if parts[3] == "01":  # established
            conns.append([*hexaddr(parts[1]), *hexaddr(parts[2])])
print("CONNS " + json.dumps(conns), flush=True)
c.barrier()
"""


@needs_clusters
def test_a_job_binds_the_source_ports_its_planner_planned(routed, tmp_path):
    import io

    from cadence.testbed import jobs

    cluster, served = routed
    planned = []
    plan = served.planner.plan

    def recording(job, conns):
        paths = plan(job, conns)
        planned.extend(paths)
        return paths

    served.planner.plan = recording
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = io.BytesIO()
    env = {"CADENCE_PLANNER": served.address, "CADENCE_PLANNER_TOKEN_FILE": str(token),
           "CADENCE_TOPO_FILE": "none"}  # fmt: skip
    result = jobs.run(cluster, 1, [sys.executable, "-c", _JOB], timeout=120, out=out,
                      env={**os.environ, **env})  # fmt: skip
    text = out.getvalue().decode()
    assert result.status == 0, text
    seen = {tuple(c) for line in text.splitlines() if "CONNS " in line
            for c in json.loads(line.split("CONNS ", 1)[1])}  # fmt: skip
    across = [(p, s) for p in planned for s in p["streams"] if s["spine"] is not None]
    assert across, planned
    for p, s in across:
        assert any((p["src"], port, p["dst"], p["dport"]) in seen for port in s["sports"]), \
            (p, s, sorted(seen))
    assert "WARN" not in text, text


def _allreduce_right(comm):
    import numpy as np

    y = comm.allreduce(np.ones(1000, dtype=np.float32))
    return bool((y == comm.size).all())


def test_a_job_whose_planner_is_unreachable_runs_as_without_one(tmp_path):
    from harness import assert_all_ok, run_ranks

    token = tmp_path / "token"
    token.write_text("t\n")
    env = {"CADENCE_PLANNER": f"unix:{tmp_path / 'none.sock'}",
           "CADENCE_PLANNER_TOKEN_FILE": str(token)}  # fmt: skip
    got = assert_all_ok(run_ranks(_allreduce_right, 4, transport="tcp", env=env))
    assert all(got.values()), got


@needs_clusters
def test_the_probe_finds_the_one_slow_uplink_among_three_racks():
    from cadence.planner.probe import probe

    name = f"pp{random.randrange(1 << 20):05x}"
    cluster = testbed.build(name, 3, 1, "100mbit", racks=3, spines=2)
    testbed.up(cluster)
    try:
        testbed.set_uplink(cluster, 1, 0, rate="10mbit")
        bad, flows = probe(cluster, seconds=0.3)
        assert bad == {(1, 0)}, [(f.src_rack, f.dst_rack, f.spine, f.rate) for f in flows]
        assert len(flows) == 12 and sum(f.bad for f in flows) == 4
        testbed.set_uplink(cluster, 1, 0, rate="100mbit")
        assert probe(cluster, seconds=0.3)[0] == set()
    finally:
        testbed.down(name)


_LOOP = r"""
import time
import numpy as np, cadence
c = cadence.init()
x = np.arange(1 << 18, dtype=np.float32) + c.rank
want = np.arange(1 << 18, dtype=np.float32) * c.size + sum(range(c.size))
end, n = time.monotonic() + float(__import__("sys").argv[1]), 0
while True:
    y = c.allreduce(x.copy())  # in place
    assert np.array_equal(y, want)
    n += 1
    go = np.array([time.monotonic() < end], dtype=np.int32)
    if not c.allreduce(go, op="min")[0]:
        break
    if n == 1:
        print("LOOPING", flush=True)
print(f"DONE {n}", flush=True)
"""


class _Stamped:
    """Output lines with the time each arrived."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []

    def write(self, b: bytes) -> None:
        self.lines.extend((time.monotonic(), x) for x in b.decode().splitlines())

    def flush(self) -> None:
        """Lines are kept as they arrive: nothing waits to be flushed."""

    def first(self, words: str, after: float = 0.0) -> float | None:
        return next((t for t, x in self.lines if words in x and t >= after), None)


@needs_clusters
def test_a_cut_uplink_holds_its_streams_at_once_at_both_ends_and_a_restored_one_frees_them(
        routed, tmp_path):
    from cadence.testbed import jobs

    cluster, served = routed
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = _Stamped()
    env = {"CADENCE_PLANNER": served.address, "CADENCE_PLANNER_TOKEN_FILE": str(token),
           "CADENCE_TOPO_FILE": "none", "CADENCE_NSTREAMS": "2"}  # fmt: skip
    result = {}
    job = threading.Thread(target=lambda: result.update(r=jobs.run(
        cluster, 1, [sys.executable, "-c", _LOOP, "12"], timeout=120, out=out,
        env={**os.environ, **env})))  # fmt: skip
    job.start()
    for _ in range(600):
        if out.first("LOOPING") or not job.is_alive():
            break
        time.sleep(0.05)
    assert out.first("LOOPING"), out.lines
    time.sleep(1.0)
    cut = time.monotonic()
    testbed.set_uplink(cluster, 1, 0, up=False)
    time.sleep(4.0)
    restored = time.monotonic()
    testbed.set_uplink(cluster, 1, 0, up=True)
    job.join(150)
    text = "\n".join(x for _, x in out.lines)
    assert result["r"].status == 0, text
    assert text.count("DONE") == 4, text
    why = "uplink rack 1 - spine 0 is down, says the path planner"
    held = [x for _, x in out.lines if f"is down ({why})" in x]
    # Both ends of the links that cross rack 1's uplink to spine 0 hold the
    # streams on it: host 1 (rack 1) and its ring neighbours in rack 0.
    ranks = {x.split("]")[0] for x in held}
    assert len(ranks) >= 2, text
    first = out.first(f"is down ({why})", cut)
    assert first is not None and first - cut < 2.5, text
    assert "no answer for" not in text, text  # held before any timeout
    assert out.first("is released by the path planner", restored), text
    assert out.first("works again", restored), text
    assert "ERROR" not in text, text


def test_the_ecmp_benchmark_balances_live_uplinks_and_plots_their_load(tmp_path):
    """The benchmark's figures: the busiest live uplink over its rack's
    mean, leaving out a bad uplink (the planner's idle spine pair); each
    uplink's MB/s between readings; the plot is written."""
    from scripts import load_script

    ecmp = load_script("benchmarks/ecmp.py", "ecmp_bench")
    moved = {(0, 0): 0, (0, 1): 40e6, (0, 2): 44e6, (0, 3): 42e6,
             (1, 0): 3e6, (1, 1): 30e6, (1, 2): 33e6, (1, 3): 30e6}  # fmt: skip
    skip = frozenset({(1, 0), (0, 0)})
    assert ecmp._balance(moved, skip) == pytest.approx(33 / 31)  # rack 1 the worse
    # Counted, the bad uplink's trickle makes the others look uneven.
    assert ecmp._balance(moved) == pytest.approx(33 / 24)
    s = ecmp.Sampler(cluster=None, every=0.5)
    s.series = [(100.0, {(0, 0): 0, (0, 1): 0}), (100.5, {(0, 0): 1e6, (0, 1): 3e6}),
                (101.5, {(0, 0): 2e6, (0, 1): 3e6})]  # fmt: skip
    t, per = s.rates()
    assert t == [0.25, 1.0]
    assert per == {(0, 0): [2.0, 1.0], (0, 1): [6.0, 0.0]}
    out = tmp_path / "up.png"
    ecmp.plot(str(out), [("planned", s, 100.7), ("gloo", s, None)], 6.0e6)
    assert out.read_bytes()[:4] == b"\x89PNG"
