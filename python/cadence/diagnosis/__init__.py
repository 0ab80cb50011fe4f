"""Diagnosis of hangs from the records every rank keeps (issue 12, first
slice: post-mortem).

    from cadence.diagnosis import load_dir, diagnose
    dumps, skipped = load_dir("/tmp/dumps")
    verdict = diagnose(dumps)
    print(verdict.text())            # or verdict.to_json()

`cadence doctor DUMPDIR` is the command-line face. Classes: `comm_hang`,
`noncomm_hang`, `mismatch`, `healthy` (see `classify.py`); the slowness
classes and the live exchange are not built yet (docs/diagnosis.md).
"""

from cadence.diagnosis.classify import (
    CLASSES,
    COMM_HANG,
    COMM_SLOW,
    HEALTHY,
    MISMATCH,
    NONCOMM_HANG,
    NONCOMM_SLOW,
    Verdict,
    diagnose,
)
from cadence.diagnosis.dumps import Dump, DumpError, LinkCounters, Msg, Op, load_dir, parse
from cadence.diagnosis.slow import SlowWatch, diagnose_slow

__all__ = [
    "CLASSES", "COMM_HANG", "COMM_SLOW", "HEALTHY", "MISMATCH", "NONCOMM_HANG", "NONCOMM_SLOW",
    "Dump", "DumpError", "LinkCounters", "Msg", "Op", "SlowWatch", "Verdict", "diagnose",
    "diagnose_slow", "load_dir", "parse",
]
