"""Diagnosis (the post-mortem classifier, docs/diagnosis.md): collective numbering that
point-to-point traffic does not shift, per-message records and dumps, and
`cadence doctor` classifying hangs from them — on synthetic dumps (each
class, signature mismatches, clock offsets, partial data, bad input) and on
real ranks that hang (a rank that never enters, one that enters late, one
frozen inside the operation)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from cadence.cli.main import main as cli
from cadence.diagnosis import DumpError, diagnose, live, load_dir, parse
from cadence.diagnosis.dumps import compact_messages
from harness import run_ranks

OP_TIMEOUT = 3.0
BASE = 1_700_000_000 * 10**9  # a wall-clock base, ns since the epoch


# --- synthetic dumps -------------------------------------------------------


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def msg(peer, dir, state="done", nbytes=4096, moved=None, first=None, last=None):
    if moved is None:
        moved = nbytes if state == "done" else 0
    if state == "done" and first is None:
        first = last = 0.01
    return {"peer": peer, "dir": dir, "state": state, "bytes": nbytes, "moved": moved,
            "first_ns": None if first is None else _ns(first),
            "last_ns": None if last is None else _ns(last)}


def op(id, seq, status="ok", start=0.0, end=0.001, sig="00000000000000aa", coll="allreduce",
       msgs=(), root=0, state=None):
    return {"id": id, "seq": seq, "sig": sig, "collective": coll, "algo": "ring",
            "dtype": "float32", "redop": "sum" if coll == "allreduce" else "", "root": root,
            "count": 1024, "bytes": 4096, "enqueue_ns": _ns(start), "start_ns": _ns(start),
            "end_ns": 0 if status == "running" else _ns(end), "status": status,
            "messages": list(msgs) if state != "dropped" else None,
            "messages_state": state or ("final" if msgs else "none"), "comm_id": "c1"}


def dump(rank, nranks, ops, *, comm="c1", job="job1", host=None, offset=0.0, error_ns=0,
         skew=0.0, dumped=10.0, timeout=OP_TIMEOUT, failure=None):
    """One rank's dump; `skew`: how far this rank's wall clock is ahead of
    rank 0's (seconds), `offset`: what its header says it measured."""
    hosts = [host or "hostA" for _ in range(nranks)]
    return {
        "format": "cadence-dump", "version": 1, "job": job, "comm_id": comm, "rank": rank,
        "nranks": nranks, "host": hosts[rank], "hostname": "box", "pid": 1000 + rank,
        "peers": [{"rank": r, "host": hosts[r], "pid": 1000 + r} for r in range(nranks)],
        "timeout_s": timeout, "base_unix_ns": BASE + _ns(skew), "dump_ns": _ns(dumped),
        "clock": {"offset_ns": _ns(offset), "error_ns": error_ns,
                  "method": "ping-pong" if host else "same host"},
        "reason": "on demand", "failure": failure, "total_ops": len(ops),
        "record_capacity": 1024, "message_capacity": 4096, "ops": ops, "links": [],
    }


def verdict(dumps, **kw):
    """The verdict on `dumps`, checked to be the verdict on them as a live
    round at scale carries them too (`as_summaries`)."""
    v = diagnose([parse(json.dumps(d), f"rank{d['rank']}") for d in dumps], **kw)
    small = diagnose([parse(json.dumps(d), f"rank{d['rank']}") for d in as_summaries(dumps)],
                     **kw)
    assert _named(small) == _named(v), (v.text(), small.text())
    return v


def _named(v):
    return v.cls, v.ranks, v.hosts, sorted(map(tuple, v.links))


def as_summaries(dumps):
    """The dumps as the live watchdog's round summaries carry them
    (live.summary): messages as runs, every rank listed by rank 0's alone,
    and a rank that waits (a running operation) with only its operations
    from two before that one."""
    out = []
    for d in dumps:
        d = json.loads(json.dumps(d))
        if d["rank"] != 0:  # itself and (here) its ring neighbours
            near = {d["rank"], (d["rank"] + 1) % d["nranks"], (d["rank"] - 1) % d["nranks"]}
            d["peers"] = [p for p in d["peers"] if p["rank"] in near]
        first = next((i for i, o in enumerate(d["ops"]) if o["status"] == "running"), None)
        if first is not None:
            d["ops"] = d["ops"][max(0, first - live.WAITING_OPS):]
        for o in d["ops"]:
            if o.get("messages"):
                o["messages"] = compact_messages(o["messages"])
        out.append(d)
    return out


def done_before(n):
    """Ops 1..n completed on a rank."""
    return [op(i, i, start=0.001 * i, end=0.001 * i + 0.0005) for i in range(1, n + 1)]


