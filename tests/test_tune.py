"""Tests of `cadence tune`: the ranges built from per-size winners, the file it
writes and merges, a real tiny tune whose table a new job then loads and
chooses by, and ranks with different tables refusing to start."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cadence.cli import main as cli_main
from cadence.cli import tune
from cadence.cli.launch import Measure, Outcome, Workload
from harness import run_ranks


def _cadence_built() -> bool:
    try:
        import cadence._core  # noqa: F401
    except ImportError:
        return False
    return True


needs_core = pytest.mark.skipif(not _cadence_built(), reason="cadence._core is not built")


def assert_covers_everything(ranges):
    """Inclusive ranges from 0 to no upper end, no gap, no overlap, no two
    neighbours with the same algorithm."""
    assert ranges, ranges
    assert ranges[0][0] == 0, ranges
    assert ranges[-1][1] is None, ranges
    for (lo, hi, algo), (nlo, _, nalgo) in zip(ranges, ranges[1:], strict=False):
        assert hi is not None and lo <= hi and nlo == hi + 1, ranges
        assert algo != nalgo, ranges


# ------------------------------------------------------------ ranges


def test_boundaries_are_geometric_means():
    winners = [(8, "a"), (64, "b"), (512, "b"), (4096, "a")]
    # sqrt(8*64) = 22.6 -> 23 starts b; sqrt(512*4096) = 1448.2 -> 1448 starts a.
    assert tune.build_ranges(winners) == [(0, 22, "a"), (23, 1447, "b"), (1448, None, "a")]


def test_ranges_merge_and_ignore_order():
    assert tune.build_ranges([(1 << 20, "x"), (8, "x"), (1024, "x")]) == [(0, None, "x")]
    assert tune.build_ranges([(100, "r")]) == [(0, None, "r")]
    assert tune.build_ranges([]) == []
    shuffled = [(4096, "a"), (8, "a"), (512, "b"), (64, "b")]
    # sqrt(8*64) = 22.6: from 23 on, b; sqrt(512*4096) = 1448.2: from 1448 on, a.
    assert tune.build_ranges(shuffled) == [(0, 22, "a"), (23, 1447, "b"), (1448, None, "a")]


def test_boundary_stays_between_the_sizes():
    # sqrt(1*2) = 1.41 rounds to 1, which would hand size 1 to its neighbour.
    assert tune.geometric_boundary(1, 2) == 2
    assert tune.build_ranges([(1, "a"), (2, "b")]) == [(0, 1, "a"), (2, None, "b")]
    assert tune.geometric_boundary(8, 32) == 16


def test_ranges_always_cover_zero_to_infinity():
    rng = random.Random(5)
    for _ in range(200):
        sizes = rng.sample(range(1, 1 << 30), rng.randint(1, 12))
        winners = [(s, rng.choice("abc")) for s in sizes]
        ranges = tune.build_ranges(winners)
        assert_covers_everything(ranges)
        for size, algo in winners:  # every measured size keeps its own winner
            assert next(a for lo, hi, a in ranges if lo <= size <= (hi or size)) == algo


def _outcome(algo, times, wrong=None):
    o = Outcome("cadence", algo=algo, label=f"cadence:{algo}")
    for size, t in times.items():
        o.measures[size] = Measure(size, size, size // 4, t, (wrong or {}).get(size, 0), algo)
    return o


def test_boundary_probes_sit_halfway_between_different_winners():
    winners = [(16, "rd"), (64, "rd"), (256, "direct"), (1024, "direct"), (2048, "ring")]
    # 64 -> 256 switches 4x apart: probe 128; 1024 -> 2048 is only 2x apart.
    assert tune.boundary_probes(winners) == {128: ("rd", "direct")}
    assert tune.boundary_probes([(16, "a"), (256, "a")]) == {}


def test_refine_adds_the_faster_of_the_pair_at_each_probe(monkeypatch):
    job = Workload(op="allreduce", dtype="float32", sizes=[64, 256], nranks=2, iters=1, warmup=0,
              timeout=1, algos=["rd", "direct", "ring"])
    res = tune.OpResult("allreduce", job.algos, [], [(64, "rd"), (256, "direct")], {})
    ran = []

    def fake_run(probe_job, backend, outdir, update):
        ran.append((probe_job.sizes, probe_job.algos))
        # ring is fastest at 128 but is not one of the pair: rd wins there.
        return [_outcome("rd", {128: 2.0}), _outcome("direct", {128: 3.0}),
                _outcome("ring", {128: 1.0})]

    monkeypatch.setattr(tune, "run_backend", fake_run)

    class Rep:
        def grow(self, n): pass
        def start(self, what): pass
        def update(self, done): pass
        def finish(self, outcome, n, label=None): pass

    tune.refine(res, job, Path("/nonexistent"), Rep())
    assert ran == [([128], ["rd", "direct"])]
    assert res.winners == [(64, "rd"), (128, "rd"), (256, "direct")]
    # The switch now sits between 128 and 256, not at sqrt(64*256) = 128.
    assert tune.build_ranges(res.winners) == [(0, 180, "rd"), (181, None, "direct")]


def test_judge_skips_wrong_results_and_reports_them():
    job = Workload(
        op="allreduce", dtype="float32", sizes=[8, 64, 512], nranks=2, iters=1, warmup=0, timeout=1
    )
    outs = [
        _outcome("ring", {8: 5.0, 64: 1.0, 512: 9.0}, wrong={64: 3}),
        _outcome("direct", {8: 4.0, 64: 2.0, 512: 3.0}),
    ]
    res = tune.judge(job, "allreduce", ["ring", "direct"], outs)
    assert res.winners == [(8, "direct"), (64, "direct"), (512, "direct")]
    assert res.wrong == ["ring at 64: 3 wrong"]
    assert res.lead[512] == pytest.approx(3.0)
    # A failed job's sizes are not trusted at all.
    outs[1].error = "rank 1 exited with status 1"
    assert tune.judge(job, "allreduce", ["ring", "direct"], outs).winners == []


# ------------------------------------------------------------ the file


def _setting(nranks, nhosts, rph, note="x"):
    return {
        "nranks": nranks,
        "nhosts": nhosts,
        "ranks_per_host": rph,
        "note": note,
        "choices": [{"collective": "allreduce", "lo": 0, "hi": None, "algo": "ring"}],
    }


def test_merge_replaces_the_same_setting_and_keeps_the_others():
    doc = {"version": 1, "settings": [_setting(8, 4, 2, "other"), _setting(2, 1, 2, "old")]}
    merged = tune.merge(doc, _setting(2, 1, 2, "new"))
    assert [(s["nranks"], s["note"]) for s in merged["settings"]] == [(8, "other"), (2, "new")]
    added = tune.merge(doc, _setting(4, 2, 2, "added"))
    assert sorted(s["note"] for s in added["settings"]) == ["added", "old", "other"]
    assert doc["settings"][1]["note"] == "old"  # the input is left alone


def test_render_is_json_with_one_choice_per_line():
    setting = _setting(2, 1, 2)
    setting["model"] = tune.model_from({})
    setting["choices"] *= 3
    doc = {"version": 1, "settings": [setting, _setting(8, 4, 2)]}
    text = tune.render(doc)
    assert json.loads(text) == doc
    lines = text.splitlines()
    assert sum('"collective": "allreduce"' in line for line in lines) == 4
    assert json.loads(tune.render({"version": 1, "settings": []})) == {"version": 1, "settings": []}


def test_model_keeps_defaults_for_what_was_not_measured():
    m = tune.model_from({"shm": {"alpha": 2.123456e-6, "beta": 3e-11}, "gamma": 1e-10})
    assert m["shm"] == {"alpha": 2.123e-6, "beta": 3e-11}
    assert m["tcp"] == {"alpha": 50e-6, "beta": 1 / 1.25e9}
    assert m["gamma"] == 1e-10 and m["incast"] == 0.1
    assert tune.model_from({})["shm"] == {"alpha": 1e-6, "beta": 1 / 8e9}


def test_model_takes_only_the_link_classes_the_core_measured():
    core = {"shm": {"alpha": 4e-6, "beta": 2e-10}, "tcp": {"alpha": 9.9, "beta": 9.9},
            "gamma": 3e-11, "loaded_scale": 2.5, "measured": ["shm"]}  # fmt: skip
    m = tune.model_from(core)
    assert m["shm"] == {"alpha": 4e-6, "beta": 2e-10} and m["gamma"] == 3e-11
    assert m["tcp"] == tune.DEFAULT_LINKS["tcp"]  # not measured: no loaded scale either
    assert tune.model_from({**core, "tcp": None, "measured": ["shm", "tcp"]})["tcp"] == (
        tune.DEFAULT_LINKS["tcp"]
    )


def test_default_output_follows_the_core():
    assert tune.default_output({"CADENCE_TUNING_FILE": "/a/t.json", "HOME": "/h"}) == Path(
        "/a/t.json"
    )
    assert tune.default_output({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path(
        "/x/cadence/tuning.json"
    )
    assert tune.default_output({"CADENCE_TUNING_FILE": "none", "HOME": "/h"}) == Path(
        "/h/.cache/cadence/tuning.json")
    assert tune.default_output({"HOME": "/h", "XDG_CACHE_HOME": ""}) == Path(
        "/h/.cache/cadence/tuning.json"
    )


def test_unreadable_output_is_refused_before_measuring(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    t0 = time.monotonic()
    assert cli_main.main(["tune", "--nranks", "2", "--output", str(bad)]) == 2
    assert time.monotonic() - t0 < 5
    assert "not a readable tuning file" in capsys.readouterr().err
    assert bad.read_text() == "{not json"


@pytest.mark.parametrize("argv", ["--ranks-per-host 2", "-f 1", "-b 1K -e 8"])
def test_bad_arguments(argv, capsys):
    assert cli_main.main(["tune", "--dry-run", *argv.split()]) == 2
    assert capsys.readouterr().err.startswith("cadence tune: ")


def test_unknown_collective_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(["tune", "--ops", "allreduce,bogus"])
    assert e.value.code == 2
    assert "unknown collective(s) bogus" in capsys.readouterr().err


# ------------------------------------------------------------ a real tune

TINY = [
    "--nranks",
    "2",
    "--ops",
    "allreduce",
    "-b",
    "8",
    "-e",
    "64K",
    "-f",
    "8",
    "-n",
    "3",
    "-w",
    "1",
]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tiny tune into a file that already holds an unrelated setting and a
    stale one for the same setting, with a broken CADENCE_TUNING_FILE in the
    environment (the measurement must not read it)."""
    if not _cadence_built():
        pytest.skip("cadence._core is not built")
    tmp = tmp_path_factory.mktemp("tune")
    out = tmp / "tuning.json"
    other = _setting(8, 4, 2, "unrelated")
    stale = _setting(2, 1, 2, "stale")
    stale["choices"][0]["algo"] = "direct"
    out.write_text(json.dumps({"version": 1, "settings": [other, stale]}))
    broken = tmp / "broken.json"
    broken.write_text('{"version": 1, "settings": [{"nranks": 2}]}')
    saved = {k: os.environ.get(k) for k in ("CADENCE_TUNING_FILE", "XDG_CACHE_HOME")}
    os.environ.update(CADENCE_TUNING_FILE=str(broken), XDG_CACHE_HOME=str(tmp / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "cadence.cli.main", "tune", *TINY, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    assert not (tmp / "cache").exists()
    return proc, out, json.loads(out.read_text())


@needs_core
def test_tune_writes_a_table_that_covers_every_size(tuned):
    proc, out, doc = tuned
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["version"] == 1
    mine = [s for s in doc["settings"] if tune.key_of(s) == (2, 1, 2)]
    assert len(mine) == 1, doc
    s = mine[0]
    assert s["note"].startswith("cadence tune --nranks 2 --ops allreduce"), s["note"]
    assert set(s["model"]) == {"shm", "tcp", "gamma", "incast"}
    assert 0 < s["model"]["shm"]["alpha"] < 1e-3 and 0 < s["model"]["shm"]["beta"] < 1e-6
    assert s["model"]["tcp"] == {"alpha": 50e-6, "beta": 1 / 1.25e9}  # one host: default
    assert 0 < s["model"]["gamma"] < 1e-6
    import cadence

    assert {c["collective"] for c in s["choices"]} == {"allreduce"}
    assert all(c["algo"] in cadence.algorithms("allreduce") for c in s["choices"])
    assert_covers_everything([(c["lo"], c["hi"], c["algo"]) for c in s["choices"]])
    # Progress on stderr, the summary on stdout.
    assert "tune: allreduce done in" in proc.stderr, proc.stderr
    assert "collective" in proc.stdout and "algorithm" in proc.stdout, proc.stdout
    assert f"wrote the setting (2 ranks on 1 host, 2 per host) to {out}" in proc.stdout


@needs_core
def test_tune_keeps_other_settings(tuned):
    _, _, doc = tuned
    notes = sorted(s.get("note", "") for s in doc["settings"])
    assert "unrelated" in notes and "stale" not in notes, notes
    assert len(doc["settings"]) == 2


@needs_core
def test_a_job_chooses_by_the_tuned_table(tuned, tmp_path):
    _, out, doc = tuned
    s = next(s for s in doc["settings"] if tune.key_of(s) == (2, 1, 2))
    sizes = [8, 4096, 1 << 20]  # bytes of float32 allreduces
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import numpy as np, cadence
        comm = cadence.init()
        for nbytes in {sizes}:
            comm.allreduce(np.ones(nbytes // 4, dtype=np.float32))
        print(f"rank {{comm.rank}} done", flush=True)
    """)
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE="2",
            CADENCE_TIMEOUT="30",
            CADENCE_DEBUG="INFO",
            CADENCE_TUNING_FILE=str(out),
        )
        env.pop("CADENCE_ALGO", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=60)[0] for p in procs]
    for r, o in enumerate(outs):
        assert f"rank {r} done" in o, o
    p = "cadence rank 0 INFO: "
    lines = outs[0].splitlines()
    assert any(line.startswith(f"{p}tuning table {out}") and s["note"] in line for line in lines), (
        outs[0]
    )
    assert any(line.startswith(f"{p}tuned allreduce: ") for line in lines), outs[0]
    for nbytes in sizes:
        algo = next(c["algo"] for c in s["choices"] if c["lo"] <= nbytes <= (c["hi"] or nbytes))
        want = f"{p}chose {algo} for allreduce of {nbytes} bytes over 2 ranks: tuning table"
        assert want in lines, (want, outs[0])
    assert " INFO: chose " not in outs[1], outs[1]


@needs_core
def test_dry_run_prints_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("CADENCE_TUNING_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "cadence.cli.main", "tune", "--nranks", "2", "--ops",
         "broadcast", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--dry-run"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dry run: would merge into {tmp_path / 'cache' / 'cadence' / 'tuning.json'}" in (
        proc.stdout
    )
    text = proc.stdout[proc.stdout.index("{") :]
    doc = json.loads(text)
    (s,) = doc["settings"]
    assert [(c["lo"], c["hi"]) for c in s["choices"]] == [(0, None)]
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------ tables must agree


def _nothing(comm):
    return None


@needs_core
def test_ranks_with_different_tables_refuse_to_start(tmp_path):
    files = []
    for r, algo in enumerate(["ring", "direct"]):
        s = _setting(2, 1, 2, f"rank {r}'s")
        s["choices"][0]["algo"] = algo
        f = tmp_path / f"t{r}.json"
        f.write_text(json.dumps({"version": 1, "settings": [s]}))
        files.append(f)
    t0 = time.monotonic()
    res = run_ranks(
        _nothing, 2, timeout=60, rank_env=lambda r: {"CADENCE_TUNING_FILE": str(files[r])}
    )
    assert time.monotonic() - t0 < 30  # refused at bootstrap, not at a deadline
    for r in range(2):
        status, text = res[r]
        assert status == "err", res[r]
        assert "ranks loaded different tuning tables" in text, text
        assert str(files[0]) in text and str(files[1]) in text, text


def _cost_model(comm):
    return comm.cost_model


def _model_and_auto_results(comm):
    """The communicator's cost model, and whether `auto` collectives (chosen
    by it) of a few sizes came out right."""
    import numpy as np

    n, me = comm.size, comm.rank
    ok = []
    for count in (0, 5, 3001, 200_003):
        x = np.arange(count, dtype=np.float64) + me
        comm.allreduce(x)
        ok.append(bool(np.array_equal(x, n * np.arange(count) + n * (n - 1) / 2)))
        g = comm.allgather(np.full(count, me, dtype=np.int32))
        ok.append(bool(np.array_equal(g.reshape(n, count), np.repeat(np.arange(n), count)
                                      .reshape(n, count))))
    return {"model": comm.cost_model, "ok": ok}


@needs_core
@pytest.mark.parametrize("transport,size,expect", [("mixed", 5, True), ("tcp", 3, True),
                                                    ("shm", 3, False)])
def test_start_up_calibration_across_hosts(transport, size, expect):
    """Across hosts with no tuning table, rank 0 measures the cost model at
    start-up and every rank chooses by the same numbers; on one host the
    size table chooses."""
    res = run_ranks(_model_and_auto_results, size, transport=transport,
                    env={"CADENCE_CALIBRATE": "1"})
    got = {r: v[1] for r, v in res.items() if v[0] == "ok"}
    assert len(got) == size, res
    assert all(all(v["ok"]) for v in got.values()), got
    models = [v["model"] for v in got.values()]
    assert all(m == models[0] for m in models), models
    if not expect:
        assert models[0] is None
        return
    m = models[0]
    assert m["source"] == "start-up", m
    assert 0 < m["tcp"]["alpha"] < 0.1 and 0 < m["tcp"]["beta"] < 1e-6, m
    assert 0 < m["gamma"] < 1e-6, m


@needs_core
def test_calibration_off_leaves_the_size_table():
    res = run_ranks(_cost_model, 4, transport="tcp", env={"CADENCE_CALIBRATE": "0"})
    assert {v for _, v in res.values()} == {None}, res


def _core_calibration(comm):
    return comm.calibrate()


@needs_core
@pytest.mark.parametrize("transport,size,classes", [("shm", 2, ["shm"]),
                                                    ("mixed", 4, ["shm", "tcp"])])
def test_calibrate_runs_the_core_procedure_on_every_rank(transport, size, classes):
    """`Comm.calibrate()`: the start-up procedure on demand, also on one
    host; every rank gets rank 0's result."""
    res = run_ranks(_core_calibration, size, transport=transport, env={"CADENCE_CALIBRATE": "0"})
    got = [v for status, v in res.values() if status == "ok"]
    assert len(got) == size, res
    assert all(g == got[0] for g in got), got
    c = got[0]
    assert c["measured"] == classes, c
    assert 1.0 <= c["loaded_scale"] <= 50.0, c
    for kind in ("shm", "tcp"):
        if kind in classes:
            assert 0 < c[kind]["alpha"] < 0.1 and 0 < c[kind]["beta"] < 1e-6, c
        else:
            assert c[kind] is None, c
    assert 0 < c["gamma"] < 1e-6, c


@needs_core
def test_tune_takes_its_model_from_the_core_procedure(tmp_path):
    """The calibration job's `model` is what `Comm.calibrate()` returned
    (keys only the core's procedure writes), and the table's model is it."""
    empty = tmp_path / "empty.json"
    empty.write_text(tune.EMPTY_TABLE)
    job = Workload(op="allreduce", dtype="float32", sizes=[8], nranks=2, iters=1, warmup=0,
                   timeout=120.0, env={"CADENCE_TUNING_FILE": str(empty)})
    calib = tune.calibrate(job, ["allreduce"], tmp_path)
    core = calib["model"]
    assert set(core) == {"shm", "tcp", "gamma", "loaded_scale", "measured"}, core
    assert core["measured"] == ["shm"] and core["tcp"] is None, core
    m = tune.model_from(core)
    assert m["shm"] == {k: tune._sig(v) for k, v in core["shm"].items()}
    assert m["gamma"] == tune._sig(core["gamma"])
    assert m["tcp"] == tune.DEFAULT_LINKS["tcp"]
    # The simulator's own figures are kept apart from the model.
    measured = calib["measured"]
    assert set(measured["idle_link"]["shm"]) == {"alpha", "beta", "overhead"}
    assert "gamma" not in measured and "shm" not in measured
