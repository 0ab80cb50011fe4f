"""What a diagnosis concludes: the class of the problem (`VerdictClass`),
and the verdict that names it with its evidence (`Verdict`). Shared by the
hang classifier (classify.py), the slowdown detector (slow.py), the live
watchdog and the reports, so none of them imports another for its words."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cadence.diagnosis.dumps import Op


class VerdictClass(StrEnum):
    """The class of a verdict; a `str`, so it compares equal to, prints as
    and is written to JSON as its value ("comm_hang")."""

    HEALTHY = "healthy"
    NONCOMM_HANG = "noncomm_hang"
    COMM_HANG = "comm_hang"
    MISMATCH = "mismatch"
    COMM_SLOW = "comm_slow"
    NONCOMM_SLOW = "noncomm_slow"
    #: Not a finding: the live diagnosis itself failed (its headline says why).
    UNKNOWN = "unknown"


HEALTHY = VerdictClass.HEALTHY
NONCOMM_HANG = VerdictClass.NONCOMM_HANG
COMM_HANG = VerdictClass.COMM_HANG
MISMATCH = VerdictClass.MISMATCH
COMM_SLOW = VerdictClass.COMM_SLOW
NONCOMM_SLOW = VerdictClass.NONCOMM_SLOW
#: The classes the classifier finds.
CLASSES = (HEALTHY, NONCOMM_HANG, COMM_HANG, MISMATCH, COMM_SLOW, NONCOMM_SLOW)


@dataclass
class Verdict:
    cls: VerdictClass
    headline: str
    comm: str | None = None
    op: Op | None = None
    ranks: list[int] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    job: str | None = None
    #: Seconds since the epoch (rank 0's clock) when the operation got stuck.
    since: float | None = None
    #: Python stacks of the named ranks (live diagnosis), faulthandler style.
    stacks: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        op = None
        if self.op is not None:
            op = {"comm": self.comm, "seq": self.op.seq, "collective": self.op.collective,
                  "bytes": self.op.bytes}
        return {
            "class": str(self.cls), "verdict": self.headline, "job": self.job, "op": op,
            "ranks": self.ranks, "links": [list(x) for x in self.links], "hosts": self.hosts,
            "evidence": self.evidence,
            **({"stacks": {str(r): t for r, t in self.stacks.items()}} if self.stacks else {}),
        }

    def text(self) -> str:
        lines = [f"cadence doctor: {self.headline}"]
        lines += [f"  {e}" for e in self.evidence]
        for r, text in sorted(self.stacks.items()):
            lines.append(f"  rank {r}'s Python stack when the others were stuck:")
            lines += [f"    {x}" for x in text.rstrip().splitlines()]
        return "\n".join(lines)


def ranks_text(ranks) -> str:
    """`0-3,5`"""
    rs = sorted(set(ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)
