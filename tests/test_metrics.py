"""Prometheus metrics: `CADENCE_METRICS_PORT` makes each
rank serve its communicators' totals on port + local rank; real ranks run
known collectives and every rank's endpoint is scraped over HTTP and parsed
with prometheus_client's own parser. Also the error cases (port taken, bad
value, library missing) and that the collector keeps no communicator alive."""

from __future__ import annotations

import gc
import random
import socket
import sys
import urllib.request

import numpy as np
import pytest
from harness import run_ranks

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

NRANKS = 3
ADDR = "127.0.0.1"


def _free_ports(n: int) -> int:
    """A base port with n free ports from it (on ADDR)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((ADDR, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://{ADDR}:{port}/metrics", timeout=20) as r:
        return r.read().decode()


def _samples(text: str) -> dict:
    """{(sample name, frozenset of label items): value} for cadence's samples."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("cadence_"):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(samples, name, **labels):
    want = {k: str(v) for k, v in labels.items()}
    hits = [v for (n, lab), v in samples.items()
            if n == name and all(dict(lab).get(k) == x for k, x in want.items())]
    assert len(hits) == 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0]


def _ranks_work(comm, base):
    """7 ring allreduces of 4000 bytes (rank r sends to r+1 only), a
    barrier, then rank r scrapes its own endpoint and rank 0 everyone's;
    then 3 allgathers and a verdict, and a second scrape."""
    from cadence.diagnosis import metrics

    x = np.ones(1000, dtype=np.float32)
    for _ in range(7):
        comm.allreduce(x, algo="ring")
    comm.barrier()
    first = {r: _scrape(base + r) for r in range(comm.size)} if comm.rank == 0 else {
        comm.rank: _scrape(base + comm.rank)}
    comm.barrier()  # nobody moves on before rank 0 scraped everyone
    for _ in range(3):
        comm.allgather(np.arange(256, dtype=np.int32))
    if comm.rank == 1:
        metrics.set_verdict(comm.id, "comm_slow", "comm_slow: link 1->2 slow")
    second = _scrape(base + comm.rank)
    comm.barrier()
    return {"id": comm.id, "local_rank": comm.local_rank, "first": first, "second": second}


