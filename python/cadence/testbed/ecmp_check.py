"""Whether the spine the kernel names for a 5-tuple (`fabric.next_spine`,
what a path planner predicts with) is the spine the flow's packets take, on
a routed emulated cluster (`cadence cluster up --racks R --spines S`).

For `--flows` random TCP 5-tuples from a host to a host of another rack
(source port drawn at random, destination one of a few listening ports),
one after another: the prediction, then the flow (64 KiB through a socket
bound to that source port), and the uplink whose transmit counter on the
sender's leaf moved by the flow's packets. Prints how many matched.

    cadence cluster up --name ec --hosts 4 --racks 2 --spines 2 --rate 200mbit
    python -m cadence.testbed.ecmp_check --name ec --flows 200
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass

from cadence import testbed
from cadence.testbed import fabric

#: What the sender writes per flow: far above the few stray bytes (ARP,
#: the other direction's handshake) an idle uplink carries.
FLOW_BYTES = 64 * 1024
DPORTS = (29400, 29401, 29402, 29403)

_SERVER = r"""
import socket, sys, threading
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, _ = s.accept()
        while c.recv(1 << 16):
            pass
        c.close()
for p in map(int, sys.argv[1:]):
    threading.Thread(target=serve, args=(p,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

_CLIENT = r"""
import socket, sys
for line in sys.stdin:
    dst, sport, dport, n = line.split()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sport)))
    s.connect((dst, int(dport)))
    s.sendall(b"x" * int(n))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
    print("done", flush=True)
"""


@dataclass
class Flow:
    sport: int
    dport: int
    predicted: int | None
    seen: int | None


def check(cluster: testbed.Cluster, flows: int, seed: int = 0, src: int = 0,
          dst: int | None = None, ports: list[tuple[int, int]] | None = None) -> list[Flow]:
    """`flows` flows from host `src` to host `dst` (default: the first host
    of another rack), each predicted and observed; `ports`: these (source
    port, destination port) pairs instead of random ones (destination
    ports among DPORTS)."""
    f = cluster.fabric
    if f is None:
        raise testbed.TestbedError(f"cluster {cluster.name} is not routed (up it with --spines)")
    rack = cluster.rack_of[src]
    if dst is None:
        dst = next(h.index for h in cluster.hosts if cluster.rack_of[h.index] != rack)
    a, b = cluster.host(src), cluster.host(dst)
    rng = random.Random(seed)
    server = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c", _SERVER,
                               *map(str, DPORTS)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    client = subprocess.Popen(["ip", "netns", "exec", a.netns, sys.executable, "-c", _CLIENT],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = []
    try:
        if server.stdout.readline().strip() != "ready":
            raise testbed.TestbedError("the flows' server did not start")
        used: set[int] = set()
        for i in range(flows if ports is None else len(ports)):
            if ports is not None:
                sport, dport = ports[i]
            else:
                sport = rng.randrange(20000, 60000)
                while sport in used:  # a port in TIME_WAIT with the same peer may refuse
                    sport = rng.randrange(20000, 60000)
                used.add(sport)
                dport = rng.choice(DPORTS)
            src_addr, dst_addr = a.nics[0].address, b.nics[0].address
            predicted = fabric.next_spine(f, rack, a.nics[0].port, src_addr, dst_addr, sport,
                                          dport)  # fmt: skip
            before = _sent(f, rack)
            client.stdin.write(f"{dst_addr} {sport} {dport} {FLOW_BYTES}\n")
            client.stdin.flush()
            if client.stdout.readline().strip() != "done":
                raise testbed.TestbedError(f"flow from port {sport} to {dport} failed")
            time.sleep(0.02)  # the last segments' counters
            after = _sent(f, rack)
            moved = {m: after.get(m, 0) - before.get(m, 0) for m in range(f.spines)}
            seen = max(moved, key=moved.get) if max(moved.values()) > FLOW_BYTES // 2 else None
            out.append(Flow(sport, dport, predicted, seen))
    finally:
        for p in (client, server):
            p.stdin.close()
            p.kill()
            p.wait()
    return out


def _sent(f: fabric.Fabric, rack: int) -> dict[int, int]:
    """Bytes leaf `rack` sent up to each spine so far (not packets: the
    hosts' segments cross the veths whole, up to 16 KiB a packet)."""
    return {m: c["tx_bytes"] for (j, m), c in fabric.uplink_counters(f).items() if j == rack}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence.testbed.ecmp_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="a routed cluster (cluster up --spines)")
    p.add_argument("--flows", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print every flow as JSON")
    a = p.parse_args(argv)
    try:
        flows = check(testbed.require(a.name), a.flows, a.seed)
    except testbed.TestbedError as e:
        print(f"ecmp_check: {e}", file=sys.stderr)
        return 1
    right = sum(x.predicted == x.seen for x in flows)
    spread = {m: sum(x.seen == m for x in flows) for m in sorted({x.seen for x in flows}, key=str)}
    if a.json:
        print(json.dumps([x.__dict__ for x in flows]))
    print(f"{right}/{len(flows)} flows took the spine predicted "
          f"({100 * right / max(len(flows), 1):.1f} %); flows per spine seen: {spread}")
    return 0 if right == len(flows) else 1


if __name__ == "__main__":
    sys.exit(main())
