"""The store's first answer: how long a rank waits between connecting to the
store rank 0 serves and the answer to its first request (a `get` of a key that
is there), for clients that come one by one, as ranks starting at different
times do.

    python benchmarks/store_latency.py [--clients 20] [--gap-ms 37]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

from cadence._core import Store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--gap-ms", type=float, default=37.0, help="pause before each client")
    args = ap.parse_args()
    port = free_port()
    server = Store("127.0.0.1", port, is_server=True, timeout=10)
    server.set("hello", b"x")
    waits = []
    for _ in range(args.clients):
        time.sleep(args.gap_ms / 1e3)
        t = time.perf_counter()
        Store("127.0.0.1", port, is_server=False, timeout=10).get("hello")
        waits.append((time.perf_counter() - t) * 1e3)
    print(f"connect and first answer: median {statistics.median(waits):.2f} ms, "
          f"max {max(waits):.2f} ms over {args.clients} clients")


if __name__ == "__main__":
    main()
