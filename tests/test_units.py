"""cadence.units: every formatter's output on a table of values (the
spellings the reports, tables and messages printed before the formatters
were gathered there), and what the parsers accept and refuse."""

from __future__ import annotations

import math

import pytest
from cadence import units

inf = math.inf

US = [
    (0, '0.00'),
    (0.004, '0.00'),
    (3.254, '3.25'),
    (99.994, '99.99'),
    (99.995, '100.00'),
    (100, '100.0'),
    (412.66, '412.7'),
    (9999.94, '9999.9'),
    (9999.96, '10000.0'),
    (10000, '10000'),
    (123456.7, '123457'),
]

GBPS = [
    (0, '0.00'),
    (0.004, '0.00'),
    (0.005, '0.01'),
    (1.234, '1.23'),
    (12.5, '12.50'),
    (1234.567, '1234.57'),
]

SHARE = [
    (0, '0.00'),
    (0.895, '0.90'),
    (0.9, '0.90'),
    (0.93456, '0.93'),
    (1, '1.00'),
    (1.005, '1.00'),
]

RATIO = [
    (None, '-'),
    (0.5, '0.5x'),
    (1, '1x'),
    (1.2345, '1.23x'),
    (12.345, '12.3x'),
    (99.94, '99.9x'),
    (99.96, '100x'),
    (100, '100x'),
    (123.4, '123x'),
    (5000, '5000x'),
]

BYTES = [
    (0, '0 B'),
    (12, '12 B'),
    (1023, '1023 B'),
    (1024, '1 KiB'),
    (1536, '1.5 KiB'),
    (1048575, '1.02e+03 KiB'),
    (1048576, '1 MiB'),
    (1572864.0, '1.5 MiB'),
    (12345678, '11.8 MiB'),
    (1073741824, '1 GiB'),
    (5497558138880, '5.12e+03 GiB'),
]

SHORT_BYTES = [
    (0, '0B'),
    (12, '12B'),
    (1023, '1023B'),
    (1024, '1K'),
    (1536, '1.5K'),
    (1048576, '1M'),
    (12345678, '11.8M'),
    (1073741824, '1G'),
]

SECS = [
    (0, '0 µs'),
    (0.00025, '250 µs'),
    (-0.00025, '-250 µs'),
    (0.000999, '999 µs'),
    (0.001, '1.00 ms'),
    (0.0015, '1.50 ms'),
    (0.999, '999.00 ms'),
    (1, '1.000 s'),
    (2, '2.000 s'),
    (123.4567, '123.457 s'),
    (-3, '-3.000 s'),
]

MS = [
    (0, '0.0 ms'),
    (0.0012, '1.2 ms'),
    (0.0094, '9.4 ms'),
    (0.0095, '10 ms'),
    (0.0123, '12 ms'),
    (0.5, '500 ms'),
    (-0.02, '-20 ms'),
    (-0.001, '-1.0 ms'),
]

US_AS_MS = [
    (0, '0.000 ms'),
    (1, '0.001 ms'),
    (1234.5, '1.234 ms'),
    (1000000.0, '1000.000 ms'),
]

RATE = [
    (0, '0 kbit/s'),
    (1000, '8 kbit/s'),
    (8000, '64 kbit/s'),
    (125000, '1 Mbit/s'),
    (125000000.0, '1.0 Gbit/s'),
    (120000000.0, '960 Mbit/s'),
    (1250000000.0, '10 Gbit/s'),
    (1500000000.0, '12 Gbit/s'),
    (inf, 'inf'),
]

MBIT = [
    (None, '-'),
    (0, '0'),
    (125000, '1'),
    (125000000.0, '1000'),
    (120000000.0, '960'),
    (inf, 'inf'),
]

SIZE = [
    (1, '1'),
    (8, '8'),
    (1000, '1000'),
    (1024, '1K'),
    (1536, '1536'),
    (4096, '4K'),
    (1048576, '1M'),
    (3145728, '3M'),
    (1049600, '1025K'),
    (1073741824, '1G'),
    (1099511627776, '1T'),
    (3298534883328, '3T'),
    (1125899906842624, '1024T'),
]

TC_RATE = [
    (1, '1bit'),
    (8000, '8kbit'),
    (1000, '1kbit'),
    (1500000, '1500kbit'),
    (1000000000, '1gbit'),
    (2000000000000, '2tbit'),
    (1234567, '1234567bit'),
    (1000000000000000, '1000tbit'),
]

