"""Link-rate reference for the emulated cluster: one TCP stream from one host
to another (plain sockets, no collective library), so that a benchmark's busbw
can be read against what a link really carries. the shaper counts every frame's
headers, so at MTU 1500 TCP payload can reach at most 95.6% of the link rate.

    .venv/bin/python benchmarks/link_rate.py --cluster tb --src 0 --dst 1 --size 125M
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

from cadence import testbed
from cadence.testbed.jobs import in_host
from cadence.testbed.rates import payload_share
from cadence.units import format_rate, parse_size

PORT = 29599
CHUNK = 1 << 20


def serve(addr: str, nbytes: int) -> None:
    """Receive `nbytes`, print the rate from the first byte to the last."""
    with socket.create_server((addr, PORT)) as server:
        server.settimeout(60)
        conn, _ = server.accept()
    with conn:
        got, t0 = 0, None
        while got < nbytes:
            data = conn.recv(CHUNK)
            if not data:
                break
            t0 = t0 or time.perf_counter()
            got += len(data)
        seconds = time.perf_counter() - (t0 or time.perf_counter())
        conn.sendall(b"k")
    print(f"{got * 8 / seconds / 1e9:.4f}", flush=True)


def send(addr: str, nbytes: int) -> None:
    deadline = time.monotonic() + 30
    while True:  # the receiver may not listen yet
        try:
            conn = socket.create_connection((addr, PORT), timeout=5)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        buf = bytes(CHUNK)
        for _ in range(0, nbytes, CHUNK):
            conn.sendall(buf)
        conn.recv(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--src", type=int, default=0, help="sending host (0)")
    p.add_argument("--dst", type=int, default=1, help="receiving host (1)")
    p.add_argument("--size", default="125M", help="bytes to send (125M)")
    p.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the receiver's address
    p.add_argument("--send", help=argparse.SUPPRESS)  # internal: the receiver's address
    args = p.parse_args()
    nbytes = parse_size(args.size)
    if args.serve:
        serve(args.serve, nbytes)
        return 0
    if args.send:
        send(args.send, nbytes)
        return 0
    cluster = testbed.require(args.cluster)
    src, dst = cluster.host(args.src), cluster.host(args.dst)
    addr = dst.nics[0].address
    me = [sys.executable, __file__, "--cluster", cluster.name, "--size", args.size]
    receiver = subprocess.Popen(in_host(dst, [*me, "--serve", addr]), stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        subprocess.run(in_host(src, [*me, "--send", addr]), check=True, timeout=600)
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    gbits = float(out.strip())
    # The path's rate: what the sender's link lets out, and the receiver's in.
    states = {(s.host.index, s.nic.index): s for s in testbed.link_states(cluster)}
    rate = min(states[src.index, 0].rate_out or 0, states[dst.index, 0].rate_in or 0)
    if not rate:
        raise SystemExit("link_rate.py: a link on the path has no shaped rate")
    print(
        f"{src.name} -> {dst.name}: {gbits:.3f} Gbit/s of TCP payload over a "
        f"{format_rate(rate)} link: {gbits * 1e9 / rate:.1%} of the rate, "
        f"{gbits * 1e9 / rate / payload_share(cluster.mtu):.1%} of what TCP can carry "
        f"at MTU {cluster.mtu}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
