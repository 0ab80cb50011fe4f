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
    HEALTHY,
    MISMATCH,
    NONCOMM_HANG,
    Verdict,
    diagnose,
)
from cadence.diagnosis.dumps import Dump, DumpError, Msg, Op, load_dir, parse

__all__ = [
    "CLASSES", "COMM_HANG", "HEALTHY", "MISMATCH", "NONCOMM_HANG", "Dump", "DumpError", "Msg",
    "Op", "Verdict", "diagnose", "load_dir", "parse",
]