def test_every_rank_serves_its_totals():
    base = _free_ports(NRANKS)
    env = {"CADENCE_METRICS_PORT": str(base), "CADENCE_METRICS_ADDR": ADDR,
           "CADENCE_METRICS_PEERS": "1"}
    res = run_ranks(_ranks_work, NRANKS, env=env, args=(base,), timeout=120)
    bad = {r: v for r, v in res.items() if v[0] != "ok"}
    assert not bad, bad
    out = {r: v[1] for r, v in res.items()}
    comm = out[0]["id"]
    scraped = {r: _samples(t) for r, t in out[0]["first"].items()}
    assert sorted(scraped) == list(range(NRANKS))
    for r in range(NRANKS):
        assert out[r]["local_rank"] == r  # one host: ports base + 0, 1, 2
        own = _samples(out[r]["first"][r])
        s = scraped[r]
        lab = {"comm": comm, "rank": r, "host": "hostA"}
        assert _get(s, "cadence_operations_total", **lab, collective="allreduce",
                    status="ok") == 7
        assert _get(s, "cadence_operations_total", **lab, collective="allreduce",
                    status="failed") == 0
        assert _get(s, "cadence_bytes_total", **lab, collective="allreduce") == 28000
        assert _get(s, "cadence_operations_total", **lab, collective="barrier",
                    status="ok") == 1
        assert _get(s, "cadence_bytes_total", **lab, collective="barrier") == 0
        # The histogram: 7 observations, cumulative buckets ending at +Inf.
        assert _get(s, "cadence_operation_seconds_count", **lab, collective="allreduce") == 7
        total = _get(s, "cadence_operation_seconds_sum", **lab, collective="allreduce")
        assert 0 < total < 30
        buckets = sorted(
            ((float(dict(k)["le"]), v) for (n, k), v in s.items()
             if n == "cadence_operation_seconds_bucket" and dict(k)["collective"] == "allreduce"
             and dict(k)["rank"] == str(r)))
        assert len(buckets) == 29 and buckets[0][0] == 1e-6 and buckets[-1][0] == float("inf")
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == 7
        # Ring: rank r sends to r+1 and receives from r-1; the barrier's
        # messages carry no payload, so the other direction moved nothing.
        nxt, prv = (r + 1) % NRANKS, (r - 1) % NRANKS
        peer = {**lab, "transport": "shm", "peer_host": "hostA"}
        sent = _get(s, "cadence_peer_bytes_total", **peer, peer=nxt, direction="send")
        got = _get(s, "cadence_peer_bytes_total", **peer, peer=prv, direction="recv")
        # A ring allreduce sends (n-1)/n of the data twice: 2 * 2/3 * 4000
        # bytes per call, give or take the uneven blocks of 1000 elements.
        assert 7 * 5328 <= sent <= 7 * 5336, sent
        assert 7 * 5328 <= got <= 7 * 5336, got
        assert _get(s, "cadence_peer_bytes_total", **peer, peer=prv, direction="send") == 0
        assert _get(s, "cadence_peer_bytes_total", **peer, peer=nxt, direction="recv") == 0
        assert _get(s, "cadence_peer_busy_seconds_total", **peer, peer=nxt) > 0
        assert _get(s, "cadence_peer_rate_bytes_per_second", **lab, peer=nxt) > 0
        assert _get(s, "cadence_peer_messages_total", **peer, peer=nxt, direction="send") >= 28
        # The per-host series sum the links to the host's ranks (all on
        # hostA here: the two links, one sending, one receiving).
        host = {**lab, "peer_host": "hostA", "transport": "shm"}
        assert _get(s, "cadence_host_links", **host) == 2
        assert _get(s, "cadence_host_bytes_total", **host, direction="send") == sent
        assert _get(s, "cadence_host_bytes_total", **host, direction="recv") == got
        assert _get(s, "cadence_host_busy_seconds_total", **host) > 0
        # What r sent to r+1, r+1 received from r, byte for byte.
        back = scraped[nxt]
        assert _get(back, "cadence_peer_bytes_total", comm=comm, rank=nxt, peer=r,
                    direction="recv") == sent
        # Rank 0 scraped the others while they may have been in the barrier.
        assert _get(own, "cadence_running_operation_seconds", **lab) == 0
        assert _get(s, "cadence_running_operation_seconds", **lab) >= 0
        assert _get(s, "cadence_verdict", **lab, **{"class": "healthy"}) == 1
        assert _get(s, "cadence_verdict", **lab, **{"class": "comm_hang"}) == 0
        assert _get(s, "cadence_communicator_info", **lab, nranks=NRANKS) == 1
        # The rank's own scrape agrees with rank 0's.
        assert _get(own, "cadence_bytes_total", **lab, collective="allreduce") == 28000

        later = _samples(out[r]["second"])
        assert _get(later, "cadence_operations_total", **lab, collective="allreduce",
                    status="ok") == 7
        assert _get(later, "cadence_operations_total", **lab, collective="allgather",
                    status="ok") == 3
        # allgather's size is its output: 256 int32 from each of 3 ranks.
        assert _get(later, "cadence_bytes_total", **lab, collective="allgather") == 3 * 3072
        assert _get(later, "cadence_operations_total", **lab, collective="barrier",
                    status="ok") == 2
        slow = 1 if r == 1 else 0
        assert _get(later, "cadence_verdict", **lab, **{"class": "comm_slow"}) == slow
        assert _get(later, "cadence_verdict", **lab, **{"class": "healthy"}) == 1 - slow


