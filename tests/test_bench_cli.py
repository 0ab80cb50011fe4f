"""Tests of `cadence bench`: sizes, bandwidth factors, the check's expected
results, the table and JSON, cadence's algorithms side by side (--algo),
failure handling, and real runs against gloo and Open MPI (and cadence, once
its extension is built)."""

from __future__ import annotations

import collections
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cadence import reference as ref
from cadence.bench.common import (
    DTYPES,
    OPS,
    busbw_factor,
    format_size,
    layout,
    p99,
    parse_size,
    pattern_modulus,
    size_sweep,
)
from cadence.bench.worker import (
    ROOT,
    Backend,
    alloc,
    batch_calls,
    chosen_algos,
    expected_result,
    pattern,
    time_ops,
    turn_rounds,
    turns,
)
from cadence.cli import bench as bench_cli
from cadence.cli import main as cli_main
from cadence.cli.launch import (
    Measure,
    Outcome,
    Workload,
    collect,
    error_line,
    merge_rounds,
    worker_command,
    worker_env,
)
from cadence.cli.report import build_table, json_records, render_plain, rounds_spread

RECORD_KEYS = {
    "backend", "op", "dtype", "bytes", "nranks", "algo", "chosen", "time_us", "p99_us",
    "timing", "rank_time_us", "span_time_us", "algbw", "busbw", "wrong",
}  # fmt: skip
# What a run on this host adds: the cores' handover probes (`handover_us`).
LOCAL_RECORD_KEYS = RECORD_KEYS | {"handover_us"}


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


HAVE_MPI = shutil.which("mpirun") is not None and _has("mpi4py")


def _cadence_built() -> bool:
    try:
        import cadence._core  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "text,value",
    [("8", 8), ("64K", 64 << 10), ("64M", 64 << 20), ("1G", 1 << 30), ("2k", 2048),
     ("64KB", 64 << 10), ("64MiB", 64 << 20), (" 16 ", 16), (4096, 4096)],
)  # fmt: skip
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-8", "0", "8X", "64 M B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("value", [1, 8, 1000, 1024, 3 << 20, 64 << 20, 1 << 30, (1 << 20) + 1])
def test_format_size_round_trips(value):
    assert parse_size(format_size(value)) == value


def test_format_size_is_short():
    assert [format_size(v) for v in (8, 2048, 64 << 20, 1 << 30, 1025)] == [
        "8", "2K", "64M", "1G", "1025",
    ]  # fmt: skip


def test_size_sweep_is_nccl_tests_like():
    sizes = size_sweep(8, 64 << 20, 4)
    assert sizes[0] == 8 and sizes[-1] == 32 << 20 and len(sizes) == 12
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:], strict=False))
    assert size_sweep(1024, 1024, 2) == [1024]
    with pytest.raises(ValueError):
        size_sweep(8, 64, 1)
    with pytest.raises(ValueError):
        size_sweep(64, 8, 2)


# ------------------------------------------------------------------ bandwidth


