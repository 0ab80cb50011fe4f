"""Topology (docs/topology.md): racks on the emulated cluster, the profiler's
inference of groups, topology files, rings ordered by the path finder in a
real job, and the profile a job without a file measures at start-up.

Pure parts (inference on synthetic measurements through `_core.topo_groups`,
the file format, `topo show`, the core's path finder through
`_core.topo_ring`) and jobs of several "hosts" on this machine run
everywhere; the cluster parts need root (network namespaces) and skip with
the reason elsewhere. The inference's own unit tests (capacities, flows) are
the core's (crates/cadence-core/src/fabric/infer.rs)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from cadence import _core, testbed
from cadence.cli import main as cli_main
from test_testbed import PYTHON_DIR, make_cluster, needs_clusters  # noqa: F401

GBIT, UPLINK = 1e9 / 8, 250e6 / 8


def _rack_rates(rack_of, nic, uplink, jitter=0.03, seed=0):
    """Alone rates of a leaf/spine model: NIC speed inside a rack, the
    uplink across, each with a little measurement noise."""
    rng = random.Random(seed)
    n = len(rack_of)
    return [[0.0 if a == b else
             (min(nic[a], nic[b]) if rack_of[a] == rack_of[b] else min(nic[a], nic[b], uplink))
             * (1 - rng.uniform(0, jitter)) for b in range(n)] for a in range(n)]  # fmt: skip


def _as_groups(rack_of):
    groups = {}
    for h, r in enumerate(rack_of):
        groups.setdefault(r, []).append(h)
    return sorted(groups.values())


def test_groups_are_recovered_from_alone_rates_of_random_placements():
    rng = random.Random(14)
    for trial in range(200):
        n = rng.randint(4, 8)
        racks = rng.choice([2, 3]) if n >= 6 else 2
        rack_of = testbed.cluster.place(n, racks, "random", seed=trial)
        nic = [GBIT * rng.choice([1.0, 1.0, 0.5]) for _ in range(n)]
        uplink = min(nic) * rng.uniform(0.1, 0.5)
        rates = _rack_rates(rack_of, nic, uplink, seed=trial)
        assert _core.topo_groups(rates) == _as_groups(rack_of), (rack_of, nic)


def test_without_a_slower_uplink_there_is_one_group():
    rates = _rack_rates([0, 1, 0, 1], [GBIT] * 4, 2 * GBIT)
    assert _core.topo_groups(rates) == [[0, 1, 2, 3]]


def _file(rack_of, nic=None, uplink=UPLINK):
    n = len(rack_of)
    nic = nic or [GBIT] * n
    groups = _as_groups(rack_of)
    return {"version": 1, "kind": "cadence-topology", "note": "synthetic",
            "hosts": [f"h{i}" for i in range(n)],
            "rates": _rack_rates(rack_of, nic, uplink, jitter=0.0),
            "groups": groups, "group_out": [uplink] * len(groups),
            "group_in": [uplink] * len(groups)}  # fmt: skip


def test_the_path_finder_crosses_each_uplink_once():
    doc = _file([0, 1, 0, 1])
    ring = _core.topo_ring(json.dumps(doc))
    # Rank order crosses between the racks at every hop: each uplink carries
    # two of the ring's flows.
    assert ring["default_score"] == pytest.approx(UPLINK / 2)
    assert ring["score"] == pytest.approx(UPLINK)
    order = ring["order"]
    crossings = sum(doc["groups"][0].count(order[i]) != doc["groups"][0].count(order[i - 1])
                    for i in range(4))  # fmt: skip
    assert crossings == 2 and order[0] == 0 and sorted(order) == [0, 1, 2, 3]
    assert ring["chain"][0] == 0 and sorted(ring["chain"]) == [0, 1, 2, 3]
    # A job on some of the file's hosts, in its own order.
    sub = _core.topo_ring(json.dumps(doc), ["h3", "h0", "h1"])
    assert sorted(sub["order"]) == [0, 1, 2]
    with pytest.raises(ValueError, match="does not know host"):
        _core.topo_ring(json.dumps(doc), ["h0", "zz"])
    bad = dict(doc, version=7)
    with pytest.raises(ValueError, match="version 7"):
        _core.topo_ring(json.dumps(bad))


def test_topo_show_prints_groups_matrix_and_ring_and_draws(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_file([0, 1, 0, 1])))
    png = tmp_path / "t.png"
    assert cli_main.main(["topo", "show", str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "group 0: h0 h2" in out and "group 1: h1 h3" in out, out
    assert "widest ring: h0 -> " in out and "250 Mbit/s per flow, against 125" in out, out
    assert png.stat().st_size > 10_000
    assert cli_main.main(["topo", "show", str(tmp_path / "missing.json")]) == 1


def test_topo_show_summarises_the_rates_of_many_hosts(tmp_path, capsys):
    # 40 hosts profiled by shifted rounds: the groups, and one line for the
    # 1560 estimated rates instead of 40 rows of 40. The file stores each
    # host's best rates, as such a profile writes it; the rates follow.
    doc = _file([h // 8 for h in range(40)])
    del doc["rates"]
    doc["host_rates"] = {"out": [GBIT] * 40, "in": [GBIT] * 40}
    doc["profile"] = {"bytes_per_flow": 1 << 20, "method": "shifts", "seconds": 2.0}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    png = tmp_path / "t.png"
    assert cli_main.main(["topo", "show", str(path), "--png", str(png)]) == 0
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "1024 KiB flows (shifts) in 2.0 s" in out, out
    assert "group 4: h32 h33 h34 h35 h36 h37 h38 h39" in out, out
    assert "alone rates, Mbit/s (estimated from the shifted rounds; 40 hosts, too many" in out
    assert "min 250, median 250, max 1000" in out, out
    assert len(out.splitlines()) < 16, out


RANK = r"""
import json, os
import numpy as np
import cadence
comm = cadence.init(timeout=60)
rng = np.random.default_rng(comm.rank)
wrong = []
for n in (0, 5, 70001):
    x = rng.integers(-100, 100, n).astype(np.float32)
    parts = comm.allgather(x)
    y = x.copy()
    comm.allreduce(y, algo="ring")
    wrong += [n] if not np.array_equal(y, parts.sum(axis=0)) else []
    rs = comm.reduce_scatter(np.tile(x, comm.size), algo="ring")
    wrong += [("rs", n)] if not np.array_equal(rs, parts.sum(axis=0)) else []
    b = x.copy() if comm.rank == 1 else np.zeros(n, np.float32)
    comm.broadcast(b, root=1, algo="pipelined_chain")
    wrong += [("bc", n)] if not np.array_equal(b, parts[1]) else []
