"""What one path-planner request costs as a cluster fills up: N ranks
(each its own lease, as the library opens them) ask at once for their ring
link (counted one way) and their set-up barrier's link (counted nothing),
and the planner's time per request is printed for each quarter of the
burst. A request's cost must not grow with what is already planned, or the
burst of a job of n ranks costs the planner O(n^2).

    python benchmarks/planner_scale.py --ranks 1024
    python benchmarks/planner_scale.py --ranks 4096 --hosts 254 --racks 32 --spines 8
    cadence cluster up --name pls --hosts 16 --racks 4 --spines 4   # root
    python benchmarks/planner_scale.py --ranks 1024 --cluster pls

Runs in-process. By default on a described cluster (nothing is built, no
root): the leaves' kernels are replaced by a hash of each 5-tuple, so what
is timed is the planner's own work (placement, port choice, bookkeeping).
With `--cluster` on a running routed cluster, its leaves' kernels answer,
as they do for `cadence planner`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib

from cadence import testbed
from cadence.planner.service import Planner
from cadence.testbed import fabric

TOKEN = "planner-scale"


def hashed_spines(spines: int):
    """A stand-in for the leaves' `ip route get`: a 5-tuple hash."""

    def next_spines(_f, _rack, _port, src, dst, ports):
        return [zlib.crc32(f"{src} {dst} {sp} {dp}".encode()) % spines for sp, dp in ports]

    return next_spines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--hosts", type=int, default=128, help="ranks are dealt to hosts in turn")
    ap.add_argument("--racks", type=int, default=16)
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--streams", type=int, default=8, help="streams per connection")
    ap.add_argument("--cluster", help="a running routed cluster: its kernels find the ports "
                    "(its hosts, racks and spines replace --hosts, --racks, --spines)")
    args = ap.parse_args()

    if args.cluster:
        cluster = testbed.require(args.cluster)
        args.hosts, args.racks, args.spines = len(cluster.hosts), cluster.racks, cluster.spines
    else:
        fabric.next_spines = hashed_spines(args.spines)
        cluster = testbed.build("plscale", args.hosts, 1, "100mbit", racks=args.racks,
                                spines=args.spines, placement="blocked")  # fmt: skip
    addr = [cluster.hosts[r % args.hosts].nics[0].address for r in range(args.ranks)]
    p = Planner(cluster, TOKEN, seed=1)
    ok = {"v": 1, "token": TOKEN}
    n = args.ranks
    times: list[float] = []
    t_all = time.perf_counter()
    for r in range(n):
        t0 = time.perf_counter()
        _, job = p.handle(None, {**ok, "op": "hello", "job": f"job/r{r}"}, None)
        conns = []
        for d, weight in ((1, 1), (2, 0)):
            peer = (r + d) % n
            conns.append({"id": f"{peer}/0", "src": addr[r], "dst": addr[peer],
                          "dport": 20000 + peer % 10000, "streams": args.streams,
                          "weight": weight, "back_weight": 0})  # fmt: skip
        answer, _ = p.handle(job, {**ok, "op": "plan", "connections": conns}, None)
        if not answer.get("ok"):
            print(f"rank {r}: refused: {answer}", file=sys.stderr)
            return 1
        times.append(time.perf_counter() - t0)
        if (r + 1) % max(1, n // 8) == 0:
            print(f"  {r + 1}/{n} ranks planned, {time.perf_counter() - t_all:.1f} s",
                  flush=True)  # fmt: skip
    q = max(1, n // 4)
    quarters = [statistics.mean(times[i:i + q]) * 1e3 for i in range(0, n, q)][:4]
    print(f"{n} ranks, {args.hosts} hosts, {args.racks} racks x {args.spines} spines, "
          f"{args.streams} streams a connection: {time.perf_counter() - t_all:.2f} s in all")
    print("ms a request, by quarter of the burst: "
          + "  ".join(f"{m:.2f}" for m in quarters)  # fmt: skip
          + f"  (last/first {quarters[-1] / quarters[0]:.2f})")
    busiest = max(max(u["up"], u["down"]) for u in p.status()["uplinks"])
    print(f"busiest uplink: {busiest} streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
