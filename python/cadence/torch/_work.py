"""Work handles for torch.distributed, and the thread that completes futures.

A `CadenceWork` stands for one torch-level operation: zero or more cadence
operations in flight (*pending*), then a *finish* step on the caller's side
(copying staged results back into the user's tensors). The operation is
*done* once both have run; it runs them at most once, on whichever thread
asks first: `wait()`, `is_completed()`, or the group's completer thread when
someone holds its future.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.futures import Future

from cadence._core import CommError


def backend_error(e: BaseException) -> dist.DistBackendError:
    """cadence's failure as the exception torch users catch, culprit kept."""
    err = dist.DistBackendError(str(e))  # names the communicator, op and culprit
    err.culprit = getattr(e, "culprit", None)
    return err


def _seconds(timeout) -> float | None:
    """torch passes timedelta(0) (kNoTimeout) for "no timeout"."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return s if s > 0 else None


class Completer:
    """Completes, in issue order, the works whose future someone holds (DDP's
    reducer and communication hooks chain `.then` on them and never call
    `wait()`). One daemon thread per group, started on first use; a future's
    callbacks run on it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(self, work: CadenceWork) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(work)

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            work._complete(None)

    def close(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None


def _wait_forwarded() -> bool:
    """Whether torch's C++ reaches a Python Work's wait() once Python holds
    the Work no more. torch 2.6 does not (2.15 does; measured): C++
    keeps only the C++ half of what a Python ProcessGroup returned, whose
    wait() then waits forever for a completion nobody signals (DDP's start,
    `_broadcast_coalesced`, the reducer's bucket order broadcast). The probe
    returns a Work through C++ and waits on it with 1 ms: a forwarding torch
    calls our wait(), the other times out."""

    class Probe(dist.Work):
        def wait(self, timeout=None) -> bool:
            return True

    class Group(dist.ProcessGroup):
        def broadcast(self, tensors, opts=None):
            return Probe()

    work = dist.ProcessGroup.broadcast(Group(0, 1), [torch.zeros(1)])
    try:
        return bool(work.wait(timedelta(milliseconds=1)))
    except RuntimeError:  # "Operation timed out!": the C++ half's own wait
        return False


WAIT_FORWARDED = _wait_forwarded()

# Where C++ does not forward, every CadenceWork stays alive here (so C++
# calls reach it) until a wait() that did not time out, or get_future():
# C++ callers make one of those calls, right after the operation returns.
# A Work that nobody waits for and whose future nobody takes stays until exit.
_alive: set = set()
_alive_lock = threading.Lock()


class CadenceWork(dist.Work):
    """The handle torch.distributed returns for an operation on a cadence group."""

    def __init__(self, name, outputs, pending=(), finish=None, completer=None, source_rank=-1):
        super().__init__()
        if not WAIT_FORWARDED:
            with _alive_lock:
                _alive.add(self)
        self._name = name
        self._outputs = list(outputs)
        self._pending = list(pending)
        self._finish = finish
        self._completer = completer
        self._peer = source_rank
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        # get_future(): a private trigger, set once done, and the user's
        # future, its continuation.
        self._trigger: Future | None = None
        self._future: Future | None = None

    @classmethod
    def completed(cls, name, outputs) -> CadenceWork:
        """The Work of an operation that already ran (synchronously)."""
        w = cls(name, outputs)
        w._done = True
        return w

    def _complete(self, timeout: float | None) -> None:
        """Waits for the pending operations, then finishes. Raises TimeoutError
        (and stays pending) if `timeout` seconds pass first; any other failure
        is kept in `_error`."""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError
        try:
            if self._done:
                return
            try:
                for w in self._pending:
                    w.wait(timeout)
                if self._finish is not None:
                    self._finish()
            except TimeoutError:
                raise
            except CommError as e:
                self._error = backend_error(e)
            except Exception as e:  # noqa: BLE001 - delivered through wait() and the future
                self._error = e
            self._done = True
            self._pending = []
            self._finish = None
            trigger = self._trigger
        finally:
            self._lock.release()
        if trigger is not None:
            trigger.set_result(None)

    def _deliver(self, _trigger: Future) -> list:
        if self._error is not None:
            raise self._error
        return self._outputs

    def _release(self) -> None:
        if not WAIT_FORWARDED:
            with _alive_lock:
                _alive.discard(self)

    def wait(self, timeout=None) -> bool:
        secs = _seconds(timeout)
        try:
            self._complete(secs)
        except TimeoutError:
            raise dist.DistBackendError(
                f"cadence: {self._name} did not finish within Work.wait's {secs:g} s "
                "(it is still running)"
            ) from None
        self._release()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if all(w.is_completed() for w in list(self._pending)):
            self._complete(None)  # only the copy-back is left
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        """The peer of a receive; for a receive from any source (given the
        cadence Work), the rank it matched, or -1 until then."""
        s = self._peer
        if isinstance(s, int):
            return s
        return -1 if s.source is None else s.source

    # torch.distributed.recv asks `work._source_rank()`, which pybind does
    # not forward to a Python override of `source_rank`.
    _source_rank = source_rank

    def synchronize(self) -> None:
        """CUDA tensors are staged through synchronous host copies: nothing to order."""

    def get_future(self) -> Future:
        """A future completed with the output tensors when the operation
        finishes (or with its error), whether or not anyone calls wait()."""
        with self._lock:
            if self._future is not None:
                return self._future
            # An error raised in the continuation marks the C++ future failed,
            # which DDP's reducer checks (Future.set_exception only stores the
            # exception as the value, which the reducer then reads as tensors).
            self._trigger = trigger = Future()
            self._future = trigger.then(self._deliver)
            done = self._done
        if done:
            trigger.set_result(None)
        elif self._completer is None or self._completer.on_thread():
            # Inside a future callback: queueing behind ourselves would deadlock.
            self._complete(None)
        else:
            self._completer.watch(self)
        return self._future


class DoneWork(dist.Work):
    """The Work of an operation that ran to completion before it was
    returned, for the synchronous fast path: nothing to wait for, no lock,
    no future until one is asked for."""

    def __init__(self, outputs: list) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return self._outputs

    def source_rank(self) -> int:
        return -1

    _source_rank = source_rank

    def synchronize(self) -> None:
        """Host memory only: nothing to order."""

    def get_future(self) -> Future:
        f = Future()
        f.set_result(self._outputs)
        return f


#: Whether an operation may run inline and return a `DoneWork`: torch says
#: when it waits itself (options' `asyncOp`, torch 2.7 on), and C++ holding
#: the Work reaches its Python wait() (`WAIT_FORWARDED`).
FAST_SYNC = WAIT_FORWARDED and hasattr(c10d.AllreduceOptions(), "asyncOp")
