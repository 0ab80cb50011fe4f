"""The classifier (post-mortem in `cadence doctor`, live in the watchdog):
from every rank's dump, the first collective not completed by every rank,
and why.

- `mismatch`: the ranks' records of that operation have different
  argument signatures (the ranks called different things).
- `noncomm_hang`: some ranks never entered it (no record of it, or they
  entered only after the others had given up): names them, their host and
  pid, and their last completed operation.
- `comm_hang`: every rank entered, but data stopped on some connection:
  names the links `src→dst` whose transfers stopped, or the rank whose
  transfers all stopped (a rank that overran its own deadline — its process
  was not running — or one at the end of every stalled link).
- `comm_slow` / `noncomm_slow`: every operation completed, but a link or
  host NIC is much slower than its peers, or a rank consistently arrives
  late (slow.py).
- `healthy`: every operation in the dumps completed on every rank, at no
  rate or pace far off the others'.

How links are found. Messages of one operation between two ranks go in
order, so the j-th receive rank d recorded from rank s is the j-th send s
recorded to d. A receive still pending when the first rank gave up is a
*stalled link* s→d when s's matching send is pending too, or finished (the
data left s and never arrived), or s left no record; when s had not yet
posted that send (it waits on something else itself), the receive is only
a consequence and the chain is followed from s instead. Events recorded
after the first rank gave up (a rank frozen, then resumed) do not count.
"""

from __future__ import annotations

from cadence.diagnosis.dumps import Dump, Msg, MsgState, Op, peer_listing
from cadence.diagnosis.slow import diagnose_slow
from cadence.diagnosis.unreachable import Silence, judge, probe_lines
from cadence.diagnosis.verdict import (  # noqa: F401 - also importable from here
    CLASSES,
    COMM_HANG,
    COMM_SLOW,
    HEALTHY,
    MISMATCH,
    NONCOMM_HANG,
    NONCOMM_SLOW,
    Verdict,
    VerdictClass,
    ranks_text,
)

#: Slack on top of the clocks' error bounds when comparing times of ranks.
TOLERANCE_S = 0.1
#: Ranks in an operation beyond which the evidence sums up those still
#: running in one line rather than a line each.
RANK_LINES = 16


def _short(status: str, n: int = 160) -> str:
    # The error text starts with "cadence comm X rank R, op #k: "; keep what follows.
    s = status.split(": ", 1)[1] if status.startswith("cadence ") and ": " in status else status
    return s if len(s) <= n else s[: n - 1] + "…"


class _Comm:
    """One communicator's dumps, indexed."""

    def __init__(self, comm: str, dumps: list[Dump], hang_after: float,
                 reach: dict[str, bool | None] | None = None):
        self.comm = comm
        self.reach = reach
        self.by_rank = {d.rank: d for d in dumps}
        self.nranks = dumps[0].nranks
        self.missing = [r for r in range(self.nranks) if r not in self.by_rank]
        self.hang_after = hang_after
        self.colls = {r: {o.seq: o for o in d.ops if not o.is_p2p and o.seq > 0}
                      for r, d in self.by_rank.items()}
        self.tol = TOLERANCE_S + 2 * max(d.clock_error_ns for d in dumps) / 1e9
        self.t0 = min(d.wall(min((o.start_ns for o in d.ops), default=d.dump_ns))
                      for d in dumps)
        self.peer_info = peer_listing(dumps)

    def who(self, r: int) -> str:
        d = self.by_rank.get(r)
        if d is not None:
            return f"rank {r} ({d.host}, pid {d.pid})"
        p = self.peer_info.get(r, {})
        return f"rank {r} ({p.get('host', '?')}, pid {p.get('pid', '?')})"

    def host(self, r: int) -> str:
        d = self.by_rank.get(r)
        return d.host if d is not None else str(self.peer_info.get(r, {}).get("host", "?"))

    def rel(self, t: float) -> str:
        return f"{t - self.t0:+.3f}s"

    def stuck(self, r: int, op: Op) -> bool:
        if op.failed:
            return True
        d = self.by_rank[r]
        # A dump the watchdog wrote at its soft deadline says so itself.
        return op.running and ((d.dump_ns - op.start_ns) / 1e9 >= self.hang_after
                               or d.dumped_stuck)

    def first_stuck(self) -> int | None:
        ks = [k for r, ops in self.colls.items() for k, o in ops.items() if self.stuck(r, o)]
        return min(ks) if ks else None