@pytest.mark.parametrize(
    "op,n,factor",
    [("allreduce", 4, 1.5), ("allreduce", 2, 1.0), ("allreduce", 1, 0.0),
     ("reduce_scatter", 4, 0.75), ("allgather", 4, 0.75), ("alltoall", 8, 0.875),
     ("broadcast", 4, 1.0), ("reduce", 4, 1.0)],
)  # fmt: skip
def test_busbw_factor(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_busbw_factor_rejects_unknown_op():
    with pytest.raises(ValueError):
        busbw_factor("gather", 4)


def test_layout_follows_nccl_tests():
    # size = the full buffer: allgather's output, reduce-scatter's input.
    lay = layout("allgather", 64, 4, 4)
    assert (lay.in_count, lay.out_count, lay.nbytes, lay.count) == (4, 16, 64, 16)
    lay = layout("reduce_scatter", 64, 4, 4)
    assert (lay.in_count, lay.out_count, lay.nbytes) == (16, 4, 64)
    lay = layout("alltoall", 100, 4, 3)  # 25 elements, rounded down to 3 * 8
    assert (lay.in_count, lay.out_count, lay.nbytes) == (24, 24, 96)
    lay = layout("allreduce", 8, 4, 4)
    assert (lay.in_count, lay.out_count, lay.nbytes) == (2, 0, 8)
    assert layout("allgather", 8, 4, 4) is None  # 2 elements for 4 ranks
    assert layout("broadcast", 4, 8, 2) is None  # less than one float64


# ------------------------------------------------------------------ the check


def _simulate(op: str, inputs: list[np.ndarray], part: int) -> list[np.ndarray | None]:
    """Each rank's result of `op` on the whole inputs (int64), by the numpy
    references the tests use (cadence.reference)."""
    n = len(inputs)
    total = ref.reference(inputs, "int64", "sum")
    if op == "allreduce":
        return [total] * n
    if op == "reduce":
        return [total if r == ROOT else None for r in range(n)]
    if op == "broadcast":
        return [inputs[ROOT]] * n
    if op == "allgather":
        return [ref.allgather(inputs)] * n
    if op == "reduce_scatter":
        return [ref.reduce_scatter(inputs, [part] * n, r, "int64", "sum") for r in range(n)]
    if op == "alltoall":
        return [ref.alltoall(inputs, [[part] * n] * n, r) for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_expected_result_matches_the_definition(op, nranks):
    dtype = DTYPES["int8"]
    modulus = pattern_modulus(dtype, nranks)
    lay = layout(op, 48 * nranks, dtype.itemsize, nranks)
    inputs = [pattern(r, np.arange(lay.in_count), modulus) for r in range(nranks)]
    part = lay.in_count // nranks
    for rank, want in enumerate(_simulate(op, inputs, part)):
        got = expected_result(op, lay, rank, nranks, modulus)
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("nranks", [1, 2, 8, 64])
def test_check_values_are_exact(dtype, nranks):
    d = DTYPES[dtype]
    modulus = pattern_modulus(d, nranks)
    values = pattern(np.arange(nranks)[:, None], np.arange(1000)[None, :], modulus)
    assert values.min() >= 0 and values.max() < modulus
    assert nranks * (modulus - 1) < d.max_exact  # sums exact, and the sentinel never correct
    if d.name != "bfloat16":
        sums = values.sum(axis=0)
        assert np.array_equal(sums.astype(d.name).astype(np.int64), sums)


# ------------------------------------------------------------------ table and JSON


def _job(**kw) -> Workload:
    args = dict(op="allreduce", dtype="float32", sizes=[8, 1 << 20], nranks=4, iters=5,
                warmup=1, timeout=60.0)  # fmt: skip
    args.update(kw)
    return Workload(**args)


def _outcome(
    backend: str, times_us: dict[int, float], wrong: int = 0, algo: str | None = None,
    chosen: str | None = None, p99_us: dict[int, float] | None = None,
) -> Outcome:
    o = Outcome(backend, algo=algo, label=f"{backend}:{algo}" if algo else "")
    for size, t in times_us.items():
        p99 = (p99_us or {}).get(size)
        o.measures[size] = Measure(size, size, size // 4, t, wrong, chosen or algo, p99)
    return o


def test_rounds_merge_into_medians_with_their_spread():
    job = _job()
    rounds = [
        [_outcome("cadence", {8: 10.0, 1 << 20: 500.0}, p99_us={8: 30.0, 1 << 20: 900.0}),
         _outcome("mpi", {8: 20.0, 1 << 20: 400.0})],
        [_outcome("cadence", {8: 14.0, 1 << 20: 520.0}, wrong=1,
                  p99_us={8: 50.0, 1 << 20: 600.0}),
         _outcome("mpi", {8: 40.0})],  # 1 MiB missing in this round
        [_outcome("cadence", {8: 11.0, 1 << 20: 480.0}, p99_us={8: 20.0, 1 << 20: 700.0}),
         Outcome("mpi", error="rank 0 exited")],
    ]
    rounds[1][0].waits = {0: {"naps": 2, "shared_core_waits": 1, "longest_idle_us": 90}}
    rounds[2][0].waits = {0: {"naps": 3, "shared_core_waits": 0, "longest_idle_us": 40}}
    for r, (rank_us, span_us) in enumerate([(10.0, 12.0), (14.0, 19.0), (11.0, 13.0)]):
        rounds[r][0].measures[8].rank_time_us = rank_us
        rounds[r][0].measures[8].span_time_us = span_us
    rounds[0][0].measures[1 << 20].span_time_us = 600.0  # the other rounds lack it
    cad, mpi = merge_rounds(rounds)
    m = cad.measures[8]
    assert (m.time_us, m.p99_us, m.wrong, m.round_times) == (11.0, 30.0, 1, [10.0, 14.0, 11.0])
    assert (m.rank_time_us, m.span_time_us) == (11.0, 13.0)
    assert cad.measures[1 << 20].span_time_us is None
    assert cad.measures[1 << 20].time_us == 500.0
    assert cad.waits == {0: {"naps": 5, "shared_core_waits": 1, "longest_idle_us": 90}}
    # A size some round did not measure has no median of the same rounds.
    assert mpi.error == "rank 0 exited" and set(mpi.measures) == set()
    note = rounds_spread([cad, mpi])
    # 8 B: 14 / 10 = 1.40; 1 MiB: 520 / 480 = 1.08; the median of two is the upper one.
    assert note == ("round-to-round spread of the medians over 3 rounds (slowest round / "
                    "fastest; median over sizes, worst): cadence 1.40x (worst 1.40x at 8)")
    recs = json_records(job, [cad])
    assert recs[0]["round_time_us"] == [10.0, 14.0, 11.0]
    assert note in build_table(job, [cad, mpi]).notes


def test_a_note_says_when_the_two_timings_part():
    job = _job()
    cad, mpi = _outcome("cadence", {8: 10.0, 1 << 20: 500.0}), _outcome("mpi", {8: 4.0})
    for m, span in ((cad.measures[8], 21.0), (cad.measures[1 << 20], 510.0),
                    (mpi.measures[8], 4.4)):  # fmt: skip
        m.rank_time_us, m.span_time_us = m.time_us, span
    notes = build_table(job, [cad, mpi]).notes
    # 8 B: 21 / 10 = 2.10; 1 MiB: 1.02; the median of two is the upper one.
    assert ("ranks ran staggered: first start to last end over the slowest rank's own time "
            "(median over sizes, worst): cadence 2.10x (worst 2.10x at 8), mpi 1.10x (worst "
            "1.10x at 8); the table shows the slowest rank's own time (--timing rank)"
            in notes), notes  # fmt: skip
    assert notes[-1].startswith("#wrong total")
    # Within 25 % everywhere: no note.
    cad.measures[8].span_time_us = 12.0
    assert not any("staggered" in n for n in build_table(job, [cad, mpi]).notes)
    # Figures without both timings (simulated, tuned): no note either.
    bare = build_table(job, [_outcome("cadence", {8: 1.0})])
    assert not any("staggered" in n for n in bare.notes)


def test_table_columns_ratios_and_notes():
    job = _job()
    outcomes = [
        _outcome("cadence", {8: 10.0, 1 << 20: 500.0}, p99_us={1 << 20: 1234.5}),
        _outcome("gloo", {8: 20.0, 1 << 20: 1000.0}),
        Outcome("mpi", error="rank 1 exited with status 1: RuntimeError: boom"),
    ]
    table = build_table(job, outcomes, copy_gbps=10.0)
    titles = [c.title for c in table.columns]
    assert titles[:4] == ["size", "count", "type", "redop"]
    assert titles[4:9] == ["time(us)", "p99(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"]
    assert titles[-2:] == ["cadence/gloo", "cadence/mpi"]
    assert [c.group for c in table.columns[4:19:5]] == ["cadence", "gloo", "mpi"]
    first, second = table.rows
    assert first[:4] == ["8", "2", "float32", "sum"]
    # 1 MiB in 500 us: algbw 2.10 GB/s, busbw x 2*3/4 = 3.15 GB/s
    assert second[4:9] == ["500.0", "1234.5", "2.10", "3.15", "0"]
    assert first[5] == "-"  # no p99 in the records: a dash, not a made-up number
    assert second[-2:] == ["2x", "-"]
    assert first[14:19] == ["error", "-", "-", "-", "-"]
    text = render_plain(table)
    lines = text.splitlines()
    assert "cadence" in lines[0] and "gloo" in lines[0] and "mpi" in lines[0]
    assert lines[1].split()[:5] == ["size", "count", "type", "redop", "time(us)"]
    assert len({len(line) for line in lines[1:4]}) == 1  # aligned columns
    assert "# mpi: FAILED: rank 1 exited with status 1: RuntimeError: boom" in text
    assert "# cadence/gloo: geomean 2x over 2 sizes" in text
    assert "# #wrong total: 0" in text
    assert "one core copies memory at 10.00 GB/s" in text


def test_table_without_cadence_has_no_ratio_and_marks_na():
    job = _job(op="allgather", dtype="float16", sizes=[4, 64])
    outcomes = [_outcome("gloo", {64: 3.0}, wrong=2), Outcome("mpi", na="no float16")]
    table = build_table(job, outcomes)
    assert not any(c.title.startswith("cadence/") for c in table.columns)
    assert len(table.rows) == 1  # 4 bytes of float16 cannot be split over 4 ranks
    assert table.rows[0][:4] == ["64", "32", "float16", "none"]
    assert table.rows[0][4:] == ["3.00", "-", "0.02", "0.02", "2"] + ["n/a"] * 5
    assert "# mpi: n/a: no float16" in render_plain(table)
    assert "# #wrong total: 2" in render_plain(table)


def test_json_records_schema():
    job = _job(algos=["ring"])
    records = json_records(
        job, [_outcome("cadence", {8: 2.0}, algo="ring"), _outcome("gloo", {8: 4.0})]
    )
    assert [set(r) for r in records] == [RECORD_KEYS, RECORD_KEYS]
    cad, gloo = records
    assert cad["algo"] == "ring" and gloo["algo"] is None
    assert cad["chosen"] == "ring" and gloo["chosen"] is None
    assert cad["bytes"] == 8 and cad["nranks"] == 4 and cad["wrong"] == 0
    assert cad["algbw"] == pytest.approx(8 / 2e-6 / 1e9)
    assert cad["busbw"] == pytest.approx(cad["algbw"] * 1.5)


# ------------------------------------------------------------------ several algorithms


def _algo_outcomes() -> list[Outcome]:
    """auto (which ran recursive_doubling, then ring), ring, direct and gloo at 8 B and 1 MiB."""
    return [
        _outcome("cadence", {8: 10.0, 1 << 20: 800.0}, algo="auto", chosen="recursive_doubling"),
        _outcome("cadence", {8: 30.0, 1 << 20: 500.0}, algo="ring"),
        _outcome("cadence", {8: 12.0, 1 << 20: 400.0}, algo="direct"),
        _outcome("gloo", {8: 20.0, 1 << 20: 1000.0}),
    ]


def test_table_with_several_algorithms():
    outcomes = _algo_outcomes()
    outcomes[0].measures[1 << 20].chosen = "ring"
    table = build_table(_job(algos=["auto", "ring", "direct"]), outcomes)
    groups = [c.group for c in table.columns[4:24:5]]
    assert groups == ["cadence:auto", "cadence:ring", "cadence:direct", "gloo"]
    titles = [c.title for c in table.columns]
    assert titles[24:] == ["cadence/gloo", "chosen", "best", "auto/best"]
    small, large = table.rows
    # The ratio to gloo is auto's; best is the fastest column, auto/best <= 1.
    assert small[24:] == ["2x", "recursive_doubling", "auto", "1.00"]
    assert large[24:] == ["1.25x", "ring", "direct", "0.50"]
    text = render_plain(table)
    assert "cadence:auto" in text.splitlines()[0] and "cadence:direct" in text.splitlines()[0]
    assert "# cadence/gloo (cadence:auto): geomean" in text
    assert "# auto within 10% of the best cadence algorithm at 1 of 2 sizes" in text
    assert "1M direct 0.50" in text
    records = json_records(_job(algos=["auto", "ring", "direct"]), outcomes)
    by_algo = {(r["algo"], r["bytes"]): r["chosen"] for r in records if r["backend"] == "cadence"}
    assert by_algo[("auto", 8)] == "recursive_doubling" and by_algo[("auto", 1 << 20)] == "ring"
    assert by_algo[("direct", 8)] == "direct"


def test_best_skips_wrong_results_and_auto_near_best_counts():
    outcomes = _algo_outcomes()
    outcomes[2].measures[1 << 20].wrong = 3  # direct is fastest at 1M, but wrong
    outcomes[0].measures[1 << 20].time_us = 540.0  # auto/best = 500/540 = 0.93
    table = build_table(_job(algos=["auto", "ring", "direct"]), outcomes)
    assert table.rows[1][-2:] == ["ring", "0.93"]
    assert "auto within 10% of the best cadence algorithm at 2 of 2 sizes" in table.notes


def test_table_without_auto_has_best_but_no_auto_columns():
    outcomes = _algo_outcomes()[1:]
    table = build_table(_job(algos=["ring", "direct"]), outcomes)
    titles = [c.title for c in table.columns]
    assert titles[19:] == ["cadence/gloo", "best"]
    assert [row[-1] for row in table.rows] == ["direct", "direct"]
    assert not any(n.startswith("auto within") for n in table.notes)
    assert any(n.startswith("cadence/gloo (cadence:ring)") for n in table.notes)


def test_one_cadence_failure_is_noted_once():
    outcomes = [Outcome("cadence", algo=a, label=f"cadence:{a}", error="rank 0 exited")
                for a in ("auto", "ring")]  # fmt: skip
    table = build_table(_job(algos=["auto", "ring"]), outcomes)
    assert table.notes.count("cadence: FAILED: rank 0 exited") == 1
    assert table.rows[0][4:14] == ["error", "-", "-", "-", "-"] * 2


def test_turns_give_every_algorithm_every_position_and_predecessor():
    for n in range(2, 12):
        rounds = turn_rounds(n)
        assert len(rounds) == (n if n % 2 == 0 else 2 * n)
        for r in rounds:
            assert sorted(r) == list(range(n))
        for pos in range(n):
            at = collections.Counter(r[pos] for r in rounds)
            assert set(at.values()) == {len(rounds) // n}, (n, pos, at)
        follows = collections.Counter((a, b) for r in rounds for a, b in itertools.pairwise(r))
        assert len(follows) == n * (n - 1), (n, follows)  # every ordered pair
        assert set(follows.values()) == {len(rounds) // n}, (n, follows)
    assert turns(4, 5) == [0, 1, 3, 2, 1, 2, 0, 3, 2, 3, 1, 0, 3, 0, 2, 1, 0, 1, 3, 2]
    assert turns(1, 4) == [0, 0, 0, 0]


class _Recorded(Backend):
    def __init__(self, names):
        self.names = names

    def ran(self, op, ncalls):
        return self.names[-ncalls:] if len(self.names) >= ncalls else None


def test_chosen_algos_reads_the_check_calls():
    algos = ["auto", "ring", "direct"]
    # Timed calls, then one check per algorithm in order; auto ran "direct".
    backend = _Recorded(["warmup"] * 5 + ["ring", "direct"] * 4 + ["direct", "ring", "direct"])
    assert chosen_algos(backend, "allreduce", algos) == ["direct", "ring", "direct"]
    assert chosen_algos(_Recorded(["ring"]), "allreduce", algos) == [None, None, None]


def test_every_sample_starts_at_a_barrier_and_times_a_batch():
    events: list[str] = []
    fns = [lambda: events.append("a"), lambda: events.append("b")]
    samples = time_ops(fns, iters=2, warmup=1, barrier=lambda: events.append("|"), batch=3)
    # Warm-up: one batch of each, untimed and without barriers.
    assert events == ["a"] * 3 + ["b"] * 3 + ["|", "a", "a", "a", "|", "b", "b", "b"] + [
        "|", "b", "b", "b", "|", "a", "a", "a"]  # fmt: skip
    assert [(s.batch, len(s.starts), len(s.ends)) for s in samples] == [(3, 2, 2)] * 2
    a, b = samples
    # On one clock, in the order they ran: a, b, then b, a.
    assert a.starts[0] <= a.ends[0] <= b.starts[0] <= b.ends[0] <= b.starts[1] <= b.ends[1]
    assert b.ends[1] <= a.starts[1] <= a.ends[1]
    assert a.per_call == [(e - s) / 3 for s, e in zip(a.starts, a.ends, strict=True)]


def _rank_records(outdir: Path, starts: list[list[float]], ends: list[list[float]], batch=2):
    """Write the rank files a worker would: one size (8 B), each rank's own
    median and p99 as the worker computes them, and the samples' clock times."""
    for rank, (s, e) in enumerate(zip(starts, ends, strict=True)):
        per_call = [(b - a) / batch for a, b in zip(s, e, strict=True)]
        rec = {"rank": rank, "nranks": len(starts), "size": 8, "bytes": 8, "count": 2,
               "time_us": float(np.median(per_call)) * 1e6, "p99_us": p99(per_call) * 1e6,
               "wrong": 0, "batch": batch, "starts": s, "ends": e}  # fmt: skip
        (outdir / f"rank{rank}.jsonl").write_text(json.dumps(rec) + "\n")


def test_span_timing_counts_from_the_first_start_to_the_last_end(tmp_path):
    """A rank that leaves the barrier late finds its data waiting and times
    itself short; the rank timing takes the slowest rank's median, the span
    timing each sample's first start to last end."""
    # Three samples of a batch of 2 calls (seconds on the host's clock). Rank 1
    # starts 4-6 us after rank 0 and ends 2 us after it.
    starts = [[0.0, 100e-6, 200e-6], [4e-6, 106e-6, 205e-6]]
    ends = [[10e-6, 110e-6, 212e-6], [12e-6, 112e-6, 214e-6]]
    _rank_records(tmp_path, starts, ends)
    for timing, median, tail in (("rank", 5.0, 6.0), ("span", 6.0, 7.0)):
        job = _job(sizes=[8], nranks=2, timing=timing)
        o = Outcome("cadence")
        collect(job, tmp_path, o)
        m = o.measures[8]
        # rank: rank 0's samples are 5, 5, 6 us a call, rank 1's 4, 3, 4.5;
        # span: 6, 6, 7 us a call; p99 sits just under the largest sample.
        assert m.time_us == pytest.approx(median), timing
        assert tail - 0.05 < m.p99_us <= tail, timing
        # Both medians either way, for comparing them in one run.
        assert (m.rank_time_us, m.span_time_us) == (pytest.approx(5.0), pytest.approx(6.0))


def test_batches_shrink_with_the_message_and_agree_across_ranks():
    assert batch_calls(0) == batch_calls(16) == batch_calls(16384) == 16
    assert batch_calls(64 * 1024) == 4
    assert batch_calls(256 * 1024) == batch_calls(64 << 20) == 1


def test_worker_gets_the_algorithms_and_no_cadence_algo_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CADENCE_ALGO", "allreduce:ring")
    job = _job(algos=["auto", "direct"])
    cmd = worker_command(job, "cadence", tmp_path)
    assert cmd[cmd.index("--algos") + 1] == "auto,direct"
    assert "--algos" not in worker_command(job, "gloo", tmp_path)
    assert "CADENCE_ALGO" not in worker_env(job, "cadence")
    default = worker_command(_job(), "cadence", tmp_path)
    assert default[default.index("--algos") + 1] == "auto"


@pytest.mark.parametrize("dtype", ["float32", "int8", "float64"])
@pytest.mark.parametrize("offset", [0, 16, 48, 4088])
def test_offset_places_every_buffer_past_a_page(dtype, offset):
    buf = alloc(1000, DTYPES[dtype], offset)
    assert buf.ctypes.data % 4096 == offset
    assert buf.dtype == np.dtype(dtype) and buf.shape == (1000,)
    assert not buf.any()
    assert alloc(0, DTYPES[dtype], offset).size == 0


def test_offset_reaches_every_backend_and_is_checked(tmp_path):
    job = _job(offset=16)
    for backend in ("cadence", "gloo", "mpi"):
        cmd = worker_command(job, backend, tmp_path)
        assert cmd[cmd.index("--offset") + 1] == "16"
    assert "--offset" not in worker_command(_job(), "cadence", tmp_path)
    for bad in ("3", "4096", "-8"):
        rc, output, _ = _bench(tmp_path, "--offset", bad, "--backends", "cadence")
        assert rc == 2 and "--offset" in output, output


def test_resolve_algos_all_follows_the_core(monkeypatch):
    import cadence

    table = {"allreduce": ["ring", "direct", "brand_new"], "broadcast": ["binomial_tree"]}
    monkeypatch.setattr(cadence, "algorithms", lambda op: table[op], raising=False)
    backends = ["cadence", "gloo"]
    assert bench_cli.resolve_algos(None, "allreduce", backends) is None
    assert bench_cli.resolve_algos("all", "allreduce", backends) == [
        "auto", "ring", "direct", "brand_new",
    ]  # fmt: skip
    assert bench_cli.resolve_algos("direct, auto,direct", "allreduce", backends) == [
        "direct", "auto",
    ]  # fmt: skip
    assert bench_cli.resolve_algos("auto,all", "broadcast", backends) == [
        "auto", "binomial_tree",
    ]  # fmt: skip
    bad = [("ring", "broadcast", backends), ("nope", "allreduce", backends),
           (",", "allreduce", backends), ("all", "allreduce", ["gloo"])]  # fmt: skip
    for text, op, names in bad:
        with pytest.raises(ValueError):
            bench_cli.resolve_algos(text, op, names)


@pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built (make build)")
@pytest.mark.parametrize("argv", ["--algo ring --op broadcast", "--algo auto,bogus",
                                  "--algo all --backends gloo"])  # fmt: skip
def test_cli_rejects_inapplicable_algorithms_before_running(argv, capsys, monkeypatch):
    monkeypatch.setattr(bench_cli, "sweep", lambda *a: pytest.fail("ran despite a bad --algo"))
    assert cli_main.main(["bench", *argv.split()]) == 2
    assert "--algo" in capsys.readouterr().err


def test_error_line_picks_the_exception():
    log = "Traceback (most recent call last):\n  File x\nRuntimeError: peer died\n-----\n"
    assert error_line(log) == "RuntimeError: peer died"
    assert error_line("some output\nmpirun noticed a failure\n------\n") == (
        "mpirun noticed a failure"
    )
    assert error_line("") == ""


# ------------------------------------------------------------------ the command line


def test_cli_parses_the_documented_command():
    args = cli_main.build_parser().parse_args(
        "bench --nranks 4 --op allreduce --dtype float32 -b 8 -e 64M -f 4 -n 20 -w 5 "
        "--backends cadence,gloo,mpi --algo ring --json out.json".split()
    )
    assert (args.nranks, args.op, args.dtype) == (4, "allreduce", "float32")
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (8, 64 << 20, 4)
    assert (args.iters, args.warmup_iters, args.algo, args.json) == (20, 5, "ring", "out.json")
    assert args.backends == ["cadence", "gloo", "mpi"]


@pytest.mark.parametrize(
    "argv",
    ["bench --backends nccl", "bench -b 1.5M", "bench --op gather", "bench --nranks 0",
     "bench --dtype complex64", "frobnicate"],
)  # fmt: skip
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(argv.split())
    assert e.value.code == 2


# ------------------------------------------------------------------ real runs


def _bench(tmp_path: Path, *argv: str, timeout: float = 240) -> tuple[int, str, list[dict]]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cadence.cli.main", "bench", "--json", str(out), *argv],
        capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(Path(cli_main.__file__).resolve().parents[2])),
    )  # fmt: skip
    records = json.loads(out.read_text()) if out.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, records


def _assert_clean(rc, output, records, backends, op, sizes, nalgos=1):
    assert rc == 0, output
    assert {r["backend"] for r in records} == set(backends), output
    for r in records:
        assert set(r) == LOCAL_RECORD_KEYS
        assert r["op"] == op and r["nranks"] == 2
        assert r["wrong"] == 0, output
        assert r["time_us"] > 0 and r["algbw"] > 0
        assert r["p99_us"] >= r["time_us"]  # the tail is never below the median
        # The same samples in both timings; a span covers every rank's time.
        assert r["time_us"] == r[f"{r['timing']}_time_us"]
        assert r["span_time_us"] >= r["rank_time_us"] > 0
        # Two probes of the cores' handover, before and after the sweep.
        assert len(r["handover_us"]) == 2
        assert all(h is None or h > 0 for h in r["handover_us"])
    per_backend = [nalgos if b == "cadence" else 1 for b in backends]
    assert len(records) == sum(per_backend) * sizes


@pytest.mark.parametrize("op", OPS)
def test_gloo_and_mpi_end_to_end(tmp_path, op):
    backends = ["gloo", "mpi"] if HAVE_MPI else ["gloo"]
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--op", op, "-b", "64", "-e", "64K", "-f", "32",
        "-n", "3", "-w", "1", "--backends", ",".join(backends),
    )  # fmt: skip
    _assert_clean(rc, output, records, backends, op, sizes=3)
    assert "#wrong total: 0" in output


def test_dtype_mpi_lacks_is_na_not_failure(tmp_path):
    backends = ["gloo", "mpi"] if HAVE_MPI else ["gloo"]
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--dtype", "float16", "-b", "64", "-e", "4K", "-f", "64",
        "-n", "2", "-w", "1", "--backends", ",".join(backends),
    )  # fmt: skip
    assert rc == 0, output
    assert {r["backend"] for r in records} == {"gloo"}
    assert all(r["wrong"] == 0 and r["dtype"] == "float16" for r in records)
    if HAVE_MPI:
        assert "mpi: n/a" in output


def test_failing_backend_is_reported_and_the_others_still_run(tmp_path):
    if not HAVE_MPI:
        pytest.skip("needs mpirun and mpi4py")
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "-b", "64", "-e", "64", "-n", "2", "-w", "0",
        "--backends", "mpi,gloo", "--mpirun-args=--no-such-mpirun-flag",
    )  # fmt: skip
    assert rc == 1, output
    assert "# mpi: FAILED: mpirun exited with status" in output
    assert [r["backend"] for r in records] == ["gloo"]


