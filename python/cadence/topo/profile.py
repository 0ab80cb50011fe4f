"""`cadence topo profile` inside a job: measure the network between the
job's hosts the way collectives load it, and return the topology file.

The measurement is the core's (crates/cadence-core/src/comm/profile.rs, the
same one a job without CADENCE_TOPO_FILE runs at start-up): one rank per
host sends and receives in synchronized rounds (every pair alone, flows out
of and into each inferred group together, rounds of shifted flows where the
pairs found no groups or are too many, and, here, the rank-order and the
found ring under load). What is measured and the file format are in
docs/topology.md.
"""

from __future__ import annotations


def profile(comm, seconds: float = 0.05, note: str = "", progress: bool = True,
            rings: bool = True, pairs_max: int | None = None) -> dict:
    """Profiles the network between `comm`'s hosts (collective over every
    rank of `comm`); returns the topology file's contents, the same on every
    rank. With `progress`, rank 0 prints a line per stage. Up to `pairs_max`
    hosts (default 16) every pair is measured alone; beyond, only rounds of
    shifted flows (about 2 log2(hosts) of them). The dict has "rates" even
    where the file keeps each host's best rates instead (`cadence.topo.to_text`
    writes it so)."""
    from cadence.topo import from_text

    text = comm._c.profile_topology(seconds, rings, note,
                                    "cadence topo: " if progress else None,
                                    pairs_max)  # fmt: skip
    return from_text(text)
