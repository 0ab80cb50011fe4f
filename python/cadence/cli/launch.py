"""Launching the ranks of one backend for `cadence bench`, with a deadline.

cadence and gloo ranks get torchrun's environment (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); mpi ranks are started by
mpirun. Every rank runs `python -m cadence.bench.worker` and appends its results
to <workdir>/rank<R>.jsonl; `collect` merges them. A rank that fails or a launch
that outlives its deadline is killed (its whole process group) and reported.
cadence's ranks time all of `Workload.algos` in one launch (`--algos`), which comes
back as one Outcome per algorithm.

On an emulated cluster (`Workload.cluster`) the ranks run inside the hosts'
namespaces instead, placed and configured by cadence.testbed.jobs.
"""

from __future__ import annotations

import importlib.util
import json
import operator
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cadence.bench.common import p99
from cadence.testbed import Cluster, processes
from cadence.testbed import jobs as cluster_jobs
from cadence.units import format_size

# Where the `cadence` package lives, so the workers run this very code.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
BACKEND_NAMES = ("cadence", "gloo", "mpi")


@dataclass
class Measure:
    """One size on one backend, merged over the ranks."""

    size: int  # requested bytes
    nbytes: int  # bytes of the full buffer actually used
    count: int
    # The median sample: with `--timing rank` the max over ranks of each
    # rank's median; with `--timing span` the median of the samples timed
    # from the first rank's start to the last rank's end.
    time_us: float
    wrong: int  # summed over ranks
    chosen: str | None = None  # cadence: the algorithm the timed calls ran (rank 0's word)
    # The 99th percentile in the same timing: the max over ranks of each
    # rank's, or the spans' (None: the records did not say, e.g. written by an
    # older worker).
    p99_us: float | None = None
    # With `--rounds`: each round's time_us, in round order (time_us and
    # p99_us are then the medians over the rounds).
    round_times: list[float] = field(default_factory=list)
    # The median in both timings, whichever the table shows (None: not
    # measured, e.g. a simulated or tuned figure), so that one run compares them.
    rank_time_us: float | None = None
    span_time_us: float | None = None


@dataclass
class Outcome:
    """One backend's results; cadence has one per algorithm asked for."""

    backend: str
    measures: dict[int, Measure] = field(default_factory=dict)
    error: str | None = None  # the backend failed: shown in its row, exit status 1
    na: str | None = None  # not applicable or not installed: shown, not a failure
    log_tail: str = ""
    seconds: float = 0.0
    algo: str | None = None  # cadence: the algorithm ("auto": its own choice); None for peers
    label: str = ""  # the column group: "cadence:ring"; empty means the backend's name
    # cadence: per rank, its TCP links' per-path traffic over the run
    links: dict[int, list[dict]] = field(default_factory=dict)
    # cadence: per rank, its engine's wait counters over the run
    waits: dict[int, dict] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.backend


def median_or_none(figures: list[float | None]) -> float | None:
    """The median, or None where a round did not give the figure."""
    return None if None in figures else statistics.median(figures)


def merge_rounds(rounds: list[list[Outcome]]) -> list[Outcome]:
    """One outcome per (backend, algorithm) from the same sweep run several
    times (`cadence bench --rounds`), in the first round's order: per size,
    the median over the rounds of the round's time and of its p99, each
    round's time kept (`round_times`), wrong elements summed; a failure or
    n/a in any round is the outcome's. A size counts only where every round
    measured it, so each figure is a median of the same number of rounds."""
    merged = []
    for first in rounds[0]:
        same = [
            o for r in rounds for o in r
            if (o.backend, o.algo) == (first.backend, first.algo)
        ]  # fmt: skip
        out = Outcome(
            first.backend,
            error=next((o.error for o in same if o.error), None),
            na=next((o.na for o in same if o.na), None),
            log_tail=next((o.log_tail for o in same if o.error), first.log_tail),
            seconds=sum(o.seconds for o in same),
            algo=first.algo,
            label=first.label,
            links=same[-1].links,
        )
        for o in same:
            for rank, w in o.waits.items():
                total = out.waits.setdefault(rank, {})
                for k, v in w.items():
                    # Counters add up over the rounds; the longest idle stretch is the longest.
                    merge = max if k == "longest_idle_us" else operator.add
                    total[k] = merge(total.get(k, 0), v)
        for size, m in first.measures.items():
            ms = [o.measures.get(size) for o in same]
            if len(ms) < len(rounds) or any(x is None for x in ms):
                continue
            out.measures[size] = Measure(
                size=size,
                nbytes=m.nbytes,
                count=m.count,
                time_us=statistics.median(x.time_us for x in ms),
                wrong=sum(x.wrong for x in ms),
                chosen=m.chosen,
                p99_us=median_or_none([x.p99_us for x in ms]),
                round_times=[x.time_us for x in ms],
                rank_time_us=median_or_none([x.rank_time_us for x in ms]),
                span_time_us=median_or_none([x.span_time_us for x in ms]),
            )
        merged.append(out)
    return merged


