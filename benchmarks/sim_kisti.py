"""The KISTI study (seed 001) reproduced in simulation: which allreduce wins
at 16 to 1024 nodes of a Nurion-like cluster, for ResNet-50's gradients.

  python benchmarks/sim_kisti.py [--nodes 16,32,...,1024] [--jobs 2]
      [--json kisti.json] [--plot docs/img/kisti.png]

The seed (KISTI, Nurion): KNL nodes on Intel Omni-Path (100 Gbit/s) in a fat
tree with 50 % blocking, PyTorch + oneCCL, ResNet-50, batch 8 per node,
synthetic data; one rank per node. It found starlike (direct) best at 16-128
nodes, ring at 256, 2D-torus(ring) from 512, and, on N x N grids (64, 256,
1024), ring ahead up to 256 and 2D-torus ahead at 1024.

Here every algorithm of cadence's suite that the study names runs, as the
library would build it, on the spec below (`cadence sim`'s model). The
gradients are PyTorch DDP's buckets for ResNet-50 (25.56 M float32
parameters, 97.5 MiB): a first bucket of 1 MiB, then 25 MiB buckets
(bucket_cap_mb), the last one 21.5 MiB. A step's communication is the sum of
its buckets' allreduce times (no overlap with the backward pass counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

MIB = 1 << 20

#: What the seed states (fabric, rate, blocking) and what it leaves open,
#: taken from the hardware: OPA's 48-port edge switches at 2:1 give 32
#: hosts per leaf; ~2 us end-to-end latency over PSM2/OFI plus 1 us across
#: the spine; a KNL core's per-message cost; oneCCL reducing with a few
#: worker threads on MCDRAM (10 GB/s, above the NIC: the network decides).
SPEC = {
    "version": 1,
    "kind": "cadence-cluster",
    "note": "Nurion-like (seed 001): KNL nodes, 100 Gbit/s OPA, fat tree at 50 % blocking",
    "ranks_per_host": 1,
    "nic": {"count": 1, "rate": "100gbit", "latency_us": 2.0, "overhead_us": 2.0},
    "fabric": {"kind": "fat_tree", "hosts_per_leaf": 32, "oversubscription": 2.0,
               "hop_latency_us": 1.0},
    "cpu": {"reduce": "10GB/s"},
}  # fmt: skip

#: The study's algorithms, in cadence's names (the seed's names beside).
ALGOS = {
    "direct": "starlike",
    "ring": "ring",
    "torus2d": "2D-torus",
    "torus2d_ring": "2D-torus(ring)",
    "hierarchical": "hierarchical",
    "recursive_doubling": "recursive doubling",
    "rabenseifner": "Rabenseifner",
    "double_binary_tree": "double binary tree",
}

#: ResNet-50's DDP buckets: (bytes, how many per step).
BUCKETS = [(1 * MIB, 1), (25 * MIB, 3), (int(21.5 * MIB), 1)]

NODES = [16, 32, 64, 128, 256, 512, 1024]


def _profiled_spec(nodes: int, where: str) -> dict:
    """SPEC with the topology file `cadence topo profile` would write on
    it: every pair alone at the NIC rate, 32-host groups whose uplinks
    carry half their hosts' rate. With it `auto` prices the spine."""
    nic, per = 100e9 / 8, SPEC["fabric"]["hosts_per_leaf"]
    uplink = per * nic / SPEC["fabric"]["oversubscription"]
    groups = [list(range(g, min(g + per, nodes))) for g in range(0, nodes, per)]
    topo = {"version": 1, "kind": "cadence-topology", "note": "the study's fat tree, as profiled",
            "hosts": [f"knl{i}" for i in range(nodes)],
            "rates": [[0.0 if a == b else nic for b in range(nodes)] for a in range(nodes)],
            "groups": groups, "group_out": [uplink] * len(groups),
            "group_in": [uplink] * len(groups)}
    path = os.path.join(where, f"topo-{nodes}.json")
    with open(path, "w") as f:
        json.dump(topo, f)
    return {**SPEC, "fabric": {"kind": "measured", "file": path}}


