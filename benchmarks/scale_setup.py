"""Set-up at scale, as processes: N rank processes on this machine as H
emulated hosts (`CADENCE_HOST`: shared memory within a host, TCP over
loopback between), cadence, gloo and Open MPI side by side.

    python benchmarks/scale_setup.py --ranks 64 --hosts 16
    python benchmarks/scale_setup.py --ranks 256 --hosts 64 --backends cadence
    python benchmarks/scale_setup.py --ranks 200 --hosts 200 --nofile 256 --backends cadence

Every rank imports what it needs (numpy and cadence; torch for gloo;
mpi4py for Open MPI), says it is ready, and starts set-up at once. Set-up is
timed from the moment the last rank is ready to the moment the last rank has
finished `init` (clocks of one machine). Each rank then counts its open file
descriptors and its resident memory, and runs one allreduce, checked.

cadence runs with its defaults and a topology cache of its own per run, so
every run is "a host set never seen before" (hosts emulated on loopback are
not profiled at start-up, as nothing but this machine's CPUs lies between
them; `CADENCE_TOPO_FILE=profile` in the environment measures them anyway);
gloo through `init_process_group` with a TCP init method;
Open MPI with `mpirun` (all ranks on one node: it uses shared memory between
every pair, as no emulated host can tell it otherwise). `--nofile N` starts
each rank under `ulimit -n N` (soft and hard), as a job whose full mesh
needs more sockets than that.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import json, os, sys, time
backend = sys.argv[1]
t_start = time.time()
import numpy as np
if backend == "cadence":
    import cadence
elif backend == "gloo":
    import torch
    import torch.distributed as dist
else:
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
ready = time.time()
cpu0 = time.process_time()
if backend == "cadence":
    comm = cadence.init(timeout=float(os.environ["SCALE_TIMEOUT"]))
    rank, size = comm.rank, comm.size
elif backend == "gloo":
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    from datetime import timedelta
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"],
                            rank=rank, world_size=size,
                            timeout=timedelta(seconds=float(os.environ["SCALE_TIMEOUT"])))
else:
    MPI.Init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
done = time.time()
init_cpu = time.process_time() - cpu0
fds = len(os.listdir("/proc/self/fd"))
rss = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
x = np.full(1000, float(rank + 1))
if backend == "cadence":
    comm.allreduce(x)
elif backend == "gloo":
    t = torch.from_numpy(x)
    dist.all_reduce(t)
else:
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    x = y
ok = bool((x == size * (size + 1) / 2).all())
print(json.dumps({"rank": rank, "ready": ready, "done": done, "fds": fds, "rss_kib": rss,
                  "ok": ok, "import_s": ready - t_start, "init_cpu_s": init_cpu}), flush=True)
if backend == "gloo":
    dist.destroy_process_group()
elif backend == "mpi":
    MPI.Finalize()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_objects(text: str):
    """The JSON objects in `text`, in order: mpirun may run two ranks' lines
    together on one line."""
    decoder, at = json.JSONDecoder(), text.find("{")
    while at >= 0:
        try:
            row, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        yield row
        at = text.find("{", end)


def limit_files(n: int | None):
    if n is None:
        return None

    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return set_limit


def run_ranks(backend: str, ranks: int, hosts: int, timeout: float, nofile: int | None,
              worker: str) -> list[dict]:
    per_host = -(-ranks // hosts)
    cache = tempfile.mkdtemp(prefix="cadence-scale-topo-")
    port = free_port()
    base = dict(os.environ, OMP_NUM_THREADS="1", SCALE_TIMEOUT=str(timeout),
                CADENCE_TOPO_CACHE=cache, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(ranks))
    try:
        if backend == "mpi":
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                   sys.executable, worker, "mpi"]
            p = subprocess.run(cmd, env=base, capture_output=True, text=True,
                               timeout=timeout + 60, preexec_fn=limit_files(nofile))
            outs = [p.stdout]
            if p.returncode != 0:
                raise RuntimeError(f"mpirun exited {p.returncode}: {p.stderr[-2000:]}")
        else:
            procs = []
            for r in range(ranks):
                env = dict(base, RANK=str(r), CADENCE_HOST=f"h{r // per_host}")
                procs.append(subprocess.Popen([sys.executable, worker, backend], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, preexec_fn=limit_files(nofile)))
            outs, errs = [], []
            for r, p in enumerate(procs):
                try:
                    o, e = p.communicate(timeout=timeout + 60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    o, e = p.communicate()
                outs.append(o)
                if r == 0 and "CADENCE_DEBUG" in os.environ:
                    # Rank 0's own account (CADENCE_DEBUG=INFO: where set-up's time went).
                    for line in e.splitlines():
                        if "set-up took" in line or "WARN" in line:
                            print(f"  {line}", file=sys.stderr)
                if p.returncode != 0:
                    errs.append(f"rank exited {p.returncode}: {e.strip()[-600:]}")
            if errs:
                raise RuntimeError(f"{len(errs)} ranks failed; first: {errs[0]}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rows = [row for o in outs for row in json_objects(o)]
    if len(rows) != ranks:
        raise RuntimeError(f"{len(rows)} of {ranks} ranks reported")
    return rows


def summary(backend: str, rows: list[dict]) -> dict:
    setup = max(r["done"] for r in rows) - max(r["ready"] for r in rows)
    fds = [r["fds"] for r in rows]
    rss = [r["rss_kib"] / 1024 for r in rows]
    return {"backend": backend, "ranks": len(rows), "setup_s": setup,
            "fds_median": statistics.median(fds), "fds_max": max(fds),
            "rss_mib_median": statistics.median(rss), "ok": all(r["ok"] for r in rows),
            "import_s_max": max(r["import_s"] for r in rows),
            "init_cpu_ms_median": 1e3 * statistics.median(r["init_cpu_s"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--hosts", type=int, default=16, help="emulated hosts (ranks spread evenly)")
    ap.add_argument("--backends", default="cadence,gloo,mpi")
    ap.add_argument("--timeout", type=float, default=120.0, help="set-up deadline per rank (s)")
    ap.add_argument("--nofile", type=int, default=None,
                    help="start every rank under ulimit -n NOFILE (soft and hard)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds to wait before each run: the previous run's 64 torch "
                         "processes take the machine a while to tear down")
    ap.add_argument("--json", help="write every run's summary here")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
        worker = f.name
    results = []
    try:
        print(f"{args.ranks} ranks as {args.hosts} hosts x {-(-args.ranks // args.hosts)}"
              + (f", ulimit -n {args.nofile}" if args.nofile else ""), flush=True)
        for _ in range(args.repeat):
            for b in backends:
                if b == "mpi" and not shutil.which("mpirun"):
                    print("mpi: mpirun not found, skipped")
                    continue
                if results:
                    time.sleep(args.settle)
                t = time.time()
                try:
                    s = summary(b, run_ranks(b, args.ranks, args.hosts, args.timeout,
                                             args.nofile, worker))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"{b:8s} FAILED: {e}", flush=True)
                    results.append({"backend": b, "error": str(e)})
                    continue
                s["wall_s"] = time.time() - t
                results.append(s)
                print(f"{b:8s} set-up {s['setup_s']:6.2f} s | fds/rank median {s['fds_median']:.0f}"
                      f" max {s['fds_max']} | RSS/rank {s['rss_mib_median']:.0f} MiB | "
                      f"init CPU/rank {s['init_cpu_ms_median']:.1f} ms | "
                      f"allreduce {'ok' if s['ok'] else 'WRONG'} | run {s['wall_s']:.0f} s",
                      flush=True)
    finally:
        os.unlink(worker)
    by = {}
    for s in results:
        if "setup_s" in s:
            by.setdefault(s["backend"], []).append(s["setup_s"])
    if "cadence" in by:
        c = statistics.median(by["cadence"])
        for b, v in by.items():
            if b != "cadence":
                print(f"cadence / {b} set-up: {c / statistics.median(v):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all("error" not in s and s.get("ok") for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