def _hosts_only(comm, base):
    """Two emulated hosts; a ring allreduce, then a scrape of this rank (on
    its host's ports: base + 2 × host + local rank)."""
    x = np.ones(1000, dtype=np.float32)
    comm.allreduce(x, algo="ring")
    comm.barrier()
    text = _scrape(base + 2 * (comm.rank // 2) + comm.local_rank)
    comm.barrier()
    return {"id": comm.id, "text": text}


def test_link_series_are_per_peer_host_unless_peers_are_asked_for():
    """By default a rank's link series grow with the hosts it talks to, not
    with its peers: 4 ranks as 2 hosts, no series names a peer rank."""
    base = _free_ports(4)
    env = {"CADENCE_METRICS_ADDR": ADDR}
    res = run_ranks(_hosts_only, 4, transport="mixed", env=env, args=(base,), timeout=120,
                    rank_env=lambda r: {"CADENCE_METRICS_PORT": str(base + 2 * (r // 2))})
    assert all(v[0] == "ok" for v in res.values()), res
    for r, (_, out) in res.items():
        s = _samples(out["text"])
        assert not [k for k in s if dict(k[1]).get("peer") is not None], r
        mine, other = ("host0", "host1") if r < 2 else ("host1", "host0")
        lab = {"comm": out["id"], "rank": r}
        assert _get(s, "cadence_host_links", **lab, peer_host=mine, transport="shm") == 1
        tcp = _get(s, "cadence_host_links", **lab, peer_host=other, transport="tcp")
        assert tcp >= 1, tcp
        moved = sum(_get(s, "cadence_host_bytes_total", **lab, peer_host=h, direction=d)
                    for h in (mine, other) for d in ("send", "recv"))
        assert moved > 0


def _idle(comm):
    comm.barrier()
    return comm.rank


def test_a_taken_port_names_the_port_and_the_variable():
    base = _free_ports(2)
    blocker = socket.socket()
    blocker.bind((ADDR, base + 1))  # rank 1's port (local rank 1)
    blocker.listen()
    try:
        env = {"CADENCE_METRICS_PORT": str(base), "CADENCE_METRICS_ADDR": ADDR}
        res = run_ranks(_idle, 2, env=env, timeout=60, op_timeout=5)
    finally:
        blocker.close()
    status, text = res[1]
    assert status == "err", res
    first = text.splitlines()[0]
    assert first == (f"MetricsError: CADENCE_METRICS_PORT={base}: port {base + 1} (= {base} "
                     f"+ local rank 1) on {ADDR} is already in use; choose another "
                     "CADENCE_METRICS_PORT (ranks of a host use CADENCE_METRICS_PORT + 0, 1, ...)"
                     ), first


def _dropped(comm, base):
    """The collector holds communicators weakly: a dropped one is gone from
    the next scrape."""
    from cadence.diagnosis import metrics

    sub = comm.split(0)
    sub.barrier()
    with_sub = _scrape(base + comm.local_rank)
    sub_id = sub.id
    sub.close()
    del sub
    gc.collect()
    without = _scrape(base + comm.local_rank)
    comm.barrier()
    return sub_id, with_sub, without, len(metrics._live())


def test_the_collector_keeps_no_communicator_alive():
    base = _free_ports(2)
    env = {"CADENCE_METRICS_PORT": str(base), "CADENCE_METRICS_ADDR": ADDR}
    res = run_ranks(_dropped, 2, env=env, args=(base,), timeout=60)
    for status, v in res.values():
        assert status == "ok", v
        sub_id, with_sub, without, live = v
        assert f'comm="{sub_id}"' in with_sub
        assert f'comm="{sub_id}"' not in without
        assert live == 1


def test_bad_values_and_a_missing_library_give_one_clear_error(monkeypatch):
    from cadence.diagnosis import metrics

    with pytest.raises(metrics.MetricsError, match=r"CADENCE_METRICS_PORT='abc' is not a port"):
        metrics.start_server("abc")
    with pytest.raises(metrics.MetricsError, match=r"port 65537 \(= 65535 \+ local rank 2\)"):
        metrics.start_server("65535", 2)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(metrics.MetricsError) as e:
        metrics.start_server("9400")
    assert "the Python package prometheus_client is not installed" in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__
