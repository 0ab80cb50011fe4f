"""HF `Trainer` steps over cadence and over gloo: the integration test's
worker (tests/integration_workers.py, the process group made first), timed.

    .venv/bin/python benchmarks/trainer_step.py --width 32 65536

For each model width (a two-layer MLP of 16 inputs, `width` hidden units:
about 18 × width parameters) and each round, one 2-rank job per backend,
`--epochs` epochs of the 64-sample set (4 steps an epoch); prints the time
per step of `Trainer.train()` on rank 0 and checks that both backends
logged the same losses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import integration_workers as iw  # noqa: E402
from test_integrations import _env, _ranked  # noqa: E402
from torch_launch import all_ok, spawn  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, nargs="+", default=[32, 65536])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print("| width | parameters | cadence ms/step | gloo ms/step | gloo/cadence |")
    print("|---|---|---|---|---|")
    for width in args.width:
        per_step: dict[str, list[float]] = {"cadence": [], "gloo": []}
        for _ in range(args.rounds):
            losses = {}
            for backend in per_step:
                out = all_ok(spawn(_ranked(iw.trainer_worker), 2, backend, args.epochs, width,
                                   env=_env(2), timeout=600))[0]
                per_step[backend].append(out["took"] / out["steps"])
                losses[backend] = out["losses"]
            assert losses["cadence"] == losses["gloo"], "the backends logged different losses"
        c, g = (statistics.median(per_step[b]) * 1e3 for b in ("cadence", "gloo"))
        print(f"| {width:,} | {18 * width + 1:,} | {c:.2f} | {g:.2f} | {g / c:.2f} |", flush=True)


if __name__ == "__main__":
    main()
