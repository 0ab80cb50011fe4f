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


def disjoint_flows(cluster: testbed.Cluster, seconds: float = 2.0) -> list[Flow]:
    """Every host at once sends one flow to its counterpart in the next
    rack (host k of rack j to host k of rack j+1), pinned to spine k mod
    spines: with as many hosts a rack as spines, no two flows share a host
    link or an uplink direction, so each should run at its link's rate.
    What a benchmark on the emulated fabric shows first: that the machine's
    cores, not the emulation, are not the limit."""
    f = cluster.fabric
    if f is None or cluster.racks < 2:
        raise testbed.TestbedError(f"cluster {cluster.name} is not routed")
    racks = [cluster.rack_hosts(r) for r in range(cluster.racks)]
    expected = min(cluster.rate_bits, cluster.uplink_bits or cluster.rate_bits) / 8
    plan = []
    for j, hosts in enumerate(racks):
        nxt = racks[(j + 1) % cluster.racks]
        for k, a in enumerate(hosts[: len(nxt)]):
            m = k % cluster.spines
            sport = _port_onto(f, j, a, nxt[k], m)
            if sport is None:
                raise testbed.TestbedError(f"no source port of {a.name} takes spine {m}")
            plan.append((j, (j + 1) % cluster.racks, m, a, nxt[k], sport))
    rates = _flows([(a, b, sport) for *_, a, b, sport in plan], seconds)
    return [Flow(j, k, m, r, expected) for (j, k, m, *_), r in zip(plan, rates, strict=True)]


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
    return _flows([(a, b, sport)], seconds)[0]


def _flows(pairs: list, seconds: float) -> list[float]:
    """Flows (sender host, receiver host, source port) at once, each for
    `seconds`: the rate each receiver saw (bytes/s)."""
    servers = [subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c", _SERVER,
                                 str(PROBE_PORT)], stdout=subprocess.PIPE, text=True)
               for _, b, _ in pairs]  # fmt: skip
    clients = []
    try:
        for (_, b, _), server in zip(pairs, servers, strict=True):
            if server.stdout.readline().strip() != "ready":
                raise testbed.TestbedError(f"the probe's receiver on {b.name} did not start")
        clients = [subprocess.Popen(["ip", "netns", "exec", a.netns, sys.executable, "-c",
                                     _CLIENT, b.nics[0].address, str(PROBE_PORT), str(sport),
                                     str(seconds)])
                   for a, b, sport in pairs]  # fmt: skip
        for c in clients:
            if c.wait(timeout=seconds + 30):
                raise testbed.TestbedError("a probe flow failed")
        rates = []
        for server in servers:
            got, secs = server.communicate(timeout=30)[0].split()
            rates.append(int(got) / max(float(secs), 1e-6))
        return rates
    finally:
        for p in servers + clients:
            p.kill()
            p.wait()