def ring_fail(rank, t_fail=3.75):
    """Rank 0 or 1 of a 3-rank ring (r sends to r+1) stuck in allreduce #3
    because rank 2 is not there: rank 0 waits on rank 2; rank 1 got rank
    0's first block and waits for the second, which rank 0 cannot send yet."""
    msgs = {0: [msg(1, "send"), msg(2, "recv", "pending")],
            1: [msg(2, "send"), msg(0, "recv"), msg(2, "send"), msg(0, "recv", "pending")]}
    return op(3, 3, status=f"cadence comm c1 rank {rank}, allreduce #3: timed out", start=0.01,
              end=t_fail, msgs=msgs[rank])


def test_healthy_when_every_operation_completed():
    v = verdict([dump(r, 3, done_before(4)) for r in range(3)])
    assert v.cls == "healthy", v.text()
    assert v.to_json()["op"] is None and v.ranks == [] and v.links == []


def test_noncomm_hang_names_the_rank_that_never_entered():
    dumps = [dump(r, 3, done_before(2) + [ring_fail(r)]) for r in (0, 1)]
    dumps.append(dump(2, 3, done_before(2)))
    v = verdict(dumps)
    j = v.to_json()
    assert j["class"] == "noncomm_hang", v.text()
    assert j["ranks"] == [2] and j["hosts"] == ["hostA"]
    assert j["op"] == {"comm": "c1", "seq": 3, "collective": "allreduce", "bytes": 4096}
    assert "rank 2 (hostA, pid 1002)" in v.headline and "allreduce #3" in v.headline
    assert any("never entered" in e and "last completed allreduce #2" in e for e in v.evidence)


def test_noncomm_hang_names_a_rank_that_entered_after_the_others_gave_up():
    dumps = [dump(r, 3, done_before(2) + [ring_fail(r, t_fail=3.75)]) for r in (0, 1)]
    late = op(3, 3, status="cadence comm c1 rank 2, allreduce #3: aborted because of rank 0",
              start=6.0, end=6.001, msgs=[msg(0, "send", "pending"), msg(1, "recv", "pending")])
    dumps.append(dump(2, 3, done_before(2) + [late]))
    v = verdict(dumps)
    assert v.cls == "noncomm_hang" and v.ranks == [2], v.text()
    assert any("after the first rank gave up" in e for e in v.evidence), v.text()


def _link_down_dumps(skew2=0.0, offset2=0.0, host_of=None):
    """4 ranks in a ring (r sends to r+1): link 1->2 stops mid-message;
    everybody else waits on someone downstream of it."""
    host = host_of or (lambda r: None)

    def stuck(r, msgs, t_fail=3.75):
        return op(3, 3, status=f"cadence comm c1 rank {r}, allreduce #3: timed out", start=0.01,
                  end=t_fail, msgs=msgs)

    # Ring steps: in step 2, rank 1's block to rank 2 stops after 1000
    # bytes. A rank sends its block of step s+1 once it received that of
    # step s, so rank 2 stops sending, then rank 3, then rank 0 waits too.
    part = {"moved": 1000, "first": 0.02, "last": 0.03}
    ops = {
        0: [msg(1, "send")] * 4 + [msg(3, "recv")] * 3 + [msg(3, "recv", "pending")],
        1: [msg(2, "send"), msg(2, "send", "pending", **part)] + [msg(0, "recv")] * 4,
        2: [msg(3, "send")] * 2 + [msg(1, "recv"), msg(1, "recv", "pending", **part)],
        3: [msg(0, "send")] * 3 + [msg(2, "recv")] * 2 + [msg(2, "recv", "pending")],
    }
    out = []
    for r in range(4):
        skew = skew2 if r == 2 else 0.0
        offset = offset2 if r == 2 else 0.0
        # Rank 2's own clock reads `skew` more for the same instant.
        o = stuck(r, ops[r], t_fail=3.75 + (0.002 * r))
        out.append(dump(r, 4, done_before(2) + [o], host=host(r), skew=skew, offset=offset,
                        error_ns=20_000 if host(r) else 0))
    return out


def test_comm_hang_names_the_stalled_link():
    v = verdict(_link_down_dumps())
    j = v.to_json()
    assert j["class"] == "comm_hang", v.text()
    assert j["links"] == [[1, 2]] and j["ranks"] == [], v.text()
    assert "link 1->2" in v.headline and "all entered" in v.headline
    assert any(e.startswith("link 1->2") and "send pending too" in e for e in v.evidence)


