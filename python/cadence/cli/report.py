"""The results table and JSON records of `cadence bench`.

With several cadence algorithms (`--algo all`, `--algo auto,ring`) each is a
column group of its own (`cadence:ring`); the cadence/<peer> ratios use `auto`
(else the first algorithm), and `best` / `auto/best` say which algorithm was
fastest at each size and how far cadence's own choice is from it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cadence.bench.common import DTYPES, REDUCING_OPS, busbw_factor, layout
from cadence.cli.launch import Measure, Outcome, Workload
from cadence.units import fmt_gbps, fmt_ratio, fmt_share, fmt_us, format_size

# time: the median sample (a sample: the mean of a batch of back-to-back
# calls, see cadence.bench.worker); p99: the 99th percentile of the samples,
# the tail a training step would feel. Both the slowest rank's, or with
# `--timing span` the samples' from the first rank's start to the last's end.
BACKEND_COLUMNS = ("time(us)", "p99(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong")
# auto counts as close to the best when auto/best, as the table shows it (two
# decimals), is at least this: within 10% of the best algorithm's speed.
NEAR_BEST = 0.90


def near_best(r: float) -> bool:
    return float(fmt_share(r)) >= NEAR_BEST


@dataclass(frozen=True)
class Column:
    group: str  # a backend, or "" for the leading and trailing columns
    title: str


@dataclass
class Table:
    columns: list[Column]
    rows: list[list[str]]
    notes: list[str]


def algbw(nbytes: int, time_us: float) -> float:
    """GB/s (1e9 bytes per second), as nccl-tests."""
    return nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else math.inf


def peers(outcomes: list[Outcome]) -> list[str]:
    """The backends compared with cadence (none if cadence is not in the run)."""
    names = [o.backend for o in outcomes]
    return [n for n in names if n != "cadence"] if "cadence" in names else []


def cadence_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """cadence's outcomes, one per algorithm timed."""
    return [o for o in outcomes if o.backend == "cadence"]


def reference(outcomes: list[Outcome]) -> Outcome | None:
    """The cadence outcome the peers are compared with: `auto` if it ran, else
    the first algorithm."""
    mine = cadence_outcomes(outcomes)
    return next((o for o in mine if o.algo == "auto"), mine[0] if mine else None)


def best(outcomes: list[Outcome], size: int) -> Outcome | None:
    """The fastest cadence algorithm at `size` among those with no wrong element."""
    timed = [
        o
        for o in cadence_outcomes(outcomes)
        if (m := o.measures.get(size)) is not None and m.wrong == 0 and m.time_us > 0
    ]
    return min(timed, key=lambda o: o.measures[size].time_us, default=None)


def auto_vs_best(outcomes: list[Outcome], size: int) -> float | None:
    """best time / auto time (at most 1; 1 when auto is the best), or None."""
    auto = next((o for o in cadence_outcomes(outcomes) if o.algo == "auto"), None)
    top = best(outcomes, size)
    mine = auto.measures.get(size) if auto else None
    if mine is None or top is None or mine.time_us <= 0:
        return None
    return top.measures[size].time_us / mine.time_us


def compares_algos(outcomes: list[Outcome]) -> tuple[bool, bool]:
    """(several cadence algorithms were timed, one of them is auto)."""
    mine = cadence_outcomes(outcomes)
    return len(mine) > 1, len(mine) > 1 and any(o.algo == "auto" for o in mine)


def backend_cells(job: Workload, outcome: Outcome, size: int) -> list[str]:
    m = outcome.measures.get(size)
    if m is not None:
        bw = algbw(m.nbytes, m.time_us)
        busbw = bw * busbw_factor(job.op, job.nranks)
        p99 = "-" if m.p99_us is None else fmt_us(m.p99_us)
        return [fmt_us(m.time_us), p99, fmt_gbps(bw), fmt_gbps(busbw), str(m.wrong)]
    width = len(BACKEND_COLUMNS)
    if outcome.na:
        return ["n/a"] * width
    if outcome.error:
        return ["error"] + ["-"] * (width - 1)
    return ["-"] * width


