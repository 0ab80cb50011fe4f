"""The soak's smoke run (`cadence soak`, docs/soak.md): about a minute of
random collectives on a 3-host x 2-rank emulated cluster, with a link cut
past the timeout under the first job and random faults after it. Needs root
and iproute2 (CI is root); skips with the reason otherwise.

The unit tests below it run anywhere: the ranks' random sequence is the same
on every rank, and the references agree with a direct computation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cadence import reference as ref
from cadence import testbed
from cadence.testbed import soak_rank

PYTHON_DIR = Path(__file__).resolve().parents[1] / "python"
SMOKE_SECONDS = 60
OP_TIMEOUT = 5


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return testbed.ROOT_MESSAGE
    missing = [t for t in ("ip", "tc", "unshare", "hostname") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install iproute2 util-linux)"
    probe = f"cad-sprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return f"network namespaces are not permitted here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    return None


@pytest.fixture(scope="module")
def why_not():
    return _why_not()


def test_soak_smoke_with_a_cut(tmp_path, why_not):
    if why_not:
        pytest.skip(why_not)
    cmd = [sys.executable, "-m", "cadence.cli.main", "soak", "--duration", str(SMOKE_SECONDS),
           "--seed", "1", "--hosts", "3", "--ranks-per-host", "2", "--timeout", str(OP_TIMEOUT),
           "--first-cut", "3", "--fault-every", "15", "--progress", "10",
           # Not slower: a communicator's start-up calibration streams 8 MiB
           # under the timeout, which a slower link can exceed (docs/soak.md).
           "--slow-rates", "100mbit,200mbit",
           "--out", str(tmp_path)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SMOKE_SECONDS + 100)
    elapsed = time.monotonic() - t0
    out = f"{p.stdout[-4000:]}\n{p.stderr[-3000:]}"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert p.returncode == 0, out
    assert summary["ok"], out
    assert summary["wrong_results"] == 0 and summary["hangs"] == 0, out
    assert summary["crashes"] == 0 and summary["unexplained_failures"] == 0, out
    assert summary["checks_ok"] > 100, out
    # The first cut outlasts the timeout: the job fails, every rank names a
    # culprit, within the timeout (and slack), and a fresh job follows.
    assert summary["faults"]["cuts"] >= 1, out
    assert summary["faults"]["cuts_failing_a_job"] >= 1, out
    assert summary["jobs"]["failed_every_rank_naming_a_culprit"] >= 1, out
    assert summary["jobs"]["total"] >= 2, out
    assert summary["rank_errors"]["seconds_from_cut_to_error_max"] < OP_TIMEOUT * 2 + 10, out
    assert elapsed < SMOKE_SECONDS + 60, out
    # Nothing left behind: no namespaces of the soak's cluster, no state file.
    name = summary["cluster"]["name"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"cad-{name}-" not in left
    assert name not in testbed.names()


# ------------------------------------------------------------------ anywhere


def test_every_rank_draws_the_same_operations():
    """What a step draws depends on (seed, job, step) only, not on the rank."""
    groups = [soak_rank.Group("world", list(range(6))), soak_rank.Group("s1.0", [4, 1, 2])]

    def draw(step):
        rng = np.random.default_rng([7, 3, step + 1])
        return [soak_rank.draw_spec(rng, groups, (7, 3, step, i), 1 << 12).describe()
                for i in range(4)]  # fmt: skip

    first = [draw(s) for s in range(50)]
    assert first == [draw(s) for s in range(50)]
    kinds = {d.split()[0] for ds in first for d in ds}
    assert {"allreduce", "sendrecv", "alltoallv"} <= kinds


def test_draw_count_has_zero_odd_and_large_sizes():
    rng = np.random.default_rng(1)
    counts = [soak_rank.draw_count(rng, 1 << 18) for _ in range(2000)]
    assert 0 in counts and any(c % 2 for c in counts) and max(counts) > 1 << 16
    assert max(counts) <= 1 << 18


def test_references_match_a_direct_computation():
    ins = [np.arange(6) + 10 * q for q in range(3)]
    assert list(ref.allgather(ins)) == [*range(6), *range(10, 16), *range(20, 26)]
    m = [[1, 2, 3], [0, 3, 3], [2, 2, 2]]
    assert list(ref.alltoall(ins, m, 1)) == [1, 2, 10, 11, 12, 22, 23]
    assert list(ref.reduce_scatter(ins, [2, 2, 2], 2, "int64", "sum")) == [42, 45]
    assert list(ref.scatter(np.arange(6), [1, 0, 5], 2)) == [1, 2, 3, 4, 5]
    counts = ref.split_counts(4, 17, (1, 2))
    assert sum(counts) == 17 and len(counts) == 4


def _fake_job(tmp_path, scripts, **cfg):
    """A soak RunningJob over local processes (no cluster): what poll() makes of them."""
    import threading

    from cadence.testbed import soak

    s = soak.Soak(soak.Config(out=tmp_path, **cfg), out=open(os.devnull, "w"))  # noqa: SIM115
    job = object.__new__(soak.RunningJob)
    job.soak, job.record = s, soak.JobRecord(0, time.time())
    job.started, job.failed_at, job.running_at = time.monotonic(), None, None
    job.log, job.log_lock, job.readers = open(tmp_path / "log", "w"), threading.Lock(), []  # noqa: SIM115
    job.ranks = {
        r: soak.RankState(r, subprocess.Popen(["sh", "-c", sc], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True),
                          time.monotonic(), ready=True)
        for r, sc in enumerate(scripts)
    }  # fmt: skip
    for r, st in job.ranks.items():
        job.read_rank(r, st.proc)
    job.running_at = time.monotonic()
    job.record.nranks = len(scripts)
    job.store = subprocess.Popen(["true"])
    s.job = job
    return s, job


def _poll_until_over(job, limit=20.0):
    end = time.monotonic() + limit
    while not job.poll():
        assert time.monotonic() < end, "the job never ended"
        time.sleep(0.05)
    return job.record


def test_a_silent_rank_is_a_hang_and_is_killed(tmp_path):
    _, job = _fake_job(tmp_path, ["sleep 30", "sleep 30"], timeout=0.3, margin=0.3)
    t0 = time.monotonic()
    rec = _poll_until_over(job)
    assert rec.outcome == "hang" and len(rec.hung_ranks) == 2
    assert time.monotonic() - t0 < 10
    assert all(st.proc.poll() is not None for st in job.ranks.values())


def test_a_rank_that_does_not_exit_after_done_is_a_hang(tmp_path):
    _, job = _fake_job(tmp_path, ["exit 0", "sleep 30"], timeout=0.3, margin=0.3)
    for r in (0, 1):
        job.on_event(r, {"ev": "done", "steps": 1, "ops": 1, "checks": 1})
    rec = _poll_until_over(job)
    assert rec.outcome == "hang" and [h["rank"] for h in rec.hung_ranks] == [1]


def test_a_rank_that_outlives_a_failure_is_a_hang(tmp_path):
    _, job = _fake_job(tmp_path, ["exit 3", "sleep 30"], timeout=0.3, margin=0.3)
    job.on_event(0, {"ev": "error", "kind": "CommError", "culprit": 1, "t": time.time()})
    rec = _poll_until_over(job)
    assert rec.outcome == "hang" and [h["rank"] for h in rec.hung_ranks] == [1]


def test_a_rank_dying_without_an_error_is_a_crash(tmp_path):
    _, job = _fake_job(tmp_path, ["kill -SEGV $$", "exit 3"], timeout=5, margin=5)
    job.on_event(1, {"ev": "error", "kind": "CommError", "culprit": 0, "t": time.time()})
    rec = _poll_until_over(job)
    assert rec.outcome == "crash" and rec.crashed_ranks[0]["rank"] == 0
    assert "SIGSEGV" in rec.crashed_ranks[0]["exit"]


def test_an_error_event_survives_a_line_written_around_it(tmp_path):
    # A progress thread's line goes to stderr in pieces while the main thread
    # prints the event that reports the failure: the event still arrives.
    def rank(r):
        ev = json.dumps({"ev": "error", "kind": "CommError", "culprit": 1 - r, "t": time.time()})
        return (f"printf 'cadence comm c rank {r}: timed out' >&2; echo '{ev}'; "
                f"printf ' [culprit: rank {1 - r}]\\n' >&2; exit 3")  # fmt: skip

    _, job = _fake_job(tmp_path, [rank(0), rank(1)], timeout=5, margin=5)
    rec = _poll_until_over(job)
    assert rec.outcome == "failed", (rec.crashed_ranks, (tmp_path / "log").read_text())
    assert sorted((e["rank"], e["culprit"]) for e in rec.errors) == [(0, 1), (1, 0)]


def test_a_failure_is_explained_only_under_a_cut(tmp_path):
    from cadence.testbed import soak

    for kind, explained in (("cut", True), ("slow", False)):
        s, job = _fake_job(tmp_path, ["exit 3", "exit 3"], timeout=5, margin=5)
        now = time.time()
        s.faults = [soak.Fault(0, kind, 1, 0, now - 2, 5.0, end=now - 1, job=0)]
        for r in (0, 1):
            job.on_event(r, {"ev": "error", "kind": "CommError", "culprit": 1 - r, "t": now})
        _poll_until_over(job)
        s._job_over()
        summary = s.summary()
        assert summary["unexplained_failures"] == (0 if explained else 1), summary
        assert summary["ok"] == explained
        assert summary["jobs"]["failed_every_rank_naming_a_culprit"] == 1


class _OneRankComm:
    """A communicator of one rank in numpy; `broken` adds 1 to each result."""

    def __init__(self, broken):
        self.broken = broken

    def algorithms(self, kind):
        return ["ring"]

    def allreduce(self, x, out=None, op="sum", factor=None, algo=None, async_op=False):
        dst = x if out is None else out
        dst[...] = np.asarray(x) * (factor or 1) + (1 if self.broken else 0)
        return dst

    def allgather(self, x, algo=None, async_op=False):
        return np.asarray(x).reshape(1, -1) + (1 if self.broken else 0)


@pytest.mark.parametrize("broken", [False, True])
def test_a_wrong_result_is_caught(broken):
    comm = _OneRankComm(broken)
    group = soak_rank.Group("world", [0], comm)
    for kind in ("allreduce", "allgather"):
        spec = soak_rank.Spec(kind, group, 17, "int32", "sum", 0.0, 0, (1, 2, 3))
        handle, check = soak_rank._issue(spec, 0, False)
        fails = []
        check(handle, fails)
        assert bool(fails) == broken, fails
