"""Simulate cadence's collectives on a modeled cluster.

The schedules are the library's own (the same generators), `auto` is the
library's own choice (the same selection code, priced with the cost model a
start-up calibration would measure there), and the network is a flow-level
model: messages share NICs and rack uplinks by max-min fairness, each pays
its latency, reductions cost what the CPU takes. The table is `cadence
bench`'s, from simulation.

  cadence sim --topology fat-tree.json --ranks 512 --op allreduce --algo all -b 8 -e 1G -f 4
  cadence sim --cluster tr --algo all -b 64K -e 64M -f 16
  cadence sim --topology topo.json --json sim.json
  cadence sim --topology spec.json --ranks 4096 -b 64K --records DIR --fault stop:5@1

--records DIR writes the dumps every rank would leave (for `cadence doctor
DIR`) when the fault `--fault` hits during `--calls` calls of one size (-b);
see cadence/cli/sim_records.py for the faults.

A spec is JSON (docs/simulator.md says every field); a topology file written by
`cadence topo profile` is one too. --cluster simulates an emulated cluster as
it is configured (hosts, NICs, rates, racks), with the costs `cadence sim
calibrate` measured on it when it has run:

  cadence sim calibrate --cluster tr [--ranks-per-host 2] [--output spec.json]

runs `cadence tune`'s calibration job on the cluster (ping-pong α and β over
TCP and shared memory, o from bursts of small sends, γ from a local
reduction) and writes the cluster's spec with those costs: the NIC rate is
what TCP got (1/β), the uplinks scaled alike, latency = α − o. By default it
goes beside the cluster's state (`cadence cluster down` removes it), where
`cadence sim --cluster` finds it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cadence.bench.common import DTYPES, OPS, layout, size_sweep
from cadence.cli import sim_records
from cadence.cli.launch import Measure, Outcome, Workload
from cadence.cli.options import _positive, add_sweep_arguments
from cadence.cli.report import build_table, json_records, print_rich, render_plain
from cadence.testbed.rates import payload_share
from cadence.units import fmt_mbytes, format_size, parse_size

NAME = "sim"
HELP = "simulate collectives on a modeled cluster (a spec, a topology file, --cluster)"

# Columns a simulation has nothing to put in: one time per size, exact data.
_NOT_SIMULATED = ("p99(us)", "#wrong")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", nargs="?", choices=["calibrate"],
        help="calibrate: measure the costs on --cluster and write its spec",
    )  # fmt: skip
    p.add_argument("--output", metavar="FILE", help="calibrate: where to write the spec")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--topology", metavar="SPEC", help="a cluster spec or topology file (JSON)")
    where.add_argument("--cluster", metavar="NAME", help="an emulated cluster, as configured")
    p.add_argument(
        "--ranks", type=_positive,
        help="ranks (a spec without `hosts`: hosts = ranks / ranks_per_host)",
    )  # fmt: skip
    p.add_argument(
        "--ranks-per-host", type=_positive, default=1, help="ranks per host with --cluster (1)"
    )
    p.add_argument("--op", choices=OPS, default="allreduce", help="collective (allreduce)")
    p.add_argument(
        "--dtype", choices=list(DTYPES), default="float32", help="element type (float32)"
    )
    add_sweep_arguments(p, stepfactor=4)
    # None: -e not given (64M), so --records can tell one size was asked for.
    p.set_defaults(maxbytes=None)
    p.add_argument(
        "--algo", metavar="ALGO[,ALGO...]", default="auto",
        help="algorithm(s), each its own column group: a name, a comma list, auto (the "
        "library's choice, the default) or all (auto and every algorithm that applies)",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write `cadence bench` records")
    p.add_argument(
        "--show-spec", action="store_true",
        help="print the spec --cluster builds (to edit and pass to --topology)",
    )  # fmt: skip
    p.add_argument(
        "--records", metavar="DIR",
        help="write the dumps every rank would leave (one size, -b), for `cadence doctor DIR`",
    )  # fmt: skip
    p.add_argument(
        "--fault", metavar="FAULT",
        help=f"with --records, inject one: {sim_records.FAULT_SYNTAX}",
    )  # fmt: skip
    p.add_argument(
        "--calls", type=_positive,
        help=f"with --records, calls every rank makes ({sim_records.DEFAULT_CALLS})",
    )  # fmt: skip


def calibrated_path(name: str) -> Path:
    """Where `cadence sim calibrate --cluster NAME` writes by default."""
    from cadence import testbed

    return testbed.cluster.cache_dir(name) / "sim-spec.json"


def cluster_spec(name: str, ranks_per_host: int) -> dict:
    """The spec of emulated cluster `name` as `cadence cluster up` made it,
    with the calibrated costs when `cadence sim calibrate` wrote them."""
    from cadence import testbed

    c = testbed.require(name)
    saved = calibrated_path(name)
    if saved.exists():
        spec = json.loads(saved.read_text())
        spec["ranks_per_host"] = ranks_per_host
        return spec
    # The shaper counts every frame's headers: TCP payload gets this share of a rate.
    share = payload_share(c.mtu)
    spec: dict = {
        "version": 1,
        "kind": "cadence-cluster",
        "note": f"emulated cluster {c.name}",
        "hosts": len(c.hosts),
        "ranks_per_host": ranks_per_host,
        "nic": {"count": c.nics, "rate": _payload_rate(c.rate_bits, share)},
        "shaper": shaper_of(c.rate_bits, c.mtu),
    }
    cores = os.cpu_count() or 1
    if len(c.hosts) * ranks_per_host > cores:
        # Every emulated host runs on this machine's cores.
        spec["cpu"] = {"shared_cores": float(cores)}
    if c.racks > 1 and c.uplink_bits:
        spec["fabric"] = {
            "kind": "racks",
            "rack_of": list(c.rack_of),
            "uplink": _payload_rate(c.uplink_bits * c.nics, share),
        }
    return spec


# What one TCP stream carried over an unshaped veth pair between two emulated
# hosts on the 2-core machine (`cadence cluster up --rate 100gbit`, then
# benchmarks/link_rate.py: 12.2 Gbit/s over 500 MB, 15.1 over 16 MB): the
# rate a shaped link passes while its bucket has credit.
UNSHAPED_PEAK = "1.5GB/s"


def shaper_of(rate_bits: int, mtu: int) -> dict:
    """The spec's `shaper` for links `cadence cluster` shaped at `rate_bits`:
    its shaper's bucket as seconds of the rate, passed at the unshaped peak."""
    from cadence.testbed.rates import Bucket

    burst = Bucket.for_rate(rate_bits, mtu).burst_bytes * 8 / rate_bits
    return {"burst_us": round(burst * 1e6, 3), "peak": UNSHAPED_PEAK}


