"""A Chrome/Perfetto trace of the dumps (`cadence doctor DUMPDIR --trace FILE`).

JSON trace-event format (loadable in ui.perfetto.dev and chrome://tracing):

- one *process* per host (its name: the host, and the machine's host name
  when that differs), one *thread* per rank in it, named
  `rank 3 (host2, pid 123)` (a communicator other than the job's largest
  is named too: `comm 9b61… rank 1 (…)`);
- one complete slice (`"ph": "X"`) per recorded operation on its rank's
  thread (`allreduce #12`, args: seq, sig, bytes, algo, status, …);
- one slice per recorded message on a track of its own under the rank
  (`rank 3 messages`; more of them when messages overlap in time, since a
  track's slices must nest): `send→2 65536 B`, `recv←1 65536 B`, args: state,
  moved, the operation it belongs to;
- an instant event per rank when it was dumped, and one for the verdict.

Times are on rank 0's clock (each rank's measured offset applied, as the
classifier does: `base_unix_ns + t_ns - offset_ns`), in microseconds since
the earliest event, kept in integer nanoseconds until then. An operation
still running when its rank was dumped, or a message still pending or held,
ends at the dump time (or when its operation failed) and says so in its name
(`[running]`, `[pending]`) and in `args.open`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cadence.diagnosis.dumps import Dump, Msg, MsgState, Op


def abs_ns(d: Dump, t_ns: int) -> int:
    """Nanoseconds since the epoch on rank 0's clock of rank `d`'s time
    `t_ns` (`Dump.wall`, without rounding through a float)."""
    return d.base_unix_ns + t_ns - d.clock_offset_ns


def op_name(o: Op) -> str:
    """`allreduce #12`, `send #3 to 1`, `recv #3 from 1`."""
    if o.collective == "send":
        return f"send #{o.seq} to {o.root}"
    if o.collective == "recv":
        return f"recv #{o.seq} from {o.root}"
    return f"{o.collective} #{o.seq}"


def msg_name(m: Msg) -> str:
    """`send→2 65536 B`, `recv←1 65536 B`."""
    arrow = "→" if m.dir == "send" else "←"
    return f"{m.dir}{arrow}{m.peer} {m.bytes} B"


def op_span(d: Dump, o: Op) -> tuple[int, int, bool]:
    """(start, end, open) in the rank's own ns: a running operation ends at
    the dump."""
    if o.running:
        return o.start_ns, max(o.start_ns, d.dump_ns), True
    return o.start_ns, max(o.start_ns, o.end_ns), False


def msg_span(d: Dump, o: Op, m: Msg) -> tuple[int, int, bool]:
    """(start, end, open) in the rank's own ns. A message without a first
    progress stamp starts with its operation; one still pending or held
    ends when its operation ended (it failed) or at the dump."""
    o_start, o_end, _ = op_span(d, o)
    start = m.first_ns if m.first_ns is not None else o_start
    if m.state == MsgState.DONE:
        end = m.last_ns if m.last_ns is not None else o_end
        return start, max(start, end), False
    end = max(o_end, m.last_ns or 0)
    return start, max(start, end), True


@dataclass
class _Slice:
    start: int  # ns since the epoch, rank 0's clock
    end: int
    name: str
    args: dict
    cname: str | None = None


def _lanes(slices: list[_Slice]) -> list[list[_Slice]]:
    """Packs slices into as few tracks as needed so that none overlap on a
    track (the trace format wants a thread's slices properly nested)."""
    lanes: list[list[_Slice]] = []
    ends: list[int] = []
    for s in sorted(slices, key=lambda s: (s.start, s.end)):
        for i, e in enumerate(ends):
            if e <= s.start:
                lanes[i].append(s)
                ends[i] = s.end
                break
        else:
            lanes.append([s])
            ends.append(s.end)
    return lanes


def _order(dumps: list[Dump]) -> list[str]:
    """Communicators, the job's largest first."""
    sizes: dict[str, tuple[int, int]] = {}
    for d in dumps:
        n, ops = sizes.get(d.comm, (d.nranks, 0))
        sizes[d.comm] = (n, ops + len(d.ops))
    return sorted(sizes, key=lambda c: (-sizes[c][0], -sizes[c][1], c))


def build(dumps: list[Dump], verdict=None) -> dict:
    """The trace as a dict (`json.dump` it). `verdict`: a `Verdict` to mark."""
    comms = _order(dumps)
    primary = comms[0] if comms else None
    ordered = sorted(dumps, key=lambda d: (comms.index(d.comm), d.rank))

    # Hosts, in the order of their first rank in the largest communicator.
    hosts: dict[str, set[str]] = {}
    for d in ordered:
        hosts.setdefault(d.host, set()).add(d.hostname)
    host_pid = {h: i + 1 for i, h in enumerate(hosts)}

    ops: dict[tuple[str, int], list[_Slice]] = {}
    msgs: dict[tuple[str, int], list[_Slice]] = {}
    instants: list[tuple[int, dict]] = []
    for d in ordered:
        key = (d.comm, d.rank)
        ops[key], msgs[key] = [], []
        for o in d.ops:
            s, e, open_ = op_span(d, o)
            name = op_name(o) + (" [running]" if open_ else " [failed]" if o.failed else "")
            args = {"seq": o.seq, "sig": o.sig, "bytes": o.bytes, "algo": o.algo,
                    "status": o.status, "count": o.count, "dtype": o.dtype, "comm": d.comm,
                    "id": o.id, "messages_state": o.messages_state}
            if o.redop:
                args["redop"] = o.redop
            if o.is_p2p or o.collective in ("broadcast", "reduce", "gather", "scatter"):
                args["root" if not o.is_p2p else "peer"] = o.root
            if o.enqueue_ns < o.start_ns:
                args["queued_us"] = round((o.start_ns - o.enqueue_ns) / 1e3, 3)
            if open_:
                args["open"] = "still running when dumped: ends at the dump time"
            cname = "bad" if open_ else "terrible" if o.failed else None
            ops[key].append(_Slice(abs_ns(d, s), abs_ns(d, e), name, args, cname))
            counts: dict[tuple[int, str], int] = {}
            for m in o.messages or ():
                j = counts[(m.peer, m.dir)] = counts.get((m.peer, m.dir), 0) + 1
                ms, me, mopen = msg_span(d, o, m)
                mname = msg_name(m) + (f" [{m.state}]" if m.state != MsgState.DONE else "")
                margs = {"state": m.state, "moved": m.moved, "bytes": m.bytes, "peer": m.peer,
                         "dir": m.dir, "op": op_name(o), "op_id": o.id, "index": j,
                         "comm": d.comm}
                if m.first_ns is None:
                    margs["first"] = "not stamped: starts with its operation"
                if mopen:
                    margs["open"] = ("not finished when its operation " +
                                     ("was dumped" if o.running else "ended") +
                                     ": ends there")
                cname = {MsgState.PENDING: "bad", MsgState.HELD: "yellow"}.get(m.state)
                msgs[key].append(_Slice(abs_ns(d, ms), abs_ns(d, me), mname, margs, cname))
        instants.append((abs_ns(d, d.dump_ns), {
            "name": "dump", "ph": "i", "s": "t", "pid": host_pid[d.host],
            "args": {"reason": d.reason, "failure": d.failure}, "_key": key}))

    starts = [s.start for ss in (*ops.values(), *msgs.values()) for s in ss]
    starts += [t for t, _ in instants]
    t0 = min(starts) if starts else 0

    def us(t: int) -> float:
        return round((t - t0) / 1e3, 3)

    events: list[dict] = []
    for h, pid in host_pid.items():
        names = hosts[h] - {"", h}
        label = f"{h} ({', '.join(sorted(names))})" if names else h
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
    tid = 0
    op_tid: dict[tuple[str, int], int] = {}
    for d in ordered:
        key = (d.comm, d.rank)
        pid = host_pid[d.host]
        who = f"rank {d.rank} ({d.host}, pid {d.pid})"
        if d.comm != primary:
            who = f"comm {d.comm} {who}"
        tracks = [(who, lane) for lane in _lanes(ops[key])] or [(who, [])]
        tracks = [(n if i == 0 else f"{n} +{i}", lane) for i, (n, lane) in enumerate(tracks)]
        mlanes = _lanes(msgs[key])
        short = who.split(" (")[0]
        tracks += [(f"{short} messages" + (f" {i + 1}" if i else ""), lane)
                   for i, lane in enumerate(mlanes)]
        for i, (name, lane) in enumerate(tracks):
            tid += 1
            if i == 0:
                op_tid[key] = tid
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
            for s in lane:
                ev = {"ph": "X", "name": s.name, "cat": "message" if "dir" in s.args else "op",
                      "pid": pid, "tid": tid, "ts": us(s.start),
                      "dur": round(us(s.end) - us(s.start), 3), "args": s.args}
                if s.cname:
                    ev["cname"] = s.cname
                events.append(ev)
    for t, ev in instants:
        key = ev.pop("_key")
        ev["tid"] = op_tid[key]
        ev["ts"] = us(t)
        events.append(ev)
    other = {"producer": "cadence doctor", "job": dumps[0].job if dumps else None,
             "time_origin_unix_ns": t0,
             "clock": "rank 0's clock (each rank's measured offset applied), µs since "
                      "the earliest event"}
    if verdict is not None:
        other["verdict"] = verdict.to_json()
        if verdict.since is not None:
            events.append({"ph": "i", "s": "g", "name": f"verdict: {verdict.cls}",
                           "pid": 0, "tid": 0, "ts": us(int(round(verdict.since * 1e9))),
                           "args": {"verdict": verdict.headline,
                                    "at": "when the first rank entered the operation"}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write(path: str, dumps: list[Dump], verdict=None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(build(dumps, verdict), f, ensure_ascii=False)
