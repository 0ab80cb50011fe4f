"""Slowness diagnosis: `comm_slow` (a slow link, or a host whose
NIC is slow: named as the host, not as its links) and `noncomm_slow` (a
straggler), on synthetic jobs — each class, both at once, clock offsets
between hosts, a healthy job with noise, warm-up, windows and `SlowWatch` —
and on real jobs on the emulated cluster (root only)."""

from __future__ import annotations

import json
import os
import random
import secrets
import statistics
import sys
import time
from pathlib import Path

import pytest
from cadence.cli.main import main as cli
from cadence.diagnosis import SlowWatch, diagnose, diagnose_slow, load_dir, parse
from cadence.diagnosis.slow import arrivals, link_rates
from clusters import why_no_clusters

BASE = 1_700_000_000 * 10**9
GBIT = 1e9 / 8  # bytes per second
MIB = 1 << 20


def _ns(s: float) -> int:
    return int(round(s * 1e9))


# What a communicator's set-up runs on a job across hosts (cost-model
# calibration): barrier, broadcast of 64 bytes, the decision, 11 x (barrier,
# 8-byte probe allreduce), the model.
SETUP = ([("barrier", "uint8", 0), ("broadcast", "uint8", 64), ("broadcast", "uint8", 1)]
         + [("barrier", "uint8", 0), ("allreduce", "float32", 8)] * 11
         + [("broadcast", "uint8", 40)])


def make_job(hosts, nops=40, *, size=MIB, rate=None, late=None, leave_late=None, clock=None,
             noise=0.0, hiccups=0.0, seed=1, first_seq=1, links=True, transport=None,
             setup=False):
    """Dumps of one communicator whose ranks run `nops` collectives (seq
    `first_seq`...), each rank receiving `size` bytes from every other.

    rate(s, d): bytes/s of link s->d; late(r, k): seconds rank r spends
    outside communication before collective k (on top of 1 ms);
    leave_late(r, k): seconds it leaves k after the others; clock[r]:
    (skew, offset) of its clock (skew: how far it reads ahead of rank 0's;
    offset: what it measured); noise: rates vary by up to that share,
    arrivals by up to 3 ms; hiccups: chance of a 30 ms pause per rank and
    collective; setup: the job starts with SETUP's collectives (counted in
    nops; no messages)."""
    n = len(hosts)
    rng = random.Random(seed)
    same = lambda s, d: hosts[s] == hosts[d]  # noqa: E731
    rate = rate or (lambda s, d: 5e9 if same(s, d) else GBIT)
    late = late or (lambda r, k: 0.0)
    leave_late = leave_late or (lambda r, k: 0.0)
    clock = clock or {}
    ops = {r: [] for r in range(n)}
    free = {r: 0.05 for r in range(n)}  # when each rank left its last collective
    for i in range(nops):
        k = first_seq + i
        arr = {}
        for r in range(n):
            a = free[r] + 0.001 + late(r, k)
            if noise:
                a += rng.uniform(0, 0.003)
            if hiccups and rng.random() < hiccups:
                a += 0.03
            arr[r] = a
        go = max(arr.values())
        msgs = {r: [] for r in range(n)}
        longest = 0.0
        kind = SETUP[i] if setup and i < len(SETUP) else None
        for d in range(n if kind is None else 0):
            for s in range(n):
                if s == d:
                    continue
                dur = size / rate(s, d)
                if noise:
                    dur *= rng.uniform(1 - noise, 1 + noise)
                first = go + 0.0002
                last = first + dur
                longest = max(longest, dur)
                msgs[d].append(_msg(s, "recv", size, first, last))
                msgs[s].append(_msg(d, "send", size, go, go))
        end = go + longest + 0.0005
        for r in range(n):
            e = end + leave_late(r, k)
            o = _op(len(ops[r]) + 1, k, arr[r], e, msgs[r], size * (n - 1))
            if kind is not None:
                o.update(collective=kind[0], dtype=kind[1], bytes=kind[2], count=kind[2] // 4)
            ops[r].append(o)
            free[r] = e
    out = []
    for r in range(n):
        skew, offset = clock.get(r, (0.0, 0.0))
        counters = None
        if links:
            counters = [{"peer": p, "transport": (transport or {}).get((r, p)) or
                         ("shm" if same(r, p) else "tcp"),
                         "bytes_sent": size * nops, "bytes_recv": size * nops, "msgs_sent": nops,
                         "msgs_recv": nops, "busy_ns": _ns(0.5), "single_copy_sent": 0}
                        for p in range(n) if p != r]
        out.append(_dump(r, hosts, ops[r], skew, offset, counters, free[r] + 0.01))
    return out


def _msg(peer, dir, nbytes, first, last):
    return {"peer": peer, "dir": dir, "state": "done", "bytes": nbytes, "moved": nbytes,
            "first_ns": _ns(first), "last_ns": _ns(last)}


def _op(id, seq, start, end, msgs, nbytes, coll="allreduce"):
    return {"id": id, "seq": seq, "sig": "00000000000000aa", "collective": coll, "algo": "ring",
            "dtype": "float32", "redop": "sum", "root": 0, "count": nbytes // 4,
            "bytes": nbytes, "enqueue_ns": _ns(start), "start_ns": _ns(start),
            "end_ns": _ns(end), "status": "ok", "messages": msgs, "messages_state": "final",
            "comm_id": "c1"}


def _dump(rank, hosts, ops, skew, offset, links, dumped):
    nranks = len(hosts)
    d = {
        "format": "cadence-dump", "version": 1, "job": "job1", "comm_id": "c1", "rank": rank,
        "nranks": nranks, "host": hosts[rank], "hostname": hosts[rank], "pid": 1000 + rank,
        "peers": [{"rank": r, "host": hosts[r], "pid": 1000 + r} for r in range(nranks)],
        "timeout_s": 30.0, "base_unix_ns": BASE + _ns(skew), "dump_ns": _ns(dumped),
        "clock": {"offset_ns": _ns(offset), "error_ns": 20_000 if len(set(hosts)) > 1 else 0,
                  "method": "ping-pong" if hosts[rank] != hosts[0] else "same host"},
        "reason": "on demand", "failure": None, "total_ops": len(ops), "record_capacity": 1024,
        "message_capacity": 4096, "ops": ops,
    }
    if links is not None:
        d["links"] = links
    return d


def parsed(dumps):
    return [parse(json.dumps(d), f"rank{d['rank']}") for d in dumps]


def slow(dumps, **kw):
    return diagnose_slow(parsed(dumps), **kw)


def window(dumps, last):
    """The same dumps trimmed to their last `last` operations (a live window)."""
    out = []
    for d in dumps:
        d = dict(d)
        d["ops"] = d["ops"][-last:]
        out.append(d)
    return out


def only_links(dumps, used):
    """The dumps with only the messages of the links (src, dst) in `used`
    (a ring's, say: each rank then talks to one peer each way)."""
    for d in dumps:
        for o in d["ops"]:
            o["messages"] = [m for m in o["messages"]
                             if ((m["peer"], d["rank"]) if m["dir"] == "recv"
                                 else (d["rank"], m["peer"])) in used]
    return dumps


ONE_PER_HOST = ["h0", "h1", "h2", "h3"]
TWO_PER_HOST = ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]


