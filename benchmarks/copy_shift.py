"""Copies between buffers shifted within a cache line: the platform, then cadence.

Part 1 (this process, one core): how fast glibc's `memcpy` and the kernel's
`process_vm_readv` (the single-copy path) copy when the destination sits
0-63 bytes past the source modulo a 64-byte line. On AMD Zen, `rep movsb`
(glibc's choice from about 2 KiB up to the L2 size) is many times slower at
shifts 1-31 (docs/benchmarks.md, "Copies shifted within a cache line").

Part 2: 2 ranks on this host, cadence against Open MPI, each a job per
round (cadence through torchrun, Open MPI through mpirun, in turns): calls
back to back on the same buffers (as a training loop makes them, the
buffers hot in cache), for each placement of the buffers: `page` (both at
a page boundary), `page+16` (16 bytes past one, where numpy puts large
arrays), `numpy` (np.empty's own placement: the input and output at
whatever offsets the allocator chose). µs a call, the median of 5 runs.

    python benchmarks/copy_shift.py --rounds 3
    python benchmarks/copy_shift.py --only platform
    PYTHONPATH=/path/to/other/build python benchmarks/copy_shift.py --only ranks --no-mpi
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from cadence.units import format_size, parse_size

JOB = r"""
import statistics, sys, time, numpy as np
lib, ops, sizes, placement = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
sizes = [int(s) for s in sizes.split(",")]
if lib == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    barrier = comm.Barrier
    calls = {"allgather": lambda i, o: comm.Allgather(i[: len(i) // n], o),
             "alltoall": lambda i, o: comm.Alltoall(i, o),
             "broadcast": lambda i, o: comm.Bcast(i, root=0),
             "allreduce": lambda i, o: comm.Allreduce(MPI.IN_PLACE, i, op=MPI.SUM)}
else:
    import cadence
    comm = cadence.init()
    rank, n = comm.rank, comm.size
    barrier = comm.barrier
    calls = {"allgather": lambda i, o: comm.allgather(i[: len(i) // n], out=o),
             "alltoall": lambda i, o: comm.alltoall(i, out=o),
             "broadcast": lambda i, o: comm.broadcast(i, root=0),
             "allreduce": lambda i, o: comm.allreduce(i)}
def buf(nbytes):
    if placement == "numpy":
        return np.ones(nbytes // 4, np.float32)
    raw = np.ones(nbytes + 8192, np.uint8)
    k = -raw.ctypes.data % 4096 + (16 if placement == "page+16" else 0)
    return raw[k:k + nbytes].view(np.float32)
out = []
for op in ops:
    for nbytes in sizes:
        i, o = buf(nbytes), buf(nbytes)
        reps = max(20, min(2000, (32 << 20) // nbytes))
        for _ in range(reps):
            calls[op](i, o)
        runs = []
        for _ in range(5):
            barrier()
            t = time.perf_counter()
            for _ in range(reps):
                calls[op](i, o)
            runs.append((time.perf_counter() - t) / reps * 1e6)
        out.append(f"{op}:{nbytes}={statistics.median(runs):.2f}")
if rank == 0:
    print("RESULT " + " ".join(out), flush=True)
"""


def platform(sizes: list[int]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.memcpy.restype = ctypes.c_void_p
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    libc.process_vm_readv.argtypes = [
        ctypes.c_int, ctypes.POINTER(Iovec), ctypes.c_ulong, ctypes.POINTER(Iovec),
        ctypes.c_ulong, ctypes.c_ulong,
    ]  # fmt: skip
    biggest = max(sizes)
    src = np.ones(biggest + 8192, np.uint8)
    dst = np.zeros(biggest + 8192, np.uint8)
    s0 = src.ctypes.data - src.ctypes.data % 4096 + 4096
    d0 = dst.ctypes.data - dst.ctypes.data % 4096 + 4096
    pid = os.getpid()

    def rate(nbytes: int, shift: int, cma: bool) -> float:
        s, d = s0, d0 + shift
        if cma:
            local, remote = Iovec(d, nbytes), Iovec(s, nbytes)

            def call():
                libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        else:

            def call():
                libc.memcpy(d, s, nbytes)

        reps = max(20, min(2000, (64 << 20) // nbytes))
        for _ in range(reps // 4):
            call()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                call()
            best = min(best, (time.perf_counter() - t) / reps)
        return nbytes / best / 1e9

    shifts = [0, 1, 8, 16, 24, 31, 32, 40, 48, 63]
    print("# GB/s by how far the destination sits past the source modulo 64 bytes "
          "(best of 3 runs)")  # fmt: skip
    print(f"{'copy':>22} " + " ".join(f"{s:>5}" for s in shifts))
    for cma in (False, True):
        for nbytes in sizes:
            what = f"{'process_vm_readv' if cma else 'memcpy'} {format_size(nbytes)}"
            print(f"{what:>22} " + " ".join(f"{rate(nbytes, s, cma):5.1f}" for s in shifts),
                  flush=True)  # fmt: skip


def run(lib: str, ops: str, sizes: str, placement: str, job: str) -> dict[str, float]:
    if lib == "mpi":
        cmd = [shutil.which("mpirun") or "mpirun", "--oversubscribe", "--bind-to", "none",
               "-np", "2"]  # fmt: skip
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        cmd += [sys.executable, job]
    else:
        cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc-per-node",
               "2", job]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd + [lib, ops, sizes, placement], capture_output=True, text=True,
                         timeout=600, env=env)  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{lib} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return {k: float(v) for k, v in (kv.split("=") for kv in lines[-1].split()[1:])}


def ranks(args: argparse.Namespace) -> None:
    libs = ["cadence"] if args.no_mpi else ["cadence", "mpi"]
    sizes = ",".join(str(parse_size(s)) for s in args.sizes.split(","))
    results: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
    try:
        for i in range(args.rounds):
            for placement in args.placements.split(","):
                for lib in libs if i % 2 == 0 else libs[::-1]:
                    got = run(lib, args.ops, sizes, placement, f.name)
                    for key, v in got.items():
                        results.setdefault((placement, key, lib), []).append(v)
                    print(f"round {i + 1} {placement} {lib}: "
                          + " ".join(f"{k} {v}" for k, v in got.items()), flush=True)
    finally:
        os.unlink(f.name)
    print("# 2 ranks, calls back to back; µs a call, median over rounds (Open MPI's time "
          "over cadence's: above 1, cadence faster)")  # fmt: skip
    for placement, key in dict.fromkeys((p, k) for p, k, _ in results):
        op, nbytes = key.split(":")
        meds = {lib: statistics.median(results[(placement, key, lib)]) for lib in libs}
        line = f"{placement:8} {op:10} {format_size(int(nbytes)):>5}: " + "  ".join(
            f"{lib} {v:8.2f}" for lib, v in meds.items())
        if "mpi" in meds:
            line += f"  mpi/cadence {meds['mpi'] / meds['cadence']:.2f}x"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["platform", "ranks"], help="one part only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", default="allgather,alltoall")
    ap.add_argument("--sizes", default="64K,256K,512K,2M", help="full buffer sizes")
    ap.add_argument("--placements", default="page,page+16,numpy")
    ap.add_argument("--no-mpi", action="store_true", help="cadence only")
    args = ap.parse_args()
    if args.only != "ranks":
        platform([4096, 65536, 262144, 1 << 20])
    if args.only != "platform":
        if not args.no_mpi and shutil.which("mpirun") is None:
            raise SystemExit("mpirun not found: install Open MPI and mpi4py, or pass --no-mpi")
        ranks(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
