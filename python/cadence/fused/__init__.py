"""Fused compute + collective operators: the math that produces a tensor
overlapped with the collective that moves it (docs/fused.md).

Each operator is also a method of `cadence.Communicator` (`comm.gemv_allreduce(
w, x)`), takes numpy arrays or CPU torch tensors (float32, float64, bfloat16,
float16), and has a plain path behind `fused=False`: compute everything, then
communicate. `matmul` holds the tensor-parallel operators (allreduce,
allgather, reduce-scatter), `alltoall` the exchanges (DLRM embeddings,
mixture-of-experts); `_pipeline` the machinery they share.
"""

from cadence.fused.alltoall import embedding_bag_alltoall, gemm_alltoall
from cadence.fused.matmul import (
    allgather_matmul,
    gemm_allreduce,
    gemv_allreduce,
    matmul_reduce_scatter,
    row_blocks,
)

__all__ = [
    "allgather_matmul",
    "embedding_bag_alltoall",
    "gemm_allreduce",
    "gemm_alltoall",
    "gemv_allreduce",
    "matmul_reduce_scatter",
    "row_blocks",
]
