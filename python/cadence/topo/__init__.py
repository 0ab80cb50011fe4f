"""Topology: measure the network between a job's hosts (`profile`) and draw
it (`draw`). The profiler, the inference of groups that share a bottleneck,
and the path finder that turns a topology file into ring orders are the
core's (crates/cadence-core/src/comm/profile.rs and src/fabric); the file
format is in docs/topology.md."""



def from_text(text: str) -> dict:
    """A topology file's text as a dict, with its alone-rate matrix under
    "rates" also where the file stores each host's best rates instead
    ("host_rates", as a profile by shifted rounds writes it): the core
    computes the matrix from them."""
    import json

    doc = json.loads(text)
    if "rates" not in doc:
        from cadence import _core

        doc["rates"] = _core.topo_rates(text)
    return doc


def to_text(doc: dict) -> str:
    """The file's text for `doc`: without "rates" where "host_rates" gives
    them (n numbers a direction instead of n squared)."""
    import json

    keep = {k: v for k, v in doc.items() if not (k == "rates" and "host_rates" in doc)}
    return json.dumps(keep, indent=1) + "\n"


def load(path) -> dict:
    """A topology file, read as `from_text` reads it."""
    from pathlib import Path

    return from_text(Path(path).read_text())
