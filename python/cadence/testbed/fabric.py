"""A routed leaf–spine fabric for the emulated cluster (`cluster up --racks R
--spines S`): flows between racks take equal-cost paths chosen by the
switches' hash of their 5-tuple (ECMP), as on a real fabric.

- **leaf** j (one per rack): a routing namespace `cad-<name>-l<j>`; host i of
  rack j plugs NIC k into it (port `h<i>e<k>`). It answers the hosts' ARP
  for every address (proxy ARP, no delay), so hosts keep their flat
  10.77.<nic>.<host+1>/24 addresses and need no routes, and routes: a /32 to
  each of its own hosts' NICs, and to every other host's NIC one multipath
  route over the spines that still reach that host's leaf.
- **spine** m: a routing namespace `cad-<name>-s<m>` with a /32 route to every
  host NIC via that host's leaf.
- **uplink** (j, m): a veth pair, `s<m>` in leaf j and `l<j>` in spine m,
  10.78.<j>.<4m+1>/30 and .<4m+2>, shaped both ways like a host link.
- **hash**: leaves and spines hash forwarded packets on the 5-tuple
  (`fib_multipath_hash_policy=3`, fields 0x37: addresses, protocol and
  ports). Policy 1 would not do: for forwarded TCP it reuses the sender
  socket's random flow hash (`sk_txhash`, rehashed on retransmits), not the
  ports, so no one could predict or choose a flow's spine.

A cut uplink is withdrawn from every leaf's routes at once (`routes`), as
a routing protocol would tell them; its flows move to the spines left, the
others keep theirs (resilient nexthop groups: the hash picks one of a
fixed table of buckets, and only the cut uplink's buckets change hands).
`next_spine` asks the kernel which spine a 5-tuple takes from its leaf
(`ip route get … iif … ipproto tcp sport … dport …`), the same lookup and
hash the packets get.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cadence.testbed import iproute, nexthops
from cadence.testbed.iproute import TestbedError

MAX_SPINES = 63  # 10.78.<rack>.<4m+2> stays within one /24
#: The 5-tuple: source and destination address, protocol, source and
#: destination port (`fib_multipath_hash_fields` bits 0, 1, 2, 4, 5).
HASH_FIELDS = "0x0037"
UPLINK_NET = "10.78"
#: Hash buckets of each leaf's resilient nexthop groups (a multiple of
#: 2, 3 and 4 spines, so that those split them evenly).
BUCKETS = 96


@dataclass(frozen=True)
class Fabric:
    """Where a routed cluster's switches live and how they are wired."""

    #: The cluster's namespaces' common prefix (`cad-<name>`).
    prefix: str
    racks: int
    spines: int

    def leaf(self, rack: int) -> str:
        return f"{self.prefix}-l{rack}"

    def spine(self, m: int) -> str:
        return f"{self.prefix}-s{m}"

    @property
    def namespaces(self) -> list[str]:
        return [self.leaf(j) for j in range(self.racks)] + \
            [self.spine(m) for m in range(self.spines)]

    @staticmethod
    def leaf_addr(rack: int, m: int) -> str:
        return f"{UPLINK_NET}.{rack}.{4 * m + 1}"

    @staticmethod
    def spine_addr(rack: int, m: int) -> str:
        return f"{UPLINK_NET}.{rack}.{4 * m + 2}"


def check(racks: int, spines: int) -> None:
    if spines and racks < 2:
        raise TestbedError("--spines needs --racks 2 or more (a spine joins leaves)")
    if not 0 <= spines <= MAX_SPINES:
        raise TestbedError(f"--spines must be 1..{MAX_SPINES}, not {spines}")


def prepare_router(netns: str) -> None:
    """A leaf or spine: forwards, hashes the 5-tuple, no reverse-path
    filter (a flow's two directions may cross different spines)."""
    iproute.in_netns(netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                     "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                     "net.ipv4.conf.all.send_redirects=0",
                     "net.ipv4.conf.default.send_redirects=0",
                     "net.ipv4.fib_multipath_hash_policy=3",
                     f"net.ipv4.fib_multipath_hash_fields={HASH_FIELDS}")  # fmt: skip


def host_port(netns: str, port: str) -> None:
    """A leaf's port to a host NIC: answers ARP for every address at once."""
    iproute.in_netns(netns, "sysctl", "-q", "-w", f"net.ipv4.conf.{port}.proxy_arp=1",
                     f"net.ipv4.conf.{port}.rp_filter=0",
                     f"net.ipv4.neigh.{port}.proxy_delay=0")  # fmt: skip


