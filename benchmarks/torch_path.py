"""What torch.distributed costs on top of cadence: allreduce through
`torch.distributed.all_reduce` on a cadence group, the same tensor through
cadence's own API (the group's communicator), and gloo through torch, in one
job and one run.

    .venv/bin/python benchmarks/torch_path.py --nranks 2 4

For each rank count it starts one job (one process per rank, torch's
spawn) with the cadence world group and a gloo group of the same ranks. For
every element type and size it times blocks of back-to-back calls of each
way in turn (the order goes through every permutation, so that neither drift nor what the
way before leaves behind favours one)
and prints the median time per call over the rounds (rank 0's clock, after a
barrier), the ratio torch/own (what torch's layers and the backend add),
gloo's time over cadence's through torch, and the bus bandwidth
(2(n-1)/n · bytes / time) of cadence through torch.

A floor for the first ratio: torch's own layers cost something on any
backend. `--floor` also times `dist.all_reduce` on torch's FakeProcessGroup
(a C++ backend that does nothing, torch.testing), alone in a process.

`--funcol` adds a way: torch's functional collective
(`funcol.all_reduce(t, "sum", group)` and `wait_tensor`, what DTensor,
`parallelize_module` and `torch.compile`d graphs call), which asks the
backend for an asynchronous operation and copies the input first.

`--deepspeed` adds another way: DeepSpeed's `inference_all_reduce`, its
hand-written shared-memory allreduce for CPU tensor parallelism (on this
job's cadence group, `deepspeed.init_distributed(dist_backend="cadence")`).
Its float32 kernel needs AVX2 and its bfloat16/float16 kernels AVX-512BW;
where the CPU lacks them DeepSpeed calls the process group's allreduce
instead (cadence's here), which the header says.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch
from cadence.bench import torch_job

WAYS = ("torch", "own", "gloo")
DTYPES = ("float32", "bfloat16", "float16")


def _parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def _calls(nbytes: int, way: str) -> int:
    """Calls per timed block: about 20 ms of cadence, 2 calls at least."""
    per_call = 3e-6 + nbytes / 2e9 * (8 if way == "gloo" else 1)
    return max(2, min(2000, int(0.02 / per_call)))


def _rank_main(rank, n, port, args, outdir):
    torch.set_num_threads(1)
    import cadence  # noqa: F401 - registers the backend
    import torch.distributed as dist

    dist.init_process_group("cadence", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    gloo = dist.new_group(backend="gloo")
    comm = dist.group.WORLD.communicator
    ways = {
        "torch": lambda t: dist.all_reduce(t),
        "own": lambda t: comm.allreduce(t),
        "gloo": lambda t: dist.all_reduce(t, group=gloo),
    }
    if args.funcol:
        import torch.distributed._functional_collectives as funcol

        world = dist.group.WORLD
        ways["funcol"] = lambda t: funcol.wait_tensor(funcol.all_reduce(t, "sum", world))
    if args.deepspeed:
        ways["deepspeed"] = _deepspeed_way(n, port)
        if rank == 0:
            print(f"# {n} ranks: DeepSpeed's shared-memory kernel takes "
                  f"{_deepspeed_kernels()}", flush=True)
    orders = list(itertools.permutations(ways))
    out: dict[tuple[str, int, str], list[float]] = {}
    for dtype in args.dtypes:
        for nbytes in args.sizes:
            dt = getattr(torch, dtype)
            # Zeros: sums stay where they are (ones would overflow half types).
            t = torch.zeros(nbytes // dt.itemsize, dtype=dt)
            for way in ways:
                for _ in range(3):
                    ways[way](t)
            for rnd in range(args.rounds):
                for way in orders[rnd % len(orders)]:
                    k = _calls(nbytes, way)
                    time.sleep(0.01)  # what the way before left running settles
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        ways[way](t)
                    out.setdefault((dtype, nbytes, way), []).append(
                        (time.perf_counter() - t0) / k)
    torch_job.report(outdir, rank, out)
    dist.destroy_process_group()


def _deepspeed_way(n: int, port: int):
    """DeepSpeed's `inference_all_reduce` on this job's (cadence) group: its
    shared-memory op wants every rank on this host (LOCAL_SIZE) and names
    its segment after MASTER_ADDR/PORT; it is compiled (ninja, from this
    environment) at first use."""
    os.environ.update(LOCAL_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      DS_ACCELERATOR="cpu")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    import deepspeed
    import deepspeed.comm as ds_comm

    deepspeed.init_distributed(dist_backend="cadence")
    return lambda t: ds_comm.inference_all_reduce(t)


def _deepspeed_kernels() -> str:
    """Which element types DeepSpeed's shared-memory kernel takes on this
    CPU (the rest go to the process group)."""
    import deepspeed.comm.comm as c

    level = getattr(c.cdb, "shm_vector_kernel_level", 0)
    return {0: "none (all to the process group)", 1: "float32 only (no AVX-512BW)"}.get(
        level, "float32, bfloat16, float16")


def run_job(n: int, args) -> dict:
    """Rank 0's {(dtype, bytes, way): seconds per call, one per round}."""
    return torch_job.run(_rank_main, n, args, args.timeout)[0]


