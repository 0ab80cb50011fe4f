"""What the framework integrations' tests run on every rank (spawned by
`torch_launch.spawn`): a tiny model trained the way each framework's
users train it, with the process group cadence or gloo."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _tiny_regression(seed: int = 0, width: int = 32):
    """A two-layer MLP (`width` hidden units) and a fixed dataset of 64
    samples."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, 1))
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


class _Regressor(nn.Module):
    """The tiny regression model in the shape HF `Trainer` takes: keyword
    inputs, a dict with the loss out."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": F.mse_loss(out, labels), "logits": out}


class _Samples(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i]
        return {"x": x, "labels": y}


def trainer_worker(rank, n, outdir, backend: str, epochs: int, width: int = 32):
    """HF `Trainer` on CPU: the process group made first with `backend`
    (TrainingArguments' `ddp_backend` accepts only the names it lists, and
    Accelerate under it takes a group that exists), then `Trainer.train()`
    as usual. Returns the logged losses, the final parameters, torch's
    backend, what Trainer reports, and the training's time."""
    import cadence  # noqa: F401  (registers the backend)
    from transformers import Trainer, TrainingArguments

    dist.init_process_group(backend)
    net, data = _tiny_regression(width=width)
    args = TrainingArguments(output_dir=str(outdir), use_cpu=True, per_device_train_batch_size=8,
                             num_train_epochs=epochs, learning_rate=0.2, optim="sgd",
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], seed=0, data_seed=3, disable_tqdm=True,
                             dataloader_num_workers=0)
    trainer = Trainer(model=_Regressor(net), args=args, train_dataset=_Samples(data))
    t0 = time.perf_counter()
    result = trainer.train()
    took = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    out = {"losses": losses, "params": params, "took": took, "torch_backend": dist.get_backend(),
           "parallel_mode": str(args.parallel_mode), "world_size": args.world_size,
           "steps": result.global_step}
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


class RayMember:
    """A Ray actor that joins cadence groups through `ray.util.collective`
    (the class is made a Ray actor by the test: `ray.remote(RayMember)`)."""

    def __init__(self):
        from cadence.ray_collective import register

        register()

    def join(self, n: int, rank: int, group: str) -> int:
        import ray.util.collective as col

        col.init_collective_group(n, rank, backend="cadence", group_name=group)
        return col.get_rank(group)

    def collectives(self, group: str, seed: int) -> dict:
        """Every collective of the API on inputs drawn from `seed` and the
        rank (the driver draws them again for its reference)."""
        import numpy as np
        import ray.util.collective as col
        from ray.util.collective.types import ReduceOp

        col.barrier(group)  # a group made the declarative way is joined here
        r, n = col.get_rank(group), col.get_collective_group_size(group)
        out: dict = {"rank": r, "size": n}
        for dtype in ("float32", "float64", "int32", "int64"):
            for size in (0, 1, 1001):
                for op in ("SUM", "PRODUCT", "MIN", "MAX"):
                    x = ray_input(seed, r, dtype, size)
                    col.allreduce(x, group, op=ReduceOp[op])
                    out[("allreduce", dtype, size, op)] = x
        t = torch.from_numpy(ray_input(seed, r, "float32", 777)).to(torch.bfloat16)
        col.allreduce(t, group)
        out["allreduce bf16"] = t.float().numpy()
        x = ray_input(seed, r, "float32", 999)
        col.broadcast(x, n - 1, group)
        out["broadcast"] = x
        x = ray_input(seed, r, "float64", 513)
        col.reduce(x, 1, group, op=ReduceOp.MAX)
        out["reduce"] = x
        parts = [torch.empty(3, 5) for _ in range(n)]
        col.allgather(parts, torch.from_numpy(ray_input(seed, r, "float32", 15)).reshape(3, 5),
                      group)
        out["allgather"] = [p.numpy() for p in parts]
        blocks = [ray_input(seed + 1 + b, r, "float32", 301) for b in range(n)]
        got = np.empty(301, dtype=np.float32)
        col.reducescatter(got, blocks, group)
        out["reducescatter"] = got
        if r == 0:
            col.send(ray_input(seed, r, "int64", 37), n - 1, group)
        elif r == n - 1:
            got = np.zeros(37, dtype=np.int64)
            col.recv(got, 0, group)
            out["recv"] = got
        try:
            col.allgather([np.empty(4, dtype=np.float32) for _ in range(n)],
                          np.ones(5, dtype=np.float32), group)
        except ValueError as e:
            out["bad allgather"] = str(e)
        col.barrier(group)
        return out

    def leave(self, group: str) -> None:
        import ray.util.collective as col

        col.destroy_collective_group(group)


def ray_input(seed: int, rank: int, dtype: str, size: int):
    """A rank's input to the Ray test's collectives: small integers for the
    integer types (products stay in range), normal floats otherwise."""
    import numpy as np

    rng = np.random.default_rng([seed, rank, size])
    if dtype.startswith("int"):
        return rng.integers(-3, 4, size=size).astype(dtype)
    return rng.standard_normal(size).astype(dtype)
