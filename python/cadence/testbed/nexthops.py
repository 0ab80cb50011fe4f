"""Asking a leaf's kernel which next hop 5-tuples take, through one `ip
-batch` process kept open per leaf: the path planner asks for every
stream it plans, and a process started per question (a fork, an exec and a
netlink socket each time) cost it more than its own work
(docs/traffic.md, "The planner at scale"). `ip -batch -` answers each
`route get` with one line, flushed, and stops at the first that fails: a
missing answer is that failure, read from its stderr, and the next
question starts a fresh process. So does a namespace made anew under the
same name (a cluster taken down and up again): a process keeps answering
from the namespace it started in.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import threading
import time

from cadence.testbed.iproute import COMMAND_TIMEOUT, TestbedError

#: Questions written before their answers are read: their answers (about
#: 130 bytes each) stay well inside a pipe's 64 KiB, so neither side
#: blocks on the other.
BATCH = 256
_DEV = re.compile(r'"dev":"([^"]*)"')


class Leaf:
    """One leaf's `ip -n NETNS -j -batch -`, started at the first question."""

    def __init__(self, netns: str):
        self.netns = netns
        self.proc: subprocess.Popen | None = None
        self.inode: int | None = None  # of the namespace it answers from
        self.lock = threading.Lock()

    def devs(self, questions: list[str]) -> list[str | None]:
        """The `dev` each `route get` question (a line without its newline)
        is answered with (None: the answer names none)."""
        out: list[str | None] = []
        with self.lock:
            for i in range(0, len(questions), BATCH):
                out += self._ask(questions[i:i + BATCH])
        return out

    def _ask(self, questions: list[str]) -> list[str | None]:
        proc = self._started()
        try:
            proc.stdin.write("".join(q + "\n" for q in questions).encode())
            proc.stdin.flush()
        except OSError:
            pass  # it stopped: what it said is read below
        lines = self._read(proc, len(questions))
        if len(lines) < len(questions):
            self.close()
            why = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise TestbedError(f"asking {self.netns} for next hops failed: "
                               f"{why or 'fewer answers than questions'}")  # fmt: skip
        out = []
        for line in lines:
            m = _DEV.search(line)
            out.append(m.group(1) if m else None)
        return out

    def _started(self) -> subprocess.Popen:
        try:
            inode = os.stat(f"/run/netns/{self.netns}").st_ino
        except OSError:
            inode = None  # `ip` says what is wrong
        if self.proc is not None and (self.proc.poll() is not None or inode != self.inode):
            self.close()
        if self.proc is None:
            self.inode = inode
            self.proc = subprocess.Popen(
                ["ip", "-n", self.netns, "-j", "-batch", "-"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        return self.proc

    def _read(self, proc: subprocess.Popen, count: int) -> list[str]:
        """Up to `count` answer lines; fewer where the process ends or says
        nothing for COMMAND_TIMEOUT."""
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        # poll, not select: a planner holding thousands of connections has
        # descriptors past select's 1024.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        chunks: list[bytes] = []
        lines = 0
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while lines < count:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # nothing yet: wait for it
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1e3):
                    break
                continue
            if not chunk:
                break
            chunks.append(chunk)
            lines += chunk.count(b"\n")
        return b"".join(chunks).decode(errors="replace").splitlines()[:count]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


_leaves: dict[str, Leaf] = {}
_leaves_lock = threading.Lock()


def leaf(netns: str) -> Leaf:
    """The (one) lookup process of leaf namespace `netns`."""
    with _leaves_lock:
        if netns not in _leaves:
            _leaves[netns] = Leaf(netns)
        return _leaves[netns]
