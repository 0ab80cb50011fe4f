"""The planner's wire protocol, both ends: JSON objects, one per line, over a
stream socket (a Unix socket path, reachable from every network namespace
of the machine, or TCP). Every request carries the cluster's token; the
answer to a request is one line; the planner may also send events on a
job's connection at any time (lines with `"event"`).

Requests (`{"v": 1, "token": T, "op": OP, ...}`):

- `hello` {job}: opens the job's lease, held as long as this connection
  stays open; answers {ok, planner, racks, spines, excluded}.
- `plan` {job, connections: [{id, src, dst, dport, streams, weight, back_weight,
  notify}]}: a path for every stream of every connection: answers {ok, paths: [{id, streams:
  [{spine, sports}]}]}: the spine (None inside a rack) and source ports
  whose 5-tuple (src, dst, tcp, sport, dport) the fabric hashes onto it,
  best first (a port may be busy on the host: the next one lands there too).
  `weight` (default 1) is what each stream counts in the uplinks' balance:
  a library asks 0 for a link it makes for small messages (a barrier's),
  which is placed but not counted. `back_weight` (default: `weight`) is
  what each stream counts from dst to src (the same TCP connection's
  other direction, which the fabric hashes apart): 0 for a link whose
  data flows one way (a ring's link to the next rank). `notify` (default: this job, naming
  the connection `id` and its streams 0..streams-1) says whom to tell
  when a stream is held or released, and by what names: [{job, peer,
  streams}], one entry per end of the connection (a library names the
  link by its peer's rank, and the connection's stream k by its stream
  number on that link; the accepting end learns of the connection only
  this way).
- `unplan` {ids}: forgets those connections of the job (a library asks it
  for a link it dialed and then dropped: its peer's link won); the streams
  they named are then held or released as the connections kept that name
  them say.
- `release` {job}: forgets the job's streams (closing the connection does).
- `status`: {ok, jobs, uplinks: [{rack, spine, up, down, state}], excluded}.

Events: `{"event": "links", "changed": [{rack, spine, state: "down"|"up"}],
"hold": [{peer, streams}], "release": [{peer, streams}], "why": text}`:
the job stops using the streams in `hold` and uses those in `release`
again, named as its `notify` entries said. With `changed` non-empty,
uplinks changed (a held stream crosses one that is down; a released one
crosses only live ones, or its connection now carries there); with it
empty, the planner's layout moved (`why` says how: a new connection's
streams standing by while it runs on its home spine, a rack end that
filled or emptied, streams held before a lease opened): no failure
(layout.py).
`{"event": "queued", "ahead": N}`: the request sent has waited a second
or more behind N others (the planner answers one at a time); sent every
second until it is answered. A client waits on while it hears this, up
to QUEUED_AT_MOST in all; a planner that says nothing for its timeout is
given up.

Errors are `{"ok": false, "error": "<one line>"}`; a malformed line or a
wrong token also closes the connection.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

VERSION = 1
#: Longest request line read (a plan of thousands of connections fits).
MAX_LINE = 16 << 20
#: How long a request may wait in all while the planner says it is queued
#: (the library's `QUEUED_AT_MOST` too).
QUEUED_AT_MOST = 30.0


class PlannerError(RuntimeError):
    """The planner refused a request, or cannot be reached; one line."""


@dataclass(frozen=True)
class Address:
    """`unix:PATH` or `tcp:HOST:PORT`."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    @staticmethod
    def parse(text: str) -> Address:
        if text.startswith("unix:") and len(text) > 5:
            return Address("unix", path=text[5:])
        if text.startswith("tcp:"):
            host, _, port = text[4:].rpartition(":")
            if host and port.isdigit():
                return Address("tcp", host=host, port=int(port))
        raise ValueError(f"planner address {text!r}: expected unix:PATH or tcp:HOST:PORT")

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp:{self.host}:{self.port}"


def read_token(path: str) -> str:
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise PlannerError(f"cannot read the planner token {path}: {e.strerror}") from None
    if not token:
        raise PlannerError(f"the planner token file {path} is empty")
    return token


def write_token(path: str) -> str:
    """A new random token, readable by its owner only."""
    import secrets

    token = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def encode(obj: dict) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


class Client:
    """One connection to the planner (a job's lease while it is open)."""

    def __init__(self, address: str, token: str, timeout: float = 5.0):
        self.address = Address.parse(address)
        self.token = token
        self.timeout = timeout
        try:
            if self.address.kind == "unix":
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(self.address.path)
            else:
                self.sock = socket.create_connection((self.address.host, self.address.port),
                                                     timeout=timeout)
        except OSError as e:
            raise PlannerError(f"planner at {self.address} unreachable: {e}") from None
        self.buf = bytearray()
        #: Events that arrived while waiting for an answer.
        self.events: list[dict] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self, timeout: float) -> dict | None:
        """The next line as an object; None when `timeout` s pass first."""
        self.sock.settimeout(timeout)
        while b"\n" not in self.buf:
            try:
                got = self.sock.recv(1 << 16)
            except TimeoutError:
                return None
            if not got:
                raise PlannerError(f"planner at {self.address} closed the connection")
            self.buf += got
            if len(self.buf) > MAX_LINE:
                raise PlannerError(f"planner at {self.address} sent a line over {MAX_LINE} B")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return json.loads(line)

    def request(self, op: str, **fields) -> dict:
        try:
            self.sock.sendall(encode({"v": VERSION, "token": self.token, "op": op, **fields}))
            until = time.monotonic() + QUEUED_AT_MOST
            while True:
                msg = self._line(self.timeout)
                if msg is None:
                    raise PlannerError(f"planner at {self.address} did not answer {op!r} "
                                       f"within {self.timeout:g}s")  # fmt: skip
                if msg.get("event") == "queued":
                    if time.monotonic() > until:
                        raise PlannerError(f"planner at {self.address}: {op!r} still queued "
                                           f"after {QUEUED_AT_MOST:g}s, {msg.get('ahead')} "
                                           f"ahead")  # fmt: skip
                    continue
                if "event" not in msg:
                    break
                self.events.append(msg)
        except (OSError, ValueError) as e:
            raise PlannerError(f"planner at {self.address}: {e}") from None
        if not msg.get("ok"):
            raise PlannerError(f"planner: {msg.get('error', 'refused')}")
        return msg

    def next_event(self, timeout: float) -> dict | None:
        """The next event pushed to this connection, or None after `timeout` s."""
        if self.events:
            return self.events.pop(0)
        try:
            return self._line(timeout)
        except (OSError, ValueError) as e:
            raise PlannerError(f"planner at {self.address}: {e}") from None
