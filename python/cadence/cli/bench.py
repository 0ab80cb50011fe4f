"""Time one collective over a sweep of sizes on cadence and its peers.

An nccl-tests-style sweep: for each backend the command starts --nranks local
ranks itself (cadence and gloo with torchrun's environment, mpi with mpirun),
times the collective at sizes -b, -b*f, ... <= -e bytes, checks the results, and
prints one table with time, algbw, busbw and #wrong per backend and the speed
ratio of cadence to each peer (peer time / cadence time: above 1 means cadence
is faster). A size is the full buffer: the gathered output of allgather, the
full input of reduce-scatter and all-to-all.

With --cluster NAME the ranks run across the hosts of an emulated cluster
(`cadence cluster up`), --ranks-per-host on each (shared memory inside a host,
TCP across), and the notes say how close each backend came to the link rate.

Exit status: 0 if every backend ran and every result was right; 1 if a backend
failed or hung (it is killed at --timeout and the others still run) or any
element was wrong. A backend not installed here, or a dtype a backend lacks
(mpi: float16, bfloat16), shows n/a and does not fail the run.

--algo all (or a list such as --algo auto,ring) times several of cadence's
algorithms side by side in the same cadence job, interleaved size by size: one
column group each (`auto` is cadence's own choice), `best` names the fastest at
each size and `auto/best` says how far the default is from it.

examples:
  cadence bench --nranks 4 --op allreduce -b 8 -e 64M -f 4 --backends cadence,gloo,mpi
  cadence bench --nranks 2 --op allgather -b 1K -e 16M -f 4 --algo all --backends cadence,gloo
  cadence bench --cluster tb --ranks-per-host 2 --op allgather -b 8 -e 64M -f 4
  cadence bench --nranks 2 --op gemv_allreduce --shape M=4194304,K=8
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cadence import testbed
from cadence.bench.common import (
    DTYPES,
    OPS,
    PAGE,
    busbw_factor,
    format_size,
    size_sweep,
)
from cadence.bench.fused import FUSED_OPS
from cadence.cli import fused, plot
from cadence.cli.launch import BACKEND_NAMES, Outcome, Workload, merge_rounds, run_backend, units
from cadence.cli.options import (  # noqa: F401 - also importable from here
    _positive,
    _size,
    add_cluster_arguments,
    add_sweep_arguments,
    resolve_ranks,
)
from cadence.cli.report import algbw, build_table, json_records, print_rich, render_plain
from cadence.testbed.rates import payload_share
from cadence.units import fmt_mbit, format_rate

NAME = "bench"
HELP = "time a collective over a sweep of sizes on cadence, gloo and Open MPI"


def _backends(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKEND_NAMES]
    if bad or not names:
        known = ", ".join(BACKEND_NAMES)
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {', '.join(bad) or '(none)'}; choose from {known}"
        )
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nranks", type=_positive,
        help="local ranks per backend (2; with --cluster: hosts x --ranks-per-host)",
    )  # fmt: skip
    add_cluster_arguments(p)
    p.add_argument(
        "--op", choices=[*OPS, *FUSED_OPS], default="allreduce",
        help="collective (allreduce), or a fused operator (docs/fused.md): fused vs unfused "
        "vs compute alone vs collective alone, on cadence only",
    )  # fmt: skip
    p.add_argument(
        "--shape", metavar="D=N[,D=N...]",
        help="a fused operator's shape (default: its documented one), e.g. M=4194304,K=8",
    )  # fmt: skip
    p.add_argument(
        "--tile-rows", type=_positive,
        help="a matmul fused operator's tile, in output rows (automatic)",
    )
    p.add_argument(
        "--dtype", choices=list(DTYPES), default="float32", help="element type (float32)"
    )
    add_sweep_arguments(p, stepfactor=2)
    p.add_argument(
        "--backends", type=_backends, default="cadence,gloo,mpi",
        help=f"comma-separated, from {','.join(BACKEND_NAMES)} (all)",
    )  # fmt: skip
    p.add_argument(
        "--algo", metavar="ALGO[,ALGO...]",
        help="cadence's algorithm(s), each its own column group: a name, a comma list, "
        "auto (cadence's choice) or all (auto and every algorithm of --op)",
    )  # fmt: skip
    p.add_argument(
        "--offset", type=int, metavar="BYTES",
        help="start every buffer this many bytes past a page boundary, on every backend "
        "(default: where the allocator puts it): copies can be slower when buffers sit "
        "at different offsets within a cache line",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON records")
    p.add_argument(
        "--paths", action="store_true",
        help="also show how cadence's traffic split over each link's paths (NIC pairs): "
        "bytes, share, measured rate, times a path went down",
    )  # fmt: skip
    p.add_argument(
        "--plot", metavar="FILE.png",
        help="also draw time (median, p99 shaded) and busbw against size, one line per "
        "backend or algorithm (matplotlib)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, default=600.0,
        help="seconds one backend may take for the whole sweep before it is killed (600)",
    )  # fmt: skip
    p.add_argument("--mpirun-args", default="", help="extra arguments for mpirun, one string")
    p.add_argument(
        "--timing", choices=("rank", "span"), default="rank",
        help="how a sample is timed. rank (default, as nccl-tests and OSU do): each rank from "
        "its own barrier exit to its last call's end, the slowest rank's median. span: from "
        "the first rank's start to the last rank's end on the host's clock, what the job "
        "waits for; with more ranks than cores a rank that starts late finds its data "
        "waiting and times itself short, which span does not miss",
    )  # fmt: skip
    p.add_argument(
        "--rounds", type=_positive, default=1,
        help="run the whole sweep this many times, the backends in alternating order, and "
        "show medians over the rounds with their spread (1): ratios that hold on a noisy host",
    )  # fmt: skip


class Reporter:
    """Progress on stderr: a rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, prog: str = "bench"):
        self.prog = prog
        self.progress = None
        self.task = None
        self.base = 0
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:
            return
        console = Console(stderr=True)
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=True,
            )  # fmt: skip
            self.task = self.progress.add_task(prog, total=total)

    def __enter__(self) -> Reporter:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.stop()

    def grow(self, nunits: int) -> None:
        """More work than announced (a follow-up job)."""
        if self.progress:
            total = self.progress.tasks[0].total or 0
            self.progress.update(self.task, total=total + nunits)

    def start(self, backend: str) -> None:
        if self.progress:
            self.progress.update(self.task, description=backend)
        else:
            print(f"{self.prog}: {backend} ...", file=sys.stderr, flush=True)

    def update(self, done: int) -> None:
        if self.progress:
            self.progress.update(self.task, completed=self.base + done)

    def finish(self, outcome: Outcome, nunits: int, label: str | None = None) -> None:
        self.base += nunits
        if self.progress:
            self.progress.update(self.task, completed=self.base)
        state = (
            f"FAILED: {outcome.error}" if outcome.error
            else f"n/a: {outcome.na}" if outcome.na
            else f"done in {outcome.seconds:.1f} s"
        )  # fmt: skip
        self.say(f"{self.prog}: {label or outcome.backend} {state}")

    def say(self, line: str) -> None:
        """A line of progress, above the bar on a terminal."""
        if self.progress:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)


