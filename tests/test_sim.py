"""`cadence sim`: the simulator's command line (the engine's closed forms are
Rust tests in crates/cadence-core/src/sim/)."""

from __future__ import annotations

import json

import pytest
from cadence import _core
from cadence.cli.main import main
from cadence.cli.sim import spec_from_calibration
from cadence.diagnosis.dumps import parse
from cadence.diagnosis.slow import SlowWatch
from cadence.diagnosis.summary import (
    decode_host,
    decode_rank,
    encode_host,
    encode_rank,
    host_summary,
    rank_summary,
)

SPEC = {
    "version": 1,
    "kind": "cadence-cluster",
    "nic": {"rate": "10gbit", "latency_us": 5},
    "fabric": {"kind": "fat_tree", "hosts_per_leaf": 4, "oversubscription": 2.0},
}


def write(tmp_path, spec: dict):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_sim_prints_benchs_table_and_records(tmp_path, capsys):
    path = write(tmp_path, SPEC)
    out = tmp_path / "sim.json"
    rc = main(["sim", "--topology", str(path), "--ranks", "16", "--algo", "auto,ring,direct",
               "-b", "1K", "-e", "4M", "-f", "16", "--json", str(out)])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "sim:ring" in text and "sim:direct" in text and "auto/best" in text
    records = json.loads(out.read_text())
    assert {r["algo"] for r in records} == {"auto", "ring", "direct"}
    assert all(r["simulated"] and r["nranks"] == 16 and r["time_us"] > 0 for r in records)
    by = {(r["algo"], r["bytes"]): r["time_us"] for r in records}
    # A larger buffer never takes less time; auto ran one of the library's.
    assert by[("ring", 4 << 20)] > by[("ring", 1024)]
    assert all(r["chosen"] in _core.algorithms("allreduce") for r in records)


def test_ring_time_is_the_bandwidth_term_at_large_sizes():
    # 8 hosts, one leaf (no blocking): 2 (n-1)/n of 256 MiB at 1.25 GB/s.
    spec = {**SPEC, "hosts": 8, "fabric": {"kind": "single_switch"}}
    model = _core.SimCluster(json.dumps(spec), "spec.json")
    algo, secs, msgs = model.run("allreduce", 64 << 20, 4, "ring")
    bound = 2 * 7 / 8 * (256 << 20) / 1.25e9
    assert algo == "ring" and msgs > 0
    assert bound <= secs <= 1.05 * bound, (secs, bound)


