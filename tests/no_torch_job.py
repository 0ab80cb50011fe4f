"""`import cadence; cadence.init()` in an environment without torch: run by
`make test-no-torch` with the interpreter of a venv that has numpy only.

Starts WORLD processes of itself as ranks (MASTER_ADDR/MASTER_PORT/RANK/
WORLD_SIZE, as any launcher sets them, two emulated hosts), each of which
joins through cadence's own store, runs an allreduce and a split, and checks
the results against numpy. Exits non-zero on any failure."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

WORLD = 5


def rank_main() -> None:
    import cadence
    import numpy as np

    comm = cadence.init(timeout=60)
    assert "torch" not in sys.modules, "cadence imported torch"
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(1001)
    want = sum(np.random.default_rng(r).standard_normal(1001) for r in range(comm.size))
    comm.allreduce(x)
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12)
    sub = comm.split(comm.rank % 2)
    y = np.full(7, float(comm.rank), dtype=np.float32)
    sub.allreduce(y)
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    assert y[0] == sum(members), (y, members)
    print(f"rank {comm.rank}: ok", flush=True)


def main() -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        print("no_torch_job: torch is installed in this environment; run it in one without",
              file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(WORLD), CADENCE_HOST=f"h{r % 2}", NO_TORCH_RANK="1")
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timed out")
    if any(c != 0 for c in codes):
        print(f"no_torch_job: ranks exited with {codes}", file=sys.stderr)
        return 1
    print(f"no_torch_job: {WORLD} ranks ran without torch")
    return 0


if __name__ == "__main__":
    if os.environ.get("NO_TORCH_RANK"):
        rank_main()
    else:
        sys.exit(main())