order = comm.dump_records()["ring_order"]
print("RESULT " + json.dumps({"rank": comm.rank, "wrong": wrong, "order": order}), flush=True)
comm.close()
"""


def _run_local(tmp_path, hosts, env, port_offset=0):
    """One process per rank on this machine, CADENCE_HOST from `hosts`."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = 29000 + os.getpid() % 1000 + port_offset
    procs = []
    for r, h in enumerate(hosts):
        e = dict(os.environ, **env, RANK=str(r), WORLD_SIZE=str(len(hosts)),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CADENCE_HOST=h,
                 CADENCE_CALIBRATE="0", OMP_NUM_THREADS="1",
                 PYTHONPATH=str(PYTHON_DIR))  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script)], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return outs, [p.returncode for p in procs]


def test_a_job_orders_its_rings_by_the_topology_file(tmp_path):
    # Hosts h0..h3 in rank order, racks {h0, h2} and {h1, h3}: two ranks per
    # host over TCP between the "hosts" of this one machine.
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(_file([0, 1, 0, 1])))
    hosts = ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]
    outs, codes = _run_local(tmp_path, hosts, {"CADENCE_TOPO_FILE": str(path),
                                                "CADENCE_DEBUG": "INFO"})
    assert codes == [0] * 8, outs
    results = [json.loads(line[7:]) for o in outs for line in o.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert len(results) == 8, outs
    for r in results:
        assert r["wrong"] == [], r
        assert r["order"]["hosts"] in (["h0", "h2", "h1", "h3"], ["h0", "h2", "h3", "h1"]), r
        assert r["order"]["source"] == str(path)
    assert "INFO: ring order h0 -> h2 -> " in outs[0] and "(2.00x)" in outs[0], outs[0]


def test_without_a_file_a_job_profiles_at_start_up_and_the_next_reads_the_cache(tmp_path):
    # Four "hosts" over TCP on this machine: rates there are whatever the CPU
    # gives, so the order may or may not change; what must hold is that
    # every rank took the same one, the collectives stay right, the cost is
    # reported, and the second job reads rank 0's cache instead of measuring.
    hosts = ["h0", "h1", "h2", "h3"]
    # `profile`: these hosts are on loopback, which is not profiled unless asked.
    env = {"CADENCE_TOPO_FILE": "profile", "CADENCE_TOPO_CACHE": str(tmp_path / "cache"),
           "CADENCE_DEBUG": "INFO"}  # fmt: skip
    outs, codes = _run_local(tmp_path, hosts, env)
    assert codes == [0] * 4, outs
    results = [json.loads(line[7:]) for o in outs for line in o.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert all(r["wrong"] == [] for r in results), results
    orders = {json.dumps(r["order"]["hosts"]) for r in results}
    assert len(orders) == 1, results
    first = results[0]["order"]
    assert first["profile_seconds"] > 0, first
    assert first["source"] in ("default", "profile at start-up"), first
    assert "INFO: topology: profiling 4 hosts: 12 pairs alone" in outs[0], outs[0]
    cached = list((tmp_path / "cache").glob("topo-*.json"))
    assert len(cached) == 1, cached
    doc = json.loads(cached[0].read_text())
    assert sorted(doc["hosts"]) == hosts and doc["profile"]["ranks"] == 4, doc
    outs, codes = _run_local(tmp_path, hosts, env, port_offset=1)
    assert codes == [0] * 4, outs
    assert "INFO: topology: the profile cached 0 min ago in " in outs[0], outs[0]
    assert "profiling" not in outs[0], outs[0]
    again = [json.loads(line[7:]) for o in outs for line in o.splitlines()
             if line.startswith("RESULT ")]  # fmt: skip
    assert all(r["order"]["hosts"] == first["hosts"] for r in again), (first, again)
    assert all(r["order"].get("profile_seconds") is None for r in again), again


def test_hosts_emulated_on_loopback_are_not_profiled_by_default(tmp_path):
    # Loopback has no network between the "hosts" to measure: a job with
    # CADENCE_TOPO_FILE unset keeps rank order, says why, and caches nothing.
    env = {"CADENCE_TOPO_FILE": "", "CADENCE_TOPO_CACHE": str(tmp_path / "cache"),
           "CADENCE_DEBUG": "INFO"}  # fmt: skip
    outs, codes = _run_local(tmp_path, ["h0", "h1", "h2", "h3"], env)
    assert codes == [0] * 4, outs
    assert "INFO: topology: 4 hosts emulated on loopback: no network" in outs[0], outs[0]
    assert "profiling" not in outs[0], outs[0]
    results = [json.loads(line[7:]) for o in outs for line in o.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert len(results) == 4 and all(r["wrong"] == [] for r in results), results
    assert all(r["order"].get("profile_seconds") is None for r in results), results
    assert not list((tmp_path / "cache").glob("topo-*.json"))


def test_ranks_with_different_topology_files_refuse_to_start(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_file([0, 1, 0, 1])))
    b.write_text(json.dumps(_file([0, 0, 1, 1])))
    # Rank 0 reads a, the others b: CADENCE_TOPO_FILE through a per-rank
    # wrapper.
    script = tmp_path / "pick.py"
    script.write_text(
        "import os, runpy\n"
        f"os.environ['CADENCE_TOPO_FILE'] = {str(a)!r} if os.environ['RANK'] == '0' "
        f"else {str(b)!r}\n"
        "import cadence\n"
        "try:\n"
        "    cadence.init(timeout=30)\n"
        "    print('STARTED')\n"
        "except Exception as e:\n"
        "    print('REFUSED', e, flush=True)\n"
    )
    port = 30000 + os.getpid() % 1000
    procs = [subprocess.Popen(
        [sys.executable, str(script)], text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, RANK=str(r), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), CADENCE_HOST=f"h{r}", CADENCE_CALIBRATE="0",
                 PYTHONPATH=str(PYTHON_DIR)))
        for r in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=90)[0] for p in procs]
    # Every rank refuses; rank 0 (which serves the store) with the reason,
    # the others with it too unless rank 0 left first.
    assert all("REFUSED" in o and "STARTED" not in o for o in outs), outs
    assert "ranks loaded different topology files" in outs[0], outs[0]
    assert "set CADENCE_TOPO_FILE alike" in outs[0], outs[0]