def test_clock_offsets_between_hosts_are_applied():
    """Rank 2's host clock runs 5 s behind rank 0's: uncorrected, it would
    seem to enter after the others gave up; with its measured offset it
    entered with them, and the verdict is the link."""
    hosts = {0: "h0", 1: "h1", 2: "h2", 3: "h3"}.get
    v = verdict(_link_down_dumps(skew2=-5.0, offset2=-5.0, host_of=hosts))
    assert v.cls == "comm_hang" and v.links == [(1, 2)], v.text()
    assert v.hosts == ["h1", "h2"]
    assert any("clocks: 4 hosts" in e for e in v.evidence), v.text()
    # The same dumps with the offset left out: the classifier is fooled,
    # which shows that it reads the offset.
    wrong = verdict(_link_down_dumps(skew2=5.0, offset2=0.0, host_of=hosts))
    assert wrong.cls == "noncomm_hang" and wrong.ranks == [2], wrong.text()


def _frozen_dumps(with_victim=True):
    """A 3-rank ring where rank 1 froze inside allreduce #3: rank 0's send
    to it is in its inbox, rank 2 waits for rank 1's next message."""
    out = [
        dump(0, 3, done_before(2) + [op(3, 3, "cadence: timed out", 0.01, 3.75, msgs=[
            msg(1, "send"), msg(2, "recv"), msg(1, "send"), msg(2, "recv", "pending")])]),
        dump(2, 3, done_before(2) + [op(3, 3, "cadence: aborted", 0.01, 3.76, msgs=[
            msg(0, "send"), msg(1, "recv"), msg(1, "recv", "pending")])]),
    ]
    if with_victim:
        # Resumed at 9 s: it took in the waiting data only then.
        out.insert(1, dump(1, 3, done_before(2) + [op(3, 3, "cadence: aborted", 0.01, 9.0, msgs=[
            msg(2, "send"), msg(0, "recv"), msg(2, "send", first=9.0, last=9.0),
            msg(0, "recv", first=9.0, last=9.0)])]))
    return out


def test_comm_hang_names_the_frozen_rank():
    v = verdict(_frozen_dumps())
    assert v.cls == "comm_hang" and v.ranks == [1], v.text()
    assert (0, 1) in v.links and (1, 2) in v.links, v.text()
    assert any("past its own deadline" in e for e in v.evidence)


def test_comm_hang_names_a_rank_that_left_no_dump_but_sent_data():
    v = verdict(_frozen_dumps(with_victim=False))
    assert v.cls == "comm_hang" and v.ranks == [1], v.text()
    assert any("wrote no dump; data from it in this operation arrived" in e for e in v.evidence)


def test_a_rank_that_only_forwards_what_it_waits_for_does_not_hide_the_culprit():
    """Rank 3 froze inside and left no dump (data from it had arrived). Rank
    1 waits on it, and so has not sent on to rank 0 what it forwards: link
    1->0 looks stalled too, but it only passes rank 1's wait on rank 3."""
    t = 3.7
    msgs = {0: [msg(1, "recv", "pending")],
            1: [msg(3, "recv", "pending", moved=1000, first=0.02, last=0.02),
                msg(0, "send", "pending")],
            2: [msg(3, "send", "pending"), msg(3, "recv", "pending")]}
    dumps = [dump(r, 4, done_before(2) + [op(3, 3, "cadence: timed out", 0.01, t, msgs=msgs[r])])
             for r in range(3)]
    v = verdict(dumps)
    assert v.cls == "comm_hang" and v.ranks == [3], v.text()
    assert (1, 0) in v.links and (3, 1) in v.links, v.text()


def test_missing_dump_with_no_data_from_it_is_a_rank_not_seen():
    dumps = [dump(r, 3, done_before(2) + [ring_fail(r)]) for r in (0, 1)]
    v = verdict(dumps)  # rank 2 left no dump, nothing arrived from it
    assert v.cls == "noncomm_hang" and v.ranks == [2], v.text()
    assert "no dump" in v.headline


def _on_hosts(dumps, hosts):
    """`dumps` placed on `hosts` (rank -> host)."""
    for d in dumps:
        d["host"] = hosts[d["rank"]]
        d["peers"] = [{"rank": r, "host": h, "pid": 1000 + r, "addr": f"10.0.0.{r}:4000"}
                      for r, h in enumerate(hosts)]
        d["clock"]["method"] = "ping-pong"
    return dumps


