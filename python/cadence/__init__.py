"""cadence — a collective communication library for distributed training.

    import cadence
    comm = cadence.init()            # MASTER_ADDR/PORT, RANK, WORLD_SIZE set (or store=, ...)
    comm.allreduce(x)                # numpy array or CPU torch tensor, in place
    w = comm.allgather(x, async_op=True); y = w.wait()

Every collective checks its arguments against the other ranks' and fails with
`cadence.CommError` naming the operation and the culprit rank instead of
hanging (deadline: `CADENCE_TIMEOUT`, default 300 s).
"""

from __future__ import annotations

from cadence._communicator import Communicator, init
from cadence._core import CommError, Store, Work, algorithms
from cadence._rendezvous import host_identity, socket_interfaces

__all__ = ["init", "Communicator", "CommError", "Store", "Work", "algorithms", "host_identity",
           "socket_interfaces"]
__version__ = "0.1.0"


# --- torch.distributed backend -----------------------------------------------
# `import cadence` makes `init_process_group("cadence")` work without importing
# torch here (2-3 s, and numpy-only users have no use for it): the backend is
# registered now if torch is loaded, else right after `import torch` finishes.


def _register_torch_backend() -> None:
    try:
        import cadence.torch  # noqa: F401 - registers the backend on import
    except Exception as e:  # noqa: BLE001 - must not break `import torch`
        import warnings

        warnings.warn(f"cadence: torch.distributed backend not registered: {e}", stacklevel=2)


class _AfterTorchImport:
    """A meta path finder that wraps torch's loader once, to register the
    backend when the torch package has finished executing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _register_torch_backend()

        spec.loader.exec_module = exec_module
        return spec


def _hook_torch() -> None:
    import sys

    if "torch" in sys.modules:
        _register_torch_backend()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


_hook_torch()
