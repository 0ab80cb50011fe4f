"""The emulated cluster: what it is made of, and bringing it up and down.

Model (one cluster, `H` hosts, `K` NICs per host):

- **host** i: a network namespace `cad-<name>-h<i>`; its processes see the
  host name `<name>-h<i>` (`CADENCE_HOST`, and `hostname` for jobs started by
  `cadence cluster run`) and its NICs `eth0` ... `eth<K-1>`.
- **rail** k: a bridge `rail<k>` in the cluster's own switch namespace
  `cad-<name>-sw`, joining NIC k of every host (one rail per NIC index, as in
  rail-optimized AI clusters). Nothing is created in the root namespace, so the
  machine's own network is never touched.
- **link** (i, k): a veth pair, `eth<k>` in host i and port `h<i>e<k>` on rail
  k, with address 10.77.<k>.<i+1>/24 on the host side. Each end has a
  shaper (an htb tree that sends pure ACKs ahead of data: `rates.Bucket`),
  so the link is rate-limited in both directions; cutting it sets the
  switch port down, which drops the carrier on the host side, as a pulled cable
  would.
- **racks** (`racks` > 1): each rail is a two-level tree. Host i's port joins
  the leaf bridge `rail<k>r<j>` of its rack j; each leaf joins the spine bridge
  `rail<k>` through an **uplink**, a veth pair `up<j>k<k>` (leaf side) /
  `dn<j>k<k>` (spine side) rate-limited both ways like a host link. Uplinks
  slower than the sum of their hosts' links are oversubscribed, as in real
  clusters. One L2 segment per rail all the same (a tree has no loops), so
  addresses do not change. `placement` says how hosts are dealt to racks:
  `blocked` (hosts 0..H/R-1 in rack 0, ...), `interleaved` (host i in rack
  i mod R, as a scheduler hands out hosts: rank order alternates racks), or
  `random` (a seeded shuffle of the interleaved deal, so racks stay balanced).

The state file `/run/cadence/<name>.json` records the cluster (written before
anything is made, so that `down` can always find what to remove); `/run` is a
tmpfs, so it goes with the namespaces at reboot. Every change takes one lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cadence.testbed import fabric, iproute
from cadence.testbed.fabric import Fabric
from cadence.testbed.iproute import TestbedError
from cadence.testbed.rates import Bucket
from cadence.units import format_rate, parse_rate

STATE_DIR = Path("/run/cadence")
# `ip netns exec` bind-mounts the files of /etc/netns/<namespace>/ over /etc:
# a hosts file there names every host, so that reverse lookups inside a host
# (torch's TCPStore does them) answer at once instead of failing on DNS.
ETC_NETNS = Path("/etc/netns")
NETNS_PREFIX = "cad-"
SUBNET = "10.77"  # 10.77.<nic>.<host+1>/24: private, and only inside our namespaces
MAX_HOSTS = 254
MAX_NICS = 16
DEFAULT_MTU = 1500
#: Largest segment TCP hands a host's link at once (see `_realize`).
GSO_MAX_BYTES = 16384
STATE_VERSION = 1
MAX_RACKS = 64
PLACEMENTS = ("blocked", "interleaved", "random")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,23}$")


@dataclass(frozen=True)
class Nic:
    index: int
    ifname: str  # inside the host namespace
    port: str  # the other end, on the rail's bridge in the switch namespace
    bridge: str
    address: str  # IPv4, /24

    @property
    def cidr(self) -> str:
        return f"{self.address}/24"


@dataclass(frozen=True)
class Host:
    index: int
    name: str  # CADENCE_HOST and the hostname its jobs see
    netns: str
    nics: tuple[Nic, ...]


@dataclass(frozen=True)
class Uplink:
    """Rack `rack`'s link from its leaf to a spine: on rail `nic`'s bridges
    (a bridged cluster), or to spine router `nic` (a routed one, --spines)."""

    rack: int
    nic: int  # the rail, or (routed) the spine
    leaf: str  # the rack's bridge on this rail, or its leaf router's namespace
    spine: str  # the rail's spine bridge, or the spine router's namespace
    leaf_port: str  # veth end on the leaf (shapes what the rack sends out)
    spine_port: str  # veth end on the spine (shapes what the rack receives)
    leaf_netns: str  # where each end lives
    spine_netns: str


@dataclass(frozen=True)
class Cluster:
    name: str
    rate_bits: int
    mtu: int
    hosts: tuple[Host, ...]
    #: rack_of[i]: host i's rack; all zeros with one rack (a single switch).
    rack_of: tuple[int, ...] = ()
    #: Every uplink's rate, each direction; None with one rack.
    uplink_bits: int | None = None
    placement: str = "blocked"
    #: Spine routers of a routed leaf–spine fabric (fabric.py); 0: bridges.
    spines: int = 0

    @property
    def racks(self) -> int:
        return max(self.rack_of, default=0) + 1

    @property
    def fabric(self) -> Fabric | None:
        """The routed fabric's switches (None: a bridged cluster)."""
        if not self.spines:
            return None
        return Fabric(f"{NETNS_PREFIX}{self.name}", self.racks, self.spines)

    @property
    def uplinks(self) -> list[Uplink]:
        """Every rack's uplink on every rail, or (routed) to every spine;
        none with one rack."""
        f = self.fabric
        if f is not None:
            return [Uplink(j, m, f.leaf(j), f.spine(m), f"s{m}", f"l{j}", f.leaf(j), f.spine(m))
                    for m in range(self.spines) for j in range(self.racks)]  # fmt: skip
        if self.racks < 2:
            return []
        sw = self.switch
        return [Uplink(j, k, leaf_bridge(k, j), f"rail{k}", f"up{j}k{k}", f"dn{j}k{k}", sw, sw)
                for k in range(self.nics) for j in range(self.racks)]  # fmt: skip

    def port_netns(self, host: Host) -> str:
        """Where the switch end of `host`'s links lives: the switch
        namespace, or (routed) its rack's leaf."""
        f = self.fabric
        return f.leaf(self.rack_of[host.index]) if f is not None else self.switch

    def rack_hosts(self, rack: int) -> list[Host]:
        return [h for h in self.hosts if self.rack_of[h.index] == rack]

    @property
    def nics(self) -> int:
        return len(self.hosts[0].nics)

    @property
    def switch(self) -> str:
        return switch_netns(self.name)

    @property
    def bridges(self) -> list[str]:
        """Every bridge: one per rail, plus one leaf per rack and rail (none
        in a routed cluster)."""
        if self.spines:
            return []
        spines = [f"rail{k}" for k in range(self.nics)]
        return spines + [u.leaf for u in self.uplinks]

    @property
    def master_addr(self) -> str:
        """Host 0's rail-0 address: where a job's store listens, reachable from every host."""
        return self.hosts[0].nics[0].address

    @property
    def namespaces(self) -> list[str]:
        f = self.fabric
        switches = f.namespaces if f is not None else [self.switch]
        return switches + [h.netns for h in self.hosts]

    @property
    def rate(self) -> str:
        return format_rate(self.rate_bits)

    def host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise TestbedError(
                f"cluster {self.name} has hosts 0..{len(self.hosts) - 1}, not {index}"
            )
        return self.hosts[index]

    def to_json(self) -> dict:
        return {
            "version": STATE_VERSION,
            "name": self.name,
            "rate": self.rate,
            "mtu": self.mtu,
            "switch": self.switch,
            "racks": self.racks,
            "rack_of": list(self.rack_of),
            "uplink_rate": None if self.uplink_bits is None else format_rate(self.uplink_bits),
            "placement": self.placement,
            "spines": self.spines,
            "hosts": [
                {"name": h.name, "netns": h.netns,
                 "nics": [{"ifname": n.ifname, "address": n.address, "bridge": n.bridge,
                           "port": n.port} for n in h.nics]}
                for h in self.hosts
            ],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> Cluster:
        if data.get("version") != STATE_VERSION:
            raise TestbedError(f"cluster state of version {data.get('version')} is not readable")
        rack_of = data.get("rack_of")  # absent: a cluster from before racks
        return build(data["name"], len(data["hosts"]), len(data["hosts"][0]["nics"]),
                     data["rate"], data["mtu"], racks=data.get("racks", 1),
                     uplink_rate=data.get("uplink_rate"),
                     placement=data.get("placement", "blocked"),
                     rack_of=rack_of, spines=data.get("spines", 0))  # fmt: skip


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise TestbedError(
            f"cluster name {name!r}: use up to 24 letters, digits and '-', starting with "
            "a letter or digit"
        )
    return name


def switch_netns(name: str) -> str:
    return f"{NETNS_PREFIX}{name}-sw"


def leaf_bridge(nic: int, rack: int) -> str:
    return f"rail{nic}r{rack}"


def place(hosts: int, racks: int, placement: str, seed: int | None = None) -> list[int]:
    """Each host's rack (see the module comment for the placements)."""
    if placement not in PLACEMENTS:
        raise TestbedError(f"--placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    if placement == "blocked":
        per = -(-hosts // racks)
        return [i // per for i in range(hosts)]
    dealt = [i % racks for i in range(hosts)]
    if placement == "random":
        random.Random(seed).shuffle(dealt)
    return dealt


def build(
    name: str, hosts: int, nics: int, rate: str, mtu: int = DEFAULT_MTU, *,
    racks: int = 1, uplink_rate: str | None = None, placement: str = "blocked",
    seed: int | None = None, rack_of: list[int] | None = None, spines: int = 0,
) -> Cluster:  # fmt: skip
    """The cluster such a command describes (nothing is made here). With
    `racks` > 1 hosts are dealt to racks by `placement` (or exactly as
    `rack_of` says) and every rack reaches the others through an uplink of
    `uplink_rate` (default: the host links' rate) per rail; with `spines`,
    through one such uplink to each of `spines` spine routers (fabric.py)."""
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts must be 1..{MAX_HOSTS}, not {hosts}")
    if not 1 <= nics <= MAX_NICS:
        raise TestbedError(f"--nics must be 1..{MAX_NICS}, not {nics}")
    if not 576 <= mtu <= 65_000:
        raise TestbedError(f"--mtu must be 576..65000, not {mtu}")
    if not 1 <= racks <= min(MAX_RACKS, hosts):
        raise TestbedError(f"--racks must be 1..{min(MAX_RACKS, hosts)} (at most one per "
                           f"host), not {racks}")  # fmt: skip
    try:
        bits = parse_rate(rate)
        up_bits = parse_rate(uplink_rate) if uplink_rate else bits
    except ValueError as e:
        raise TestbedError(str(e)) from None
    fabric.check(racks, spines)
    if rack_of is None:
        rack_of = place(hosts, racks, placement, seed)
    if len(rack_of) != hosts or sorted(set(rack_of)) != list(range(racks)):
        raise TestbedError(f"rack_of {rack_of} must give each of {hosts} hosts one of "
                           f"racks 0..{racks - 1}, each used")  # fmt: skip
    return Cluster(
        name=name,
        rate_bits=bits,
        mtu=mtu,
        hosts=tuple(
            Host(
                index=i,
                name=f"{name}-h{i}",
                netns=f"{NETNS_PREFIX}{name}-h{i}",
                nics=tuple(
                    Nic(k, f"eth{k}", f"h{i}e{k}",
                        "" if spines else leaf_bridge(k, rack_of[i]) if racks > 1 else f"rail{k}",
                        f"{SUBNET}.{k}.{i + 1}")  # fmt: skip
                    for k in range(nics)
                ),
            )
            for i in range(hosts)
        ),
        rack_of=tuple(rack_of),
        uplink_bits=up_bits if racks > 1 else None,
        placement=placement if racks > 1 else "blocked",
        spines=spines,
    )


# ---------------------------------------------------------------- state


def state_path(name: str) -> Path:
    return STATE_DIR / f"{check_name(name)}.json"


def cache_dir(name: str) -> Path:
    """Where jobs on the cluster cache their start-up topology profiles
    (CADENCE_TOPO_CACHE): removed with the cluster, so a cluster brought up
    again under the same name, maybe wired differently, is measured anew."""
    return STATE_DIR / f"{check_name(name)}.cache"


def planner_socket(name: str) -> Path:
    """Where `cadence planner` serves cluster `name` by default (a path:
    reachable from every host's namespace)."""
    return STATE_DIR / f"{check_name(name)}.planner.sock"


def planner_token(name: str) -> Path:
    """The cluster token of its planner (root only)."""
    return STATE_DIR / f"{check_name(name)}.planner-token"


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One cluster change at a time on this machine (flock on the state directory)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_DIR, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load(name: str) -> Cluster | None:
    path = state_path(name)
    try:
        return Cluster.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise TestbedError(f"cannot read {path}: {e}") from None


def require(name: str) -> Cluster:
    """The cluster `name`, which must be up; errors say how to fix it."""
    iproute.check_root()
    cluster = load(name)
    if cluster is None:
        raise TestbedError(
            f"no cluster named {name!r}; start one with `cadence cluster up --name {name}`"
        )
    missing = [ns for ns in cluster.namespaces if ns not in iproute.namespaces()]
    if missing:
        raise TestbedError(
            f"cluster {name} is broken ({', '.join(missing)} missing); run "
            f"`cadence cluster up --name {name} {up_arguments(cluster)}` to repair it, "
            "or `down` to remove it"
        )
    return cluster


def up_arguments(cluster: Cluster) -> str:
    """The `cluster up` arguments that describe `cluster` (for messages)."""
    args = f"--hosts {len(cluster.hosts)} --nics {cluster.nics} --rate {cluster.rate}"
    if cluster.racks > 1:
        args += (f" --racks {cluster.racks} --uplink-rate {format_rate(cluster.uplink_bits)}"
                 f" --rack-of {','.join(map(str, cluster.rack_of))}")
    if cluster.spines:
        args += f" --spines {cluster.spines}"
    return args


def names() -> list[str]:
    """The clusters with a state file, sorted."""
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json"))


def _save(cluster: Cluster) -> None:
    path = state_path(cluster.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cluster.to_json(), indent=1) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------- up


def up(cluster: Cluster) -> bool:
    """Make `cluster` exist, with every link up at its rate. Idempotent: what
    exists is kept and brought back to the description (rates, links up), what
    is missing is made. Returns True if the cluster was created from nothing.
    On failure a cluster created by this call is removed again."""
    iproute.check_root()
    iproute.check_tools()
    with locked():
        old = load(cluster.name)
        shape = lambda c: (len(c.hosts), c.nics, c.rack_of, c.spines)  # noqa: E731
        if old is not None and shape(old) != shape(cluster):
            raise TestbedError(
                f"cluster {cluster.name} exists with {len(old.hosts)} hosts x {old.nics} NICs "
                f"in {old.racks} rack(s) {list(old.rack_of)}, {old.spines} spine router(s); "
                "remove it first: "
                f"cadence cluster down --name {cluster.name}"
            )
        present = iproute.namespaces()
        fresh = not any(ns in present for ns in cluster.namespaces)
        _save(cluster)
        try:
            _realize(cluster, present)
        except BaseException:
            if fresh:
                _teardown(cluster.name, cluster)
            raise
    return fresh


def _realize(cluster: Cluster, present: set[str]) -> None:
    for ns in cluster.namespaces:
        if ns not in present:
            iproute.run("ip", "netns", "add", ns)
        # No IPv6: gloo would pick a link-local address off the interface, and
        # router solicitations would cross the throttled links. -e: a kernel
        # without IPv6 has no such key.
        iproute.in_netns(ns, "sysctl", "-q", "-e", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                         "net.ipv6.conf.default.disable_ipv6=1")  # fmt: skip
        # No TCP autocorking: it holds a small write back while the
        # connection's earlier packets have not left the host. A real NIC
        # sends them within microseconds; here they wait in the shaper's
        # queue, milliseconds at the link's rate, and 64 KiB recursive
        # doubling allreduces on 4 x 2 ranks stalled 100-300 ms now and
        # then (p99 87-166 ms against 4-18 ms without it; docs/benchmarks.md).
        iproute.in_netns(ns, "sysctl", "-q", "-e", "-w", "net.ipv4.tcp_autocorking=0")
        iproute.ip(ns, "link", "set", "lo", "up")
    f = cluster.fabric
    if f is not None:
        _realize_routers(cluster, f)
    else:
        _realize_bridges(cluster)
    _realize_hosts(cluster)
    if f is not None:
        _route(cluster)


def _realize_routers(cluster: Cluster, f: Fabric) -> None:
    for ns in f.namespaces:
        fabric.prepare_router(ns)
    for u in cluster.uplinks:
        fabric.wire_uplink(f, u.rack, u.nic, cluster.mtu)
        _set_uplink_rate(cluster, u, cluster.uplink_bits)
        iproute.ip(u.leaf_netns, "link", "set", u.leaf_port, "up")
        iproute.ip(u.spine_netns, "link", "set", u.spine_port, "up")


def _realize_bridges(cluster: Cluster) -> None:
    sw = cluster.switch
    mtu = ("mtu", str(cluster.mtu))
    for bridge in cluster.bridges:
        if not iproute.link_exists(sw, bridge):
            iproute.ip(sw, "link", "add", bridge, "type", "bridge")
        iproute.ip(sw, "link", "set", bridge, *mtu, "up")
    for u in cluster.uplinks:
        if not iproute.link_exists(sw, u.leaf_port):
            iproute.ip(sw, "link", "add", u.leaf_port, "type", "veth", "peer", "name",
                       u.spine_port)  # fmt: skip
        iproute.ip(sw, "link", "set", u.leaf_port, *mtu, "master", u.leaf)
        iproute.ip(sw, "link", "set", u.spine_port, *mtu, "master", u.spine)
        _set_uplink_rate(cluster, u, cluster.uplink_bits)
        iproute.ip(sw, "link", "set", u.leaf_port, "up")
        iproute.ip(sw, "link", "set", u.spine_port, "up")


def _realize_hosts(cluster: Cluster) -> None:
    sw = cluster.switch
    mtu = ("mtu", str(cluster.mtu))
    for host in cluster.hosts:
        port_ns = cluster.port_netns(host)
        for nic in host.nics:
            if not iproute.link_exists(port_ns, nic.port):
                # Made inside the namespaces, never in the root one: both ends are
                # born where they live.
                iproute.ip(port_ns, "link", "add", nic.port, "type", "veth",
                           "peer", "name", nic.ifname, "netns", host.netns)  # fmt: skip
            if nic.bridge:
                iproute.ip(sw, "link", "set", nic.port, *mtu, "master", nic.bridge)
            else:
                iproute.ip(port_ns, "link", "set", nic.port, *mtu)
                fabric.host_port(port_ns, nic.port)
            # TCP builds segments of up to gso_max_size for the device, and
            # the veths carry them whole to the shapers' queues, where a
            # drop loses 64 KiB (44 packets) at once: flows into a shared
            # uplink sat out retransmission timeouts (direct allgather of
            # 16 MiB across two racks: 7 timeouts in 7 calls and a p99 of
            # 1.1-1.7 s against a 0.56 s median). 16 KiB: none, and a
            # stream still carries 95.7 % of the link rate (docs/simulator.md).
            iproute.ip(host.netns, "link", "set", nic.ifname, *mtu,
                       "gso_max_size", str(GSO_MAX_BYTES))  # fmt: skip
            iproute.ip(host.netns, "addr", "replace", nic.cidr, "dev", nic.ifname)
            _set_rate(cluster, host, nic, cluster.rate_bits)
            iproute.ip(host.netns, "link", "set", nic.ifname, "up")
            iproute.ip(port_ns, "link", "set", nic.port, "up")
        _write_hosts_file(cluster, host)


def _route(cluster: Cluster) -> None:
    """A routed cluster's routes, the uplinks the kernel says are down
    withdrawn."""
    f = cluster.fabric
    down = {(s.uplink.rack, s.uplink.nic) for s in uplink_states(cluster) if s.state != "up"}
    nics = [(cluster.rack_of[h.index], n.address, n.port) for h in cluster.hosts for n in h.nics]
    fabric.routes(f, nics, down)


def _set_rate(cluster: Cluster, host: Host, nic: Nic, bits: int) -> None:
    """A shaper on both ends: the host side shapes what the host sends, the
    switch side what it receives."""
    _shape(host.netns, nic.ifname, Bucket.for_rate(bits, cluster.mtu))
    _shape(cluster.port_netns(host), nic.port, Bucket.for_rate(bits, cluster.mtu))


def _set_uplink_rate(cluster: Cluster, u: Uplink, bits: int) -> None:
    """A shaper on both ends: the leaf side shapes what the rack sends out,
    the spine side what it receives."""
    for ns, port in ((u.leaf_netns, u.leaf_port), (u.spine_netns, u.spine_port)):
        _shape(ns, port, Bucket.for_rate(bits, cluster.mtu))


def _shape(netns: str, dev: str, bucket: Bucket) -> None:
    # Rebuilt whole, whatever was there (a cluster made before the shaper was
    # an htb tree has a tbf, whose replacement by htb keeps no classes).
    iproute.tc(netns, "qdisc", "del", "dev", dev, "root", check=False)
    for args in bucket.tc_commands(dev):
        iproute.tc(netns, *args)


def _write_hosts_file(cluster: Cluster, host: Host) -> None:
    # A host's name is its rail-0 address (not 127.0.1.1 as on a laptop): a
    # library that resolves its own host name then gets an address peers reach.
    lines = ["127.0.0.1\tlocalhost"]
    for other in cluster.hosts:
        for nic in other.nics:
            alias = other.name if nic.index == 0 else f"{other.name}-{nic.ifname}"
            lines.append(f"{nic.address}\t{alias}")
            # torch's store talks over IPv6 sockets, so it looks its peers up
            # by their IPv4-mapped addresses.
            lines.append(f"::ffff:{nic.address}\t{alias}")
    etc = ETC_NETNS / host.netns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- down


def down(name: str) -> bool:
    """Remove everything cluster `name` is made of: its processes, namespaces
    (which takes their links, bridges and qdiscs with them), hosts files and
    state file. Returns False if there was nothing to remove."""
    iproute.check_root()
    with locked():
        return _teardown(name, load(name))


def _teardown(name: str, cluster: Cluster | None) -> bool:
    # Also namespaces the state file does not list: a crash between creating a
    # namespace and saving the state must not leave it behind forever.
    # (sw: the switch; h: hosts; l, s: a routed fabric's leaves and spines.)
    pattern = re.compile(rf"^{re.escape(NETNS_PREFIX + name)}-(sw|h\d+|l\d+|s\d+)$")
    doomed = {ns for ns in iproute.namespaces() if pattern.match(ns)}
    if cluster is not None:
        doomed |= set(cluster.namespaces) & iproute.namespaces()
    found = bool(doomed) or state_path(name).exists()
    _kill_processes(sorted(doomed))
    # The switch first: deleting it deletes every veth pair (both ends) and bridge.
    for ns in sorted(doomed, key=lambda ns: not ns.endswith("-sw")):
        iproute.run("ip", "netns", "delete", ns)
    for etc in ETC_NETNS.glob(f"{NETNS_PREFIX}{name}-*"):
        if pattern.match(etc.name):
            shutil.rmtree(etc, ignore_errors=True)
    if ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
        with contextlib.suppress(OSError):  # made by us, unless another tool uses it now
            ETC_NETNS.rmdir()
    state_path(name).unlink(missing_ok=True)
    shutil.rmtree(cache_dir(name), ignore_errors=True)
    return found


def _kill_processes(netns: list[str], grace: float = 2.0) -> None:
    """A job still running inside would keep its namespace (and links) alive."""
    pids = {pid for ns in netns for pid in iproute.netns_pids(ns)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(p) for p in pids):
            time.sleep(0.05)
        pids = {p for p in pids if _alive(p)}
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) no longer holds anything.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- links


@dataclass(frozen=True)
class LinkState:
    host: Host
    nic: Nic
    state: str  # "up", "down" (cut at the switch port), or what the kernel says
    rate_out: int | None  # bit/s the host may send (the shaper on its end), None: unshaped
    rate_in: int | None  # bit/s the host may receive (the shaper on the switch port)


def link_states(cluster: Cluster) -> list[LinkState]:
    """What the kernel says about every link (not what the state file says)."""
    ports_of: dict[str, dict] = {}
    states = []
    for host in cluster.hosts:
        port_ns = cluster.port_netns(host)
        if port_ns not in ports_of:
            ports_of[port_ns] = {d["ifname"]: d for d in iproute.links(port_ns)}
        ports = ports_of[port_ns]
        ends = {d["ifname"]: d for d in iproute.links(host.netns)}
        for nic in host.nics:
            port, end = ports.get(nic.port), ends.get(nic.ifname)
            if port is None or end is None:
                state = "missing"
            elif "UP" not in port.get("flags", []):
                state = "down"
            else:
                state = end.get("operstate", "unknown").lower()
            states.append(LinkState(
                host, nic, state,
                _shaped_rate(host.netns, nic.ifname) if end else None,
                _shaped_rate(port_ns, nic.port) if port else None,
            ))  # fmt: skip
    return states


_CLASS_RATE = re.compile(r"\brate (\S+)")


def _shaped_rate(netns: str, ifname: str) -> int | None:
    """Bit/s the shaper on `ifname` passes (its htb root class), or None."""
    qdisc = iproute.root_qdisc(netns, ifname)
    if not qdisc or qdisc.get("kind") != "htb":
        return None
    # This tc prints htb classes as text even with -j; the rate as tc
    # rounds it (1Gbit, 250Mbit: exact for the rates people give).
    proc = iproute.tc(netns, "class", "show", "dev", ifname, "classid", "1:1", check=False)
    m = _CLASS_RATE.search(proc.stdout)
    return parse_rate(m.group(1)) if m else None


@dataclass(frozen=True)
class UplinkState:
    uplink: Uplink
    hosts: list[Host]
    state: str  # "up", "down" (cut), or what the kernel says
    rate_out: int | None  # bit/s the rack may send to the others (shaper on the leaf end)
    rate_in: int | None  # bit/s the rack may receive from them (shaper on the spine end)


def uplink_states(cluster: Cluster) -> list[UplinkState]:
    """What the kernel says about every rack's uplinks (none with one rack)."""
    if not cluster.uplinks:
        return []
    ports: dict[str, dict] = {}
    for ns in {x for u in cluster.uplinks for x in (u.leaf_netns, u.spine_netns)}:
        ports[ns] = {d["ifname"]: d for d in iproute.links(ns)}
    states = []
    for u in cluster.uplinks:
        leaf = ports[u.leaf_netns].get(u.leaf_port)
        spine = ports[u.spine_netns].get(u.spine_port)
        if leaf is None or spine is None:
            state = "missing"
        elif "UP" not in leaf.get("flags", []) or "UP" not in spine.get("flags", []):
            state = "down"
        else:
            state = leaf.get("operstate", "unknown").lower()
        states.append(UplinkState(
            u, cluster.rack_hosts(u.rack), state,
            _shaped_rate(u.leaf_netns, u.leaf_port) if leaf else None,
            _shaped_rate(u.spine_netns, u.spine_port) if spine else None,
        ))  # fmt: skip
    return states


def set_uplink(
    cluster: Cluster, rack: int, nic: int, *, rate: str | None = None, up: bool | None = None
) -> UplinkState:
    """Change one rack's uplink on one rail (or, routed, to spine `nic`) now:
    its rate in both directions, and/or cut it (both ends go down) or
    restore it; a routed fabric's leaves stop (or start again) sending
    over it at once."""
    iproute.check_root()
    if cluster.racks < 2:
        raise TestbedError(f"cluster {cluster.name} has one rack (no uplinks); "
                           "make one with `cluster up --racks R`")  # fmt: skip
    if not 0 <= rack < cluster.racks:
        raise TestbedError(f"cluster {cluster.name} has racks 0..{cluster.racks - 1}, not {rack}")
    width, what = (cluster.spines, "spines") if cluster.spines else (cluster.nics, "NICs")
    if not 0 <= nic < width:
        raise TestbedError(f"cluster {cluster.name} has {what} 0..{width - 1}, not {nic}")
    u = next(x for x in cluster.uplinks if (x.rack, x.nic) == (rack, nic))
    with locked():
        if rate is not None:
            _set_uplink_rate(cluster, u, _bits(rate))
        if up is not None:
            for ns, port in ((u.leaf_netns, u.leaf_port), (u.spine_netns, u.spine_port)):
                iproute.ip(ns, "link", "set", port, "up" if up else "down")
            if cluster.fabric is not None:
                _route(cluster)
    return next(s for s in uplink_states(cluster) if s.uplink == u)


def _bits(rate: str) -> int:
    try:
        return parse_rate(rate)
    except ValueError as e:
        raise TestbedError(str(e)) from None


def set_link(
    cluster: Cluster, host: int, nic: int, *, rate: str | None = None, up: bool | None = None
) -> LinkState:
    """Change one link now (jobs keep running): its rate in both directions,
    and/or cut it (`up=False`: the switch port goes down) or restore it."""
    iproute.check_root()
    h = cluster.host(host)
    if not 0 <= nic < cluster.nics:
        raise TestbedError(f"cluster {cluster.name} has NICs 0..{cluster.nics - 1}, not {nic}")
    n = h.nics[nic]
    with locked():
        if rate is not None:
            _set_rate(cluster, h, n, _bits(rate))
        if up is not None:
            iproute.ip(cluster.port_netns(h), "link", "set", n.port, "up" if up else "down")
    return next(s for s in link_states(cluster) if s.host == h and s.nic == n)