def _waiting(rank, peers_pending, t_fail=None):
    """Rank `rank` in allreduce #3: sent to everyone, waits on receives from
    `peers_pending` (nothing arrived)."""
    msgs = [msg(p, "recv", "pending") for p in peers_pending]
    status = "running" if t_fail is None else "cadence: timed out"
    return op(3, 3, status, 0.01, t_fail or 0.0, msgs=msgs)


SIX = ["h0", "h0", "h1", "h1", "h2", "h2"]


def test_a_host_none_of_whose_ranks_answered_is_unreachable():
    """Host h2's only link is cut: its ranks 4-5 send no summary, and
    nothing of theirs arrived in the operation the others wait in."""
    dumps = _on_hosts([dump(r, 6, done_before(2) + [_waiting(r, [4, 5], 3.7)])
                       for r in range(4)], SIX)
    v = verdict(dumps)
    assert v.cls == "comm_hang" and v.hosts == ["h2"] and v.ranks == [4, 5], v.text()
    assert "host h2 unreachable" in v.headline and "ranks 0-3 wait in it" in v.headline
    assert any("a rank stuck in its own code still answers" in e for e in v.evidence)


def test_only_the_store_host_answering_is_the_host_cut_off():
    """Host h0, which serves the Store, is cut: only its ranks answer the
    round; every rank of h1 and h2 is silent."""
    dumps = _on_hosts([dump(r, 6, done_before(2) + [_waiting(r, [2, 3, 4, 5], 3.7)])
                       for r in range(2)], SIX)
    v = verdict(dumps)
    assert v.cls == "comm_hang" and v.hosts == ["h0"] and v.ranks == [0, 1], v.text()
    assert "host h0 is cut off" in v.headline and "none of the 2 other hosts" in v.headline


def test_a_silent_host_a_probe_reaches_is_left_to_the_usual_rules():
    """The live coordinator reached h2's kernel: its processes are frozen
    or lost the Store, not its network; nothing of theirs arrived, so they
    are ranks never seen in the operation."""
    dumps = _on_hosts([dump(r, 6, done_before(2) + [_waiting(r, [4, 5], 3.7)])
                       for r in range(4)], SIX)
    v = verdict(dumps, reach={"h2": True})
    assert v.cls == "noncomm_hang" and v.ranks == [4, 5], v.text()
    assert any("reachable; their processes are stopped" in e for e in v.evidence), v.text()
    v = verdict(dumps, reach={"h2": False})
    assert v.cls == "comm_hang" and v.hosts == ["h2"], v.text()
    assert any("got no answer" in e for e in v.evidence), v.text()


def test_one_silent_rank_beside_a_host_mate_that_answered_is_not_a_host_fault():
    dumps = _on_hosts([dump(r, 6, done_before(2) + [_waiting(r, [5], 3.7)])
                       for r in range(5)], SIX)
    v = verdict(dumps)
    assert v.cls == "noncomm_hang" and v.ranks == [5], v.text()


def test_a_dump_written_at_the_soft_deadline_counts_its_operation_as_stuck():
    """The watchdog dumps as soon as an operation passes CADENCE_DIAG_AFTER
    (here 2 s, under the doctor's --hang-after of 10 s): its reason says so."""
    dumps = [dump(r, 3, done_before(2) + [_waiting(r, [2])], dumped=2.5) for r in (0, 1)]
    assert verdict(dumps).cls == "healthy"
    for d in dumps:
        d["reason"] = "stuck: allreduce #3 ran 2.5s (CADENCE_DIAG_AFTER=2)"
    v = verdict(dumps)
    assert v.cls == "noncomm_hang" and v.ranks == [2], v.text()


def test_mismatched_signatures_are_named():
    dumps = [dump(r, 3, done_before(2) + [op(3, 3, "cadence: mismatch", 0.01, 0.02,
                                             sig="00000000000000bb" if r == 1 else
                                             "00000000000000aa",
                                             coll="allgather" if r == 1 else "allreduce")])
             for r in range(3)]
    v = verdict(dumps)
    assert v.cls == "mismatch" and v.ranks == [1], v.text()
    assert "called allgather #3" in v.headline and "ranks 0,2 called allreduce #3" in v.headline


def test_point_to_point_traffic_is_not_a_collective():
    # Rank 1 waits on a receive from rank 0, which never posted the send;
    # every collective completed.
    recv = op(4, 1, "cadence: timed out", 0.01, 3.7, coll="recv", root=0,
              msgs=[msg(0, "recv", "pending")])
    v = verdict([dump(0, 2, done_before(3)), dump(1, 2, done_before(3) + [recv])])
    assert v.cls == "noncomm_hang" and v.ranks == [0], v.text()
    assert "never posted the matching send" in v.headline