def calls_for(model, nbytes: int) -> int:
    """Calls per simulated sample: on shaped links, the back-to-back calls of
    one `cadence bench` sample (what the buckets see), else one call."""
    from cadence.bench.worker import batch_calls

    return batch_calls(nbytes) if model.describe()["shaper"] else 1


def _payload_rate(bits: int, share: float) -> str:
    return f"{bits * share / 8e6:.3f}MB/s"


def _algos(text: str, op: str, available: list[str]) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if names == ["all"]:
        return ["auto", *available]
    unknown = [a for a in names if a != "auto" and a not in available]
    if unknown:
        raise ValueError(
            f"--algo {','.join(unknown)} does not apply to {op} here "
            f"(it has: {', '.join(available)})"
        )
    return names


def spec_from_calibration(
    spec: dict, measured: dict, rate_bits: int, bottleneck_bits: int | None = None
) -> dict:
    """`spec` (a cluster's, as configured) with the costs `measured` by
    `cadence tune`'s calibration job. TCP got `1/β` over a path whose
    configured bottleneck is `bottleneck_bits` (the NICs' `rate_bits`, or a
    rack uplink when the peer measured was in another rack): the NICs and
    uplinks are scaled by the share of it that TCP got. On shaped (emulated)
    links the ranks share the machine's `cores`, and the loaded ring step of
    `nranks` gives every message's floor cost on a busy machine; the same
    ring with bulk (`loaded_bulk`) gives what a byte between hosts costs
    those cores (`fit_stack_rate`)."""
    out = json.loads(json.dumps(spec))
    tcp, shm, gamma = measured.get("tcp"), measured.get("shm"), measured.get("gamma")
    count = spec["nic"]["count"]
    if tcp and spec.get("shaper"):
        # Shaped links keep their payload rate: a ping-pong's β over them
        # counts the bucket's credit (v: 4 MiB at 122.5 MB/s over a link
        # whose payload ceiling is 119.6), which the model has as such.
        o = tcp.get("overhead", 0.0)
        out["nic"]["latency_us"] = round(max(tcp["alpha"] - o, 0.0) * 1e6, 3)
        out["nic"]["overhead_us"] = round(o * 1e6, 3)
    elif tcp:
        got = 1.0 / tcp["beta"]  # bytes/s
        share = got * 8 / (bottleneck_bits or rate_bits * count)
        o = tcp.get("overhead", 0.0)
        out["nic"] = {
            "count": 1,
            "rate": f"{rate_bits * count * share / 8e6:.3f}MB/s",
            "latency_us": round(max(tcp["alpha"] - o, 0.0) * 1e6, 3),
            "overhead_us": round(o * 1e6, 3),
        }
        fabric = out.get("fabric")
        if fabric and fabric.get("kind") == "racks":
            bits = float(fabric["uplink"].removesuffix("bit"))
            fabric["uplink"] = f"{bits * share / 8e6:.3f}MB/s"
    if shm:
        o = shm.get("overhead", 0.0)
        out["shm"] = {
            "rate": fmt_mbytes(1.0 / shm["beta"]),
            "latency_us": round(max(shm["alpha"] - o, 0.0) * 1e6, 3),
            "overhead_us": round(o * 1e6, 3),
        }
    if gamma:
        out.setdefault("cpu", {})["reduce"] = fmt_mbytes(1.0 / gamma)
    loaded, cores = measured.get("loaded"), measured.get("cores")
    nranks = measured.get("nranks") or spec["hosts"] * spec.get("ranks_per_host", 1)
    if spec.get("shaper") and loaded and cores and nranks > cores:
        # An emulated cluster's ranks all run on this machine's cores, more
        # ranks than cores. In the loaded ring step every rank sent one
        # message: a message's share of the cores is the step's time over
        # the messages each core carried (a floor of what a message costs a
        # busy machine, whatever its transport). With a core per rank the
        # step is a message's latency, which α and o already are.
        step, call = loaded, 0.0
        steps, ar = nranks - 1, measured.get("loaded_allreduce")
        if ar:
            # The allgather's call is n-1 steps and the call's own work, the
            # allreduce's 2(n-1) steps and the same: a step is their
            # difference over n-1 steps (2 ar - loaded), the call what the
            # allgather's call has beyond its steps.
            per_step = 2 * ar - loaded
            if per_step > 0:
                step, call = per_step, max(steps * (loaded - per_step), 0.0)
        out.setdefault("cpu", {}).update(
            shared_cores=float(cores),
            loaded_overhead_us=round(step * cores / nranks * 1e6, 3),
        )
        if call > 0:
            # Every rank worked on the call on the same cores.
            out["cpu"]["call_overhead_us"] = round(call * cores / nranks * 1e6, 3)
        bulk = measured.get("loaded_bulk")
        rate = fit_stack_rate(out, bulk, nranks) if bulk else None
        if rate is not None:
            out["cpu"]["stack_rate"] = fmt_mbytes(rate)
    return out


