"""cadence as a torch.distributed backend.

    import cadence                      # registers "cadence" once torch is imported
    import torch.distributed as dist
    dist.init_process_group("cadence")  # under torchrun; or store=, rank=, world_size=
    # DDP, FSDP2 (fully_shard), new_group, split_group and the dist.* calls work unchanged.

`init_process_group("cpu:cadence,cuda:nccl")` puts cadence on CPU tensors
only (torch 2.14 on; older torch cannot construct a Python `c10d.Backend`,
and such a group is refused with an error that says so). Alone, cadence
also takes CUDA tensors, staged through host memory.

Supported: torch 2.6 to 2.15. What differs on torch before 2.14 is torch's
doing, not cadence's: `split_group` is refused (it needs a bound device and a
Python Backend), `dist.monitored_barrier` accepts only gloo (call the
group's own `monitored_barrier`), and `_set_pg_timeout` is ignored with a
warning. Before 2.15, `device_id` must be an accelerator's.
The group's timeout (`timeout=` of `init_process_group`/`new_group`) is
every operation's deadline. Failures raise `torch.distributed.DistBackendError`
with cadence's message, which names the operation and the rank to blame
(also in the exception's `culprit` attribute).

What differs from gloo: send/recv tags are not matched (a pair's messages
arrive in the order they were sent); `recv` without `src` takes the first
rank that sends to this one; `set_timeout` is
refused (the deadline is fixed at creation); ReduceOp.BAND/BOR/BXOR work by
gathering every rank's data.
"""

from __future__ import annotations

import torch.distributed as dist

from cadence.torch._group import BACKEND, BackendCadence, ProcessGroupCadence, create_backend
from cadence.torch._work import CadenceWork

__all__ = ["register", "ProcessGroupCadence", "BackendCadence", "CadenceWork"]


def register() -> None:
    """Registers the "cadence" backend with torch.distributed (idempotent)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])


register()


def _register_fused_ops() -> None:
    """torch.ops.cadence.* (cadence/torch/fused.py). A failure here must not
    take the backend down with it: it is reported, and the ops are missing."""
    try:
        from cadence.torch import fused  # noqa: F401 - registers on import
    except Exception as e:  # noqa: BLE001 - any failure: warn, keep the backend
        import warnings

        warnings.warn(f"cadence: torch.ops.cadence.* not registered: {e}", stacklevel=2)


_register_fused_ops()
