"""What the framework integrations' tests run on every rank (spawned by
`torch_launch.spawn`): a tiny model trained the way each framework's
users train it, with the process group cadence or gloo."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _tiny_regression(seed: int = 0):
    """A two-layer MLP and a fixed dataset of 64 samples."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 16, generator=gen)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=gen)
    return model, torch.utils.data.TensorDataset(x, y)


def accelerate_worker(rank, n, outdir, backend: str, epochs: int):
    """HF Accelerate on CPU: the process group is made first with
    `backend` (Accelerate's CPU path only ever asks for gloo or mpi, and
    takes a group that already exists), then the usual loop. Returns the
    losses, the final parameters, what Accelerate and torch report, the
    gathered losses of the last step, and the loop's time."""
    import cadence  # noqa: F401  (registers the backend)
    from accelerate import Accelerator

    dist.init_process_group(backend)
    acc = Accelerator(cpu=True)
    model, data = _tiny_regression()
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
            losses.append(loss.item())
    took = time.perf_counter() - t0
    gathered = acc.gather(loss.detach().reshape(1)).tolist()
    params = torch.cat([p.detach().reshape(-1) for p in acc.unwrap_model(model).parameters()])
    out = {"losses": losses, "params": params, "took": took, "gathered": gathered,
           "torch_backend": dist.get_backend(), "type": str(acc.distributed_type),
           "processes": acc.num_processes}
    acc.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


def deepspeed_worker(rank, n, outdir, backend: str, stages: tuple[int, ...], steps: int):
    """DeepSpeed on CPU: `init_distributed(dist_backend=backend)`, then per
    ZeRO stage of `stages` a fresh copy of the model trained `steps` steps
    (every rank its own batches). Returns per stage the losses and the
    final parameters (gathered whole under stage 3), and torch's backend."""
    import cadence  # noqa: F401  (registers the backend)
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)
    out = {"torch_backend": dist.get_backend()}
    for stage in stages:
        model, _ = _tiny_regression()
        cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
               "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=cfg)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(steps):
            x = torch.randn(8, 16, generator=gen)
            y = x[:, :4].sum(dim=1, keepdim=True)
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()),
                                               enabled=stage == 3):
            params = torch.cat([p.detach().reshape(-1).clone()
                                for p in engine.module.parameters()])
        out[stage] = {"losses": losses, "params": params}
        engine.destroy()
    dist.destroy_process_group()
    return out