@dataclass
class Workload:
    """What every rank of every backend is asked to run."""

    op: str
    dtype: str
    sizes: list[int]
    nranks: int
    iters: int
    warmup: int
    timeout: float
    # cadence's algorithms, each timed as its own column group ("auto": the
    # library's choice); None: its default choice alone, shown as plain "cadence".
    algos: list[str] | None = None
    mpirun_args: list[str] = field(default_factory=list)
    cluster: Cluster | None = None  # run across its hosts, ranks_per_host each
    ranks_per_host: int = 1
    # Set in every rank's environment (`cadence tune`: an empty CADENCE_TUNING_FILE).
    env: dict[str, str] = field(default_factory=dict)
    # Where every buffer starts past a page boundary (None: the allocator's choice).
    offset: int | None = None
    # How a sample is timed: "rank" (each rank from its own barrier exit, the
    # slowest rank's median) or "span" (first rank's start to last rank's end).
    timing: str = "rank"


def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run on this machine, or None."""
    if backend == "gloo" and not _has_module("torch"):
        return "torch is not installed"
    if backend == "mpi":
        if shutil.which("mpirun") is None:
            return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
        if not _has_module("mpi4py"):
            return "mpi4py is not installed"
    return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(job: Workload, backend: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{PACKAGE_ROOT}{os.pathsep}{path}" if path else str(PACKAGE_ROOT)
    # The worker passes algo= per call; a CADENCE_ALGO from the caller's shell
    # would silently change what "auto" means.
    env.pop("CADENCE_ALGO", None)
    env.update(job.env)
    return env


def cadence_algos(job: Workload) -> list[str]:
    """The algorithms cadence's ranks time, in order."""
    return list(job.algos) if job.algos else ["auto"]


def cadence_label(job: Workload, algo: str) -> str:
    return f"cadence:{algo}" if job.algos else "cadence"


def units(job: Workload, backend: str) -> int:
    """Records one rank writes for the whole sweep (for the progress bar)."""
    return len(job.sizes) * (len(cadence_algos(job)) if backend == "cadence" else 1)


def worker_command(job: Workload, backend: str, outdir: Path) -> list[str]:
    return [
        sys.executable, "-m", "cadence.bench.worker",
        "--backend", backend,
        "--op", job.op,
        "--dtype", job.dtype,
        "--sizes", ",".join(map(str, job.sizes)),
        "--iters", str(job.iters),
        "--warmup", str(job.warmup),
        "--out", str(outdir),
        "--timeout", str(job.timeout),
        *(["--algos", ",".join(cadence_algos(job))] if backend == "cadence" else []),
        *(["--offset", str(job.offset)] if job.offset is not None else []),
    ]  # fmt: skip


def spawn(
    job: Workload, backend: str, outdir: Path, cmd: list[str] | None = None
) -> list[subprocess.Popen]:
    """Start the ranks; each in its own session so that a kill reaches its children.
    They run the bench worker, or `cmd` (a program of one rank, as the worker)."""
    cmd = cmd or worker_command(job, backend, outdir)
    env = worker_env(job, backend)
    if job.cluster is not None:
        return spawn_on_cluster(job, job.cluster, backend, outdir, cmd, env)
    if backend == "mpi":
        mpirun = [
            "mpirun", "--allow-run-as-root", "--oversubscribe",
            # unbound, as the torch-launched ranks are: same scheduling for every backend
            "--bind-to", "none",
            "-np", str(job.nranks),
            "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH",
            *job.mpirun_args,
        ]  # fmt: skip
        return [_popen(mpirun + cmd, env, outdir / "mpirun.log")]
    port = free_port()
    procs = []
    for rank in range(job.nranks):
        rank_env = dict(
            env,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(job.nranks),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(job.nranks),
            GROUP_RANK="0",
        )
        procs.append(_popen(cmd, rank_env, outdir / f"rank{rank}.log"))
    return procs