def diagnose(dumps: list[Dump], hang_after: float = 10.0,
             reach: dict[str, bool | None] | None = None) -> Verdict:
    """The verdict over one job's dumps (see the module comment).
    `hang_after`: seconds an operation still running in an on-demand dump
    must have waited to count as stuck. `reach`: host → whether a probe
    reached it (the live coordinator's, for hosts none of whose ranks
    answered; unreachable.py)."""
    comms: dict[str, list[Dump]] = {}
    for d in dumps:
        comms.setdefault(d.comm, []).append(d)
    job = dumps[0].job
    findings = [_diagnose_comm(_Comm(c, ds, hang_after, reach))
                for c, ds in sorted(comms.items())]
    bad = [v for v in findings if v.cls != HEALTHY]
    for v in findings:
        v.job = job
    if not bad:
        v = findings[0] if len(findings) == 1 else _healthy_all(findings)
        v.job = job
        return v
    # The operation that got stuck first is the cause; later ones (other
    # communicators waiting on it) are consequences, kept as evidence.
    bad.sort(key=lambda v: (v.since is None, v.since or 0.0))
    first = bad[0]
    for other in bad[1:]:
        first.evidence.append(f"also, comm {other.comm}: {other.headline}")
    return first


def _healthy_all(findings: list[Verdict]) -> Verdict:
    v = Verdict(HEALTHY, f"healthy: {len(findings)} communicators, nothing pending")
    for f in findings:
        v.evidence.append(f"comm {f.comm}: {f.headline}")
    return v