# --- comm_slow ----------------------------------------------------------------


def test_comm_slow_names_the_slow_link():
    hosts = ONE_PER_HOST
    rate = lambda s, d: GBIT / 5 if (s, d) == (1, 2) else GBIT  # noqa: E731
    v = slow(make_job(hosts, rate=rate))
    assert v is not None and v.cls == "comm_slow", v and v.text()
    assert v.links == [(1, 2)] and v.hosts == ["h1", "h2"], v.text()
    assert "link 1->2 (h1 -> h2) at 200 Mbit/s" in v.headline, v.headline
    assert "host" not in v.headline
    assert any("reference (p75) 1.0 Gbit/s" in e for e in v.evidence), v.text()
    assert any(e.strip().startswith("h1 -> h0 1000, h2 200*, h3 1000") for e in v.evidence)
    # The counters name its transport and bytes.
    assert any(e.startswith("rank 1's counters for rank 2: tcp") for e in v.evidence)


def test_comm_slow_names_a_whole_slow_host_not_its_links():
    """A host whose NIC is throttled slows every link out of and into its
    two ranks: the verdict names the host and its ranks, once."""
    hosts = TWO_PER_HOST
    rate = lambda s, d: (5e9 if hosts[s] == hosts[d]  # noqa: E731
                         else GBIT / 5 if "h2" in (hosts[s], hosts[d]) else GBIT)
    v = slow(make_job(hosts, rate=rate))
    assert v is not None and v.cls == "comm_slow", v and v.text()
    assert v.hosts == ["h2"] and v.ranks == [4, 5] and v.links == [], v.text()
    assert v.headline.startswith("comm_slow (comm c1): host h2 (ranks 4-5) NIC slow both ways"), \
        v.headline
    assert "->" not in v.headline
    assert any("3 of 3 links out of it under 0.5x" in e for e in v.evidence), v.text()
    assert any("3 of 3 links into it under 0.5x" in e for e in v.evidence), v.text()


def test_comm_slow_names_a_host_slow_sending_only():
    hosts = TWO_PER_HOST
    rate = lambda s, d: (5e9 if hosts[s] == hosts[d]  # noqa: E731
                         else GBIT / 6 if hosts[s] == "h3" else GBIT)
    v = slow(make_job(hosts, rate=rate))
    assert v is not None and v.hosts == ["h3"] and v.ranks == [6, 7], v and v.text()
    assert "host h3 (ranks 6-7) NIC slow sending" in v.headline, v.headline