STACK_RATES = (1e7, 1e11)  # bytes/s a core: the range the fit searches


def fit_stack_rate(spec: dict, bulk: dict, nranks: int) -> float | None:
    """What one shared core moves through the hosts' network stacks, such
    that the model (`spec`, with everything else calibrated) gives the
    loaded ring's bulk probe its measured time: the rate, bytes/s, or None
    where the model is as slow as the probe without it (the stacks cost
    nothing it can see). The model is slower the lower the rate, so a
    bisection (in log space) finds it."""
    import math

    from cadence import _core

    s = json.loads(json.dumps(spec))
    s["ranks_per_host"] = nranks // s["hosts"]
    per_rank, calls, measured = bulk["bytes_per_rank"], bulk["calls"], bulk["seconds"]

    def simulated(rate: float) -> float:
        s["cpu"]["stack_rate"] = f"{rate:.6g}B/s"
        model = _core.SimCluster(json.dumps(s), "calibration", None)
        return model.run("allgather", per_rank * nranks, 1, "ring", calls)[1]

    lo, hi = STACK_RATES
    if simulated(hi) >= measured:
        return None
    if simulated(lo) <= measured:
        return lo
    for _ in range(30):  # to 0.1 % of the rate
        mid = math.sqrt(lo * hi)
        if simulated(mid) > measured:
            lo = mid
        else:
            hi = mid
    return hi


