"""An emulated multi-host cluster on this machine (Linux network namespaces).

Each host is a network namespace with --nics interfaces; interface k of every
host joins bridge k (one rail per NIC index) in a switch namespace of the
cluster's own; every link is rate-limited in both directions (a tc htb shaper on
both ends of its veth pair). With --racks R, each rail is a leaf/spine tree: hosts
join their rack's leaf bridge, and each leaf reaches the spine through an
uplink of --uplink-rate (oversubscribed when slower than its hosts' links
together); --placement deals hosts to racks. With --spines S the fabric is
routed instead: a leaf router per rack, S spine routers, an uplink from every
leaf to every spine, and flows between racks spread over the spines by the
switches' hash of their 5-tuple (ECMP), as on a real fabric. Addresses are
10.77.<nic>.<host+1>/24 and exist only inside the cluster's namespaces.
Everything needs root.

  up      create the cluster, or bring an existing one back to this description
  down    remove everything the cluster is made of
  status  hosts, addresses, link rates and states (of one cluster, or all)
  link    change one link while jobs run: its rate, or cut it / restore it
  run     launch a job over the hosts as torchrun would (or with mpirun: --mpi)

examples:
  cadence cluster up --name tb --hosts 4 --nics 1 --rate 1gbit
  cadence cluster link --name tb --host 2 --nic 0 --rate 500mbit
  cadence cluster link --name tb --host 2 --nic 0 --down
  cadence cluster up --name tr --hosts 4 --racks 2 --uplink-rate 250mbit --placement interleaved
  cadence cluster link --name tr --rack 1 --rate 100mbit
  cadence cluster up --name ec --hosts 8 --racks 4 --spines 2 --rate 200mbit
  cadence cluster link --name ec --rack 0 --spine 1 --down
  cadence cluster run --name tb --ranks-per-host 2 -- python train.py
  cadence cluster down --name tb
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from cadence import testbed
from cadence.testbed import jobs
from cadence.units import fmt_bytes, fmt_link_rate, format_rate

NAME = "cluster"
HELP = "an emulated multi-host cluster (network namespaces): up, down, status, link, run"


def _rack_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of racks: {text}") from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    up = sub.add_parser("up", help="create the cluster (idempotent)")
    up.add_argument("--name", required=True, help="cluster name (letters, digits, '-')")
    up.add_argument("--hosts", type=_positive, default=4, help="emulated hosts (4)")
    up.add_argument("--nics", type=_positive, default=1, help="NICs (rails) per host (1)")
    up.add_argument("--rate", default="1gbit", help="every link's rate, each direction (1gbit)")
    up.add_argument("--mtu", type=int, default=testbed.cluster.DEFAULT_MTU, help="MTU (1500)")
    up.add_argument("--racks", type=_positive, default=1,
                    help="racks (leaf switches) the hosts are spread over (1: one switch)")
    up.add_argument("--uplink-rate",
                    help="each rack's uplink to the spine, each direction (default: --rate)")
    up.add_argument("--placement", choices=testbed.cluster.PLACEMENTS, default="blocked",
                    help="how hosts are dealt to racks: blocked (h0.. in rack 0), interleaved "
                         "(host i in rack i mod R), random (balanced, --seed) (blocked)")
    up.add_argument("--seed", type=int, default=0, help="seed of --placement random (0)")
    up.add_argument("--rack-of", type=_rack_list,
                    help="each host's rack, comma-separated (overrides --placement)")
    up.add_argument("--spines", type=_positive,
                    help="with --racks: a routed leaf-spine fabric of this many spines, flows "
                         "spread over them by the 5-tuple hash (ECMP), one uplink of "
                         "--uplink-rate from each leaf to each spine (default: bridges)")

    down = sub.add_parser("down", help="remove the cluster and everything it made")
    down.add_argument("--name", required=True)

    status = sub.add_parser("status", help="hosts, addresses, link rates and states")
    status.add_argument("--name", help="one cluster (default: all)")
    status.add_argument("--json", action="store_true", help="print JSON")

    link = sub.add_parser("link", help="change one link now: --rate, --down or --up")
    link.add_argument("--name", required=True)
    which = link.add_mutually_exclusive_group(required=True)
    which.add_argument("--host", type=int, help="host index")
    which.add_argument("--rack", type=int, help="a rack's uplink instead of a host's link")
    link.add_argument("--nic", type=int, default=0, help="NIC index (0)")
    link.add_argument("--spine", type=int,
                      help="with --rack on a routed fabric: the uplink to this spine")
    link.add_argument("--rate", help="new rate, both directions (e.g. 500mbit)")
    state = link.add_mutually_exclusive_group()
    state.add_argument("--down", dest="up", action="store_false", default=None, help="cut it")
    state.add_argument("--up", dest="up", action="store_true", default=None, help="restore it")

    run = sub.add_parser("run", help="launch a job over the hosts as torchrun would")
    run.add_argument("--name", required=True)
    run.add_argument("--ranks-per-host", type=_positive, default=1, help="ranks per host (1)")
    run.add_argument(
        "--timeout", type=float, default=600.0,
        help="seconds the job may take before every rank is killed (600)",
    )  # fmt: skip
    run.add_argument(
        "--grace", type=float, default=10.0,
        help="after a rank fails, seconds the others get to finish before they are killed (10)",
    )  # fmt: skip
    run.add_argument("--master-port", type=int, default=jobs.DEFAULT_MASTER_PORT,
                     help=f"MASTER_PORT on host 0 ({jobs.DEFAULT_MASTER_PORT})")  # fmt: skip
    run.add_argument("--mpi", action="store_true", help="launch with Open MPI's mpirun instead")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command and its arguments")


def run(args: argparse.Namespace) -> int:
    try:
        return ACTIONS[args.action](args)
    except testbed.TestbedError as e:
        print(f"cadence cluster {args.action}: {e}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace) -> int:
    racks = max(args.rack_of) + 1 if args.rack_of else args.racks
    cluster = testbed.build(args.name, args.hosts, args.nics, args.rate, args.mtu, racks=racks,
                            uplink_rate=args.uplink_rate, placement=args.placement,
                            seed=args.seed, rack_of=args.rack_of,
                            spines=args.spines or 0)  # fmt: skip
    created = testbed.up(cluster)
    print(f"cluster {cluster.name}: {'created' if created else 'already up; restored'}")
    _print_status(cluster)
    return 0


def _down(args: argparse.Namespace) -> int:
    from cadence.cli import planner

    if planner.stop(args.name, forget=True):
        print(f"cluster {args.name}: its planner stopped")
    if testbed.down(args.name):
        print(f"cluster {args.name}: removed")
    else:
        print(f"cluster {args.name}: nothing to remove")
    return 0


def _status(args: argparse.Namespace) -> int:
    testbed.check_root()
    names = [args.name] if args.name else testbed.names()
    clusters = [testbed.require(n) for n in names]
    if args.json:
        print(json.dumps([_status_json(c) for c in clusters], indent=1))
        return 0
    if not clusters:
        print("no clusters (start one with `cadence cluster up --name NAME`)")
    for c in clusters:
        _print_status(c)
    return 0


def _status_json(cluster: testbed.Cluster) -> dict:
    data = cluster.to_json()
    counters = _uplink_counters(cluster)
    data["uplinks"] = [
        {"rack": s.uplink.rack, "nic": s.uplink.nic, "leaf": s.uplink.leaf,
         "spine": s.uplink.spine, "hosts": [h.index for h in s.hosts], "state": s.state,
         "rate_out": s.rate_out, "rate_in": s.rate_in,
         **counters.get((s.uplink.rack, s.uplink.nic), {})}
        for s in testbed.uplink_states(cluster)
    ]  # fmt: skip
    data["links"] = [
        {"host": s.host.index, "host_name": s.host.name, "nic": s.nic.index,
         "ifname": s.nic.ifname, "address": s.nic.address, "state": s.state,
         "rate_out": s.rate_out, "rate_in": s.rate_in}
        for s in testbed.link_states(cluster)
    ]  # fmt: skip
    return data


def _uplink_counters(cluster: testbed.Cluster) -> dict:
    """(rack, spine) → the routed fabric's uplink counters (none bridged)."""
    f = cluster.fabric
    return testbed.fabric.uplink_counters(f) if f is not None else {}


