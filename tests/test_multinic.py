"""Several NICs per host (issue 13, first slice): CADENCE_SOCKET_IFNAME takes
a list or a prefix, every rank listens on each NIC, and a message between
two hosts is striped over every rail they share — checked on an emulated
cluster with two rails (root), where both NICs must carry the traffic and
every result must match numpy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import cadence
import pytest
from test_testbed import PYTHON_DIR, make_cluster, needs_clusters  # noqa: F401


def test_interface_lists_and_prefixes():
    names = sorted(n for _, n in socket.if_nameindex())
    lo = "lo" if "lo" in names else names[0]
    assert cadence.socket_interfaces(lo) == [lo]
    assert cadence.socket_interfaces(f"{lo}, {lo}") == [lo]  # once each
    prefix = lo[:1]
    assert cadence.socket_interfaces(prefix) == [n for n in names if n.startswith(prefix)]
    with pytest.raises(ValueError, match="no interface is named or starts with 'nope9'"):
        cadence.socket_interfaces(f"{lo},nope9")
    with pytest.raises(ValueError, match="names no interface"):
        cadence.socket_interfaces(" , ")


RANK = r"""
import json, sys
import numpy as np
import cadence
comm = cadence.init(timeout=60)
def nic_bytes():
    out = {}
    for line in open("/proc/net/dev").read().splitlines()[2:]:
        name, rest = line.split(":", 1)
        if name.strip().startswith("eth"):
            f = rest.split()
            out[name.strip()] = int(f[8])  # bytes sent
    return out
before = nic_bytes()
rng = np.random.default_rng(comm.rank)
wrong = []
for n in (0, 1, 7, 1000, 65537, 3_000_001):
    for dtype in ("float64", "int32"):
        x = (rng.standard_normal(n) * 100).astype(dtype)
        parts = comm.allgather(x)
        want = parts.sum(axis=0, dtype=dtype)
        comm.allreduce(x)
        if not np.allclose(x, want, rtol=1e-12, atol=1e-9):
            wrong.append((n, dtype))
after = nic_bytes()
print(json.dumps({"rank": comm.rank, "wrong": wrong,
                  "sent": {k: after[k] - before.get(k, 0) for k in after}}))
comm.close()
"""


@needs_clusters
def test_a_job_stripes_over_both_rails(make_cluster, tmp_path):  # noqa: F811
    cluster = make_cluster(3, nics=2, rate="1gbit", tag="mn")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {"PYTHONPATH": str(PYTHON_DIR)}
    p = subprocess.run(
        [sys.executable, "-m", "cadence.cli.main", "cluster", "run", "--name", cluster.name,
         "--timeout", "120", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, env={**os.environ, **env},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    res = [json.loads(line.partition(": ")[2]) for line in p.stdout.splitlines()
           if line.startswith("[rank")]
    assert sorted(r["rank"] for r in res) == [0, 1, 2], p.stdout
    for r in res:
        assert r["wrong"] == [], r
        # Each rank sends ~2 x 24 MB of allreduce and allgather data to the
        # other hosts: both NICs carry a large share of it.
        eth0, eth1 = r["sent"]["eth0"], r["sent"]["eth1"]
        assert eth0 > 5e6 and eth1 > 5e6, r["sent"]
        assert 0.5 < eth0 / eth1 < 2.0, r["sent"]
