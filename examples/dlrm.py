"""A small DLRM-style model trained on cadence's fused operators.

    torchrun --nproc-per-node 2 examples/dlrm.py --steps 50            # fused
    torchrun --nproc-per-node 2 examples/dlrm.py --steps 50 --unfused  # the plain path

The embedding tables are model-parallel: rank q owns tables q, q+n, ...
(cadence.torch.layers.ShardedEmbeddingBag, embedding_bag_alltoall: each rank
pools its tables for the whole batch and sends every rank the rows of its
batch slice, fused: a peer's rows leave as soon as they are pooled). The
MLPs are data-parallel: each rank runs its batch slice, and their gradients
are averaged with one allreduce per step. The target is a fixed random
function of the features, so the loss goes down. Fused and unfused give
bitwise the same losses: the all-to-all moves rows without summing them.
"""

from __future__ import annotations

import argparse

import cadence
import numpy as np
import torch
from cadence.torch.layers import ShardedEmbeddingBag

TABLES, ROWS, DIM, DENSE, BATCH, HOT = 8, 1000, 16, 13, 256, 3


def synthetic_batch(step: int):
    """The whole batch (every rank draws the same): dense features, per
    table HOT indices per sample, and a label from a fixed rule."""
    g = torch.Generator().manual_seed(1000 + step)
    dense = torch.randn(BATCH, DENSE, generator=g)
    idx = torch.randint(0, ROWS, (TABLES, BATCH * HOT), generator=g)
    # The label depends on the dense features and on which half of each
    # table the sample's first index falls in: something to learn.
    logit = dense[:, :4].sum(1) + (idx[:, ::HOT] < ROWS // 2).float().sum(0) - TABLES / 2
    return dense, idx, (logit > 0).float()


class DLRM(torch.nn.Module):
    def __init__(self, comm, fused: bool):
        super().__init__()
        n, r = comm.size, comm.rank
        torch.manual_seed(0)  # the same dense weights on every rank
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, 32), torch.nn.ReLU(),
                                          torch.nn.Linear(32, DIM))  # fmt: skip
        self.top = torch.nn.Sequential(torch.nn.Linear(DIM * (TABLES + 1), 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))  # fmt: skip
        self.mine = list(range(r, TABLES, n))  # tables this rank owns
        torch.manual_seed(100 + r)
        self.embeddings = ShardedEmbeddingBag(comm, [ROWS] * len(self.mine), DIM, TABLES,
                                              fused=fused)  # fmt: skip
        self.n = n
        # The exchange returns tables in rank order (rank 0's, then rank 1's,
        # ...); this puts them back in table order.
        order = [t for q in range(n) for t in range(q, TABLES, n)]
        self.register_buffer("table_order", torch.tensor(np.argsort(order)))

    def forward(self, dense_slice, idx):
        offsets = torch.arange(0, idx.shape[1], HOT)
        pooled = self.embeddings([idx[t] for t in self.mine], [offsets] * len(self.mine))
        pooled = pooled[:, self.table_order, :]  # (b_r, TABLES, DIM)
        features = torch.cat([self.bottom(dense_slice).unsqueeze(1), pooled], dim=1)
        return self.top(features.flatten(1)).squeeze(1)


def train(comm, steps: int, fused: bool, lr: float = 0.01) -> list[float]:
    """Losses (mean over the whole batch) of `steps` Adam steps."""
    model = DLRM(comm, fused)
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    mine = np.array_split(np.arange(BATCH), comm.size)[comm.rank]
    losses = []
    for step in range(steps):
        dense, idx, label = synthetic_batch(step)
        out = model(dense[mine], idx)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        loss = bce(out, label[mine], reduction="sum") / BATCH
        opt.zero_grad()
        loss.backward()
        # Data-parallel MLPs: sum the gradients of every rank's slice. The
        # tables' gradients are already their owner's alone.
        flat = torch.cat([p.grad.reshape(-1) for p in dense_params])
        comm.allreduce(flat)
        at = 0
        for p in dense_params:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        opt.step()
        total = torch.tensor([loss.item()], dtype=torch.float64)
        comm.allreduce(total)
        losses.append(float(total[0]))
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--unfused", action="store_true", help="compute, then all-to-all")
    args = p.parse_args()
    torch.set_num_threads(1)
    comm = cadence.init()
    losses = train(comm, args.steps, fused=not args.unfused)
    if comm.rank == 0:
        for step in range(0, len(losses), max(1, len(losses) // 10)):
            print(f"step {step:4d}  loss {losses[step]:.4f}", flush=True)
        print(f"step {len(losses) - 1:4d}  loss {losses[-1]:.4f}")
    comm.close()


if __name__ == "__main__":
    main()
