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


def _trainer(backend: str, n: int = 2, epochs: int = 3) -> dict:
    import integration_workers as iw

    return all_ok(spawn(_ranked(iw.trainer_worker), n, backend, epochs, env=_env(n),
                        timeout=240))


def test_trainer_trains_over_cadence_exactly_as_over_gloo():
    """HF `Trainer` with the process group made first: DDP under it, its
    loss logging and its data sharding all over cadence, step for step the
    same as over gloo."""
    pytest.importorskip("transformers")
    ours, gloo = _trainer("cadence"), _trainer("gloo")
    for r in (0, 1):
        assert ours[r]["torch_backend"] == "cadence", ours[r]
        assert ours[r]["parallel_mode"] == "ParallelMode.DISTRIBUTED", ours[r]
        assert ours[r]["world_size"] == 2 and ours[r]["steps"] == 3 * 64 // (8 * 2), ours[r]
        # The logged loss is the mean over the ranks (Trainer gathers it).
        assert len(ours[r]["losses"]) == ours[r]["steps"], ours[r]["losses"]
        assert ours[r]["losses"] == ours[0]["losses"], (r, ours[r]["losses"])
        assert ours[r]["losses"] == gloo[r]["losses"], (r, ours[r]["losses"], gloo[r]["losses"])
        assert torch.equal(ours[r]["params"], gloo[r]["params"])
        assert torch.equal(ours[r]["params"], ours[0]["params"])
    first, last = ours[0]["losses"][:4], ours[0]["losses"][-4:]
    assert sum(last) < 0.8 * sum(first), ours[0]["losses"]


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


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    tests = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=3, include_dashboard=False, object_store_memory=80 << 20,
             log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": tests, "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def _ray_reference(seed: int, n: int) -> dict:
    """What every rank of the Ray test's collectives must end with."""
    import numpy as np
    from integration_workers import ray_input

    ref: dict = {}
    reduce = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}
    for dtype in ("float32", "float64", "int32", "int64"):
        for size in (0, 1, 1001):
            for op, f in reduce.items():
                ref[("allreduce", dtype, size, op)] = f.reduce(
                    [ray_input(seed, r, dtype, size) for r in range(n)]).astype(dtype)
    ref["allreduce bf16"] = sum(torch.from_numpy(ray_input(seed, r, "float32", 777))
                                .to(torch.bfloat16).float().numpy() for r in range(n))
    ref["broadcast"] = ray_input(seed, n - 1, "float32", 999)
    ref["reduce"] = np.maximum.reduce([ray_input(seed, r, "float64", 513) for r in range(n)])
    ref["allgather"] = [ray_input(seed, r, "float32", 15).reshape(3, 5) for r in range(n)]
    ref["reducescatter"] = [sum(ray_input(seed + 1 + b, r, "float32", 301) for r in range(n))
                            for b in range(n)]
    ref["send"] = ray_input(seed, 0, "int64", 37)
    return ref


def test_ray_actors_run_every_collective_through_cadence(ray_cluster):
    """Three actors (not a power of two) in a group made with
    `init_collective_group(backend="cadence")`, every collective of
    `ray.util.collective` against numpy, numpy arrays and torch tensors;
    then a second group on the same actors made the declarative way."""
    import numpy as np
    from integration_workers import ray_input

    ray = ray_cluster
    import integration_workers as iw

    n, seed = 3, 11
    members = [ray.remote(num_cpus=1)(iw.RayMember).remote() for _ in range(n)]
    assert ray.get([m.join.remote(n, r, "g1") for r, m in enumerate(members)],
                   timeout=120) == [0, 1, 2]
    got = ray.get([m.collectives.remote("g1", seed) for m in members], timeout=120)
    ref = _ray_reference(seed, n)
    for r, out in enumerate(got):
        assert out["rank"] == r and out["size"] == n
        for key, want in ref.items():
            if key == "reduce" and r != 1:  # others keep their input
                np.testing.assert_array_equal(out[key], ray_input(seed, r, "float64", 513))
            elif key == "reducescatter":
                np.testing.assert_allclose(out[key], want[r], rtol=1e-5, atol=1e-5)
            elif key == "send":
                if r == n - 1:
                    np.testing.assert_array_equal(out["recv"], want)
            elif key == "allreduce bf16":
                np.testing.assert_allclose(out[key], want, rtol=2e-2, atol=2e-2)
            elif key == "allgather":
                for a, b in zip(out[key], want, strict=True):
                    np.testing.assert_array_equal(a, b)
            else:
                assert out[key].shape == want.shape and out[key].dtype == want.dtype, key
                np.testing.assert_allclose(out[key], want, rtol=1e-5, atol=1e-5, err_msg=str(key))
        assert "must have shape (5,), one has (4,)" in out["bad allgather"], out["bad allgather"]

    # Declarative: the driver names the members, each joins at its first call.
    import ray.util.collective as col
    from cadence.ray_collective import register

    register()
    col.create_collective_group(members, n, list(range(n)), backend="cadence", group_name="g2")
    again = ray.get([m.collectives.remote("g2", seed) for m in members], timeout=120)
    for r in range(n):
        np.testing.assert_array_equal(again[r]["broadcast"], ref["broadcast"])
    ray.get([m.leave.remote(g) for m in members for g in ("g1", "g2")], timeout=60)
