"""The diagnosis campaign: on an emulated cluster,
inject one fault per trial with the culprit drawn at random while a loop of
mixed collectives runs, and score the live verdict: right class, right
culprit, in time. Prints a confusion matrix (rows: what was injected,
columns: the verdict).

    python -m cadence.testbed.diag_campaign --trials 20 --out diag-results

Needs root (network namespaces). With `--nics 2` (the default) the cluster
gets two rails: jobs carry data on rail 0 (`eth0`) and reach the job's Store
on rail 1, as a management network would be separate from the data network —
so cutting a host's data link does not also cut it off from the Store. With
`--nics 1` every host has one link, and rank 0 serves the Store on it, as
`cadence cluster run` and most clusters have it: cutting a host's link cuts
it off from the Store too (and cutting host 0's cuts everyone else off from
the Store). Every rank computes `--compute` s (a sleep) between collectives.
Faults:

- `link_down`: host H's rail-0 link is cut (`set_link up=False`), H drawn
  from every host (the Store's included). Right: comm_hang naming host H, or
  only links of H's ranks, or ranks on H. The trial also waits until every
  rank has written its dump into the trial's `dumps/` (CADENCE_DUMP_DIR),
  and runs `cadence doctor` on them, and for the first verdict of a round
  (the first verdict is often a rank's own, saying it lost the Store):
  `dumps`, `doctor` and `round_ok` in the results.
- `freeze`: rank R SIGSTOPs itself inside a collective. Right: comm_hang
  naming rank R.
- `hold`: rank R stays out of the next collective (a sleep in "compute").
  Right: noncomm_hang naming rank R.
- `slow_link`: host H's rail-0 link is slowed (`--slow-rate`) before the
  job starts (a shaper changed under load drops its queue, and TCP's back-off
  then stalls the link for seconds: a hang, not a slow link). Right:
  comm_slow naming host H (or only links of H's ranks), within 60 s of the
  job being ready.
- `straggle`: rank R computes `--delay` s more before every collective;
  `straggle<MS>` (`straggle20`, `straggle60`, ...): MS milliseconds more.
  Right: noncomm_slow naming rank R.
- `none`: nothing, for `--clean-duration` seconds. Right: no verdict.

A hang must be named within 30 s of the fault, a slowness within 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cadence.diagnosis.verdict import VerdictClass
from cadence.testbed import cluster as tb
from cadence.testbed import jobs

HANG_LIMIT_S = 30.0
SLOW_LIMIT_S = 60.0
EXPECTED = {"link_down": VerdictClass.COMM_HANG, "freeze": VerdictClass.COMM_HANG,
            "hold": VerdictClass.NONCOMM_HANG, "slow_link": VerdictClass.COMM_SLOW,
            "straggle": VerdictClass.NONCOMM_SLOW, "none": VerdictClass.HEALTHY}


@dataclass
class Trial:
    n: int
    fault: str
    culprit_host: int | None = None
    culprit_rank: int | None = None
    fault_t: float | None = None
    verdict: dict | None = None
    verdict_t: float | None = None
    cls: str = "none"
    right_class: bool = False
    right_culprit: bool = False
    in_time: bool = False
    note: str = ""
    ranks_host: dict = field(default_factory=dict)
    #: A cut: ranks whose dump was in CADENCE_DUMP_DIR, and when the last
    #: appeared (s after the fault).
    dumps: int | None = None
    dumps_t: float | None = None
    #: A cut: `cadence doctor` on those dumps (class, right culprit).
    doctor: str | None = None
    doctor_ok: bool | None = None
    #: A cut: the first verdict of a round (the coordinator's, over the
    #: summaries that arrived), when the first verdict was a rank's own.
    round_verdict: str | None = None
    round_ok: bool | None = None

    @property
    def ok(self) -> bool:
        if self.fault == "none":
            return self.cls in ("none", VerdictClass.HEALTHY)
        return self.right_class and self.right_culprit and self.in_time


def kind(fault: str) -> str:
    """The fault's kind: `straggle60` is a `straggle`."""
    return "straggle" if fault.startswith("straggle") else fault


def delay_of(fault: str, default: float) -> float:
    """A straggler's extra seconds per collective (`straggle<MS>`, else the
    default)."""
    ms = fault.removeprefix("straggle")
    return int(ms) / 1000 if fault.startswith("straggle") and ms.isdigit() else default


