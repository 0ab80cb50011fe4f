"""Sizes, rates and times: how the package reads them from the command line
and how it prints them, in one place so that every table, report and
message spells a quantity the same way.

Two families, not to be mixed up:

- sizes are bytes in powers of 1024 (``64K``, ``1G``), as nccl-tests takes
  them; link rates are bits per second with SI prefixes (``1gbit``,
  ``500mbit``), as `tc` takes them;
- the `fmt_*` functions are for people (rounded), `format_size` and
  `format_rate` give back an exact spelling their `parse_*` reads again.

Library layer: stdlib only, cheap to import (the bench workers import it
before torch).
"""

from __future__ import annotations

import math
import re

# ------------------------------------------------------------------ sizes

_BINARY = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse a byte count: ``8``, ``64K``, ``64M``, ``1G`` (powers of 1024; a
    trailing ``B`` or ``iB`` is accepted)."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(text)
        if not m:
            raise ValueError(f"not a size: {text!r} (examples: 8, 64K, 64M, 1G)")
        value = int(m.group(1)) * 1024 ** _BINARY[m.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """The shortest exact spelling of a byte count in parse_size's syntax."""
    for suffix in ("T", "G", "M", "K"):
        unit = 1024 ** _BINARY[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def fmt_bytes(n: float, *, short: bool = False) -> str:
    """A byte count to three significant digits: ``1.5 MiB``, ``12 B``; with
    `short`, ``1.5M``, ``12B`` (where a chart has little room)."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g}{unit}" if short else f"{n / size:.3g} {unit}iB"
    return f"{n}B" if short else f"{int(n)} B"


# ------------------------------------------------------------------ rates

_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bps)?\s*$", re.IGNORECASE)
#: The slowest rate accepted: a slower link is too slow to carry a packet.
MIN_RATE_BITS = 8_000


def parse_rate(text: str) -> int:
    """Bits per second of a tc-style rate ("1gbit", "500mbit", "1000000")."""
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"not a rate: {text!r} (examples: 1gbit, 500mbit, 200mbit, 10mbit)")
    bits = int(float(m.group(1)) * _SI[m.group(2).lower()])
    if bits < MIN_RATE_BITS:
        raise ValueError(f"rate {text!r} is below 8kbit, too slow to carry a packet")
    return bits


def format_rate(bits: int) -> str:
    """The shortest exact tc spelling of a rate: 1gbit, 500mbit, 1500kbit."""
    for prefix in ("t", "g", "m", "k"):
        unit = _SI[prefix]
        if bits >= unit and bits % unit == 0:
            return f"{bits // unit}{prefix}bit"
    return f"{bits}bit"


def fmt_link_rate(bits: int | None) -> str:
    """A shaped link's rate in tc's spelling, ``unlimited`` when not shaped."""
    return "unlimited" if bits is None else format_rate(bits)


def fmt_rate(bytes_per_s: float) -> str:
    """A measured rate in bits per second, as network people read it:
    ``12 Gbit/s``, ``1.2 Gbit/s``, ``350 Mbit/s``, ``64 kbit/s``."""
    if math.isinf(bytes_per_s):
        return "inf"
    bits = bytes_per_s * 8
    if bits >= 1e10:
        return f"{bits / 1e9:.0f} Gbit/s"
    if bits >= 1e9:
        return f"{bits / 1e9:.1f} Gbit/s"
    if bits >= 1e6:
        return f"{bits / 1e6:.0f} Mbit/s"
    return f"{bits / 1e3:.0f} kbit/s"


def fmt_mbit(bytes_per_s: float | None) -> str:
    """A rate in whole Mbit/s without the unit (a matrix cell), ``-`` when
    unknown, ``inf`` when unbounded."""
    if bytes_per_s is None:
        return "-"
    return "inf" if math.isinf(bytes_per_s) else f"{bytes_per_s * 8 / 1e6:.0f}"


def fmt_mbytes(bytes_per_s: float) -> str:
    """A rate in MB/s (10**6 bytes) with one decimal, as the simulator's
    model files spell rates: ``122.5MB/s``."""
    return f"{bytes_per_s / 1e6:.1f}MB/s"


def fmt_gbps(gbps: float) -> str:
    """GB/s (10**9 bytes a second) with two decimals: a bandwidth column."""
    return f"{gbps:.2f}"


# ------------------------------------------------------------------ times


def fmt_us(us: float) -> str:
    """Microseconds with three to four significant digits: ``3.25``,
    ``412.7``, ``12345`` (a time column: the unit is in its title)."""
    if us < 100:
        return f"{us:.2f}"
    if us < 10_000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def fmt_secs(s: float) -> str:
    """A span in the unit that reads best: ``250 µs``, ``1.50 ms``, ``2.000 s``."""
    a = abs(s)
    if a < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if a < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_ms(s: float) -> str:
    """A span in milliseconds: whole ones from 9.5 ms (where a tenth would be
    noise), one decimal below."""
    return f"{s * 1e3:.0f} ms" if abs(s) >= 0.0095 else f"{s * 1e3:.1f} ms"


def fmt_us_as_ms(us: float) -> str:
    """Microseconds printed as milliseconds with three decimals."""
    return f"{us / 1e3:.3f} ms"


# ------------------------------------------------------------------ ratios


def fmt_share(r: float) -> str:
    """A ratio near 1 with two decimals (``0.93``)."""
    return f"{r:.2f}"


def fmt_ratio(r: float | None) -> str:
    """A speed-up: ``1.23x``, ``12.3x``, ``123x``; ``-`` when unknown."""
    if r is None:
        return "-"
    return f"{r:.0f}x" if r >= 100 else f"{r:.3g}x"
