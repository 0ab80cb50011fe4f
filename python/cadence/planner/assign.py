"""Which spine each stream between racks takes, so that the most loaded
uplink carries as little as it can (C4P's assignment).

A stream from rack a to rack b over spine m loads uplink (a, m) upward and
(b, m) downward by its weight (1: every stream of a collective carries as
much as the others). Streams inside a rack cross no uplink. An uplink
that is down or excluded (a bad link at start) takes nothing, in either
direction.

With every uplink live and unit weights the optimum is the lower bound
`ceil(streams at the busiest rack end / spines)`: the streams are the edges
of a bipartite multigraph (sending racks, receiving racks), and such a graph
splits into S parts each of degree at most ceil(d / S) at every vertex (an
equitable edge colouring). `place` gets there the way such colourings are
found: each stream on its least loaded spine, then, while the busiest
uplink is above the bound, a stream on it moves to another spine, and
where that overloads the far end, the alternating chain of streams between
the two spines is swapped (a Kempe chain). Existing streams (other jobs')
stay where they are unless `rebalance` is asked for (after a link event).

A connection's streams (keys (job, connection, k[, "back"]): one direction)
are placed as one: together on one spine. A collective's step ends with
its slowest stream, so a connection spread over every spine shares each
uplink with the other jobs' spread connections, and every job loses a
tenth to a fifth of its rate to the others' (docs/traffic.md, "A
connection's streams together"); on one spine it shares with none where
the balance allows. With uplinks as fast as the hosts' links, spreading
one connection gains it nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Up: a rack sends up to the spine; down: the spine sends down to a rack.
UP, DOWN = 0, 1


@dataclass
class Stream:
    key: object  # the caller's: (job, connection, stream index)
    src: int  # sending rack
    dst: int  # receiving rack
    weight: int = 1
    spine: int | None = None


@dataclass
class Fabric:
    racks: int
    spines: int
    #: (rack, spine) uplinks that carry nothing: down, or excluded.
    dead: set[tuple[int, int]] = field(default_factory=set)

    def live(self, rack: int, m: int) -> bool:
        return (rack, m) not in self.dead

    def spines_for(self, src: int, dst: int) -> list[int]:
        """The spines a stream from rack `src` to rack `dst` can take."""
        return [m for m in range(self.spines) if self.live(src, m) and self.live(dst, m)]


class Loads:
    """Every uplink direction's load: (rack, spine, UP|DOWN) → weight, and
    the streams on it (weightless ones too: they are spread by count)."""

    def __init__(self, fabric: Fabric):
        self.f = fabric
        self.w: dict[tuple[int, int, int], int] = {}
        self.n: dict[tuple[int, int, int], int] = {}
        #: (rack, UP|DOWN) → the connections with streams that weigh
        #: something there, and how many.
        self.c: dict[tuple[int, int], dict] = {}
        #: (rack, UP|DOWN) → the weight of every stream that leaves or
        #: enters the rack, whichever spine it takes (`bound`).
        self.ends: dict[tuple[int, int], int] = {}

    def of(self, rack: int, m: int, d: int) -> int:
        return self.w.get((rack, m, d), 0)

    def count(self, s: Stream, m: int) -> int:
        return max(self.n.get((s.src, m, UP), 0), self.n.get((s.dst, m, DOWN), 0))

    def add(self, s: Stream, m: int, sign: int = 1) -> None:
        for key in ((s.src, m, UP), (s.dst, m, DOWN)):
            self.w[key] = self.w.get(key, 0) + sign * s.weight
            self.n[key] = self.n.get(key, 0) + sign
        for end in ((s.src, UP), (s.dst, DOWN)):
            self.ends[end] = self.ends.get(end, 0) + sign * s.weight
        if not s.weight:
            return  # carries nothing: shares no uplink with anyone
        for end in ((s.src, UP), (s.dst, DOWN)):
            conns = self.c.setdefault(end, {})
            conns[_conn(s)] = conns.get(_conn(s), 0) + sign
            if not conns[_conn(s)]:
                del conns[_conn(s)]

    def room(self, s: Stream, spines: int) -> bool:
        """Whether both ends of `s` have fewer other connections than
        `spines`: then each can have a spine of its own."""
        return all(len(self.c.get(end, {}).keys() - {_conn(s)}) < spines
                   for end in ((s.src, UP), (s.dst, DOWN)))  # fmt: skip

    def worst(self) -> int:
        return max(self.w.values(), default=0)

    def bound(self) -> int:
        """`lower_bound` of the streams these loads hold (live uplinks
        as the fabric now says)."""
        live = [sum(self.f.live(r, m) for m in range(self.f.spines))
                for r in range(self.f.racks)]  # fmt: skip
        bound = 0
        for (rack, _d), w in self.ends.items():
            if w and not live[rack]:
                raise ValueError(f"rack {rack} has no live uplink")
            if w:
                bound = max(bound, math.ceil(w / live[rack]))
        return bound

    def after(self, s: Stream, m: int) -> int:
        """The larger of the two loads `s` would make on spine m."""
        return max(self.of(s.src, m, UP), self.of(s.dst, m, DOWN)) + s.weight


def _conn(s: Stream):
    """A stream's connection: its key without the stream's own index (keys
    are tuples (job, connection, k[, "back"]); others are their own)."""
    if isinstance(s.key, tuple) and len(s.key) >= 3:
        return (s.key[0], s.key[1], s.key[3:])
    return s.key


def lower_bound(fabric: Fabric, streams: list[Stream]) -> int:
    """No assignment does better: the weight every rack end must spread over
    its live uplinks."""
    ends: dict[tuple[int, int], int] = {}
    for s in streams:
        if s.src == s.dst:
            continue
        for key in ((s.src, UP), (s.dst, DOWN)):
            ends[key] = ends.get(key, 0) + s.weight
    bound = 0
    for (rack, _d), w in ends.items():
        live = sum(fabric.live(rack, m) for m in range(fabric.spines))
        if live == 0:
            raise ValueError(f"rack {rack} has no live uplink")
        bound = max(bound, math.ceil(w / live))
    return bound


def place(fabric: Fabric, streams: list[Stream], fixed: list[Stream] = (),
          rebalance: bool = False, loads: Loads | None = None) -> int:
    """Sets `spine` of every stream between racks in `streams` (inside a
    rack: None), given the `fixed` ones already placed (other jobs'; moved
    too when `rebalance`), or, where the caller keeps them across calls,
    the `loads` of what is placed (updated here with `streams`: a placement
    then costs what it places, not everything placed before it). Returns
    the most loaded uplink's weight. Raises ValueError when a stream has no
    live spine."""
    movable = [s for s in streams if s.src != s.dst]
    for s in streams:
        if s.src == s.dst:
            s.spine = None
    if loads is None:
        loads = Loads(fabric)
        for s in fixed:
            if s.spine is not None and s.src != s.dst:
                if rebalance or not fabric.spines_for(s.src, s.dst).count(s.spine):
                    movable.append(s)
                else:
                    loads.add(s, s.spine)
    elif fixed or rebalance:
        raise ValueError("place: fixed streams or loads, not both")
    units = _units(movable)
    # Fewest choices first, heaviest first: the constrained ones get theirs.
    units.sort(key=lambda um: (len(fabric.spines_for(um[0].src, um[0].dst)), -um[0].weight))
    for u, _members in units[:1]:  # the fewest choices first: none is none
        if not fabric.spines_for(u.src, u.dst):
            raise ValueError(f"no live spine joins rack {u.src} to rack {u.dst}")
    placing: list[Stream] = []  # what is placed: whole connections, or streams
    whole: list[tuple[Stream, list[Stream]]] = []
    for u, members in units:
        options = fabric.spines_for(u.src, u.dst)
        # A connection goes whole onto one spine while its ends have a spine
        # for each connection; past that, sharing is certain, and its
        # streams spread so that it shares evenly.
        alone = len(members) == 1 or loads.room(u, len(options))
        if alone:
            whole.append((u, members))
        for s in [u] if alone else members:
            # Ties: the fewest streams (weightless ones are spread by count).
            s.spine = min(options, key=lambda m: (loads.after(s, m), loads.count(s, m), m))
            loads.add(s, s.spine)
            placing.append(s)
    _improve(fabric, loads, placing, loads.bound())
    for u, members in whole:
        # The loads count streams one by one (what `count` and `room` see).
        loads.add(u, u.spine, -1)
        for s in members:
            s.spine = u.spine
            loads.add(s, s.spine)
    return loads.worst()


def _units(streams: list[Stream]) -> list[tuple[Stream, list[Stream]]]:
    """The streams by connection and direction, each group with one stream
    that weighs what they weigh together (placed for them)."""
    groups: dict[tuple, list[Stream]] = {}
    for s in streams:
        groups.setdefault((_conn(s), s.src, s.dst), []).append(s)
    return [(Stream(g[0].key, g[0].src, g[0].dst, sum(s.weight for s in g)), g)
            for g in groups.values()]


def _improve(fabric: Fabric, loads: Loads, movable: list[Stream], bound: int) -> None:
    """Moves streams (and swaps chains of them) off the busiest uplink
    while that lowers it, down to `bound` at best."""
    for _ in range(4 * len(movable) + 16):
        worst = loads.worst()
        if worst <= bound:
            return
        if not any(_relieve(fabric, loads, movable, key, worst)
                   for key, w in sorted(loads.w.items()) if w == worst):
            return


def _relieve(fabric: Fabric, loads: Loads, movable: list[Stream], key: tuple[int, int, int],
             worst: int) -> bool:
    rack, m, d = key
    on = [s for s in movable if s.spine == m and (s.src if d == UP else s.dst) == rack]
    for s in on:
        for m2 in fabric.spines_for(s.src, s.dst):
            if m2 != m and loads.after(s, m2) < worst:
                loads.add(s, m, -1)
                loads.add(s, m2)
                s.spine = m2
                return True
    for s in on:
        for m2 in fabric.spines_for(s.src, s.dst):
            if m2 != m and _swap_chain(fabric, loads, movable, s, m, m2, worst):
                return True
    return False


def _swap_chain(fabric: Fabric, loads: Loads, movable: list[Stream], first: Stream, m: int,
                m2: int, worst: int) -> bool:
    """Moves `first` from spine m to m2 and then, one at a time, a stream
    at an uplink end that move overloaded back the other way (between m
    and m2 only), until no uplink it touched reaches `worst`; undone when
    the chain cannot close."""
    moved: list[tuple[Stream, int, int]] = []
    touched: set[tuple[int, int, int]] = set()

    def move(s: Stream, a: int, b: int) -> None:
        loads.add(s, a, -1)
        loads.add(s, b)
        s.spine = b
        moved.append((s, a, b))
        touched.update({(s.src, b, UP), (s.dst, b, DOWN)})

    move(first, m, m2)
    seen = {id(first)}
    for _ in range(2 * len(movable)):
        over = sorted(k for k in touched if loads.of(*k) >= worst)
        if not over:
            return True
        rack, spine, d = over[0]
        back = m if spine == m2 else m2
        nxt = next((s for s in movable if id(s) not in seen and s.spine == spine
                    and (s.src if d == UP else s.dst) == rack
                    and back in fabric.spines_for(s.src, s.dst)), None)  # fmt: skip
        if nxt is None:
            break
        seen.add(id(nxt))
        move(nxt, spine, back)
    for s, a, b in reversed(moved):
        loads.add(s, b, -1)
        loads.add(s, a)
        s.spine = a
    return False