def floor_us(calls: int = 20000, functional: bool = False) -> float:
    """µs per `dist.all_reduce` of 8 KiB on torch's FakeProcessGroup (or,
    `functional`, per functional all_reduce and its wait)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    t = torch.ones(2048)
    world = dist.group.WORLD
    call = ((lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", world))) if functional
            else (lambda: dist.all_reduce(t)))  # fmt: skip
    calls = calls // 10 if functional else calls
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - t0) / calls)
    dist.destroy_process_group()
    return best * 1e6


def _fmt_size(b: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes", default="8K,64K,1M,16M", help="bytes per call, a comma list")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="element types, a comma list")
    p.add_argument("--rounds", type=int, default=12, help="timed blocks of each way")
    p.add_argument("--floor", action="store_true",
                   help="also time torch's FakeProcessGroup (its own layers' cost)")
    p.add_argument("--funcol", action="store_true",
                   help="also torch's functional all_reduce (DTensor's, torch.compile's)")
    p.add_argument("--deepspeed", action="store_true",
                   help="also DeepSpeed's shared-memory inference_all_reduce")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    args = p.parse_args(argv)
    args.sizes = [_parse_size(s) for s in args.sizes.split(",") if s]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    print(f"# torch {torch.__version__}, {os.cpu_count()} cores; median µs per call over "
          f"{args.rounds} rounds (rank 0)", flush=True)
    if args.floor:
        print(f"# torch's layers on a backend that does nothing (FakeProcessGroup), 8 KiB: "
              f"{floor_us():.1f} µs", flush=True)
        if args.funcol:
            print(f"# the same, functional all_reduce and wait_tensor: "
                  f"{floor_us(functional=True):.1f} µs", flush=True)
    extra = (f" {'funcol':>9} {'funcol/own':>10}" if args.funcol else "") + (
        f" {'deepspeed':>10} {'ds/torch':>8}" if args.deepspeed else "")
    print(f"{'ranks':>5} {'dtype':>9} {'size':>8} {'torch':>9} {'own API':>9} {'gloo':>10} "
          f"{'torch/own':>9} {'gloo/torch':>10} {'busbw':>11}{extra}", flush=True)
    for n in args.nranks:
        res = run_job(n, args)
        for dtype in args.dtypes:
            for nbytes in args.sizes:
                ways = WAYS + (("funcol",) if args.funcol else ()) + (
                    ("deepspeed",) if args.deepspeed else ())
                med = {w: statistics.median(res[dtype, nbytes, w]) for w in ways}
                bus = 2 * (n - 1) / n * nbytes / med["torch"] / 1e9
                extra = (f" {med['funcol'] * 1e6:>9.1f} {med['funcol'] / med['own']:>10.2f}"
                      if args.funcol else "") + (
                    f" {med['deepspeed'] * 1e6:>10.1f} {med['deepspeed'] / med['torch']:>8.2f}"
                    if args.deepspeed else "")
                print(f"{n:>5} {dtype:>9} {_fmt_size(nbytes):>8} {med['torch'] * 1e6:>9.1f} "
                      f"{med['own'] * 1e6:>9.1f} {med['gloo'] * 1e6:>10.1f} "
                      f"{med['torch'] / med['own']:>9.2f} {med['gloo'] / med['torch']:>10.1f} "
                      f"{bus:>7.2f} GB/s{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
