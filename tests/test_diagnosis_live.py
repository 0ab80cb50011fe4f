"""Live diagnosis (docs/diagnosis.md): the watchdog opens a round once an operation
passes CADENCE_DIAG_AFTER, every rank publishes a summary through the job's
Store, one verdict is logged by every rank as one line and carried by the
CommError raised later (`e.diagnosis`) — on real ranks that hang: one that
never enters (stuck in compute: the verdict shows where), one frozen inside
the operation. A healthy job opens no round at all."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

import numpy as np
import pytest
from harness import run_ranks

OP_TIMEOUT = 5.0
LIVE = {"CADENCE_DIAG_AFTER": "1"}


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _capture():
    h = _Lines()
    logging.getLogger("cadence").addHandler(h)
    return h


def load_batch(seconds, until=None):
    """Stands for a data loader that got stuck: for `seconds`, or until the
    file `until` appears (at most `seconds`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and os.path.exists(until)):
        time.sleep(0.05)


def _never_enters(comm, stuck):
    import cadence

    logs = _capture()
    x = np.ones(1000, dtype=np.float32)
    comm.allreduce(x)
    comm.barrier()
    t0 = time.monotonic()
    if comm.rank == stuck:
        load_batch(OP_TIMEOUT + 3.0)  # past the deadline and its grace period
        with contextlib.suppress(cadence.CommError):
            comm.allreduce(x)
            comm.barrier()
        return {"logs": logs.lines}
    try:
        comm.allreduce(x)
        return {"logs": logs.lines, "error": None}
    except cadence.CommError as e:
        return {"logs": logs.lines, "error": str(e), "diagnosis": e.diagnosis,
                "after": time.monotonic() - t0}