def _read_events(out: Path, nranks: int) -> dict[int, list[dict]]:
    evs = {}
    for r in range(nranks):
        p = out / f"rank{r}.jsonl"
        evs[r] = []
        if p.exists():
            for line in p.read_text().splitlines():
                try:
                    evs[r].append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a kill
    return evs


def _first_verdict(evs: dict[int, list[dict]], rounds_only: bool = False
                   ) -> tuple[dict | None, float | None]:
    """The first verdict any rank delivered (`rounds_only`: of a round,
    not a rank's own verdict without the Store)."""
    found = [(e["t"], e["verdict"]) for es in evs.values() for e in es
             if e.get("ev") == "verdict" and e["verdict"].get("class") != VerdictClass.HEALTHY
             and not (rounds_only and e["verdict"].get("local"))]
    if not found:
        return None, None
    t, v = min(found, key=lambda x: x[0])
    return v, t


def _score(t: Trial, nranks_per_host: int) -> None:
    v = t.verdict
    t.cls = v["class"] if v else "none"
    t.right_class = t.cls == EXPECTED[kind(t.fault)]
    if v is None or t.fault == "none":
        t.right_culprit = t.fault == "none"
        t.in_time = True
        return
    t.right_culprit = _right_culprit(t, v, nranks_per_host)
    if t.fault in ("link_down", "slow_link"):
        limit = HANG_LIMIT_S if t.fault == "link_down" else SLOW_LIMIT_S
    else:
        limit = HANG_LIMIT_S if t.fault in ("freeze", "hold") else SLOW_LIMIT_S
    t.in_time = t.fault_t is not None and t.verdict_t is not None and \
        t.verdict_t - t.fault_t <= limit


