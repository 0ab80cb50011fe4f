"""How the size of each `process_vm_readv` call changes the rate of a
single-copy read between two processes (`transport/shm/single_copy.rs`'s
CMA_DIRECT_CHUNK): a child process fills a buffer, the parent reads all of
it in chunks of each size, and memcpy within one process gives the scale.

    python benchmarks/cma_chunks.py [--mib 16] [--reps 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import numpy as np


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=16, help="bytes to read, MiB")
    ap.add_argument("--reps", type=int, default=7, help="reads per chunk size (median)")
    args = ap.parse_args()
    size = args.mib << 20
    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender: its own pages (not shared with the parent by fork)
        src = np.ones(size, np.uint8)
        os.close(r)
        os.write(w, str(src.ctypes.data).encode())
        time.sleep(600)
        os._exit(0)
    os.close(w)
    addr = int(os.read(r, 64))
    dst = np.zeros(size, np.uint8)
    other = np.ones(size, np.uint8)

    def read(chunk: int) -> None:
        off = 0
        while off < size:
            n = min(chunk, size - off)
            local, remote = IoVec(dst.ctypes.data + off, n), IoVec(addr + off, n)
            got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got != n:
                raise OSError(ctypes.get_errno(), f"process_vm_readv read {got} of {n} bytes")
            off += n

    chunks = [256 << 10, 1 << 20, 4 << 20, size]
    times: dict[int, list[float]] = {c: [] for c in chunks}
    copies = []
    try:
        for _ in range(args.reps):  # the sizes in turn, so drift hits all alike
            for c in chunks:
                t0 = time.perf_counter()
                read(c)
                times[c].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            np.copyto(dst, other)
            copies.append(time.perf_counter() - t0)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print(f"{args.mib} MiB from another process, median of {args.reps}:")
    for c, v in times.items():
        t = statistics.median(v)
        print(f"  {c >> 10:>6} KiB a call: {t * 1e6:8.0f} us  {size / t / 1e9:5.2f} GB/s")
    t = statistics.median(copies)
    print(f"  memcpy in one process: {t * 1e6:8.0f} us  {size / t / 1e9:5.2f} GB/s")


if __name__ == "__main__":
    main()