def test_hanging_backend_is_killed_at_the_deadline(tmp_path):
    # Importing torch alone takes longer than this deadline.
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "-b", "64", "-e", "64", "-n", "2", "-w", "0",
        "--backends", "gloo", "--timeout", "0.3",
    )  # fmt: skip
    assert rc == 1, output
    assert "# gloo: FAILED: timed out after 0.3 s" in output
    assert records == []
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cadence.bench.worker" in args and b"0.3" in args:
            leftovers.append(cmdline.parent.name)
    assert not leftovers, f"worker processes left running: {leftovers}"


@pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built (make build)")
def test_cadence_end_to_end(tmp_path):
    backends = ["cadence", "gloo"]
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--op", "allreduce", "-b", "8", "-e", "1M", "-f", "32",
        "-n", "3", "-w", "1", "--backends", ",".join(backends),
        *(["--plot", str(tmp_path / "run.png")] if _has("matplotlib") else []),
    )  # fmt: skip
    _assert_clean(rc, output, records, backends, "allreduce", sizes=4)
    if _has("matplotlib"):
        assert f"# plot: {tmp_path / 'run.png'}" in output
        assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    assert "cadence/gloo" in output
    cad = [r for r in records if r["backend"] == "cadence"]
    assert {r["algo"] for r in cad} == {"auto"}  # the default choice, named
    import cadence

    assert all(r["chosen"] in cadence.algorithms("allreduce") for r in cad), cad
    assert "cadence:" not in output  # one algorithm: the plain "cadence" group
    # The engine's wait counters, summed over the ranks (a stall's first clue).
    waits = [ln for ln in output.splitlines() if ln.startswith("# cadence's waits, all ranks: ")]
    assert len(waits) == 1 and "sleeps" in waits[0] and "longest idle" in waits[0], output
    assert "futex wake-ups sent" in waits[0], output


@pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built (make build)")
def test_cadence_algo_all_end_to_end(tmp_path):
    import cadence

    algos = ["auto", *cadence.algorithms("allreduce")]
    backends = ["cadence", "gloo"]
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--op", "allreduce", "-b", "1K", "-e", "1M", "-f", "32",
        "-n", "3", "-w", "1", "--backends", ",".join(backends), "--algo", "all",
    )  # fmt: skip
    _assert_clean(rc, output, records, backends, "allreduce", sizes=3, nalgos=len(algos))
    lines = output.splitlines()
    groups = next(line for line in lines if "cadence:auto" in line).split()
    assert groups == [f"cadence:{a}" for a in algos] + ["gloo"], output
    header = next(line for line in lines if line.lstrip().startswith("size"))
    assert header.split()[-4:] == ["cadence/gloo", "chosen", "best", "auto/best"], output
    assert "auto within 10% of the best cadence algorithm at" in output
    cad = [r for r in records if r["backend"] == "cadence"]
    assert [r["algo"] for r in cad] == [a for a in algos for _ in range(3)]
    for r in cad:
        # The flight recorder confirms each forced algorithm ran; auto picked a real one.
        assert r["chosen"] in algos[1:], r
        if r["algo"] != "auto":
            assert r["chosen"] == r["algo"], r
    assert all(r["algo"] is None and r["chosen"] is None for r in records
               if r["backend"] == "gloo")  # fmt: skip


@pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built (make build)")
def test_cadence_algo_list_end_to_end(tmp_path):
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--op", "allgather", "-b", "64", "-e", "64K", "-f", "32",
        "-n", "3", "-w", "1", "--backends", "cadence", "--algo", "direct,auto",
        "--timing", "span",
    )  # fmt: skip
    _assert_clean(rc, output, records, ["cadence"], "allgather", sizes=3, nalgos=2)
    assert "timed first start to last end" in output
    assert {r["timing"] for r in records} == {"span"}
    assert [r["algo"] for r in records] == ["direct"] * 3 + ["auto"] * 3
    assert {r["chosen"] for r in records[:3]} == {"direct"}
    groups = next(line for line in output.splitlines() if "cadence:" in line).split()
    assert groups == ["cadence:direct", "cadence:auto"], output
    assert "cadence:ring" not in output


@pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built (make build)")
def test_rounds_end_to_end(tmp_path):
    rc, output, records = _bench(
        tmp_path, "--nranks", "2", "--op", "broadcast", "-b", "8", "-e", "64K", "-f", "8192",
        "-n", "2", "-w", "0", "--backends", "cadence,gloo", "--rounds", "2",
    )  # fmt: skip
    assert rc == 0, output
    # Two rounds, the second in reverse order.
    starts = [ln.split()[1] for ln in output.splitlines() if ln.startswith("bench: ") and
              ln.rstrip().endswith("...")]  # fmt: skip
    assert starts == ["cadence", "gloo", "gloo", "cadence"], output
    assert "medians over 2 rounds" in output
    assert "# round-to-round spread of the medians over 2 rounds" in output
    assert len(records) == 4  # one per backend and size
    for r in records:
        assert len(r["round_time_us"]) == 2 and r["wrong"] == 0
        assert min(r["round_time_us"]) <= r["time_us"] <= max(r["round_time_us"])
    groups = next(ln for ln in output.splitlines() if "time(us)" not in ln and "gloo" in ln)
    assert groups.split()[:2] == ["cadence", "gloo"], output