def _print_status(cluster: testbed.Cluster) -> None:
    where = (f"{cluster.spines} spine routers, ECMP on the 5-tuple" if cluster.spines
             else f"switch namespace {cluster.switch}")
    print(
        f"cluster {cluster.name}: {len(cluster.hosts)} hosts x {cluster.nics} NIC(s), "
        f"{cluster.rate} links, MTU {cluster.mtu}, {where}"
    )
    if cluster.racks > 1:
        _print_racks(cluster)
    rows = [("host", "netns", "nic", "address", "rate out", "rate in", "state")]
    for s in testbed.link_states(cluster):
        switch = s.nic.bridge or cluster.port_netns(s.host)
        rows.append((
            s.host.name, s.host.netns, f"{s.nic.ifname}/{switch}", s.nic.address,
            fmt_link_rate(s.rate_out), fmt_link_rate(s.rate_in), s.state,
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(f"{cell:<{w}}" for cell, w in zip(r, widths, strict=True)).rstrip())


def _print_racks(cluster: testbed.Cluster) -> None:
    """The wiring: which hosts hang off which leaf, and each leaf's uplink
    against what its hosts could send together (the oversubscription)."""
    hosts_rate = lambda j: len(cluster.rack_hosts(j)) * cluster.rate_bits  # noqa: E731
    shape = f"{cluster.spines} spines" if cluster.spines else "leaf/spine per rail"
    print(f"  {cluster.racks} racks ({cluster.placement} placement), {shape}; "
          f"uplinks {format_rate(cluster.uplink_bits)} each way")  # fmt: skip
    counters = _uplink_counters(cluster)
    ups = max(cluster.spines, 1) if cluster.spines else 1
    for s in testbed.uplink_states(cluster):
        u = s.uplink
        over = hosts_rate(u.rack) / (s.rate_out * ups) if s.rate_out else 0
        which = f"spine {u.nic}" if cluster.spines else f"rail {u.nic}"
        c = counters.get((u.rack, u.nic))
        moved = "" if c is None else (f", {fmt_bytes(c['tx_bytes'])} up, "
                                      f"{fmt_bytes(c['rx_bytes'])} down, {c['drops']} drops")
        print(f"  rack {u.rack} {which}: {' '.join(h.name for h in s.hosts)} -> "
              f"{u.leaf} =[{u.leaf_port}/{u.spine_port}: out {fmt_link_rate(s.rate_out)}, "
              f"in {fmt_link_rate(s.rate_in)}, {s.state}, {over:.1f}:1{moved}]= "
              f"{u.spine}")  # fmt: skip


def _link(args: argparse.Namespace) -> int:
    if args.rate is None and args.up is None:
        print("cadence cluster link: say what to change: --rate, --down or --up", file=sys.stderr)
        return 2
    cluster = testbed.require(args.name)
    if args.spine is not None and (args.rack is None or not cluster.spines):
        print("cadence cluster link: --spine goes with --rack on a cluster with --spines",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.rack is not None:
        index = args.spine if cluster.spines else args.nic
        if cluster.spines and args.spine is None:
            print(f"cadence cluster link: which uplink of rack {args.rack}? --spine "
                  f"0..{cluster.spines - 1}", file=sys.stderr)  # fmt: skip
            return 2
        u = testbed.set_uplink(cluster, args.rack, index, rate=args.rate, up=args.up)
        which = f"to spine {index}" if cluster.spines else f"on rail {index}"
        print(f"cluster {cluster.name}: rack {args.rack} uplink {which}: {u.state}, "
              f"out {fmt_link_rate(u.rate_out)}, in {fmt_link_rate(u.rate_in)}")  # fmt: skip
        return 0
    s = testbed.set_link(cluster, args.host, args.nic, rate=args.rate, up=args.up)
    print(f"cluster {cluster.name}: {s.host.name} {s.nic.ifname} ({s.nic.address}): "
          f"{s.state}, out {fmt_link_rate(s.rate_out)}, in {fmt_link_rate(s.rate_in)}")  # fmt: skip
    return 0


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("cadence cluster run: no command; give it after --", file=sys.stderr)
        return 2
    cluster = testbed.require(args.name)
    # The ranks run in sessions of their own, out of reach of a signal to our
    # process group: a SIGTERM (a CI deadline, `kill`) unwinds like Ctrl-C, so
    # that they are killed on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    if args.mpi:
        with tempfile.TemporaryDirectory(prefix="cadence-mpirun-") as workdir:
            result = jobs.run_mpi(cluster, args.ranks_per_host, cmd, Path(workdir),
                                  timeout=args.timeout)  # fmt: skip
    else:
        result = jobs.run(cluster, args.ranks_per_host, cmd, timeout=args.timeout,
                          grace=args.grace, master_port=args.master_port)  # fmt: skip
    if result.status:
        print(f"cadence cluster run: {result.reason}", file=sys.stderr)
    return result.status


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


ACTIONS = {"up": _up, "down": _down, "status": _status, "link": _link, "run": _run}
