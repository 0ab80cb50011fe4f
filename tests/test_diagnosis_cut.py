"""A host that loses its only link, on the emulated cluster (root): the live
verdict names that host's network (`comm_hang`), also when the host is the
one serving the Store, and every rank's dump is in CADENCE_DUMP_DIR within
seconds of the soft deadline — one trial of the diagnosis campaign each
(`cadence.testbed.diag_campaign`, `--nics 1`: rank 0 serves the Store on
the only link). Three hosts, one rank each, 1 Gbit/s."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

import pytest
from clusters import why_no_clusters

HERE = Path(__file__).resolve()
PYTHON_DIR = HERE.parents[1] / "python"
WHY_NO_CLUSTERS = why_no_clusters()
needs_clusters = pytest.mark.skipif(WHY_NO_CLUSTERS is not None, reason=str(WHY_NO_CLUSTERS))


class _Pick:
    """The campaign's random draw, fixed: the host to cut."""

    def __init__(self, host: int):
        self.host = host

    def randrange(self, n: int) -> int:
        return self.host


@needs_clusters
def test_a_cut_single_link_host_is_named_and_every_rank_dumps(tmp_path, monkeypatch):
    from cadence import testbed
    from cadence.testbed import diag_campaign as camp

    monkeypatch.setenv("PYTHONPATH", str(PYTHON_DIR))
    name = f"cut{secrets.token_hex(2)}"
    cluster = testbed.build(name, hosts=3, nics=1, rate="1gbit")
    args = argparse.Namespace(ranks_per_host=1, diag_after=4.0, timeout=30.0, warmup=3.0,
                              at_step=30, delay=0.2, compute=0.005, clean_duration=10.0,
                              master_port=29700, slow_rate="200mbit", out=str(tmp_path))
    try:
        testbed.up(cluster)
        for n, host in enumerate((2, 0)):  # a host, then the Store's (rank 0's)
            t = camp.run_trial(cluster, args, n, "link_down", _Pick(host))
            took = t.verdict_t - t.fault_t if t.verdict_t and t.fault_t else None
            print(f"cut host {host}: {t.cls} in {took}s: {(t.verdict or {}).get('verdict')}; "
                  f"dumps {t.dumps} in {t.dumps_t}s; doctor: {t.doctor}")
            assert t.note == "", t.note
            assert t.cls == "comm_hang" and t.right_culprit, t.verdict
            assert t.in_time, (t.fault_t, t.verdict_t)
            # Every rank dumped at its soft deadline (4 s), long before the
            # operations' own (30 s), and the doctor reads them right.
            assert t.dumps == 3 and t.dumps_t is not None and t.dumps_t < 15, t.dumps_t
            assert t.doctor_ok, t.doctor
            # The round's own verdict (over the summaries that arrived) too.
            assert t.round_ok, t.round_verdict
    finally:
        testbed.down(name)
