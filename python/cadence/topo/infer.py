"""From measured rates to the model the path finder reads: groups of hosts
that share a bottleneck, and what each group's bottleneck carries.

Pure functions over numbers (no network), so they are tested on synthetic
measurements as well as on the emulated cluster.

- **Alone rates** `rates[a][b]`: bytes/s of one flow a → b with nothing else
  on the network.
- **NIC estimate** of a host: the fastest it sent (received) alone to (from)
  any partner. A pair whose alone rate is well below what both ends' NICs
  did elsewhere (`FAST`) is held back by something between them: an uplink.
- **Groups**: hosts that reach each other at their NICs' speed: the cliques
  of the "fast" relation (connected components, checked to be cliques). A
  host alone in its rack is indistinguishable, by any flow, from a host
  with a slower NIC, and the path finder treats both alike.
- **Group capacity** (`cap_out`, `cap_in`): what concurrent flows out of
  (into) a group carried together (all their bytes over the time the last
  one took), measured under load, when that is below the sum of the same
  flows alone (`SHARED`): a shared bottleneck. Otherwise None (not a
  bottleneck at the load a ring puts on it).
"""

from __future__ import annotations

from collections.abc import Sequence

#: A pair at or above this fraction of its ends' NIC estimates is "fast".
FAST = 0.8
#: Flows measured together that reach less than this fraction of their
#: alone rates share a bottleneck.
SHARED = 0.85


def nic_estimates(rates: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """(out, in) per host: the fastest alone rate it sent and received."""
    n = len(rates)
    out = [max((rates[a][b] for b in range(n) if b != a), default=0.0) for a in range(n)]
    inn = [max((rates[a][b] for a in range(n) if a != b), default=0.0) for b in range(n)]
    return out, inn


def fast_pairs(rates: Sequence[Sequence[float]]) -> list[list[bool]]:
    """fast[a][b]: both directions of the pair run at (near) NIC speed."""
    n = len(rates)
    out, inn = nic_estimates(rates)

    def fast(a: int, b: int) -> bool:
        limit = min(out[a], inn[b])
        return limit > 0 and rates[a][b] >= FAST * limit

    return [[a != b and fast(a, b) and fast(b, a) for b in range(n)] for a in range(n)]


def groups_from_rates(rates: Sequence[Sequence[float]]) -> list[list[int]]:
    """Hosts that reach each other at NIC speed, as groups (each sorted,
    ordered by their lowest host). A component of the fast relation that is
    not a clique (a reaches b and b reaches c fast, but not a and c) is split
    greedily into cliques: its hosts share no single bottleneck."""
    n = len(rates)
    fast = fast_pairs(rates)
    left = list(range(n))
    groups: list[list[int]] = []
    while left:
        seed = left[0]
        group = [seed]
        for h in left[1:]:
            if all(fast[h][g] for g in group):
                group.append(h)
        groups.append(group)
        left = [h for h in left if h not in group]
    return groups


def group_of(groups: Sequence[Sequence[int]], n: int) -> list[int]:
    at = [-1] * n
    for g, members in enumerate(groups):
        for h in members:
            at[h] = g
    return at


def spread_flows(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int]]:
    """One flow from each of min(len) senders to a distinct receiver, so no
    host's NIC carries two flows of the round: what slows them is shared
    further in."""
    k = min(len(src), len(dst))
    return [(src[i], dst[i]) for i in range(k)]


def capacity(measured: Sequence[float], alone: Sequence[float]) -> float | None:
    """A group's bottleneck from one round of its k flows together (equal
    sizes): k times the slowest flow's rate, i.e. all their bytes over the
    time the last one took, when that falls short of their alone rates' sum
    (SHARED); else None. (The sum of the flows' own rates overstates a
    shared link: TCP does not share it fairly, and a flow that finishes
    early leaves it to the others.) A single flow cannot tell an uplink
    from a NIC: None."""
    if len(measured) < 2:
        return None
    total, ideal = len(measured) * min(measured), sum(alone)
    return total if total < SHARED * ideal else None


def ring_flows(order: Sequence[int]) -> list[tuple[int, int]]:
    n = len(order)
    return [(order[i], order[(i + 1) % n]) for i in range(n)] if n > 1 else []
