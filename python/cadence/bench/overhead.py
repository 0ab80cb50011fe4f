"""What the live diagnosis costs: the same allreduce loop with the watchdog
off (`CADENCE_DIAG_AFTER=0`) and on (the defaults: 1 s ticks, 10 s slowness
windows), alternated in one run, on local ranks.

    python -m cadence.bench.overhead --nranks 4 --size 1M --seconds 20 --rounds 3

Each run: N ranks (processes, shared memory), a TCPStore in this process as
under torchrun, `--seconds` of back-to-back allreduces of `--size` bytes
(float32) between two barriers, timed on every rank; a run's figure is the
slowest rank's mean time per call. The mean, not the median: the watchdog's
cost comes in rare lumps (a dump every window), which a median would hide.
Prints each run and the ratio of the medians over rounds (on / off).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

from cadence.bench.common import parse_size


def _rank(rank, size, port, env, nbytes, iters, q):
    os.environ.update(env)
    from datetime import timedelta

    import numpy as np
    import torch.distributed as dist

    import cadence

    store = dist.TCPStore("127.0.0.1", port, size, is_master=False,
                          timeout=timedelta(seconds=60))
    comm = cadence.init(store=store, rank=rank, world_size=size)
    x = np.ones(nbytes // 4, dtype=np.float32)
    for _ in range(20):
        comm.allreduce(x)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.allreduce(x)
    comm.barrier()
    q.put((rank, (time.perf_counter() - t0) / iters))
    comm.close()


def run(nranks: int, nbytes: int, iters: int, watchdog: bool) -> float:
    from datetime import timedelta

    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    server = dist.TCPStore("127.0.0.1", 0, nranks, is_master=True,
                           timeout=timedelta(seconds=60), wait_for_workers=False)
    env = {"CADENCE_HOST": "local", "OMP_NUM_THREADS": "1",
           "CADENCE_DIAG_AFTER": "30" if watchdog else "0"}
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, nranks, server.port, env, nbytes, iters, q))
             for r in range(nranks)]
    for p in procs:
        p.start()
    times = [q.get(timeout=600)[1] for _ in range(nranks)]
    for p in procs:
        p.join()
    return max(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--size", default="1M")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    nbytes = parse_size(args.size)
    # Calibrate the loop length once (watchdog off) so a run lasts --seconds.
    probe = run(args.nranks, nbytes, 200, watchdog=False)
    iters = max(200, int(args.seconds / probe))
    print(f"{args.nranks} ranks, allreduce of {nbytes} bytes, {iters} calls per run "
          f"(~{iters * probe:.0f} s)", flush=True)
    res: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.rounds):
        for on in (False, True):
            t = run(args.nranks, nbytes, iters, on)
            res[on].append(t)
            print(f"round {i + 1}: watchdog {'on ' if on else 'off'} {t * 1e6:9.1f} us/call",
                  flush=True)
    off, on = statistics.median(res[False]), statistics.median(res[True])
    print(f"median off {off * 1e6:.1f} us, on {on * 1e6:.1f} us: on/off = {on / off:.4f} "
          f"({(on / off - 1) * 100:+.2f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