def copy_rate_gbps(nbytes: int, repeats: int = 5) -> float | None:
    """How fast one core copies `nbytes` (numpy, median of `repeats`): the
    reference for busbw on one host, where memory bandwidth is the limit."""
    import numpy as np

    if nbytes < 1 << 20:
        return None  # a cache-sized copy says nothing about memory
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


HANDOVER_BYTES = 256 << 10


def handover_us(nbytes: int = HANDOVER_BYTES, rounds: int = 200) -> float | None:
    """How long one core takes to write `nbytes` that another core then
    reads (median µs; two processes pinned to the first two CPUs we may
    use, handing the buffer back and forth through shared memory).

    It tells whether those two cores share a cache: on this project's 2-vCPU
    machine it is about 35 µs when they do and about 130 µs when the
    hypervisor has put them apart (the round trip of one cache line: 80
    against 330 ns), and the placement changes from one minute to the next.
    Every same-host message pays this, so a sweep's times move with it
    (docs/benchmarks.md, "Two vCPUs that share a cache, or not"). None where
    fewer than two CPUs are ours or processes cannot fork."""
    import mmap
    import os

    import numpy as np

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or not hasattr(os, "fork"):
        return None
    shared = mmap.mmap(-1, nbytes + 64)
    flag = np.frombuffer(shared, dtype=np.int64, count=1, offset=nbytes)
    data = np.frombuffer(shared, dtype=np.uint8, count=nbytes)
    mine = np.empty(nbytes, dtype=np.uint8)
    pid = os.fork()
    if pid == 0:  # the reader: waits for odd, reads, answers with even
        try:
            os.sched_setaffinity(0, {cpus[1]})
            for i in range(rounds):
                # Spin (a sleep would time the wake-up, not the cores), but
                # give up if the writer is gone: never outlive it.
                deadline = time.perf_counter() + 5.0
                while flag[0] != 2 * i + 1:
                    if time.perf_counter() > deadline:
                        os._exit(1)
                np.copyto(mine, data)
                flag[0] = 2 * i + 2
        finally:
            os._exit(0)
    times = []
    try:
        os.sched_setaffinity(0, {cpus[0]})
        for i in range(rounds):
            t0 = time.perf_counter()
            data.fill(i & 0xFF)
            flag[0] = 2 * i + 1
            deadline = t0 + 5.0
            while flag[0] != 2 * i + 2:
                if time.perf_counter() > deadline:
                    return None
            times.append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, cpus)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return statistics.median(times) * 1e6