def wire_uplink(f: Fabric, rack: int, m: int, mtu: int) -> tuple[str, str]:
    """Makes uplink (rack, m) if missing, addressed; returns its two ports
    (leaf side, spine side)."""
    leaf, spine = f.leaf(rack), f.spine(m)
    lp, sp = f"s{m}", f"l{rack}"
    if not iproute.link_exists(leaf, lp):
        iproute.ip(leaf, "link", "add", lp, "type", "veth", "peer", "name", sp, "netns", spine)
    iproute.ip(leaf, "link", "set", lp, "mtu", str(mtu))
    iproute.ip(spine, "link", "set", sp, "mtu", str(mtu))
    iproute.ip(leaf, "addr", "replace", f"{f.leaf_addr(rack, m)}/30", "dev", lp)
    iproute.ip(spine, "addr", "replace", f"{f.spine_addr(rack, m)}/30", "dev", sp)
    for ns, port in ((leaf, lp), (spine, sp)):
        iproute.in_netns(ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{port}.rp_filter=0")
    return lp, sp


def routes(f: Fabric, hosts: list[tuple[int, str, str]], down: set[tuple[int, int]]) -> None:
    """Every leaf's and spine's routes for `hosts` (rack, address, leaf port
    of each host NIC), with the uplinks in `down` (rack, spine) withdrawn.
    A host no spine reaches any more gets no route from the other leaves
    (its packets are dropped there, as a fabric would)."""
    for m in range(f.spines):
        for rack, addr, _port in hosts:
            if (rack, m) in down:
                iproute.ip(f.spine(m), "route", "del", f"{addr}/32", check=False)
            else:
                iproute.ip(f.spine(m), "route", "replace", f"{addr}/32", "via",
                           f.leaf_addr(rack, m), "dev", f"l{rack}")  # fmt: skip
    for j in range(f.racks):
        leaf = f.leaf(j)
        for m in range(f.spines):
            if (j, m) not in down:
                iproute.ip(leaf, "nexthop", "replace", "id", str(_hop_id(m)), "via",
                           f.spine_addr(j, m), "dev", f"s{m}")  # fmt: skip
        # One resilient group per other rack, changed in place: a member
        # that leaves hands its buckets to the others, and every other
        # flow keeps its spine (as a switch's resilient hashing does; a
        # plain multipath route would rehash them all). A member that
        # comes back takes buckets idle for a second.
        for r in range(f.racks):
            if r == j:
                continue
            up = [m for m in range(f.spines) if (j, m) not in down and (r, m) not in down]
            if up:
                members = "/".join(str(_hop_id(m)) for m in up)
                iproute.ip(leaf, "nexthop", "replace", "id", str(_group_id(r)), "group",
                           members, "type", "resilient", "buckets", str(BUCKETS),
                           "idle_timer", "1")  # fmt: skip
            else:
                iproute.ip(leaf, "nexthop", "del", "id", str(_group_id(r)), check=False)
        for rack, addr, port in hosts:
            if rack == j:
                iproute.ip(leaf, "route", "replace", f"{addr}/32", "dev", port, "scope", "link")
                continue
            if not any((j, m) not in down and (rack, m) not in down for m in range(f.spines)):
                iproute.ip(leaf, "route", "del", f"{addr}/32", check=False)
                continue
            iproute.ip(leaf, "route", "replace", f"{addr}/32", "nhid", str(_group_id(rack)))


def _hop_id(m: int) -> int:
    """A leaf's nexthop object for spine m."""
    return 1 + m


def _group_id(rack: int) -> int:
    """A leaf's nexthop group towards `rack`."""
    return 1000 + rack


def next_spine(f: Fabric, rack: int, in_port: str, src: str, dst: str, sport: int,
               dport: int) -> int | None:
    """The spine leaf `rack` sends a TCP packet of this 5-tuple arriving on
    `in_port` to (None: it stays in the rack, or no route)."""
    return next_spines(f, rack, in_port, src, dst, [(sport, dport)])[0]


def next_spines(f: Fabric, rack: int, in_port: str, src: str, dst: str,
                ports: list[tuple[int, int]]) -> list[int | None]:
    """`next_spine` of each (source port, destination port), asked of the
    leaf's lookup process (`nexthops.py`: some 20 µs a lookup)."""
    devs = nexthops.leaf(f.leaf(rack)).devs([
        f"route get {dst} from {src} iif {in_port} ipproto tcp sport {sp} dport {dp}"
        for sp, dp in ports])  # fmt: skip
    return [int(d[1:]) if d and d.startswith("s") and d[1:].isdigit() else None for d in devs]


def uplink_counters(f: Fabric) -> dict[tuple[int, int], dict[str, int]]:
    """Per uplink (rack, spine): bytes and packets the rack sent up it
    (`tx_*` of the leaf port) and got down it (`rx_*`), and drops."""
    out: dict[tuple[int, int], dict[str, int]] = {}
    for j in range(f.racks):
        for d in iproute.link_stats(f.leaf(j)):
            name = d.get("ifname", "")
            if not (name.startswith("s") and name[1:].isdigit()):
                continue
            stats = d.get("stats64") or d.get("stats") or {}
            tx, rx = stats.get("tx", {}), stats.get("rx", {})
            out[(j, int(name[1:]))] = {
                "tx_bytes": tx.get("bytes", 0), "tx_packets": tx.get("packets", 0),
                "rx_bytes": rx.get("bytes", 0), "rx_packets": rx.get("packets", 0),
                "drops": tx.get("dropped", 0) + rx.get("dropped", 0),
            }  # fmt: skip
    return out


def host_of_addr(addr: str) -> tuple[int, int]:
    """(nic, host index) of a cluster address 10.77.<nic>.<host+1>."""
    ip = ipaddress.IPv4Address(addr).packed
    return ip[2], ip[3] - 1