def _right_culprit(t: Trial, v: dict, nranks_per_host: int) -> bool:
    host_of = t.ranks_host
    ranks, links, hosts = v.get("ranks") or [], v.get("links") or [], v.get("hosts") or []
    if t.fault in ("link_down", "slow_link"):
        hname = next((n for r, n in host_of.items() if r // nranks_per_host == t.culprit_host),
                     str(t.culprit_host))
        on_h = {r for r, n in host_of.items() if n == hname}
        if ranks:
            return set(ranks) <= on_h
        if links:
            return all(a in on_h or b in on_h for a, b in links)
        return hosts == [hname]
    return ranks == [t.culprit_rank]


def _wait_dumps(out: Path, world: int, since: float, until: float) -> tuple[int, float | None]:
    """Waits until every rank's dump is in `out` (or `until`): (how many,
    seconds after `since` the last appeared)."""
    while True:
        n = len(list(out.glob("cadence-*-rank*.json")))
        if n >= world:
            return n, time.time() - since
        if time.time() > until:
            return n, None
        time.sleep(0.5)


def _wait_round(t: Trial, out: Path, world: int, nranks_per_host: int) -> None:
    """A cut: waits (until HANG_LIMIT_S after the fault) for the first
    verdict of a round, and scores it as the first verdict is scored."""
    while True:
        v, vt = _first_verdict(_read_events(out, world), rounds_only=True)
        if v is not None or time.time() > t.fault_t + HANG_LIMIT_S:
            break
        time.sleep(0.5)
    if v is not None:
        t.round_verdict = v.get("verdict")
        t.round_ok = (v["class"] == EXPECTED[kind(t.fault)] and vt - t.fault_t <= HANG_LIMIT_S
                      and _right_culprit(t, v, nranks_per_host))


def _doctor(t: Trial, dumps: Path, nranks_per_host: int) -> None:
    """`cadence doctor` on a trial's dumps: its class, and whether it names
    the culprit."""
    from cadence.diagnosis import diagnose, load_dir
    from cadence.diagnosis.dumps import DumpError

    try:
        v = diagnose(load_dir(dumps)[0]).to_json()
    except (DumpError, OSError) as e:
        t.doctor, t.doctor_ok = f"error: {e}", False
        return
    t.doctor = v["verdict"]
    t.doctor_ok = v["class"] == EXPECTED[kind(t.fault)] and _right_culprit(t, v, nranks_per_host)


def run_trial(c: tb.Cluster, args, n: int, fault: str, rng: random.Random) -> Trial:
    nhosts, rph = len(c.hosts), args.ranks_per_host
    world = nhosts * rph
    t = Trial(n, fault)
    if fault in ("link_down", "slow_link"):
        t.culprit_host = rng.randrange(nhosts)
    elif fault != "none":
        t.culprit_rank = rng.randrange(world)
    out = Path(args.out) / f"trial-{n:03d}-{fault}"
    out.mkdir(parents=True, exist_ok=True)
    port = args.master_port + n % 200
    dumps = out / "dumps"
    env = dict(os.environ, CADENCE_DIAG_AFTER=f"{args.diag_after:g}",
               CADENCE_TIMEOUT=f"{args.timeout:g}", CADENCE_CALIBRATE="0",
               CADENCE_DUMP_DIR=str(dumps))  # fmt: skip
    places = jobs.placements(c, rph)
    for p in places:
        t.ranks_host[p.rank] = p.host.name
    procs = []
    # Two rails: the Store apart, on rail 1 (a management network). One:
    # rank 0 serves it on the only link, as `cadence cluster run` does.
    separate_store = len(c.hosts[0].nics) > 1
    store_addr = c.hosts[0].nics[1].address if separate_store else c.master_addr
    if separate_store:
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        store_env = jobs.rank_env(c, places[0], rph, port, env)
        store_env["MASTER_ADDR"] = store_addr
        procs.append(subprocess.Popen(
            jobs.in_host(places[0].host, [sys.executable, "-m", "cadence.testbed.soak_rank",
                                          "--seed", "1", "--serve-store"]),
            env=store_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True))  # fmt: skip
    if fault == "slow_link":
        # Slowed before the job starts: changing a shaper under load drops the
        # queued packets, and TCP's retransmission back-off then stalls the
        # link for seconds (a hang, not a slow link).
        tb.set_link(c, t.culprit_host, 0, rate=args.slow_rate)
    time.sleep(1.0)
    duration = args.clean_duration if fault == "none" else args.warmup + (
        HANG_LIMIT_S if fault in ("link_down", "freeze", "hold") else SLOW_LIMIT_S) + 5
    rank_fault = {"freeze": "freeze", "hold": "hold", "straggle": "straggle"}.get(kind(fault),
                                                                                "none")
    cmd = [sys.executable, "-m", "cadence.testbed.diag_rank", "--out", str(out),
           "--seed", str(n), "--fault", rank_fault,
           "--culprit", str(t.culprit_rank if t.culprit_rank is not None else -1),
           "--at", str(args.at_step), "--delay", f"{delay_of(fault, args.delay):g}",
           "--compute", f"{args.compute:g}"]  # fmt: skip
    logs = []
    for p in places:
        e = jobs.rank_env(c, p, rph, port, env)
        e["MASTER_ADDR"] = store_addr
        # Data on rail 0 only: rail 1 stands for a management network (the
        # Store's), not a second data NIC.
        e["CADENCE_SOCKET_IFNAME"] = jobs.socket_ifname(c)
        log = open(out / f"rank{p.rank}.log", "w")  # noqa: SIM115
        logs.append(log)
        procs.append(subprocess.Popen(jobs.in_host(p.host, cmd), env=e, stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
    try:
        start_deadline = time.time() + 60
        while time.time() < start_deadline:
            evs = _read_events(out, world)
            if all(any(e.get("ev") == "ready" for e in evs[r]) for r in range(world)):
                break
            time.sleep(0.2)
        else:
            t.note = "the job did not start"
            return t
        ready_at = time.time()
        if fault == "slow_link":
            t.fault_t = ready_at  # slow from the start
        if fault == "link_down":
            time.sleep(args.warmup)
            t.fault_t = time.time()
            tb.set_link(c, t.culprit_host, 0, up=False)
        end = ready_at + duration
        while time.time() < end:
            evs = _read_events(out, world)
            if t.fault_t is None and t.culprit_rank is not None:
                fe = [e for e in evs[t.culprit_rank] if e.get("ev") == "fault"]
                if fe:
                    t.fault_t = fe[0]["t"]
            v, vt = _first_verdict(evs)
            if v is not None:
                t.verdict, t.verdict_t = v, vt
                break
            if all(any(e.get("ev") in ("done", "error") for e in evs[r]) for r in range(world)):
                break
            time.sleep(0.5)
        if fault == "link_down" and t.fault_t is not None:
            t.dumps, t.dumps_t = _wait_dumps(dumps, world, t.fault_t,
                                             t.fault_t + args.timeout + 15)
            _wait_round(t, out, world, rph)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
        if fault == "link_down":
            tb.set_link(c, t.culprit_host, 0, up=True)
        elif fault == "slow_link":
            tb.set_link(c, t.culprit_host, 0, rate=c.rate)
    _score(t, rph)
    if fault == "link_down" and t.dumps:
        _doctor(t, dumps, rph)
    return t


def matrix(trials: list[Trial]) -> str:
    cols = [VerdictClass.COMM_HANG, VerdictClass.NONCOMM_HANG, VerdictClass.COMM_SLOW,
            VerdictClass.NONCOMM_SLOW, VerdictClass.MISMATCH, "none"]
    rows = list(dict.fromkeys(t.fault for t in trials))
    head = "| injected \\ verdict | " + " | ".join(cols) + " | right class + culprit + in time |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for f in rows:
        ts = [t for t in trials if t.fault == f]
        counts = [sum(1 for t in ts if (t.cls if t.cls != VerdictClass.HEALTHY else "none") == c)
                  for c in cols]
        good = sum(t.ok for t in ts)
        lines.append(f"| {f} ({EXPECTED[kind(f)]}) | " + " | ".join(map(str, counts)) +
                     f" | {good}/{len(ts)} |")
    cuts = [t for t in trials if t.fault == "link_down"]
    if cuts:
        whole = sum(t.dumps == len(t.ranks_host) for t in cuts)
        took = [t.dumps_t for t in cuts if t.dumps_t is not None]
        lines.append("")
        lines.append(f"link_down: every rank's dump written in {whole}/{len(cuts)} trials"
                     + (f" (the last {min(took):.1f}-{max(took):.1f}s after the cut)"
                        if took else ""))
        lines.append(f"link_down: cadence doctor on those dumps right in "
                     f"{sum(bool(t.doctor_ok) for t in cuts)}/{len(cuts)}")
        lines.append(f"link_down: the first round's verdict (over the summaries that arrived) "
                     f"right and in time in {sum(bool(t.round_ok) for t in cuts)}/{len(cuts)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the diagnosis campaign on an emulated cluster")
    p.add_argument("--name", default="diagc", help="cluster name (created and removed)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--nics", type=int, default=2, choices=(1, 2),
                   help="2: data on rail 0, the Store apart on rail 1; 1: one link per host, "
                        "the Store served by rank 0 on it")
    p.add_argument("--compute", type=float, default=0.005,
                   help="seconds every rank computes between collectives")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--slow-rate", default="200mbit")
    p.add_argument("--trials", type=int, default=20, help="trials per fault")
    p.add_argument("--faults", default="link_down,freeze,hold,none",
                   help="comma-separated, of: " + ",".join(EXPECTED) +
                        " (straggle<MS>: a straggler of MS milliseconds)")
    p.add_argument("--diag-after", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--at-step", type=int, default=30)
    p.add_argument("--delay", type=float, default=0.2)
    p.add_argument("--clean-duration", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--master-port", type=int, default=29600)
    p.add_argument("--out", default="diag-results")
    args = p.parse_args(argv)
    faults = args.faults.split(",")
    bad = [f for f in faults if kind(f) not in EXPECTED or (
        f.startswith("straggle") and f != "straggle" and not f[8:].isdigit())]
    if bad:
        p.error(f"unknown fault(s) {bad}; known: {', '.join(EXPECTED)}")
    rng = random.Random(args.seed)
    c = tb.build(args.name, args.hosts, args.nics, args.rate)
    tb.up(c)
    trials = []
    order = [f for f in faults for _ in range(args.trials)]
    rng.shuffle(order)
    try:
        for n, fault in enumerate(order):
            t = run_trial(c, args, n, fault, rng)
            trials.append(t)
            took = (t.verdict_t - t.fault_t) if t.verdict_t and t.fault_t else None
            who = f"host {t.culprit_host}" if t.culprit_host is not None else t.culprit_rank
            when = f" in {took:.1f}s" if took is not None else ""
            dumped = "" if t.dumps is None else (
                f"; dumps {t.dumps}/{len(t.ranks_host)}"
                + (f" in {t.dumps_t:.1f}s" if t.dumps_t is not None else "")
                + f", doctor {'ok' if t.doctor_ok else 'WRONG: ' + str(t.doctor)}"
                + f", round {'ok' if t.round_ok else 'WRONG: ' + str(t.round_verdict)}")
            print(f"trial {n + 1}/{len(order)} {fault:9s} culprit {who}: {t.cls}{when} "
                  f"{'ok' if t.ok else 'WRONG'}"
                  f"{' — ' + t.verdict.get('verdict', '') if t.verdict else ''}"
                  f"{' (' + t.note + ')' if t.note else ''}{dumped}", flush=True)
    finally:
        tb.down(args.name)
    print()
    print(matrix(trials))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "campaign.json", "w") as f:
        json.dump([t.__dict__ for t in trials], f, indent=1)
    return 0 if all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
