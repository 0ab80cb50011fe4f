"""The fused operators as torch ops with autograd: `torch.ops.cadence.*`
(registered when cadence and torch are both imported), opaque to
torch.compile, and the layers built on them (cadence.torch.layers).

A communicator is named by its id (`comm.id`): custom ops take tensors and
plain values only. Backward passes (each rank gets the gradient of the sum of
every rank's loss with respect to its own operands):

- gemv_allreduce / gemm_allreduce (row-parallel linear): the output is the
  same on every rank, and so is its gradient (the layers after it are
  replicated), so backward needs no communication: dx = dy @ w^T,
  dw = x^T @ dy.
- allgather_matmul(a_shard, b): da = block r of sum over ranks of dy @ b^T,
  which is matmul_reduce_scatter(dy, b^T), fused too; db = gathered^T @ dy.
- matmul_reduce_scatter(a, b): dY = every rank's dy gathered (allgather_matmul
  of dy and b^T, fused, when the blocks are equal); da = dY @ b^T,
  db = a^T @ dY.
- embedding_bag_alltoall: the pooled gradients go back by the reverse
  all-to-all (fused: in rounds, each block added into the tables as it
  arrives), then into each table's rows (index_add).
- gemm_alltoall: dx = gemm_alltoall(dy, w^T) (the same routing, the experts
  transposed); dw_e = x_e^T @ dy_e with both dispatched to the expert.
"""

# No `from __future__ import annotations`: torch before 2.7 infers the ops'
# schemas from evaluated annotations, and from typing.List / typing.Tuple only.
from typing import List, Tuple  # noqa: UP035

import torch

from cadence.fused import alltoall as _a2a
from cadence.fused import row_blocks
from cadence.fused._pipeline import communicator

Tensor = torch.Tensor


# ---------------------------------------------------------- row-parallel


@torch.library.custom_op("cadence::gemv_allreduce", mutates_args=())
def gemv_allreduce(w: Tensor, x: Tensor, comm: str, fused: bool = True) -> Tensor:
    return communicator(comm).gemv_allreduce(w, x, fused=fused)


@gemv_allreduce.register_fake
def _(w, x, comm, fused=True):
    return w.new_empty((w.shape[0],))


def _gemv_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _gemv_backward(ctx, dy):
    w, x = ctx.saved_tensors
    return torch.outer(dy, x), w.t() @ dy, None, None


gemv_allreduce.register_autograd(_gemv_backward, setup_context=_gemv_setup)


@torch.library.custom_op("cadence::gemm_allreduce", mutates_args=())
def gemm_allreduce(x: Tensor, w: Tensor, comm: str, fused: bool = True) -> Tensor:
    return communicator(comm).gemm_allreduce(x, w, fused=fused)


@gemm_allreduce.register_fake
def _(x, w, comm, fused=True):
    return x.new_empty((x.shape[0], w.shape[1]))


def _gemm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _gemm_backward(ctx, dy):
    x, w = ctx.saved_tensors
    return dy @ w.t(), x.t() @ dy, None, None


gemm_allreduce.register_autograd(_gemm_backward, setup_context=_gemm_setup)


# ---------------------------------------------------------- async TP pair


@torch.library.custom_op("cadence::allgather_matmul", mutates_args=())
def allgather_matmul(a: Tensor, b: Tensor, comm: str,
                     fused: bool = True) -> Tuple[Tensor, Tensor]:  # noqa: UP006
    out, gathered = communicator(comm).allgather_matmul(a, b, fused=fused, return_gathered=True)
    return out, gathered


@allgather_matmul.register_fake
def _(a, b, comm, fused=True):
    n = communicator(comm).size
    return a.new_empty((n * a.shape[0], b.shape[1])), a.new_empty((n * a.shape[0], a.shape[1]))


def _ag_setup(ctx, inputs, output):
    _, b, comm, fused = inputs
    ctx.comm, ctx.fused = comm, fused
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(b, output[1])


def _ag_backward(ctx, dy, _dgathered):
    b, gathered = ctx.saved_tensors
    c = communicator(ctx.comm)
    da = c.matmul_reduce_scatter(dy.contiguous(), b.t().contiguous(), fused=ctx.fused)
    return da, gathered.t() @ dy, None, None


allgather_matmul.register_autograd(_ag_backward, setup_context=_ag_setup)


@torch.library.custom_op("cadence::matmul_reduce_scatter", mutates_args=())
def matmul_reduce_scatter(a: Tensor, b: Tensor, comm: str, fused: bool = True) -> Tensor:
    return communicator(comm).matmul_reduce_scatter(a, b, fused=fused)


@matmul_reduce_scatter.register_fake
def _(a, b, comm, fused=True):
    c = communicator(comm)
    return a.new_empty((row_blocks(a.shape[0], c.size)[c.rank], b.shape[1]))


