"""The collectives of a cadence process group, in torch.distributed's terms.

torch hands a backend its arguments as (tensor lists, options); the methods
below translate them into calls on one `cadence.Communicator` and return a
`CadenceWork`. The same methods serve two shapes:

- `ProcessGroupCadence`, a `torch.distributed.ProcessGroup` subclass: what
  `init_process_group("cadence")` and `new_group()` return. torch calls its
  Python methods directly, so users get our Work objects back (with a working
  `is_completed()`).
- `BackendCadence`, a per-device backend inside torch's own ProcessGroup: used
  when cadence serves one device of several ("cpu:cadence,cuda:nccl") and for
  groups made by `split_group`. torch wraps its Work objects in a C++ holder
  that forwards `wait()` and `get_future()` but not `is_completed()`.

Ops run inline on the caller's thread when torch asks for a synchronous
operation (`_async(opts)` false: the common `dist.all_reduce(t)`) or for an
asynchronous collective of a small tensor (functional collectives), and on
cadence's progress thread otherwise. The commonest of them, an allreduce of
one contiguous CPU tensor, is read and run by the core itself
(`_core.TorchFast`, returning a finished `DoneWork`): at decode sizes the
general path's Python steps took longer than the collective.
"""

from __future__ import annotations

import functools
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from cadence import _communicator
from cadence._core import DTYPES, CommError, TorchFast
from cadence.torch._tensors import (
    BITWISE,
    NATIVE,
    Reduction,
    concat,
    core,
    elements,
    flat_buffer,
    stage,
    unpack,
)
from cadence.torch._work import FAST_SYNC, CadenceWork, Completer, DoneWork, backend_error