def test_a_host_slow_both_ways_with_one_way_above_the_slow_bar():
    """A NIC whose sends are at 0.2x and its receives at 0.35x: the
    receives are under the side bar (0.5x), not the slow bar (0.3x). Both
    ways are named, once the host is named for its sends."""
    hosts = TWO_PER_HOST

    def rate(s, d):
        if hosts[s] == hosts[d]:
            return 5e9
        return GBIT / 5 if hosts[s] == "h2" else GBIT * 0.35 if hosts[d] == "h2" else GBIT

    v = slow(make_job(hosts, rate=rate))
    assert v is not None and v.hosts == ["h2"] and v.links == [], v and v.text()
    assert "host h2 (ranks 4-5) NIC slow both ways" in v.headline, v.headline


def test_a_slow_host_seen_through_a_ring_only():
    """A window of ring algorithms: each host talks to one peer each way
    (h0 -> h1 -> h2 -> h3 -> h0). Host h1's NIC at a quarter: both its
    links are slow, and the host is named, not two links."""
    hosts = ONE_PER_HOST
    ring = {(0, 1), (1, 2), (2, 3), (3, 0)}

    def rate(s, d):
        if (s, d) not in ring:
            return None
        return GBIT / 4 if 1 in (s, d) else GBIT

    v = slow(only_links(make_job(hosts, rate=lambda s, d: rate(s, d) or GBIT), ring))
    assert v is not None and v.hosts == ["h1"] and v.links == [], v and v.text()
    assert "host h1 (rank 1) NIC slow both ways" in v.headline, v.headline
    # Only the link h0 -> h1 slow: the link, not a host.
    v = slow(only_links(make_job(hosts, rate=lambda s, d: GBIT / 4 if (s, d) == (0, 1)
                                 else GBIT), ring))
    assert v is not None and v.links == [(0, 1)] and "host" not in v.headline, v and v.text()


def test_a_slow_nic_is_named_alone_not_the_neighbour_it_drags():
    """Six hosts of one rank, each sending to the next two (a torus's rows
    and columns give each host two peers each way). Host h2's NIC at a
    quarter both ways; host h4, which receives from h2 and from h3, sees
    its receives from h3 dragged to 0.45x as well (it waits on h2's). Both
    of h4's receiving links are under the side bar, yet only one is slow,
    and h2 explains it: h2 is named, h4 is not."""
    hosts = [f"h{i}" for i in range(6)]
    used = {(s, (s + k) % 6) for s in range(6) for k in (1, 2)}

    def rate(s, d):
        if 2 in (s, d):
            return GBIT / 4
        return GBIT * 0.45 if (s, d) == (3, 4) else GBIT

    v = slow(only_links(make_job(hosts, rate=rate), used))
    assert v is not None and v.cls == "comm_slow", v and v.text()
    assert v.hosts == ["h2"] and v.links == [], v.text()
    assert "host h2 (rank 2) NIC slow both ways" in v.headline, v.headline


def test_a_nic_slow_both_ways_above_the_slow_bar_is_named_as_a_whole():
    """Links carry half their NIC's rate (short messages of a job of
    thousands), so a NIC at a fifth reads a third of the others: no link is
    under the slow bar (0.3x), but every link both ways of the host is
    under the side bar (0.5x). The host is named; one way alone under the
    side bar, or a host beside a straggler, is not."""
    hosts = [f"h{i}" for i in range(6)]
    used = {(s, (s + k) % 6) for s in range(6) for k in (1, 2)}

    def job(share_out, share_in, **kw):
        def rate(s, d):
            return GBIT * (share_out if s == 2 else share_in if d == 2 else 1.0)
        return only_links(make_job(hosts, rate=rate, **kw), used)

    v = slow(job(0.37, 0.33))
    assert v is not None and v.cls == "comm_slow", v and v.text()
    assert v.hosts == ["h2"] and v.links == [], v.text()
    assert "host h2 (rank 2) NIC slow both ways" in v.headline, v.headline
    assert slow(job(0.37, 0.6)) is None
    assert slow(job(0.55, 0.45)) is None
    # Beside a straggler: the links wait on it.
    v = slow(job(0.45, 0.45, late=lambda r, k: 0.1 if r == 2 else 0.0))
    assert v is not None and v.cls == "noncomm_slow" and v.ranks == [2], v and v.text()
    assert v.links == [] and "also comm_slow" not in v.headline, v.text()