@pytest.mark.parametrize(
    ("change", "ranks", "says"),
    [
        ({"speed": 3}, "16", "unknown field `speed`"),
        ({"nic": {"rate": "-10gbit"}}, "16", "nic.rate"),
        ({"ranks_per_host": 3}, "16", "16 ranks do not fill whole hosts of 3 ranks"),
        ({"hosts": 4}, "16", "16 ranks do not fit 4 hosts"),
    ],
)
def test_a_spec_with_a_mistake_is_one_line(tmp_path, capsys, change, ranks, says):
    path = write(tmp_path, {**SPEC, **change})
    rc = main(["sim", "--topology", str(path), "--ranks", ranks, "-b", "1K", "-e", "1K"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err


def test_calibration_turns_measurements_into_a_spec():
    base = {
        "version": 1, "kind": "cadence-cluster", "hosts": 4, "ranks_per_host": 1,
        "nic": {"count": 1, "rate": "1000000000bit"},
        "fabric": {"kind": "racks", "rack_of": [0, 1, 0, 1], "uplink": "250000000bit"},
    }  # fmt: skip
    measured = {
        "tcp": {"alpha": 60e-6, "beta": 1 / 1.1e8, "overhead": 10e-6},
        "shm": {"alpha": 3e-6, "beta": 1 / 5e9, "overhead": 1e-6},
        "gamma": 1 / 4e9,
    }
    spec = spec_from_calibration(base, measured, 10**9)
    assert spec["nic"]["latency_us"] == 50.0 and spec["nic"]["overhead_us"] == 10.0
    # TCP got 88 % of the NIC: the uplinks are scaled alike.
    model = _core.SimCluster(json.dumps(spec), "spec.json").describe()
    assert model["nic_out"][0] == pytest.approx(1.1e8, rel=1e-6)
    assert model["group_out"][0] == pytest.approx(0.88 * 250e6 / 8, rel=1e-6)
    assert model["gamma"] == pytest.approx(1 / 4e9)


def test_tune_sim_writes_a_setting_for_the_simulated_cluster(tmp_path, capsys):
    path = write(tmp_path, SPEC)
    out = tmp_path / "tuning.json"
    rc = main(["tune", "--sim", str(path), "--nranks", "8", "--ops", "allreduce,alltoall",
               "-b", "8", "-e", "4M", "-f", "8", "--output", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    (setting,) = doc["settings"]
    assert (setting["nranks"], setting["nhosts"], setting["ranks_per_host"]) == (8, 8, 1)
    assert "(simulated)" in setting["note"]
    for op in ("allreduce", "alltoall"):
        ranges = [c for c in setting["choices"] if c["collective"] == op]
        # The winners cover every size: from 0, each range where the last ended, to max.
        assert ranges[0]["lo"] == 0 and ranges[-1]["hi"] is None
        assert all(a["hi"] + 1 == b["lo"] for a, b in zip(ranges, ranges[1:], strict=False))
    assert setting["model"]["tcp"]["beta"] == pytest.approx(1 / 1.25e9)


def _emulated_base() -> dict:
    """The spec of an emulated 4-host cluster at 1 Gbit/s, before calibration."""
    from cadence.cli.sim import shaper_of

    return {
        "version": 1, "kind": "cadence-cluster", "hosts": 4, "ranks_per_host": 1,
        "nic": {"count": 1, "rate": "119.551MB/s"}, "shaper": shaper_of(10**9, 1500),
    }  # fmt: skip


def test_calibration_of_an_emulated_cluster_shares_the_machines_cores():
    base = _emulated_base()
    # 8 ranks on 2 cores: a ring step of 100 µs carried 8 messages on 2 cores.
    measured = {"tcp": {"alpha": 20e-6, "beta": 1 / 1.2e8, "overhead": 20e-6},
                "loaded": 100e-6, "cores": 2, "nranks": 8}  # fmt: skip
    spec = spec_from_calibration(base, measured, 10**9)
    assert spec["cpu"] == {"shared_cores": 2.0, "loaded_overhead_us": 25.0}
    model = _core.SimCluster(json.dumps(spec), "spec.json").describe()
    assert model["shared_cores"] == 2.0
    assert model["loaded_overhead"] == pytest.approx(25e-6)
    # A core per rank: the step is one message's latency (α and o), not a share.
    assert "cpu" not in spec_from_calibration(base, {**measured, "cores": 16}, 10**9)
    # A real cluster (no shaper) keeps a core per rank.
    unshaped = {k: v for k, v in base.items() if k != "shaper"}
    assert "cpu" not in spec_from_calibration(unshaped, measured, 10**9)


def test_calibration_separates_a_calls_cost_from_a_steps():
    base = _emulated_base()
    # 8 ranks on 2 cores. A step costs 50 µs and a call 140 µs: the
    # allgather's 7 steps take 490 µs (70 a step), the allreduce's 14
    # take 840 (60 a step).
    measured = {"loaded": 490e-6 / 7, "loaded_allreduce": 840e-6 / 14, "cores": 2, "nranks": 8}
    cpu = spec_from_calibration(base, measured, 10**9)["cpu"]
    assert cpu["loaded_overhead_us"] == pytest.approx(50 * 2 / 8)
    assert cpu["call_overhead_us"] == pytest.approx(140 * 2 / 8)
    model = _core.SimCluster(json.dumps({**base, "ranks_per_host": 2,
                                         "cpu": cpu}), "spec.json").describe()  # fmt: skip
    assert model["call_overhead"] == pytest.approx(35e-6)
    # An allreduce no slower a step than the allgather: all of it is steps.
    cpu = spec_from_calibration(base, {**measured, "loaded_allreduce": 35e-6}, 10**9)["cpu"]
    assert cpu["loaded_overhead_us"] == pytest.approx(70 * 2 / 8) and "call_overhead_us" not in cpu


def test_calibration_fits_what_the_network_stacks_cost_the_shared_cores():
    from cadence.cli.sim import fit_stack_rate

    base = _emulated_base()
    measured = {"tcp": {"alpha": 13e-6, "beta": 1 / 1.2e8, "overhead": 8e-6},
                "loaded": 60e-6, "cores": 2, "nranks": 8}  # fmt: skip
    plain = spec_from_calibration(base, measured, 10**9)
    assert "stack_rate" not in plain["cpu"]

    # The bulk probe as a model whose cores move 300 MB/s each through the
    # stacks would time it: the fit finds that rate again.
    def probe(stack_rate):
        s = json.loads(json.dumps(plain))
        s["ranks_per_host"] = 2
        if stack_rate:
            s["cpu"]["stack_rate"] = stack_rate
        model = _core.SimCluster(json.dumps(s), "spec.json", None)
        return {"bytes_per_rank": 8192, "calls": 4,
                "seconds": model.run("allgather", 8 * 8192, 1, "ring", 4)[1]}  # fmt: skip

    bulk = probe("300MB/s")
    spec = spec_from_calibration(base, {**measured, "loaded_bulk": bulk}, 10**9)
    assert float(spec["cpu"]["stack_rate"].removesuffix("MB/s")) == pytest.approx(300, rel=0.01)
    # The stacks cost the probe something: it is slower than the model without them.
    assert bulk["seconds"] > probe(None)["seconds"] * 1.2
    # A probe no slower than the model without the stacks: they cost nothing.
    free = {**bulk, "seconds": probe(None)["seconds"] * 0.9}
    assert fit_stack_rate(plain, free, 8) is None
    spec = spec_from_calibration(base, {**measured, "loaded_bulk": free}, 10**9)
    assert "stack_rate" not in spec["cpu"]


def test_calibration_across_racks_scales_by_the_uplink_it_measured():
    base = {
        "version": 1, "kind": "cadence-cluster", "hosts": 4,
        "nic": {"count": 1, "rate": "1000000000bit"},
        "fabric": {"kind": "racks", "rack_of": [0, 1, 0, 1], "uplink": "250000000bit"},
    }  # fmt: skip
    # TCP got 88 % of the 250 Mbit/s uplink between rank 0 and its peer.
    measured = {"tcp": {"alpha": 60e-6, "beta": 1 / 2.75e7, "overhead": 0.0}}
    spec = spec_from_calibration(base, measured, 10**9, 250 * 10**6)
    model = _core.SimCluster(json.dumps(spec), "spec.json").describe()
    assert model["nic_out"][0] == pytest.approx(0.88 * 1e9 / 8, rel=1e-6)
    assert model["group_out"][0] == pytest.approx(2.75e7, rel=1e-6)


def test_shaped_links_keep_their_payload_rate_and_pass_their_burst_first():
    # The emulated cluster's 1gbit links: the shaper's bucket holds 1 ms of the rate.
    from cadence.cli.sim import shaper_of

    shaper = shaper_of(10**9, 1500)
    assert shaper["burst_us"] == pytest.approx(1000.0)
    base = {
        "version": 1, "kind": "cadence-cluster", "hosts": 2,
        "nic": {"count": 1, "rate": "119.551MB/s"}, "shaper": shaper,
    }  # fmt: skip
    # A ping-pong over a shaped link counts the bucket's credit: its β is
    # not the link's rate, which stays; α and o are taken.
    measured = {"tcp": {"alpha": 60e-6, "beta": 1 / 1.23e8, "overhead": 10e-6}}
    spec = spec_from_calibration(base, measured, 10**9)
    assert spec["nic"]["rate"] == "119.551MB/s" and spec["nic"]["latency_us"] == 50.0
    model = _core.SimCluster(json.dumps(spec), "spec.json")
    assert model.describe()["shaper"] == pytest.approx((1e-3, 1.5e9))
    # 64 KiB broadcasts timed as `cadence bench` times them, a barrier and
    # one call a sample: once the first samples have spent the bucket's
    # credit, the root's link idles from the broadcast's last byte to the
    # next one's first (the receiver's α, its barrier message's o + α, the
    # root's o) and the bucket refills (14 kB) at the rate. Then a call is o,
    # that credit spent at the peak (draining at peak - rate), the rest at
    # the rate, and α. Unshaped it would be o + α + 64 KiB at the rate: 608 µs.
    o, alpha, rate, peak = 10e-6, 50e-6, 119.551e6, 1.5e9
    _, secs, _ = model.run("broadcast", 16384, 4, "binomial_tree")
    credit = (2 * alpha + 2 * o) * rate
    at_peak = credit / (peak - rate)
    want = o + at_peak + (65536 - peak * at_peak) / rate + alpha
    assert secs == pytest.approx(want, rel=1e-4), (secs, want)
    assert secs < 65536 / rate, secs


def test_kisti_study_runs_and_auto_with_a_topology_file_prices_the_spine(tmp_path):
    # The study's script at its two smallest scales plus 64 (the first past
    # one 32-host leaf): every algorithm simulated, and at 64 nodes the
    # library's choice after its start-up profile (shifted rounds find the
    # 32-host leaves behind the 2:1 spine, which no pair alone shows) is as
    # good as with the fabric's topology file, and beats its choice with
    # nothing measured.
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "sim_kisti.py"
    out = tmp_path / "kisti.json"
    r = subprocess.run([sys.executable, str(script), "--nodes", "16,64", "--jobs", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| 64 |" in r.stdout
    times = json.loads(out.read_text())["times"]
    seen = {(t["nodes"], t["algo"], t["bytes"]) for t in times}
    assert len(seen) == 2 * 11 * 3  # nodes x (8 algorithms + 3 autos) x buckets
    at = {(t["nodes"], t["algo"], t["bytes"]): t for t in times}
    big = 25 << 20
    auto, blind, filed = (at[64, a, big] for a in ("auto", "auto_blind", "auto_profiled"))
    assert auto["seconds"] < 0.9 * blind["seconds"], (blind, auto)
    best = min(at[64, a, big]["seconds"] for a in
               ("direct", "ring", "torus2d", "torus2d_ring", "hierarchical",
                "recursive_doubling", "rabenseifner", "double_binary_tree"))
    assert filed["seconds"] <= 1.05 * best
    assert auto["seconds"] <= 1.05 * best, (auto, best)


def _records(tmp_path, capsys, *extra: str) -> list:
    """`cadence sim --records` on 12 ranks on 3 hosts; the dumps, by rank."""
    from cadence.diagnosis.dumps import load_dir

    path = write(tmp_path, {"version": 1, "kind": "cadence-cluster", "hosts": 3,
                            "ranks_per_host": 4, "nic": {"rate": "10gbit", "latency_us": 20}})
    out = tmp_path / "dumps"
    rc = main(["sim", "--topology", str(path), "-b", "64K", "--records", str(out), *extra])
    assert rc == 0
    assert "wrote 12 dumps" in capsys.readouterr().out
    dumps, skipped = load_dir(str(out))
    dumps.sort(key=lambda d: d.rank)
    assert not skipped and [d.rank for d in dumps] == list(range(12))
    return dumps


def _live(dump) -> list:
    """The running operation's messages, by (peer, dir), in order."""
    (op,) = [o for o in dump.ops if o.running]
    assert op.messages_state == "live" and op.messages_at_ns == dump.dump_ns
    assert all(m.count >= 1 for m in op.messages)
    return op.messages


def test_sim_records_a_clean_run_as_every_call_completed(tmp_path, capsys):
    dumps = _records(tmp_path, capsys, "--calls", "2")
    assert all([o.status for o in d.ops] == ["ok", "ok"] for d in dumps)
    assert len({(o.sig, o.seq) for d in dumps for o in d.ops}) == 2
    assert len(dumps[0].peers) == 12 and dumps[0].host == "h0" and dumps[11].host == "h2"


def test_sim_records_a_rank_that_stops_calling(tmp_path, capsys):
    dumps = _records(tmp_path, capsys, "--fault", "stop:5@1")
    assert [o.status for o in dumps[5].ops] == ["ok"]
    for d in dumps[:5] + dumps[6:]:
        assert [o.status for o in d.ops] == ["ok", "running"]
        states = {m.state for m in _live(d)}
        assert states - {"done"}, f"rank {d.rank} waits on nothing"
    # Stuck for `cadence doctor`: dumped 31 s after the stall.
    assert dumps[0].dump_ns - dumps[0].ops[1].start_ns > 30e9


def test_sim_records_a_hung_link_pending_at_both_ends(tmp_path, capsys):
    # A link the library's algorithm uses in call 1: rank 0's first send.
    stopped = _records(tmp_path, capsys, "--fault", "stop:5@1")
    dst = next(m.peer for m in _live(stopped[0]) if m.dir == "send")
    dumps = _records(tmp_path, capsys, "--fault", f"hung-link:0-{dst}@1")
    assert all(d.ops[0].ok for d in dumps)
    first = {(m.peer, m.dir): m for m in reversed(_live(dumps[0]))}
    assert first[dst, "send"].state == "pending" and first[dst, "send"].moved == 0
    first = {(m.peer, m.dir): m for m in reversed(_live(dumps[dst]))}
    assert first[0, "recv"].state == "pending"


@pytest.mark.parametrize("args, says", [
    (["--records", "{out}", "--fault", "stop:12@1"], "rank 12 is not a rank of 12"),
    (["--records", "{out}", "--fault", "hung-link:1-1@0"], "itself"),
    (["--records", "{out}", "--fault", "stop5"], "expected stop:RANK@CALL"),
    (["--records", "{out}", "-e", "1M"], "one size"),
    (["--fault", "stop:1@1"], "go with --records"),
    (["--records", "{foreign}"], "not cadence dumps"),
])  # fmt: skip
def test_sim_records_refuses_what_it_cannot_do(tmp_path, capsys, args, says):
    path = write(tmp_path, {**SPEC, "hosts": 3, "ranks_per_host": 4})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    args = [a.format(out=tmp_path / "out", foreign=foreign) for a in args]
    rc = main(["sim", "--topology", str(path), "-b", "64K", *args])
    assert rc == 2
    assert says in capsys.readouterr().err
    assert (foreign / "notes.txt").exists()


def _judged_windows(fault) -> tuple[object, list[int]]:
    """30 allreduces of 4 MiB on 4 hosts of 2 (10 Gbit/s NICs), cut into
    windows of 15.5 calls (the judge's 5 warm-up collectives and 10 more,
    then 15), through the live path's steps: the verdict in force after the
    last window, and how many ranks published each."""
    spec = {**SPEC, "hosts": 4, "ranks_per_host": 2, "fabric": {"kind": "single_switch"}}
    sim = _core.SimCluster(json.dumps(spec), "spec.json")
    rec = sim.recording("allreduce", 1 << 20, 4, 30, fault)
    window_s = 15.5 * rec.seconds / 30
    watch, published = SlowWatch(), []
    for k in range(rec.count(window_s)):
        by_host: dict[str, list[bytes]] = {}
        for r, text in enumerate(rec.window(k, window_s)):
            if text is not None:
                s = rank_summary(parse(text, f"rank {r}"))
                by_host.setdefault(s.host, []).append(encode_rank(s))
        published.append(sum(map(len, by_host.values())))
        hosts = [encode_host(host_summary([decode_rank(b) for b in bs]))
                 for bs in by_host.values()]
        watch.feed([decode_host(b) for b in hosts])
    if fault is None:  # the one-call form cuts the same windows from the start
        texts = sim.windows("allreduce", 1 << 20, 4, 30, window_s=window_s)
        assert texts == [rec.window(k, window_s) for k in range(rec.count(window_s))]
    return watch.current, published


def test_window_records_of_a_slow_nic_name_its_host():
    v, published = _judged_windows({"kind": "slow-nic", "host": 1, "factor": 0.2})
    assert published[:2] == [8, 8]
    assert v is not None and v.cls == "comm_slow", v
    assert v.hosts == ["h1"] and v.ranks == [2, 3] and not v.links, v.headline
    clean, _ = _judged_windows(None)
    assert clean is None, clean.headline
