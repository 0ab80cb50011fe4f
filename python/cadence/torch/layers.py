"""Drop-in layers on the fused operators (docs/fused.md).

- `RowParallelLinear`: the second linear of a tensor-parallel MLP. Each rank
  holds a slice of the input features (K_r of K) and the matching rows of the
  weight; the output, summed over ranks, is the same on every rank
  (gemm_allreduce, fused: the sum of each tile of output rows travels while
  the next is computed).
- `ShardedEmbeddingBag`: DLRM's model-parallel embeddings. Each rank owns
  some of the tables, pools them for the whole batch, and gets back the
  pooled rows of its own batch slice from every table
  (embedding_bag_alltoall, fused: rows for peers first, sent as they are
  pooled).

`comm` is a cadence.Communicator, or a torch process group of the "cadence"
backend (its communicator is used).
"""

from __future__ import annotations

import math

import torch

from cadence.torch import fused as _ops  # noqa: F401 - registers torch.ops.cadence.*


def communicator_of(comm):
    """The cadence.Communicator of `comm` (itself, or a "cadence" group's)."""
    if hasattr(comm, "gemm_allreduce"):
        return comm
    try:
        backend = comm._get_backend(torch.device("cpu"))
        return backend.communicator
    except (AttributeError, RuntimeError) as e:
        raise TypeError(
            "cadence layers need a cadence.Communicator or a process group of the 'cadence' "
            f"backend, not {type(comm).__name__}"
        ) from e


class RowParallelLinear(torch.nn.Module):
    """y = sum over ranks of x_r @ W_r (+ bias): x_r (..., in_features_shard),
    W_r (in_features_shard, out_features), y (..., out_features)."""

    def __init__(self, comm, in_features_shard: int, out_features: int, bias: bool = True,
                 fused: bool = True, dtype=None):  # fmt: skip
        super().__init__()
        self.comm = communicator_of(comm)
        self.fused = fused
        self.weight = torch.nn.Parameter(torch.empty(in_features_shard, out_features, dtype=dtype))
        # The bias is added once, after the sum (it is the same on every rank).
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        bound = 1 / math.sqrt(in_features_shard * self.comm.size)
        torch.nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.ops.cadence.gemm_allreduce(flat, self.weight, self.comm.id, self.fused)
        y = y.reshape(*lead, y.shape[-1])
        return y + self.bias if self.bias is not None else y


class ShardedEmbeddingBag(torch.nn.Module):
    """This rank's tables (`num_embeddings[t]` rows of `dim`), pooled by
    `mode` over every bag of the batch; forward returns (b_r, T, dim), the
    pooled rows of this rank's batch slice (the batch split as
    numpy.array_split does) from all `total_tables` tables, in rank order."""

    def __init__(self, comm, num_embeddings: list[int], dim: int, total_tables: int,
                 mode: str = "sum", fused: bool = True, dtype=None):  # fmt: skip
        super().__init__()
        self.comm = communicator_of(comm)
        self.mode, self.fused, self.total_tables = mode, fused, total_tables
        self.tables = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(rows, dim, dtype=dtype) / math.sqrt(dim))
            for rows in num_embeddings
        )

    def forward(self, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        return torch.ops.cadence.embedding_bag_alltoall(
            list(self.tables), list(indices), list(offsets), self.comm.id, self.total_tables,
            self.mode, self.fused,
        )  # fmt: skip