def test_transport_classes_are_compared_apart():
    """Shared memory is 40x faster than TCP here; that is no slow TCP link.
    A slow shared-memory link is compared with the other shared-memory ones."""
    hosts = TWO_PER_HOST
    assert slow(make_job(hosts)) is None
    rate = lambda s, d: (GBIT * 40 / (10 if (s, d) == (2, 3) else 1)  # noqa: E731
                         if hosts[s] == hosts[d] else GBIT)
    v = slow(make_job(hosts, rate=rate))
    assert v is not None and v.links == [(2, 3)], v and v.text()
    assert any(e.startswith("shm links") for e in v.evidence)


def test_link_rates_matrix_and_counters_are_parsed():
    hosts = ONE_PER_HOST
    ds = parsed(make_job(hosts, nops=12))
    m = link_rates(ds)
    assert set(m) == {(s, d) for s in range(4) for d in range(4) if s != d}
    assert all(abs(lr.rate - GBIT) / GBIT < 0.01 for lr in m.values()), m
    assert ds[0].links[0].transport == "tcp" and ds[0].links[0].bytes_sent == 12 * MIB
    # Older dumps (no "links") and dumps taken while an operation ran
    # ("links": null) still parse.
    old = make_job(hosts, nops=12, links=False)
    assert parsed(old)[0].links is None
    old[0]["links"] = None
    assert parsed(old)[0].links is None


# --- noncomm_slow -------------------------------------------------------------


def test_noncomm_slow_names_the_straggler_with_its_lateness():
    hosts = TWO_PER_HOST
    v = slow(make_job(hosts, late=lambda r, k: 0.18 if r == 5 else 0.0))
    assert v is not None and v.cls == "noncomm_slow", v and v.text()
    assert v.ranks == [5] and v.hosts == ["h2"] and v.links == [], v.text()
    # 40 collectives, the first 5 skipped as warm-up.
    assert "rank 5 (h2, pid 1005) arrives 180 ms late on average over 35 collectives" in \
        v.headline, v.headline
    assert any("its own time between collectives: median 181 ms" in e for e in v.evidence), \
        v.text()


def test_a_small_straggler_that_costs_the_job_its_time_is_named():
    """5 ms late at collectives of ~9 ms: a third of the job's time, named
    whatever its size."""
    v = slow(make_job(TWO_PER_HOST, late=lambda r, k: 0.005 if r == 3 else 0.0))
    assert v is not None and v.cls == "noncomm_slow" and v.ranks == [3], v and v.text()
    assert "arrives 5.0 ms late on average" in v.headline, v.headline
    assert any("the job waited for it" in e for e in v.evidence), v.text()


def test_a_straggler_beside_long_collectives_is_named_by_its_share():
    """20 ms late at collectives of ~100 ms (12 MiB per link at 1 Gbit/s):
    16 % of the job's time."""
    v = slow(make_job(ONE_PER_HOST, size=12 * MIB, late=lambda r, k: 0.02 if r == 2 else 0.0))
    assert v is not None and v.cls == "noncomm_slow" and v.ranks == [2], v and v.text()


def test_lateness_that_costs_little_or_comes_rarely_is_no_straggler():
    # 4 ms late at collectives of ~100 ms: 4 % of the time.
    v = slow(make_job(ONE_PER_HOST, size=12 * MIB, late=lambda r, k: 0.004 if r == 2 else 0.0))
    assert v is None, v.text()
    # 30 ms late at one collective in five: not at most of them.
    v = slow(make_job(ONE_PER_HOST, late=lambda r, k: 0.03 if r == 2 and k % 5 == 0 else 0.0))
    assert v is None, v.text()
    # Under the scheduler's noise floor (2 ms), however often.
    v = slow(make_job(ONE_PER_HOST, size=64 << 10, late=lambda r, k: 0.002 if r == 2 else 0.0))
    assert v is None, v.text()


def test_a_rank_late_because_it_leaves_late_is_no_straggler():
    """Ranks 4-5 finish every collective 40 ms after the others (their
    transfers end last) and so reach the next one 40 ms late: their own time
    between collectives is normal; that is not a compute straggler."""
    v = slow(make_job(TWO_PER_HOST, leave_late=lambda r, k: 0.04 if r in (4, 5) else 0.0))
    assert v is None, v.text()


def test_clock_offsets_between_hosts_are_applied():
    """Rank 3's host clock reads 50 ms ahead of rank 0's; with its measured
    offset it arrives with the others. Rank 1, the straggler, sits on a host
    whose clock reads 60 ms behind: its lateness is still 100 ms."""
    hosts = ONE_PER_HOST
    late = lambda r, k: 0.1 if r == 1 else 0.0  # noqa: E731
    clock = {3: (0.05, 0.05), 1: (-0.06, -0.06)}
    ds = parsed(make_job(hosts, late=late, clock=clock))
    _, lat, _ = arrivals(ds)
    assert abs(lat[3].median_s) < 0.002 and abs(lat[1].median_s - 0.1) < 0.005, lat
    v = diagnose_slow(ds)
    assert v is not None and v.cls == "noncomm_slow" and v.ranks == [1], v and v.text()
    assert "arrives 100 ms late" in v.headline
    assert any(e.startswith("clocks: 4 hosts") for e in v.evidence), v.text()
    # Offsets left out: the arrivals are off by the clocks' difference,
    # which shows that they are read.
    ds = parsed(make_job(hosts, late=late, clock={3: (0.05, 0.0)}))
    _, lat, _ = arrivals(ds)
    assert abs(lat[3].median_s - 0.05) < 0.002, lat