def test_link_share_is_quoted_at_the_largest_size(monkeypatch):
    """A tbf link passes its burst at line rate, so a mid-size message can
    seem faster than the link: the share quoted is the largest size's."""
    from types import SimpleNamespace

    monkeypatch.setattr(bench_cli.testbed, "link_states", lambda cluster: [])
    cluster = SimpleNamespace(rate_bits=1_000_000_000, rate="1gbit", mtu=1500, hosts=(0,) * 4)
    job = Workload("allreduce", "float32", [1 << 20, 64 << 20], 8, 1, 0, 60.0, cluster=cluster)
    # 1 MiB "faster than the link", 64 MiB at 80 % of it (busbw factor 1.5).
    fast = Measure(1 << 20, 1 << 20, 1 << 18, (1 << 20) * 1.5 / 0.130e9 * 1e6, 0)
    sustained = Measure(64 << 20, 64 << 20, 16 << 20, (64 << 20) * 1.5 / 0.100e9 * 1e6, 0)
    out = Outcome("cadence", measures={1 << 20: fast, 64 << 20: sustained})
    notes = bench_cli.link_notes(job, [out])
    assert notes[1].endswith("cadence 0.100 (80.0%) at 64M"), notes


# ------------------------------------------------------------------ --plot


def test_plot_series_skip_wrong_sizes_and_compute_busbw():
    from cadence.cli import plot

    job = _job()
    o = _outcome("cadence", {8: 10.0, 1 << 20: 500.0, 4 << 20: 900.0}, p99_us={8: 30.0})
    o.measures[4 << 20].wrong = 1  # a wrong result is not plotted as a speed
    xs, med, p99, bus = plot.series(job, o)
    assert xs == [8, 1 << 20]
    assert med == [10.0, 500.0]
    assert p99 == [30.0, 500.0]  # no p99 recorded: the band collapses onto the median
    assert bus[1] == pytest.approx((1 << 20) / 500e-6 / 1e9 * 1.5)


