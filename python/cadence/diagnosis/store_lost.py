"""What a rank says by itself when the job's Store is out of reach during a
hang: no round can be held, so the rank probes (reach.py) the Store's host,
the hosts it waits on and a few others, and tells which side of a cut it is
on.

- Every probed host silent: this host is cut off.
- Some silent (the Store's, most often): those hosts are unreachable.
- All answering, the Store's host too: the Store's process is not
  answering. When a rank of this communicator serves the Store in its own
  process (rank 0 under a plain `MASTER_ADDR` job: `cadence.init` without
  torchrun's agent), that rank's process is not running (frozen, stopped,
  swapped out): a Store thread answers even while its rank computes. It is
  named, `comm_hang` as the doctor names a rank that overran its own
  deadline (a process not running is no compute or data-loading problem),
  saying whether data from it arrived in the operation this rank waits in.
  Otherwise the class is `unknown`, saying so.
"""

from __future__ import annotations

import json

from cadence._rendezvous import resolve
from cadence.diagnosis import reach
from cadence.diagnosis.verdict import VerdictClass, ranks_text


def running_messages(core) -> list[dict]:
    """The messages of this rank's newest operation (the running one)."""
    ops = json.loads(core.dump_records(1)).get("ops") or []
    return (ops[-1].get("messages") or []) if ops else []


def store_host(store, peers: list[dict]) -> str | None:
    """The cadence host whose set-up address is the Store's, if any."""
    host = getattr(store, "host", None)
    if not host:
        return None
    try:
        ip = resolve(host)
    except OSError:
        return None
    for p in peers:
        if str(p.get("addr", "")).rpartition(":")[0] == ip:
            return str(p.get("host"))
    return None


def verdict(*, comm_id: str, rank: int, peers: list[dict], store, store_rank: int | None,
            messages: list[dict], err: Exception, seq: int, collective: str) -> dict:
    """The verdict dict (the live verdict's keys, plus `"local": True`) of
    rank `rank`, stuck in `collective` #`seq` with `messages`, whose Store
    call failed with `err`."""
    me = str(peers[rank]["host"]) if rank < len(peers) else "?"
    addrs = reach.host_addrs(peers)
    where_addr = f"{getattr(store, 'host', '?')}:{getattr(store, 'port', '?')}"
    on = store_host(store, peers)
    waits = sorted({int(m["peer"]) for m in messages if m.get("state") in ("pending", "held")})
    # The Store's host, the hosts this rank waits on, then others: enough to
    # tell "I am cut off" from "they are".
    order = [on] + [str(peers[r]["host"]) for r in waits if r < len(peers)] + sorted(addrs)
    picked: dict[str, str] = {}
    for h in order:
        if h and h != me and h in addrs and h not in picked and len(picked) < reach.MAX_PROBES:
            picked[h] = addrs[h]
    answers = reach.probe_hosts(picked)
    store_answers = reach.probe(where_addr) if on is None else answers.get(on)
    heard = sorted(h for h, ok in answers.items() if ok)
    unheard = sorted(h for h, ok in answers.items() if ok is False)
    where = f"the job's Store at {where_addr}" + (f" (on host {on})" if on else "")
    what = f"{collective} #{seq} (comm {comm_id})"
    evidence = [f"rank {rank} ({me}) is in {collective} #{seq} past the soft deadline, and "
                f"{where} does not answer: {err}",
                "probed from here: " + ", ".join(f"{h} {_word(ok)}" for h, ok in answers.items())
                if answers else "no other host to probe"]
    cls, hosts, ranks = VerdictClass.COMM_HANG, [], []
    if unheard and not heard:
        hosts = [me]
        headline = (f"{cls} in {what}: host {me} is cut off: from rank {rank}, {where} and "
                    f"hosts {', '.join(unheard)} do not answer")
    elif unheard:
        hosts = unheard
        headline = (f"{cls} in {what}: host {', '.join(unheard)} unreachable from rank {rank} "
                    f"({me}), while {', '.join(heard)} answer{'s' if len(heard) == 1 else ''}; "
                    f"{where} cannot be reached, so "
                    "no rank can gather a verdict")
    elif store_answers and store_rank is not None and store_rank < len(peers):
        s = peers[store_rank]
        who = f"rank {store_rank} ({s.get('host')}, pid {s.get('pid')})"
        arrived = any(int(m["peer"]) == store_rank and m.get("dir") == "recv"
                      and (m.get("state") == "done" or (m.get("moved") or 0) > 0)
                      for m in messages)
        ranks, hosts = [store_rank], [str(s.get("host"))]
        evidence.append(f"{who} serves the Store in its own process, whose Store thread "
                        "answers even while the rank computes: its process is not running")
        inside = ("data from it arrived in this operation, so it stopped inside it" if arrived
                  else "nothing from it arrived here in this operation: it stopped before "
                  "entering it, or inside before sending here")
        headline = (f"{cls} in {what}: {who} stopped (its process is not running: the Store it "
                    f"serves does not answer, while its host does); {inside}")
    else:
        cls = VerdictClass.UNKNOWN
        headline = (f"live diagnosis of {what} impossible: {where} does not answer"
                    + (" (its host does: the process serving it is stopped or hung)"
                       if store_answers else "")
                    + f"; rank {rank} waits on ranks {ranks_text(waits) or 'none known'}")
    if not ranks:
        ranks = sorted(int(p["rank"]) for p in peers if str(p.get("host")) in hosts)
    return {"class": str(cls), "verdict": headline, "job": None,
            "op": {"comm": comm_id, "seq": seq, "collective": collective, "bytes": None},
            "ranks": ranks, "links": [], "hosts": hosts, "evidence": evidence,
            "text": "cadence: " + headline + "".join("\n  " + e for e in evidence),
            "summaries": [rank], "round": None, "coordinator": rank, "local": True}


def _word(ok: bool | None) -> str:
    return {True: "answers", False: "does not answer"}.get(ok, "cannot be probed")
