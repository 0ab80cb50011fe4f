"""Which of a connection's streams carry: C4P's move when a link fails or
the fabric fills, made without dialing anything again.

A connection with at least as many streams as there are live spines
between its racks is laid out with one stream on every such spine and the
rest on its home spine (the one `assign.place` chose for it). While every
rack end it crosses has a spine for each of its connections, only the
home's streams carry ("together": the connection shares no uplink, and the
others are dialed and idle). Where an end has more connections than live
spines (an uplink cut or excluded, or more jobs than spines), sharing is
certain, and every connection there carries on one stream a live spine
("spread"): the switches' queues share each uplink by flow, so each
connection gets the same share of every spine, and every job the same
rate, instead of two jobs halving one spine while the others keep theirs.
A cut or a restore then moves only holds and releases, which the library
applies at once (`transport/tcp/holds.rs`).
"""

from __future__ import annotations

#: Why a stream that could carry does not (the hold's reason, logged).
CUT = "an uplink it crosses is down"
STANDBY = "standby: its connection runs on its home spine"
SURPLUS = "spread: its connection carries on one stream a live spine"


def lay_out(n: int, home: int, spines: list[int]) -> list[int] | None:
    """The spine of each of `n` streams: one on every spine of `spines`
    but `home`, the rest on `home` (first). None when `n` streams cannot
    cover the spines (or there is only one): the connection keeps the
    spines it was placed on, and carries on all of them."""
    others = [m for m in spines if m != home]
    if len(spines) < 2 or home not in spines or n < len(spines):
        return None
    return [home] * (n - len(others)) + others


def carrying(spines: list[int], cut: list[bool], home: int | None,
             spread: bool) -> list[str | None]:
    """Per stream (on `spines`; `cut`: it crosses an uplink that is down):
    None where it carries, else why it is held. Together: the home's
    streams; spread: the first stream on each live spine."""
    out: list[str | None] = []
    seen: set[int] = set()
    for m, c in zip(spines, cut, strict=True):
        if c:
            out.append(CUT)
        elif spread:
            out.append(SURPLUS if m in seen else None)
            seen.add(m)
        else:
            out.append(None if m == home else STANDBY)
    return out
