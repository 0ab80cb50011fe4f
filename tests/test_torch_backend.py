"""The torch.distributed backend "cadence", launched the way users launch:
torch.multiprocessing (spawn) and torchrun, 2 and 3 ranks.

- every op against a reference computed locally, every dtype torch supports
  for it, on the world group, a sub-group and a split group;
- DDP training of a small CNN: parameters identical on all ranks after every
  step, losses equal to the same run on gloo, and a communication hook that
  chains on Work.get_future();
- FSDP2 (fully_shard) training of transformer blocks against the unsharded
  model, with ReduceOp.AVG and PREMUL_SUM gradient reduction;
- a rank killed mid-training: the others raise a clear error in time.

The rank functions live in torch_workers.py, the launcher in torch_launch.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch_workers as w
from torch_launch import all_ok, free_port, spawn, torchrun


def _env():
    """env:// rendezvous, as torchrun would set it up."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def _check_ops(results):
    out = all_ok(results)
    failures = [f for v in out.values() for f in v["failures"]]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    assert min(v["checks"] for v in out.values()) > 500


def test_cadence_detects_what_this_torch_allows():
    """cadence feature-detects torch; the tests know each release's limits
    (torch_workers.py). The two must agree, or one of them is wrong."""
    from cadence.torch import _group

    assert _group.PY_BACKEND == w.PY_BACKEND, (torch.__version__, _group.PY_BACKEND)


@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "tcp")])
def test_every_op_matches_local_reference(n, transport):
    # The 3-rank world is bound to a device (eager init, split-capable parent)
    # where torch lets a CPU device be bound (2.15 on): before, device_id must
    # be an accelerator's.
    device_id = torch.device("cpu", 0) if n == 3 and w.CPU_DEVICE_ID else None
    _check_ops(spawn(w.ops_worker, n, "cadence", transport, device_id, timeout=180,
                     env=_env()))


def test_every_op_as_cpu_backend_of_a_mixed_group():
    """"cpu:cadence,cuda:gloo": cadence is one device's backend inside torch's
    own ProcessGroup (the shape "cpu:cadence,cuda:nccl" gets). Before torch
    2.14 a Python c10d.Backend cannot be constructed: then the group is
    refused on every rank with an error that says so and what to use."""
    if w.PY_BACKEND:
        _check_ops(spawn(w.ops_worker, 2, "cpu:cadence,cuda:gloo", timeout=180, env=_env()))
        return
    out = all_ok(spawn(w.mixed_refused_worker, 2, timeout=120, env=_env()))
    for r in range(2):
        err = out[r]["error"]
        assert err is not None, f"rank {r}: a mixed group was created on torch {torch.__version__}"
        assert "cannot give cadence one device of a group" in err, err
        assert 'init_process_group("cadence")' in err, err


def test_import_cadence_registers_backend_without_importing_torch():
    code = (
        "import sys, cadence\n"
        "assert 'torch' not in sys.modules, 'import cadence imported torch'\n"
        "import torch.distributed as dist\n"
        "assert dist.is_backend_available('cadence')\n"
        "assert 'cpu' in dist.Backend.backend_capability['cadence']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_waits_from_torch_cpp_reach_cadence():
    """torch's C++ waits on our Work itself at DDP's start (parameter shapes
    checked by an allgather, module states broadcast). torch 2.6 does not
    forward such a wait to a Python Work that Python no longer holds; cadence
    keeps its Works alive for it. One rank, so a hang is the only failure."""
    code = (
        "import gc, cadence, torch, torch.distributed as dist\n"
        "dist.init_process_group('cadence', store=dist.HashStore(), rank=0, world_size=1)\n"
        "pg = dist.distributed_c10d._get_default_group()\n"
        "t = torch.arange(4.0)\n"
        "dist._broadcast_coalesced(pg, [t], 1 << 20, 0)\n"
        "gc.collect()\n"
        "dist._verify_params_across_processes(pg, [t])\n"
        "assert torch.equal(t, torch.arange(4.0))\n"
        "dist.destroy_process_group()\n"
    )
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torch {torch.__version__}: a wait() from torch's C++ hung")


def _check_ddp(out, n):
    for run in ("cadence", "gloo", "hook"):
        params = [out[r][run][1] for r in range(n)]
        steps = len(params[0])
        assert steps >= 20
        for s in range(steps):
            for r in range(1, n):
                assert torch.equal(params[r][s], params[0][s]), (
                    f"{run}: parameters differ between rank 0 and rank {r} after step {s}"
                )
    for r in range(n):
        ours, gloo, hook = (out[r][k][0] for k in ("cadence", "gloo", "hook"))
        assert ours == pytest.approx(gloo, rel=1e-4, abs=1e-5), (r, ours, gloo)
        assert hook == pytest.approx(ours, rel=1e-4, abs=1e-5), (r, hook, ours)
        assert out[r]["hook"][2] >= 20, "the communication hook did not run every step"
    # Same trajectory as gloo for the parameters too, at the end.
    final = out[0]["cadence"][1][-1]
    assert torch.allclose(final, out[0]["gloo"][1][-1], rtol=1e-4, atol=1e-5)


def test_ddp_under_torchrun_matches_gloo():
    results, log = torchrun(["ddp"], 2, timeout=180)
    out = all_ok(results)
    assert out[0]["backend"] == "cadence", log
    _check_ddp(out, 2)


def test_ddp_three_ranks_matches_gloo():
    out = all_ok(spawn(w.ddp_worker, 3, 20, free_port(), timeout=180))
    _check_ddp(out, 3)


@pytest.mark.parametrize("n,divide_factor", [(2, None), (3, 12)])
def test_fsdp2_matches_unsharded(n, divide_factor):
    out = all_ok(spawn(w.fsdp_worker, n, 10, divide_factor, timeout=200))
    if not w.FSDP2_CPU:
        # torch's own FSDP2 cannot run on CPU before 2.7 (any backend): the
        # check is that it gets there, in torch, past its first all-gather
        # on cadence (torch.cpu.Stream.record_event right after it).
        for r in range(n):
            assert "record_event" in out[r].get("torch_refused", ""), out[r]
        return
    for r in range(n):
        res = out[r]
        assert len(res["losses"]) >= 10
        assert res["losses"] == pytest.approx(res["ref_losses"], rel=1e-4, abs=1e-6)
        assert res["max_param_diff"] < 1e-4, res["max_param_diff"]
    # The reference learns: the comparison is not between two stuck models.
    assert out[0]["ref_losses"][-1] < out[0]["ref_losses"][0]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_killed_rank_raises_clear_error_within_timeout(transport):
    n, victim, timeout_s = 3, 2, 15
    results = spawn(w.kill_worker, n, transport, free_port(), victim, 5, timeout_s,
                    timeout=timeout_s + 60)
    assert results[victim][0] == "lost"
    for r in range(n):
        if r == victim:
            continue
        status, res = results[r]
        assert status == "ok", res
        assert res["step"] is not None, f"rank {r} trained on after rank {victim} died"
        assert res["is_runtime_error"], res
        assert f"rank {victim}" in res["message"], res["message"]
        assert res["at"] - res["death"] <= timeout_s + 5, res


@pytest.mark.hardware_skip
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_staged_through_host():
    out = all_ok(spawn(w.cuda_worker, 2, free_port(), timeout=180))
    failures = [f for v in out.values() for f in v["failures"]]
    assert not failures, "\n".join(failures)