def spawn_on_cluster(
    job: Workload, cluster: Cluster, backend: str, outdir: Path, cmd: list[str], env: dict[str, str]
) -> list[subprocess.Popen]:
    """The ranks of `job` inside the cluster's hosts, `job.ranks_per_host` each."""
    rph = job.ranks_per_host
    if backend == "mpi":
        mpirun = cluster_jobs.mpirun_command(cluster, rph, outdir, [
            "--bind-to", "none", "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", *job.mpirun_args,
        ])  # fmt: skip
        return [_popen(mpirun + cmd, env, outdir / "mpirun.log")]
    # Any port is free on host 0: its namespace is the cluster's own. A fresh
    # one per backend all the same, so that no store waits out TIME_WAIT.
    port = free_port()
    return [
        _popen(
            cluster_jobs.in_host(place.host, cmd),
            cluster_jobs.rank_env(cluster, place, rph, port, env),
            outdir / f"rank{place.rank}.log",
        )
        for place in cluster_jobs.placements(cluster, rph)
    ]


def _popen(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as f:
        return subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a kill
    return records


def units_done(outdir: Path) -> int:
    """Records rank 0 has written: one per size (and algorithm, for cadence)."""
    return sum(1 for r in read_records(outdir / "rank0.jsonl") if "size" in r)


_EXC_RE = re.compile(r"^\s*([\w.]+(Error|Exception|Interrupt|Exit)\b.*)$")


def error_line(log: str) -> str:
    """The most telling line of a failed rank's output: its exception, if any."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _EXC_RE.match(line):
            return line
    meaningful = [ln for ln in lines if not set(ln) <= set("-=*")]
    return meaningful[-1] if meaningful else ""


def supervise(
    procs: list[subprocess.Popen],
    timeout: float,
    poll: Callable[[], None],
) -> tuple[str | None, int | None]:
    """Wait for the ranks: (None, None) if all succeeded, else (why, which proc
    failed or None). Kills everything on the first failure or at the deadline."""
    result = processes.supervise(dict(enumerate(procs)), timeout, grace=0.0, poll=poll)
    if result.first is not None:
        return processes.describe_exit(result.exits[result.first]), result.first
    if result.status != 0:
        return f"timed out after {timeout:g} s", None
    return None, None


def collect(job: Workload, outdir: Path, outcome: Outcome) -> None:
    """Merge the ranks' records of `outcome.algo` into `outcome` (sizes every
    rank finished)."""
    per_rank = [read_records(outdir / f"rank{r}.jsonl") for r in range(job.nranks)]
    for records in per_rank:
        for rec in records:
            if "na" in rec:
                outcome.na = rec["na"]
            if "links" in rec:
                outcome.links[rec.get("rank", 0)] = rec["links"]
            if "waits" in rec:
                outcome.waits[rec.get("rank", 0)] = rec["waits"]
            if rec.get("nranks", job.nranks) != job.nranks and outcome.error is None:
                outcome.error = f"worker saw {rec['nranks']} ranks, not {job.nranks}"
    for size in job.sizes:
        recs = sorted(
            (rec for records in per_rank for rec in records
             if rec.get("size") == size and rec.get("algo") == outcome.algo
             and "time_us" in rec),
            key=lambda rec: rec.get("rank", 0),
        )  # fmt: skip
        if len(recs) != job.nranks:
            continue
        rank_us = max(r["time_us"] for r in recs)
        spans = span_samples(recs)
        span_us = statistics.median(spans) * 1e6
        if job.timing == "span":
            time_us, p99_us = span_us, p99(spans) * 1e6
        else:
            time_us = rank_us
            p99_us = max((r["p99_us"] for r in recs if "p99_us" in r), default=None)
        outcome.measures[size] = Measure(
            size=size,
            nbytes=recs[0]["bytes"],
            count=recs[0]["count"],
            time_us=time_us,
            wrong=sum(r["wrong"] for r in recs),
            chosen=recs[0].get("chosen"),
            p99_us=p99_us,
            rank_time_us=rank_us,
            span_time_us=span_us,
        )


def span_samples(recs: list[dict]) -> list[float]:
    """Each sample's seconds per call from the first rank's start to the last
    rank's end. Every rank runs the same samples in the same order, so the
    k-th start of every rank belongs to the same sample; the ranks' clocks are
    one (time.perf_counter is the host's monotonic clock, and every rank
    `cadence bench` launches runs on this host, network namespaces included)."""
    batch = recs[0]["batch"]
    return [
        (max(ends) - min(starts)) / batch
        for starts, ends in zip(
            zip(*(r["starts"] for r in recs), strict=True),
            zip(*(r["ends"] for r in recs), strict=True),
            strict=True,
        )
    ]


def run_backend(
    job: Workload, backend: str, workdir: Path, on_progress: Callable[[int], None]
) -> list[Outcome]:
    """Run `job` on every rank of `backend`; never raises for a failing backend.
    One Outcome, or for cadence one per algorithm of the job (all from one
    launch: a failure or n/a is every algorithm's)."""
    if backend == "cadence":
        outcomes = [Outcome(backend, algo=a, label=cadence_label(job, a))
                    for a in cadence_algos(job)]  # fmt: skip
    else:
        outcomes = [Outcome(backend)]
    reason = unavailable(backend)
    if reason:
        for o in outcomes:
            o.na = reason
        return outcomes
    outdir = workdir / backend
    outdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    procs = spawn(job, backend, outdir)
    try:
        why, which = supervise(procs, job.timeout, lambda: on_progress(units_done(outdir)))
    finally:
        processes.terminate(procs)  # no-op unless interrupted
    seconds = time.monotonic() - start
    for o in outcomes:
        o.seconds = seconds
        collect(job, outdir, o)
    on_progress(units_done(outdir))
    if why is not None:
        first = outcomes[0]
        describe_failure(job, backend, outdir, outcomes, why, which)
        for o in outcomes[1:]:
            o.error, o.log_tail = first.error, first.log_tail
    return outcomes


def run_program(job: Workload, cmd: list[str], outdir: Path) -> str | None:
    """Run `cmd`, a program of one rank, on every rank of `job` as cadence's
    ranks run (environment, placement, deadline `job.timeout`); None when every
    rank exited 0, else one line saying who failed and why."""
    outdir.mkdir(parents=True, exist_ok=True)
    procs = spawn(job, "cadence", outdir, cmd)
    try:
        why, which = supervise(procs, job.timeout, lambda: None)
    finally:
        processes.terminate(procs)
    if why is None:
        return None
    logs = [outdir / f"rank{which}.log"] if which is not None else sorted(outdir.glob("*.log"))
    texts = [p.read_text(errors="replace") for p in logs]
    detail = next((line for line in map(error_line, texts) if line), "")
    who = f"rank {which} " if which is not None else ""
    return f"{who}{why}" + (f": {detail}" if detail else "")


def describe_failure(
    job: Workload, backend: str, outdir: Path, outcomes: list[Outcome], why: str, which: int | None
) -> None:
    """Fill the first outcome's error (one line: who, what, where, the
    exception) and log_tail."""
    outcome = outcomes[0]
    logs = sorted(outdir.glob("*.log"))
    if which is not None and backend != "mpi":
        logs = [outdir / f"rank{which}.log"]
    texts = [p.read_text(errors="replace") for p in logs]
    detail = next((line for line in map(error_line, texts) if line), "")
    who = "mpirun" if backend == "mpi" else (f"rank {which}" if which is not None else "")
    stuck = [s for s in job.sizes if any(s not in o.measures for o in outcomes)]
    where = f" at size {format_size(stuck[0])}" if stuck and which is None else ""
    outcome.error = " ".join(x for x in (who, why + where) if x) + (f": {detail}" if detail else "")
    outcome.log_tail = "\n".join(t.rstrip()[-2000:] for t in texts if t.strip())
