"""The path planner of a routed emulated cluster (C4P, docs/traffic.md): one
service per cluster, shared by every job on it, that assigns each stream
between racks a spine so the busiest uplink carries as little as it can, and
answers with source ports the fabric's ECMP hash puts on that spine.

  serve   run it in the foreground (logs every decision to stderr); at start it
          measures every uplink with a flow pinned to it and excludes those far
          below their rate (--no-probe: not)
  start   run it in the background (log and pid beside the cluster's state)
  stop    stop the background one
  status  its jobs, streams per uplink, excluded and down links

examples:
  cadence cluster up --name ec --hosts 8 --racks 4 --spines 2 --rate 200mbit
  cadence planner start --cluster ec
  cadence planner status --cluster ec
  cadence planner stop --cluster ec

Jobs find it with CADENCE_PLANNER (an address: unix:PATH or tcp:HOST:PORT)
and CADENCE_PLANNER_TOKEN_FILE; by default the planner listens on a Unix
socket beside the cluster's state, reachable from every emulated host, and
writes a new random token (readable by root only) there, and `cadence
cluster run` hands both to its ranks while the planner serves there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cadence import testbed
from cadence.planner.protocol import Address, Client, PlannerError, read_token, write_token

NAME = "planner"
HELP = "the path planner of a routed cluster (C4P): serve, start, stop, status"


def default_address(cluster: str) -> str:
    return f"unix:{testbed.cluster.planner_socket(cluster)}"


def default_token_file(cluster: str) -> str:
    return str(testbed.cluster.planner_token(cluster))


def _pid_file(cluster: str) -> Path:
    return testbed.cluster.STATE_DIR / f"{cluster}.planner.pid"


def _log_file(cluster: str) -> Path:
    return testbed.cluster.STATE_DIR / f"{cluster}.planner.log"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("serve", "run the planner in the foreground"),
                       ("start", "run the planner in the background"),
                       ("stop", "stop the background planner"),
                       ("status", "the planner's jobs and uplink loads")):  # fmt: skip
        a = sub.add_parser(name, help=text)
        a.add_argument("--cluster", required=True, help="the routed cluster (cluster up --spines)")
        a.add_argument("--listen", help="unix:PATH or tcp:HOST:PORT (a socket beside the "
                                         "cluster's state)")  # fmt: skip
        a.add_argument("--token-file", help="the cluster token (beside the cluster's state)")
        if name in ("serve", "start"):
            a.add_argument("--exclude", action="append", default=[], metavar="RACK:SPINE",
                           help="an uplink to leave unused from the start (repeatable)")
            a.add_argument("--no-probe", action="store_true",
                           help="do not measure the uplinks at start (by default one flow "
                                "pinned to each crosses each, and those far below their rate "
                                "are excluded)")
        if name == "status":
            a.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    address = args.listen or default_address(args.cluster)
    token_file = args.token_file or default_token_file(args.cluster)
    try:
        return ACTIONS[args.action](args, address, token_file)
    except (testbed.TestbedError, PlannerError, ValueError) as e:
        print(f"cadence planner {args.action}: {e}", file=sys.stderr)
        return 1


def _excluded(items: list[str]) -> set[tuple[int, int]]:
    out = set()
    for item in items:
        rack, _, spine = item.partition(":")
        if not (rack.isdigit() and spine.isdigit()):
            raise ValueError(f"--exclude {item}: expected RACK:SPINE")
        out.add((int(rack), int(spine)))
    return out


def _serve(args: argparse.Namespace, address: str, token_file: str) -> int:
    from cadence.planner.service import Planner, serve

    level = logging.DEBUG if os.environ.get("CADENCE_PLANNER_DEBUG") else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")  # fmt: skip
    cluster = testbed.require(args.cluster)
    token = read_token(token_file) if os.path.exists(token_file) else write_token(token_file)
    excluded = _excluded(args.exclude)
    bad = [x for x in excluded if not (0 <= x[0] < cluster.racks and 0 <= x[1] < cluster.spines)]
    if bad:
        raise ValueError(f"--exclude {bad[0][0]}:{bad[0][1]}: cluster {cluster.name} has racks "
                         f"0..{cluster.racks - 1} and spines 0..{cluster.spines - 1}")
    log = logging.getLogger("cadence.planner")
    if not args.no_probe:
        from cadence.planner.probe import BAD_SHARE, probe

        log.info("probing %d uplinks ...", cluster.racks * cluster.spines)
        bad, flows = probe(cluster)
        for f in flows:
            log.info("probe: rack %d -> rack %d over spine %d: %.1f of %.1f Mbit/s%s",
                     f.src_rack, f.dst_rack, f.spine, f.rate * 8e-6, f.expected * 8e-6,
                     f" (below {BAD_SHARE:.0%})" if f.bad else "")
        for r, m in sorted(bad):
            log.warning("uplink rack %d spine %d runs far below its rate: excluded", r, m)
        excluded |= bad
    planner = Planner(cluster, token, excluded=excluded)

    async def main() -> None:
        # SIGTERM (`stop`) and ^C cancel the service, which closes every
        # connection in order (an exception thrown from a signal handler
        # lands in whichever callback runs, one error per open lease).
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(planner, Address.parse(address))

    asyncio.run(main())
    logging.getLogger("cadence.planner").info("planner stopped")
    return 0


def _start(args: argparse.Namespace, address: str, token_file: str) -> int:
    pid, fresh = start(args.cluster, address, token_file, args.exclude, not args.no_probe)
    what = "running" if fresh else "already running"
    print(f"planner of cluster {args.cluster}: {what} (pid {pid}) on {address}; "
          f"log {_log_file(args.cluster)}")
    return 0


def start(cluster: str, address: str | None = None, token_file: str | None = None,
          exclude: list[str] = (), probe: bool = True) -> tuple[int, bool]:
    """Starts cluster `cluster`'s planner in the background unless it runs;
    returns its pid and whether it was started now, once it answers."""
    address = address or default_address(cluster)
    token_file = token_file or default_token_file(cluster)
    c = testbed.require(cluster)
    pid = _running(cluster)
    if pid is not None:
        return pid, False
    cmd = [sys.executable, "-m", "cadence.cli.main", "planner", "serve", "--cluster",
           cluster, "--listen", address, "--token-file", token_file]
    for x in exclude:
        cmd += ["--exclude", x]
    if not probe:
        cmd.append("--no-probe")
    log = open(_log_file(cluster), "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    _pid_file(cluster).write_text(f"{proc.pid}\n")
    # The probe at start: a flow of 0.4 s an uplink (two with 3 racks or more).
    deadline = time.monotonic() + 30 + 2 * c.racks * c.spines
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _log_file(cluster).read_text().strip().splitlines()[-1:]
            raise testbed.TestbedError(f"the planner exited at once: {' '.join(tail)}")
        try:
            with Client(address, read_token(token_file), timeout=1.0) as client:
                client.request("status")
            return proc.pid, True
        except PlannerError:
            time.sleep(0.1)
    proc.kill()
    raise testbed.TestbedError(f"the planner did not answer on {address} in time; see "
                               f"{_log_file(cluster)}")


def _running(cluster: str) -> int | None:
    try:
        pid = int(_pid_file(cluster).read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _stop(args: argparse.Namespace, address: str, token_file: str) -> int:
    stopped = stop(args.cluster)
    print(f"planner of cluster {args.cluster}: {'stopped' if stopped else 'not running'}")
    return 0


def stop(cluster: str, forget: bool = False) -> bool:
    """Stops cluster `cluster`'s background planner (SIGTERM, then SIGKILL
    after 5 s); `forget`: its token, log and socket go too (the cluster is
    being removed). Whether one was running."""
    pid = _running(cluster)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    _pid_file(cluster).unlink(missing_ok=True)
    if forget:
        for path in (_log_file(cluster), Path(default_token_file(cluster)),
                     Path(Address.parse(default_address(cluster)).path)):  # fmt: skip
            path.unlink(missing_ok=True)
    return pid is not None


def _status(args: argparse.Namespace, address: str, token_file: str) -> int:
    with Client(address, read_token(token_file)) as c:
        st = c.request("status")
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"planner of cluster {st['cluster']} on {address}: {len(st['jobs'])} job(s)")
    for j in st["jobs"]:
        held = (f", {j['held']} held (standing by, or an uplink they cross is down)"
                if j.get("held") else "")
        spread = (f", {j['spread']} spread over the live spines (a crowded rack end)"
                  if j.get("spread") else "")
        print(f"  job {j['job']}: {j['connections']} connections, {j['streams']} streams"
              f"{held}{spread}")
    print("  uplink          streams up  streams down  state")
    for u in st["uplinks"]:
        print(f"  rack {u['rack']:>2} spine {u['spine']:>2}  {u['up']:>10}  {u['down']:>12}  "
              f"{u['state']}")
    return 0


ACTIONS = {"serve": _serve, "start": _start, "stop": _stop, "status": _status}
