"""How a process joins a job: who its host is, which addresses its peers
reach it at, and the rendezvous store when `cadence.init()` is given none
(cadence's own, served by rank 0; torchrun's agent's under torchrun)."""

from __future__ import annotations

import os
import socket


def host_identity() -> str:
    """The host this process runs on: `CADENCE_HOST`, else hostname + boot id
    (two containers with one hostname on different machines stay distinct)."""
    override = os.environ.get("CADENCE_HOST")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}-{boot}"


def _interface_ip(ifname: str) -> str:
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(
                s.fileno(), siocgifaddr, struct.pack("256s", ifname.encode()[:15])
            )
        except OSError as e:
            raise ValueError(f"CADENCE_SOCKET_IFNAME={ifname!r}: no IPv4 address ({e})") from e
    return socket.inet_ntoa(packed[20:24])


def socket_interfaces(spec: str) -> list[str]:
    """The interfaces `CADENCE_SOCKET_IFNAME` names, in order: a comma list
    (`eth0,eth1`); an entry that is not an interface's name is a prefix and
    takes every interface it starts (`eth`: eth0, eth1, ...), sorted."""
    present = sorted(name for _, name in socket.if_nameindex())
    out: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        names = [entry] if entry in present else [n for n in present if n.startswith(entry)]
        if not names:
            raise ValueError(f"CADENCE_SOCKET_IFNAME={spec!r}: no interface is named or "
                             f"starts with {entry!r} (this host has {', '.join(present)})")
        out += [n for n in names if n not in out]
    if not out:
        raise ValueError(f"CADENCE_SOCKET_IFNAME={spec!r} names no interface")
    return out


def resolve(host: str) -> str:
    """The IPv4 address of `host`. An ASCII name is handed over as bytes: a
    str makes the socket module import the idna codec first, the larger
    part of a rank's `init` in Python (docs/benchmarks.md, "Set-up at
    scale"), and ranks crowding a host's cores wait for each other's."""
    try:
        name: str | bytes = host.encode("ascii")
    except UnicodeEncodeError:
        name = host
    return socket.gethostbyname(name)


def local_ip(toward: str | None) -> str:
    """The addresses peers should reach us at: one per interface of
    CADENCE_SOCKET_IFNAME (comma-separated: a large message between two
    hosts is carried by every NIC they share), else the source address of the
    route toward the store (no packet is sent)."""
    ifname = os.environ.get("CADENCE_SOCKET_IFNAME")
    if ifname:
        return ",".join(_interface_ip(n) for n in socket_interfaces(ifname))
    if not toward:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((resolve(toward), 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def store_from_env(rank: int, world_size: int, timeout: float):
    """The job's rendezvous store from MASTER_ADDR/MASTER_PORT: cadence's own
    (rank 0 serves it in its process), or, under torchrun's agent
    (TORCHELASTIC_USE_AGENT_STORE=True), a client of the agent's TCPStore."""
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError(
            "cadence.init(): no store given and MASTER_ADDR/MASTER_PORT are not set "
            "(launch with torchrun, or set them, or pass store=, rank=, world_size=)"
        )
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"cadence.init(): MASTER_PORT={port!r} is not a port number") from None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from datetime import timedelta

        import torch.distributed as dist

        return dist.TCPStore(addr, port_n, world_size, is_master=False,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)
    from cadence._core import Store

    return Store(addr, port_n, is_server=(rank == 0), timeout=timeout)


def env_int(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise ValueError(f"cadence.init(): {name} is not set (launch with torchrun, or pass it)")
    return int(v)