def _diagnose_comm(c: _Comm) -> Verdict:
    k = c.first_stuck()
    if k is None:
        p2p = _p2p_stuck(c)
        if p2p is not None:
            return p2p
        slow = diagnose_slow(list(c.by_rank.values()))
        return slow if slow is not None else _healthy(c)
    recs = {r: ops.get(k) for r, ops in c.colls.items()}
    present = {r: o for r, o in recs.items() if o is not None}
    op = _representative(present)
    v = Verdict(HEALTHY, "", comm=c.comm, op=op)
    v.since = min(c.by_rank[r].wall(o.start_ns) for r, o in present.items())
    c.t0 = v.since  # times in the evidence: seconds since the first rank entered
    fails = [c.by_rank[r].wall(o.end_ns) for r, o in present.items() if o.failed]
    t_fail = min(fails) if fails else None
    what = f"{op.collective} #{k} (comm {c.comm})"
    v.evidence.append(f"first operation not completed by every rank: {op.describe()}, "
                      f"{op.bytes} bytes, signature {op.sig}")
    if t_fail is not None:
        v.evidence.append(f"the first rank gave up at {c.rel(t_fail)} (times: seconds since the "
                          "first rank entered it, on rank 0's clock)")
    _clock_note(c, v)

    # Different calls: the ranks do not agree on what operation k is.
    sigs: dict[str, list[int]] = {}
    for r, o in present.items():
        sigs.setdefault(o.sig, []).append(r)
    if len(sigs) > 1:
        return _mismatch(c, v, present, sigs, what)

    # Who entered, who did not (or only after the others had given up).
    absent, late = [], []
    for r in sorted(c.by_rank):
        o = recs[r]
        d = c.by_rank[r]
        if o is None:
            # A later collective means it completed this one (its record
            # fell out of the ring).
            if not any(s > k for s in c.colls[r]):
                absent.append(r)
        elif t_fail is not None and d.wall(o.start_ns) > t_fail + c.tol:
            late.append(r)
    unknown = [m for m in c.missing if not _sent_in(c, present, m)]
    v.evidence += _entries(c, present)
    for m in c.missing:
        how = "data from it in this operation arrived, so it entered" if m not in unknown \
            else "no data from it in this operation arrived"
        v.evidence.append(f"{c.who(m)}: wrote no dump; {how}")

    if not absent and not late:
        silence = judge({r: c.host(r) for r in range(c.nranks)}, c.missing, c.reach)
        if silence is not None:
            return _unreachable(c, v, what, present, t_fail, silence)
    v.evidence += probe_lines(c.reach)

    if absent or late:
        v.cls = NONCOMM_HANG
        named = sorted(absent + late)
        for r in absent:
            v.evidence.append(f"{c.who(r)}: never entered {op.collective} #{k}; "
                              f"{_last_completed(c, r)}")
        for r in late:
            d = c.by_rank[r]
            lag = d.wall(recs[r].start_ns) - t_fail
            v.evidence.append(f"{c.who(r)}: entered {op.collective} #{k} only "
                              f"{lag:.2f}s after the first rank gave up; "
                              f"{_last_completed(c, r, before=recs[r].id)}")
        v.ranks = named
        v.hosts = sorted({c.host(r) for r in named})
        for r in named:
            stack = c.by_rank[r].stack
            if stack:
                v.stacks[r] = stack
                where = _innermost(stack)
                if where:
                    v.evidence.append(f"{c.who(r)} is at {where}")
        entered = sorted(r for r in present if r not in late)
        v.headline = (f"{NONCOMM_HANG} in {what}: {_names(c, named)} "
                      f"{'never entered' if not late else 'did not enter in time'}; "
                      f"{_last_brief(c, named[0], recs)}; ranks {ranks_text(entered)} entered")
        return v

    links, deps, notes = _stalled_links(c, present, t_fail)
    v.evidence += notes
    frozen = _overran(c, present)
    for r, secs in frozen:
        d = c.by_rank[r]
        v.evidence.append(f"{c.who(r)}: spent {secs:.1f}s in {op.collective} #{k}, past its own "
                          f"deadline ({d.timeout_s:g}s): its process was not running "
                          "(stopped, frozen or starved of CPU)")
    if unknown and (not links or all(set(unknown) & {s, d} for s, d in links)):
        # A rank without a dump from which nothing arrived: it may never
        # have entered, or froze inside before sending; its peers waited on it.
        v.cls = NONCOMM_HANG
        v.ranks = sorted(unknown)
        v.hosts = sorted({c.host(r) for r in unknown})
        v.links = sorted(links)
        v.evidence.append(f"{_names(c, unknown)} left no dump and sent nothing in this "
                          "operation: it never entered it, or froze inside before sending "
                          "(its own dump would tell)")
        v.headline = (f"{NONCOMM_HANG} in {what}: {_names(c, unknown)} never seen in it "
                      f"(no dump); ranks {ranks_text(present)} entered")
        return v

    v.cls = COMM_HANG
    v.links = sorted(links)
    host = None if frozen or c.missing else _common_host(c, present, links, v)
    if host is not None:
        # Every rank reported, and every stalled link between hosts has one
        # host at an end: that host's network (its NIC, cable or switch
        # port). Its shared-memory links inside hosts only waited on it.
        cross = sorted((s, d) for s, d in links if c.host(s) != c.host(d))
        inside = len(links) - len(cross)
        v.links = cross
        v.hosts = [host]
        v.ranks = []
        names = ", ".join(f"{s}->{d}" for s, d in cross)
        if inside:
            v.evidence.append(f"{inside} stalled link(s) inside hosts left out: they waited on "
                              f"the links of {host}")
        v.headline = (f"{COMM_HANG} in {what}: the network of host {host} stalled (links "
                      f"{names} between hosts all touch it); ranks "
                      f"{ranks_text(sorted(present))} all entered")
        return v
    cross = [(s, d) for s, d in links if c.host(s) != c.host(d)]
    if not frozen and not c.missing and cross and len(cross) < len(links):
        # Every rank reported and data stalls between hosts: a shared-memory
        # link inside a host (both ends alive, answering) only waited on them.
        v.evidence.append(f"{len(links) - len(cross)} stalled link(s) inside hosts left out: "
                          "they waited on the links between hosts")
        links = cross
        v.links = sorted(links)
    culprits = sorted({r for r, _ in frozen}) or _common_rank(c, links)
    entered = ranks_text(sorted(set(present) | (set(c.missing) - set(unknown))))
    if culprits:
        v.ranks = culprits
        v.hosts = sorted({c.host(r) for r in culprits})
        stalled = ", ".join(f"{s}->{d}" for s, d in v.links) or "none found"
        v.headline = (f"{COMM_HANG} in {what}: {_names(c, culprits)} stopped moving data "
                      f"(stalled links {stalled}); ranks {entered} all entered")
    elif links:
        v.hosts = sorted({c.host(r) for link in links for r in link})
        names = ", ".join(f"{s}->{d} ({c.host(s)} -> {c.host(d)})" for s, d in v.links)
        v.headline = (f"{COMM_HANG} in {what}: link{'s' if len(links) > 1 else ''} {names} "
                      f"stalled; ranks {entered} all entered")
    else:
        waits = "; ".join(f"rank {a} waits on rank {b}" for a, b in sorted(deps)) or "none"
        v.headline = (f"{COMM_HANG} in {what}: every rank entered but no stalled link was found "
                      f"in the records (waits: {waits})")
    return v