def test_plot_draws_a_png_and_refuses_nothing(tmp_path):
    pytest.importorskip("matplotlib")
    from cadence.cli import plot

    job = _job()
    outcomes = _algo_outcomes()
    path = plot.plot(job, outcomes, tmp_path / "b.png", "title", 10.0, "copy rate")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1430, 550)  # two panels, 13 x 5 in at 110 dpi
    with pytest.raises(plot.PlotError, match="nothing to plot"):
        plot.plot(job, [Outcome("mpi", error="boom")], tmp_path / "c.png", "t")


def test_plot_path_is_checked_before_the_sweep(capsys):
    rc = cli_main.main(["bench", "--nranks", "2", "--backends", "gloo", "-b", "8", "-e", "8",
                        "--plot", "/no/such/dir/x.png"])  # fmt: skip
    assert rc == 2
    assert "--plot: directory /no/such/dir does not exist" in capsys.readouterr().err


def test_paths_lines_show_each_paths_share_rate_and_failures():
    """`--paths`: one line per rank and link with several paths that carried
    data, each path's MB, share of the link's bytes, rate and failures."""
    def path(sent, rate, up=True, downs=0, resent=0):
        return {"bytes_sent": sent, "bytes_recv": 0, "rate_bps": rate, "up": up,
                "downs": downs, "resent_bytes": resent}
    out = Outcome("cadence", algo="auto")
    out.links = {
        1: [{"peer": 0, "peer_host": "h0", "paths": [path(30e6, 25e6), path(10e6, 5e6, False, 2,
                                                                              3e6)]},
            {"peer": 2, "peer_host": "h2", "paths": [path(100, 0), path(0, 0)]}],  # control only
        0: [{"peer": 1, "peer_host": "h1", "paths": [path(5e6, 1e6)]}],  # one path
    }
    lines = bench_cli.path_lines([Outcome("gloo"), out])
    assert lines == [
        "rank 1 -> rank 0 (h0): path 0 30.0 MB (75%) 200 Mbit/s; "
        "path 1 10.0 MB (25%) 40 Mbit/s, down 2x, 3.0 MB sent again [DOWN]"
    ]


