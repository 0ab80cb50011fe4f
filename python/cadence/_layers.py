"""Which modules of the package are the library and which are its tools.

The library is what a user's program imports: `cadence` (the communicator),
`cadence.torch`, `cadence.ray_collective`, `cadence.fused`, `cadence.topo` and the live diagnosis
with the classifier it runs inside a job. The tools are what the `cadence`
command and the test rigs run: the CLI, the benchmark harness, the testbed
(emulated clusters, soak runs, campaigns) and the post-mortem reports.

Two rules keep the library light and the package untangled (checked by
tests/test_layers.py, which reads every `import` in the package):

- no library module imports a tool module, not even inside a function:
  a training job never loads the CLI or the testbed;
- the import graph has no cycle: every module can be read, tested and
  replaced on top of the ones it imports.

A module belongs to the longest entry below that names it or a package
above it; the entries of MIXED, packages with modules in both layers, name
their __init__ alone, so a new module there must be placed by hand.
"""

from __future__ import annotations

MIXED = ("cadence", "cadence.diagnosis", "cadence.planner")

LIBRARY = (
    "cadence",  # the package root: init, Communicator, the torch hook
    "cadence._buffers",
    "cadence._communicator",
    "cadence._core",  # the compiled core (crates/cadence-py)
    "cadence._dtypes",
    "cadence._layers",
    "cadence._rendezvous",
    "cadence.diagnosis",  # the package root re-exports the classifier
    "cadence.diagnosis.classify",
    "cadence.diagnosis.dumps",
    "cadence.diagnosis.live",
    "cadence.diagnosis.metrics",
    "cadence.diagnosis.reach",
    "cadence.diagnosis.slow",
    "cadence.diagnosis.store_lost",
    "cadence.diagnosis.summary",
    "cadence.diagnosis.unreachable",
    "cadence.diagnosis.verdict",
    "cadence.fused",
    "cadence.planner",  # the package root: nothing but its docstring
    "cadence.planner.protocol",  # the planner's wire format and the client a job holds
    "cadence.ray_collective",  # the backend of Ray's collectives
    "cadence.topo",
    "cadence.torch",
    "cadence.units",  # parsing and printing sizes, rates and times
)

TOOLS = (
    "cadence.bench",
    "cadence.cli",
    "cadence.reference",  # numpy results of the collectives, for the checks
    "cadence.diagnosis.exclude",
    "cadence.diagnosis.report_html",
    "cadence.diagnosis.trace",
    "cadence.planner.assign",  # the planner service and what only it runs
    "cadence.planner.layout",
    "cadence.planner.probe",
    "cadence.planner.service",
    "cadence.testbed",
    "cadence.topo.draw",  # `cadence topo show --png`
)


def layer(module: str) -> str | None:
    """The layer of `module`: "library", "tools", or None when neither lists it."""
    best, where = "", None
    for name, kind in [(m, "library") for m in LIBRARY] + [(m, "tools") for m in TOOLS]:
        above = module.startswith(name + ".") and name not in MIXED
        if (module == name or above) and len(name) > len(best):
            best, where = name, kind
    return where