def build_table(job: Workload, outcomes: list[Outcome], copy_gbps: float | None = None) -> Table:
    by_name = {o.backend: o for o in outcomes if o.backend != "cadence"}
    several, with_auto = compares_algos(outcomes)
    columns = [Column("", t) for t in ("size", "count", "type", "redop")]
    for o in outcomes:
        columns += [Column(o.name, t) for t in BACKEND_COLUMNS]
    columns += [Column("", f"cadence/{p}") for p in peers(outcomes)]
    if several:
        titles = ("chosen", "best", "auto/best") if with_auto else ("best",)
        columns += [Column("", t) for t in titles]
    cadence = reference(outcomes)
    auto = next((o for o in cadence_outcomes(outcomes) if o.algo == "auto"), None)

    rows = []
    redop = "sum" if job.op in REDUCING_OPS else "none"
    itemsize = DTYPES[job.dtype].itemsize
    for size in job.sizes:
        lay = layout(job.op, size, itemsize, job.nranks)
        if lay is None:
            continue
        row = [format_size(lay.nbytes), str(lay.count), job.dtype, redop]
        for o in outcomes:
            row += backend_cells(job, o, size)
        for p in peers(outcomes):
            row.append(fmt_ratio(ratio(cadence, by_name[p], size)))
        if several:
            top = best(outcomes, size)
            if with_auto:
                m = auto.measures.get(size)
                row.append((m.chosen or "?") if m else "-")
            row.append(top.algo if top else "-")
            if with_auto:
                r = auto_vs_best(outcomes, size)
                row.append("-" if r is None else fmt_share(r))
        rows.append(row)
    return Table(columns, rows, build_notes(job, outcomes, copy_gbps))


def ratio(cadence: Outcome | None, peer: Outcome, size: int) -> float | None:
    """peer time / cadence time: above 1 means cadence is faster."""
    mine = cadence.measures.get(size) if cadence else None
    theirs = peer.measures.get(size)
    if mine is None or theirs is None or mine.time_us <= 0:
        return None
    return theirs.time_us / mine.time_us


def build_notes(job: Workload, outcomes: list[Outcome],
                copy_gbps: float | None = None) -> list[str]:
    notes = []
    for o in outcomes:
        # cadence's algorithms run in one launch: its failure is theirs, said once.
        line = (
            f"{o.backend}: FAILED: {o.error}" if o.error
            else f"{o.backend}: n/a: {o.na}" if o.na
            else None
        )  # fmt: skip
        if line and line not in notes:
            notes.append(line)
    factor = busbw_factor(job.op, job.nranks)
    avgs = []
    for o in outcomes:
        ms = list(o.measures.values())
        if ms:
            avg = sum(algbw(m.nbytes, m.time_us) * factor for m in ms) / len(ms)
            avgs.append(f"{o.name} {fmt_gbps(avg)}")
    if avgs:
        notes.append("avg busbw (GB/s): " + ", ".join(avgs))
    if copy_gbps:
        # On one host the limit is memory bandwidth: say how far each backend is from it.
        peaks = [
            f"{o.name} {fmt_gbps(peak)} ({peak / copy_gbps:.0%})"
            for o in outcomes
            if o.measures
            for peak in [max(algbw(m.nbytes, m.time_us) * factor for m in o.measures.values())]
        ]
        notes.append(
            f"one core copies memory at {fmt_gbps(copy_gbps)} GB/s; "
            "peak busbw (GB/s, share of that): " + (", ".join(peaks) or "-")
        )
    by_name = {o.backend: o for o in outcomes if o.backend != "cadence"}
    cadence = reference(outcomes)
    several, with_auto = compares_algos(outcomes)
    which = f" ({cadence.name})" if several and cadence else ""
    for p in peers(outcomes):
        rs = [r for s in job.sizes if (r := ratio(cadence, by_name[p], s)) is not None]
        if rs:
            geomean = math.exp(sum(map(math.log, rs)) / len(rs))
            notes.append(
                f"cadence/{p}{which}: geomean {fmt_ratio(geomean)} over {len(rs)} sizes "
                f"(min {fmt_ratio(min(rs))}, max {fmt_ratio(max(rs))}; "
                "above 1 means cadence is faster)"
            )
    if with_auto:
        notes.append(auto_summary(job, outcomes))
    for note in (rounds_spread(outcomes), timings_disagree(job, outcomes)):
        if note:
            notes.append(note)
    wrong = sum(m.wrong for o in outcomes for m in o.measures.values())
    notes.append(f"#wrong total: {wrong}")
    return notes