def test_a_rank_stuck_in_compute_is_named_live_with_its_stack():
    stuck = 2
    res = run_ranks(_never_enters, 3, transport="shm", args=(stuck,), env=LIVE,
                    op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" for r in range(3)), res
    for r in (0, 1):
        out = res[r][1]
        d = out["diagnosis"]
        assert d is not None, out
        assert d["class"] == "noncomm_hang" and d["ranks"] == [stuck], d["text"]
        assert d["op"]["collective"] == "allreduce", d
        # Where the stuck rank was: its Python stack, innermost frame first.
        assert "load_batch" in d["stacks"][str(stuck)], d["stacks"]
        assert any("load_batch" in e for e in d["evidence"]), d["evidence"]
        # One line, logged once, well before the deadline's error.
        lines = [x for x in out["logs"] if "noncomm_hang" in x]
        assert len(lines) == 1 and "\n" not in lines[0], out["logs"]
        assert lines[0].startswith("cadence: noncomm_hang in allreduce #"), lines
    # The stuck rank logged the same verdict while it was still computing.
    assert any("noncomm_hang" in x for x in res[stuck][1]["logs"]), res[stuck]


def _frozen_inside(comm, victim):
    import cadence

    logs = _capture()
    x = np.ones(1 << 16, dtype=np.float32)
    comm.allreduce(x)
    pids = {p["rank"]: p["pid"] for p in comm.dump_records()["peers"]}
    comm.barrier()
    t0 = time.monotonic()
    if comm.rank == 0:
        time.sleep(0.5)  # the victim is inside the allreduce by now
        os.kill(pids[victim], signal.SIGSTOP)
    try:
        comm.allreduce(x, algo="ring")
        out = {"error": None}
    except cadence.CommError as e:
        out = {"error": str(e), "diagnosis": e.diagnosis}
    if comm.rank == 0:
        time.sleep(max(0.0, t0 + OP_TIMEOUT + 2.0 - time.monotonic()))
        os.kill(pids[victim], signal.SIGCONT)
    out["logs"] = logs.lines
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_frozen_inside_the_operation_is_named_live(transport):
    victim = 2
    res = run_ranks(_frozen_inside, 4, transport=transport, args=(victim,), env=LIVE,
                    op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" for r in range(4)), res
    for r in (0, 1, 3):
        out = res[r][1]
        assert out["error"] is not None, out
        d = out["diagnosis"]
        assert d is not None and d["class"] == "comm_hang", out
        assert d["ranks"] == [victim], d["text"]
        # The frozen process published nothing: the verdict was made without it.
        assert victim not in d["summaries"], d
        assert sum("comm_hang" in x for x in out["logs"]) == 1, out["logs"]
        # One round: the first rank to claim the stuck operation opened it.
        assert d["round"] == 1, d


def _error_during_a_second_round(comm):
    import cadence

    x = np.ones(16, dtype=np.float32)
    comm.allreduce(x)
    comm.barrier()
    out = {}
    # A verdict on the hang is held, then another stuck operation opens a
    # second round (whose coordinator may fail and never publish): an error
    # raised now carries the verdict at once.
    comm._c._set_diagnosis({"class": "comm_hang", "verdict": "held"})
    comm._c._diagnosis_pending(30.0)
    comm._c.abort("test: fail this rank")
    t0 = time.monotonic()
    with pytest.raises(cadence.CommError) as e:
        comm.allreduce(x)
    out["held"] = (time.monotonic() - t0, e.value.diagnosis)
    # With no verdict held, the error waits for the round's (bounded).
    comm._c._set_diagnosis(None, 0.8)
    t0 = time.monotonic()
    with pytest.raises(cadence.CommError) as e:
        comm.allreduce(x)
    out["none"] = (time.monotonic() - t0, e.value.diagnosis)
    return out


def test_an_error_during_a_second_round_keeps_the_verdict_it_holds():
    res = run_ranks(_error_during_a_second_round, 2, transport="shm", env=LIVE,
                    op_timeout=OP_TIMEOUT, timeout=60)
    for r in range(2):
        assert res[r][0] == "ok", res
        waited, verdict = res[r][1]["held"]
        assert waited < 0.5 and verdict == {"class": "comm_hang", "verdict": "held"}, res[r]
        waited, verdict = res[r][1]["none"]
        assert 0.6 < waited < 3.0 and verdict is None, res[r]


def _healthy(comm):
    logs = _capture()
    x = np.ones(4096, dtype=np.float32)
    n = 0
    for _ in range(200):  # ~2.5 s: ten watchdog ticks
        comm.allreduce(x)
        comm.allgather(x[:16])
        time.sleep(0.01)
        n += 1
    time.sleep(1.0)  # a few watchdog ticks with nothing running
    return {"logs": logs.lines, "n": n}


def test_a_healthy_job_opens_no_round_and_logs_nothing():
    res = run_ranks(_healthy, 3, transport="shm", env=LIVE,
                    op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" for r in range(3)), res
    for r in range(3):
        assert res[r][1]["n"] > 10 and res[r][1]["logs"] == [], res[r]


def test_diag_after_is_bounded_by_the_timeout_and_can_be_turned_off(monkeypatch):
    from cadence.diagnosis.live import diag_after

    monkeypatch.delenv("CADENCE_DIAG_AFTER", raising=False)
    assert diag_after(300) == 30 and diag_after(10) == 5
    monkeypatch.setenv("CADENCE_DIAG_AFTER", "7")
    assert diag_after(300) == 7
    for off in ("0", "off"):
        monkeypatch.setenv("CADENCE_DIAG_AFTER", off)
        assert diag_after(300) is None
    monkeypatch.setenv("CADENCE_DIAG_AFTER", "soon")
    with pytest.raises(ValueError, match="CADENCE_DIAG_AFTER"):
        diag_after(300)


# The ranks' own rounds open at half the operation deadline: long enough that
# the doctor's round (its process's start, the store's greeting, torch's
# import, on a loaded CI host) comes first, and everyone is still in the job.
ASK_TIMEOUT = 60.0


def _doctor_asks(comm, stuck, asked):
    """Rank `stuck` hangs in its data loader until rank 0's doctor has
    answered (the file `asked`), then joins: the job ends cleanly, however
    long the doctor took to start."""
    import subprocess
    import sys
    import threading

    x = np.ones(1000, dtype=np.float32)
    comm.allreduce(x)
    comm.barrier()
    if comm.rank == stuck:
        load_batch(ASK_TIMEOUT / 2, until=asked)
        comm.allreduce(x)
        return None
    result = {}

    def ask():
        try:
            time.sleep(1.5)
            p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "doctor", "--store",
                                f"{comm._store.host}:{comm._store.port}", "--prefix",
                                comm._prefix, "--hang-after", "1", "--gather", "3", "--json"],
                               capture_output=True, text=True, timeout=ASK_TIMEOUT / 2)
            result["rc"], result["out"], result["err"] = p.returncode, p.stdout, p.stderr
        finally:
            open(asked, "w").close()

    t = threading.Thread(target=ask) if comm.rank == 0 else None
    if t:
        t.start()
    comm.allreduce(x)
    if t:
        t.join()
    return result


def test_doctor_asks_a_running_job_through_its_store(tmp_path):
    stuck = 1
    res = run_ranks(_doctor_asks, 3, transport="tcp", args=(stuck, str(tmp_path / "asked")),
                    op_timeout=ASK_TIMEOUT, timeout=90)
    assert all(res[r][0] == "ok" for r in range(3)), res
    out = res[0][1]
    assert out["rc"] == 1, out
    import json

    v = json.loads(out["out"])
    assert v["class"] == "noncomm_hang" and v["ranks"] == [stuck], v
    assert v["coordinator"] == "cadence doctor" and v["summaries"] == [0, 1, 2], v
    assert "load_batch" in v["stacks"][str(stuck)]


def test_doctor_store_errors_are_one_line():
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for target in (f"127.0.0.1:{port}", "nohost"):
        p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "doctor", "--store", target,
                            "--gather", "0.5"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.startswith("cadence doctor: "), p.stderr


def _straggles(comm, slow):
    from cadence.diagnosis import live

    seen = []
    live.add_listener(lambda _c, v: seen.append(v))
    x = np.ones(1 << 14, dtype=np.float32)
    for _ in range(300 if slow < 0 else 70):  # ~9 s: four windows of 2 s
        time.sleep(0.03 if comm.rank != slow else 0.13)  # compute; longer on the straggler
        comm.allreduce(x)
    time.sleep(1.0)  # the last window's verdict reaches everyone
    return {"verdicts": seen}


@pytest.mark.parametrize("transport", ["shm", "mixed"])
def test_a_straggler_is_named_live_from_the_slowness_windows(transport):
    """On one host, and on two (host0: ranks 0-1, host1: rank 2), whose
    leaders reduce their ranks' window summaries for rank 0."""
    slow = 1
    res = run_ranks(_straggles, 3, transport=transport, args=(slow,),
                    env={"CADENCE_DIAG_WINDOW": "2"}, op_timeout=30, timeout=90)
    assert all(res[r][0] == "ok" for r in range(3)), res
    for r in range(3):
        vs = [v for v in res[r][1]["verdicts"] if v["class"] != "healthy"]
        assert vs, res[r]
        assert vs[0]["class"] == "noncomm_slow" and vs[0]["ranks"] == [slow], vs[0]
        assert len(vs) == 1, vs  # logged once while it persists


def _layout_of(comm):
    c = comm._c
    with pytest.raises(ValueError, match="rank 3 of 3"):
        c.peer_pid(3)
    return {"host": c.host_ranks(), "leaders": c.host_leaders(), "pid": os.getpid(),
            "pids": [c.peer_pid(r) for r in range(comm.size)]}


def test_the_watchdog_reads_its_hosts_layout_from_the_core():
    """What the windows' leaders and relays are made of, without a list of
    every rank: host0 holds ranks 0-1, host1 rank 2."""
    res = run_ranks(_layout_of, 3, transport="mixed", timeout=60)
    assert all(res[r][0] == "ok" for r in range(3)), res
    got = {r: res[r][1] for r in range(3)}
    assert [got[r]["host"] for r in range(3)] == [[0, 1], [0, 1], [2]], got
    assert all(got[r]["leaders"] == [0, 2] for r in range(3)), got
    assert all(got[r]["pids"] == [got[q]["pid"] for q in range(3)] for r in range(3)), got


def test_a_healthy_job_raises_no_slowness_verdict():
    res = run_ranks(_straggles, 3, transport="shm", args=(-1,),
                    env={"CADENCE_DIAG_WINDOW": "2"}, op_timeout=30, timeout=90)
    assert all(res[r][0] == "ok" for r in range(3)), res
    for r in range(3):
        assert res[r][1]["verdicts"] == [], res[r]


def test_one_rank_a_host_reads_the_stores_counters(tmp_path):
    """The round and slowness counters: the host's leader reads them from
    the Store and leaves them in the host's relay; its other ranks read the
    relay, unless their own operation has waited half the soft deadline or
    the leader has gone quiet, when they read the Store themselves."""
    import struct

    from cadence.diagnosis import live

    class CountingStore:
        def __init__(self):
            self.calls, self.v = 0, {"p/diag/round": 3, "p/diag/slow": 1}

        def add(self, key, n):
            self.calls += 1
            self.v[key] = self.v.get(key, 0) + n
            return self.v[key]

    store = CountingStore()
    relay = live._Relay(str(tmp_path / "relay"))

    def watched(rank):
        w = live._Watched(None, store, "p", rank, 4, after=10.0, gather=1.0, window=10.0)
        w.leader, w.host_ranks, w.leaders, w.relay = 0, [0, 1, 2, 3], [0], relay
        return w

    wd = live.Watchdog()
    leader, other = watched(0), watched(2)
    assert other.relay.read(max_age=3.0) is None  # nothing relayed yet
    assert wd._counters(leader, None, None) == (3, 1) and store.calls == 2
    store.v["p/diag/round"] = 4  # a round opens: the relay has the old count
    assert wd._counters(other, None, None) == (3, 1) and store.calls == 2
    assert wd._counters(other, None, (7, "allreduce", 6.0)) == (4, 1) and store.calls == 4
    assert wd._counters(leader, None, None) == (4, 1) and store.calls == 6
    assert wd._counters(other, None, None) == (4, 1) and store.calls == 6
    # The leader gone quiet: its last word is old, the rank asks the Store.
    with open(relay.path, "wb") as f:
        f.write(struct.pack("<dqq", time.time() - 10, 4, 1))
    store.v["p/diag/slow"] = 2
    assert wd._counters(other, None, None) == (4, 2) and store.calls == 8
    relay.remove()
    assert not os.path.exists(relay.path)


def _window_and_pause(comm):
    import json

    from cadence.diagnosis import live

    small = np.ones(16, dtype=np.float32)  # 64 B: no timed receive in it
    big = np.ones(1 << 18, dtype=np.float32)  # 1 MiB: ring messages of 512 KiB
    comm.barrier()
    t0 = time.time()
    for _ in range(5):
        comm.allreduce(small)
    time.sleep(0.05)
    t1 = time.time()
    for _ in range(6):
        if comm.rank == 1:
            time.sleep(0.05)  # rank 0 waits, so its messages are recorded
        comm.allreduce(big)
    comm.barrier()
    t2 = time.time()
    c = comm._c
    ns = lambda t: int(t * 1e9)  # noqa: E731
    before = c.dump_window(0, ns(t0 - 60), 128, 64 * 1024)
    first = json.loads(c.dump_window(ns(t0), ns(t1), 128, 64 * 1024))
    second = json.loads(c.dump_window(ns(t1), ns(t2), 128, 64 * 1024))
    newest = json.loads(c.dump_window(ns(t1), ns(t2), 3, 64 * 1024))
    # The watchdog: paused, it does no work; running, it does.
    live.pause()
    time.sleep(0.3)  # a tick under way finishes
    paused = live.cost()["ticks"]
    time.sleep(2.5)
    still = live.cost()["ticks"]
    live.pause(False)
    time.sleep(2.5)
    resumed = live.cost()
    return {"before": before, "first": first, "second": second, "newest": newest,
            "paused": paused, "still": still, "resumed": resumed}


def test_slowness_windows_send_only_their_operations_and_timed_receives():
    res = run_ranks(_window_and_pause, 2, transport="shm", env=LIVE,
                    op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" for r in range(2)), res
    for r in range(2):
        out = res[r][1]
        assert out["before"] is None  # nothing completed then
        first, second = out["first"], out["second"]
        assert first["reason"] == "slowness window"
        # Nothing in a window grows with the job: its peers are the rank
        # and those it has links to, and it has no ring order.
        linked = {c["peer"] for c in first["links"]} | {r}
        assert {p["rank"] for p in first["peers"]} == linked, first["peers"]
        assert first["ring_order"]["hosts"] == [], first["ring_order"]
        assert [o["collective"] for o in first["ops"]] == ["allreduce"] * 5, first["ops"]
        assert not any(o["messages"] for o in first["ops"])  # 64 B: no rate in them
        colls = [o["collective"] for o in second["ops"]]
        assert colls == ["allreduce"] * 6 + ["barrier"], colls
        assert all(o["status"] == "ok" for o in second["ops"])
        msgs = [m for o in second["ops"][:6] for m in o["messages"] or ()]
        if r == 0:
            assert msgs, second["ops"]
        # Only receives of at least 64 KiB that took time are sent.
        assert all(m["dir"] == "recv" and m["state"] == "done" and m["bytes"] >= 64 * 1024
                   and m["last_ns"] > m["first_ns"] for m in msgs), msgs
        # The newest N of the window.
        assert [o["seq"] for o in out["newest"]["ops"]] == [o["seq"] for o in second["ops"][-3:]]
        # Paused: no tick did work; resumed: ticks again, and their CPU is counted.
        assert out["still"] == out["paused"], out
        assert out["resumed"]["ticks"] >= out["still"] + 1 and out["resumed"]["cpu_s"] > 0, out


# --- without the Store: what a rank says by itself -------------------------------


class _FakeStore:
    host, port = "10.0.0.1", 29500


PEERS = [{"rank": r, "host": f"h{r // 2}", "pid": 100 + r, "addr": f"10.0.0.{r // 2 + 1}:4000"}
         for r in range(8)]


@pytest.mark.parametrize("answering, store_rank, arrived, cls, ranks", [
    ({"h0": False, "h1": False, "h2": False}, 0, False, "comm_hang", [6, 7]),  # h3 cut off
    ({"h0": False, "h1": True, "h2": True}, 0, False, "comm_hang", [0, 1]),  # h0 unreachable
    ({"h0": True, "h1": True, "h2": True}, 0, True, "comm_hang", [0]),  # rank 0 stopped inside
    ({"h0": True, "h1": True, "h2": True}, 0, False, "comm_hang", [0]),  # or before it sent
    ({"h0": True, "h1": True, "h2": True}, None, False, "unknown", []),  # an agent's Store
])
def test_a_rank_that_lost_the_store_names_the_side_of_the_cut(monkeypatch, answering, store_rank,
                                                              arrived, cls, ranks):
    """Rank 6 (host h3) is stuck and its Store calls hang: it probes the
    Store's host (h0: the Store's address is rank 0's) first, then the hosts
    it waits on and the others, and names the silent side of the cut — or,
    when every host answers but the Store served by rank 0's own process
    does not, rank 0."""
    from cadence.diagnosis import reach, store_lost

    probed = {}

    def probe_hosts(addrs, timeout=1.0):
        probed.update(addrs)
        return {h: answering.get(h) for h in addrs}

    monkeypatch.setattr(reach, "probe_hosts", probe_hosts)
    monkeypatch.setattr(reach, "probe", lambda addr, timeout=1.0: True)
    msgs = [{"peer": 0, "dir": "recv", "state": "pending", "moved": 4096 if arrived else 0},
            {"peer": 4, "dir": "recv", "state": "pending", "moved": 0}]
    v = store_lost.verdict(comm_id="c1", rank=6, peers=PEERS, store=_FakeStore(),
                           store_rank=store_rank, messages=msgs, err=TimeoutError("no reply"),
                           seq=812, collective="allreduce")
    assert "h3" not in probed and list(probed)[0] == "h0", probed  # the Store's host first
    assert v["class"] == cls and v["ranks"] == ranks, v
    assert v["local"] is True and v["op"]["seq"] == 812, v
    if cls == "unknown":
        assert "the process serving it is stopped or hung" in v["verdict"], v
        assert "waits on ranks 0,4" in v["verdict"], v
    elif ranks == [0]:
        assert "rank 0 (h0, pid 100) stopped" in v["verdict"], v
    else:
        assert "(on host h0)" in v["verdict"], v