def test_partial_data_and_several_communicators():
    """A healthy sub-communicator beside the world where rank 2 never
    arrived; one rank's messages were overwritten (no message records)."""
    world = [dump(r, 3, done_before(2) + [ring_fail(r)], comm="w") for r in (0, 1)]
    world.append(dump(2, 3, done_before(2), comm="w"))
    world[0]["ops"][-1]["messages"] = None
    world[0]["ops"][-1]["messages_state"] = "dropped"
    sub = [dump(r, 2, done_before(5), comm="s") for r in range(2)]
    v = verdict(world + sub)
    assert v.cls == "noncomm_hang" and v.ranks == [2] and v.comm == "w", v.text()


def test_running_operations_count_as_stuck_only_after_hang_after():
    def dumps():
        out = []
        for r in range(2):
            o = op(3, 3, "running", start=1.0, msgs=[msg(1 - r, "recv", "pending")],
                   state="live")
            out.append(dump(r, 2, done_before(2) + [o], dumped=1.5))
        return out
    assert verdict(dumps(), hang_after=10).cls == "healthy"
    v = verdict(dumps(), hang_after=0.2)
    assert v.cls == "comm_hang", v.text()


# --- bad input --------------------------------------------------------------


def _doctor(args, capsys):
    rc = cli(["doctor", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_doctor_cli_text_json_and_exit_status(tmp_path, capsys):
    for r in range(3):
        d = dump(r, 3, done_before(2) + ([ring_fail(r)] if r < 2 else []))
        (tmp_path / f"cadence-c1-rank{r}.json").write_text(json.dumps(d))
    rc, out, err = _doctor([str(tmp_path)], capsys)
    assert rc == 1 and err == ""
    assert out.startswith("cadence doctor: noncomm_hang in allreduce #3"), out
    rc, out, _ = _doctor([str(tmp_path), "--json"], capsys)
    j = json.loads(out)
    assert rc == 1 and j["class"] == "noncomm_hang" and j["ranks"] == [2]
    assert set(j) >= {"class", "op", "ranks", "links", "hosts", "evidence"}


def _bad_dirs(tmp_path):
    good = json.dumps(dump(0, 2, done_before(2)))
    cases = {}
    cases["missing"] = (str(tmp_path / "nope"), "no such directory")
    (tmp_path / "empty").mkdir()
    cases["empty"] = (str(tmp_path / "empty"), "empty directory")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("hello")
    cases["foreign"] = (str(foreign), "no cadence dumps")
    trunc = tmp_path / "truncated"
    trunc.mkdir()
    (trunc / "cadence-c1-rank0.json").write_text(good[: len(good) // 2])
    cases["truncated"] = (str(trunc), "not valid JSON (truncated?)")
    alien = tmp_path / "alien"
    alien.mkdir()
    (alien / "cadence-c1-rank0.json").write_text(json.dumps({"hello": 1}))
    cases["alien"] = (str(alien), "not a cadence dump")
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "cadence-c1-rank0.json").write_text(json.dumps({**json.loads(good), "version": 9}))
    cases["newer"] = (str(newer), "format version 9")
    odd = tmp_path / "odd-message"
    odd.mkdir()
    d = json.loads(good)
    d["ops"][0]["messages"] = [{"peer": 1, "dir": "recv", "state": "lost", "bytes": 8,
                                "moved": 8, "first_ns": 1, "last_ns": 2}]
    (odd / "cadence-c1-rank0.json").write_text(json.dumps(d))
    cases["odd message"] = (str(odd), "a message record is malformed (state 'lost')")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "cadence-c1-rank0.json").write_text(good)
    (jobs / "cadence-c9-rank0.json").write_text(
        json.dumps(dump(0, 2, done_before(2), comm="c9", job="job2")))
    cases["jobs"] = (str(jobs), "dumps of 2 different jobs: job job1 (cadence-c1-rank0.json); "
                                "job job2 (cadence-c9-rank0.json)")
    return cases


def test_doctor_refuses_bad_input_in_one_line(tmp_path, capsys):
    for name, (path, want) in _bad_dirs(tmp_path).items():
        rc, out, err = _doctor([path], capsys)
        assert rc == 2 and out == "", (name, out)
        assert err.startswith("cadence doctor: ") and err.count("\n") == 1, (name, err)
        assert want in err, (name, err)
        with pytest.raises(DumpError):
            load_dir(path)


def test_doctor_skips_a_bad_file_when_asked(tmp_path, capsys):
    for r in range(2):
        (tmp_path / f"cadence-c1-rank{r}.json").write_text(json.dumps(dump(r, 2, done_before(3))))
    (tmp_path / "cadence-c1-rank1.json").write_text('{"format": "cadence-dump", "vers')
    rc, _, err = _doctor([str(tmp_path)], capsys)
    assert rc == 2 and "rank1.json" in err and "--skip-bad" in err
    rc, out, _ = _doctor([str(tmp_path), "--skip-bad"], capsys)
    assert rc == 0 and "healthy" in out and "skipped:" in out, out


def test_doctor_command_never_shows_a_traceback(tmp_path):
    """The entry point as a user runs it, on a few of the inputs above."""
    cases = _bad_dirs(tmp_path)
    for name in ("missing", "truncated", "jobs"):
        path, want = cases[name]
        p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "doctor", path],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (name, p.stderr)
        assert p.stderr.count("\n") == 1 and want in p.stderr, (name, p.stderr)


# --- real ranks ---------------------------------------------------------------


def _numbering(comm, dump_dir):
    import cadence

    x = np.ones(64, dtype=np.float32)
    # Uneven point-to-point traffic: rank 0 sends 3 to rank 1, rank 2 sends
    # 1 to rank 0; rank 2 never talks to rank 1.
    if comm.rank == 0:
        for _ in range(3):
            comm.send(x, 1)
        comm.recv(np.empty(64, dtype=np.float32), 2)
    elif comm.rank == 1:
        for _ in range(3):
            comm.recv(np.empty(64, dtype=np.float32), 0)
    else:
        comm.send(x, 0)
    comm.allreduce(x)
    if comm.rank == 1:
        comm.send(x, 2)
    elif comm.rank == 2:
        comm.recv(np.empty(64, dtype=np.float32), 1)
    comm.allgather(x)
    # Sub-communicators belong to their parent's job (the first one's id).
    sub = comm.split(comm.rank % 2)
    jobs = (comm.job, sub.job, comm.id, sub.id)
    sub.close()
    # Then a collective the ranks disagree on: every error names it.
    try:
        comm.allreduce(np.ones(65 if comm.rank == 1 else 64, dtype=np.float32))
        err = None
    except cadence.CommError as e:
        err = str(e)
    return {"records": comm.dump_records(), "error": err, "jobs": jobs}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_collectives_have_one_number_on_every_rank(transport, tmp_path):
    res = run_ranks(_numbering, 3, transport=transport, args=(str(tmp_path),),
                    env={"CADENCE_DUMP_DIR": str(tmp_path)}, op_timeout=10.0, timeout=90)
    assert all(res[r][0] == "ok" for r in range(3)), res
    colls, sent, received = {}, {}, {}
    for r in range(3):
        recs = res[r][1]["records"]["ops"]
        colls[r] = [(o["collective"], o["seq"], o["sig"]) for o in recs
                    if o["collective"] not in ("send", "recv")]
        for o in recs:
            if o["collective"] == "send":
                sent.setdefault((r, o["root"]), []).append(o["seq"])
            elif o["collective"] == "recv":
                received.setdefault((o["root"], r), []).append(o["seq"])
        ids = [o["id"] for o in recs]
        assert ids == sorted(set(ids)), ids
    # Point-to-point messages are numbered per (source, destination) pair,
    # the same on both sides (over TCP, start-up's clock ping-pongs count too).
    assert sent == received, (sent, received)
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in sent.values()), sent
    assert len(sent[(0, 1)]) >= 3 and (2, 1) not in sent
    # The same collectives, with the same numbers and signatures, everywhere
    # (the last one's signature differs on rank 1: that is the mismatch).
    assert [c[:2] for c in colls[0]] == [c[:2] for c in colls[1]] == [c[:2] for c in colls[2]]
    assert colls[0][:-1] == colls[1][:-1] == colls[2][:-1], colls
    seq = colls[0][-1][1]
    assert colls[0][-1][0] == "allreduce" and colls[0][-1][2] == colls[2][-1][2]
    assert colls[1][-1][2] != colls[0][-1][2]
    for r in range(3):
        assert f"allreduce #{seq}" in res[r][1]["error"], res[r][1]["error"]
        [path] = glob.glob(str(tmp_path / f"cadence-*-rank{r}.json"))
        d = json.loads(open(path).read())
        last = d["ops"][-1]
        assert (last["collective"], last["seq"]) == ("allreduce", seq)
        assert d["reason"].startswith("failure: ") and f"allreduce #{seq}" in d["reason"]
        assert d["host"] and d["pid"] == d["peers"][r]["pid"] and d["job"]
    for r in range(3):
        job, sub_job, comm_id, sub_id = res[r][1]["jobs"]
        assert job == sub_job == comm_id != sub_id, res[r][1]["jobs"]
    # The doctor reads the dumps the failure wrote.
    v = diagnose(load_dir(str(tmp_path))[0])
    assert v.cls == "mismatch" and v.ranks == [1] and v.op.seq == seq, v.text()


