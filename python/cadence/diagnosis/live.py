"""Live diagnosis: a watchdog that works out a verdict while the job is still
stuck, long before the operation's deadline.

One daemon thread per process watches every live communicator (weakly: it
keeps none alive). Once a second it asks the core where each stands
(`_progress()`: the oldest running operation and for how long), and reads one
counter from the job's Store. Nothing runs on the collective path.

A round of diagnosis:

1. A rank whose operation has run for `CADENCE_DIAG_AFTER` seconds (default
   30, and at most half the operation deadline) opens a round: it increments
   `<prefix>/diag/round` in the Store and becomes the round's coordinator.
2. Every rank's watchdog sees the counter move (within a tick) and publishes a
   summary under `<prefix>/diag/<round>/s/<rank>`: its flight recorder (the
   last operations with their live messages, the dump format) plus where its
   Python threads are (faulthandler style). A rank stuck in compute publishes
   too — its watchdog thread still runs — so the verdict can say where it is.
3. The coordinator waits for every summary (at most `gather` seconds; a
   frozen process publishes nothing, which the classifier reads as "left no
   dump"), runs the same classifier as `cadence doctor`, and publishes the
   verdict under `<prefix>/diag/<round>/verdict`.
4. Every rank logs the verdict once, as one line on the `cadence` logger
   (stderr unless the application configured logging), and keeps it on the
   communicator: a `CommError` raised later carries it as `e.diagnosis`.

The Store is the job's own (cadence's, which rank 0 serves; torchrun's agent
store; or one the application passed): summaries never travel on the data
path. A cadence Store or TCPStore gets a client connection of its own here,
with a short timeout, so a watchdog never holds up the application's use of
the Store. When the Store lives in a process that is itself frozen (served by
a stopped rank 0), no round can complete; the post-mortem `cadence doctor`
still works from the dumps.

`CADENCE_DIAG_AFTER=0` (or `off`) turns the watchdog off.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import threading
import time
import traceback
import weakref
import zlib
from dataclasses import dataclass, field

from cadence.diagnosis.dumps import STUCK_REASON
from cadence.diagnosis.verdict import VerdictClass

log = logging.getLogger("cadence")

#: Default soft deadline (seconds) before a running operation is diagnosed.
DEFAULT_DIAG_AFTER = 30.0
#: Default length of a slowness window (seconds).
DEFAULT_WINDOW_S = 10.0
#: Operations kept in a summary (the stuck one, the ones before it on slower
#: ranks, and enough history to find a rank's last completed operation).
SUMMARY_OPS = 64
#: Operations before its oldest running one a waiting rank's summary keeps
#: (summary()): a rank that completed the stuck operation shows it.
WAITING_OPS = 2
#: Operations a slowness window looks at, at most (the newest): enough for
#: the slowness classifier's evidence (10 collectives, 8 timed receives per
#: unit); a rank's summary of a window, and rank 0's work per host, grow
#: with it (docs/diagnosis.md, "Slowness at scale").
WINDOW_OPS = 128
#: A round's verdict is waited for this much longer than its gather time
#: before a rank stops expecting it.
VERDICT_SLACK_S = 5.0
#: How long the watchdog leaves a communicator alone after a failed Store
#: call when nothing is stuck (most often the job is ending) ...
STORE_BACKOFF_S = 30.0
#: ... and while an operation runs: the Store may be gone because the
#: network is cut, and the hang must still be named in time.
STORE_RETRY_S = 1.0
#: A watchdog Store call still running after this long has lost the Store.
#: A TCPStore client's request times out after 5 s (`_store_client`), but
#: once its connection is cut the client's retry blocks for minutes (seen
#: with torch 2.x on a downed link), so the sentinel does not wait for it.
STORE_CALL_LIMIT_S = 6.0


def diag_after(timeout: float) -> float | None:
    """The soft deadline for a communicator whose operations time out after
    `timeout` seconds: `CADENCE_DIAG_AFTER` (default 30), at most half of
    `timeout`; None when turned off."""
    raw = os.environ.get("CADENCE_DIAG_AFTER", "").strip().lower()
    if raw in ("0", "off", "no", "false"):
        return None
    if raw:
        try:
            after = float(raw)
        except ValueError:
            raise ValueError(f"CADENCE_DIAG_AFTER={raw!r} is not a number of seconds "
                             "(or 0/off)") from None
        if after <= 0:
            return None
    else:
        after = DEFAULT_DIAG_AFTER
    return min(after, timeout / 2) if timeout > 0 else after


def diag_window() -> float | None:
    """Seconds per slowness window (`CADENCE_DIAG_WINDOW`, default 10);
    None when off (0, or the watchdog is off)."""
    raw = os.environ.get("CADENCE_DIAG_WINDOW", "").strip().lower()
    if raw in ("0", "off", "no", "false"):
        return None
    try:
        win = float(raw) if raw else DEFAULT_WINDOW_S
    except ValueError:
        raise ValueError(f"CADENCE_DIAG_WINDOW={raw!r} is not a number of seconds "
                         "(or 0/off)") from None
    return win if win > 0 else None


def python_stacks(skip_thread: int | None = None) -> str:
    """Every Python thread's stack, most recent call first, main thread
    first — what faulthandler prints, taken with the GIL (so it is exact)."""
    frames = sys._current_frames()
    main = threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident in sorted(frames, key=lambda i: (i != main, i)):
        if ident == skip_thread:
            continue
        kind = "Current thread" if ident == main else "Thread"
        out.append(f"{kind} 0x{ident:016x} ({names.get(ident, '?')}, most recent call first):")
        for fs in reversed(traceback.extract_stack(frames[ident])):
            out.append(f'  File "{fs.filename}", line {fs.lineno} in {fs.name}')
        out.append("")
    return "\n".join(out)


def summary(core, skip_thread: int | None = None, waiting: bool = False) -> bytes:
    """This rank's summary for a round, compressed: its dump of the last
    SUMMARY_OPS operations, their messages as runs (dumps.compact_messages),
    plus its Python stacks. Its size does not grow with the job:

    - `waiting` (a collective of this rank has run half the soft deadline):
      only the operations from WAITING_OPS before its oldest running one on,
      and no stacks: the classifier reads of such a rank the stuck operation
      and whether it completed the ones before; its stack is cadence's wait;
    - every rank listed (`peers`) and the ring order only in rank 0's (the
      core's `dump_round`; the coordinator adds its own list when rank 0
      sent none: `verdict_of`).

    A rank that is not waiting (stuck in its own code, or in another
    communicator) sends its history and stacks: the verdict names it with
    its last completed operation and where it is."""
    from cadence.diagnosis.dumps import compact_messages

    d = json.loads(core.dump_round(SUMMARY_OPS))
    ops = d.get("ops") or []
    if waiting:
        first = next((i for i, o in enumerate(ops) if o.get("status") == "running"), len(ops))
        ops = ops[max(0, first - WAITING_OPS):]
    for o in ops:
        if o.get("messages"):
            o["messages"] = compact_messages(o["messages"])
    d["ops"] = ops
    if not waiting:
        d["stack"] = python_stacks(skip_thread)
    return zlib.compress(json.dumps(d).encode(), 6)


def window_summary(core, start_unix: float, end_unix: float) -> bytes | None:
    """This rank's summary (summary.RankSummary) of its operations that
    completed within [start, end) (wall clock), the newest WINDOW_OPS; None
    when there were none. The core keeps only the timed receives the
    slowness classifier reads before it serializes; the summary groups them
    per collective and sender, so its size does not grow with the job."""
    from cadence.diagnosis.dumps import parse
    from cadence.diagnosis.summary import MIN_MSG_BYTES, encode_rank, rank_summary

    d = core.dump_window(int(start_unix * 1e9), int(end_unix * 1e9), WINDOW_OPS, MIN_MSG_BYTES)
    return None if d is None else encode_rank(rank_summary(parse(d, "this rank's window")))


def verdict_of(summaries: dict[int, bytes], hang_after: float,
               reach: dict[str, bool | None] | None = None,
               peers: list | None = None) -> dict:
    """The classifier over the summaries that arrived (rank → compressed
    dump); a rank that sent none is one that left no dump. `reach`: host →
    whether a probe reached it (hosts none of whose ranks answered).
    `peers`: every rank's {rank, host, pid, addr}, for when rank 0's
    summary (the one that lists them) did not arrive."""
    from cadence.diagnosis.classify import diagnose
    from cadence.diagnosis.dumps import parse

    dumps = [parse(zlib.decompress(b).decode(), f"rank {r}'s summary")
             for r, b in sorted(summaries.items())]
    if peers and dumps and not any(len(d.peers) >= d.nranks for d in dumps):
        dumps[0].peers = list(peers)
    v = diagnose(dumps, hang_after=hang_after, reach=reach)
    out = v.to_json()
    out["text"] = v.text()
    out["summaries"] = sorted(summaries)
    return out


class _TimedStore:
    """A Store whose calls say since when one has been running (`busy_since`,
    None when idle): the sentinel reads it to tell a lost Store while the
    watchdog thread is blocked in a call."""

    def __init__(self, store):
        self._store = store
        self.busy_since: float | None = None
        self.host = getattr(store, "host", None)
        self.port = getattr(store, "port", None)

    def __getattr__(self, name):
        fn = getattr(self._store, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):
            self.busy_since = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.busy_since = None

        return call


def _store_client(store):
    """A client of the job's Store for the watchdog, with a short timeout:
    for cadence's Store a handle on the rank's one connection (the server,
    rank 0, holds one per rank; after set-up the application's requests are
    few and short); for a TCPStore a connection of its own (so it never
    blocks the application's calls, nor for long); else the store itself.

    A TCPStore client connects with the application's own store timeout (a
    loaded host once took over 5 s to accept it, which failed `init`), and
    only then shortens the timeout of its requests."""
    from datetime import timedelta

    from cadence._core import Store

    if isinstance(store, Store):
        return store.client(5.0)
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: no torch Store either
        return store
    if isinstance(store, dist.TCPStore):
        client = dist.TCPStore(store.host, store.port, is_master=False,
                               timeout=max(store.timeout, timedelta(seconds=5)),
                               wait_for_workers=False)
        client.set_timeout(timedelta(seconds=5))
        return client
    return store


@dataclass
class _Round:
    number: int
    coordinator: bool
    #: Coordinator: when to stop waiting for summaries.
    gather_until: float
    #: Everyone: when to stop waiting for the verdict.
    verdict_until: float


@dataclass
class _Watched:
    #: None until the communicator exists (`Watchdog.watch`).
    comm: weakref.ref | None
    store: object
    prefix: str
    rank: int
    size: int
    after: float
    gather: float
    seen_round: int = 0
    #: The (operations started, seq) of the operation a round was opened for.
    opened_for: tuple | None = None
    last_round_at: float = 0.0
    rounds: dict = field(default_factory=dict)
    logged: set = field(default_factory=set)
    #: total_ops when the current verdict was set (to clear it on recovery).
    verdict_at_ops: int | None = None
    failures: int = 0
    #: After a failed Store call: when to try again.
    resume_at: float = 0.0
    #: Slowness windows: their length (None: off), the last one published,
    #: the last one reduced (a host's leader), the last one judged (rank 0,
    #: which keeps the SlowWatch), and the slowness verdicts seen so far
    #: (their counter in the Store).
    window: float | None = None
    win_published: int = 0
    win_reduced: int = 0
    win_judged: int = 0
    #: The lowest rank of this rank's host (which reduces the host's
    #: window summaries), the host's ranks, and every host's leader; read
    #: once from the core.
    leader: int | None = None
    host_ranks: list = field(default_factory=list)
    leaders: list = field(default_factory=list)
    #: The host's relay of the Store's counters (None: alone on its host).
    relay: _Relay | None = None
    slow_watch: object = None
    slow_seen: int = 0
    slow_logged: tuple | None = None
    #: The rank of this communicator that serves the Store in its own
    #: process (rank 0 of a plain MASTER_ADDR job), if any.
    store_rank: int | None = None
    #: Every rank's {rank, host, pid, addr}, read once from the core.
    peers: list | None = None
    #: The (operations started, seq) this rank dumped for as stuck, and
    #: the file (removed again if the operation recovers).
    dumped_for: tuple | None = None
    dumped_path: str | None = None
    #: The (operations started, seq) a lost Store was reported for.
    store_lost_for: tuple | None = None
    #: Guards the fields above: the sentinel thread writes them too.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def key(self, *parts) -> str:
        return "/".join([self.prefix, "diag", *map(str, parts)])


class Watchdog:
    """The process's watchdog thread (see the module comment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: list[_Watched] = []
        self._thread: threading.Thread | None = None
        self._sentinel: threading.Thread | None = None
        self._clients: dict = {}
        #: Cleared by pause(): the thread sleeps through its ticks.
        self._enabled = threading.Event()
        self._enabled.set()
        #: Set at interpreter exit: the thread ends after its current tick.
        self._stop = threading.Event()
        #: What the watchdog itself has cost this process: ticks that did
        #: work, and the thread's CPU time in them (native calls included).
        self.ticks = 0
        self.cpu_s = 0.0

    def prepare(self, store, prefix: str, rank: int, size: int, timeout: float,
                store_rank: int | None = None, fresh: bool = False) -> _Watched | None:
        """The Store work of watching a communicator that is being set up:
        its client connection and the counters it starts from. Called
        before the ranks' set-up ends (its closing barrier), so that however
        long this takes (a loaded host once took over 5 s to accept the
        connection) no rank reaches its first operation that much after its
        peers, whose deadline runs meanwhile: a first allreduce once timed
        out that way, every peer blaming rank 0 for a message it had not
        yet had the chance to send. None when the watchdog is off.

        `fresh`: no process ever used `prefix` before (a split's, named
        after its parent's id), so its counters are 0 without asking the
        store: a split makes no store round trip."""
        after = diag_after(timeout)
        if after is None:
            return None
        # One client per TCPStore server, shared by its communicators; other
        # stores (prefixed, file, hash) are used as they are.
        port = getattr(store, "port", None)
        key = (getattr(store, "host", None), port) if isinstance(port, int) else None
        with self._lock:
            client = self._clients.get(key) if key is not None else None
            if client is None:
                client = _TimedStore(_store_client(store))
                if key is not None:
                    self._clients[key] = client
        gather = min(5.0, max(1.0, after / 2))
        w = _Watched(None, client, prefix, rank, size, after, gather, store_rank=store_rank)
        w.window = diag_window()
        if w.window:
            w.win_published = w.win_reduced = w.win_judged = int(time.time() // w.window)
        try:
            if not fresh:
                w.seen_round = int(client.add(w.key("round"), 0))
                w.slow_seen = int(client.add(w.key("slow"), 0))
        except Exception:  # noqa: BLE001 - a watchdog must never break init
            w.seen_round = 0
        # The threads start here, while the set-up still waits for every
        # rank: `Thread.start` waits until the new thread runs, which on a
        # crowded host (64 ranks on 2 cores, each starting its own) took a
        # rank 25 ms a thread after its peers were done and waiting for it.
        self._start_threads()
        return w

    def _start_threads(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="cadence-diagnosis",
                                                daemon=True)
                self._thread.start()
                self._sentinel = threading.Thread(target=self._sentinel_loop,
                                                  name="cadence-diagnosis-sentinel", daemon=True)
                self._sentinel.start()

    def watch(self, comm, w: _Watched | None) -> None:
        """Starts watching `comm`, set up by `prepare` (None: off)."""
        if w is None:
            return
        w.comm = weakref.ref(comm)
        with self._lock:
            self._watched.append(w)
        self._start_threads()

    def unwatch(self, comm) -> None:
        with self._lock:
            gone = [w for w in self._watched if w.comm() in (None, comm)]
            self._watched = [w for w in self._watched if w not in gone]
        for w in gone:
            if w.relay is not None and w.rank == w.leader:
                w.relay.remove()

    def _tick_s(self) -> float:
        with self._lock:
            afters = [w.after for w in self._watched]
        return min([1.0] + [a / 4 for a in afters])

    def _loop(self) -> None:
        while not self._stop.wait(self._tick_s()):
            if not self._enabled.is_set():
                continue
            cpu0 = time.thread_time()
            self._tick()
            self.cpu_s += time.thread_time() - cpu0
            self.ticks += 1

    def _sentinel_loop(self) -> None:
        """The sentinel: no Store call ever, so nothing it does can block on
        the network. Once a tick, for every communicator whose operation is
        past the soft deadline: its dump (CADENCE_DUMP_DIR) is written, and
        if the watchdog thread has been inside one Store call for
        STORE_CALL_LIMIT_S, the lost Store is reported (`_store_lost`)."""
        while not self._stop.wait(self._tick_s()):
            if not self._enabled.is_set():
                continue
            with self._lock:
                watched = list(self._watched)
            for w in watched:
                comm = w.comm() if w.comm is not None else None
                if comm is None:
                    continue
                try:
                    total, running = comm._c._progress()
                    if running is None or running[2] < w.after:
                        continue
                    self._dump_stuck(w, comm, total, running)
                    since = getattr(w.store, "busy_since", None)
                    if since is not None and time.monotonic() - since >= STORE_CALL_LIMIT_S:
                        self._store_lost(w, comm, TimeoutError(
                            f"a Store call has not returned for {time.monotonic() - since:.0f}s"))
                except Exception as e:  # noqa: BLE001 - the sentinel must survive
                    log.debug("cadence: diagnosis sentinel, comm %s: %s", comm.id, e)
                del comm

    def stop(self, timeout: float) -> None:
        """Ends the thread and waits for it (at most `timeout` s). At exit a
        daemon thread still inside a Store call (a C++ call that released
        the GIL) would be killed as it takes the GIL back, which aborts the
        process (SIGABRT from a forced unwind through C++); so it is
        stopped before the interpreter finalizes."""
        self._stop.set()
        for t in (self._sentinel, self._thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)
        with self._lock:
            watched = list(self._watched)
        for w in watched:
            if w.relay is not None and w.rank == w.leader:
                w.relay.remove()

    def _tick(self) -> None:
        with self._lock:
            self._watched = [w for w in self._watched if w.comm() is not None]
            watched = list(self._watched)
        for w in watched:
            comm = w.comm()
            if comm is None or time.monotonic() < w.resume_at:
                continue
            try:
                self._check(w, comm)
                w.failures = 0
            except Exception as e:  # noqa: BLE001 - the watchdog must survive
                # Most often the Store is gone: the job is ending (back off,
                # since torch prints every failed Store call), or the network
                # is cut while an operation waits (name that without it).
                w.failures += 1
                log.debug("cadence: live diagnosis of comm %s: %s", comm.id, e)
                running = comm._c._progress()[1]
                w.resume_at = time.monotonic() + (STORE_RETRY_S if running is not None
                                                  else STORE_BACKOFF_S)
                try:
                    self._store_lost(w, comm, e)
                except Exception as e2:  # noqa: BLE001
                    log.debug("cadence: live diagnosis without the Store: %s", e2)
            del comm

    def _check(self, w: _Watched, comm) -> None:
        core = comm._c
        now = time.monotonic()
        total, running = core._progress()
        store = w.store

        # Rounds opened elsewhere (or by us): publish our summary for each.
        current, slow = self._counters(w, comm, running)
        for r in range(max(w.seen_round + 1, current - 2), current + 1):
            self._publish(w, core, r, coordinator=False, now=now)
        w.seen_round = max(w.seen_round, current)

        # Our own operation is past the soft deadline: open a round, unless
        # one ran recently (another rank opened it for the same hang).
        if running is not None:
            seq, collective, secs = running
            mine = (total, seq)
            if secs >= w.after and w.opened_for != mine and now - w.last_round_at >= w.after:
                w.opened_for = mine
                # Every rank stuck in this operation gets here within a
                # tick of the others: the first to claim it opens the round.
                claim = store.compare_set(w.key("claim", collective, seq), "", str(w.rank))
                if bytes(claim).decode() == str(w.rank):
                    r = int(store.add(w.key("round"), 1))
                    w.seen_round = max(w.seen_round, r)
                    self._publish(w, core, r, coordinator=True, now=now)

        for r, rnd in list(w.rounds.items()):
            if rnd.coordinator and rnd.gather_until is not None:
                self._coordinate(w, rnd, now)
            vkey = w.key(r, "verdict")
            if store.check([vkey]):
                verdict = json.loads(store.get(vkey).decode())
                self._deliver(w, core, verdict, total)
                del w.rounds[r]
            elif now > rnd.verdict_until:
                del w.rounds[r]

        if w.window:
            try:
                self._windows(w, comm, slow)
            except Exception as e:  # noqa: BLE001 - slowness must not stop hang watching
                log.debug("cadence: slowness window of comm %s: %s", comm.id, e)

        # Recovered (the stuck operation finished and more ran): forget the
        # verdict, so a later error does not carry a stale one.
        if w.verdict_at_ops is not None and total >= w.verdict_at_ops + 2 and (
                running is None or running[2] < w.after):
            core._set_diagnosis(None)
            w.verdict_at_ops = None
            _metrics_verdict(w, {"class": str(VerdictClass.HEALTHY), "verdict": "recovered"})
        with w.lock:
            recovered = w.dumped_for is not None and total > w.dumped_for[0] and (
                running is None or running[2] < w.after)
            path = w.dumped_path if recovered else None
            if recovered:
                w.dumped_for = w.dumped_path = None
        if recovered:
            _remove_stuck_dump(path)

    def _dump_stuck(self, w: _Watched, comm, total: int, running: tuple) -> None:
        """Writes this rank's dump into CADENCE_DUMP_DIR (if set) once per
        stuck operation, as soon as it is past the soft deadline: a
        post-mortem has it even if the process is killed before the
        operation's deadline, or the Store is out of reach. The dump of the
        operation's failure later replaces it; if the operation completes,
        it is removed."""
        seq, collective, secs = running
        with w.lock:
            if w.dumped_for == (total, seq):
                return
            w.dumped_for = (total, seq)
        where = os.environ.get("CADENCE_DUMP_DIR")
        if not where:
            return
        try:
            w.dumped_path = comm._c.dump(where, f"{STUCK_REASON} {collective} #{seq} ran "
                                                f"{secs:.1f}s (CADENCE_DIAG_AFTER={w.after:g})")
        except OSError as e:
            log.warning("cadence: could not write a dump into %s: %s", where, e)

    def _store_lost(self, w: _Watched, comm, err: Exception) -> None:
        """The Store failed while an operation is stuck past the soft
        deadline: no round can be held. Says so at once, with which side
        of a cut this rank is on: it probes the Store's host and the hosts
        it waits on (reach.py). Once per stuck operation."""
        core = comm._c
        total, running = core._progress()
        if running is None or running[2] < w.after:
            return
        self._dump_stuck(w, comm, total, running)
        seq, collective, _secs = running
        with w.lock:
            if w.store_lost_for == (total, seq):
                return
            w.store_lost_for = (total, seq)
        from cadence.diagnosis import store_lost

        verdict = store_lost.verdict(
            comm_id=comm.id, rank=w.rank, peers=_peers(w, comm), store=w.store,
            store_rank=w.store_rank, messages=store_lost.running_messages(core), err=err,
            seq=seq, collective=collective)
        self._deliver(w, core, verdict, total)

    def _counters(self, w: _Watched, comm, running) -> tuple[int, int]:
        """The Store's round and slowness counters: read by one rank a host,
        its leader, which passes them to the others through a file on the
        host (`_Relay`). A rank reads them itself when its leader has not
        passed them on for a few ticks (gone, stuck, or cut from the Store),
        and while its own operation has run half the soft deadline: in a
        hang it hears of the round within a tick, whatever its leader."""
        _layout(w, comm)
        relay = w.relay
        waiting = running is not None and running[2] >= w.after / 2
        if relay is not None and w.rank != w.leader and not waiting:
            got = relay.read(max_age=3 * self._tick_s())
            if got is not None:
                return got
        current = int(w.store.add(w.key("round"), 0))
        slow = int(w.store.add(w.key("slow"), 0)) if w.window else 0
        if relay is not None and w.rank == w.leader:
            relay.write(current, slow)
        return current, slow

    def _windows(self, w: _Watched, comm, slow: int) -> None:
        """Slowness: every rank publishes its summary of each finished
        window; each host's leader reduces its ranks' into the host's
        summary; rank 0 judges the host summaries with a SlowWatch (a
        verdict must persist over windows) and publishes a verdict when it
        changes; every rank logs it. A summary's size, and the work of a
        leader, do not grow with the job; rank 0 reads one per host."""
        store, win, core = w.store, w.window, comm._c
        _layout(w, comm)
        # Ranks publish a window within a tick of its end, leaders reduce
        # within a tick of their ranks: each waits that long, and half a
        # window at least, before it goes on without the late ones.
        grace = max(0.5 * win, 1.5 * self._tick_s())
        current = int(time.time() // win)
        if current - 1 > w.win_published:
            k = current - 1
            w.win_published = k
            blob = window_summary(core, k * win, (k + 1) * win)
            if blob is not None:
                store.set(w.key("win", k, "r", w.rank), blob)
            store.add(w.key("win", k, "h", w.leader, "count"), 1)
        if w.rank == w.leader:
            for k in range(w.win_reduced + 1, current):
                count = int(store.add(w.key("win", k, "h", w.rank, "count"), 0))
                if count < len(w.host_ranks) and time.time() < (k + 1) * win + grace:
                    break  # wait a little for the host's slower ranks
                self._reduce_window(w, k)
                w.win_reduced = k
        if w.rank == 0:
            for k in range(w.win_judged + 1, current):
                count = int(store.add(w.key("win", k, "count"), 0))
                if count < len(w.leaders) and time.time() < (k + 1) * win + 2 * grace:
                    break  # wait a little for the slower hosts
                self._judge_window(w, k)
                w.win_judged = k
        if slow > w.slow_seen:
            w.slow_seen = slow
            self._deliver_slow(w, core, json.loads(store.get(w.key("slow", slow)).decode()))

    def _reduce_window(self, w: _Watched, k: int) -> None:
        """A host's leader: its ranks' summaries of window k into the
        host's (none when no rank had anything in the window)."""
        from cadence.diagnosis.summary import decode_rank, encode_host, host_summary

        ranks = _take(w, k, "r", w.host_ranks, decode_rank, "window")
        _delete(w.store, w.key("win", k, "h", w.rank, "count"))
        if ranks:
            w.store.set(w.key("win", k, "host", w.rank), encode_host(host_summary(ranks)))
        w.store.add(w.key("win", k, "count"), 1)

    def _judge_window(self, w: _Watched, k: int) -> None:
        from cadence.diagnosis.slow import SlowWatch
        from cadence.diagnosis.summary import decode_host

        if w.slow_watch is None:
            w.slow_watch = SlowWatch()
        hosts = _take(w, k, "host", w.leaders, decode_host, "host window")
        _delete(w.store, w.key("win", k, "count"))
        if sum(len(h.ranks) for h in hosts) < w.size:
            return  # a rank with nothing in this window (or late): no evidence
        before = w.slow_watch.current
        v = w.slow_watch.feed(hosts)
        if _ident(v) == _ident(before):
            return
        out = v.to_json() if v is not None else {"class": str(VerdictClass.HEALTHY),
                                                 "verdict": "slowness cleared"}
        if v is not None:
            out["text"] = v.text()
        out["window"] = [k * w.window, (k + 1) * w.window]
        n = int(w.store.add(w.key("slow"), 1))
        w.store.set(w.key("slow", n), json.dumps(out))

    def _deliver_slow(self, w: _Watched, core, verdict: dict) -> None:
        ident = (verdict.get("class"), tuple(verdict.get("ranks") or ()),
                 tuple(verdict.get("hosts") or ()), tuple(map(tuple, verdict.get("links") or ())))
        if ident == w.slow_logged:
            return
        w.slow_logged = ident
        _metrics_verdict(w, verdict)
        if verdict.get("class") == VerdictClass.HEALTHY:
            log.info("cadence: comm %s: %s", w.prefix, verdict.get("verdict"))
            return
        log.warning("cadence: %s", verdict.get("verdict"))
        _notify(w, verdict)

    def _publish(self, w: _Watched, core, r: int, coordinator: bool, now: float) -> None:
        if r in w.rounds or r <= 0:
            return
        running = core._progress()[1]
        waiting = running is not None and running[2] >= w.after / 2
        w.store.set(w.key(r, "s", w.rank), summary(core, threading.get_ident(), waiting))
        w.store.add(w.key(r, "count"), 1)
        w.rounds[r] = _Round(r, coordinator, now + w.gather if coordinator else None,
                             now + w.gather + VERDICT_SLACK_S)
        w.last_round_at = now
        # A CommError raised while the verdict is worked out waits for it,
        # unless this rank already holds a verdict on the hang.
        core._diagnosis_pending(w.gather + VERDICT_SLACK_S)

    def _coordinate(self, w: _Watched, rnd: _Round, now: float) -> None:
        count = int(w.store.add(w.key(rnd.number, "count"), 0))
        if count < w.size and now < rnd.gather_until:
            return
        rnd.gather_until = None
        summaries = {}
        for rank in range(w.size):
            k = w.key(rnd.number, "s", rank)
            if w.store.check([k]):
                summaries[rank] = bytes(w.store.get(k))
        try:
            from cadence.diagnosis.reach import probe_silent

            comm = w.comm()
            peers = _peers(w, comm) if comm is not None else None
            reach = probe_silent(peers, summaries) if peers is not None else None
            verdict = verdict_of(summaries, hang_after=w.after * 0.9, reach=reach, peers=peers)
        except Exception as e:  # noqa: BLE001 - say so rather than go silent
            verdict = {"class": str(VerdictClass.UNKNOWN), "verdict": f"live diagnosis failed: {e}",
                       "text": f"cadence: live diagnosis failed: {e}", "ranks": [],
                       "links": [], "hosts": [], "evidence": [], "op": None,
                       "summaries": sorted(summaries)}
        verdict["round"] = rnd.number
        verdict["coordinator"] = w.rank
        w.store.set(w.key(rnd.number, "verdict"), json.dumps(verdict))
        for rank in summaries:
            _delete(w.store, w.key(rnd.number, "s", rank))

    def _deliver(self, w: _Watched, core, verdict: dict, total: int) -> None:
        core._set_diagnosis(verdict)
        w.verdict_at_ops = total
        _metrics_verdict(w, verdict)
        op = verdict.get("op") or {}
        ident = (verdict.get("class"), op.get("comm"), op.get("seq"))
        with w.lock:
            if ident in w.logged:
                return
            w.logged.add(ident)
        if verdict.get("class") == VerdictClass.HEALTHY:
            log.info("cadence: %s", verdict.get("verdict"))
        else:
            log.warning("cadence: %s", verdict.get("verdict"))
        _notify(w, verdict)


def ask(store, prefix: str = "cadence/init1", gather: float = 5.0,
        hang_after: float = 10.0) -> dict:
    """Asks a running job for a verdict (`cadence doctor --store`): opens a
    round under `prefix` (a communicator's store prefix; `cadence/init1` is
    the first `cadence.init()` of a job), waits up to `gather` seconds for
    every rank's watchdog to publish its summary, classifies, and publishes
    the verdict so that the ranks log it too. Raises LookupError when no
    rank answers (wrong prefix, or the watchdog is off)."""
    def key(*parts):
        return "/".join([prefix, "diag", *map(str, parts)])

    r = int(store.add(key("round"), 1))
    deadline = time.monotonic() + gather
    nranks = None
    summaries: dict[int, bytes] = {}
    while time.monotonic() < deadline:
        if nranks is None and store.check([key(r, "s", 0)]):
            first = bytes(store.get(key(r, "s", 0)))
            nranks = json.loads(zlib.decompress(first).decode())["nranks"]
        if nranks is not None and int(store.add(key(r, "count"), 0)) >= nranks:
            break
        time.sleep(0.1)
    count = int(store.add(key(r, "count"), 0))
    if count == 0:
        raise LookupError(f"no rank answered under {prefix!r} within {gather:g}s (is the "
                          "job running with the live watchdog on, and is the prefix right?)")
    for rank in range(nranks or 4096):
        k = key(r, "s", rank)
        if store.check([k]):
            summaries[rank] = bytes(store.get(k))
        elif nranks is None and len(summaries) >= count:
            break
    verdict = verdict_of(summaries, hang_after=hang_after)
    verdict["round"] = r
    verdict["coordinator"] = "cadence doctor"
    store.set(key(r, "verdict"), json.dumps(verdict))
    return verdict


def _remove_stuck_dump(path: str | None) -> None:
    """Removes a dump written at the soft deadline, unless a later dump
    (a failure's) replaced it."""
    if not path:
        return
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            reason = json.load(f).get("reason", "")
        if reason.startswith(STUCK_REASON):
            os.unlink(path)


def _peers(w: _Watched, comm) -> list:
    """Every rank's {rank, host, pid, addr}, read once from the core."""
    if w.peers is None:
        w.peers = json.loads(comm._c.dump_records(1)).get("peers") or []
    return w.peers


def _take(w: _Watched, k: int, kind: str, ranks: list, decode, what: str) -> list:
    """The summaries of window `k` that `ranks` published under `kind`,
    decoded, each removed from the Store once read."""
    out = []
    for rank in ranks:
        key = w.key("win", k, kind, rank)
        if w.store.check([key]):
            out.append(decode(bytes(w.store.get(key)), f"rank {rank}'s {what}"))
            _delete(w.store, key)
    return out


def _layout(w: _Watched, comm) -> None:
    """This rank's host leader and the host's ranks, every host's leader
    (the lowest rank of each host: rank 0 alone, which judges, asks), and
    the host's relay, once; from the core's topology, O(the host's ranks),
    not a list of every rank."""
    if w.leader is not None:
        return
    core = comm._c
    w.host_ranks = sorted(core.host_ranks()) or [w.rank]
    w.leader = w.host_ranks[0]
    w.leaders = sorted(core.host_leaders()) if w.rank == 0 else [w.leader]
    if len(w.host_ranks) > 1:
        w.relay = _Relay.for_host(w.prefix, comm.id, w.leader, core.peer_pid(w.leader))


class _Relay:
    """A small file on the host (/dev/shm when there is one) where a host's
    leader leaves the Store's round and slowness counters for the host's
    other ranks, with when it read them: the Store sees one reader a host,
    not one a rank. Replaced whole (a rename), so it is never read torn."""

    _FORMAT = struct.Struct("<dqq")

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def for_host(prefix: str, comm_id: str, leader: int, leader_pid: int) -> _Relay:
        where = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        # Named by the communicator and its leader's process: two jobs (or
        # two communicators) on one host never share one.
        name = hashlib.blake2s(f"{prefix}|{comm_id}|{leader}|{leader_pid}".encode(),
                               digest_size=8).hexdigest()
        return _Relay(os.path.join(where, f"cadence-diag-{name}"))

    def write(self, round_: int, slow: int) -> None:
        tmp = f"{self.path}.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(self._FORMAT.pack(time.time(), round_, slow))
            os.replace(tmp, self.path)
        except OSError as e:  # the others read the Store themselves
            log.debug("cadence: diagnosis relay %s: %s", self.path, e)

    def read(self, max_age: float) -> tuple[int, int] | None:
        """The counters, unless older than `max_age` seconds or missing."""
        try:
            with open(self.path, "rb") as f:
                at, round_, slow = self._FORMAT.unpack(f.read(self._FORMAT.size))
        except (OSError, struct.error):
            return None
        return (round_, slow) if time.time() - at <= max_age else None

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _metrics_verdict(w: _Watched, verdict: dict) -> None:
    """The verdict as `cadence_verdict` (CADENCE_METRICS_PORT)."""
    from cadence.diagnosis import metrics

    comm = w.comm()
    if comm is not None:
        metrics.set_verdict(comm.id, str(verdict.get("class")), str(verdict.get("verdict", "")))


def _notify(w: _Watched, verdict: dict) -> None:
    """Calls the listeners (`add_listener`) with a new verdict."""
    for fn in list(_listeners):
        try:
            fn(w.comm(), verdict)
        except Exception as e:  # noqa: BLE001 - a listener must not stop the watchdog
            log.debug("cadence: a verdict listener failed: %s", e)


def _ident(v) -> tuple | None:
    if v is None:
        return None
    return (v.cls, tuple(v.ranks), tuple(v.hosts), tuple(v.links))


def _delete(store, key: str) -> None:
    # Some stores cannot delete; a key left behind is harmless.
    with contextlib.suppress(Exception):
        store.delete_key(key)


_watchdog = Watchdog()
_listeners: list = []
# The longest a tick can take is a Store call's timeout (5 s, _store_client).
atexit.register(_watchdog.stop, 6.0)


def add_listener(fn) -> None:
    """Calls `fn(communicator, verdict dict)` for every new verdict this
    process's watchdog delivers (after it is logged): metrics, a test
    harness, an application's own alerting."""
    _listeners.append(fn)


def prepare(store, prefix: str, rank: int, size: int, timeout: float,
            store_rank: int | None = None, fresh: bool = False) -> _Watched | None:
    """What watching the communicator being set up under `prefix` needs from
    the Store, done while the set-up still waits for every rank (see
    `Watchdog.prepare`); hand the result to `watch`. `store_rank`: the rank
    that serves the Store in its own process, if one does; `fresh`: the
    prefix was never used before (nothing to read from the Store)."""
    return _watchdog.prepare(store, prefix, rank, size, timeout, store_rank, fresh)


def watch(comm, prepared: _Watched | None) -> None:
    """Puts `comm` under the live watchdog (see the module comment)."""
    _watchdog.watch(comm, prepared)


def unwatch(comm) -> None:
    _watchdog.unwatch(comm)


def pause(paused: bool = True) -> None:
    """Stops (or, with `False`, restarts) this process's watchdog ticks: no
    Store calls, no summaries, no windows. `cadence.bench.overhead`
    alternates it inside one job to measure what it costs."""
    if paused:
        _watchdog._enabled.clear()
    else:
        _watchdog._enabled.set()


def cost() -> dict:
    """What the watchdog has cost this process so far: `ticks` that did work
    and `cpu_s`, the watchdog thread's CPU time in them (its Store calls,
    dumps and classifier runs included)."""
    return {"ticks": _watchdog.ticks, "cpu_s": _watchdog.cpu_s}
