"""The planner's probe at start: every leaf–spine uplink measured by flows
that cross it, and those running far below their rate excluded, so no job
is planned onto a bad link (C4P probes its paths the same way).

For each spine m and each rack j: a flow from a host of rack j to a host of
rack j+1 (and of rack j+2 when there are three racks or more), pinned to
spine m by its source port (`fabric.next_spines`), for `seconds`. A flow
j → k over m crosses uplink (j, m) up and (k, m) down. An uplink is bad
when every flow that crossed it ran below `share` of what it should carry
(the slower of the hosts' links and the uplink). With two racks both
uplinks of a spine carry every flow over it, so a bad one takes its
partner with it: either way that spine joins no rack to the other.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from cadence import testbed
from cadence.testbed import fabric

#: A flow below this share of its expected rate marks its uplinks.
BAD_SHARE = 0.5
FLOW_S = 0.4
PROBE_PORT = 29399

_SERVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
got, first, last = 0, None, None
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    now = time.monotonic()
    first = first or now
    last = now
    got += len(b)
print(got, (last or 0) - (first or 0), flush=True)
"""

_CLIENT = r"""
import socket, sys, time
dst, dport, sport, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", sport)); s.connect((dst, dport))
buf = b"x" * (1 << 16); end = time.monotonic() + secs
while time.monotonic() < end:
    s.sendall(buf)
s.close()
"""


@dataclass
class Flow:
    src_rack: int
    dst_rack: int
    spine: int
    rate: float  # bytes/s the receiver saw
    expected: float  # bytes/s it should have seen

    @property
    def bad(self) -> bool:
        return self.rate < BAD_SHARE * self.expected


def probe(cluster: testbed.Cluster, seconds: float = FLOW_S) -> tuple[set, list[Flow]]:
    """The uplinks to exclude, and every flow measured."""
    f = cluster.fabric
    if f is None:
        raise testbed.TestbedError(f"cluster {cluster.name} is not routed")
    first = {r: next(h for h in cluster.hosts if cluster.rack_of[h.index] == r)
             for r in range(cluster.racks)}  # fmt: skip
    steps = [1, 2] if cluster.racks >= 3 else [1]
    expected = min(cluster.rate_bits, cluster.uplink_bits or cluster.rate_bits) / 8
    flows: list[Flow] = []
    for m in range(cluster.spines):
        for j in range(cluster.racks):
            for step in steps:
                k = (j + step) % cluster.racks
                a, b = first[j], first[k]
                sport = _port_onto(f, j, a, b, m)
                if sport is None:
                    continue  # no route over m (down): nothing to measure
                rate = _flow(a, b, sport, seconds)
                flows.append(Flow(j, k, m, rate, expected))
    bad = set()
    for r in range(cluster.racks):
        for m in range(cluster.spines):
            crossing = [x for x in flows if x.spine == m and r in (x.src_rack, x.dst_rack)]
            if crossing and all(x.bad for x in crossing):
                bad.add((r, m))
    return bad, flows


def _port_onto(f: fabric.Fabric, rack: int, a, b, m: int) -> int | None:
    src, dst = a.nics[0].address, b.nics[0].address
    for base in range(20000, 32000, 256):
        ports = list(range(base, base + 256))
        spines = fabric.next_spines(f, rack, a.nics[0].port, src, dst,
                                    [(p, PROBE_PORT) for p in ports])  # fmt: skip
        for p, got in zip(ports, spines, strict=True):
            if got == m:
                return p
    return None


def _flow(a, b, sport: int, seconds: float) -> float:
    server = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c", _SERVER,
                               str(PROBE_PORT)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if server.stdout.readline().strip() != "ready":
            raise testbed.TestbedError(f"the probe's receiver on {b.name} did not start")
        subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, "-c", _CLIENT,
                        b.nics[0].address, str(PROBE_PORT), str(sport), str(seconds)],
                       check=True, timeout=seconds + 30)  # fmt: skip
        got, secs = server.communicate(timeout=30)[0].split()
        return int(got) / max(float(secs), 1e-6)
    finally:
        server.kill()
        server.wait()
