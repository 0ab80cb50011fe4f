"""The frameworks people launch, over cadence (docs/integrations.md): each
recipe run as its users run it, against the same run over gloo."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch_launch import all_ok, free_port, spawn


def _env(n: int) -> dict:
    """What torchrun puts in the environment of each of n ranks on one
    host, less the rank (`_ranked` sets RANK and LOCAL_RANK)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n)}


def _accelerate(backend: str, n: int = 2, epochs: int = 3) -> dict:
    import integration_workers as iw

    return all_ok(spawn(_ranked(iw.accelerate_worker), n, backend, epochs, env=_env(n),
                        timeout=240))


class _ranked:
    """Sets RANK and LOCAL_RANK from the spawned rank, then calls `fn`
    (picklable, unlike a closure)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, rank, n, outdir, *args):
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
        return self.fn(rank, n, outdir, *args)


def test_accelerate_trains_over_cadence_exactly_as_over_gloo():
    pytest.importorskip("accelerate")
    ours, gloo = _accelerate("cadence"), _accelerate("gloo")
    for r in (0, 1):
        assert ours[r]["torch_backend"] == "cadence", ours[r]
        assert ours[r]["type"] == "DistributedType.MULTI_CPU" and ours[r]["processes"] == 2
        assert len(ours[r]["losses"]) == 3 * 64 // (8 * 2)  # each rank's shard of the batches
        # Two ranks: every gradient element is one sum of two numbers, so
        # cadence and gloo give the same bits, step after step.
        assert ours[r]["losses"] == gloo[r]["losses"], (r, ours[r]["losses"], gloo[r]["losses"])
        assert torch.equal(ours[r]["params"], gloo[r]["params"])
        # Both ranks hold the same model, and gather brought both losses.
        assert torch.equal(ours[r]["params"], ours[0]["params"])
        assert ours[r]["gathered"] == [ours[0]["losses"][-1], ours[1]["losses"][-1]]
    # The loss went down: the loop trained something.
    assert ours[0]["losses"][-1] < 0.5 * ours[0]["losses"][0], ours[0]["losses"]


def _deepspeed(backend: str, stages=(1, 2, 3), steps: int = 10, n: int = 2) -> dict:
    import integration_workers as iw

    # DeepSpeed's CPU accelerator compiles its shared-memory op with the
    # ninja of this environment (on PATH) at first use.
    env = {**_env(n), "DS_ACCELERATOR": "cpu",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    return all_ok(spawn(_ranked(iw.deepspeed_worker), n, backend, stages, steps, env=env,
                        timeout=280))


def test_deepspeed_zero_trains_over_cadence_exactly_as_over_gloo():
    """`deepspeed.init_distributed(dist_backend="cadence")`, ZeRO stages 1,
    2 and 3 on CPU: the same losses and parameters as over gloo, step by
    step (two ranks: every sum is of two numbers)."""
    pytest.importorskip("deepspeed")
    ours, gloo = _deepspeed("cadence"), _deepspeed("gloo")
    for r in (0, 1):
        assert ours[r]["torch_backend"] == "cadence", ours[r]["torch_backend"]
        for stage in (1, 2, 3):
            a, b = ours[r][stage], gloo[r][stage]
            assert a["losses"] == b["losses"], (r, stage, a["losses"], b["losses"])
            assert torch.equal(a["params"], b["params"]), (r, stage)
            assert torch.equal(a["params"], ours[0][stage]["params"]), (r, stage)
    # The stages train the same model the same way: same trajectory.
    assert ours[0][1]["losses"] == pytest.approx(ours[0][3]["losses"], rel=1e-5)
