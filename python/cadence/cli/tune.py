"""Measure every algorithm on this machine or cluster and write a tuning table.

For each collective of --ops, times every cadence algorithm that applies on
this setting (not `auto`: it is what is being tuned) side by side in one job,
as `cadence bench --algo all` does, at sizes -b, -b*f, ... <= -e bytes (the
full buffer, as cadence bench and CADENCE_ALGO count it). At each size the
fastest algorithm with no wrong element wins. Where two neighbouring sizes
have different winners and lie 4x or more apart, the two are timed again at
the size halfway between (geometrically), so the switch is placed on a
measurement rather than a guess. The boundary between two measured sizes is
their geometric mean, so the winners become byte ranges 0..max, adjacent
ranges with the same winner merged.

A small calibration job first measures the cost model that `auto` uses for
what the table does not cover, by the core's own procedure (`Comm.calibrate`,
the one a job across hosts runs at start-up): α and β of shared memory and
of TCP from rank 0 (a link class the setting lacks keeps its default), γ
from the engine's reduction kernel, α scaled to a loaded allreduce.

The result is one setting, keyed by (ranks, hosts, ranks per host), merged into
--output (default: CADENCE_TUNING_FILE if set, else
$XDG_CACHE_HOME/cadence/tuning.json or ~/.cache/cadence/tuning.json, which
cadence reads when CADENCE_TUNING_FILE is not set): a setting with the same key
is replaced, the others are kept. Every rank of a job must load the same file:
copy it to every host. While measuring, the ranks read an empty table, so that
an old one changes nothing.

Exit status: 0 if every collective was measured and every result was right;
1 if a job failed (the collectives that were measured are still written) or
some algorithm gave a wrong result (it never wins); 2 for bad arguments or an
unreadable --output.

examples:
  cadence tune --nranks 4
  cadence tune --nranks 2 --ops allreduce -b 8 -e 1M -f 8 --dry-run
  cadence tune --cluster tb --ranks-per-host 2 --ops allreduce,allgather
  cadence tune --sim fat-tree.json --nranks 512 --dry-run

With --sim SPEC nothing runs: every algorithm is simulated on the cluster the
spec describes (`cadence sim`, docs/simulator.md) and the winners make the
setting (keyed by the spec's ranks, hosts and ranks per host), with the cost
model the spec's own numbers give: tuning entries for a cluster this machine
cannot reach. Simulated winners are as good as the model; check them with
`cadence tune` on the cluster when you have it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from cadence import testbed
from cadence.bench.common import DTYPES, OPS, size_sweep
from cadence.cli.bench import Reporter, unwind_on_signals
from cadence.cli.launch import Outcome, Workload, run_backend, run_program, units
from cadence.cli.options import _positive, add_cluster_arguments, add_sweep_arguments, resolve_ranks
from cadence.cli.report import Column, Table, best, print_rich, render_plain
from cadence.units import format_size

NAME = "tune"
HELP = "time every algorithm here and write a tuning table cadence chooses by"

DEFAULT_OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
# The cost model's defaults (crates/cadence-core/src/schedule/cost.rs), kept
# for a link class the setting has no pair of ranks on.
DEFAULT_LINKS = {
    "shm": {"alpha": 1e-6, "beta": 1 / 8e9},
    "tcp": {"alpha": 50e-6, "beta": 1 / 1.25e9},
}
DEFAULT_GAMMA = 1 / 4e9
INCAST = 0.1
EMPTY_TABLE = '{"version": 1, "settings": []}\n'


class TuneError(Exception):
    """A problem to report in one line (bad --output, a failed calibration)."""


def _ops(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in OPS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown collective(s) {', '.join(bad) or '(none)'}; choose from {', '.join(OPS)}"
        )
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nranks",
        type=_positive,
        help="local ranks (2; with --cluster: hosts x --ranks-per-host)",
    )
    add_cluster_arguments(p)
    p.add_argument(
        "--ops",
        type=_ops,
        default=",".join(DEFAULT_OPS),
        help=f"comma-separated collectives ({','.join(DEFAULT_OPS)})",
    )
    p.add_argument(
        "--dtype", choices=list(DTYPES), default="float32", help="element type timed (float32)"
    )
    add_sweep_arguments(p, stepfactor=4)
    p.add_argument(
        "--output",
        metavar="PATH",
        help="the tuning file to merge into (CADENCE_TUNING_FILE, else the default location)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the table, write nothing")
    p.add_argument(
        "--sim", metavar="SPEC",
        help="simulate on this cluster spec or topology file instead of measuring "
        "(--nranks: its ranks when the spec has no hosts)",
    )  # fmt: skip
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds one collective's sweep (or the calibration) may take (600)",
    )


# ------------------------------------------------------------ pure parts


def geometric_boundary(lo_size: int, hi_size: int) -> int:
    """The first byte count that belongs to `hi_size`'s range: the geometric
    mean of two measured sizes, rounded, kept within (lo_size, hi_size]."""
    mean = round(math.sqrt(lo_size * hi_size))
    return max(lo_size + 1, min(hi_size, mean))


def build_ranges(winners: list[tuple[int, str]]) -> list[tuple[int, int | None, str]]:
    """Per-size winners [(bytes, algo)] (any order) -> inclusive byte ranges
    [(lo, hi, algo)] covering 0..infinity (hi None: no upper end): the
    boundary between neighbouring sizes is their geometric mean; adjacent
    ranges with the same algorithm are merged."""
    points = sorted(dict(winners).items())  # one winner per size: the last given
    ranges: list[tuple[int, int | None, str]] = []
    lo = 0
    for i, (size, algo) in enumerate(points):
        hi = geometric_boundary(size, points[i + 1][0]) - 1 if i + 1 < len(points) else None
        if ranges and ranges[-1][2] == algo:
            lo = ranges.pop()[0]
        ranges.append((lo, hi, algo))
        lo = (hi or 0) + 1
    return ranges


def boundary_probes(winners: list[tuple[int, str]]) -> dict[int, tuple[str, str]]:
    """Sizes to time again, and the two algorithms to time there: halfway
    (geometrically) between neighbouring measured sizes that are 4x or more
    apart and have different winners."""
    points = sorted(dict(winners).items())
    probes = {}
    for (lo, a), (hi, b) in zip(points, points[1:], strict=False):
        if a != b and hi >= 4 * lo:
            probes[round(math.sqrt(lo * hi))] = (a, b)
    return probes


def choices_of(op: str, ranges: list[tuple[int, int | None, str]]) -> list[dict]:
    return [{"collective": op, "lo": lo, "hi": hi, "algo": algo} for lo, hi, algo in ranges]


def _sig(x: float) -> float:
    """Four significant digits: what the measurement is good for, and readable."""
    return float(f"{x:.4g}")


def model_from(found: dict) -> dict:
    """The setting's `model` from the core's calibration (calibrate.json's
    `model`, what `Comm.calibrate()` returned); a link class it did not
    measure keeps the default, untouched by the loaded-α scale."""
    measured = found.get("measured", ("shm", "tcp"))
    links = {
        kind: {
            k: _sig(v)
            for k, v in ((kind in measured and found.get(kind)) or DEFAULT_LINKS[kind]).items()
            if k in ("alpha", "beta")
        }
        for kind in ("shm", "tcp")
    }
    return {**links, "gamma": _sig(found.get("gamma") or DEFAULT_GAMMA), "incast": INCAST}


def default_output(env: dict[str, str]) -> Path:
    """Where the table goes: CADENCE_TUNING_FILE, else where cadence looks by
    default ($XDG_CACHE_HOME/cadence/tuning.json, ~/.cache/cadence/tuning.json).
    CADENCE_TUNING_FILE=none (tables off) still writes to the default place."""
    named = env.get("CADENCE_TUNING_FILE", "")
    if named and named.lower() != "none":
        return Path(named)
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "cadence" / "tuning.json"


def key_of(setting: dict) -> tuple:
    return (setting.get("nranks"), setting.get("nhosts"), setting.get("ranks_per_host"))


def load_table(path: Path) -> dict:
    """The tuning file at `path` (an empty one if there is none)."""
    if not path.exists():
        return {"version": 1, "settings": []}
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TuneError(
            f"{path}: not a readable tuning file ({e}); move it away or choose another --output"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("version") != 1
        or not isinstance(doc.get("settings"), list)
    ):
        raise TuneError(
            f"{path}: not a version 1 tuning file; move it away or choose another --output"
        )
    return doc


def merge(doc: dict, setting: dict) -> dict:
    """`doc` with `setting` in place of the one with the same (nranks, nhosts,
    ranks_per_host), or added; the others kept, in order."""
    settings = list(doc.get("settings", []))
    same = [i for i, s in enumerate(settings) if key_of(s) == key_of(setting)]
    if same:
        settings[same[0]] = setting
        settings = [s for i, s in enumerate(settings) if i not in same[1:]]
    else:
        settings.append(setting)
        settings.sort(key=lambda s: tuple(v if isinstance(v, int) else -1 for v in key_of(s)))
    return {**doc, "version": 1, "settings": settings}


def render(doc: dict) -> str:
    """Pretty JSON for people: two spaces per level, one key of a setting per
    line, and each link class of the model and each choice on one line."""

    def one(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    def block(open_: str, items: list[str], close: str, indent: str) -> str:
        if not items:
            return open_ + close
        return open_ + "\n" + ",\n".join(items) + "\n" + indent + close

    def setting_text(s: dict) -> str:
        lines = []
        for k, v in s.items():
            if k == "choices" and isinstance(v, list):
                lines.append(
                    block('      "choices": [', [f"        {one(c)}" for c in v], "]", "      ")
                )
            elif k == "model" and isinstance(v, dict):
                items = [f"        {one(mk)}: {one(mv)}" for mk, mv in v.items()]
                lines.append(block('      "model": {', items, "}", "      "))
            else:
                lines.append(f"      {one(k)}: {one(v)}")
        return block("    {", lines, "}", "    ")

    head = [f"  {one(k)}: {one(v)}" for k, v in doc.items() if k != "settings"]
    settings = [setting_text(s) for s in doc.get("settings", [])]
    return block("{", [*head, block('  "settings": [', settings, "]", "  ")], "}", "") + "\n"


def write_table(path: Path, doc: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render(doc))
    os.replace(tmp, path)


# ------------------------------------------------------------ measuring


@dataclass
class OpResult:
    op: str
    algos: list[str]
    outcomes: list[Outcome]
    winners: list[tuple[int, str]]  # (bytes, algo) per size with a correct result
    lead: dict[int, float]  # bytes -> runner-up time / winner time
    error: str | None = None
    wrong: list[str] | None = None  # "ring at 4K: 3 wrong"
    unjudged: list[int] | None = None  # sizes no algorithm got right

    @property
    def ranges(self) -> list[tuple[int, int | None, str]]:
        return build_ranges(self.winners)


def judge(job: Workload, op: str, algos: list[str], outcomes: list[Outcome]) -> OpResult:
    """The winner at each size: the fastest algorithm with no wrong element."""
    res = OpResult(op, algos, outcomes, [], {}, wrong=[], unjudged=[])
    res.error = next((o.error or o.na for o in outcomes if o.error or o.na), None)
    if res.error:
        return res  # a failed job's sizes are not trusted: the op keeps no choice
    for size in job.sizes:
        for o in outcomes:
            m = o.measures.get(size)
            if m is not None and m.wrong:
                res.wrong.append(f"{o.algo} at {format_size(m.nbytes)}: {m.wrong} wrong")
        top = best(outcomes, size)
        if top is None:
            if any(size in o.measures for o in outcomes):
                res.unjudged.append(size)
            continue
        m = top.measures[size]
        res.winners.append((m.nbytes, top.algo))
        others = sorted(
            o.measures[size].time_us
            for o in outcomes
            if o is not top and size in o.measures and not o.measures[size].wrong
        )
        if others and m.time_us > 0:
            res.lead[m.nbytes] = others[0] / m.time_us
    return res


def refine(res: OpResult, job: Workload, workdir: Path, rep: Reporter) -> None:
    """Times the two algorithms of each boundary probe (see
    `boundary_probes`) side by side and adds the faster as a winner."""
    probes = boundary_probes(res.winners)
    if not probes:
        return
    algos = [a for a in job.algos if any(a in pair for pair in probes.values())]
    probe_job = replace(job, sizes=sorted(probes), algos=algos)
    n = units(probe_job, "cadence")
    rep.grow(n)
    rep.start(f"{res.op} boundaries ({', '.join(format_size(s) for s in sorted(probes))})")
    outcomes = run_backend(probe_job, "cadence", workdir, rep.update)
    rep.finish(outcomes[0], n, label=f"{res.op} boundaries")
    if any(o.error or o.na for o in outcomes):
        return  # the sweep's winners stand
    for size, pair in probes.items():
        top = best([o for o in outcomes if o.algo in pair], size)
        if top is not None:
            res.winners.append((top.measures[size].nbytes, top.algo))
    res.winners.sort()


def calibrate(job: Workload, ops: list[str], workdir: Path) -> dict:
    """Run the calibration job on the setting; its calibrate.json."""
    outdir = workdir / "calibrate"
    cmd = [
        sys.executable,
        "-m",
        "cadence.bench.calibrate",
        "--out",
        str(outdir),
        "--ops",
        ",".join(ops),
    ]
    error = run_program(job, cmd, outdir)
    if error:
        raise TuneError(f"calibration job failed: {error}")
    try:
        return json.loads((outdir / "calibrate.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TuneError(f"calibration job wrote no result: {e}") from None


def summary_table(results: list[OpResult]) -> Table:
    columns = [Column("", t) for t in ("collective", "from", "to", "algorithm", "won at", "lead")]
    rows = []
    for r in results:
        if not r.winners:
            rows.append([r.op, "-", "-", "(not measured)", "-", "-"])
            continue
        for lo, hi, algo in r.ranges:
            won = [b for b, a in sorted(r.winners) if a == algo and lo <= b <= (hi or b)]
            spots = (
                format_size(won[0])
                if len(won) == 1
                else f"{format_size(won[0])}..{format_size(won[-1])} ({len(won)})"
            )
            leads = [r.lead[b] for b in won if b in r.lead]
            rows.append(
                [
                    r.op,
                    format_size(lo) if lo else "0",
                    "max" if hi is None else format_size(hi),
                    algo,
                    spots,
                    f"{min(leads):.2f}x" if leads else "-",
                ]
            )
    notes = [
        "from/to: inclusive bytes of the full buffer; won at: the measured sizes "
        "(count) where the algorithm was fastest; lead: the next fastest algorithm's "
        "time / the winner's, the least over those sizes (near 1.00x: a toss-up)"
    ]
    for r in results:
        if r.error:
            notes.append(f"{r.op}: FAILED: {r.error}")
        if r.wrong:
            notes.append(f"{r.op}: WRONG results (never chosen): {'; '.join(r.wrong)}")
        if r.unjudged:
            sizes = ", ".join(format_size(s) for s in r.unjudged)
            notes.append(f"{r.op}: no algorithm was right at {sizes}")
    return Table(columns, rows, notes)


def model_line(model: dict, calib: dict) -> str:
    measured = calib.get("model", {}).get("measured", ())

    def link(kind: str) -> str:
        c = model[kind]
        how = "measured" if kind in measured else "default"
        return f"{kind} α {c['alpha'] * 1e6:.1f} µs, {1 / c['beta'] / 1e9:.2f} GB/s ({how})"

    scale = calib.get("model", {}).get("loaded_scale")
    # The scale applies to the measured α's only.
    loaded = f"measured α x{scale:.2f} under load; " if scale else ""
    return (
        f"cost model: {link('shm')}; {link('tcp')}; {loaded}"
        f"γ {1 / model['gamma'] / 1e9:.2f} GB/s; incast {model['incast']}"
    )


# ------------------------------------------------------------ the command


def resolve_setting(args: argparse.Namespace) -> tuple[testbed.Cluster | None, int]:
    try:
        return resolve_ranks(args)
    except ValueError as e:
        raise TuneError(str(e)) from None


def setting_of(key: dict, note: str, model: dict, results: list[OpResult]) -> dict:
    """One setting of the tuning file: its key, note, cost model and choices."""
    choices = [c for r in results for c in choices_of(r.op, r.ranges)]
    return {**key, "note": note, "model": model, "choices": choices}


def save(setting: dict, output: Path, existing: dict | None, dry_run: bool) -> bool:
    """Merges `setting` into the table at `output` (True), or prints what it
    would write (False, --dry-run)."""
    if dry_run:
        print(f"# dry run: would merge into {output}:")
        print(render({"version": 1, "settings": [setting]}), end="")
        return False
    write_table(output, merge(existing, setting))
    return True


def model_of_spec(desc: dict) -> dict:
    """The cost model a start-up calibration would measure on a simulated
    cluster (`SimCluster.describe()`): α with the per-message overhead."""
    return {
        "shm": {"alpha": _sig(desc["shm_alpha"] + desc["shm_overhead"]),
                "beta": _sig(1 / min(desc["shm_rate"], desc["mem_rate"]))},
        "tcp": {"alpha": _sig(desc["tcp_alpha"] + desc["tcp_overhead"]),
                "beta": _sig(1 / min(desc["nic_out"] + desc["nic_in"]))},
        "gamma": _sig(desc["gamma"]),
        "incast": INCAST,
    }  # fmt: skip


def simulated(args: argparse.Namespace, sizes: list[int]) -> tuple[dict, list[OpResult], str]:
    """`cadence tune --sim`: (the setting's key, per-collective winners, where)."""
    from cadence import _core
    from cadence.bench.common import layout
    from cadence.cli.launch import Measure

    if args.cluster:
        raise TuneError("--sim and --cluster: simulate a cluster with `cadence sim --cluster`")
    try:
        text = Path(args.sim).read_text()
        model = _core.SimCluster(text, args.sim, args.nranks)
    except (OSError, ValueError) as e:
        raise TuneError(str(e)) from None
    n, hosts = model.nranks, model.nhosts
    key = {"nranks": n, "nhosts": hosts, "ranks_per_host": n // hosts}
    itemsize = DTYPES[args.dtype].itemsize
    results = []
    for op in args.ops:
        algos = list(model.algorithms(op))
        job = Workload(op=op, dtype=args.dtype, sizes=sizes, nranks=n, iters=1, warmup=0,
                  timeout=0.0, algos=algos)  # fmt: skip
        outcomes = []
        for a in algos:
            o = Outcome(backend="cadence", algo=a)
            for size in sizes:
                lay = layout(op, size, itemsize, n)
                if lay is None:
                    continue
                try:
                    _, secs, _ = model.run(op, lay.count, itemsize, a)
                except ValueError as e:
                    raise TuneError(f"{op} {a} at {format_size(lay.nbytes)}: {e}") from None
                o.measures[size] = Measure(size=size, nbytes=lay.nbytes, count=lay.count,
                                           time_us=secs * 1e6, wrong=0)  # fmt: skip
            outcomes.append(o)
        res = judge(job, op, algos, outcomes)
        print(f"tune: {op}: simulated {len(algos)} algorithms x {len(sizes)} sizes",
              file=sys.stderr, flush=True)  # fmt: skip
        results.append(res)
    return key, results, model_of_spec(model.describe())


def run_sim(args: argparse.Namespace, sizes: list[int], output: Path, existing, note: str) -> int:
    try:
        key, results, model = simulated(args, sizes)
    except TuneError as e:
        print(f"cadence tune: {e}", file=sys.stderr)
        return 2
    where = f"{key['nranks']} ranks on {key['nhosts']} hosts of {args.sim} (simulated)"
    table = summary_table(results)
    line = model_line(model, {"model": {"measured": ["shm", "tcp"]}})
    table.notes.append(line.replace("(measured)", "(the spec's)"))
    title = f"cadence tune --sim: {where}, {args.dtype}, " + (
        f"{format_size(sizes[0])}..{format_size(sizes[-1])} x{args.stepfactor}"
    )
    if sys.stdout.isatty():
        print_rich(table, title)
    else:
        print(f"# {title}\n{render_plain(table)}", flush=True)
    setting = setting_of(key, f"{note} (simulated)", model, results)
    if save(setting, output, existing, args.dry_run):
        print(f"# wrote the simulated setting ({where}) to {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        if args.sim:
            output = Path(args.output) if args.output else default_output(dict(os.environ))
            existing = None if args.dry_run else load_table(output)
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            argv = getattr(args, "argv", None) or sys.argv[1:]
            return run_sim(args, sizes, output, existing, f"cadence {shlex.join(argv)}, {stamp}")
        cluster, nranks = resolve_setting(args)
        output = Path(args.output) if args.output else default_output(dict(os.environ))
        existing = None if args.dry_run else load_table(output)
    except (ValueError, TuneError) as e:
        print(f"cadence tune: {e}", file=sys.stderr)
        return 2
    argv = getattr(args, "argv", None) or sys.argv[1:]
    stamp = datetime.now().astimezone().isoformat(timespec="seconds")
    note = f"cadence {shlex.join(argv)}, {stamp}"
    unwind_on_signals()

    with tempfile.TemporaryDirectory(prefix="cadence-tune-") as tmp:
        workdir = Path(tmp)
        # The ranks read an empty table: an old (or another setting's) one
        # must neither steer nor break the measurement.
        empty = workdir / "empty-tuning.json"
        empty.write_text(EMPTY_TABLE)

        def job_for(op: str, algos: list[str] | None) -> Workload:
            return Workload(
                op=op,
                dtype=args.dtype,
                sizes=sizes,
                nranks=nranks,
                iters=args.iters,
                warmup=max(0, args.warmup_iters),
                timeout=args.timeout,
                algos=algos,
                cluster=cluster,
                ranks_per_host=args.ranks_per_host,
                env={"CADENCE_TUNING_FILE": str(empty)},
            )

        print(f"tune: calibrating on {nranks} ranks ...", file=sys.stderr, flush=True)
        try:
            calib = calibrate(job_for(args.ops[0], None), args.ops, workdir)
        except TuneError as e:
            print(f"cadence tune: {e}", file=sys.stderr)
            return 1
        model = model_from(calib.get("model", {}))
        key = {k: calib[k] for k in ("nranks", "nhosts", "ranks_per_host")}
        where = (
            f"{key['nranks']} ranks on {key['nhosts']} host{'s' if key['nhosts'] != 1 else ''}, "
            f"{key['ranks_per_host'] or 'uneven'} per host"
        )
        print(f"tune: {where}; {model_line(model, calib)}", file=sys.stderr, flush=True)

        jobs = {
            op: job_for(op, [a for a in calib["algorithms"][op] if a != "auto"]) for op in args.ops
        }
        results = []
        with Reporter(sum(units(j, "cadence") for j in jobs.values()), prog="tune") as rep:
            for op, job in jobs.items():
                rep.start(f"{op} ({len(job.algos)} algorithms x {len(sizes)} sizes)")
                outcomes = run_backend(job, "cadence", workdir / op, rep.update)
                rep.finish(outcomes[0], units(job, "cadence"), label=op)
                res = judge(job, op, job.algos, outcomes)
                if res.error and outcomes[0].log_tail:
                    rep.say(f"--- {op} output (tail) ---\n{outcomes[0].log_tail}")
                if not res.error:
                    refine(res, job, workdir / f"{op}-probes", rep)
                text = ", ".join(
                    f"{a} {format_size(lo) if lo else 0}-{'max' if hi is None else format_size(hi)}"
                    for lo, hi, a in res.ranges
                )
                rep.say(f"tune: {op}: {text or 'nothing measured'}")
                results.append(res)

    title = (
        f"cadence tune: {where}, {args.dtype}, {args.iters} iters ({args.warmup_iters} "
        f"warm-up), {format_size(sizes[0])}..{format_size(sizes[-1])} x{args.stepfactor}"
    )
    table = summary_table(results)
    table.notes.append(model_line(model, calib))
    if sys.stdout.isatty():
        print_rich(table, title)
    else:
        print(f"# {title}\n{render_plain(table)}", flush=True)

    setting = setting_of(key, note, model, results)
    if save(setting, output, existing, args.dry_run):
        print(f"# wrote the setting ({where}) to {output}")
        if cluster:
            print(
                "# every host of a job must read the same file (copy it, or point "
                "CADENCE_TUNING_FILE at one place)"
            )
    failed = any(r.error for r in results)
    wrong = any(r.wrong for r in results)
    return 1 if failed or wrong else 0