LINK_RATE = [
    (None, 'unlimited'),
    (1000000000, '1gbit'),
    (250000000, '250mbit'),
]

FORMATTERS = [
    (units.fmt_us, US),
    (units.fmt_gbps, GBPS),
    (units.fmt_share, SHARE),
    (units.fmt_ratio, RATIO),
    (units.fmt_bytes, BYTES),
    (lambda n: units.fmt_bytes(n, short=True), SHORT_BYTES),
    (units.fmt_secs, SECS),
    (units.fmt_ms, MS),
    (units.fmt_us_as_ms, US_AS_MS),
    (units.fmt_rate, RATE),
    (units.fmt_mbit, MBIT),
    (units.format_size, SIZE),
    (units.format_rate, TC_RATE),
    (units.fmt_link_rate, LINK_RATE),
]


@pytest.mark.parametrize(
    "fmt, value, text",
    [(f, v, t) for f, table in FORMATTERS for v, t in table],
)
def test_formatters_print_as_before(fmt, value, text):
    assert fmt(value) == text


def test_fmt_mbytes():
    assert units.fmt_mbytes(122.5e6) == "122.5MB/s"
    assert units.fmt_mbytes(1.5e9) == "1500.0MB/s"


@pytest.mark.parametrize("text, nbytes", [
    ("8", 8), ("64K", 1 << 16), ("64M", 1 << 26), ("64m", 1 << 26), ("1G", 1 << 30),
    ("1T", 1 << 40), ("2KB", 2048), ("4kib", 4096), ("16 MiB", 1 << 24), (" 3 ", 3), (5, 5),
])
def test_parse_size_accepts(text, nbytes):
    assert units.parse_size(text) == nbytes


@pytest.mark.parametrize("text, message", [
    ("x", "not a size: 'x' (examples: 8, 64K, 64M, 1G)"),
    ("1P", "not a size"), ("", "not a size"), ("1.5M", "not a size"), ("-1", "not a size"),
    ("0", "size must be positive: '0'"), ("0K", "size must be positive"),
    (0, "size must be positive: 0"), (-3, "size must be positive"),
])
def test_parse_size_refuses(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        units.parse_size(text)


@pytest.mark.parametrize("nbytes", [1, 8, 1000, 1024, 1536, 3 << 20, 1025 << 10, 7 << 40])
def test_format_size_reads_back(nbytes):
    assert units.parse_size(units.format_size(nbytes)) == nbytes


@pytest.mark.parametrize("text, bits", [
    ("1gbit", 10**9), ("500mbit", 5 * 10**8), ("200Mbit", 2 * 10**8), ("10kbit", 10**4),
    ("1000000", 10**6), ("1.5gbit", 15 * 10**8), ("8000", 8000), ("8kbit", 8000),
    ("1gbps", 10**9), ("1g", 10**9), (" 2 mbit ", 2 * 10**6), ("1tbit", 10**12),
])
def test_parse_rate_accepts(text, bits):
    assert units.parse_rate(text) == bits


@pytest.mark.parametrize("text, message", [
    ("gbit", "not a rate: 'gbit' (examples: 1gbit, 500mbit, 200mbit, 10mbit)"),
    ("1xbit", "not a rate"), ("", "not a rate"), ("-1gbit", "not a rate"),
    ("7999", "rate '7999' is below 8kbit, too slow to carry a packet"),
    ("0.5kbit", "is below 8kbit"),
])
def test_parse_rate_refuses(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        units.parse_rate(text)


@pytest.mark.parametrize("bits", [8000, 1500 * 10**3, 10**9, 250 * 10**6, 1234567, 2 * 10**12])
def test_format_rate_reads_back(bits):
    assert units.parse_rate(units.format_rate(bits)) == bits


def test_old_homes_still_export_the_parsers():
    from cadence.bench import common
    from cadence.testbed import rates

    assert common.parse_size is units.parse_size and common.format_size is units.format_size
    assert rates.parse_rate is units.parse_rate and rates.format_rate is units.format_rate


def test_units_is_cheap_to_import():
    """stdlib only: the bench workers import it before torch."""
    import ast
    import pathlib
    import sys

    tree = ast.parse(pathlib.Path(units.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""
            ]:
                top = name.split(".")[0]
                assert top == "__future__" or top in sys.stdlib_module_names, name
