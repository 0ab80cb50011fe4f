"""The soak: random collectives on the emulated cluster while its links fail.

A driver (this module, `cadence soak`) runs jobs of cadence.testbed.soak_rank
one after the other on an emulated cluster, and from outside the jobs
injects faults at random times:

- **cut**: a host's link goes down (`ip link set ... down` on its switch
  port) for a short while (1 s up to the operation timeout: TCP may ride it
  out) or a long one (past the timeout: the job must fail);
- **slow**: a host's link is throttled (its shaper) to a low rate for a while.

Only one fault is active at a time; links are cut only while a job is
running (not while its ranks start), and a new job starts only while no link
is cut. What is expected today (multipath and failover are future work):

- every result is right (`wrong` = 0);
- a cut either passes (the job rides it out, results right) or fails the job:
  every rank then ends within the timeout + margin with a CommError (the
  soak counts those that name a culprit rank, and whether that rank sits
  across the cut);
- a slowed link only makes operations slower;
- nothing hangs: a rank that neither reports progress nor ends within the
  timeout + margin is a hang (the job is then killed), as is a job whose ranks
  are not all up within the start-up limit;
- a job fails only when a cut explains it (a cut made while the job ran, and
  the job failed between the cut and its restore + timeout + margin);
  anything else (and any crash) is unexplained.

After a failed job a fresh one starts (with the next job number: the seed
and job number fix its operations). At the end a summary (JSON) says what
happened; `ok` is false, and the exit status 1, if any result was wrong,
anything hung or crashed, or a failure was unexplained.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from cadence.testbed import cluster as tb
from cadence.testbed import jobs, processes, soak_rank
from cadence.units import parse_rate

SLOW_RATES = ("20mbit", "50mbit", "200mbit")
CUT_SHARE = 0.6  # of the faults that come while a job runs
LAST_START = 15.0  # seconds before the end after which no new job starts
READERS_DRAIN_S = 5.0  # after a job's last exit, to read the rest of its output


@dataclass
class Config:
    duration: float = 300.0  # seconds of soak (jobs stop, then the summary)
    seed: int = 0
    hosts: int = 3
    ranks_per_host: int = 2
    nics: int = 1
    rate: str = "1gbit"
    cluster: str | None = None  # reuse this cluster (kept at the end) instead of a new one
    timeout: float = 10.0  # CADENCE_TIMEOUT of every job
    margin: float = 10.0  # beyond the timeout, before a silent rank counts as hung
    startup: float = 120.0  # seconds a job's ranks may take to be up
    fault_every: float = 20.0  # mean seconds between faults (0: no faults)
    # The first fault: a cut past the timeout, this many s into a running job.
    first_cut: float | None = None
    max_count: int = 1 << 18
    slow_rates: tuple[str, ...] = SLOW_RATES  # what a slowed link runs at
    out: Path = Path("soak-results")
    progress: float = 5.0  # seconds between progress lines
    master_port: int = 29600


@dataclass
class Fault:
    id: int
    kind: str  # "cut" or "slow"
    host: int
    nic: int
    start: float  # wall clock
    planned: float  # seconds it is meant to last
    rate: str | None = None
    end: float | None = None
    job: int | None = None  # the job running when it began
    outcome: str = ""  # cuts: "failed job <j>" or "ridden out"


@dataclass
class RankState:
    rank: int
    proc: subprocess.Popen
    last: float  # monotonic time of the last event (or start)
    ready: bool = False
    step: int = 0
    ops: int = 0
    checks: int = 0
    error: dict | None = None
    done: dict | None = None
    exit: int | None = None
    exit_at: float | None = None  # wall clock
    killed: bool = False


@dataclass
class JobRecord:
    id: int
    start: float
    end: float | None = None
    nranks: int = 0
    outcome: str = "running"  # ok, failed, hang, crash, interrupted
    explained_by: int | None = None  # fault id
    first_failure: float | None = None
    ops: int = 0
    checks: int = 0
    wrong: int = 0
    errors: list = field(default_factory=list)  # one per rank that reported one
    hung_ranks: list = field(default_factory=list)
    crashed_ranks: list = field(default_factory=list)
    note: str = ""


class RunningJob:
    """One running job: its ranks' processes and what they said."""

    def __init__(self, soak: Soak, jid: int):
        self.soak = soak
        self.record = JobRecord(jid, time.time())
        self.started = time.monotonic()
        self.ranks: dict[int, RankState] = {}
        self.failed_at: float | None = None  # monotonic: first error or bad exit
        self.running_at: float | None = None  # monotonic: every rank ready
        self.log = open(soak.cfg.out / f"job-{jid:04d}.log", "w")  # noqa: SIM115
        self.log_lock = threading.Lock()
        self.readers: list[threading.Thread] = []
        cfg = soak.cfg
        env = dict(os.environ, CADENCE_TIMEOUT=f"{cfg.timeout:g}")
        cmd = [sys.executable, "-m", "cadence.testbed.soak_rank", "--seed", str(cfg.seed),
               "--job", str(jid), "--stop-at", f"{soak.stop_at:.3f}",
               "--max-count", str(cfg.max_count)]  # fmt: skip
        self.cmd = cmd
        port = cfg.master_port + jid % 200  # a fresh store port: no TIME_WAIT leftovers
        places = jobs.placements(soak.cluster, cfg.ranks_per_host)
        self.store = self._serve_store(places[0], port, env)
        self.started = time.monotonic()  # the start-up limit is the ranks'
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        for place in places:
            proc = subprocess.Popen(
                jobs.in_host(place.host, cmd),
                env=jobs.rank_env(soak.cluster, place, cfg.ranks_per_host, port, env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            self.ranks[place.rank] = RankState(place.rank, proc, time.monotonic())
            self.read_rank(place.rank, proc)
        self.record.nranks = len(self.ranks)

    def _serve_store(self, place, port: int, env: dict) -> subprocess.Popen:
        """The job's store on host 0, in a process of its own (as torchrun's
        agent serves it): a failing rank 0 does not take it along. Waits
        (up to the start-up limit) until it listens."""
        cfg = self.soak.cfg
        cmd = [sys.executable, "-m", "cadence.testbed.soak_rank", "--seed", str(cfg.seed),
               "--serve-store"]  # fmt: skip
        proc = subprocess.Popen(
            jobs.in_host(place.host, cmd),
            env=jobs.rank_env(self.soak.cluster, place, cfg.ranks_per_host, port, env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        up = threading.Event()

        def read():
            with proc.stdout:
                for raw in iter(proc.stdout.readline, b""):
                    line = raw.decode(errors="replace").rstrip("\n")
                    with self.log_lock:
                        self.log.write(f"[store] {line}\n")
                    if line.startswith('{"ev": "store"'):
                        up.set()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        self.readers.append(t)
        if not up.wait(cfg.startup):
            with self.log_lock:
                self.log.write(f"[driver] the store is not up after {cfg.startup:g} s\n")
        return proc

    def read_rank(self, rank: int, proc: subprocess.Popen) -> None:
        """Reads a rank's stdout (its events) and stderr (cadence's own
        lines) on two threads, into the job's log. Two pipes, because lines
        that two threads of a rank write to one pipe can interleave: a
        progress thread's error line split the event that reported it, and
        the driver took the rank for crashed (stop 33's CI run)."""
        for stream, events in ((proc.stdout, True), (proc.stderr, False)):
            t = threading.Thread(target=self._read, args=(rank, stream, events), daemon=True)
            t.start()
            self.readers.append(t)

    def _read(self, rank: int, stream, events: bool) -> None:
        tag = f"[rank{rank}]" if events else f"[rank{rank} stderr]"
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                with self.log_lock:
                    self.log.write(f"{tag} {line}\n")
                at = line.find('{"ev"') if events else -1
                if at < 0:
                    continue
                try:
                    self.soak.events.put((self.record.id, rank, json.loads(line[at:])))
                except ValueError:
                    with self.log_lock:
                        self.log.write(f"[driver] rank {rank}: an event line that does not "
                                       f"parse: {line[:300]!r}\n")  # fmt: skip

    @property
    def running(self) -> bool:
        return self.running_at is not None and self.failed_at is None

    def on_event(self, rank: int, ev: dict) -> None:
        st = self.ranks[rank]
        st.last = time.monotonic()
        kind = ev.get("ev")
        if kind == "ready":
            st.ready = True
            if self.running_at is None and all(s.ready for s in self.ranks.values()):
                self.running_at = time.monotonic()
        elif kind == "progress":
            st.step, st.ops, st.checks = ev["step"], ev["ops"], ev["checks"]
        elif kind == "done":
            st.done = ev
            st.step, st.ops, st.checks = ev["steps"], ev["ops"], ev["checks"]
        elif kind == "wrong":
            self.record.wrong += 1
            self.soak.wrong.append({
                "job": self.record.id, "rank": rank, **ev,
                "replay_args": f"--seed {self.soak.cfg.seed} --job {self.record.id} "
                               f"--max-steps {int(ev.get('step') or 0) + 1}",
            })  # fmt: skip
            self.soak.say(f"WRONG RESULT job {self.record.id} rank {rank} step {ev['step']}: "
                          f"{ev['detail']}")  # fmt: skip
        elif kind == "error":
            st.error = ev
            self._failed(ev.get("t", time.time()))

    def _failed(self, wall: float) -> None:
        if self.failed_at is None:
            self.failed_at = time.monotonic()
            self.record.first_failure = wall

    def poll(self) -> bool:
        """Checks exits and deadlines; True when the job is over."""
        cfg = self.soak.cfg
        now = time.monotonic()
        for st in self.ranks.values():
            if st.exit is None and st.proc.poll() is not None:
                st.exit = st.proc.returncode
                st.exit_at = time.time()
                if st.exit != 0:
                    self._failed(st.exit_at)
        live = [st for st in self.ranks.values() if st.exit is None]
        if not live:
            self._finish()
            return True
        limit = cfg.timeout + cfg.margin
        hung = []
        if self.failed_at is not None:
            # After a failure every rank must end by itself, within the timeout.
            if now - self.failed_at > limit:
                hung = live
                why = f"not ended {limit:g} s after the job's first failure"
        elif self.running_at is None:
            if now - self.started > cfg.startup:
                hung = [st for st in live if not st.ready]
                why = f"not up {cfg.startup:g} s after the job started"
        else:
            # (A rank that said "done" but does not exit counts too: its
            # communicator's close() would be what hangs.)
            hung = [st for st in live if now - st.last > limit]
            why = f"no progress (or no exit after 'done') for {limit:g} s"
            done = [st for st in self.ranks.values() if st.done is not None]
            if done and not hung:
                # Ranks that finished wait for nobody: the rest must follow soon.
                first_done = min(st.last for st in done)
                hung = [st for st in live if st.done is None and now - first_done > limit]
                why = f"not done {limit:g} s after rank {done[0].rank}"
        if hung:
            self.record.hung_ranks = [
                {"rank": st.rank, "step": st.step, "ready": st.ready, "why": why}
                for st in hung
            ]  # fmt: skip
            self.soak.say(f"HANG job {self.record.id}: ranks {[st.rank for st in hung]} {why}")
            for st in hung:
                st.killed = True
            self.kill()
            return self.poll()
        return False

    def kill(self) -> None:
        processes.terminate([st.proc for st in self.ranks.values()] + [self.store])
        for st in self.ranks.values():
            if st.exit is None:
                st.proc.wait()
                st.exit = st.proc.returncode
                st.exit_at = time.time()
                st.killed = True

    def _finish(self) -> None:
        processes.terminate([self.store])
        # Every process has exited: its pipes end once read to the last line.
        until = time.monotonic() + READERS_DRAIN_S
        for t in self.readers:
            t.join(timeout=max(0.0, until - time.monotonic()))
        if any(t.is_alive() for t in self.readers):
            with self.log_lock:
                self.log.write(f"[driver] output still unread {READERS_DRAIN_S:g} s after "
                               "the last exit; later events are lost\n")  # fmt: skip
        self.soak.drain()  # the last events of this job
        rec = self.record
        rec.end = time.time()
        # Operations every member completed and checked: ops of the rank that did fewest
        # is a lower bound; rank-level checks add up.
        rec.ops = sum(st.ops for st in self.ranks.values())
        rec.checks = sum(st.checks for st in self.ranks.values())
        for st in self.ranks.values():
            if st.error is not None:
                e = st.error
                rec.errors.append({
                    "rank": st.rank, "kind": e.get("kind"), "culprit": e.get("culprit"),
                    "op": e.get("op"), "step": e.get("step"), "t": e.get("t"),
                    "msg": (e.get("msg") or "")[:500],
                })  # fmt: skip
            elif st.exit not in (0, None) and not st.killed:
                exit_ = processes.describe_exit(st.exit)
                if st.exit == soak_rank.EXIT_COMM_ERROR:
                    exit_ += " (a CommError) without its error event"
                rec.crashed_ranks.append({"rank": st.rank, "exit": exit_})
            elif st.exit == 0 and st.done is None:
                rec.crashed_ranks.append({"rank": st.rank, "exit": "exited 0 without 'done'"})
        if rec.hung_ranks:
            rec.outcome = "hang"
        elif rec.crashed_ranks:
            rec.outcome = "crash"
        elif rec.first_failure is not None:
            rec.outcome = "failed"
        else:
            rec.outcome = "ok"
        with self.log_lock:
            self.log.close()


class Soak:
    def __init__(self, cfg: Config, out: TextIO | None = None):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.rng = random.Random(cfg.seed)
        self.events: queue.Queue = queue.Queue()
        self.cluster: tb.Cluster | None = None
        self.owns_cluster = False
        self.job: RunningJob | None = None
        self.records: list[JobRecord] = []
        self.faults: list[Fault] = []
        self.active: Fault | None = None
        self.wrong: list[dict] = []
        self.t0 = time.monotonic()
        self.stop_at = time.time() + cfg.duration
        self.next_fault = self._gap() if cfg.first_cut is None else None
        self.interrupted = False

    def say(self, text: str) -> None:
        print(f"soak [{time.monotonic() - self.t0:6.0f}s] {text}", file=self.out, flush=True)

    def _gap(self) -> float | None:
        if self.cfg.fault_every <= 0:
            return None
        return time.monotonic() + self.rng.expovariate(1 / self.cfg.fault_every)

    # ------------------------------------------------------------ set-up

    def setup(self) -> None:
        cfg = self.cfg
        for rate in cfg.slow_rates:
            try:
                parse_rate(rate)
            except ValueError as e:
                raise tb.TestbedError(f"--slow-rates: {e}") from None
        if not cfg.slow_rates:
            raise tb.TestbedError("--slow-rates: give at least one rate")
        cfg.out.mkdir(parents=True, exist_ok=True)
        if cfg.cluster:
            self.cluster = tb.require(cfg.cluster)
            tb.up(self.cluster)  # every link up, at its rate
        else:
            name = f"soak{os.getpid() % 100000}"
            self.cluster = tb.build(name, cfg.hosts, cfg.nics, cfg.rate)
            self.owns_cluster = True
            tb.up(self.cluster)
        c = self.cluster
        self.say(f"seed {cfg.seed}; cluster {c.name}: {len(c.hosts)} hosts x "
                 f"{cfg.ranks_per_host} ranks, {c.nics} NIC(s) at {c.rate}; "
                 f"CADENCE_TIMEOUT={cfg.timeout:g}; {cfg.duration:g} s; "
                 f"logs in {cfg.out}")  # fmt: skip

    def cleanup(self) -> None:
        if self.job is not None:
            self.job.kill()
            self.job._finish()
            if self.job.record.outcome == "ok":
                self.job.record.outcome = "interrupted"
            self.records.append(self.job.record)
            self.job = None
        if self.active is not None:
            with contextlib.suppress(Exception):
                self._restore()
        if self.cluster is not None and self.owns_cluster:
            with contextlib.suppress(Exception):
                tb.down(self.cluster.name)

    # ------------------------------------------------------------ faults

    def _inject(self, kind: str, long: bool | None = None) -> None:
        c = self.cluster
        host = self.rng.randrange(len(c.hosts))
        nic = self.rng.randrange(c.nics)
        t = self.cfg.timeout
        if kind == "cut":
            # Short (TCP may ride it out) or past the timeout (the job must fail).
            if long is None:
                long = self.rng.random() < 0.5
            planned = self.rng.uniform(t + 1, t + 5) if long else self.rng.uniform(1.0, t)
            rate = None
        else:
            planned = self.rng.uniform(5.0, 20.0)
            rate = self.rng.choice(self.cfg.slow_rates)
        f = Fault(len(self.faults), kind, host, nic, time.time(), round(planned, 2), rate,
                  job=self.job.record.id if self.job else None)  # fmt: skip
        if kind == "cut":
            tb.set_link(c, host, nic, up=False)
        else:
            tb.set_link(c, host, nic, rate=rate)
        self.faults.append(f)
        self.active = f
        self.fault_until = time.monotonic() + planned
        what = f"cut {planned:.1f} s" if kind == "cut" else f"slowed to {rate} for {planned:.1f} s"
        self.say(f"fault {f.id}: host {host} nic {nic} {what}")

    def _restore(self) -> None:
        f = self.active
        c = self.cluster
        if f.kind == "cut":
            tb.set_link(c, f.host, f.nic, up=True)
        else:
            tb.set_link(c, f.host, f.nic, rate=c.rate)
        f.end = time.time()
        self.active = None
        self.say(f"fault {f.id}: host {f.host} nic {f.nic} restored")

    def _faults_tick(self, stopping: bool) -> None:
        now = time.monotonic()
        if self.active is not None:
            if now >= self.fault_until:
                self._restore()
                self.next_fault = self._gap()
            return
        if stopping:
            return
        job = self.job
        if self.next_fault is None and self.cfg.first_cut is not None and not self.faults:
            if job is not None and job.running and now - job.running_at >= self.cfg.first_cut:
                self._inject("cut", long=True)
            return
        if self.next_fault is None or now < self.next_fault:
            return
        # Links are cut only under a running job (a cut during start-up would
        # fail the store's rendezvous, which is not cadence's to report).
        if job is not None and job.running and self.rng.random() < CUT_SHARE:
            self._inject("cut")
        else:
            self._inject("slow")

    def _cut_windows(self) -> list[tuple[float, float, Fault]]:
        slack = self.cfg.timeout + self.cfg.margin
        return [(f.start, (f.end or time.time()) + slack, f) for f in self.faults
                if f.kind == "cut"]  # fmt: skip

    # ------------------------------------------------------------ the loop

    def drain(self) -> None:
        while True:
            try:
                jid, rank, ev = self.events.get_nowait()
            except queue.Empty:
                return
            if self.job is not None and self.job.record.id == jid:
                self.job.on_event(rank, ev)

    def _job_over(self) -> None:
        rec = self.job.record
        self.job = None
        if rec.outcome == "failed":
            for start, end, f in self._cut_windows():
                if f.job == rec.id and start <= rec.first_failure <= end:
                    rec.explained_by = f.id
                    f.outcome = f"failed job {rec.id}"
                    break
        if rec.outcome == "failed" and rec.explained_by is None:
            during = [f for f in self.faults if f.start <= rec.first_failure
                      and (f.end is None or rec.first_failure <= f.end)]  # fmt: skip
            rec.note = "not under a cut" + "".join(
                f"; during {f.kind} fault {f.id} (host {f.host}{', ' + f.rate if f.rate else ''})"
                for f in during
            )
        for f in self.faults:  # cuts under this job that it rode out
            if f.kind == "cut" and f.job == rec.id and not f.outcome:
                f.outcome = "ridden out" if rec.explained_by != f.id else f.outcome
        self.records.append(rec)
        culprits = sum(1 for e in rec.errors if e["culprit"] is not None)
        detail = ""
        if rec.outcome != "ok":
            detail = (f"; {len(rec.errors)} rank errors, {culprits} naming a culprit, "
                      f"explained by {'fault ' + str(rec.explained_by) if rec.explained_by is not None else 'nothing'}")  # noqa: E501  # fmt: skip
        self.say(f"job {rec.id}: {rec.outcome}, {rec.checks} checks, {rec.wrong} wrong{detail}")

    def run(self) -> dict:
        self.setup()
        end = self.t0 + self.cfg.duration
        next_progress = time.monotonic() + self.cfg.progress
        jid = 0
        try:
            while True:
                now = time.monotonic()
                stopping = now >= end
                self.drain()
                if self.job is not None and self.job.poll():
                    self._job_over()
                cut = self.active is not None and self.active.kind == "cut"
                if self.job is None and not cut:
                    # A job started in the last seconds would only start and stop.
                    if stopping or (jid > 0 and end - now < LAST_START):
                        break
                    self.job = RunningJob(self, jid)
                    jid += 1
                self._faults_tick(stopping)
                if now >= next_progress:
                    next_progress = now + self.cfg.progress
                    self.say(self.progress_line())
                time.sleep(0.1)
        except KeyboardInterrupt:
            self.interrupted = True
            self.say("interrupted: cleaning up")
        finally:
            self.cleanup()
        summary = self.summary()
        (self.cfg.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary

    # ------------------------------------------------------------ reporting

    def _totals(self) -> dict:
        recs = list(self.records) + ([self.job.record] if self.job else [])
        live = self.job
        checks = sum(r.checks for r in self.records)
        if live is not None:
            checks += sum(st.checks for st in live.ranks.values())
        return {
            "checks": checks,
            "wrong": len(self.wrong),
            "jobs": len(recs),
            "failed": sum(1 for r in self.records if r.outcome == "failed"),
            "hangs": sum(1 for r in self.records if r.outcome == "hang"),
            "crashes": sum(1 for r in self.records if r.outcome == "crash"),
            "unexplained": sum(1 for r in self.records if r.outcome == "failed"
                               and r.explained_by is None),  # fmt: skip
        }

    def progress_line(self) -> str:
        t = self._totals()
        cuts = sum(1 for f in self.faults if f.kind == "cut")
        slows = len(self.faults) - cuts
        job = self.job
        state = "none"
        if job is not None:
            step = max((st.step for st in job.ranks.values()), default=0)
            phase = "failing" if job.failed_at else ("running" if job.running_at else "starting")
            state = f"{job.record.id} {phase} step {step}"
        active = ""
        if self.active is not None:
            f = self.active
            left = max(0.0, self.fault_until - time.monotonic())
            active = f" (now: {f.kind} host {f.host}, {left:.0f} s left)"
        return (f"job {state} | {t['checks']} checks, {t['wrong']} wrong | faults {cuts} cuts, "
                f"{slows} slows{active} | jobs {t['jobs']}, failed {t['failed']} "
                f"(unexplained {t['unexplained']}), hangs {t['hangs']}, "
                f"crashes {t['crashes']}")  # fmt: skip

    def summary(self) -> dict:
        t = self._totals()
        recs = self.records
        errors = [e for r in recs for e in r.errors]
        cut_hosts = {f.id: f.host for f in self.faults}
        rph = self.cfg.ranks_per_host

        def across(rec, e):
            if rec.explained_by is None or e["culprit"] is None:
                return False
            host = cut_hosts[rec.explained_by]
            mine = e["rank"] // rph == host
            theirs = e["culprit"] // rph == host
            return mine != theirs

        failed = [r for r in recs if r.outcome == "failed"]
        named = [r for r in failed if len(r.errors) == r.nranks
                 and all(e["culprit"] is not None for e in r.errors)]  # fmt: skip
        latency = [e["t"] - self.faults[r.explained_by].start for r in failed
                   if r.explained_by is not None for e in r.errors if e.get("t")]  # fmt: skip
        cuts = [f for f in self.faults if f.kind == "cut"]
        s = {
            "ok": (t["wrong"] == 0 and t["hangs"] == 0 and t["crashes"] == 0
                   and t["unexplained"] == 0 and not self.interrupted),  # fmt: skip
            "seed": self.cfg.seed,
            "duration_s": self.cfg.duration,
            "elapsed_s": round(time.monotonic() - self.t0, 1),
            "interrupted": self.interrupted,
            "cluster": {
                "name": self.cluster.name if self.cluster else None,
                "hosts": len(self.cluster.hosts) if self.cluster else self.cfg.hosts,
                "ranks_per_host": rph, "nics": self.cfg.nics, "rate": self.cfg.rate,
            },  # fmt: skip
            "timeout_s": self.cfg.timeout,
            "margin_s": self.cfg.margin,
            "checks_ok": t["checks"] - t["wrong"],
            "wrong_results": t["wrong"],
            "hangs": t["hangs"],
            "crashes": t["crashes"],
            "unexplained_failures": t["unexplained"],
            "jobs": {
                "total": len(recs),
                "ok": sum(1 for r in recs if r.outcome == "ok"),
                "failed": len(failed),
                "failed_every_rank_naming_a_culprit": len(named),
                "failed_otherwise": len(failed) - len(named),
            },
            "rank_errors": {
                "total": len(errors),
                "comm_error_with_culprit": sum(1 for e in errors if e["kind"] == "CommError"
                                               and e["culprit"] is not None),  # fmt: skip
                "comm_error_without_culprit": sum(1 for e in errors if e["kind"] == "CommError"
                                                  and e["culprit"] is None),  # fmt: skip
                "other_exception": sum(1 for e in errors if e["kind"] != "CommError"),
                "culprit_across_the_cut": sum(1 for r in failed for e in r.errors
                                              if across(r, e)),  # fmt: skip
                "seconds_from_cut_to_error_max": round(max(latency), 2) if latency else None,
            },
            "faults": {
                "cuts": len(cuts),
                "cuts_failing_a_job": sum(1 for f in cuts if f.outcome.startswith("failed")),
                "cuts_ridden_out": sum(1 for f in cuts if f.outcome == "ridden out"),
                "slows": sum(1 for f in self.faults if f.kind == "slow"),
            },
            "fault_log": [asdict(f) for f in self.faults],
            "job_log": [self._job_json(r) for r in recs],
            "wrong": self.wrong[:50],
            "unexplained": [
                {"job": r.id, "note": r.note, "errors": r.errors[:3]}
                for r in recs if r.outcome == "failed" and r.explained_by is None
            ],  # fmt: skip
            "hung": [{"job": r.id, "ranks": r.hung_ranks} for r in recs if r.hung_ranks],
            "crashed": [{"job": r.id, "ranks": r.crashed_ranks} for r in recs if r.crashed_ranks],
            "replay": self.replay_hint(),
        }
        return s

    def _job_json(self, r: JobRecord) -> dict:
        d = asdict(r)
        if r.outcome == "ok":
            d.pop("errors")
        return d

    def replay_hint(self) -> str:
        """How to rerun one job's operations by hand (no faults)."""
        name = self.cluster.name if self.cluster else "NAME"
        return (f"cadence cluster up --name {name} --hosts {self.cfg.hosts} && "
                f"cadence cluster run --name {name} --ranks-per-host {self.cfg.ranks_per_host} "
                f"-- env CADENCE_TIMEOUT={self.cfg.timeout:g} {sys.executable} -m "
                f"cadence.testbed.soak_rank --seed {self.cfg.seed} --job JOB "
                "--max-steps STEPS")  # fmt: skip


def run(cfg: Config, out: TextIO | None = None) -> dict:
    return Soak(cfg, out).run()
