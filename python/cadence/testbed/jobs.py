"""Jobs on the emulated cluster, started as torchrun would start them.

Ranks are placed host by host: rank = host * ranks_per_host + local_rank, so a
host's ranks are consecutive (as torchrun's static rendezvous numbers them).
Each rank runs inside its host's namespace with its own host name, and gets
torchrun's environment plus what selects the cluster's network:

    RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE
    ROLE_RANK ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT OMP_NUM_THREADS (1 if unset)
    CADENCE_HOST CADENCE_SOCKET_IFNAME GLOO_SOCKET_IFNAME

MASTER_ADDR is host 0's rail-0 address, which every host reaches. cadence is
given every rail (it stripes over them); gloo rail 0.

Open MPI cannot enter a namespace by itself, so `mpirun` runs inside host 0's
namespace with a hostfile naming the hosts and, as its "remote shell"
(plm_rsh_agent), a script that starts the daemon (orted) of a host inside that
host's namespace with that host's name. Its TCP traffic is pinned to rail 0;
ranks on one host use shared memory, as cadence's do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cadence.testbed.cluster import (
    NETNS_PREFIX,
    Cluster,
    Host,
    cache_dir,
    planner_socket,
    planner_token,
)
from cadence.testbed.processes import (  # noqa: F401 - also importable from here
    KILL_GRACE,
    JobResult,
    describe_exit,
    supervise,
    terminate,
)

DEFAULT_MASTER_PORT = 29500  # torchrun's; every cluster has namespaces of its own


@dataclass(frozen=True)
class Placement:
    rank: int
    local_rank: int
    host: Host


def placements(cluster: Cluster, ranks_per_host: int) -> list[Placement]:
    if ranks_per_host < 1:
        raise ValueError(f"ranks per host must be at least 1, not {ranks_per_host}")
    return [
        Placement(h.index * ranks_per_host + local, local, h)
        for h in cluster.hosts
        for local in range(ranks_per_host)
    ]


def socket_ifname(cluster: Cluster) -> str:
    """Rail 0's interface: where jobs meet (the Store, Open MPI's control)."""
    return cluster.hosts[0].nics[0].ifname


def cadence_ifnames(cluster: Cluster) -> str:
    """Every rail's interface, comma-separated: what cadence, gloo and Open
    MPI's TCP transport are given, so that each library may use all NICs
    (cadence spreads a message over them; gloo takes a list too, and gives
    each call one device; Open MPI's TCP BTL stripes over its interfaces)."""
    return ",".join(n.ifname for n in cluster.hosts[0].nics)


def rank_env(
    cluster: Cluster,
    place: Placement,
    ranks_per_host: int,
    master_port: int,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """torchrun's environment for one rank, plus the cluster's network choice."""
    env = dict(os.environ if base is None else base)
    nhosts = len(cluster.hosts)
    world = nhosts * ranks_per_host
    rails = cadence_ifnames(cluster)
    env.update(
        RANK=str(place.rank),
        LOCAL_RANK=str(place.local_rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(ranks_per_host),
        GROUP_RANK=str(place.host.index),
        GROUP_WORLD_SIZE=str(nhosts),
        ROLE_RANK=str(place.rank),
        ROLE_WORLD_SIZE=str(world),
        MASTER_ADDR=cluster.master_addr,
        MASTER_PORT=str(master_port),
        CADENCE_HOST=place.host.name,
        CADENCE_SOCKET_IFNAME=rails,
        GLOO_SOCKET_IFNAME=rails,
    )
    # As torchrun: one thread per rank unless the user says otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    # Start-up topology profiles live and die with the cluster.
    env.setdefault("CADENCE_TOPO_CACHE", str(cache_dir(cluster.name)))
    # On a routed fabric, a link's streams can cover every spine (where the
    # planner puts them; and that many hashed flows spread better).
    if cluster.fabric is not None and "CADENCE_NSTREAMS" not in env:
        env["CADENCE_NSTREAMS"] = str(max(2, cluster.spines))
    # A routed cluster's path planner, while one serves it (`cadence planner`).
    sock, token = planner_socket(cluster.name), planner_token(cluster.name)
    if "CADENCE_PLANNER" not in env and sock.exists() and token.exists():
        env["CADENCE_PLANNER"] = f"unix:{sock}"
        env["CADENCE_PLANNER_TOKEN_FILE"] = str(token)
    return env


def in_host(host: Host, cmd: list[str]) -> list[str]:
    """`cmd` as a process of `host`: in its namespace, with its host name (a
    UTS namespace of its own). Every step execs, so the pid is `cmd`'s."""
    return ["ip", "netns", "exec", host.netns, "unshare", "--uts",
            "/bin/sh", "-c", 'hostname "$0" && exec "$@"', host.name, *cmd]  # fmt: skip


# Open MPI's remote shell into an emulated host: `agent HOST COMMAND...`, as ssh.
# Like ssh, it joins the words of COMMAND and hands them to a shell.
_AGENT = """#!/bin/sh
# Written by cadence: Open MPI's plm_rsh_agent for the emulated cluster.
host="$1"; shift
exec ip netns exec "{prefix}$host" unshare --uts /bin/sh -c "hostname '$host' && exec $*"
"""


def mpirun_command(
    cluster: Cluster, ranks_per_host: int, workdir: Path, extra: list[str] | None = None
) -> list[str]:
    """`mpirun` over the cluster's hosts (its hostfile and agent go to `workdir`);
    append the program and its arguments."""
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{h.name} slots={ranks_per_host}\n" for h in cluster.hosts))
    agent = workdir / "netns-agent"
    agent.write_text(_AGENT.format(prefix=NETNS_PREFIX))
    agent.chmod(0o755)
    ifname = socket_ifname(cluster)
    nranks = len(cluster.hosts) * ranks_per_host
    # Each emulated host looks uncrowded to Open MPI (its slots are its ranks),
    # but they all share this machine's cores: when the ranks outnumber them,
    # say so, as Open MPI does by itself on one oversubscribed host. Its ranks
    # then yield while they poll; spinning, one 8 B allreduce over 4 hosts on
    # 2 cores took 17 ms instead of 90 us.
    crowded = ["--mca", "mpi_yield_when_idle", "1"] if nranks > (os.cpu_count() or 1) else []
    # mpirun runs as a process of host 0 (its name included), so it starts host
    # 0's ranks itself and the other hosts' through the agent.
    return in_host(cluster.hosts[0], [
        "mpirun", "--allow-run-as-root", "--oversubscribe",
        "--hostfile", str(hostfile), "--map-by", "slot",
        "-np", str(nranks),
        "--mca", "plm_rsh_agent", str(agent),
        # Control on rail 0; data on every rail, as the other backends get.
        "--mca", "oob_tcp_if_include", ifname,
        "--mca", "btl_tcp_if_include", cadence_ifnames(cluster),
        "--mca", "btl", "self,vader,tcp",
        *crowded,
        *(extra or []),
    ])  # fmt: skip


class _Printer:
    """Copies the ranks' output to one stream, line by line, each line prefixed."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.lock = threading.Lock()

    def pump(self, prefix: bytes, stream: BinaryIO) -> None:
        with stream:
            for line in iter(stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                with self.lock:
                    self.out.write(prefix + line)
                    self.out.flush()


def run(
    cluster: Cluster,
    ranks_per_host: int,
    cmd: list[str],
    *,
    timeout: float,
    grace: float = 10.0,
    master_port: int = DEFAULT_MASTER_PORT,
    env: dict[str, str] | None = None,
    out: BinaryIO | None = None,
) -> JobResult:
    """Run `cmd` once per rank over the cluster, streaming each rank's output
    to `out` (default stdout) as `[rank<R>]: line`."""
    printer = _Printer(out if out is not None else sys.stdout.buffer)
    procs: dict[int, subprocess.Popen] = {}
    pumps = []
    try:
        for place in placements(cluster, ranks_per_host):
            proc = subprocess.Popen(
                in_host(place.host, cmd),
                env=rank_env(cluster, place, ranks_per_host, master_port, env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # a kill reaches the rank's children too
            )  # fmt: skip
            procs[place.rank] = proc
            pump = threading.Thread(
                target=printer.pump, args=(f"[rank{place.rank}]: ".encode(), proc.stdout),
                daemon=True,
            )  # fmt: skip
            pump.start()
            pumps.append(pump)
        return supervise(procs, timeout, grace)
    finally:
        terminate(list(procs.values()))
        for pump in pumps:
            # A rank's orphaned child may keep the pipe open: do not wait for it.
            pump.join(timeout=1.0)


def run_mpi(
    cluster: Cluster,
    ranks_per_host: int,
    cmd: list[str],
    workdir: Path,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
) -> JobResult:
    """Run `cmd` under mpirun over the cluster; mpirun tags each output line
    with [job,rank] and stops the job when a rank fails."""
    mpirun = mpirun_command(cluster, ranks_per_host, workdir, ["--tag-output"])
    proc = subprocess.Popen(
        mpirun + cmd, env=dict(os.environ if env is None else env),
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        return supervise({0: proc}, timeout, grace=0.0, what="mpirun")
    finally:
        terminate([proc])
