"""Launches a torch.distributed job the way users do: one process per rank
started by torch.multiprocessing (spawn), or by torchrun.

`spawn(fn, n, *args)` runs `fn(rank, n, outdir, *args)` on every rank and
returns {rank: ("ok", value) | ("err", traceback) | ("lost", exit code)}.
Every launch has a deadline and stragglers are killed, so a hang fails the
test instead of CI. Unlike `torch.multiprocessing.spawn(join=True)`, a rank
that dies does not take the others down: the fault tests need the survivors'
reports.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import torch.multiprocessing as tmp

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _result_path(outdir: str, rank: int) -> str:
    return os.path.join(outdir, f"rank{rank}.pkl")


def save_result(outdir: str, rank: int, status: str, value) -> None:
    tmp_path = _result_path(outdir, rank) + ".tmp"
    with open(tmp_path, "wb") as f:
        pickle.dump((status, value), f)
    os.replace(tmp_path, _result_path(outdir, rank))


def _entry(rank, fn, n, outdir, env, args):
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    try:
        value = fn(rank, n, outdir, *args)
        save_result(outdir, rank, "ok", value)
    except BaseException as e:  # noqa: BLE001 - reported to the parent verbatim
        save_result(outdir, rank, "err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


def _collect(outdir, n, exitcodes):
    results = {}
    for r in range(n):
        try:
            with open(_result_path(outdir, r), "rb") as f:
                results[r] = pickle.load(f)
        except FileNotFoundError:
            results[r] = ("lost", f"exit code {exitcodes[r]} (died or killed at the deadline)")
    return results


def spawn(fn, n, *args, timeout=120.0, env=None):
    """Runs fn(rank, n, outdir, *args) in n spawned processes."""
    base = {"OMP_NUM_THREADS": "1"}
    base.update(env or {})
    with tempfile.TemporaryDirectory(prefix="cadence-torch-") as outdir:
        ctx = tmp.start_processes(_entry, args=(fn, n, outdir, base, args), nprocs=n,
                                  join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while any(p.is_alive() for p in ctx.processes) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
        return _collect(outdir, n, [p.exitcode for p in ctx.processes])


def torchrun(script_args, n, *, timeout=120.0, env=None):
    """Runs `torchrun --nproc-per-node n tests/torch_workers.py <script_args>`
    (standalone rendezvous); returns (per-rank results, torchrun's output)."""
    with tempfile.TemporaryDirectory(prefix="cadence-torchrun-") as outdir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", os.path.join(HERE, "torch_workers.py"), outdir,
               *script_args]
        e = dict(os.environ, OMP_NUM_THREADS="1")
        e.update(env or {})
        proc = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
        return _collect(outdir, n, [proc.returncode] * n), proc.stdout + proc.stderr


def all_ok(results):
    bad = {r: v for r, v in results.items() if v[0] != "ok"}
    assert not bad, "\n".join(f"rank {r}: {s}: {v}" for r, (s, v) in sorted(bad.items()))
    return {r: v[1] for r, v in results.items()}