def _never_or_late(comm, dump_dir, late, mode):
    import cadence

    x = np.ones(1000, dtype=np.float32)
    comm.allreduce(x)
    comm.barrier()
    if comm.rank == late:
        if mode == "never":
            comm.dump(dump_dir)  # what it did so far; then it is gone elsewhere
            time.sleep(OP_TIMEOUT + 1.5)
            return "slept"
        time.sleep(OP_TIMEOUT + 1.5)  # enters after the others gave up
    try:
        comm.allreduce(x)
        # The late rank may complete it (the others' blocks were already in
        # its inbox); its next call sees their abort, fails and dumps.
        comm.barrier()
    except cadence.CommError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("mode,transport", [("never", "tcp"), ("late", "shm")])
def test_doctor_names_the_rank_that_did_not_enter(mode, transport, tmp_path):
    late = 2
    res = run_ranks(_never_or_late, 3, transport=transport, args=(str(tmp_path), late, mode),
                    env={"CADENCE_DUMP_DIR": str(tmp_path)}, op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" for r in range(3)), res
    assert len(glob.glob(str(tmp_path / "cadence-*-rank*.json"))) == 3
    dumps, _ = load_dir(str(tmp_path))
    if transport == "tcp":
        # Emulated hosts on one machine read one clock: nothing measured.
        assert all(d.clock_method == "same machine" for d in dumps if d.rank > 0)
    v = diagnose(dumps)
    j = v.to_json()
    assert j["class"] == "noncomm_hang" and j["ranks"] == [late], v.text()
    assert j["op"]["collective"] == "allreduce", j
    late_dump = next(d for d in dumps if d.rank == late)
    assert f"rank {late} ({late_dump.host}, pid {late_dump.pid})" in j["verdict"]
    seq = j["op"]["seq"]
    assert any(f"last completed barrier #{seq - 1}" in e for e in j["evidence"]), v.text()


def _frozen(comm, dump_dir, victim):
    import cadence

    x = np.ones(1 << 16, dtype=np.float32)
    comm.allreduce(x)
    pids = {p["rank"]: p["pid"] for p in comm.dump_records()["peers"]}
    comm.barrier()
    t0 = time.monotonic()
    if comm.rank == 0:
        # The victim is inside the allreduce by now, waiting on this rank:
        # freeze it there, then join.
        time.sleep(0.5)
        os.kill(pids[victim], signal.SIGSTOP)
    try:
        comm.allreduce(x, algo="ring")
        out = "no error"
    except cadence.CommError as e:
        out = str(e)
    if comm.rank == 0:
        # Let it go well after everybody's deadline: it fails and dumps too.
        time.sleep(max(0.0, t0 + OP_TIMEOUT + 3.0 - time.monotonic()))
        os.kill(pids[victim], signal.SIGCONT)
    return out


def test_doctor_names_the_rank_frozen_inside_the_operation(tmp_path):
    victim = 2
    res = run_ranks(_frozen, 4, transport="shm", args=(str(tmp_path), victim),
                    env={"CADENCE_DUMP_DIR": str(tmp_path)}, op_timeout=OP_TIMEOUT, timeout=60)
    assert all(res[r][0] == "ok" and res[r][1] != "no error" for r in range(4)), res
    v = diagnose(load_dir(str(tmp_path))[0])
    assert v.cls == "comm_hang" and v.ranks == [victim], v.text()
    assert v.links and all(victim in link for link in v.links), v.text()
    assert v.op.collective == "allreduce" and v.op.count == 1 << 16
    # Without the victim's own dump (a process that never came back), the
    # others' records still point at it.
    alone = tmp_path / "survivors"
    alone.mkdir()
    for f in glob.glob(str(tmp_path / "cadence-*.json")):
        if not f.endswith(f"rank{victim}.json"):
            shutil.copy(f, alone)
    v = diagnose(load_dir(str(alone))[0])
    assert v.cls == "comm_hang" and v.ranks == [victim], v.text()


def _dump_while_waiting(comm, dump_dir):
    x = np.ones(4096, dtype=np.float32)
    comm.barrier()
    if comm.rank == 1:
        time.sleep(1.5)
        comm.allreduce(x)
        return None
    paths = []
    t = threading.Timer(0.8, lambda: paths.append(comm.dump(dump_dir)))
    t.start()
    comm.allreduce(x)  # waits on rank 1 meanwhile
    t.join()
    return json.loads(open(paths[0]).read())


def test_a_dump_during_a_wait_shows_the_pending_messages(tmp_path):
    res = run_ranks(_dump_while_waiting, 2, transport="shm", args=(str(tmp_path),),
                    op_timeout=10.0, timeout=60)
    assert res[0][0] == "ok" and res[1][0] == "ok", res
    d = res[0][1]
    last = d["ops"][-1]
    assert last["collective"] == "allreduce" and last["status"] == "running", last
    assert last["messages_state"] == "live", last
    pending = [m for m in last["messages"] if m["state"] == "pending"]
    assert any(m["dir"] == "recv" and m["peer"] == 1 and m["moved"] == 0 for m in pending), last
    assert d["dump_ns"] > last["start_ns"]
    # The links' counters are readable while the operation waits.
    assert [link["peer"] for link in d["links"]] == [1], d["links"]


def _three_hosts(msgs_of):
    """6 ranks, two per host (A: 0-1, B: 2-3, C: 4-5), all inside allreduce
    #3 for 8 s when dumped; `msgs_of(rank)` gives its messages."""
    hosts = ["A", "A", "B", "B", "C", "C"]
    out = []
    for r in range(6):
        o = op(3, 3, status="running", start=0.01, msgs=msgs_of(r), state="live")
        d = dump(r, 6, done_before(2) + [o], host="x", dumped=8.0, error_ns=20_000, timeout=60)
        d["host"] = hosts[r]
        d["peers"] = [{"rank": p, "host": hosts[p], "pid": 1000 + p} for p in range(6)]
        out.append(d)
    return out


def test_a_cut_host_network_is_named_as_the_host():
    # Host A's cable is cut: in the ring 0->1->...->5->0, the links into and
    # out of A between hosts (1->2, 5->0) stall; 3->4 (B->C) delivered.
    stalled = {(1, 2), (5, 0)}

    def msgs_of(r):
        nxt, prv = (r + 1) % 6, (r - 1) % 6
        send = msg(nxt, "send", first=0.5, last=1.0)
        if (prv, r) in stalled:
            return [send, msg(prv, "recv", "pending")]
        return [send, msg(prv, "recv", first=0.5, last=1.0)]

    v = verdict(_three_hosts(msgs_of), hang_after=5.0)
    assert v.cls == "comm_hang" and v.hosts == ["A"] and v.ranks == [], v.text()
    assert v.links == [(1, 2), (5, 0)], v.text()
    assert "network of host A" in v.headline, v.headline


def test_one_stalled_link_between_two_hosts_clears_the_host_that_still_receives():
    # Only 5->0 (C->A) stalled, at t=1.0; rank 4 on C received from rank 3
    # (on B) at t=2.0, after that: C's network works, so A is named.
    def msgs_of(r):
        if r == 0:
            return [msg(5, "recv", "pending")]
        if r == 5:
            return [msg(0, "send", first=0.5, last=1.0)]
        if r == 4:
            return [msg(3, "recv", first=1.5, last=2.0)]
        if r == 3:
            return [msg(4, "send", first=1.5, last=2.0)]
        return []

    v = verdict(_three_hosts(msgs_of), hang_after=5.0)
    assert v.cls == "comm_hang" and v.hosts == ["A"], v.text()
    assert any("host C received data from other hosts" in e for e in v.evidence), v.text()


def test_a_probe_tells_a_host_that_answers():
    """Accepted or refused, the host's kernel answered; a malformed address
    cannot be probed. (No answer at all needs a cut link: the emulated
    cluster's test, test_diagnosis_cut.py.)"""
    import socket

    from cadence.diagnosis.reach import probe, probe_hosts

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        open_port = s.getsockname()[1]
        assert probe(f"127.0.0.1:{open_port}") is True
    assert probe(f"127.0.0.1:{open_port}") is True  # closed now: refused
    assert probe("no-port") is None and probe("127.0.0.1:x") is None
    assert probe_hosts({"a": f"127.0.0.1:{open_port}", "b": "bad"}) == {"a": True, "b": None}


def test_the_classifier_names_simulated_hangs_on_a_hundred_ranks(capsys):
    """The records `cadence sim --records` leaves for 96 ranks on 12 hosts:
    a rank that never calls, a hung link between hosts, nothing (every
    verdict right, class and culprit; cadence.bench.hangs)."""
    from cadence.bench import hangs

    assert hangs.main(["--ranks", "96", "--trials", "3", "--size", "64K,1M"]) == 0, \
        capsys.readouterr().out
