"""Small messages on one host, cadence against Open MPI, in alternating rounds.

Three measurements, each a job per library per round (cadence through
torchrun, Open MPI through mpirun and mpi4py; the two take turns so that
drift hits both alike):

- **ping-pong**: two ranks, `send` then `recv` (the other rank the reverse),
  10 000 round trips per size after 2 000 to warm up; half a round trip.
- **broadcasts back to back**: `--nranks` ranks (default 4), root 0, 20 000
  calls after 2 000; the root's µs a call. With more ranks than cores this is
  how fast the ranks pass small messages along while they share the cores.
- **streamed or batched**: `--nranks` ranks, broadcast and reduce (root
  0) of 8 bytes, timed two ways: *stream*, 20 000 calls back to back (the
  root's µs a call), and *batched*, as `cadence bench` times them: 2 000
  samples of a barrier and then 16 calls, each rank's median µs a call,
  the slowest rank's. With more ranks than cores the two part: the first
  shows how fast calls pass once the ranks run, the second adds how the
  ranks come out of each barrier.
- **late receivers**: `--nranks` ranks; after a barrier every rank but the
  root sleeps half a second, and the root times 32 broadcasts of 8 bytes.
  A transport that holds small messages in the receiver's ring returns at
  once; one that makes the sender wait for its receiver takes the half
  second.

    python benchmarks/small_messages.py --rounds 4
    python benchmarks/small_messages.py --rounds 4 --nranks 8 --only broadcast
    python benchmarks/small_messages.py --rounds 4 --only batched

Prints each round, then the median over rounds and Open MPI's time over
cadence's (above 1: cadence faster). Needs `mpirun` and mpi4py for the Open
MPI side (`--no-mpi` leaves it out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

JOB = r"""
import os, sys, time, numpy as np
lib, what, arg = sys.argv[1], sys.argv[2], sys.argv[3]
if lib == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    send = lambda x, peer: comm.Send(x, dest=peer)
    recv = lambda x, peer: comm.Recv(x, source=peer)
    bcast = lambda x: comm.Bcast(x, root=0)
    reduce = lambda x, y: comm.Reduce(x, y, op=MPI.SUM, root=0)
    slowest = lambda v: comm.allreduce(v, op=MPI.MAX)
    barrier = comm.Barrier
else:
    import cadence
    comm = cadence.init()
    rank, size = comm.rank, comm.size
    send = lambda x, peer: comm.send(x, peer)
    recv = lambda x, peer: comm.recv(x, peer)
    bcast = lambda x: comm.broadcast(x, root=0)
    reduce = lambda x, y: comm.reduce(x, root=0, out=y)
    slowest = lambda v: float(comm.allreduce(np.array([v]), op="max")[0])
    barrier = comm.barrier
out = []


def back_to_back(call, calls):
    # µs a call of `calls` calls in a row, after 2 000 to warm up.
    for _ in range(2000):
        call()
    barrier()
    t = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t) / calls * 1e6


if what == "pingpong":
    for nbytes in [int(s) for s in arg.split(",")]:
        x, y = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        def trip():
            if rank == 0:
                send(x, 1); recv(y, 1)
            else:
                recv(y, 0); send(x, 0)
        out.append(f"{nbytes}={back_to_back(trip, 10000) / 2:.3f}")
elif what == "broadcast":
    for nbytes in [int(s) for s in arg.split(",")]:
        x = np.ones(max(nbytes // 4, 1), np.float32)
        out.append(f"{nbytes}={back_to_back(lambda: bcast(x), 20000):.3f}")
        barrier()
elif what == "batched":
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    calls = {"bcast": lambda: bcast(x), "reduce": lambda: reduce(x, y)}
    for name, call in calls.items():
        out.append(f"{name}-stream={back_to_back(call, 20000):.3f}")
        samples = []
        for _ in range(2000):
            barrier()
            t = time.perf_counter()
            for _ in range(16):
                call()
            samples.append((time.perf_counter() - t) / 16)
        out.append(f"{name}-batched={slowest(float(np.median(samples))) * 1e6:.3f}")
        barrier()
else:  # late receivers
    x = np.zeros(2, np.float32)
    for _ in range(100):
        bcast(x)
    barrier()
    if rank != 0:
        time.sleep(0.5)
    t = time.perf_counter()
    for i in range(32):
        if rank == 0:
            x[:] = i
        bcast(x)
    took = time.perf_counter() - t
    if rank != 0 and x[0] != 31:
        raise SystemExit(f"rank {rank} got {x[0]}, not 31")
    out.append(f"32calls={took * 1e6:.1f}")
    barrier()
if rank == 0:
    print("RESULT " + " ".join(out), flush=True)
"""


def run(lib: str, nranks: int, what: str, arg: str, job: str) -> dict[str, float]:
    bindir = os.path.dirname(sys.executable)
    if lib == "mpi":
        cmd = [shutil.which("mpirun") or "mpirun", "--oversubscribe", "-np", str(nranks)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        cmd += [sys.executable, job]
    else:
        cmd = [os.path.join(bindir, "torchrun"), "--nproc-per-node", str(nranks), job]
    out = subprocess.run(cmd + [lib, what, arg], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{lib} {what} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return {k: float(v) for k, v in (kv.split("=") for kv in lines[-1].split()[1:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--nranks", type=int, default=4, help="ranks for the broadcasts (default 4)")
    ap.add_argument("--pingpong-sizes", default="8,64,512,2048,16384")
    ap.add_argument("--broadcast-sizes", default="8,1024")
    ap.add_argument(
        "--only",
        choices=["pingpong", "broadcast", "batched", "late"],
        action="append",
        help="run only these measurements (repeatable)",
    )
    ap.add_argument("--no-mpi", action="store_true", help="cadence only")
    args = ap.parse_args()
    libs = ["cadence"] if args.no_mpi else ["cadence", "mpi"]
    if not args.no_mpi and shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found: install Open MPI and mpi4py, or pass --no-mpi")
    plan = [
        ("pingpong", 2, args.pingpong_sizes),
        ("broadcast", args.nranks, args.broadcast_sizes),
        ("batched", args.nranks, "-"),
        ("late", args.nranks, "-"),
    ]
    plan = [p for p in plan if not args.only or p[0] in args.only]
    results: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
    try:
        for i in range(args.rounds):
            for what, n, arg in plan:
                for lib in libs if i % 2 == 0 else libs[::-1]:
                    got = run(lib, n, what, arg, f.name)
                    for key, v in got.items():
                        results.setdefault((what, key, lib), []).append(v)
                    print(
                        f"round {i + 1} {what} ({n} ranks) {lib}: "
                        + " ".join(f"{k} {v}" for k, v in got.items()),
                        flush=True,
                    )
    finally:
        os.unlink(f.name)
    print(
        "# median over rounds, µs (ping-pong: half a round trip; broadcast and *-stream: the "
        "root's time a call; *-batched: the slowest rank's median a call, 16 calls after a "
        "barrier; late: the root's 32 calls)"
    )
    for what, key in dict.fromkeys((w, k) for w, k, _ in results):
        meds = {lib: statistics.median(results[(what, key, lib)]) for lib in libs}
        line = f"{what:9} {key:>8}: " + "  ".join(f"{lib} {v:.3f}" for lib, v in meds.items())
        if "mpi" in meds:
            line += f"  mpi/cadence {meds['mpi'] / meds['cadence']:.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
