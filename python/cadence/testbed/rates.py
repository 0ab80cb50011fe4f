"""Link rates as `tc` spells them, and the token-bucket parameters for one.

A rate is bits per second: ``1gbit``, ``500mbit``, ``200Mbit``, ``10kbit`` or
a plain number of bit/s (SI prefixes, as tc: 1gbit = 10**9 bit/s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bps)?\s*$", re.IGNORECASE)

# A bucket holds this many seconds of traffic: what a link passes at memory
# speed after it was idle. Large buckets make short transfers faster than the
# link (a 500 kB bucket let a 32 KiB allreduce reach 2.5x the 1gbit rate);
# small ones keep a bulk transfer under the rate, since the veth hands tbf 64
# KiB GSO packets from a CPU shared with the sender. Measured, one TCP stream
# over 1gbit: 64 KiB bucket 85% of the rate, 125 kB (1 ms) 95.3%, 500 kB 95.8%
# (the payload ceiling at MTU 1500 is 95.6%); at 200mbit 25 kB (1 ms) already
# gives 95.5%.
BURST_SECONDS = 1 / 1000
# How long a packet may wait in the queue before tbf drops it. Deep enough that
# TCP fills the link with several streams, as a switch port's buffer would.
LATENCY = "50ms"
ETHERNET_HEADER = 14


def parse_rate(text: str) -> int:
    """Bits per second of a tc-style rate ("1gbit", "500mbit", "1000000")."""
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"not a rate: {text!r} (examples: 1gbit, 500mbit, 200mbit, 10mbit)")
    bits = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if bits < 8_000:
        raise ValueError(f"rate {text!r} is below 8kbit, too slow to carry a packet")
    return bits


def format_rate(bits: int) -> str:
    """The shortest exact tc spelling of a rate: 1gbit, 500mbit, 1500kbit."""
    for prefix in ("t", "g", "m", "k"):
        unit = _UNITS[prefix]
        if bits >= unit and bits % unit == 0:
            return f"{bits // unit}{prefix}bit"
    return f"{bits}bit"


@dataclass(frozen=True)
class Bucket:
    """One tbf qdisc: `tc qdisc replace dev X root tbf <args>`."""

    rate_bits: int
    burst_bytes: int

    @classmethod
    def for_rate(cls, bits: int, mtu: int) -> Bucket:
        # Never below two full frames: tbf could not send a packet at all.
        burst = max(int(bits / 8 * BURST_SECONDS), 2 * (mtu + ETHERNET_HEADER))
        return cls(bits, burst)

    def tc_args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate_bits}bit", "burst", str(self.burst_bytes),
                "latency", LATENCY]  # fmt: skip


def payload_share(mtu: int) -> float:
    """The share of a link's rate left for TCP payload at this MTU: tbf counts
    each frame's Ethernet, IP and TCP headers (with timestamps) too."""
    return (mtu - 52) / (mtu + ETHERNET_HEADER)
