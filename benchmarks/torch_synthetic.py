"""Synthetic-data DDP training throughput, cadence against gloo, in the
spirit of Horovod's pytorch_synthetic_benchmark.py: a ResNet-like CNN
(defined here; there is no CPU torchvision), random images and labels made
once, SGD; images/sec per rank over timed iterations after a warm-up.

    .venv/bin/python benchmarks/torch_synthetic.py --nranks 2 4

For each rank count it starts one job (one process per rank, started by
torch.multiprocessing) that trains four identical models in turn: DDP on
cadence (the default group), DDP on gloo (a `new_group(backend="gloo")` of
the same ranks), and two floors: "sync-only", DDP whose buckets are not
exchanged (each bucket's hook allreduces one number, so the ranks still wait
for each other: what a step costs with infinitely fast communication), and
"local", the model without DDP. It rotates between them every iteration: on a
shared, noisy machine, drift then hits all alike. It prints images/sec per
rank (median over iterations and ranks, with the interquartile range),
cadence/gloo, the throughput ratio (above 1: cadence trains faster), both as
the ratio of the medians and as the median of the per-iteration ratios of
back-to-back iterations, and how much longer a step takes than each floor.

Each rank computes with one thread (torch.set_num_threads(1)), as a job with
one rank per core would; ranks may outnumber cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from cadence.bench import torch_job

BACKENDS = ("cadence", "gloo")
FLOORS = ("sync-only", "local")
RUNS = (*BACKENDS, *FLOORS)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3×3 convolutions and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNetLike(nn.Module):
    """ResNet-18's layout (four stages of `depth` basic blocks, channels
    width·1, 2, 4, 8) for small images: width 64, depth 2 is ResNet-18
    (11.2M parameters); width 64, depth 1 has 4.9M."""

    def __init__(self, width: int = 64, depth: int = 1, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for stage in range(4):
            cout = width * 2 ** stage
            for i in range(depth):
                blocks.append(BasicBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _sync_only_hook(_state, bucket):
    import torch.distributed as dist

    flag = torch.zeros(1)
    fut = dist.all_reduce(flag, async_op=True).get_future()
    return fut.then(lambda _: bucket.buffer())


def _rank_main(rank, n, port, args, outdir):
    torch.set_num_threads(1)
    import cadence  # noqa: F401 - registers the backend
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("cadence", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    groups = {"cadence": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.classes, (args.batch_size,))
    models, opts = {}, {}
    for name in RUNS:
        torch.manual_seed(0)
        model = ResNetLike(args.width, args.depth, args.classes)
        if name in groups:
            model = DDP(model, process_group=groups[name])
        elif name == "sync-only":
            # DDP whose buckets are not exchanged: each bucket's hook only
            # allreduces one number (on cadence). What is left of a step is
            # DDP's own work and waiting for the slowest rank: the floor any
            # backend's DDP step can reach on this machine.
            model = DDP(model, process_group=groups["cadence"])
            model.register_comm_hook(None, _sync_only_hook)
        # "local": the same training without DDP: no communication at all.
        models[name] = model
        opts[name] = torch.optim.SGD(models[name].parameters(), lr=0.01, momentum=0.9)

    def step(name):
        opts[name].zero_grad()
        F.cross_entropy(models[name](data), target).backward()
        opts[name].step()

    for name in models:
        for _ in range(args.num_warmup_batches):
            step(name)
    rates = {name: [] for name in models}
    order = list(models)
    for it in range(args.num_iters):
        # Rotate which one goes first, so that drift favours none.
        k = it % len(order)
        for name in order[k:] + order[:k]:
            dist.barrier()
            t = time.perf_counter()
            for _ in range(args.num_batches_per_iter):
                step(name)
            rates[name].append(args.batch_size * args.num_batches_per_iter
                               / (time.perf_counter() - t))
    # Results first: gloo's teardown sometimes aborts the process (SIGABRT,
    # "terminate called without an active exception") after a clean run.
    torch_job.report(outdir, rank, rates)
    dist.destroy_process_group()


def run_job(n: int, args) -> dict[str, list[list[float]]]:
    """One job training both models; returns {backend: per-rank lists of
    images/sec, one entry per timed iteration}."""
    ranks = torch_job.run(_rank_main, n, args, args.timeout)
    return {b: [rk[b] for rk in ranks] for b in ranks[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--width", type=int, default=64, help="channels of the first stage")
    p.add_argument("--depth", type=int, default=1, help="basic blocks per stage")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8, help="images per rank per batch")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1, help="jobs per rank count")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    model = ResNetLike(args.width, args.depth, args.classes)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"# ResNet-like width {args.width} depth {args.depth}: {nparams / 1e6:.2f}M parameters "
          f"({nparams * 4 / 2**20:.1f} MiB of fp32 gradients per step); "
          f"{args.image_size}x{args.image_size} images, batch {args.batch_size} per rank; "
          f"{args.num_iters} iters x {args.num_batches_per_iter} batches after "
          f"{args.num_warmup_batches} warm-up; {os.cpu_count()} cores", flush=True)
    results = {}
    for n in args.nranks:
        per_rank = {b: [[] for _ in range(n)] for b in RUNS}
        for _ in range(args.rounds):
            job = run_job(n, args)
            for b in RUNS:
                for r in range(n):
                    per_rank[b][r] += job[b][r]
        results[n] = per_rank
        flat = {b: [x for rk in per_rank[b] for x in rk] for b in RUNS}
        # Paired ratios: the two backends' iterations ran back to back.
        paired = [c / g for rc, rg in zip(per_rank["cadence"], per_rank["gloo"], strict=True)
                  for c, g in zip(rc, rg, strict=True)]
        line = [f"{n} ranks, img/s per rank:"]
        for b in RUNS:
            med = statistics.median(flat[b])
            q1, _, q3 = statistics.quantiles(flat[b], n=4)
            line.append(f"{b} {med:.1f} (IQR {q1:.1f}-{q3:.1f})")
        ratio = statistics.median(flat["cadence"]) / statistics.median(flat["gloo"])
        q1, pm, q3 = statistics.quantiles(paired, n=4)
        line.append(f"cadence/gloo {ratio:.2f}x (paired iterations: median {pm:.2f}x, "
                    f"IQR {q1:.2f}-{q3:.2f}x)")
        for fl in FLOORS:
            floor = statistics.median(flat[fl])
            over = ", ".join(f"{b} +{100 * (floor / statistics.median(flat[b]) - 1):.0f}%"
                             for b in BACKENDS)
            line.append(f"step time over {fl}: {over}")
        print("  ".join(line), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "params": nparams, "rates": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
