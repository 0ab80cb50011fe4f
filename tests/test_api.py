"""The Python face: asynchronous handles, ordering, split, argument errors,
torch tensors, records, and bootstrap from torchrun's environment."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from harness import assert_all_ok, run_ranks


def _async_in_order(comm):
    n = comm.size
    xs = [np.full(1000 + i, comm.rank + i, dtype=np.float64) for i in range(8)]
    works = [comm.allreduce(x, async_op=True) for x in xs]
    works.append(comm.allgather(np.array([comm.rank], dtype=np.int32), async_op=True))
    bad = []
    for i, w in enumerate(works[:-1]):
        res = w.wait(timeout=30)
        want = sum(r + i for r in range(n))
        if not (res is xs[i] and np.all(res == want)):
            bad.append(i)
    g = works[-1].wait()
    assert all(w.is_completed() for w in works)
    # A synchronous call after async ones still sees them done, in order.
    y = comm.allreduce(np.ones(3, dtype=np.float32))
    return {"bad": bad, "gather": g.reshape(-1).tolist(), "y": y.tolist()}


def test_async_operations_complete_in_issue_order():
    res = assert_all_ok(run_ranks(_async_in_order, 3))
    for v in res.values():
        assert v["bad"] == [], v
        assert v["gather"] == [0, 1, 2]
        assert v["y"] == [3.0, 3.0, 3.0]


def _wait_timeout(comm):
    if comm.rank == 0:
        w = comm.allreduce(np.ones(4, dtype=np.float32), async_op=True)
        try:
            w.wait(timeout=0.2)
            early = "completed"
        except TimeoutError:
            early = "timeout"
        done_before = w.is_completed()
        comm.barrier(async_op=True).wait()  # rank 1 joins late
        w.wait()
        return [early, done_before]
    import time

    time.sleep(1.0)
    comm.allreduce(np.ones(4, dtype=np.float32))
    comm.barrier()
    return None


def test_wait_with_timeout_and_is_completed():
    res = assert_all_ok(run_ranks(_wait_timeout, 2))
    assert res[0] == ["timeout", False]


def _split(comm):
    sub = comm.split(color=comm.rank % 2, key=-comm.rank)
    x = np.array([comm.rank], dtype=np.int64)
    sub.allreduce(x)
    none = comm.split(color=-1 if comm.rank == 0 else 0)
    return {"sub_rank": sub.rank, "sub_size": sub.size, "sum": int(x[0]),
            "none": none is None, "local": (comm.local_rank, comm.local_size)}


def test_split():
    res = assert_all_ok(run_ranks(_split, 5, transport="mixed"))
    evens, odds = [0, 2, 4], [1, 3]
    for r, v in res.items():
        group = evens if r % 2 == 0 else odds
        assert v["sub_size"] == len(group)
        assert v["sub_rank"] == sorted(group, key=lambda q: -q).index(r)  # key orders
        assert v["sum"] == sum(group)
        assert v["none"] == (r == 0)
        assert v["local"] == ((r % 2, 2) if r < 4 else (0, 1))  # two ranks per host


def _split_keys(comm):
    sub = comm.split(color=comm.rank % 2)
    sub.allreduce(np.ones(3))
    store = comm._store
    diag = ("round", "slow")
    return {"world": [store.check([f"{comm._prefix}/diag/{k}"]) for k in diag],
            "split": [store.check([f"{sub._prefix}/diag/{k}"]) for k in diag]}


def test_a_split_makes_no_store_round_trip():
    # The world's watchdog reads its counters from the store (a job before
    # may have left some under its name); a split's name carries its
    # parent's id, new with every job, so it has none to read.
    res = assert_all_ok(run_ranks(_split_keys, 3))
    for v in res.values():
        assert v == {"world": [True, True], "split": [False, False]}, v


def _bad_args(comm):
    errs = []

    def expect(exc, fn):
        try:
            fn()
            errs.append(f"no error from {fn}")
        except exc as e:
            errs.append(type(e).__name__ + ": " + str(e))

    x = np.ones(10, dtype=np.float32)
    expect(ValueError, lambda: comm.allreduce(x, out=np.ones(9, dtype=np.float32)))
    expect(ValueError, lambda: comm.allreduce(x, out=np.ones(10, dtype=np.float64)))
    expect(ValueError, lambda: comm.allreduce(np.ones(10, dtype=np.int32), op="premul_sum",
                                              factor=2.0))
    expect(ValueError, lambda: comm.allreduce(x, op="median"))
    expect(ValueError, lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 1]))
    expect(ValueError, lambda: comm.allreduce(np.ones(4, dtype=np.uint64)))
    expect(TypeError, lambda: comm.allreduce([1.0, 2.0]))
    expect(ValueError, lambda: comm.broadcast(x, root=comm.size))
    expect(ValueError, lambda: comm.allreduce(x, algo="quantum"))
    ro = np.ones(10, dtype=np.float32)
    ro.flags.writeable = False
    expect(ValueError, lambda: comm.allreduce(ro))
    # The communicator still works after local argument errors.
    comm.allreduce(x)
    return {"errs": errs, "x": x.tolist()}


def test_argument_errors_are_clear_and_local():
    res = assert_all_ok(run_ranks(_bad_args, 2))
    errs = res[0]["errs"]
    assert all(not e.startswith("no error") for e in errs), errs
    assert "output has 9 elements, expected 10" in errs[0]
    assert "float32" in errs[1] and "float64" in errs[1]
    assert "premul_sum" in errs[2]
    assert "median" in errs[3]
    assert "contiguous" in errs[4]
    assert "uint64" in errs[5] or "format" in errs[5]
    assert res[0]["x"] == [2.0] * 10


def _torch_tensors(comm):
    import torch

    out = {}
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        t = torch.full((3, 5), comm.rank + 1, dtype=dt)
        comm.allreduce(t)
        out[str(dt)] = t.float().tolist()
    g = comm.allgather(torch.arange(3, dtype=torch.bfloat16) + comm.rank)
    out["gather_type"] = str(type(g).__name__) + "/" + str(g.dtype)
    out["gather"] = g.float().tolist()
    p = torch.ones(4, requires_grad=True)
    with torch.no_grad():
        comm.allreduce(p.data)
    out["param"] = p.detach().tolist()
    # A view that starts inside its storage: the data at its own offset.
    big = torch.arange(8, dtype=torch.int32)
    comm.allreduce(big[3:6])
    out["view"] = big.tolist()
    empty = torch.zeros(0, dtype=torch.float64)
    comm.allreduce(empty)
    out["empty"] = empty.tolist()
    errs = []
    for bad in (torch.ones(4, 4)[:, 1], torch.ones(3, dtype=torch.bool),
                torch.ones(3, dtype=torch.complex64)):
        try:
            comm.allreduce(bad)
            errs.append("no error")
        except (TypeError, ValueError) as e:
            errs.append(str(e))
    out["errs"] = errs
    return out


def test_torch_tensors_every_dtype():
    res = assert_all_ok(run_ranks(_torch_tensors, 2))
    for v in res.values():
        for dt in ("torch.float32", "torch.bfloat16", "torch.float16", "torch.int64",
                   "torch.uint8"):
            assert v[dt] == [[3.0] * 5] * 3, (dt, v[dt])
        assert v["gather_type"] == "Tensor/torch.bfloat16"
        assert v["gather"] == [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]
        assert v["param"] == [2.0] * 4
        assert v["view"] == [0, 1, 2, 6, 8, 10, 6, 7]
        assert v["empty"] == []
        contiguous, boolean, complex_ = v["errs"]
        assert "contiguous" in contiguous, contiguous
        assert "bool" in boolean, boolean
        assert "unsupported" in complex_, complex_


def _records(comm):
    comm.allreduce(np.ones(256, dtype=np.float32), algo="ring")
    comm.allgather(np.ones(3, dtype=np.int8))
    return comm.dump_records()


def test_records_have_every_field():
    res = assert_all_ok(run_ranks(_records, 2, transport="tcp"))
    rec = res[1]
    ops = rec["ops"]
    ar = [o for o in ops if o["collective"] == "allreduce"][-1]
    for k in ("comm_id", "seq", "algo", "dtype", "count", "bytes", "enqueue_ns", "start_ns",
              "end_ns", "status"):
        assert k in ar
    assert ar["algo"] == "ring" and ar["count"] == 256 and ar["bytes"] == 1024
    assert ar["status"] == "ok" and ar["end_ns"] >= ar["start_ns"] >= ar["enqueue_ns"]
    assert ops[-1]["collective"] == "allgather" and ops[-1]["seq"] == ar["seq"] + 1
    link = rec["links"][0]
    assert link["transport"] == "tcp" and link["bytes_sent"] > 0 and link["bytes_recv"] > 0


def test_init_from_torchrun_environment(tmp_path):
    """`cadence.init()` with nothing but torchrun's variables (and
    CADENCE_DEBUG=TRACE, whose lines it checks)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, cadence
        comm = cadence.init()
        x = np.array([comm.rank + 1.0])
        comm.allreduce(x)
        print(f"rank {comm.rank} of {comm.size}: {x[0]}", flush=True)
    """))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(3):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE="3", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="3", CADENCE_TIMEOUT="30",
                   CADENCE_DEBUG="TRACE")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, o in enumerate(outs):
        assert f"rank {r} of 3: 6.0" in o, o
        # CADENCE_DEBUG=TRACE: the algorithm choice and one record per operation.
        assert f"cadence rank {r} INFO: allreduce of 1 x float64 over 3 ranks" in o, o
        assert f'cadence rank {r} TRACE {{"seq":' in o and '"collective":"allreduce"' in o, o


def test_info_prints_the_selection_table_and_each_choice_once(tmp_path):
    """CADENCE_DEBUG=INFO with CADENCE_ALGO size ranges: rank 0 prints the
    table in force at creation and every distinct choice once, with why."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, cadence
        comm = cadence.init()
        for _ in range(3):
            comm.allreduce(np.ones(16, dtype=np.float64))      # 128 B: range 0-8K
            comm.allreduce(np.ones(2048, dtype=np.float32))    # 8 KiB: range 0-8K
            comm.allreduce(np.ones(1025, dtype=np.float64))    # 8200 B: range 8193-64K
            comm.allreduce(np.ones(16385, dtype=np.float32))   # 64 KiB + 4: default
            comm.broadcast(np.ones(1000, dtype=np.float32))    # 4000 B: default
        print(f"rank {comm.rank} done", flush=True)
    """))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", CADENCE_TIMEOUT="30",
                   CADENCE_DEBUG="INFO",
                   CADENCE_ALGO="allreduce:recursive_doubling:0-8K;ring:8193-64K;^scatter_allgather")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, o in enumerate(outs):
        assert f"rank {r} done" in o, o
    o0, o1 = outs
    p = "cadence rank 0 INFO: "
    lines = o0.splitlines()
    for want in [
        p + "algorithm selection over 2 ranks",
        p + "CADENCE_ALGO allreduce forced: "
            "allreduce:recursive_doubling:0-8K;allreduce:ring:8193-64K",
        p + "CADENCE_ALGO excludes scatter_allgather everywhere",
        p + "default allreduce: recursive_doubling:0-32767,direct:32K-1M,ring:1048577-max",
        p + "default broadcast: binomial_tree:0-max",
    ]:
        assert sum(line.startswith(want) for line in lines) == 1, (want, o0)
    rd = "forced by CADENCE_ALGO range allreduce:recursive_doubling:0-8K"
    ring = "forced by CADENCE_ALGO range allreduce:ring:8193-64K"
    for want in [
        f"chose recursive_doubling for allreduce of 128 bytes over 2 ranks: {rd}",
        f"chose recursive_doubling for allreduce of 8192 bytes over 2 ranks: {rd}",
        f"chose ring for allreduce of 8200 bytes over 2 ranks: {ring}",
        "chose direct for allreduce of 65540 bytes over 2 ranks: default",
        "chose binomial_tree for broadcast of 4000 bytes over 2 ranks: default",
    ]:
        # Once, although each call is made three times.
        assert lines.count(p + want) == 1, (want, o0)
    chose = [line for line in lines if " INFO: chose " in line]
    assert len(chose) == len(set(chose)), o0
    # Rank 1 prints neither the table nor the choices (but still its schedules).
    assert " INFO: chose " not in o1 and "default allreduce" not in o1, o1
    assert "cadence rank 1 INFO: allreduce of 16 x float64 over 2 ranks" in o1, o1


@pytest.mark.parametrize("bad", ["CADENCE_ALGO=allreduce:bogus", "CADENCE_TIMEOUT=soon"])
def test_bad_configuration_is_an_error(bad):
    name, value = bad.split("=")
    res = run_ranks(_records, 2, env={name: value}, timeout=60)
    for r in range(2):
        assert res[r][0] == "err" and name in res[r][1], res[r]