def _one(nodes: int, algo: str, size: int) -> tuple[int, str, int, float, float, str]:
    from cadence import _core

    t0 = time.perf_counter()
    if algo == "auto_profiled":
        with tempfile.TemporaryDirectory() as where:
            c = _core.SimCluster(json.dumps(_profiled_spec(nodes, where)), "kisti", nodes)
    else:
        # "auto_blind": a job with CADENCE_TOPO_FILE=none (no start-up profile).
        c = _core.SimCluster(json.dumps(SPEC), "kisti", nodes, profile=algo != "auto_blind")
    auto = algo.startswith("auto")
    ran, secs, _ = c.run("allreduce", size // 4, 4, None if auto else algo)
    return nodes, algo, size, secs, time.perf_counter() - t0, ran


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default=",".join(map(str, NODES)))
    p.add_argument("--jobs", type=int, default=2, help="simulations at once")
    p.add_argument("--json", help="write every simulated time here")
    p.add_argument("--plot", help="draw step time against nodes (PNG)")
    a = p.parse_args()
    nodes = [int(x) for x in a.nodes.split(",")]
    # Largest first, so the long ones (direct at 1024) do not come last.
    autos = ["auto", "auto_blind", "auto_profiled"]
    tasks = sorted(((n, algo, size) for n in nodes for algo in [*ALGOS, *autos]
                    for size, _ in BUCKETS),
                   key=lambda t: -t[0] * (4 if t[1] == "direct" else 1))
    times: dict[tuple[int, str, int], float] = {}
    chosen: dict[tuple[int, str, int], str] = {}
    t_start = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        futs = [pool.submit(_one, *t) for t in tasks]
        for i, f in enumerate(as_completed(futs), 1):
            n, algo, size, secs, wall, ran = f.result()
            times[n, algo, size] = secs
            if algo in autos:
                chosen[n, algo, size] = ran
            print(f"# [{i}/{len(tasks)}] {n} nodes {algo} {size / MIB:g} MiB: "
                  f"{secs * 1e3:.2f} ms simulated in {wall:.1f} s", file=sys.stderr, flush=True)
    step = {(n, algo): sum(k * times[n, algo, size] for size, k in BUCKETS)
            for n in nodes for algo in [*ALGOS, *autos]}
    print(f"# {SPEC['note']}; ResNet-50 DDP buckets "
          + " + ".join(f"{k} x {s / MIB:g} MiB" for s, k in BUCKETS)
          + f"; simulated in {time.perf_counter() - t_start:.0f} s")
    print()
    print("Communication per step (ms; winner in bold):")
    print()
    print("| nodes | " + " | ".join(ALGOS) + " | best |")
    print("|---" * (len(ALGOS) + 2) + "|")
    for n in nodes:
        best = min(ALGOS, key=lambda x: step[n, x])
        cells = [f"**{step[n, x] * 1e3:.1f}**" if x == best else f"{step[n, x] * 1e3:.1f}"
                 for x in ALGOS]
        print(f"| {n} | " + " | ".join(cells) + f" | {best} |")
    print()
    print("The library's choice (ms per step, its picks, / the best): `auto` as a job")
    print("starts (a start-up profile: pairs up to 4 hosts, shifted rounds beyond),")
    print("with CADENCE_TOPO_FILE=none (nothing measured), and with the topology file")
    print("of the fabric as built:")
    print()
    print("| nodes | auto | /best | nothing measured | /best | with the topology file | /best |")
    print("|---|---|---|---|---|---|---|")
    for n in nodes:
        best = min(step[n, x] for x in ALGOS)
        cells = []
        for x in autos:
            picks = ", ".join(sorted({chosen[n, x, s] for s, _ in BUCKETS}))
            cells += [f"{step[n, x] * 1e3:.1f} ({picks})", f"{step[n, x] / best:.2f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    for size, _ in BUCKETS:
        print()
        print(f"One {size / MIB:g} MiB bucket: winner (ms), runner-up (ms):")
        print()
        for n in nodes:
            order = sorted(ALGOS, key=lambda x: times[n, x, size])
            print(f"- {n} nodes: {order[0]} {times[n, order[0], size] * 1e3:.2f}, "
                  f"{order[1]} {times[n, order[1], size] * 1e3:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"spec": SPEC, "buckets": BUCKETS,
                       "times": [{"nodes": n, "algo": x, "bytes": s, "seconds": t,
                                  **({"chosen": chosen[n, x, s]} if x in autos else {})}
                                 for (n, x, s), t in sorted(times.items())]}, f, indent=1)
    if a.plot:
        _plot(a.plot, nodes, step)
    return 0


def _plot(path: str, nodes: list[int], step: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for algo, seed_name in ALGOS.items():
        # Dashed: the ones that would hide a twin (hierarchical is ring with
        # one rank per node; the two 2D-tori differ by their last step).
        ax.plot(nodes, [step[n, algo] * 1e3 for n in nodes], marker="o",
                linestyle="--" if algo in ("hierarchical", "torus2d_ring") else "-",
                label=f"{algo} ({seed_name})" if seed_name != algo else algo)
    ax.plot(nodes, [step[n, "auto"] * 1e3 for n in nodes], color="black", linestyle=":",
            label="auto (the library's choice, profiled at start-up)")
    ax.plot(nodes, [step[n, "auto_blind"] * 1e3 for n in nodes], color="grey", linestyle=":",
            label="auto with nothing measured")
    ax.plot(nodes, [step[n, "auto_profiled"] * 1e3 for n in nodes], color="black",
            linestyle="-.", label="auto with a topology file")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel("nodes (one rank each)")
    ax.set_ylabel("allreduce time per step (ms)")
    ax.set_title("ResNet-50 gradients on a simulated Nurion-like fat tree (50 % blocking)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