def _entries(c: _Comm, present: dict[int, Op]) -> list[str]:
    """A line per rank that entered the operation: when, and how it ended.
    Of a large job, the ranks still running in one line, and the first
    RANK_LINES of the others."""
    lines, running = [], []
    for r, o in sorted(present.items()):
        d = c.by_rank[r]
        if o.running and len(present) > RANK_LINES:
            running.append(r)
            continue
        end = f"{'failed' if o.failed else 'still running'} at " \
              f"{c.rel(d.wall(o.end_ns if o.failed else d.dump_ns))}"
        if o.ok:
            end = f"completed at {c.rel(d.wall(o.end_ns))}"
        line = f"{c.who(r)}: entered at {c.rel(d.wall(o.start_ns))}, {end}"
        if o.failed:
            line += f": {_short(o.status)}"
        lines.append(line)
    if len(lines) > RANK_LINES:
        lines[RANK_LINES:] = [f"... and {len(lines) - RANK_LINES} more ranks that completed or "
                              "failed it"]
    if running:
        starts = [c.by_rank[r].wall(present[r].start_ns) for r in running]
        lines.insert(0, f"ranks {ranks_text(running)} ({len(running)} ranks): entered between "
                        f"{c.rel(min(starts))} and {c.rel(max(starts))}, still running")
    return lines


def _unreachable(c: _Comm, v: Verdict, what: str, present: dict[int, Op],
                 t_fail: float | None, s: Silence) -> Verdict:
    """comm_hang: a host nobody can hear, or the one host that hears only
    itself (unreachable.py)."""
    links, _deps, notes = _stalled_links(c, present, t_fail)
    v.cls = COMM_HANG
    v.hosts = s.hosts
    v.ranks = sorted(r for r in range(c.nranks) if c.host(r) in s.hosts)
    v.links = sorted((a, b) for a, b in links if c.host(a) in s.hosts or c.host(b) in s.hosts)
    v.evidence += notes + s.evidence
    hosts = ", ".join(s.hosts)
    if s.cut_off:
        v.evidence.append(f"only the ranks of {hosts} answered; every rank of hosts "
                          f"{', '.join(s.silent)} is silent: one host cut off, not all the "
                          "others at once (the job's Store is reachable from it)")
        v.headline = (f"{COMM_HANG} in {what}: host {hosts} is cut off ({_names(c, v.ranks)}): "
                      f"none of the {len(s.silent)} other hosts answered; its network is cut")
    else:
        v.evidence.append(f"no rank of host(s) {hosts} answered, while every other host's "
                          "ranks did: a rank stuck in its own code still answers (its "
                          "watchdog runs), so the host cannot be reached")
        v.headline = (f"{COMM_HANG} in {what}: host {hosts} unreachable ({_names(c, v.ranks)} "
                      f"silent); ranks {ranks_text(sorted(present))} wait in it; its network "
                      "is cut or the machine is down")
    return v


