"""Diagnosis of hangs and slowdowns from the records every rank keeps.

    from cadence.diagnosis import load_dir, diagnose
    dumps, skipped = load_dir("/tmp/dumps")
    verdict = diagnose(dumps)
    print(verdict.text())            # or verdict.to_json()

Classes: `comm_hang`, `noncomm_hang`, `mismatch` (classify.py),
`comm_slow`, `noncomm_slow` (slow.py), `healthy`. The same classifier runs
post-mortem (`cadence doctor DUMPDIR`: dumps.py, with trace.py,
report_html.py and exclude.py for its reports) and live inside the job
(live.py: the watchdog, `cadence doctor --store`); metrics.py serves
Prometheus metrics (`CADENCE_METRICS_PORT`). See docs/diagnosis.md.
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
