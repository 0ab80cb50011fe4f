"""A NIC cut in the middle of a loop of allreduces, and restored.

Runs one job on an emulated cluster with several NICs per host: every rank
runs `--iters` allreduces of `--size` float32 whose exact sum is known (small
integers), checks every result bit for bit, and prints each iteration's time
and busbw. Rank 0 cuts one NIC (`cadence cluster link --down`) once
iteration `--cut-at` has started and restores it (`--up`) once iteration
`--restore-at` has started; the table shows the loop going on over the
surviving NIC and coming back to both.

    cadence cluster up --name fo --hosts 4 --nics 2 --rate 500mbit
    .venv/bin/python benchmarks/failover.py --cluster fo --host 1 --nic 1

Prints one line per iteration, then a summary: the steady time on both NICs,
during the cut, after the restore, and how long after the restore the loop
was back within 10 % of the two-NIC time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

RANK = r"""
import json, os, subprocess, sys, threading, time
import numpy as np
import cadence

args = json.loads(os.environ["FO_ARGS"])
comm = cadence.init(timeout=300)
n = args["size"] // 4
pattern = (np.arange(n, dtype=np.int64) % 251).astype(np.float32)
x0 = pattern * (comm.rank + 1)
want = pattern * (comm.size * (comm.size + 1) // 2)  # exact in float32
cli = [sys.executable, "-m", "cadence.cli.main", "cluster", "link", "--name", args["cluster"],
       "--host", str(args["host"]), "--nic", str(args["nic"])]

def change(flag, delay):
    time.sleep(delay)
    stamp = time.time()
    subprocess.run(cli + [flag], check=True, capture_output=True)
    print(json.dumps({"event": flag, "at": stamp}), flush=True)

for it in range(args["iters"]):
    x = x0.copy()
    if comm.rank == 0 and it in (args["cut_at"], args["restore_at"]):
        # Lands during this iteration, not between two.
        flag = "--down" if it == args["cut_at"] else "--up"
        threading.Thread(target=change, args=(flag, args["delay"]), daemon=True).start()
    comm.barrier()
    t0 = time.time()
    comm.allreduce(x)
    t1 = time.time()
    exact = bool(np.array_equal(x, want))
    if comm.rank == 0:
        print(json.dumps({"it": it, "t0": t0, "s": t1 - t0, "exact": exact}), flush=True)
    elif not exact:
        print(json.dumps({"it": it, "rank": comm.rank, "exact": False}), flush=True)
time.sleep(0.5)
comm.close()
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--host", type=int, default=1, help="host whose NIC is cut")
    ap.add_argument("--nic", type=int, default=1, help="NIC cut")
    ap.add_argument("--size", default="64M", help="bytes per allreduce (default 64M)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cut-at", type=int, default=5)
    ap.add_argument("--restore-at", type=int, default=12)
    ap.add_argument("--delay", type=float, default=0.3,
                    help="seconds into the iteration when the change lands")
    ap.add_argument("--algo", help="CADENCE_ALGO for the job (default: cadence's choice)")
    ap.add_argument("--json", help="write the per-iteration records here")
    a = ap.parse_args(argv)
    from cadence.testbed import cluster as tb
    from cadence.units import parse_size

    cluster = tb.require(a.cluster)
    size = parse_size(a.size)
    args = {"cluster": a.cluster, "host": a.host, "nic": a.nic, "size": size, "iters": a.iters,
            "cut_at": a.cut_at, "restore_at": a.restore_at, "delay": a.delay}
    env = {**os.environ, "FO_ARGS": json.dumps(args)}
    if a.algo:
        env["CADENCE_ALGO"] = a.algo
    script = f"/tmp/cadence-failover-{os.getpid()}.py"
    with open(script, "w") as f:
        f.write(RANK)
    print(f"cluster {a.cluster}: {len(cluster.hosts)} hosts x {cluster.nics} NICs; "
          f"{a.iters} x allreduce {a.size} float32; cut host {a.host} NIC {a.nic} in "
          f"iteration {a.cut_at}, restore in {a.restore_at}"
          + (f"; CADENCE_ALGO={a.algo}" if a.algo else ""), flush=True)
    t = time.time()
    # Output is read as it comes, so that log lines carry the time they
    # appeared (`cluster run` merges the ranks' stderr into its stdout).
    p = subprocess.Popen(
        [sys.executable, "-m", "cadence.cli.main", "cluster", "run", "--name", a.cluster,
         "--timeout", "900", "--", sys.executable, script],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    lines = [(time.time(), line) for line in p.stdout]
    p.wait()
    os.unlink(script)
    # Whatever happened, the NIC is up again afterwards.
    tb.set_link(cluster, a.host, a.nic, up=True)
    recs, events, bad, logs = [], {}, [], []
    for at, line in lines:
        body = line.partition(": ")[2] if line.startswith("[rank") else line
        try:
            r = json.loads(body)
        except ValueError:
            if "WARN" in line:
                logs.append((at, line.strip()))
            continue
        if "event" in r:
            events[r["event"]] = r["at"]
        elif "rank" in r:
            bad.append(r)
        elif "it" in r:
            recs.append(r)
    for at, line in logs:
        since = [f"{at - events[e]:+.1f} s from {e.strip('-')}" for e in events if events[e] <= at]
        print(f"  [{since[-1] if since else ''}] {line}")
    if p.returncode != 0:
        print("".join(line for _, line in lines[-60:]), file=sys.stderr)
        print(f"job failed (rc {p.returncode}) after {time.time() - t:.0f} s", file=sys.stderr)
        return 1
    n = len(cluster.hosts)
    print(f"{'iter':>4} {'time_s':>8} {'busbw_GB/s':>11} {'exact':>6}  note")
    for r in recs:
        busbw = 2 * (n - 1) / n * size / r["s"] / 1e9
        note = ""
        for ev, at in events.items():
            if r["t0"] <= at <= r["t0"] + r["s"]:
                note = f"{ev.strip('-')} at +{at - r['t0']:.2f} s"
        r["busbw"] = busbw
        print(f"{r['it']:>4} {r['s']:>8.2f} {busbw:>11.4f} {str(r['exact']):>6}  {note}")
    exact = all(r["exact"] for r in recs) and not bad
    before = [r["s"] for r in recs[1:a.cut_at]]
    during = [r["s"] for r in recs[a.cut_at + 1:a.restore_at]]
    both = min(before) if before else float("nan")
    one = sorted(during)[len(during) // 2] if during else float("nan")
    back = next((r for r in recs[a.restore_at:] if r["s"] <= 1.1 * both), None)
    print(f"every result bit-exact: {exact}")
    print(f"two NICs {both:.2f} s/iter; cut (median) {one:.2f} s/iter = {both / one:.2f} of "
          f"the two-NIC speed")
    if back is not None and "--up" in events:
        print(f"back within 10 % of two NICs: iteration {back['it']}, "
              f"{back['t0'] + back['s'] - events['--up']:.1f} s after the restore")
    else:
        print("never back within 10 % of the two-NIC time")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": args, "records": recs, "events": events}, f, indent=1)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