def _innermost(stack: str) -> str | None:
    """`File "train.py", line 12 in load_batch` of the main thread (the
    first thread in the stack text, most recent call first)."""
    for line in stack.splitlines():
        line = line.strip()
        if line.startswith("File "):
            return line
    return None


def _representative(present: dict[int, Op]) -> Op:
    # The call most ranks made (for the headline).
    counts: dict[str, int] = {}
    for o in present.values():
        counts[o.sig] = counts.get(o.sig, 0) + 1
    best = max(counts, key=lambda s: counts[s])
    return next(o for o in present.values() if o.sig == best)


def _names(c: _Comm, ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return c.who(ranks[0])
    return "ranks " + ", ".join(c.who(r).removeprefix("rank ") for r in ranks)


def _clock_note(c: _Comm, v: Verdict) -> None:
    methods = {d.clock_method for d in c.by_rank.values()} - {"same host"}
    hosts = {d.host for d in c.by_rank.values()}
    if len(hosts) > 1:
        err = max(d.clock_error_ns for d in c.by_rank.values()) / 1e3
        offs = max(abs(d.clock_offset_ns) for d in c.by_rank.values()) / 1e6
        how = "/".join(sorted(methods)) or "none measured"
        v.evidence.append(f"clocks: {len(hosts)} hosts; offsets to rank 0's clock ({how}, "
                          f"largest {offs:.3f} ms, within {err:.0f} µs) applied")


def _last_completed(c: _Comm, r: int, before: int | None = None) -> str:
    d = c.by_rank[r]
    done = [o for o in d.ops if o.ok and (before is None or o.id < before)]
    if not done:
        return "no completed operation in its records"
    o = done[-1]
    return f"last completed {o.describe()} at {c.rel(d.wall(o.end_ns))}"


def _last_brief(c: _Comm, r: int, recs: dict[int, Op | None]) -> str:
    d = c.by_rank[r]
    before = recs[r].id if recs.get(r) is not None else None
    done = [o for o in d.ops if o.ok and (before is None or o.id < before)]
    if not done:
        return "no completed operation recorded"
    o = done[-1]
    return f"its last completed: {o.collective} #{o.seq}"


def _mismatch(c: _Comm, v: Verdict, present: dict[int, Op], sigs: dict[str, list[int]],
              what: str) -> Verdict:
    groups = sorted(sigs.values(), key=lambda rs: (-len(rs), rs))
    majority = groups[0] if len(groups[0]) > len(groups[1]) else []
    odd = sorted(r for g in groups if g is not majority for r in g)
    v.cls = MISMATCH
    v.ranks = odd
    v.hosts = sorted({c.host(r) for r in odd})
    for g in groups:
        o = present[g[0]]
        v.evidence.append(f"ranks {ranks_text(g)} called {o.describe()}, signature {o.sig}")
    if majority:
        theirs = present[odd[0]].describe()
        v.headline = (f"{MISMATCH} in {what}: {_names(c, odd)} called {theirs} where ranks "
                      f"{ranks_text(majority)} called {present[majority[0]].describe()}")
    else:
        calls = "; ".join(f"ranks {ranks_text(g)}: {present[g[0]].describe()}" for g in groups)
        v.headline = f"{MISMATCH} in {what}: the ranks called different operations ({calls})"
    return v


def _at(d: Dump, m: Msg, t_fail: float | None, tol: float) -> tuple[str, int | None, str]:
    """A message as it stood when the first rank gave up: (state, bytes
    moved by then or None if unknown, a note when it moved only later).
    Without a failure, as recorded."""
    if t_fail is None:
        return m.state, m.moved, ""
    first = None if m.first_ns is None else d.wall(m.first_ns)
    last = None if m.last_ns is None else d.wall(m.last_ns)
    if last is None or last <= t_fail + tol:
        return m.state, m.moved, ""
    later = f"it moved only {last - t_fail:.3f}s later"
    if first is not None and first > t_fail + tol:
        return MsgState.PENDING, 0, later
    return MsgState.PENDING, None, later


def _sent_in(c: _Comm, present: dict[int, Op], m: int) -> bool:
    """Whether data from rank `m` arrived at any rank in this operation."""
    for o in present.values():
        for x in o.messages or ():
            if x.dir == "recv" and x.peer == m and (x.moved > 0 or x.state == MsgState.DONE):
                return True
    return False


def _msgs(c: _Comm, present: dict[int, Op]) -> dict[tuple[int, int, str], list[Msg]]:
    """(rank, peer, dir) → that rank's messages in order."""
    out: dict[tuple[int, int, str], list[Msg]] = {}
    for r, o in present.items():
        for m in o.messages or ():
            out.setdefault((r, m.peer, m.dir), []).append(m)
    return out


def _numbered(ms: list[Msg]):
    """(index of its first message, record) for a rank's records with one
    peer in one direction: a record may stand for a run of messages."""
    j = 0
    for m in ms:
        yield j, m
        j += m.count


def _nth(ms: list[Msg], j: int) -> Msg | None:
    """The record holding message j of `ms` (None: fewer messages)."""
    for first, m in _numbered(ms):
        if j < first + m.count:
            return m
    return None


def _nth_text(what: str, j: int, m: Msg) -> str:
    return f"{what} {j + 1}" if m.count == 1 else f"{what}s {j + 1}-{j + m.count}"


def _stalled_links(c: _Comm, present: dict[int, Op], t_fail: float | None):
    """(stalled links, wait edges that are only consequences, evidence: one
    line per stalled link)."""
    msgs = _msgs(c, present)
    links: dict[tuple[int, int], list[str]] = {}
    deps: set[tuple[int, int]] = set()
    notes: list[str] = []
    for r, o in sorted(present.items()):
        if o.messages is None:
            notes.append(f"rank {r}: no message records for this operation "
                         f"({o.messages_state})")

    def at(r, m):
        return _at(c.by_rank[r], m, t_fail, c.tol)

    def moved(m, view):
        got = "?" if view[1] is None else view[1]
        return f"{got}/{m.bytes} bytes by then" + (f"; {view[2]}" if view[2] else "")

    for (dst, src, kind), ms in sorted(msgs.items()):
        if kind != "recv":
            continue
        sends = msgs.get((src, dst, "send"), [])
        for j, m in _numbered(ms):
            view = at(dst, m)
            if view[0] != MsgState.PENDING:
                continue
            rx = f"rank {dst}'s {_nth_text('receive', j, m)} from rank {src} pending " \
                 f"({moved(m, view)})"
            if src not in present or present[src].messages is None:
                why = "left no dump" if src not in present else "recorded no messages"
                links.setdefault((src, dst), []).append(f"{rx}; rank {src} {why}")
                continue
            # The j-th receive from src is src's j-th send to dst.
            send = _nth(sends, j)
            if send is None or at(src, send)[0] == MsgState.HELD:
                deps.add((dst, src))  # src had not got there: it waits itself
                continue
            sv = at(src, send)
            if sv[0] == MsgState.DONE:
                t = c.by_rank[src].wall(send.last_ns)
                links.setdefault((src, dst), []).append(
                    f"{rx}, but rank {src}'s send had finished at {c.rel(t)}: the data left "
                    f"rank {src} and was not taken in by rank {dst}")
            else:
                links.setdefault((src, dst), []).append(
                    f"{rx}, and rank {src}'s send pending too ({moved(send, sv)})")
    # Sends toward a rank that left no dump.
    for (src, dst, kind), ms in sorted(msgs.items()):
        if kind != "send" or dst in present:
            continue
        for j, m in _numbered(ms):
            view = at(src, m)
            if view[0] == MsgState.PENDING:
                links.setdefault((src, dst), []).append(
                    f"rank {src}'s {_nth_text('send', j, m)} to rank {dst} pending "
                    f"({moved(m, view)}); rank {dst} left no dump")
    for (src, dst), items in sorted(links.items()):
        more = f" (+{len(items) - 1} more message{'s' if len(items) > 2 else ''})" \
            if len(items) > 1 else ""
        notes.append(f"link {src}->{dst} ({c.host(src)} -> {c.host(dst)}) stalled: "
                     f"{items[0]}{more}")
    return set(links), deps, notes


def _overran(c: _Comm, present: dict[int, Op]) -> list[tuple[int, float]]:
    """Ranks that stayed in the operation well past their own deadline."""
    out = []
    for r, o in present.items():
        d = c.by_rank[r]
        if d.timeout_s <= 0:
            continue
        grace = min(max(d.timeout_s / 4, 0.5), 3.0)
        end = o.end_ns if not o.running else d.dump_ns
        secs = (end - o.start_ns) / 1e9
        if (o.failed or o.running) and secs > d.timeout_s + grace + 1.0:
            out.append((r, secs))
    return out


def _common_host(c: _Comm, present: dict[int, Op], links, v: Verdict) -> str | None:
    """The one host every stalled link between hosts touches (None when
    there is no such link, or no single host).

    One stalled link between two hosts touches both; the one whose network
    still works is cleared by what it received from a third host after the
    stall began (only receives count: a send "moves" into the kernel's
    buffer even when the cable is cut)."""
    cross = [(s, d) for s, d in links if c.host(s) != c.host(d)]
    if not cross:
        return None
    common = set.intersection(*({c.host(s), c.host(d)} for s, d in cross))
    if len(common) == 2:
        t_ref = _stall_began(c, present, cross)
        if t_ref is not None:
            alive = {h for h in common if _received_across_after(c, present, h, t_ref, common)}
            for h in sorted(alive):
                v.evidence.append(f"host {h} received data from other hosts after the stall "
                                  "began: its network works")
            common -= alive
    return next(iter(common)) if len(common) == 1 else None


def _stall_began(c: _Comm, present: dict[int, Op], cross) -> float | None:
    """When data last moved on the stalled links (the earliest of them)."""
    times = []
    for s, d in cross:
        t = []
        for r, peer, want in ((s, d, "send"), (d, s, "recv")):
            o = present.get(r)
            for m in (o.messages or []) if o is not None else []:
                if m.peer == peer and m.dir == want and m.last_ns is not None and (
                        want == "recv" or m.state == MsgState.DONE):
                    t.append(c.by_rank[r].wall(m.last_ns))
        if t:
            times.append(max(t))
    return min(times) if times else None


def _received_across_after(c: _Comm, present: dict[int, Op], host: str, t_ref: float,
                           suspects: set[str]) -> bool:
    """Whether a rank received data across hosts after `t_ref` on a link
    with `host` at one end and a host outside `suspects` at the other."""
    for r, o in present.items():
        d = c.by_rank[r]
        for m in o.messages or []:
            if m.dir != "recv" or m.last_ns is None or m.moved == 0:
                continue
            ends = {c.host(r), c.host(m.peer)}
            if host in ends and len(ends) == 2 and not ends <= suspects and \
                    d.wall(m.last_ns) > t_ref + c.tol:
                return True
    return False


def _common_rank(c: _Comm, links) -> list[int]:
    """The rank every stalled link touches, when that points at a rank
    rather than a link: it left no dump, or its stalled links go to two or
    more peers."""
    if not links:
        return []
    # A link out of a rank that itself waits on a stalled link from a rank
    # that left no dump only passes that wait on (it forwards what it has
    # not received): it does not count against the silent rank.
    silent = set(c.missing)
    waiting = {d for s, d in links if s in silent}
    links = [(s, d) for s, d in links
             if not (s in waiting and s not in silent and d not in silent)] or links
    common = set.intersection(*({s, d} for s, d in links))
    out = []
    for r in sorted(common):
        peers = {d if s == r else s for s, d in links}
        if r in c.missing or len(peers) >= 2:
            out.append(r)
    return out if len(out) == 1 else []


def _p2p_stuck(c: _Comm) -> Verdict | None:
    """A failed (or long-running) send or receive when every collective
    completed: does the peer have the matching message at all?"""
    stuck = [(c.by_rank[r].wall(o.start_ns), r, o) for r, d in c.by_rank.items()
             for o in d.ops if o.is_p2p and c.stuck(r, o) and o.seq > 0]
    if not stuck:
        return None
    _, r, o = min(stuck, key=lambda x: x[0])
    peer = o.root
    src, dst = (r, peer) if o.collective == "send" else (peer, r)
    want = "recv" if o.collective == "send" else "send"
    v = Verdict(HEALTHY, "", comm=c.comm, op=o, since=c.by_rank[r].wall(o.start_ns))
    v.evidence.append(f"{c.who(r)}: {o.describe()} {o.status}")
    pd = c.by_rank.get(peer)
    if pd is None:
        v.cls = NONCOMM_HANG
        v.ranks, v.hosts = [peer], [c.host(peer)]
        v.headline = f"{NONCOMM_HANG} in {o.describe()} (comm {c.comm}): {c.who(peer)} left no " \
                     "dump"
        return v
    match = [x for x in pd.ops if x.collective == want and x.root == r and x.seq == o.seq]
    if not match:
        v.cls = NONCOMM_HANG
        v.ranks, v.hosts = [peer], [c.host(peer)]
        v.evidence.append(f"{c.who(peer)}: no {want} #{o.seq} with rank {r} in its records; "
                          f"{_last_completed(c, peer)}")
        v.headline = (f"{NONCOMM_HANG} in {o.describe()} (comm {c.comm}): {c.who(peer)} never "
                      f"posted the matching {want}")
        return v
    v.cls = COMM_HANG
    v.links = [(src, dst)]
    v.hosts = sorted({c.host(src), c.host(dst)})
    v.evidence.append(f"{c.who(peer)}: {match[0].describe()} {match[0].status}")
    v.headline = (f"{COMM_HANG} in {o.describe()} (comm {c.comm}): link {src}->{dst} "
                  f"({c.host(src)} -> {c.host(dst)}) stalled with both sides posted")
    return v


def _healthy(c: _Comm) -> Verdict:
    v = Verdict(HEALTHY, "", comm=c.comm)
    seqs = sorted({k for ops in c.colls.values() for k in ops})
    lasts = {r: max(ops) if ops else 0 for r, ops in c.colls.items()}
    span = f"collectives #{seqs[0]}-#{seqs[-1]}" if seqs else "no collectives"
    v.headline = (f"{HEALTHY}: comm {c.comm}, {len(c.by_rank)} of {c.nranks} ranks dumped, "
                  f"{span} completed, nothing pending")
    if len(set(lasts.values())) > 1:
        v.evidence.append("ranks were dumped at different points (last collective: " +
                          ", ".join(f"rank {r} #{k}" for r, k in sorted(lasts.items())) + ")")
    if c.missing:
        v.evidence.append(f"no dump from rank(s) {ranks_text(c.missing)}")
    failures = {r: d.failure for r, d in c.by_rank.items() if d.failure}
    for r, f in sorted(failures.items()):
        v.evidence.append(f"rank {r} reports an earlier failure no longer in its records: "
                          f"{_short(f)}")
    return v