def handover_note(before: float, after: float) -> str:
    return (
        f"two cores hand {HANDOVER_BYTES >> 10} KiB over in {before:.0f} µs before the sweep, "
        f"{after:.0f} µs after (several times longer when the two share no cache)"
    )


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """A SIGTERM (a CI deadline, `kill`) or SIGHUP unwinds like Ctrl-C, so that
    the ranks, which run in sessions of their own, are killed on the way out."""
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)


def sweep(job: Workload, backends: list[str]) -> list[Outcome]:
    """Run `job` on each backend in turn; a failing one does not stop the others."""
    unwind_on_signals()
    outcomes = []
    with (
        tempfile.TemporaryDirectory(prefix="cadence-bench-") as workdir,
        Reporter(sum(units(job, b) for b in backends)) as reporter,
    ):
        for backend in backends:
            reporter.start(backend)
            results = run_backend(job, backend, Path(workdir), reporter.update)
            first = results[0]  # a backend's launch fails or not as a whole
            reporter.finish(first, units(job, backend))
            if first.error and first.log_tail:
                print(f"--- {backend} output (tail) ---\n{first.log_tail}", file=sys.stderr)
            outcomes += results
    return outcomes


def sweep_rounds(job: Workload, backends: list[str], rounds: int) -> list[Outcome]:
    """`sweep` `rounds` times, the backends in the given order and then
    reversed, in turn (so that drift on a shared host hits them alike),
    merged into medians over the rounds (see `merge_rounds`)."""
    if rounds == 1:
        return sweep(job, backends)
    runs = []
    for i in range(rounds):
        print(f"bench: round {i + 1} of {rounds}", file=sys.stderr, flush=True)
        order = backends if i % 2 == 0 else backends[::-1]
        got = sweep(job, order)
        # The table's column order is --backends', whatever order this round ran.
        runs.append(sorted(got, key=lambda o: backends.index(o.backend)))
    return merge_rounds(runs)


def resolve_algos(text: str | None, op: str, backends: list[str]) -> list[str] | None:
    """--algo as the list of cadence algorithms to time (None: the default
    choice alone). `all` is auto plus every algorithm the core lists for `op`,
    so algorithms added to the core show up without a change here. Raises
    ValueError for a name that does not apply to `op`."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--algo {text!r}: no algorithm named")
    if "cadence" not in backends:
        raise ValueError("--algo picks cadence's algorithms, but cadence is not in --backends")
    try:
        import cadence
    except ImportError as e:
        raise ValueError(f"--algo needs cadence's extension to list algorithms: {e}") from None
    known = list(cadence.algorithms(op))
    algos: list[str] = []
    for name in names:
        if name == "all":
            algos += ["auto", *known]
        elif name == "auto" or name in known:
            algos.append(name)
        else:
            raise ValueError(
                f"--algo {name}: not an algorithm of {op}; choose from "
                f"{', '.join(['auto', *known])}, or all"
            )
    return list(dict.fromkeys(algos))


def plot_problem(path: str) -> str | None:
    """Why `--plot path` could not be written, checked before the sweep runs
    (a bad path should not cost a whole benchmark)."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        return f"directory {parent} does not exist"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (`make build` installs it, or pip install matplotlib)"
    return None