# ------------------------------------------------------------------ clusters


@pytest.fixture
def racked(make_cluster):  # noqa: F811 - the fixture imported from test_testbed
    def make(hosts, racks, placement, seed=0, uplink="250mbit"):
        return make_cluster(hosts, tag="tp", racks=racks, uplink_rate=uplink,
                            placement=placement, seed=seed)  # fmt: skip

    return make


def test_racks_are_wired_as_placed():
    c = testbed.build("tw", 6, 2, "1gbit", racks=3, uplink_rate="200mbit",
                      placement="interleaved")  # fmt: skip
    assert c.rack_of == (0, 1, 2, 0, 1, 2)
    assert c.hosts[4].nics[1].bridge == "rail1r1"
    assert len(c.uplinks) == 6 and c.uplinks[0].leaf_port == "up0k0"
    assert sorted(c.bridges) == sorted(["rail0", "rail1"] + [f"rail{k}r{j}" for k in range(2)
                                                              for j in range(3)])  # fmt: skip
    assert testbed.cluster.place(5, 2, "blocked") == [0, 0, 0, 1, 1]
    random_deal = testbed.cluster.place(8, 2, "random", seed=3)
    assert sorted(random_deal) == [0, 0, 0, 0, 1, 1, 1, 1]
    again = testbed.Cluster.from_json(json.loads(json.dumps(c.to_json())))
    assert again == c
    with pytest.raises(testbed.TestbedError, match="--racks must be 1..2"):
        testbed.build("tw", 2, 1, "1gbit", racks=3)