def median_and_worst(name: str, ratios: list[tuple[float, int]]) -> str:
    """One backend's part of a note over sizes: the median of its (ratio,
    bytes) pairs (the upper middle for an even count) and the worst one."""
    mid = sorted(r for r, _ in ratios)[len(ratios) // 2]
    worst, nbytes = max(ratios)
    return f"{name} {mid:.2f}x (worst {worst:.2f}x at {format_size(nbytes)})"


def rounds_spread(outcomes: list[Outcome]) -> str | None:
    """With `--rounds`: how steady each backend's medians were from round to
    round (a size's spread: its slowest round's median over its fastest's),
    the median spread over the sizes and the worst one."""
    parts, nrounds = [], 0
    for o in outcomes:
        spreads = [
            (max(m.round_times) / min(m.round_times), m.nbytes)
            for m in o.measures.values()
            if len(m.round_times) > 1 and min(m.round_times) > 0
        ]
        if not spreads:
            continue
        nrounds = max(nrounds, *(len(m.round_times) for m in o.measures.values()))
        parts.append(median_and_worst(o.name, spreads))
    if not parts:
        return None
    return (
        f"round-to-round spread of the medians over {nrounds} rounds (slowest round / "
        "fastest; median over sizes, worst): " + ", ".join(parts)
    )


# The other timing is worth a note when some size's median moves this much
# between them (docs/bench-cli.md, "Timing across ranks").
TIMINGS_APART = 1.25


def timings_disagree(job: Workload, outcomes: list[Outcome]) -> str | None:
    """Where the span across ranks is well above the slowest rank's own time
    (ranks staggered: more ranks than cores, or a barrier that lets them out
    apart), each backend's median and worst span/rank over the sizes, so
    that a reader of the default table knows the other timing differs."""
    parts, apart = [], False
    for o in outcomes:
        shares = [
            (m.span_time_us / m.rank_time_us, m.nbytes)
            for m in o.measures.values()
            if m.span_time_us is not None and m.rank_time_us
        ]
        if not shares:
            continue
        apart = apart or max(shares)[0] >= TIMINGS_APART
        parts.append(median_and_worst(o.name, shares))
    if not apart:
        return None
    shown = (
        "first start to last end (--timing span)" if job.timing == "span"
        else "the slowest rank's own time (--timing rank)"
    )  # fmt: skip
    return (
        "ranks ran staggered: first start to last end over the slowest rank's own time "
        f"(median over sizes, worst): {', '.join(parts)}; the table shows {shown}"
    )


def auto_summary(job: Workload, outcomes: list[Outcome]) -> str:
    """In how many sizes auto is within 10% of the fastest algorithm's speed
    (auto/best >= NEAR_BEST), and where it is not."""
    itemsize = DTYPES[job.dtype].itemsize
    near, total, misses = 0, 0, []
    for size in job.sizes:
        r = auto_vs_best(outcomes, size)
        if r is None:
            continue
        total += 1
        if near_best(r):
            near += 1
        else:
            lay = layout(job.op, size, itemsize, job.nranks)
            nbytes = lay.nbytes if lay else size
            misses.append(f"{format_size(nbytes)} {best(outcomes, size).algo} {fmt_share(r)}")
    line = (
        f"auto within {1 - NEAR_BEST:.0%} of the best cadence algorithm at {near} of {total} sizes"
    )
    if misses:
        line += " (elsewhere: size, best, auto/best: " + "; ".join(misses) + ")"
    return line


def render_plain(table: Table) -> str:
    """nccl-tests-like fixed-width text: backend names over their columns."""
    cols = table.columns
    widths = [max(len(c.title), *(len(r[i]) for r in table.rows)) if table.rows else len(c.title)
              for i, c in enumerate(cols)]  # fmt: skip
    # The group line: each backend name centred over its columns.
    group_line, i = [], 0
    while i < len(cols):
        j = i
        while j < len(cols) and cols[j].group == cols[i].group:
            j += 1
        span = sum(widths[i:j]) + 2 * (j - i - 1)
        group_line.append(f"{cols[i].group:^{span}}" if cols[i].group else " " * span)
        i = j
    lines = ["  ".join(group_line).rstrip()]
    lines.append("  ".join(f"{c.title:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for row in table.rows:
        lines.append("  ".join(f"{cell:>{w}}" for cell, w in zip(row, widths, strict=True)))
    lines += [f"# {note}" for note in table.notes]
    return "\n".join(lines)


def _style(cell: str, title: str) -> str:
    if cell == "error":
        return f"[bold red]{cell}[/]"
    if cell == "n/a":
        return f"[dim]{cell}[/]"
    if title == "#wrong" and cell not in ("0", "-"):
        return f"[bold red]{cell}[/]"
    if title.startswith("cadence/") and cell.endswith("x"):
        return f"[green]{cell}[/]" if float(cell[:-1]) >= 1 else f"[yellow]{cell}[/]"
    if title == "auto/best" and cell != "-":
        return f"[green]{cell}[/]" if near_best(float(cell)) else f"[yellow]{cell}[/]"
    return cell


def print_rich(table: Table, title: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table as RichTable

    t = RichTable(
        title=title, box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False,
        collapse_padding=True,
    )  # fmt: skip
    # "cadence:recursive_doubling" on two lines, so that it widens its column less.
    depth = max((c.group.count(":") + 1 for c in table.columns if c.group), default=1)
    previous = None
    for c in table.columns:
        parts = c.group.split(":") if c.group and c.group != previous else []
        header = "\n".join([*parts, *[""] * (depth - len(parts)), c.title])
        t.add_column(header, justify="right", no_wrap=True)
        previous = c.group
    for row in table.rows:
        t.add_row(*(_style(cell, c.title) for cell, c in zip(row, table.columns, strict=True)))
    console = Console()
    unbounded = console.options.update_width(1 << 16)  # console.measure caps at the width
    if Measurement.get(console, unbounded, t).maximum > console.width:
        # Too wide for the terminal (many algorithms): rich would cut every
        # cell short; the plain table loses nothing (pipe it to `less -S`).
        console.print(f"# {title}\n{render_plain(table)}", markup=False, highlight=False,
                      soft_wrap=True)  # fmt: skip
        return
    console.print(t)
    for note in table.notes:
        console.print(f"# {note}", markup=False, highlight=False)


def json_records(job: Workload, outcomes: list[Outcome]) -> list[dict]:
    factor = busbw_factor(job.op, job.nranks)
    records = []
    for o in outcomes:
        for size in job.sizes:
            m: Measure | None = o.measures.get(size)
            if m is None:
                continue
            bw = algbw(m.nbytes, m.time_us)
            records.append({
                "backend": o.backend,
                "op": job.op,
                "dtype": job.dtype,
                "bytes": m.nbytes,
                "nranks": job.nranks,
                "algo": o.algo,
                "chosen": m.chosen,
                "time_us": m.time_us,
                "p99_us": m.p99_us,
                "timing": job.timing,
                # Both timings' medians of the same samples (docs/bench-cli.md).
                "rank_time_us": m.rank_time_us,
                "span_time_us": m.span_time_us,
                "algbw": bw,
                "busbw": bw * factor,
                "wrong": m.wrong,
                **({"round_time_us": m.round_times} if len(m.round_times) > 1 else {}),
            })  # fmt: skip
    return records