def link_notes(job: Workload, outcomes: list[Outcome]) -> list[str]:
    """How close each backend came to the link rate, and any link that is not
    as the cluster was brought up (throttled or cut since)."""
    cluster = job.cluster
    assert cluster is not None
    link_gbps = cluster.rate_bits / 8 / 1e9
    hosts = len(cluster.hosts)
    # What each host's link must carry, relative to the buffer: the busbw factor
    # over hosts (with one rank per host, the busbw column itself).
    factor = busbw_factor(job.op, hosts) if hosts > 1 else 0.0
    notes = [
        f"links: {cluster.rate} = {link_gbps:.3f} GB/s each way; TCP payload can use at "
        f"most {payload_share(cluster.mtu):.1%} of it at MTU {cluster.mtu}"
    ]
    if factor:
        # At the largest size, not the best one: a shaped link passes its burst
        # at line rate, so a mid-size message can seem to beat the link.
        shares = [
            f"{o.name} {share:.3f} ({share / link_gbps:.1%}) at {format_size(m.nbytes)}"
            for o in outcomes
            if o.measures
            for m in [max(o.measures.values(), key=lambda m: m.nbytes)]
            for share in [algbw(m.nbytes, m.time_us) * factor]
        ]
        notes.append(
            f"algbw x {factor:.3g} at the largest size (busbw over {hosts} hosts; GB/s, "
            "share of the link rate): " + (", ".join(shares) or "-")
        )
    odd = [
        f"{s.host.name} {s.nic.ifname} {s.state} out {format_rate(s.rate_out or 0)} "
        f"in {format_rate(s.rate_in or 0)}"
        for s in testbed.link_states(cluster)
        if (s.state, s.rate_out, s.rate_in) != ("up", cluster.rate_bits, cluster.rate_bits)
    ]
    if odd:
        notes.append("links not at the cluster's rate: " + "; ".join(odd))
    return notes


def wait_note(outcomes: list[Outcome]) -> str | None:
    """cadence's waits over its whole run, all ranks: where a stall comes
    from (sleeps that woke late: a lost wake-up; waits that ended on a
    shared core: ranks the scheduler put on one core; the futex wake-ups
    the sleepers cost their senders; the longest stretch in which a rank
    moved nothing)."""
    waits = next((o.waits for o in outcomes if o.waits), {})
    if not waits:
        return None
    total = {k: sum(w.get(k, 0) for w in waits.values())
             for k in ("naps", "late_wakeups", "shared_core_waits", "doorbells_rung")}  # fmt: skip
    shared = [r for r in sorted(waits) if waits[r].get("shared_core_waits", 0)]
    worst = max(waits, key=lambda r: waits[r].get("longest_idle_us", 0))
    where = f" (ranks {', '.join(map(str, shared))})" if shared else ""
    longest_ms = waits[worst].get("longest_idle_us", 0) / 1e3
    return (
        f"cadence's waits, all ranks: {total['naps']} sleeps ({total['late_wakeups']} woke "
        f"late), {total['shared_core_waits']} ended after the waiting rank's core ran another "
        f"task for a moment{where}; {total['doorbells_rung']} futex wake-ups sent; longest "
        f"idle stretch {longest_ms:.1f} ms (rank {worst})"
    )


def path_lines(outcomes: list[Outcome]) -> list[str]:
    """Per rank and TCP link, what each path carried over cadence's whole
    run (every algorithm and size), its measured rate, and its failures."""
    links = next((o.links for o in outcomes if o.links), {})
    lines = []
    for rank in sorted(links):
        for link in links[rank]:
            paths = link["paths"]
            total = sum(q["bytes_sent"] for q in paths)
            if len(paths) < 2 or total < 1e6:  # control messages only
                continue
            parts = [
                f"path {k} {q['bytes_sent'] / 1e6:.1f} MB ({q['bytes_sent'] / total:.0%}) "
                f"{fmt_mbit(q['rate_bps'])} Mbit/s"
                + (f", down {q['downs']}x, {q['resent_bytes'] / 1e6:.1f} MB sent again"
                   if q["downs"] else "")
                + ("" if q["up"] else " [DOWN]")
                for k, q in enumerate(paths)
            ]  # fmt: skip
            lines.append(f"rank {rank} -> rank {link['peer']} ({link['peer_host']}): "
                         + "; ".join(parts))  # fmt: skip
    return lines