# --- both, neither ------------------------------------------------------------


def test_a_straggler_and_a_slow_link_are_both_named():
    hosts = ONE_PER_HOST
    rate = lambda s, d: GBIT / 5 if (s, d) == (2, 3) else GBIT  # noqa: E731
    v = slow(make_job(hosts, rate=rate, late=lambda r, k: 0.1 if r == 1 else 0.0))
    assert v is not None, "nothing found"
    # The straggler cost more time (100 ms x 35) than the link (~35 ms x 35).
    assert v.cls == "noncomm_slow", v.text()
    assert v.ranks == [1] and v.links == [(2, 3)], v.text()
    assert "rank 1 (h1, pid 1001) arrives 100 ms late" in v.headline
    assert "; also comm_slow: link 2->3 (h2 -> h3) at 200 Mbit/s" in v.headline, v.headline
    assert v.hosts == ["h1", "h2", "h3"]


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_noisy_job_raises_no_alarm(seed):
    """Rates that vary by ±50% per message, arrivals by 3 ms, and a 30 ms
    pause of some rank in 5% of the collectives: healthy."""
    for hosts in (ONE_PER_HOST, TWO_PER_HOST):
        ds = make_job(hosts, noise=0.5, hiccups=0.05, seed=seed)
        assert slow(ds) is None, slow(ds).text()
        v = diagnose(parsed(ds))
        assert v.cls == "healthy", v.text()


def test_warm_up_and_short_windows_raise_no_alarm():
    # The first collectives after set-up: a rank that arrives seconds late
    # (it was still importing) is not a straggler.
    late = lambda r, k: 2.0 if (r == 2 and k <= 3) else 0.0  # noqa: E731
    assert slow(make_job(ONE_PER_HOST, late=late)) is None
    # Too few collectives to call anything consistent.
    assert slow(make_job(ONE_PER_HOST, nops=12, late=lambda r, k: 0.1 * (r == 2))) is None
    assert slow(make_job(ONE_PER_HOST, nops=16, late=lambda r, k: 0.1 * (r == 2))) is not None


def test_set_up_collectives_are_skipped():
    """Set-up's calibration: rank 0 measures links while the others wait in
    barrier #4 (rank 0 arrives 70 ms late there); then a straggler in the
    job's first 15 collectives. The 26 set-up collectives, where nobody is
    late, must not water its lateness down, nor rank 0's barrier count."""
    ds = parsed(make_job(ONE_PER_HOST, nops=26 + 5 + 15, setup=True,
                         late=lambda r, k: 0.07 * (r == 0 and k == 4) + 0.1 * (r == 3 and k > 26)))
    from cadence.diagnosis.slow import setup_collectives

    assert setup_collectives(ds) == 26
    v = diagnose_slow(ds)
    assert v is not None and v.ranks == [3], v and v.text()
    assert "over 15 collectives" in v.headline, v.headline
    assert any("set-up's #1-#26 and the next 5 skipped" in e for e in v.evidence), v.text()
    assert diagnose_slow(parsed(make_job(ONE_PER_HOST, nops=26 + 20, setup=True,
                                         late=lambda r, k: 0.07 * (r == 0 and k == 4)))) is None


def test_a_window_of_the_last_operations_is_enough():
    hosts = TWO_PER_HOST
    rate = lambda s, d: (5e9 if hosts[s] == hosts[d]  # noqa: E731
                         else GBIT / 5 if "h1" in (hosts[s], hosts[d]) else GBIT)
    ds = make_job(hosts, nops=60, rate=rate, late=lambda r, k: 0.05 * (r == 6), first_seq=400)
    v = slow(window(ds, 15))
    assert v is not None and set(v.ranks) == {2, 3, 6}, v and v.text()
    assert any(e.startswith("window: collectives #445-#459") for e in v.evidence), v.text()


