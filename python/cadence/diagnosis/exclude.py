"""The exclusion list: which machines to leave out when the job restarts
(`cadence doctor DUMPDIR --exclude-file FILE`, docs/diagnosis.md).

The verdict names hosts by cadence's host identity. Set by hand or by a
launcher (`CADENCE_HOST`: `cadence cluster run` sets it to the emulated
host's name), that is the name written. By default it is the machine's host
name plus `-` and the first 8 hex digits of its boot id, which no launcher
knows: the host name is written instead (as the dumps of that host recorded
it, else the identity less that suffix).
"""

from __future__ import annotations

import re

from cadence.diagnosis.dumps import Dump
from cadence.diagnosis.verdict import HEALTHY, MISMATCH

_DEFAULT_IDENTITY = re.compile(r"^(?P<name>.+)-[0-9a-f]{8}$")


def exclusion_hosts(verdict, dumps: list[Dump]) -> list[str]:
    """Host names to exclude on restart, in the verdict's order. None when
    the job is healthy, nor for a `mismatch` (the ranks called different
    operations: a program error that would follow the job to any machine)."""
    if verdict.cls in (HEALTHY, MISMATCH):
        return []
    names: dict[str, str] = {}
    for d in dumps:
        if d.hostname:
            names.setdefault(d.host, d.hostname)
    out: list[str] = []
    for h in verdict.hosts:
        m = _DEFAULT_IDENTITY.match(h)
        name = h
        if h in names and m and m["name"] == names[h]:
            name = names[h]
        elif h not in names and m:
            name = m["name"]
        if name not in out:
            out.append(name)
    return out


def write(path: str, hosts: list[str]) -> None:
    """One host per line; an empty file when there is nothing to exclude."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{h}\n" for h in hosts))
