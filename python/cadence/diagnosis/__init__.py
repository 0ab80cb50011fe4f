"""Diagnosis of hangs and slowdowns from the records every rank keeps.

    from cadence.diagnosis import load_dir, diagnose
    dumps, skipped = load_dir("/tmp/dumps")
    verdict = diagnose(dumps)
    print(verdict.text())            # or verdict.to_json()

Classes (`VerdictClass`, verdict.py): `comm_hang`, `noncomm_hang`,
`mismatch` (found by classify.py), `comm_slow`, `noncomm_slow` (slow.py),
`healthy`. The same classifier runs
post-mortem (`cadence doctor DUMPDIR`: dumps.py, with trace.py,
report_html.py and exclude.py for its reports) and live inside the job
(live.py: the watchdog, `cadence doctor --store`); metrics.py serves
Prometheus metrics (`CADENCE_METRICS_PORT`). See docs/diagnosis.md.
"""

# The names below load their module on first use: `import cadence` imports
# the watchdog (live.py) from this package, and a job that never judges a
# hang need not load the classifier.
_HOMES = {
    "verdict": ("CLASSES", "COMM_HANG", "COMM_SLOW", "HEALTHY", "MISMATCH", "NONCOMM_HANG",
                "NONCOMM_SLOW", "Verdict", "VerdictClass"),
    "classify": ("diagnose",),
    "dumps": ("Dump", "DumpError", "LinkCounters", "Msg", "Op", "load_dir", "parse"),
    "slow": ("SlowWatch", "diagnose_slow"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    home = _HOME_OF.get(name)
    if home == "verdict":
        from cadence.diagnosis import verdict as module
    elif home == "classify":
        from cadence.diagnosis import classify as module
    elif home == "dumps":
        from cadence.diagnosis import dumps as module
    elif home == "slow":
        from cadence.diagnosis import slow as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