def test_slow_watch_reports_what_persists():
    hosts = ONE_PER_HOST
    healthy = lambda k0: make_job(hosts, nops=20, first_seq=k0, noise=0.3, seed=k0)  # noqa: E731
    straggling = lambda k0: make_job(hosts, nops=20, first_seq=k0,  # noqa: E731
                                     late=lambda r, k: 0.1 * (r == 2))
    w = SlowWatch()
    assert w.feed(parsed(healthy(100))) is None
    assert w.feed(parsed(straggling(120))) is None  # once: not yet
    v = w.feed(parsed(straggling(140)))
    assert v is not None and v.cls == "noncomm_slow" and v.ranks == [2], v and v.text()
    # A window with too little in it keeps the verdict in force.
    assert w.feed(parsed(window(straggling(160), 3))) is v
    assert w.feed(parsed(straggling(180))).ranks == [2]
    # A healthy window clears it.
    assert w.feed(parsed(healthy(200))) is None and w.current is None
    # Start-up: the first window holds the warm-up collectives only.
    w = SlowWatch(persist=1)
    assert w.feed(parsed(make_job(hosts, nops=5, late=lambda r, k: 1.0 * (r == 1)))) is None


# --- the live path: rank summaries, host summaries, rank 0 -------------------------


def through_the_wire(dumps):
    """What rank 0 judges live: every rank's summary of its dump, encoded;
    each host's leader decodes its ranks' and encodes the host's."""
    from cadence.diagnosis.summary import (
        decode_host,
        decode_rank,
        encode_host,
        encode_rank,
        host_summary,
        rank_summary,
    )

    by_host = {}
    for d in parsed(dumps):
        by_host.setdefault(d.host, []).append(encode_rank(rank_summary(d)))
    return [decode_host(encode_host(host_summary([decode_rank(b) for b in blobs])))
            for blobs in by_host.values()]


def _ring_only(ds, ring):
    for d in ds:
        for o in d["ops"]:
            o["messages"] = [m for m in o["messages"]
                             if ((m["peer"], d["rank"]) if m["dir"] == "recv"
                                 else (d["rank"], m["peer"])) in ring]
    return ds


def test_the_live_path_judges_as_the_dumps_do():
    """Every finding of this file's synthetic jobs, through the summaries a
    live window sends, comes out as from the dumps themselves."""
    one, two = ONE_PER_HOST, TWO_PER_HOST
    jobs = [
        make_job(one, rate=lambda s, d: GBIT / 5 if (s, d) == (1, 2) else GBIT),
        make_job(two, rate=lambda s, d: (5e9 if two[s] == two[d] else
                                         GBIT / 5 if "h2" in (two[s], two[d]) else GBIT)),
        make_job(two, rate=lambda s, d: (GBIT * 40 / (10 if (s, d) == (2, 3) else 1)
                                         if two[s] == two[d] else GBIT)),
        make_job(two, late=lambda r, k: 0.18 if r == 5 else 0.0),
        make_job(one, rate=lambda s, d: GBIT / 5 if (s, d) == (2, 3) else GBIT,
                 late=lambda r, k: 0.1 if r == 1 else 0.0),
        make_job(one, clock={2: (0.05, 0.05)}, late=lambda r, k: 0.02 * (r == 2)),
        _ring_only(make_job(one, rate=lambda s, d: GBIT / 4 if 1 in (s, d) else GBIT),
                   {(0, 1), (1, 2), (2, 3), (3, 0)}),
        make_job(one, nops=26 + 5 + 15, setup=True, late=lambda r, k: 0.1 * (r == 3 and k > 26)),
    ] + [make_job(h, noise=0.5, hiccups=0.05, seed=seed) for seed in range(3) for h in (one, two)]
    found = 0
    for i, ds in enumerate(jobs):
        want, got = slow(ds), diagnose_slow(through_the_wire(ds))
        assert (want is None) == (got is None), (i, want and want.text(), got and got.text())
        if want is not None:
            found += 1
            assert got.to_json() == want.to_json(), (i, want.text(), got.text())
    assert found == 8


def test_medians_are_those_of_statistics():
    from cadence.diagnosis.slow import medians_of_others

    rng = random.Random(5)
    import numpy as np

    for n in (2, 3, 4, 7, 8, 33):
        # Ties included: values from a small set.
        a = np.array([[rng.choice([0.1, 0.2, 0.25, 1.0, rng.random()]) for _ in range(9)]
                      for _ in range(n)])
        got = medians_of_others(a)
        rows = np.median(a, axis=1)  # what a rank's median lateness is taken with
        for r in range(n):
            assert rows[r] == statistics.median(a[r].tolist()), (n, r)
            for k in range(9):
                want = statistics.median([a[j, k] for j in range(n) if j != r])
                assert got[r, k] == want, (n, r, k)


def _window_dump(rank, n, peers, recv_from, nops=20, chunks=1):
    """A live window's dump (summary.py reads it): `peers` its links,
    receiving `chunks` timed messages per collective from `recv_from`."""
    ops = []
    for k in range(nops):
        t = 1.0 + 0.1 * k
        msgs = [_msg(recv_from, "recv", 1 << 20, t + 0.01 * i, t + 0.01 * i + 0.005)
                for i in range(chunks)]
        ops.append(_op(k + 1, 100 + k, t, t + 0.09, msgs, 4 << 20))
    hosts = [f"h{r // 8}" for r in range(n)]
    d = _dump(rank, hosts, ops, 0.0, 0.0, [
        {"peer": p, "transport": "tcp", "bytes_sent": 1, "bytes_recv": 1, "msgs_sent": 1,
         "msgs_recv": 1, "busy_ns": 1, "single_copy_sent": 0} for p in peers], 5.0)
    d["peers"] = [x for x in d["peers"] if x["rank"] in set(peers) | {rank}]
    return d


