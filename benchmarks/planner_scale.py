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
    python benchmarks/planner_scale.py --ranks 4096 --cluster pls --served

Runs in-process. By default on a described cluster (nothing is built, no
root): the leaves' kernels are replaced by a hash of each 5-tuple, so what
is timed is the planner's own work (placement, port choice, bookkeeping).
With `--cluster` on a running routed cluster, its leaves' kernels answer,
as they do for `cadence planner`. With `--served` as well, the requests go
to `cadence planner start` (its own process, started and stopped here)
over its socket, every lease at once, and what each lease heard is
reported: when its plan was answered, the `queued` events it got, and its
longest silence (the library gives up a planner silent for 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
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
    ap.add_argument("--served", action="store_true",
                    help="ask `cadence planner start` over its socket, every lease at once")
    args = ap.parse_args()
    if args.served:
        if not args.cluster:
            ap.error("--served needs --cluster")
        return served(args)

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


def _requests(args, cluster) -> list[list[dict]]:
    """Per rank, its two requests' fields after the token: hello, plan."""
    addr = [cluster.hosts[r % len(cluster.hosts)].nics[0].address for r in range(args.ranks)]
    out = []
    for r in range(args.ranks):
        conns = [{"id": f"{(r + d) % args.ranks}/0", "src": addr[r],
                  "dst": addr[(r + d) % args.ranks], "dport": 20000 + (r + d) % 10000,
                  "streams": args.streams, "weight": w, "back_weight": 0}
                 for d, w in ((1, 1), (2, 0))]  # fmt: skip
        out.append([{"op": "hello", "job": f"burst/r{r}"},
                    {"op": "plan", "connections": conns}])  # fmt: skip
    return out


def served(args) -> int:
    from cadence.planner.protocol import VERSION, read_token

    cluster = testbed.require(args.cluster)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < args.ranks + 64:
        print(f"--ranks {args.ranks} needs {args.ranks + 64} file descriptors; the hard limit "
              f"is {hard}", file=sys.stderr)  # fmt: skip
        return 2
    # The planner (a child) inherits it: it holds a connection per lease.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    from cadence.cli import planner as planner_cli

    planner_cli.stop(cluster.name)
    planner_cli.start(cluster.name, probe=False)
    try:
        token = read_token(str(testbed.cluster.planner_token(cluster.name)))
        sock = str(testbed.cluster.planner_socket(cluster.name))
        reqs = _requests(args, cluster)
        heard = asyncio.run(_burst(sock, token, VERSION, reqs))
    finally:
        planner_cli.stop(cluster.name)
    bad = [h for h in heard if not h["ok"]]
    done = sorted(h["answered"] for h in heard if h["ok"]) or [float("nan")]
    queued = [h["queued"] for h in heard]
    print(f"{args.ranks} leases at once to `cadence planner` on {cluster.name} "
          f"({len(cluster.hosts)} hosts, {cluster.racks} racks x {cluster.spines} spines): "
          f"{len(heard) - len(bad)} planned, {len(bad)} refused or lost")
    print(f"plans answered: median {statistics.median(done):.2f} s, last {done[-1]:.2f} s "
          f"after the first hello; longest silence a lease heard "
          f"{max(h['silence'] for h in heard):.2f} s; queued events: "
          f"{sum(1 for q in queued if q)} leases heard them, at most {max(queued)} each; "
          f"link events (holds) heard by {sum(1 for h in heard if h['events'])} leases")
    for h in bad[:3]:
        print(f"  {h['why']}")
    return 1 if bad else 0


async def _burst(sock: str, token: str, version: int, reqs: list[list[dict]]) -> list[dict]:
    """Every lease at once: what each heard. Leases stay open until all are
    planned (a lease's end forgets its streams)."""
    t0 = time.monotonic()
    heard: list[dict] = []
    everyone = asyncio.Event()

    async def ask(reader, writer, fields: list[dict], got: dict) -> None:
        for f in fields:
            writer.write((json.dumps({"v": version, "token": token, **f}) + "\n").encode())
            await writer.drain()
            last = time.monotonic()
            while True:
                line = await asyncio.wait_for(reader.readline(), 60)
                now = time.monotonic()
                got["silence"], last = max(got["silence"], now - last), now
                msg = json.loads(line)
                if msg.get("event") == "queued":
                    got["queued"] += 1
                elif msg.get("event"):
                    got["events"] += 1  # holds and releases: the layout's
                elif not msg.get("ok"):
                    got["why"] = msg.get("error", "refused")
                    return
                else:
                    break
        got["ok"], got["answered"] = True, time.monotonic() - t0

    async def lease(fields: list[dict]) -> None:
        got = {"ok": False, "queued": 0, "events": 0, "silence": 0.0, "answered": None,
               "why": ""}
        writer = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock, limit=1 << 24)
            await ask(reader, writer, fields, got)
        except (TimeoutError, OSError, ValueError) as e:
            got["why"] = f"{type(e).__name__}: {e}"
        heard.append(got)
        if len(heard) == len(reqs):
            everyone.set()
        await everyone.wait()
        if writer is not None:
            writer.close()

    await asyncio.gather(*(lease(f) for f in reqs))
    return heard


if __name__ == "__main__":
    sys.exit(main())
