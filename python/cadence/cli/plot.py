"""`cadence bench --plot FILE.png`: time and busbw against message size, one
line per backend (or per cadence algorithm with --algo), from the same merged
measurements as the table.

Two panels side by side: time per call (log-log, the median as a line and the
p99 as a shaded band above it, so tails are visible at a glance) and busbw
(log x), with the physical limit as a dashed line when the caller knows it
(memory copy rate on one host, the link rate across hosts)."""

from __future__ import annotations

from pathlib import Path

from cadence.bench.common import busbw_factor
from cadence.cli.launch import Outcome, Workload
from cadence.units import format_size


class PlotError(Exception):
    """The plot could not be drawn (matplotlib missing, nothing measured, bad path)."""


def series(job: Workload,
           outcome: Outcome) -> tuple[list[int], list[float], list[float], list[float]]:
    """(bytes, median us, p99 us, busbw GB/s) of the sizes `outcome` measured
    without a wrong result, in size order. p99 falls back to the median where
    the records do not carry one."""
    factor = busbw_factor(job.op, job.nranks)
    xs, med, p99, bus = [], [], [], []
    for size in sorted(outcome.measures):
        m = outcome.measures[size]
        if m.wrong or m.time_us <= 0:
            continue
        xs.append(m.nbytes)
        med.append(m.time_us)
        p99.append(m.p99_us if m.p99_us is not None else m.time_us)
        bus.append(m.nbytes / (m.time_us * 1e-6) / 1e9 * factor)
    return xs, med, p99, bus


def plot(
    job: Workload,
    outcomes: list[Outcome],
    path: str | Path,
    title: str,
    limit_gbps: float | None = None,
    limit_label: str = "",
) -> Path:
    """Draws the two panels into `path` (PNG, or any format matplotlib knows
    from the suffix) and returns it. Raises PlotError."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a cluster node
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        raise PlotError(
            f"matplotlib is not installed ({e}); `make build` installs it "
            "(requirements-tools.txt), or `pip install matplotlib`"
        ) from e
    lines = [(o.name, *series(job, o)) for o in outcomes]
    lines = [ln for ln in lines if ln[1]]
    if not lines:
        raise PlotError("nothing to plot: no backend measured a size without errors")
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    for name, xs, med, p99, bus in lines:
        (line,) = ax_t.plot(xs, med, marker="o", markersize=3, label=name)
        ax_t.fill_between(xs, med, p99, color=line.get_color(), alpha=0.15, linewidth=0)
        ax_b.plot(xs, bus, marker="o", markersize=3, label=name, color=line.get_color())
    if limit_gbps:
        ax_b.axhline(limit_gbps, color="grey", linestyle="--", linewidth=1, label=limit_label)
    size_fmt = FuncFormatter(lambda v, _pos: format_size(int(v)) if v >= 1 else "")
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(size_fmt)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (µs): median, shaded up to p99")
    ax_b.set_ylabel("busbw (GB/s)")
    ax_b.set_ylim(bottom=0)
    ax_b.legend(loc="upper left", fontsize="small")
    fig.suptitle(title, fontsize="medium")
    out = Path(path)
    try:
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:
        raise PlotError(f"cannot write {out}: {e}") from e
    finally:
        plt.close(fig)
    return out