def test_a_window_summary_does_not_grow_with_the_job():
    """A rank of a ring: the same summary at 16 ranks and at 4096, and a
    host's summary too; a sender of many chunks a collective is held to
    SPAN_CAP spans, which cover exactly the time the chunks took, not the
    gaps between them (a ring starved upstream receives its chunks far
    apart: its link is not slow for that)."""
    from cadence.diagnosis.summary import (
        SPAN_CAP,
        covered,
        encode_host,
        encode_rank,
        host_summary,
        rank_summary,
    )

    def sizes(n):
        rs = [rank_summary(parse(json.dumps(_window_dump(r, n, [(r - 1) % n, (r + 1) % n],
                                                         (r - 1) % n)), f"rank {r}"))
              for r in range(8, 16)]
        return len(encode_rank(rs[3])), len(encode_host(host_summary(rs)))

    small, big = sizes(16), sizes(4096)
    for a, b in zip(small, big, strict=True):
        assert abs(b - a) <= 0.05 * a, (small, big)
    d = parse(json.dumps(_window_dump(1, 4, [0], 0, nops=1, chunks=100)), "rank 1")
    s = rank_summary(d)
    (g,) = s.received
    assert g.messages == 100 and len(g.spans) == SPAN_CAP, g
    assert abs(covered(g.spans) - 100 * 0.005) < 1e-6, covered(g.spans)


def test_the_judge_names_random_faults_among_sixty_hosts(capsys):
    """`python -m cadence.bench.judge` at 480 ranks (60 hosts of 8): a
    throttled link, a slow host and a straggler drawn at random, with noise,
    and clean windows: every verdict right (it exits 1 otherwise)."""
    from cadence.bench import judge

    assert judge.main(["--ranks", "480", "--trials", "2", "--noise", "--colls", "40"]) == 0, \
        capsys.readouterr().out


