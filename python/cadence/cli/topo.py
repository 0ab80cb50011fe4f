"""The network between a job's hosts, measured: topology files for
CADENCE_TOPO_FILE.

  profile  measure it (rounds of concurrent transfers between one rank per
           host) and write a topology file: inside a job (every rank runs
           `cadence topo profile -o FILE`; rank 0 writes), or from outside on
           an emulated cluster (--cluster NAME)
  show     print a topology file: hosts, groups that share a bottleneck
           (racks), their capacities, the rate matrix, and the ring order
           cadence will use; --png draws the matrix and the groups

A job that loads the file (CADENCE_TOPO_FILE=FILE on every rank) orders its
rings, chains and hierarchical cross-host rings by the widest ring over the
measured rates (docs/topology.md).

examples:
  cadence cluster up --name tr --hosts 4 --racks 2 --uplink-rate 250mbit --placement interleaved
  cadence topo profile --cluster tr -o tr.json
  cadence topo show tr.json --png tr.png
  CADENCE_TOPO_FILE=tr.json cadence bench --cluster tr --op allreduce -b 64M -e 64M
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cadence.units import fmt_mbit

NAME = "topo"
HELP = "measure the network between hosts (topology files) and show them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    prof = sub.add_parser("profile", help="measure the network and write a topology file")
    prof.add_argument("-o", "--out", required=True, help="topology file to write (JSON)")
    prof.add_argument("--cluster", help="run on this emulated cluster (else: inside a job)")
    prof.add_argument("--ranks-per-host", type=int, default=1,
                      help="with --cluster: ranks per host (1; one per host measures)")
    prof.add_argument("--seconds", type=float, default=0.05,
                      help="about how long the fastest pair's transfer takes (0.05)")
    prof.add_argument("--pairs-max", type=int, default=16,
                      help="most hosts whose every pair is measured alone (16); beyond, "
                           "rounds of shifted flows only, about 2 log2(hosts) of them")
    prof.add_argument("--timeout", type=float, default=300.0,
                      help="with --cluster: seconds the job may take (300)")
    show = sub.add_parser("show", help="print a topology file (and --png it)")
    show.add_argument("file", help="topology file")
    show.add_argument("--png", help="also draw the rate matrix and groups into this PNG")
    show.add_argument("--json", action="store_true", help="print the ring and groups as JSON")


def run(args: argparse.Namespace) -> int:
    if args.action == "show":
        return _show(args)
    if args.cluster:
        return _profile_cluster(args)
    return _profile_in_job(args)


def _profile_in_job(args: argparse.Namespace) -> int:
    import cadence
    from cadence.topo import profile, to_text

    # This is the profile: no file to order by, no start-up profile first.
    os.environ["CADENCE_TOPO_FILE"] = "none"
    comm = cadence.init()
    try:
        note = os.environ.get("CADENCE_TOPO_NOTE") or _note(args)
        doc = profile.profile(comm, seconds=args.seconds, note=note, pairs_max=args.pairs_max)
        if comm.rank == 0:
            path = Path(args.out)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(to_text(doc))
            tmp.replace(path)
            print(f"cadence topo: wrote {path}", flush=True)
            for line in describe(doc):
                print(line, flush=True)
    finally:
        comm.close()
    return 0


def _note(args: argparse.Namespace) -> str:
    import datetime

    where = f" --cluster {args.cluster}" if getattr(args, "cluster", None) else ""
    return f"cadence topo profile{where}, {datetime.date.today().isoformat()}"


def _profile_cluster(args: argparse.Namespace) -> int:
    from cadence import testbed

    cluster = testbed.require(args.cluster)
    out = Path(args.out).resolve()
    cmd = [sys.executable, "-m", "cadence.cli.main", "topo", "profile", "-o", str(out),
           "--seconds", str(args.seconds), "--pairs-max", str(args.pairs_max)]  # fmt: skip
    env = dict(os.environ, CADENCE_TOPO_NOTE=_note(args))
    result = testbed.jobs.run(cluster, args.ranks_per_host, cmd, timeout=args.timeout, env=env)
    if result.status:
        print(f"cadence topo profile: {result.reason}", file=sys.stderr)
    return result.status


#: Hosts up to which `topo show` prints the whole rate matrix.
MATRIX_MAX_HOSTS = 24


def describe(doc: dict) -> list[str]:
    """The lines `topo show` prints."""
    from cadence import _core

    hosts, rates = doc["hosts"], doc["rates"]
    n = len(hosts)
    lines = [f"topology of {n} hosts ({doc.get('note', '')})"]
    prof = doc.get("profile") or {}
    if prof:
        how = f" ({prof['method']})" if prof.get("method") else ""
        lines.append(f"  measured with {prof.get('bytes_per_flow', 0) >> 10} KiB flows{how} in "
                     f"{prof.get('seconds', 0):.1f} s")  # fmt: skip
    for g, members in enumerate(doc["groups"]):
        lines.append(f"  group {g}: {' '.join(hosts[h] for h in members)}  "
                     f"(shared out {fmt_mbit(doc['group_out'][g])} Mbit/s, "
                     f"in {fmt_mbit(doc['group_in'][g])} Mbit/s)")  # fmt: skip
    estimated = prof.get("method") == "shifts"
    what = "estimated from the shifted rounds" if estimated else "measured"
    if n <= MATRIX_MAX_HOSTS:
        width = max(6, *(len(h) for h in hosts))
        lines.append(f"  alone rates, Mbit/s (row: from, column: to; {what}):")
        lines.append("  " + " " * width + "".join(f"{h:>{width + 1}}" for h in hosts))
        for a in range(n):
            cells = "".join(f"{'-' if a == b else fmt_mbit(rates[a][b]):>{width + 1}}"
                            for b in range(n))  # fmt: skip
            lines.append(f"  {hosts[a]:<{width}}{cells}")
    else:
        off = sorted(rates[a][b] for a in range(n) for b in range(n) if a != b)
        lines.append(f"  alone rates, Mbit/s ({what}; {n} hosts, too many to print): "
                     f"min {fmt_mbit(off[0])}, median {fmt_mbit(off[len(off) // 2])}, "
                     f"max {fmt_mbit(off[-1])} (--png draws them)")  # fmt: skip
    if n >= 2:
        ring = _core.topo_ring(json.dumps(_loadable(doc)))
        order = " -> ".join(hosts[h] for h in ring["order"])
        best, plain = fmt_mbit(ring["score"]), fmt_mbit(ring["default_score"])
        lines.append(f"  widest ring: {order}: {best} Mbit/s per flow, "
                     f"against {plain} in this file's host order")  # fmt: skip
    for p in doc.get("patterns") or []:
        if p["name"].startswith("ring in"):
            slowest = min((f[2] for f in p["flows"]), default=0.0)
            lines.append(f"  measured {p['name']}: slowest flow {fmt_mbit(slowest)} Mbit/s")
    return lines


def _loadable(doc: dict) -> dict:
    """What the library reads (the patterns are for people; a file of host
    rates gives the library those, from which it computes the matrix)."""
    skip = {"patterns", "rates"} if "host_rates" in doc else {"patterns"}
    return {k: v for k, v in doc.items() if k not in skip}


def _show(args: argparse.Namespace) -> int:
    from cadence import _core
    from cadence.topo import load

    try:
        doc = load(args.file)
        ring = _core.topo_ring(json.dumps(_loadable(doc)))
    except (OSError, ValueError, KeyError) as e:
        print(f"cadence topo show: {args.file}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"hosts": doc["hosts"], "groups": doc["groups"], **ring}, indent=1))
    else:
        for line in describe(doc):
            print(line)
    if args.png:
        from cadence.topo.draw import draw

        draw(doc, ring["order"], args.png)
        print(f"drew {args.png}")
    return 0