def run(args: argparse.Namespace) -> int:
    if args.op in FUSED_OPS:
        for flag, given in (("--rounds", args.rounds > 1), ("--timing", args.timing != "rank")):
            if given:
                print(f"cadence bench: {flag} is for collectives, not fused operators",
                      file=sys.stderr)  # fmt: skip
                return 2
        return fused.run(args)
    if args.shape or args.tile_rows:
        print("cadence bench: --shape and --tile-rows are for fused operators", file=sys.stderr)
        return 2
    if args.offset is not None:
        itemsize = DTYPES[args.dtype].itemsize
        if not 0 <= args.offset < PAGE or args.offset % itemsize:
            print(f"cadence bench: --offset {args.offset}: a multiple of {args.dtype}'s "
                  f"{itemsize} bytes from 0 to {PAGE - 1}", file=sys.stderr)  # fmt: skip
            return 2
    try:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as e:
        print(f"cadence bench: {e}", file=sys.stderr)
        return 2
    try:
        algos = resolve_algos(args.algo, args.op, args.backends)
    except ValueError as e:
        print(f"cadence bench: {e}", file=sys.stderr)
        return 2
    if args.plot:
        problem = plot_problem(args.plot)
        if problem:
            print(f"cadence bench: --plot: {problem}", file=sys.stderr)
            return 2
    try:
        cluster, nranks = resolve_ranks(args)
    except ValueError as e:
        print(f"cadence bench: {e}", file=sys.stderr)
        return 2
    job = Workload(
        op=args.op,
        dtype=args.dtype,
        sizes=sizes,
        nranks=nranks,
        iters=args.iters,
        warmup=max(0, args.warmup_iters),
        timeout=args.timeout,
        algos=algos,
        mpirun_args=shlex.split(args.mpirun_args),
        cluster=cluster,
        ranks_per_host=args.ranks_per_host,
        offset=args.offset,
        timing=args.timing,
    )
    # Where ranks share this machine's cores, how fast two of them hand data
    # over, before and after the sweep (it can change meanwhile).
    local = not cluster and job.nranks > 1
    handover = [handover_us()] if local else []
    outcomes = sweep_rounds(job, args.backends, args.rounds)
    if local:
        handover.append(handover_us())

    where = (
        f" on cluster {cluster.name} ({len(cluster.hosts)} hosts x {job.ranks_per_host}, "
        f"{cluster.rate} links)" if cluster else ""
    )  # fmt: skip
    title = (
        f"cadence bench: {job.op} {job.dtype}, {job.nranks} ranks{where}, {job.iters} iters "
        f"({job.warmup} warm-up), {format_size(sizes[0])}..{format_size(sizes[-1])} "
        f"x{args.stepfactor}" + (f", cadence algos {','.join(algos)}" if algos else "")
        + (f", medians over {args.rounds} rounds" if args.rounds > 1 else "")
        + (f", buffers {args.offset} B past a page" if args.offset is not None else "")
        + (", timed first start to last end" if job.timing == "span" else "")
    )
    copy_gbps = None
    if cluster:
        # Across hosts the limit is the link rate, not memory bandwidth.
        table = build_table(job, outcomes)
        table.notes[-1:-1] = link_notes(job, outcomes)
    else:
        copy_gbps = copy_rate_gbps(min(sizes[-1], 64 << 20))
        table = build_table(job, outcomes, copy_gbps)
        if all(h is not None for h in handover) and handover:
            table.notes.insert(-1, handover_note(*handover))
    note = wait_note(outcomes)
    if note:
        table.notes.insert(-1, note)
    if sys.stdout.isatty():
        print_rich(table, title)
    else:
        print(f"# {title}\n{render_plain(table)}", flush=True)
    if args.paths:
        lines = path_lines(outcomes)
        print("# traffic per path (cadence, sent)" if lines else
              "# --paths: no link with several paths carried cadence's traffic")  # fmt: skip
        for line in lines:
            print(line)
    if args.json:
        records = json_records(job, outcomes)
        if cluster:
            for rec in records:
                rec.update(
                    cluster=cluster.name,
                    hosts=len(cluster.hosts),
                    ranks_per_host=job.ranks_per_host,
                    link_bits=cluster.rate_bits,
                )
        if local:
            # Which state the cores were in, before and after (None: no probe).
            probes = [None if h is None else round(h, 1) for h in handover]
            for rec in records:
                rec["handover_us"] = probes
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.plot:
        if cluster:
            limit, label = cluster.rate_bits / 8e9, f"link rate ({cluster.rate})"
        else:
            limit, label = copy_gbps, "one core's memory copy rate"
        try:
            out = plot.plot(job, outcomes, args.plot, title, limit, label)
            print(f"# plot: {out}", flush=True)
        except plot.PlotError as e:
            print(f"cadence bench: --plot: {e}", file=sys.stderr)
            return 1
    failed = any(o.error for o in outcomes)
    wrong = any(m.wrong for o in outcomes for m in o.measures.values())
    return 1 if failed or wrong else 0
