"""Reading the dumps ranks write (`CADENCE_DUMP_DIR` on failure,
`Communicator.dump(dir)` on demand): one JSON file per rank and
communicator, `cadence-<comm>-rank<r>.json`, format in docs/diagnosis.md.

Everything that can be wrong with the input (no directory, no dumps, a
truncated or foreign file, dumps of different jobs, a newer format) raises
`DumpError` with one line that says what and where.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum

FORMAT = "cadence-dump"
VERSION = 1
NAME = re.compile(r"^cadence-(?P<comm>[A-Za-z0-9_-]+)-rank(?P<rank>\d+)\.json$")
P2P = ("send", "recv")


class DumpError(Exception):
    """Input `cadence doctor` cannot use; the message is one line."""


class MsgState(StrEnum):
    """Where a message stood when its rank recorded it (the core's
    `monitor::MsgState`)."""

    #: Every byte moved.
    DONE = "done"
    #: Allowed to move, not finished: waiting on the peer (or the link).
    PENDING = "pending"
    #: Held back behind the rank's own earlier transfers: not yet offered.
    HELD = "held"


class OpStatus(StrEnum):
    """An operation's status while it runs and once it completed; any other
    status is the error it failed with."""

    OK = "ok"
    RUNNING = "running"


#: The `reason` a dump starts with when the live watchdog wrote it because
#: its running operation passed the soft deadline (live.py).
STUCK_REASON = "stuck:"

@dataclass
class Msg:
    """One message of one operation as its rank recorded it (times in ns
    since that rank's communicator was created, on its own clock)."""

    peer: int
    dir: str  # "send" | "recv"
    state: MsgState
    bytes: int
    moved: int
    first_ns: int | None
    last_ns: int | None
    #: Messages this record stands for: a run of consecutive messages of
    #: the rank with this peer, in this direction and state (`compact`),
    #: `bytes` and `moved` summed, `first_ns` of its first, `last_ns` of
    #: its last. 1 in the core's dumps.
    count: int = 1


@dataclass
class LinkCounters:
    """One rank's counters for its connection to `peer`, cumulative since the
    communicator was created (`links` in a dump)."""

    peer: int
    transport: str  # "shm" | "tcp"
    bytes_sent: int
    bytes_recv: int
    msgs_sent: int
    msgs_recv: int
    #: ns during which the link had a transfer pending: every phase that used
    #: it is charged whole, waits on other ranks included.
    busy_ns: int


@dataclass
class Op:
    id: int
    seq: int
    sig: str
    collective: str
    algo: str
    dtype: str
    redop: str
    root: int
    count: int
    bytes: int
    enqueue_ns: int
    start_ns: int
    end_ns: int
    status: str  # an OpStatus, or the error the operation failed with
    messages: list[Msg] | None
    messages_state: str  # "final" | "live" | "dropped" | "none"
    messages_at_ns: int | None = None

    @property
    def is_p2p(self) -> bool:
        return self.collective in P2P

    @property
    def ok(self) -> bool:
        return self.status == OpStatus.OK

    @property
    def running(self) -> bool:
        return self.status == OpStatus.RUNNING

    @property
    def failed(self) -> bool:
        return not (self.ok or self.running)

    def describe(self) -> str:
        """`allreduce #5 (count=1000, float32, sum)`; a send or receive
        names its peer."""
        if self.is_p2p:
            where = "to" if self.collective == "send" else "from"
            return f"{self.collective} #{self.seq} {where} rank {self.root} " \
                   f"({self.count} x {self.dtype})"
        if self.collective == "barrier":
            return f"barrier #{self.seq}"
        parts = [f"count={self.count}", self.dtype]
        if self.redop:
            parts.append(self.redop)
        if self.collective in ("broadcast", "reduce", "gather", "scatter"):
            parts.append(f"root {self.root}")
        return f"{self.collective} #{self.seq} ({', '.join(parts)})"


@dataclass
class Dump:
    path: str
    job: str
    comm: str
    rank: int
    nranks: int
    host: str
    hostname: str
    pid: int
    peers: list[dict]
    timeout_s: float
    base_unix_ns: int
    dump_ns: int
    clock_offset_ns: int
    clock_error_ns: int
    clock_method: str
    reason: str
    #: Per-link counters (None in older dumps and while an operation ran).
    links: list[LinkCounters] | None
    failure: str | None
    ops: list[Op] = field(default_factory=list)
    #: Where the rank's Python threads were (faulthandler style), when the
    #: live watchdog took the summary; None in dumps written by the core.
    stack: str | None = None

    @property
    def dumped_stuck(self) -> bool:
        """Written by the live watchdog when its running operation passed the
        soft deadline (its `reason` starts with STUCK_REASON)."""
        return self.reason.startswith(STUCK_REASON)

    def wall(self, ns: int) -> float:
        """Seconds since the epoch on rank 0's clock of this rank's time `ns`."""
        return (self.base_unix_ns + ns - self.clock_offset_ns) / 1e9

    @property
    def dumped_at(self) -> float:
        return self.wall(self.dump_ns)

    def peer(self, rank: int) -> dict:
        for p in self.peers:
            if p.get("rank") == rank:
                return p
        return {}


def peer_listing(dumps: list[Dump]) -> dict[int, dict]:
    """rank → {rank, host, pid, addr} of the ranks the dumps list: each
    core dump lists every rank; a live round's summary, only rank 0's does,
    the others their own and their linked peers (`Comm::dump_round`)."""
    out: dict[int, dict] = {}
    for d in sorted(dumps, key=lambda d: -len(d.peers)):
        if len(out) >= d.nranks:
            break
        for p in d.peers:
            out.setdefault(p.get("rank"), p)
    return out


def _need(obj: dict, key: str, kind, where: str):
    if key not in obj:
        raise DumpError(f"{where}: not a complete cadence dump (no {key!r})")
    v = obj[key]
    if kind is not None and v is not None and not isinstance(v, kind):
        raise DumpError(f"{where}: not a complete cadence dump ({key!r} is {type(v).__name__})")
    return v


_STATES = {s.value: s for s in MsgState}


def _msg(m: dict, where: str) -> Msg:
    # A window holds thousands of these a rank: one lookup per field.
    try:
        state = _STATES.get(m["state"])
        if state is None:
            raise ValueError(f"state {m['state']!r}")
        first, last, count = m.get("first_ns"), m.get("last_ns"), m.get("count", 1)
        return Msg(int(m["peer"]), str(m["dir"]), state, int(m["bytes"]), int(m["moved"]),
                   None if first is None else int(first), None if last is None else int(last),
                   1 if count == 1 else _count(count))
    except (KeyError, TypeError, ValueError) as e:
        raise DumpError(f"{where}: a message record is malformed ({e})") from None


def _count(v) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(f"count {n}")
    return n


def compact_messages(msgs: list[dict]) -> list[dict]:
    """A rank's message records of one operation (the dump's dicts) as
    runs: per peer and direction, in order, consecutive messages in one
    state become one record with `count` (Msg.count). What the classifier
    reads of them is kept: the state of the j-th message between two ranks
    and when data last moved. A ring's thousands of messages a rank become
    a few records a peer."""
    runs: dict[tuple, list[dict]] = {}
    for m in msgs:
        key = (m["peer"], m["dir"])
        mine = runs.setdefault(key, [])
        last = mine[-1] if mine else None
        if last is not None and last["state"] == m["state"]:
            last["count"] = last.get("count", 1) + m.get("count", 1)
            last["bytes"] += m["bytes"]
            last["moved"] += m["moved"]
            if m.get("last_ns") is not None:
                last["last_ns"] = m["last_ns"]
            if last.get("first_ns") is None:
                last["first_ns"] = m.get("first_ns")
        else:
            mine.append(dict(m, count=m.get("count", 1)))
    return [r for key in sorted(runs) for r in runs[key]]


def _links(v, where: str) -> list[LinkCounters] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise DumpError(f"{where}: not a complete cadence dump ('links' is {type(v).__name__})")
    try:
        return [LinkCounters(peer=int(x["peer"]), transport=str(x.get("transport", "")),
                             bytes_sent=int(x.get("bytes_sent", 0)),
                             bytes_recv=int(x.get("bytes_recv", 0)),
                             msgs_sent=int(x.get("msgs_sent", 0)),
                             msgs_recv=int(x.get("msgs_recv", 0)),
                             busy_ns=int(x.get("busy_ns", 0))) for x in v]
    except (KeyError, TypeError, ValueError) as e:
        raise DumpError(f"{where}: a link counter record is malformed ({e})") from None


def _op(o: dict, where: str) -> Op:
    try:
        msgs = o.get("messages")
        return Op(
            id=int(o["id"]), seq=int(o["seq"]), sig=str(o["sig"]),
            collective=str(o["collective"]), algo=str(o.get("algo", "")),
            dtype=str(o.get("dtype", "")), redop=str(o.get("redop", "")),
            root=int(o.get("root", 0)), count=int(o.get("count", 0)),
            bytes=int(o.get("bytes", 0)), enqueue_ns=int(o["enqueue_ns"]),
            start_ns=int(o["start_ns"]), end_ns=int(o["end_ns"]), status=str(o["status"]),
            messages=None if msgs is None else [_msg(m, where) for m in msgs],
            messages_state=str(o.get("messages_state", "none")),
            messages_at_ns=o.get("messages_at_ns"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise DumpError(f"{where}: an operation record is malformed ({e})") from None


def parse(text: str, where: str) -> Dump:
    """One dump from its JSON text; `where` names it in errors."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (truncated?)" if not text.rstrip().endswith("}") else ""
        raise DumpError(f"{where}: not valid JSON{hint}: {e.msg} at line {e.lineno} "
                        f"column {e.colno}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DumpError(f"{where}: not a cadence dump (no \"format\": \"{FORMAT}\")")
    version = d.get("version")
    if version != VERSION:
        raise DumpError(f"{where}: dump format version {version!r}; this cadence doctor reads "
                        f"version {VERSION}")
    clock = _need(d, "clock", dict, where)
    ops = _need(d, "ops", list, where)
    try:
        return Dump(
            path=where, job=str(_need(d, "job", str, where)),
            comm=str(_need(d, "comm_id", str, where)), rank=int(_need(d, "rank", int, where)),
            nranks=int(_need(d, "nranks", int, where)), host=str(d.get("host", "?")),
            hostname=str(d.get("hostname", "")), pid=int(d.get("pid", 0)),
            peers=list(d.get("peers") or []), timeout_s=float(d.get("timeout_s", 0.0)),
            base_unix_ns=int(_need(d, "base_unix_ns", int, where)),
            dump_ns=int(_need(d, "dump_ns", int, where)),
            links=_links(d.get("links"), where),
            clock_offset_ns=int(clock.get("offset_ns", 0)),
            clock_error_ns=int(clock.get("error_ns", 0)),
            clock_method=str(clock.get("method", "")),
            reason=str(d.get("reason", "")), failure=d.get("failure"),
            ops=[_op(o, where) for o in ops],
            stack=d.get("stack") if isinstance(d.get("stack"), str) else None,
        )
    except (TypeError, ValueError) as e:
        raise DumpError(f"{where}: not a complete cadence dump ({e})") from None


def load_dir(path: str, skip_bad: bool = False) -> tuple[list[Dump], list[str]]:
    """Every dump in directory `path`, and the problems skipped (only with
    `skip_bad`: a bad file then becomes a note instead of an error)."""
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise DumpError(f"{path}: not a directory (give the directory the ranks dumped into)")
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise DumpError(f"{path}: cannot list it ({e.strerror})") from None
    ours = [n for n in names if NAME.match(n)]
    if not ours:
        if not names:
            raise DumpError(f"{path}: empty directory, no dumps (ranks write them there on "
                            "failure with CADENCE_DUMP_DIR, or with Communicator.dump)")
        raise DumpError(f"{path}: no cadence dumps among its {len(names)} entries (expected "
                        "cadence-<comm>-rank<r>.json files)")
    dumps, skipped = [], []
    for n in ours:
        full = os.path.join(path, n)
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
            if not text.strip():
                raise DumpError(f"{full}: empty file")
            d = parse(text, full)
            m = NAME.match(n)
            if d.comm != m["comm"] or d.rank != int(m["rank"]):
                raise DumpError(f"{full}: holds comm {d.comm} rank {d.rank}, not what its name "
                                "says")
            dumps.append(d)
        except (OSError, UnicodeDecodeError) as e:
            err = DumpError(f"{full}: cannot read it ({e})")
            if not skip_bad:
                raise err from None
            skipped.append(str(err))
        except DumpError as e:
            if not skip_bad:
                raise DumpError(f"{e} (--skip-bad diagnoses without it)") from None
            skipped.append(str(e))
    if not dumps:
        raise DumpError(f"{path}: no usable dump ({len(skipped)} skipped: {skipped[0]})")
    check_one_job(dumps)
    return dumps, skipped


def check_one_job(dumps: list[Dump]) -> None:
    """Refuses dumps of different jobs, naming them."""
    jobs: dict[str, list[Dump]] = {}
    for d in dumps:
        jobs.setdefault(d.job, []).append(d)
    if len(jobs) > 1:
        parts = []
        for job, ds in sorted(jobs.items(), key=lambda kv: -len(kv[1])):
            files = ", ".join(os.path.basename(d.path) for d in ds[:3])
            more = f" and {len(ds) - 3} more" if len(ds) > 3 else ""
            parts.append(f"job {job} ({files}{more})")
        raise DumpError(f"dumps of {len(jobs)} different jobs: {'; '.join(parts)}; diagnose one "
                        "job's dumps at a time")
    comms: dict[str, set[int]] = {}
    for d in dumps:
        sizes = comms.setdefault(d.comm, set())
        sizes.add(d.nranks)
        if len(sizes) > 1:
            raise DumpError(f"comm {d.comm}: dumps disagree on its size ({sorted(sizes)} ranks)")