@needs_clusters
def test_profile_recovers_racks_and_rates_and_the_found_ring_is_faster(racked, tmp_path):
    c = racked(6, 2, "random", seed=5)
    out = tmp_path / "t.json"
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "topo", "profile",
                        "--cluster", c.name, "-o", str(out)], env=env, text=True,
                       capture_output=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["hosts"] == [h.name for h in c.hosts]
    assert doc["groups"] == _as_groups(list(c.rack_of)), (doc["groups"], c.rack_of)
    # Rates within 45 % of the configured ones (4x apart, so still told
    # apart: 0.55-1.45 of one never meets 0.55-1.45 of the other). A pair
    # alone runs 50 ms on emulated links that need the 2 cores: in 7 runs
    # of this file one pair came out at 0.834 of 1 Gbit/s and another at
    # 0.734 of its 250 Mbit/s uplink, and a clean-clone CI run measured one
    # at 0.61 (9 local runs after it: all within 30 %); the profile measures
    # again only pairs that look stalled, and these did not.
    for a in range(6):
        for b in range(6):
            if a != b:
                want = GBIT if c.rack_of[a] == c.rack_of[b] else UPLINK
                assert abs(doc["rates"][a][b] / want - 1) < 0.45, (a, b, doc["rates"][a][b])
    # Capacities within 20 %, as in the shifts' test below: a clean-clone CI
    # run here measured one uplink at 0.845 of its rate.
    for cap in doc["group_out"] + doc["group_in"]:
        assert cap is not None and abs(cap / UPLINK - 1) < 0.2, doc["group_out"]
    measured = {p["name"]: min(f[2] for f in p["flows"]) for p in doc["patterns"]
                if p["name"].startswith("ring in")}  # fmt: skip
    # Ideally 2x (one flow per uplink instead of two); a busy 2-core CI host
    # once measured 1.48x. A wrong order gives about 1x.
    assert measured["ring in found order"] > 1.3 * measured["ring in rank order"], measured