def _rs_setup(ctx, inputs, output):
    a, b, comm, fused = inputs
    ctx.comm, ctx.fused = comm, fused
    ctx.save_for_backward(a, b)


def _rs_backward(ctx, dy):
    a, b = ctx.saved_tensors
    c = communicator(ctx.comm)
    blocks = row_blocks(a.shape[0], c.size)
    dy = dy.contiguous()
    if len(set(blocks)) == 1:
        da, full = c.allgather_matmul(dy, b.t().contiguous(), fused=ctx.fused,
                                      return_gathered=True)  # fmt: skip
    else:  # uneven blocks: gather them whole, then multiply
        full = c.allgatherv(dy.reshape(-1), [k * dy.shape[1] for k in blocks])
        full = full.reshape(a.shape[0], dy.shape[1])
        da = full @ b.t()
    return da, a.t() @ full, None, None


matmul_reduce_scatter.register_autograd(_rs_backward, setup_context=_rs_setup)


# ---------------------------------------------------------- all-to-all


@torch.library.custom_op("cadence::embedding_bag_alltoall", mutates_args=())
def embedding_bag_alltoall(
    tables: List[Tensor], indices: List[Tensor], offsets: List[Tensor], comm: str,  # noqa: UP006
    total_tables: int, mode: str = "sum", fused: bool = True,
) -> Tensor:  # fmt: skip
    out = communicator(comm).embedding_bag_alltoall(tables, indices, offsets, mode=mode,
                                                    fused=fused)  # fmt: skip
    if not isinstance(out, torch.Tensor):  # a rank with no tables allocates with numpy
        out = torch.from_numpy(out)
    if out.shape[1] != total_tables:
        raise ValueError(f"cadence embedding_bag_alltoall: the ranks hold {out.shape[1]} tables "
                         f"in all, not total_tables={total_tables}")  # fmt: skip
    return out


@embedding_bag_alltoall.register_fake
def _(tables, indices, offsets, comm, total_tables, mode="sum", fused=True):
    c = communicator(comm)
    batch = offsets[0].shape[0] if offsets else 0
    width = tables[0].shape[1] if tables else 0
    return torch.empty((row_blocks(batch, c.size)[c.rank], total_tables, width),
                       dtype=tables[0].dtype if tables else torch.float32)  # fmt: skip


def _eb_setup(ctx, inputs, output):
    tables, indices, offsets, comm, _, mode, fused = inputs
    ctx.comm, ctx.mode, ctx.fused = comm, mode, fused
    ctx.shapes = [tuple(t.shape) for t in tables]
    ctx.save_for_backward(*indices, *offsets)
    ctx.ntables = len(tables)
    ctx.dtype = output.dtype


def _eb_backward(ctx, dout):
    c = communicator(ctx.comm)
    saved = ctx.saved_tensors
    indices, offsets = saved[:ctx.ntables], saved[ctx.ntables:]
    grads = _a2a.embedding_bag_backward(c, dout.contiguous(), ctx.shapes, indices, offsets,
                                        ctx.mode, ctx.fused)  # fmt: skip
    none = [None] * ctx.ntables
    # As many entries as the op's inputs: torch 2.6 counts the ones passed,
    # later versions every one in the schema; needs_input_grad has that shape.
    rest = [None] * (len(ctx.needs_input_grad) - 3)
    return (grads, none, list(none), *rest)


embedding_bag_alltoall.register_autograd(_eb_backward, setup_context=_eb_setup)


@torch.library.custom_op("cadence::gemm_alltoall", mutates_args=())
def gemm_alltoall(tokens: Tensor, experts: Tensor, routing: Tensor, comm: str,
                  fused: bool = True) -> Tensor:  # fmt: skip
    return communicator(comm).gemm_alltoall(tokens, experts, routing, fused=fused)


@gemm_alltoall.register_fake
def _(tokens, experts, routing, comm, fused=True):
    return tokens.new_empty((tokens.shape[0], experts.shape[2]))


def _moe_setup(ctx, inputs, output):
    tokens, experts, routing, comm, fused = inputs
    ctx.comm, ctx.fused = comm, fused
    ctx.save_for_backward(tokens, experts, routing)


def _moe_backward(ctx, dy):
    tokens, experts, routing = ctx.saved_tensors
    c = communicator(ctx.comm)
    dy = dy.contiguous()
    dx = c.gemm_alltoall(dy, experts.transpose(1, 2).contiguous(), routing, fused=ctx.fused)
    dw = _a2a.expert_weight_grads(c, tokens, dy, routing, experts.shape)
    return dx, dw, None, None, None


gemm_alltoall.register_autograd(_moe_backward, setup_context=_moe_setup)
