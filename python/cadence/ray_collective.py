"""cadence as a backend of Ray's collectives (`ray.util.collective`).

    from cadence.ray_collective import register
    register()  # in the driver and in every actor, before its group is made
    col.init_collective_group(world_size, rank, backend="cadence", group_name="g")
    col.allreduce(tensor, group_name="g")

Ray (2.5x and later) lets a backend register a `BaseGroup` class under a
name. Each group is one cadence communicator: its rank 0 serves a cadence
Store on its node and publishes the address in Ray's internal key-value
store under the group's name; the other ranks read it there, and all of
them rendezvous through that Store as `cadence.init` does. Tensors are
numpy arrays or CPU torch tensors (contiguous), as everywhere in cadence.
"""

from __future__ import annotations

import os
import time

import ray
import ray.experimental.internal_kv as internal_kv
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp

import cadence
from cadence._buffers import empty, is_tensor

#: The name groups are made with: `backend="cadence"` (Ray upper-cases it).
BACKEND = "CADENCE"

#: How long ranks other than 0 wait for rank 0's Store address.
RENDEZVOUS_S = float(os.environ.get("CADENCE_RAY_RENDEZVOUS", "120"))

_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min",
        ReduceOp.MAX: "max"}


def register() -> None:
    """Registers the backend with this process's Ray (idempotent). Ray asks
    for it in the driver and in every actor that joins a group."""
    if not _global_registry.is_registered(BACKEND):
        register_collective_backend(BACKEND, CadenceGroup)


def _address_key(group_name: str) -> str:
    return f"cadence/ray/{group_name}/store"


class CadenceGroup(BaseGroup):
    """One `ray.util.collective` group over a cadence communicator."""

    def __init__(self, world_size: int, rank: int, group_name: str):
        super().__init__(world_size, rank, group_name)
        key = _address_key(group_name)
        timeout = float(os.environ.get("CADENCE_TIMEOUT", "300"))
        if rank == 0:
            # A group made again under the same name must not find the
            # address of the one before: it is removed once all joined.
            self._store = cadence.Store(ray.util.get_node_ip_address(), 0, is_server=True,
                                        timeout=timeout)
            internal_kv._internal_kv_put(key, f"{self._store.host}:{self._store.port}",
                                         overwrite=True)
        else:
            host, port = self._wait_for(key).rsplit(":", 1)
            self._store = cadence.Store(host, int(port), timeout=timeout)
        self._comm = cadence.init(store=self._store, rank=rank, world_size=world_size,
                                  timeout=timeout, name=f"ray-{group_name}")
        self._comm.barrier()  # every rank has read the address
        if rank == 0:
            internal_kv._internal_kv_del(key)

    @staticmethod
    def _wait_for(key: str) -> str:
        deadline = time.monotonic() + RENDEZVOUS_S
        while (value := internal_kv._internal_kv_get(key)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cadence: rank 0 of the Ray collective group did not publish its Store "
                    f"under {key!r} within {RENDEZVOUS_S:g} s (CADENCE_RAY_RENDEZVOUS); "
                    "did it call init_collective_group with backend='cadence'?")
            time.sleep(0.05)
        return value.decode()

    @property
    def communicator(self) -> cadence.Communicator:
        """The cadence communicator under the group (its whole API)."""
        return self._comm

    def destroy_group(self):
        self._comm.close()

    @classmethod
    def backend(cls):
        return BACKEND

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def allreduce(self, tensor, allreduce_options=None):
        self._comm.allreduce(_one(tensor), op=_op(allreduce_options))

    def barrier(self, barrier_options=None):
        self._comm.barrier()

    def reduce(self, tensor, reduce_options=None):
        # Ray's reduce leaves the other ranks' tensors as they were.
        t = _one(tensor)
        root = getattr(reduce_options, "root_rank", 0)
        out = t if self._rank == root else empty(t, tuple(t.shape))
        self._comm.reduce(t, root=root, out=out, op=_op(reduce_options))

    def allgather(self, tensor_list, tensor, allgather_options=None):
        t = _one(tensor)
        outs = _list(tensor_list, self._world_size, t)
        gathered = self._comm.allgather(t)
        for dst, src in zip(outs, gathered, strict=True):
            _copy(dst, src)

    def broadcast(self, tensor, broadcast_options=None):
        self._comm.broadcast(_one(tensor), root=getattr(broadcast_options, "root_rank", 0))

    def reducescatter(self, output_tensor, tensor_list, reducescatter_options=None):
        out = _one(output_tensor)
        blocks = _list(tensor_list, self._world_size, out)
        self._comm.reduce_scatter(_stack(blocks), out=out, op=_op(reducescatter_options))

    def send(self, tensor, send_options):
        self._comm.send(_first(_one(tensor), send_options.n_elements), send_options.dst_rank)

    def recv(self, tensor, recv_options):
        self._comm.recv(_first(_one(tensor), recv_options.n_elements), recv_options.src_rank)


def _op(options) -> str:
    op = getattr(options, "reduceOp", ReduceOp.SUM)
    if op not in _OPS:
        names = sorted(o.name for o in _OPS)
        raise ValueError(f"cadence: Ray reduce op {op!r} is not one of {names}")
    return _OPS[op]


def _one(tensors):
    """Ray hands every tensor argument over in a list of one."""
    if not (isinstance(tensors, list) and len(tensors) == 1):
        raise ValueError("cadence: the Ray backend takes one tensor per process, "
                         f"got {type(tensors).__name__} of {len(tensors)}")
    return tensors[0]


def _list(tensor_lists, n: int, like) -> list:
    """The one list of `n` tensors shaped as `like` that Ray hands over."""
    tensors = _one(tensor_lists)
    if len(tensors) != n:
        raise ValueError(f"cadence: a list of {n} tensors (one a rank) was expected, "
                         f"got {len(tensors)}")
    for t in tensors:
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"cadence: every tensor of the list must have shape "
                             f"{tuple(like.shape)}, one has {tuple(t.shape)}")
    return tensors


def _stack(tensors):
    if is_tensor(tensors[0]):
        import torch

        return torch.stack(tensors)
    import numpy as np

    return np.stack(tensors)


def _copy(dst, src) -> None:
    if is_tensor(dst):
        dst.copy_(src)
    else:
        import numpy as np

        np.copyto(dst, src)


def _first(t, n: int):
    """The first `n` elements of `t` (Ray's `n_elements`; 0 means all)."""
    if not n:
        return t
    return t.reshape(-1)[:n]