@pytest.mark.skipif(not _cadence_built(), reason="cadence's extension is not built")
@pytest.mark.parametrize(
    "op,shape",
    [("gemv_allreduce", "M=300000,K=4"), ("matmul_reduce_scatter", "M=1001,K=16,N=64"),
     ("embedding_bag_alltoall", "T=2,R=500,D=16,B=600,L=3"),
     ("gemm_alltoall", "T=300,H=32,O=16,E=2")],
)  # fmt: skip
def test_fused_operator_bench_prints_four_variants_and_writes_records(tmp_path, op, shape):
    rc, output, records = _bench(tmp_path, "--nranks", "2", "--op", op, "--shape", shape,
                                 "-n", "3", "-w", "1", "--tile-rows", "50")  # fmt: skip
    assert rc == 0, output
    assert [r["algo"] for r in records] == ["fused", "unfused", "compute", "collective"]
    for r in records:
        assert r["op"] == op and r["nranks"] == 2 and r["backend"] == "cadence"
        assert r["time_us"] > 0 and r["p99_us"] >= r["time_us"] and r["wrong"] == 0
    assert "fused is " in output and "x unfused" in output, output
    for variant in ("fused", "unfused", "compute", "collective"):
        assert f"\n{variant} " in output, output


def test_fused_operator_bench_refuses_a_bad_shape(tmp_path):
    rc, output, _ = _bench(tmp_path, "--op", "gemm_alltoall", "--shape", "T=4,Q=3")
    assert rc == 2 and "gemm_alltoall takes T=N,H=N,O=N,E=N" in output, output
    rc, output, _ = _bench(tmp_path, "--op", "allreduce", "--shape", "M=4")
    assert rc == 2 and "--shape and --tile-rows are for fused operators" in output, output
    rc, output, _ = _bench(tmp_path, "--op", "gemv_allreduce", "--rounds", "2")
    assert rc == 2 and "--rounds is for collectives" in output, output
    rc, output, _ = _bench(tmp_path, "--op", "gemv_allreduce", "--timing", "span")
    assert rc == 2 and "--timing is for collectives" in output, output


def test_handover_probe_times_two_cores_and_needs_two():
    """`cadence bench` notes how long two cores take to hand 256 KiB over
    (it tells whether they share a cache); with one CPU of ours there is
    no pair to time, and the probe says so instead of timing one core."""
    import os
    import subprocess
    import sys

    from cadence.cli.bench import handover_note, handover_us

    if len(os.sched_getaffinity(0)) >= 2:
        us = handover_us(rounds=20)
        assert us is not None and 0 < us < 1e5, us
    code = ("import os; from cadence.cli.bench import handover_us; "
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(handover_us())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None", out
    assert handover_note(36.4, 141.9).startswith(
        "two cores hand 256 KiB over in 36 µs before the sweep, 142 µs after")