def calibrate(args: argparse.Namespace) -> int:
    import tempfile
    from datetime import datetime

    from cadence import testbed
    from cadence.cli import tune

    if not args.cluster:
        print("cadence sim calibrate: needs --cluster NAME", file=sys.stderr)
        return 2
    try:
        cluster = testbed.require(args.cluster)
    except testbed.TestbedError as e:
        print(f"cadence sim calibrate: {e}", file=sys.stderr)
        return 2
    # Measure with at least 2 ranks per host, so shared memory is measured too.
    rph = max(args.ranks_per_host, 2)
    saved = calibrated_path(args.cluster)
    if saved.exists():
        saved.unlink()  # measure the cluster as configured, not an old spec
    base = cluster_spec(args.cluster, args.ranks_per_host)
    job = Workload(
        op="allreduce", dtype="float32", sizes=[8], nranks=len(cluster.hosts) * rph, iters=1,
        warmup=0, timeout=300.0, cluster=cluster, ranks_per_host=rph,
    )  # fmt: skip
    print(f"sim calibrate: measuring {cluster.name} ({len(cluster.hosts)} hosts x {rph}) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cadence-sim-") as tmp:
        try:
            calib = tune.calibrate(job, ["allreduce"], Path(tmp))
        except tune.TuneError as e:
            print(f"cadence sim calibrate: {e}", file=sys.stderr)
            return 1
    # The TCP peer the job measured (the first rank on another host): across
    # racks its path's bottleneck is the uplink.
    names = calib.get("hosts", [])
    index = {h.name: h.index for h in cluster.hosts}
    peer = next((h for h in names if h != names[0]), None) if names else None
    bottleneck = cluster.rate_bits * cluster.nics
    if peer in index and names[0] in index and cluster.racks > 1 and cluster.uplink_bits:
        if cluster.rack_of[index[peer]] != cluster.rack_of[index[names[0]]]:
            bottleneck = min(bottleneck, cluster.uplink_bits * cluster.nics)
    # The idle link figures (the simulator adds its own load), the core's γ.
    found = calib.get("measured", {})
    measured = {**found, **found.get("idle_link", {}), "nranks": calib.get("nranks"),
                "gamma": calib.get("model", {}).get("gamma")}  # fmt: skip
    spec = spec_from_calibration(base, measured, cluster.rate_bits, bottleneck)
    loaded, bulk = measured.get("loaded"), measured.get("loaded_bulk")
    if loaded and bulk:
        cpu = spec.get("cpu", {})
        print(f"sim calibrate: loaded ring step {loaded * 1e6:.1f} µs (8 B a rank; allreduce "
              f"{(measured.get('loaded_allreduce') or 0) * 1e6:.1f} µs); "
              f"{bulk['seconds'] * 1e6:.1f} µs a call with {bulk['bytes_per_rank']} B a rank "
              f"({bulk['calls']} calls a sample): a message {cpu.get('loaded_overhead_us')} µs "
              f"and a call {cpu.get('call_overhead_us', 0)} µs of the cores, stack rate "
              f"{cpu.get('stack_rate', 'not needed')}", file=sys.stderr)  # fmt: skip
    stamp = datetime.now().astimezone().isoformat(timespec="seconds")
    spec["note"] = f"emulated cluster {cluster.name}, calibrated {stamp}"
    out = Path(args.output) if args.output else saved
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(spec, indent=1) + "\n")
    print(json.dumps({k: spec[k] for k in ("nic", "shm", "cpu") if k in spec}))
    print(f"# sim calibrate: wrote {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    from cadence import _core

    if args.action == "calibrate":
        return calibrate(args)
    if not args.records and (args.fault or args.calls):
        print("cadence sim: --fault and --calls go with --records", file=sys.stderr)
        return 2
    try:
        # --records runs one size (-b); the sweep ends at 64M unless -e says.
        last = args.maxbytes if args.maxbytes is not None else parse_size("64M")
        sizes = size_sweep(args.minbytes, args.minbytes if args.records else last,
                           args.stepfactor)  # fmt: skip
    except ValueError as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    try:
        if args.cluster:
            spec = cluster_spec(args.cluster, args.ranks_per_host)
            if args.show_spec:
                print(json.dumps(spec, indent=1))
                return 0
            text, origin = json.dumps(spec), f"cluster {args.cluster}"
        else:
            if args.show_spec:
                print("cadence sim: --show-spec goes with --cluster", file=sys.stderr)
                return 2
            path = Path(args.topology)
            text, origin = path.read_text(), str(path)
        model = _core.SimCluster(text, origin, args.ranks)
    except (OSError, ValueError) as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # testbed.TestbedError: no such cluster
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2
    if args.records:
        return sim_records.run(model, args)
    try:
        algos = _algos(args.algo, args.op, model.algorithms(args.op))
    except ValueError as e:
        print(f"cadence sim: {e}", file=sys.stderr)
        return 2

    n = model.nranks
    itemsize = DTYPES[args.dtype].itemsize
    job = Workload(
        op=args.op, dtype=args.dtype, sizes=sizes, nranks=n, iters=1, warmup=0, timeout=0.0,
        algos=algos,
    )  # fmt: skip
    outcomes = [
        Outcome(backend="cadence", algo=a, label=f"sim:{a}" if len(algos) > 1 else "sim")
        for a in algos
    ]
    started = time.monotonic()
    for o in outcomes:
        t0 = time.monotonic()
        for size in sizes:
            lay = layout(args.op, size, itemsize, n)
            if lay is None:
                continue
            algo = None if o.algo == "auto" else o.algo
            try:
                chosen, secs, _messages = model.run(args.op, lay.count, itemsize, algo,
                                                    calls_for(model, lay.nbytes))  # fmt: skip
            except ValueError as e:
                o.error = str(e)
                break
            o.measures[size] = Measure(
                size=size, nbytes=lay.nbytes, count=lay.count, time_us=secs * 1e6, wrong=0,
                chosen=chosen,
            )  # fmt: skip
        o.seconds = time.monotonic() - t0
        print(f"# sim: {o.name} {len(o.measures)} sizes in {o.seconds:.1f} s", file=sys.stderr,
              flush=True)  # fmt: skip

    table = build_table(job, outcomes)
    keep = [i for i, c in enumerate(table.columns) if c.title not in _NOT_SIMULATED]
    table.columns = [table.columns[i] for i in keep]
    table.rows = [[row[i] for i in keep] for row in table.rows]
    table.notes = [x for x in table.notes if not x.startswith("#wrong")]
    desc = model.describe()
    nic = min(desc["nic_out"]) * 8 / 1e9
    table.notes.append(
        f"model: {desc['hosts']} hosts x {n // desc['hosts']} ranks, NIC {nic:g} Gbit/s, "
        f"{len(desc['group_out'])} group(s), ring order: {model.order}; "
        f"simulated in {time.monotonic() - started:.1f} s"
    )
    where = f"cluster {args.cluster}" if args.cluster else args.topology
    title = (
        f"cadence sim: {args.op} {args.dtype}, {n} ranks on {where}, "
        f"{format_size(sizes[0])}..{format_size(sizes[-1])} x{args.stepfactor}"
    )
    if sys.stdout.isatty():
        print_rich(table, title)
    else:
        print(f"# {title}\n{render_plain(table)}", flush=True)
    if args.json:
        records = json_records(job, outcomes)
        for rec in records:
            rec.pop("p99_us", None)
            for key in ("timing", "rank_time_us", "span_time_us"):
                rec.pop(key, None)
            rec.pop("wrong", None)
            rec["simulated"] = True
            rec["topology"] = where
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 1 if any(o.error for o in outcomes) else 0
