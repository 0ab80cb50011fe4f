"""The torch benchmarks of docs/benchmarks.md run, on tiny shapes: what they
print, and what they check on the way (every rank decodes the same tokens,
cadence and gloo the same ones)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, timeout: float = 300) -> str:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    return p.stdout


def test_tp_decode_runs_and_every_sharding_decodes_the_same_tokens():
    out = _run("tp_decode.py", "--nranks", "2", "--layers", "2", "--hidden", "64", "--heads",
               "4", "--ffn", "128", "--vocab", "500", "--prompt", "6", "--tokens", "4",
               "--rounds", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith("    2")]
    assert [r[1] for r in rows] == ["cadence", "gloo", "cadence/hand", "gloo/hand", "local"], out
    # Two partial sums add the same in any order: the backends and both ways
    # of sharding agree token for token, on every rank.
    assert "different tokens" not in out, out


def test_torch_path_prints_a_row_per_shape():
    out = _run("torch_path.py", "--nranks", "2", "--sizes", "8K,64K", "--dtypes",
               "float32,bfloat16", "--rounds", "1", "--funcol")
    rows = [line.split() for line in out.splitlines() if line.startswith("    2")]
    assert [(r[1], r[2]) for r in rows] == [("float32", "8"), ("float32", "64"),
                                            ("bfloat16", "8"), ("bfloat16", "64")], out
    assert all(float(r[4]) > 0 and float(r[5]) > 0 and float(r[6]) > 0 for r in rows), out
    assert all(float(r[-2]) > 0 for r in rows), out  # funcol's µs a call