def _shifted_profile(cluster, out) -> str | None:
    """One `topo profile` by shifted rounds on the two racks of
    `test_shifted_rounds_find_racks_whose_uplinks_beat_one_nic`: None when
    it found what the cluster is, else what was wrong (with its output)."""
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "topo", "profile",
                        "--cluster", cluster.name, "-o", str(out), "--pairs-max", "2",
                        "--seconds", "0.2"],
                       env=env, text=True, capture_output=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["profile"]["method"] == "shifts"
    # Each host's best rates, not the matrix they give (n, not n², numbers).
    assert "rates" not in doc and len(doc["host_rates"]["out"]) == 6, doc
    shifts = [q["name"] for q in doc["patterns"] if q["name"].startswith("shift")]
    assert len(shifts) <= 6, shifts
    if doc["groups"] != [[0, 1, 2], [3, 4, 5]]:
        return f"groups {doc['groups']}:\n{p.stdout}"
    assert "groups from the shifts" in p.stdout, p.stdout
    uplink = 120e6 / 8
    caps = doc["group_out"] + doc["group_in"]
    # Within 20 %: TCP's unfair sharing and the 2 cores' load move it by up
    # to 18 % (seen with a simulation running beside).
    if not all(cap is not None and abs(cap / uplink - 1) < 0.2 for cap in caps):
        return f"uplinks {caps} against {uplink:.0f} B/s:\n{p.stdout}"
    return None


@needs_clusters
def test_shifted_rounds_find_racks_whose_uplinks_beat_one_nic(make_cluster, tmp_path):  # noqa: F811
    # Uplinks at 1.2x a NIC: any pair alone runs at its NICs' rate, so only
    # load shows the racks. The shifted rounds alone (--pairs-max 2, as a
    # job over more than 16 hosts runs them) find both racks and what each
    # uplink carries, in a handful of rounds. A measurement on 6 emulated
    # hosts sharing 2 cores: flows of ~0.2 s (4 MiB), not the default 0.05 s,
    # and up to three profiles, one of which must be right. Alone, 1 profile
    # in 4-8 here had a rack split or every flow at 2/3 of its rate (CI: a
    # ring of single flows at 48-67 of 100 Mbit/s); a profiler that cannot
    # find the racks fails all three.
    c = make_cluster(6, rate="100mbit", tag="ts", racks=2, uplink_rate="120mbit",
                     placement="blocked")  # fmt: skip
    wrong = []
    for attempt in range(3):
        why = _shifted_profile(c, tmp_path / f"t{attempt}.json")
        if why is None:
            return
        wrong.append(why)
    pytest.fail("three profiles, none right:\n" + "\n---\n".join(wrong))


@needs_clusters
def test_cluster_up_refuses_a_changed_rack_layout_and_status_shows_wiring(racked, capsys):
    c = racked(4, 2, "interleaved")
    assert cli_main.main(["cluster", "status", "--name", c.name]) == 0
    out = capsys.readouterr().out
    assert f"rack 0 rail 0: {c.name}-h0 {c.name}-h2 -> rail0r0" in out, out
    assert "out 250mbit, in 250mbit, up, 8.0:1" in out, out
    with pytest.raises(testbed.TestbedError, match="remove it first"):
        testbed.up(testbed.build(c.name, 4, 1, "1gbit", racks=2, placement="blocked"))
    s = testbed.set_uplink(c, 1, 0, rate="100mbit")
    assert s.rate_out == 100_000_000 and s.rate_in == 100_000_000
    assert cli_main.main(["cluster", "link", "--name", c.name, "--rack", "0", "--down"]) == 0
    assert testbed.uplink_states(c)[0].state == "down"