def test_the_judge_names_simulated_slowness_on_256_ranks(capsys):
    """`python -m cadence.bench.sim_slowness` on `cadence sim`'s window
    records of 256 ranks (hosts of 8, 2D torus rings): clean runs, a slow
    NIC and a late rank drawn at random, every verdict right (it exits 1
    otherwise). The campaign at 1,024 and 4,096 ranks is in
    docs/benchmarks.md."""
    from cadence.bench import sim_slowness

    rc = sim_slowness.main(["--ranks", "256", "--trials", "2", "--jobs", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "torus2d_ring" in out and "slow-nic    2/2" in out, out


def test_an_alltoall_rank_keeps_per_sender_detail_only_for_slow_senders():
    """32 ranks on 16 hosts, everyone receiving from everyone: a rank keeps
    its receives from other hosts per sending host, and per sender only for
    the one that looks slow; the verdict names that link, a slow host, or
    nothing, live as from the dumps."""
    from cadence.diagnosis.summary import PEER_DETAIL, rank_summary

    hosts = [f"h{i // 2}" for i in range(32)]
    other = lambda s, d: 5e9 if hosts[s] == hosts[d] else GBIT  # noqa: E731
    link = make_job(hosts, nops=30, noise=0.2, seed=3,
                    rate=lambda s, d: GBIT / 5 if (s, d) == (5, 20) else other(s, d))
    s20 = rank_summary(parsed(link)[20])
    assert len({g.src for g in s20.received}) == 16 > PEER_DETAIL  # rank 21, 15 hosts
    assert {g.src for g in s20.slow_peers} == {5}, s20.slow_peers
    for ds in (link, through_the_wire(link)):
        v = diagnose_slow(parsed(ds) if ds is link else ds)
        assert v is not None and v.links == [(5, 20)], v and v.text()
        assert "link 5->20 (h2 -> h10) at" in v.headline, v.headline
    host = make_job(hosts, nops=30, noise=0.2, seed=3, rate=lambda s, d: (
        GBIT / 5 if "h7" in (hosts[s], hosts[d]) and hosts[s] != hosts[d] else other(s, d)))
    v = slow(host)
    assert v is not None and v.hosts == ["h7"] and v.ranks == [14, 15], v and v.text()
    assert slow(make_job(hosts, nops=30, noise=0.2, seed=3)) is None


def test_a_malformed_summary_is_named():
    from cadence.diagnosis.summary import decode_host, decode_rank, encode_rank, rank_summary

    for blob in (b"", b"garbage", __import__("zlib").compress(b"\x05\x00\x00\x00{}")):
        with pytest.raises(ValueError, match="rank 3's window: not a"):
            decode_rank(blob, "rank 3's window")
    rank = encode_rank(rank_summary(parse(json.dumps(_window_dump(1, 4, [0], 0)), "r1")))
    with pytest.raises(ValueError, match="not a host window summary"):
        decode_host(rank, "h")


# --- through diagnose and cadence doctor --------------------------------------


def test_doctor_reports_slowness(tmp_path, capsys):
    hosts = TWO_PER_HOST
    rate = lambda s, d: (5e9 if hosts[s] == hosts[d]  # noqa: E731
                         else GBIT / 5 if "h2" in (hosts[s], hosts[d]) else GBIT)
    for d in make_job(hosts, rate=rate):
        (tmp_path / f"cadence-c1-rank{d['rank']}.json").write_text(json.dumps(d))
    rc = cli(["doctor", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1 and out.startswith("cadence doctor: comm_slow (comm c1): host h2"), out
    rc = cli(["doctor", str(tmp_path), "--json"])
    j = json.loads(capsys.readouterr().out)
    assert rc == 1 and j["class"] == "comm_slow" and j["hosts"] == ["h2"] and j["op"] is None


# --- real jobs on the emulated cluster -------------------------------------------

HERE = Path(__file__).resolve()
PYTHON_DIR = HERE.parents[1] / "python"
WHY_NO_CLUSTERS = why_no_clusters() if __name__ != "__main__" else None
needs_clusters = pytest.mark.skipif(WHY_NO_CLUSTERS is not None, reason=str(WHY_NO_CLUSTERS))


def worker(out: str, seconds: float) -> None:
    """One rank of the real job: a loop of allreduce / allgather / alltoall
    of 4 KiB-4 MiB for `seconds`, then a dump. SLOW_RANK sleeps SLOW_DELAY
    before each collective."""
    import cadence
    import numpy as np

    straggler = int(os.environ.get("SLOW_RANK", "-1"))
    delay = float(os.environ.get("SLOW_DELAY", "0.1"))
    comm = cadence.init()
    sizes = [4 << 10, 64 << 10, 1 << 20, 4 << 20]
    t0, i = time.time(), 0
    while True:
        if i % 12 == 0:  # every rank stops at the same collective
            flag = np.array([float(time.time() - t0 > seconds)], dtype=np.float32)
            comm.allreduce(flag)
            if flag[0] > 0:
                break
        block = sizes[i % 4] // 4 // comm.size  # float32s per rank
        kind = ("allreduce", "allgather", "alltoall")[(i // 4) % 3]
        if comm.rank == straggler:
            time.sleep(delay)
        if kind == "allgather":
            comm.allgather(np.ones(block, dtype=np.float32))
        else:
            getattr(comm, kind)(np.ones(block * comm.size, dtype=np.float32))
        i += 1
    comm.dump(out)


@needs_clusters
def test_real_slow_host_and_straggler_on_the_emulated_cluster(tmp_path):
    """3 hosts x 1 rank at 1 Gbit/s, 5 s of mixed collectives each time:
    healthy; host 1 cut to 200 Mbit/s is named as a host; rank 2 sleeping
    100 ms before each collective is named as a straggler. (One rank per
    host: starting a rank takes seconds on a loaded 2-core machine.)"""
    from cadence import testbed

    name = f"slowt{secrets.token_hex(2)}"
    cluster = testbed.build(name, hosts=3, nics=1, rate="1gbit")
    env = dict(os.environ, PYTHONPATH=f"{PYTHON_DIR}{os.pathsep}{HERE.parent}")
    try:
        testbed.up(cluster)

        def job(tag, **extra):
            out, t0 = tmp_path / tag, time.monotonic()
            cmd = [sys.executable, str(HERE), "worker", str(out), "5"]
            res = testbed.jobs.run(cluster, 1, cmd, timeout=60, env={**env, **extra})
            assert res.status == 0, res.reason
            v = diagnose(load_dir(str(out))[0])
            print(f"{tag} ({time.monotonic() - t0:.1f}s): {v.headline}")
            return v

        v = job("healthy")
        assert v.cls == "healthy", v.text()
        testbed.set_link(cluster, host=1, nic=0, rate="200mbit")
        v = job("slowhost")
        assert v.cls == "comm_slow" and v.hosts == [f"{name}-h1"] and v.ranks == [1], v.text()
        assert v.links == [], v.text()
        testbed.set_link(cluster, host=1, nic=0, rate="1gbit")
        v = job("straggler", SLOW_RANK="2", SLOW_DELAY="0.1")
        assert v.cls == "noncomm_slow" and v.ranks == [2], v.text()
    finally:
        testbed.down(name)


if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "worker":
    worker(sys.argv[2], float(sys.argv[3]))