_R = dist.ReduceOp.RedOpType
BACKEND = "cadence"
#: The reductions the synchronous fast path hands to the core as they are.
_FAST_OPS = {_R.SUM: "sum", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max"}


class _StoreForInit:
    """The group's store as `cadence.init` uses it (set, get), plus the host
    of the TCPStore underneath the prefixes, so that without MASTER_ADDR ranks
    still advertise the address that reaches the store, not 127.0.0.1."""

    def __init__(self, store) -> None:
        self._store = store
        inner = store
        while isinstance(inner, dist.PrefixStore):
            inner = inner.underlying_store
        self.host = getattr(inner, "host", None)

    def set(self, key, value) -> None:
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def __getattr__(self, name):
        # The rest of the Store API (add, check, compare_set, ...), for the
        # live diagnosis watchdog.
        return getattr(self._store, name)


class _Group:
    """What a torch group and its backend objects share: the communicator,
    the store it was built from, the completer thread and the timeout."""

    def __init__(self, store, rank: int, size: int, timeout_s: float, name: str) -> None:
        self.comm = _communicator.init(store=_StoreForInit(store), rank=rank, world_size=size,
                                       timeout=timeout_s, name=f"torch/{name}")
        self.store = store
        self.timeout_s = timeout_s
        self.completer = Completer(f"cadence-{self.comm.id}")
        self.nbarriers = 0
        self.splits: dict[str, BackendCadence] = {}
        self.closed = False
        self.fast = _fast_path(self.comm) if FAST_SYNC else None

    def work(self, name, outputs, async_op, pending, finish=None, source_rank=-1):
        """The Work for an operation whose cadence parts were started with
        `async_op` (else they already ran: finish now)."""
        if async_op:
            return CadenceWork(name, outputs, pending, finish, self.completer, source_rank)
        if finish is not None:
            finish()
        return CadenceWork.completed(name, outputs)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.completer.close()
            self.comm.close()


def _fast_path(comm: _communicator.Communicator) -> TorchFast:
    """The core's synchronous path for `comm`'s plain calls."""
    dtypes = {getattr(torch, name): code for code, name in enumerate(DTYPES)
              if getattr(torch, name, None) in NATIVE}
    ops = [(int(k), name) for k, name in _FAST_OPS.items()]
    return TorchFast(comm._c, DoneWork, c10d.AllreduceOptions, dtypes, ops)


def _translated(fn):
    """cadence.CommError → torch.distributed.DistBackendError (a RuntimeError)."""

    @functools.wraps(fn)
    def op(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except CommError as e:
            raise backend_error(e) from e

    return op


def _options(opts, cls):
    """torch's options object; older callers pass a bare ReduceOp instead."""
    if opts is None:
        return cls()
    if isinstance(opts, (dist.ReduceOp, _R)):
        o = cls()
        o.reduceOp = opts
        return o
    return opts


def _async(opts, *tensors: torch.Tensor) -> bool:
    """Whether to run the operation on the progress thread. Options carry
    `asyncOp` from torch 2.7 on; before, torch always waits (so: run async).
    A collective asked for asynchronously (functional collectives, DTensor,
    `torch.compile`) whose `tensors` are small runs now all the same, where
    a finished Work reaches torch (`FAST_SYNC`): the hand-off to the
    progress thread and back costs more than the collective
    (`TorchFast.INLINE_ASYNC_BYTES`); order is kept, since a call run now
    queues behind asynchronous ones still in flight."""
    a = getattr(opts, "asyncOp", True)
    if a and tensors and FAST_SYNC:
        return max(t.numel() * t.element_size() for t in tensors) > TorchFast.INLINE_ASYNC_BYTES
    return a


def _one(tensors, what: str) -> torch.Tensor:
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(
            f"cadence: {what} takes one tensor per process, got a list of {len(tensors)}"
        )
    return tensors[0]


def _same_dtype(tensors, dtype, what: str) -> None:
    for t in tensors:
        if t.dtype != dtype:
            raise ValueError(f"cadence: {what}: tensors are {t.dtype} and {dtype}")


def _check_bitwise(dtype, red) -> None:
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"cadence: ReduceOp.{red.name} needs integer or bool tensors, got {dtype}")


_FOLD = {_R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return stage(t, reduce=False).buf.reshape(-1).view(torch.uint8)


class _Collectives:
    """torch.distributed's backend interface over `self._g` (a `_Group`)."""

    _g: _Group

    # -- identity ----------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - the name torch's trampoline looks up
        return BACKEND

    @property
    def communicator(self) -> _communicator.Communicator:
        """The cadence communicator under this group (flight recorder, hosts)."""
        return self._g.comm

    # -- reductions --------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # The common call (one contiguous CPU tensor, run now) goes straight
        # to the core (`_core.TorchFast`); None: it is not that call.
        fast = self._g.fast
        if fast is not None and opts is not None:
            try:
                work = fast.allreduce(tensors, opts)
            except CommError as e:
                raise backend_error(e) from e
            if work is not None:
                return work
        return self._allreduce(tensors, opts)

    @_translated
    def _allreduce(self, tensors, opts=None):
        opts = _options(opts, c10d.AllreduceOptions)
        t = _one(tensors, "allreduce")
        red = Reduction(opts.reduceOp)
        a = _async(opts, t)
        if red.kind in BITWISE:
            return self._bitwise("allreduce", [t], [t], red, a,
                                 lambda folded: unpack(folded, [t], [folded.numel()]))
        s = stage(t, reduce=True)
        w = self._g.comm.allreduce(core(s.buf), op=red.for_dtype(t.dtype), factor=red.factor,
                                   async_op=a)
        return self._g.work("allreduce", [t], a, [w], s.restore if s.copied else None)

    @_translated
    def allreduce_coalesced(self, tensors, opts=None):
        """One allreduce per element type over the tensors laid end to end."""
        opts = _options(opts, c10d.AllreduceCoalescedOptions)
        red = Reduction(opts.reduceOp)
        a = _async(opts)
        tensors = list(tensors)
        if red.kind in BITWISE:
            nbytes = [t.numel() * t.element_size() for t in tensors]
            return self._bitwise("allreduce_coalesced", tensors, tensors, red, a,
                                 lambda folded: unpack(folded, tensors, nbytes))
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        pending, unpacks = [], []
        for dtype, group in by_dtype.items():
            flat = concat(group, reduce=True)
            pending.append(self._g.comm.allreduce(core(flat), op=red.for_dtype(dtype),
                                                  factor=red.factor, async_op=a))
            counts = [elements(t, reduce=True) for t in group]
            unpacks.append(functools.partial(unpack, flat, group, counts))

        def finish():
            for u in unpacks:
                u()

        return self._g.work("allreduce_coalesced", tensors, a, pending, finish)

    @_translated
    def reduce(self, tensors, opts=None):
        opts = _options(opts, c10d.ReduceOptions)
        t = _one(tensors, "reduce")
        red = Reduction(opts.reduceOp)
        root, a = opts.rootRank, _async(opts)
        at_root = self._g.comm.rank == root
        if red.kind in BITWISE:
            def write(folded):
                if at_root:
                    unpack(folded, [t], [folded.numel()])
            return self._bitwise("reduce", [t], [t], red, a, write)
        s = stage(t, reduce=True)
        w = self._g.comm.reduce(core(s.buf), root, op=red.for_dtype(t.dtype), factor=red.factor,
                                async_op=a)
        return self._g.work("reduce", [t], a, [w], s.restore if s.copied and at_root else None)

    @_translated
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Block r of the reduction (rank r's `input_tensors[0][r]` summed
        over ranks) lands in rank r's output; blocks may differ in size."""
        opts = _options(opts, c10d.ReduceScatterOptions)
        out = _one(output_tensors, "reduce_scatter")
        ins = list(_one(input_tensors, "reduce_scatter"))
        red = Reduction(opts.reduceOp)
        a = _async(opts)
        comm = self._g.comm
        if len(ins) != comm.size:
            raise ValueError(f"cadence: reduce_scatter needs {comm.size} input tensors, "
                             f"got {len(ins)}")
        _same_dtype(ins, out.dtype, "reduce_scatter")
        if ins[comm.rank].numel() != out.numel():
            raise ValueError(f"cadence: reduce_scatter: output has {out.numel()} elements, "
                             f"input block {comm.rank} has {ins[comm.rank].numel()}")
        if red.kind in BITWISE:
            nbytes = [t.numel() * t.element_size() for t in ins]
            lo, n = sum(nbytes[:comm.rank]), nbytes[comm.rank]
            return self._bitwise("reduce_scatter", [out], ins, red, a,
                                 lambda folded: unpack(folded[lo:lo + n], [out], [n]))
        counts = [elements(t, reduce=True) for t in ins]
        flat = concat(ins, reduce=True)
        so = stage(out, reduce=True, read=False)
        w = comm.reduce_scatterv(core(flat), counts, out=core(so.buf.reshape(-1)),
                                 op=red.for_dtype(out.dtype), factor=red.factor, async_op=a)
        return self._g.work("reduce_scatter", [out], a, [w], so.restore if so.copied else None)

    def _reduce_scatter_one(self, output, input, red, a) -> list:
        comm = self._g.comm
        if input.numel() != comm.size * output.numel():
            raise ValueError(
                f"cadence: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"expected world size {comm.size} × output's {output.numel()}"
            )
        if input.dtype != output.dtype:
            raise ValueError(f"cadence: reduce_scatter_tensor: input is {input.dtype}, "
                             f"output {output.dtype}")
        if red.kind in BITWISE:
            _check_bitwise(output.dtype, red)
            n = output.numel() * output.element_size()
            lo = comm.rank * n
            return self._bitwise_parts([input], red, a, lambda folded: unpack(
                folded[lo:lo + n], [output], [n]))
        si = stage(input, reduce=True)
        so = stage(output, reduce=True, read=False)
        w = comm.reduce_scatter(core(si.buf.reshape(-1)), out=core(so.buf.reshape(-1)),
                                op=red.for_dtype(output.dtype), factor=red.factor, async_op=a)
        return [(w, so.restore if so.copied else None)]

    @_translated
    def reduce_scatter_single(self, output, input, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        red, a = Reduction(opts.reduceOp), _async(opts, input)
        return self._combine("reduce_scatter_tensor", [output], a,
                             self._reduce_scatter_one(output, input, red, a))

    _reduce_scatter_base = reduce_scatter_single

    @_translated
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        red, a = Reduction(opts.reduceOp), _async(opts)
        parts = []
        for o, i in zip(outputs, inputs, strict=True):
            parts += self._reduce_scatter_one(o, i, red, a)
        return self._combine("reduce_scatter_tensor_coalesced", list(outputs), a, parts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ReduceOp.BAND/BOR/BXOR: the core has no bitwise reductions, so every
    # rank's bytes are gathered and folded locally (size × the data moved;
    # these ops carry flags and masks, not gradients).
    def _bitwise_parts(self, tensors, red, a, write) -> list:
        """[(work, finish)] that gathers `tensors` (as bytes, end to end) from
        every rank, folds them with the bitwise op and hands them to `write`."""
        src = torch.cat([_bytes(t) for t in tensors])
        gathered = self._g.comm.allgather(src, async_op=a)

        def fold(g):
            write(functools.reduce(_FOLD[red.kind], g.unbind(0)))

        if a:
            return [(gathered, lambda: fold(gathered.wait()))]
        return [(None, functools.partial(fold, gathered))]

    def _bitwise(self, name, outputs, tensors, red, a, write):
        for t in tensors:
            _check_bitwise(t.dtype, red)
        return self._combine(name, outputs, a, self._bitwise_parts(tensors, red, a, write))

    def _combine(self, name, outputs, a, parts):
        """One Work for several (cadence work or None, finish or None) parts."""
        pending = [w for w, _ in parts if w is not None]
        finishes = [f for _, f in parts if f is not None]
        if len(finishes) > 1:
            def finish():
                for f in finishes:
                    f()
        else:
            finish = finishes[0] if finishes else None
        return self._g.work(name, outputs, a, pending, finish)

    # -- moves -------------------------------------------------------------

    @_translated
    def broadcast(self, tensors, opts=None):
        opts = _options(opts, c10d.BroadcastOptions)
        t = _one(tensors, "broadcast")
        root, a = opts.rootRank, _async(opts, t)
        at_root = self._g.comm.rank == root
        s = stage(t, reduce=False, read=at_root)
        w = self._g.comm.broadcast(core(s.buf), root, async_op=a)
        return self._g.work("broadcast", [t], a, [w],
                            s.restore if s.copied and not at_root else None)

    @_translated
    def allgather(self, output_tensors, input_tensors, opts=None):
        """Rank r's input lands in everyone's `output_tensors[0][r]`; sizes
        may differ per rank (each rank knows them from its output list)."""
        opts = _options(opts, c10d.AllgatherOptions)
        outs = list(_one(output_tensors, "allgather"))
        inp = _one(input_tensors, "allgather")
        comm = self._g.comm
        if len(outs) != comm.size:
            raise ValueError(f"cadence: allgather needs {comm.size} output tensors, "
                             f"got {len(outs)}")
        _same_dtype(outs, inp.dtype, "allgather")
        if outs[comm.rank].numel() != inp.numel():
            raise ValueError(f"cadence: allgather: input has {inp.numel()} elements, output "
                             f"{comm.rank} has {outs[comm.rank].numel()}")
        counts = [elements(o, reduce=False) for o in outs]
        flat = flat_buffer(inp, sum(o.numel() for o in outs), reduce=False)
        src = stage(inp, reduce=False).buf.reshape(-1)
        w = comm.allgatherv(core(src), counts, out=core(flat), async_op=_async(opts))
        return self._g.work("allgather", outs, _async(opts), [w],
                            functools.partial(unpack, flat, outs, counts))

    @_translated
    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """output_lists[r][j] ← rank r's input_tensors[j], as one allgather of
        bytes (the tensors may differ in type)."""
        opts = _options(opts, c10d.AllgatherOptions)
        comm = self._g.comm
        ins = list(input_tensors)
        if len(output_lists) != comm.size:
            raise ValueError(f"cadence: allgather_coalesced needs {comm.size} output lists")
        flat = torch.cat([_bytes(t) for t in ins])
        out = torch.empty((comm.size, flat.numel()), dtype=torch.uint8)
        w = comm.allgather(core(flat), out=core(out), async_op=_async(opts))
        nbytes = [t.numel() * t.element_size() for t in ins]

        def finish():
            for r in range(comm.size):
                unpack(out[r], list(output_lists[r]), nbytes)

        outputs = [t for lst in output_lists for t in lst]
        return self._g.work("allgather_coalesced", outputs, _async(opts), [w], finish)

    def _allgather_one(self, output, input, a):
        comm = self._g.comm
        if output.numel() != comm.size * input.numel():
            raise ValueError(
                f"cadence: all_gather_into_tensor: output has {output.numel()} elements, "
                f"expected world size {comm.size} × input's {input.numel()}"
            )
        if input.dtype != output.dtype:
            raise ValueError(f"cadence: all_gather_into_tensor: input is {input.dtype}, "
                             f"output {output.dtype}")
        si = stage(input, reduce=False)
        so = stage(output, reduce=False, read=False)
        w = comm.allgather(core(si.buf.reshape(-1)), out=core(so.buf.reshape(-1)), async_op=a)
        return w, (so.restore if so.copied else None)

    @_translated
    def all_gather_single(self, output, input, opts=None):
        opts = _options(opts, c10d.AllgatherOptions)
        a = _async(opts, output)
        w, finish = self._allgather_one(output, input, a)
        return self._g.work("all_gather_into_tensor", [output], a, [w], finish)

    _allgather_base = all_gather_single

    @_translated
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = _options(opts, c10d.AllgatherOptions)
        a = _async(opts)
        parts = [self._allgather_one(o, i, a) for o, i in zip(outputs, inputs, strict=True)]
        return self._combine("all_gather_into_tensor_coalesced", list(outputs), a, parts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_translated
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """input_tensors[d] goes to rank d, output_tensors[s] comes from rank
        s; sizes may differ (they are exchanged first)."""
        opts = _options(opts, c10d.AllToAllOptions)
        comm = self._g.comm
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != comm.size or len(ins) != comm.size:
            raise ValueError(f"cadence: alltoall needs {comm.size} input and output tensors")
        _same_dtype(outs + ins, ins[0].dtype, "alltoall")
        send = [elements(t, reduce=False) for t in ins]
        recv = [elements(t, reduce=False) for t in outs]
        flat_in = concat(ins, reduce=False)
        flat_out = flat_buffer(ins[0], sum(t.numel() for t in outs), reduce=False)
        w = comm.alltoallv(core(flat_in), send, recv, out=core(flat_out), async_op=_async(opts))
        return self._g.work("alltoall", outs, _async(opts), [w],
                            functools.partial(unpack, flat_out, outs, recv))

    @_translated
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        """Split sizes count rows (dim 0). Without split sizes every rank must
        pass none (equal blocks, one all-to-all); with them the ranks exchange
        their counts first, so a disagreement is reported, not corrupted."""
        opts = _options(opts, c10d.AllToAllOptions)
        comm, a = self._g.comm, _async(opts, input, output)
        if input.dtype != output.dtype:
            raise ValueError(f"cadence: all_to_all_single: input is {input.dtype}, "
                             f"output {output.dtype}")
        si = stage(input, reduce=False)
        so = stage(output, reduce=False, read=False)
        in_elems = elements(input, reduce=False)
        out_elems = elements(output, reduce=False)
        if not output_split_sizes and not input_split_sizes:
            if in_elems != out_elems or in_elems % comm.size:
                raise ValueError(
                    f"cadence: all_to_all_single without split sizes needs input and output "
                    f"of equal size divisible by {comm.size}"
                )
            w = comm.alltoall(core(si.buf.reshape(-1)), out=core(so.buf.reshape(-1)), async_op=a)
        else:
            send = _split_counts(input, input_split_sizes, in_elems, comm.size, "input")
            recv = _split_counts(output, output_split_sizes, out_elems, comm.size, "output")
            w = comm.alltoallv(core(si.buf.reshape(-1)), send, recv, out=core(so.buf.reshape(-1)),
                               async_op=a)
        return self._g.work("all_to_all_single", [output], a, [w],
                            so.restore if so.copied else None)

    alltoall_base = all_to_all_single

    @_translated
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = _options(opts, c10d.GatherOptions)
        comm, a, root = self._g.comm, _async(opts), opts.rootRank
        inp = _one(input_tensors, "gather")
        src = core(stage(inp, reduce=False).buf.reshape(-1))
        if comm.rank != root:
            w = comm.gather(src, root, async_op=a)
            return self._g.work("gather", [], a, [w])
        outs = list(_one(output_tensors, "gather"))
        if len(outs) != comm.size:
            raise ValueError(f"cadence: gather needs {comm.size} output tensors at the root")
        _same_dtype(outs, inp.dtype, "gather")
        for o in outs:
            if o.numel() != inp.numel():
                raise ValueError(f"cadence: gather: output of {o.numel()} elements for an "
                                 f"input of {inp.numel()}")
        flat = flat_buffer(inp, comm.size * inp.numel(), reduce=False)
        w = comm.gather(src, root, out=core(flat), async_op=a)
        counts = [elements(inp, reduce=False)] * comm.size
        return self._g.work("gather", outs, a, [w], functools.partial(unpack, flat, outs, counts))

    @_translated
    def gather_single(self, output, input, opts=None):
        opts = _options(opts, c10d.GatherOptions)
        comm, a, root = self._g.comm, _async(opts), opts.rootRank
        src = core(stage(input, reduce=False).buf.reshape(-1))
        if comm.rank != root:
            return self._g.work("gather_single", [], a, [comm.gather(src, root, async_op=a)])
        if output.numel() != comm.size * input.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"cadence: gather_single: output must hold {comm.size} × {input.numel()} "
                f"elements of {input.dtype}"
            )
        so = stage(output, reduce=False, read=False)
        w = comm.gather(src, root, out=core(so.buf.reshape(-1)), async_op=a)
        return self._g.work("gather_single", [output], a, [w], so.restore if so.copied else None)

    @_translated
    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = _options(opts, c10d.ScatterOptions)
        comm, a, root = self._g.comm, _async(opts), opts.rootRank
        out = _one(output_tensors, "scatter")
        src = None
        if comm.rank == root:
            ins = list(_one(input_tensors, "scatter"))
            if len(ins) != comm.size:
                raise ValueError(f"cadence: scatter needs {comm.size} input tensors at the root")
            _same_dtype(ins, out.dtype, "scatter")
            for t in ins:
                if t.numel() != out.numel():
                    raise ValueError(f"cadence: scatter: input of {t.numel()} elements for an "
                                     f"output of {out.numel()}")
            src = core(concat(ins, reduce=False))
        so = stage(out, reduce=False, read=False)
        w = comm.scatter(src, core(so.buf.reshape(-1)), root, async_op=a)
        return self._g.work("scatter", [out], a, [w], so.restore if so.copied else None)

    # -- point to point ----------------------------------------------------
    # Tags are not matched: cadence delivers a pair's messages in the order
    # they were sent, which is what tag 0 (torch's default) means anyway.

    @_translated
    def send(self, tensors, dst_rank, tag=0):
        t = _one(tensors, "send")
        s = stage(t, reduce=False)
        w = self._g.comm.send(core(s.buf.reshape(-1)), dst_rank, async_op=True)
        return self._g.work("send", [t], True, [w])

    @_translated
    def recv(self, tensors, src_rank, tag=0):
        t = _one(tensors, "recv")
        s = stage(t, reduce=False, read=False)
        w = self._g.comm.recv(core(s.buf.reshape(-1)), src_rank, async_op=True)
        return self._g.work("recv", [t], True, [w], s.restore if s.copied else None,
                            source_rank=src_rank)

    @_translated
    def recv_anysource(self, tensors, tag=0):
        # The first rank whose next message to this one is a send of this
        # size; the Work's source_rank() names it once matched.
        t = _one(tensors, "recv")
        s = stage(t, reduce=False, read=False)
        w = self._g.comm.recv(core(s.buf.reshape(-1)), None, async_op=True)
        return self._g.work("recv", [t], True, [w], s.restore if s.copied else None,
                            source_rank=w)

    # -- synchronization ---------------------------------------------------

    @_translated
    def barrier(self, opts=None):
        opts = _options(opts, c10d.BarrierOptions)
        w = self._g.comm.barrier(async_op=_async(opts))
        return self._g.work("barrier", [], _async(opts), [w])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier that names the ranks that did not arrive in time. It goes
        through the store, not the communicator, so it works (and reports)
        even when a collective is stuck. Rank 0 waits for everyone's arrival
        key; the others wait for rank 0's release key."""
        if isinstance(timeout, c10d.BarrierOptions):  # the C++ Backend calling convention
            timeout = timeout.timeout
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not secs or secs <= 0:
            secs = self._g.timeout_s
        g = self._g
        g.nbarriers += 1
        key = f"cadence/monitored_barrier/{g.nbarriers}"
        rank, size = g.comm.rank, g.comm.size
        ms = int(secs * 1000)
        if rank != 0:
            g.store.set(f"{key}/arrived/{rank}", b"1")
            try:
                g.store.wait([f"{key}/released"], timedelta(seconds=secs))
            except RuntimeError:
                raise dist.DistBackendError(
                    f"[Rank {rank}]: cadence: rank 0 did not release monitoredBarrier in "
                    f"{ms} ms (another rank failed to arrive, or rank 0 did)"
                ) from None
            return
        deadline = time.monotonic() + secs
        missing = []
        for r in range(1, size):
            arrived = f"{key}/arrived/{r}"
            left = deadline - time.monotonic()
            try:
                if left <= 0 or missing:
                    if not g.store.check([arrived]):
                        raise RuntimeError("missing")
                else:
                    g.store.wait([arrived], timedelta(seconds=left))
            except RuntimeError:
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing:
            who = (f"Rank {missing[0]}" if len(missing) == 1
                   else "Ranks " + ", ".join(map(str, missing)))
            raise dist.DistBackendError(
                f"[Rank 0]: {who} failed to pass monitoredBarrier in {ms} ms"
            )
        g.store.set(f"{key}/released", b"1")

    # -- lifetime ----------------------------------------------------------

    def set_timeout(self, timeout):
        raise RuntimeError(
            "cadence: a group's timeout is fixed when it is created (pass timeout= to "
            "init_process_group or new_group)"
        )

    def shutdown(self):
        """Finishes queued operations and closes the communicator."""
        self._g.close()

    def abort(self):
        # The core cannot cancel operations in flight; each ends at its
        # deadline. Stop completing futures and let the process exit.
        self._g.completer.close()


def _split_counts(t, splits, elems, size, what) -> list[int]:
    if not splits:
        if elems % size:
            raise ValueError(f"cadence: all_to_all_single: {what} does not split into {size}")
        return [elems // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size:
        raise ValueError(f"cadence: all_to_all_single: {len(splits)} {what} split sizes "
                         f"for {size} ranks")
    rows = t.shape[0] if t.dim() else 1
    if sum(splits) != rows:
        raise ValueError(f"cadence: all_to_all_single: {what} split sizes sum to "
                         f"{sum(splits)}, dim 0 is {rows}")
    per_row = elems // rows if rows else 0
    return [s * per_row for s in splits]


def _probe_constructible(cls, *args) -> bool:
    try:
        cls(*args)
    except TypeError:  # pybind11: "No constructor defined", "not an alias instance"
        return False
    return True


class _BackendProbe(c10d.Backend):
    """An empty Python subclass: whether torch lets one be constructed."""


class _GroupProbe(dist.ProcessGroup):
    """An empty Python subclass: which constructors torch allows it."""


# What this torch allows a third-party backend written in Python (measured
# on every release from 2.6 to 2.15; README.md, "torch versions"):
# - a Python subclass of c10d.Backend is constructible from 2.14 on
#   ("No constructor defined" before): needed for a backend that serves one
#   device of a group ("cpu:cadence,cuda:nccl") and for split_group;
# - a Python subclass of ProcessGroup is constructible with (rank, size) on
#   every release (torch's own "threaded" test backend does that), with
#   (store, rank, size) on 2.6 and from 2.14 on (2.7-2.13: "returned
#   holder-wrapped instance is not an alias instance");
# - the creator gets the group being built (`opts.process_group`) from 2.14 on.
PY_BACKEND = _probe_constructible(_BackendProbe, 0, 1)
PG_TAKES_STORE = _probe_constructible(_GroupProbe, dist.HashStore(), 0, 1)


class BackendCadence(_Collectives, c10d.Backend):
    """cadence as one device's backend inside a torch ProcessGroup."""

    def __init__(self, group: _Group) -> None:
        super().__init__(group.comm.rank, group.comm.size)
        self._g = group

    # torch's trampoline evaluates these capability properties through Python
    # and recurses forever on the inherited C++ ones, so each is defined here.
    supports_splitting = property(lambda self: True)
    supports_coalescing = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)

    @property
    def options(self) -> c10d.Backend.Options:
        """What torch copies into a split's options (name and timeout)."""
        return c10d.Backend.Options(BACKEND, timedelta(seconds=self._g.timeout_s))

    def perform_nocolor_split(self, device) -> None:
        """torch asks non-members of a new group to take part in splitting
        the parent when the world is bound to a device; cadence builds
        sub-groups by a members-only rendezvous, so there is nothing to do."""

    def split(self, store, ranks, opts):
        """A backend over `ranks` (ranks of this group), made by a fresh
        rendezvous on `store`; None on ranks outside it. torch asks once per
        device the group serves: they share one communicator."""
        ranks = [int(r) for r in ranks]
        me = self._g.comm.rank
        if me not in ranks:
            return None
        name = getattr(opts, "group_name", "") or ",".join(map(str, ranks))
        backend = self._g.splits.get(name)
        if backend is None:
            timeout = getattr(opts, "timeout", None)
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else 0
            group = _Group(store, ranks.index(me), len(ranks), secs or self._g.timeout_s,
                           f"split/{name}")
            backend = self._g.splits[name] = BackendCadence(group)
        return backend


class ProcessGroupCadence(_Collectives, dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on cadence.

    Where torch can construct a Python `c10d.Backend` (`PY_BACKEND`), it
    also registers a `BackendCadence` (same communicator) for cpu and cuda,
    which torch consults for device checks (monitored_barrier,
    batch_isend_irecv) and to split the group. Elsewhere `_get_backend`
    answers those checks itself (`_DeviceFacts`)."""

    def __init__(self, store, group: _Group) -> None:
        if PG_TAKES_STORE:
            super().__init__(store, group.comm.rank, group.comm.size)
        else:
            super().__init__(group.comm.rank, group.comm.size)
        self._g = group
        self._backend = BackendCadence(group) if PY_BACKEND else None
        if self._backend is not None:
            for device in ("cpu", "cuda"):
                self._register_backend(torch.device(device),
                                       dist.ProcessGroup.BackendType.CUSTOM, self._backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    if not PY_BACKEND:
        # torch's C++ ProcessGroup keeps its name and description in its
        # device backends ("ProcessGroup name not set" without one); torch
        # sets and reads them from Python, so the group keeps them itself.
        def _set_group_name(self, name: str) -> None:
            self._cadence_name = name

        def _set_group_desc(self, desc: str) -> None:
            self._cadence_desc = desc

        @property
        def group_name(self) -> str:
            return getattr(self, "_cadence_name", "")

        @property
        def group_desc(self) -> str:
            return getattr(self, "_cadence_desc", "")

        def _get_backend(self, device):
            """torch's Python code asks a group for its device backend
            (device_id binding, FSDP2's allocator, splitting); with no C++
            Backend to register, the group answers for itself."""
            return _DeviceFacts(self)

    def __repr__(self) -> str:
        c = self._g.comm
        return f"<ProcessGroupCadence {c.id} rank {c.rank}/{c.size}>"


class _DeviceFacts:
    """What torch asks of a device's backend, for a `ProcessGroupCadence` on
    a torch that cannot hold a Python `c10d.Backend`: no splitting, no
    coalescing manager, no custom allocation, no time estimates."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    _supports_time_estimate = False

    def __init__(self, pg: ProcessGroupCadence) -> None:
        self._pg = pg

    def name(self) -> str:
        return BACKEND

    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def eager_connect_single_device(self, device) -> None:
        """cadence connects when the group is created."""

    def perform_nocolor_split(self, device) -> None:
        """Sub-groups are built by a members-only rendezvous: nothing to do."""

    def _set_default_timeout(self, timeout) -> None:
        self._pg.set_timeout(timeout)


def _caller_device_backends() -> dict | None:
    """The {device: backend name} map of the group torch is creating, read
    from torch's `_new_process_group_helper` frame: torch before 2.14 does
    not pass the group (`opts.process_group`) to the creator, and nothing
    else tells "cadence" alone from "cpu:cadence,cuda:nccl". None if the
    frame is not where it was in those (frozen) releases."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        config = frame.f_locals.get("backend_config")
        if config is not None and hasattr(config, "get_device_backend_map"):
            return dict(config.get_device_backend_map())
        frame = frame.f_back
    return None


def _alone(opts) -> bool:
    """Whether cadence is the group's only backend (plain "cadence")."""
    pg = getattr(opts, "process_group", None)
    if pg is not None:
        # torch gave the group the CUSTOM default type and no other device
        # has a backend yet.
        return not list(pg._device_types) and pg.name() == "custom"
    backends = _caller_device_backends()
    return backends is None or set(backends.values()) == {BACKEND}


def create_backend(opts, backend_options):
    """torch's creator hook (`extended_api=True`): called on every member of
    a new group with its store, rank, size, timeout and name. Returns a
    `ProcessGroupCadence` when cadence is the group's only backend (and on
    every torch that cannot construct a Python `c10d.Backend`), else a
    `BackendCadence` for torch's own ProcessGroup."""
    alone = _alone(opts)
    if not alone and not PY_BACKEND:
        raise RuntimeError(
            f"cadence: torch {torch.__version__} cannot give cadence one device of a group "
            "(\"cpu:cadence,cuda:...\"): a Python c10d.Backend has no constructor before "
            "torch 2.14. Use init_process_group(\"cadence\"): cadence then serves every "
            "device (CUDA tensors staged through host memory)."
        )
    group = _Group(opts.store, opts.group_rank, opts.group_size,
                   opts.timeout.total_seconds(), opts.group_id)
    if alone or not PY_BACKEND:
        return ProcessGroupCadence(opts.store, group)
    return BackendCadence(group)
