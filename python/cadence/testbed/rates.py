"""Link rates as `tc` spells them, and the token-bucket parameters for one.

A rate is bits per second: ``1gbit``, ``500mbit``, ``200Mbit``, ``10kbit`` or
a plain number of bit/s (SI prefixes, as tc: 1gbit = 10**9 bit/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.units import format_rate, parse_rate  # noqa: F401 - their old home

# A bucket holds this many seconds of traffic: what a link passes at memory
# speed after it was idle. Large buckets make short transfers faster than the
# link (a 500 kB bucket let a 32 KiB allreduce reach 2.5x the 1gbit rate);
# small ones keep a bulk transfer under the rate, since the veth hands the
# shaper 64 KiB GSO packets from a CPU shared with the sender. Measured with
# tbf, one TCP stream over 1gbit: 64 KiB bucket 85% of the rate, 125 kB (1 ms)
# 95.3%, 500 kB 95.8% (the payload ceiling at MTU 1500 is 95.6%); at 200mbit
# 25 kB (1 ms) already gives 95.5%. With htb and 1 ms: 95.8% (link_rate.py,
# 120 MB).
BURST_SECONDS = 1 / 1000
# How long data may wait in a link's queue (its depth at the rate) before the
# shaper drops it. Deep enough that TCP fills the link with several streams,
# as a switch port's buffer would.
LATENCY_SECONDS = 0.050
ETHERNET_HEADER = 14


@dataclass(frozen=True)
class Bucket:
    """How one end of a link is shaped: `rate_bits` with a bucket of
    `burst_bytes` passed at line rate after an idle spell, as an HTB tree
    that sends pure ACKs ahead of data (`tc_commands`).

    Why not one tbf, as before: a tbf queue is one FIFO, so the ACKs of a
    stream going one way wait behind the data of a stream going the other
    (up to LATENCY_SECONDS), and TCP in one direction of a duplex pair through a
    250mbit uplink got 0.127-0.17 Gbit/s of 0.239 (the other direction all
    of it). A real switch port's queue is microseconds deep at its rate, so
    ACKs never wait that long there. With the ACK class both directions get
    0.239 and the queue stays as deep for data (incast still fills it).
    `prio`, `fq_codel` and `sfq` would do it more simply; kernels built for
    small VMs often have none of them, and htb with u32 is everywhere."""

    rate_bits: int
    burst_bytes: int

    @classmethod
    def for_rate(cls, bits: int, mtu: int) -> Bucket:
        # Never below two full frames: the shaper could not send a packet.
        burst = max(int(bits / 8 * BURST_SECONDS), 2 * (mtu + ETHERNET_HEADER))
        return cls(bits, burst)

    @property
    def queue_bytes(self) -> int:
        """Bytes of data the queue holds: LATENCY_SECONDS of the rate, and at least a
        few 64 KiB segments (the veth hands the shaper unsegmented TCP
        segments of up to 64 KiB; a shorter queue would drop them whole)."""
        return max(int(self.rate_bits / 8 * LATENCY_SECONDS), 4 * 65536)

    def tc_commands(self, dev: str) -> list[list[str]]:
        """`tc` argument lists that build the shaper on `dev`'s egress, in
        order. Delete the old root qdisc first (an htb root cannot be
        replaced by another); the queue starts empty, as after any change."""
        rate = self.rate_bits
        # Pure ACKs are ~2% of a stream's bytes; data keeps at least half.
        acks = min(max(rate // 20, 8_000), rate // 2)
        burst = ["burst", str(self.burst_bytes), "cburst", str(self.burst_bytes)]
        # quantum: a leaf's DRR share, which only matters among equal prios;
        # set, so htb does not warn about the one it derives from the rate.
        leaf = ["ceil", f"{rate}bit", *burst, "quantum", "60000"]
        root = ["dev", dev, "parent", "1:"]
        return [
            ["qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20"],
            ["class", "replace", *root, "classid", "1:1", "htb", "rate", f"{rate}bit",
             "ceil", f"{rate}bit", *burst],
            ["class", "replace", "dev", dev, "parent", "1:1", "classid", "1:10", "htb",
             "rate", f"{acks}bit", *leaf, "prio", "0"],
            ["class", "replace", "dev", dev, "parent", "1:1", "classid", "1:20", "htb",
             "rate", f"{rate - acks}bit", *leaf, "prio", "1"],
            ["qdisc", "replace", "dev", dev, "parent", "1:10", "handle", "10:", "pfifo",
             "limit", "1000"],
            ["qdisc", "replace", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo",
             "limit", str(self.queue_bytes)],
            *(["filter", "replace", *root, "protocol", "ip", "prio", "1",
               "handle", f"800::{0x800 + i:x}", "u32", *match, "flowid", "1:10"]
              for i, match in enumerate(pure_ack_matches())),
        ]  # fmt: skip


def pure_ack_matches() -> list[list[str]]:
    """u32 matches, one per TCP header length, that together take the TCP
    segments without payload (pure ACKs) and nothing else: an IPv4 header
    of 20 bytes (Linux sends TCP without IP options), protocol TCP, and a
    total length equal to 20 + the TCP header's (data offset × 4: options
    such as timestamps and SACK blocks lengthen it).

    A class for "packets under 128 bytes", as before, also took a small
    message's data segment past the data of the same connection queued in
    the data class: the receiver saw it out of order, SACKed, and the
    sender retransmitted spuriously and cut its window (151 fast
    retransmits, every one answered by a D-SACK, in one run of 64 KiB
    recursive doubling allreduces on 4 × 2 ranks; none with these)."""
    return [
        ["match", "u8", "0x45", "0xff", "at", "0",  # IPv4, 20-byte header
         "match", "u8", "0x06", "0xff", "at", "9",  # TCP
         "match", "u16", f"{20 + 4 * words:#06x}", "0xffff", "at", "2",
         "match", "u8", f"{words << 4:#04x}", "0xf0", "at", "32"]  # data offset
        for words in range(5, 16)
    ]  # fmt: skip


def payload_share(mtu: int) -> float:
    """The share of a link's rate left for TCP payload at this MTU: the shaper counts
    each frame's Ethernet, IP and TCP headers (with timestamps) too."""
    return (mtu - 52) / (mtu + ETHERNET_HEADER)
