"""Memory-bandwidth reference for the single-host benchmarks: how fast one
core, and every core at once, copy a buffer (numpy.copyto, median of 15).
An allreduce must at least read each rank's input and write its output, so
`bytes / copy rate with all ranks copying at once` is a lower bound on its time.

    .venv/bin/python benchmarks/membw.py --size 64M --procs 1 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np


def _copy_rate(nbytes: int, start, out) -> None:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start.wait()
    times = []
    for _ in range(15):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    out.put(nbytes / float(np.median(times)) / 1e9)


def copy_rate(nbytes: int, procs: int) -> list[float]:
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_copy_rate, args=(nbytes, start, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    rates = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="64M", help="bytes per copy (K/M/G suffixes)")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = a.size.upper()
    nbytes = int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)
    for p in a.procs:
        rates = copy_rate(nbytes, p)
        print(f"{p} process(es) copying {a.size} each: "
              f"{min(rates):.2f} GB/s per process (slowest), {sum(rates):.2f} GB/s together")


if __name__ == "__main__":
    main()
