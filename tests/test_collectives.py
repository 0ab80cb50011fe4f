"""Every collective × dtype × op against numpy, on shared memory, TCP and a mix,
for rank counts that are and are not powers of two."""

import os

import pytest
from checks import (
    check_algorithms,
    check_direct_fold_order,
    check_matrix,
    check_matrix_single_copy,
    check_one_algorithm,
    check_random_floats,
    helped_copies,
    single_copies_of,
)
from harness import assert_all_ok, run_ranks

SMALL = [0, 1, 7, 4097]
ONE_MIB_ODD = (1 << 20) // 4 + 3  # float32 elements: ~1 MiB, odd
SIXTEEN_MIB = (16 << 20) // 4


def _run(check, n, transport, *args, timeout=600):
    res = assert_all_ok(run_ranks(check, n, transport=transport, args=args, timeout=timeout))
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_all_collectives(n, transport):
    """Every collective × dtype × op at 0, 1, 7, 4097 and ~1 MiB (an odd
    count); at 16 MiB (up to 4 ranks: memory and time on 2 cores) float32 sum,
    int32 max and the data-moving collectives."""
    big = (SIXTEEN_MIB,) if n <= 4 else ()
    _run(check_matrix, n, transport, SMALL + [ONE_MIB_ODD], None, big)


def test_mixed_hosts():
    """Two ranks per host: shared memory inside a host, TCP across."""
    _run(check_matrix, 6, "mixed", [0, 7, 4097], None, (ONE_MIB_ODD,))


@pytest.mark.parametrize("n,transport", [(3, "shm"), (4, "shm"), (3, "tcp"), (4, "tcp"),
                                         (4, "mixed"), (5, "mixed")])
def test_every_allreduce_algorithm(n, transport):
    _run(check_algorithms, n, transport, [0, 1, 7, 4097, 100003])


@pytest.mark.parametrize("n", [4, 6])
def test_pipelined_hierarchical_allreduce(n):
    """From 2 Mi elements hierarchical allreduce runs segments in a pipeline
    (local stages of one under the cross-host stage of another): 3 segments
    of odd length, 2 or 3 hosts of 2 ranks, in and out of place."""
    count = 3 * (1 << 20) + 7
    _run(check_one_algorithm, n, "mixed", "hierarchical", count,
         [("float32", "sum"), ("int32", "max")])


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_random_floats_identical_on_all_ranks(transport):
    _run(check_random_floats, 5, transport, 300007)


# Each launch forces one algorithm per collective, so that together they run
# every algorithm of every collective (allreduce has its own test above).
FORCED = [
    "allgather:ring;reduce_scatter:ring;broadcast:scatter_allgather;"
    "reduce:reduce_scatter_gather;alltoall:direct",
    "allgather:direct;reduce_scatter:direct;broadcast:binomial_tree;"
    "reduce:binomial_tree;alltoall:pairwise",
    "allgather:recursive_doubling;reduce:direct;broadcast:direct",
    "allgather:bruck;reduce_scatter:recursive_halving;broadcast:pipelined_chain;"
    "alltoall:bruck",
    "allgather:hierarchical;reduce_scatter:hierarchical",
]


@pytest.mark.parametrize("n,transport", [(3, "shm"), (5, "shm"), (3, "tcp"), (5, "tcp"),
                                         (4, "mixed")])
@pytest.mark.parametrize("forced", FORCED)
def test_every_algorithm_of_every_collective(n, transport, forced):
    res = assert_all_ok(run_ranks(
        check_matrix, n, transport=transport, env={"CADENCE_ALGO": forced},
        args=([0, 1, 7, 4097, 100003], ["float32", "int8", "bfloat16", "float64"], ()),
        timeout=600))
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


@pytest.mark.parametrize("transport", ["shm", "tcp", "mixed"])
def test_tiny_slots_and_many_streams(transport):
    """Messages much larger than a shared-memory frame (8 KiB frames, 4 in
    flight, 16 KiB of ring, so frames are cut to the room left and run past
    the ring's end; no single copy, so the ring carries everything) and
    striped over 3 TCP streams: chunking, ring wrap-around and stripe
    reassembly at every odd boundary."""
    res = assert_all_ok(run_ranks(
        check_matrix, 4, transport=transport,
        env={"CADENCE_SHM_FRAME_BYTES": "8K", "CADENCE_SHM_FRAMES": "4",
             "CADENCE_SHM_RING_BYTES": "16K", "CADENCE_SHM_CMA_MIN": "0",
             "CADENCE_NSTREAMS": "3"},
        args=([7, 4097, 300007], ["float32", "float16", "int64"], ()), timeout=600))
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


@pytest.mark.parametrize("transport", ["shm", "tcp", "mixed"])
def test_direct_folds_contributions_in_peer_order(transport):
    """5 ranks, 1.2 Mi float32 (each block ~15 TCP chunks, striped over 3
    streams; single copy on shared memory from 1 KiB): the owners' sums have
    the bits of peer order."""
    res = assert_all_ok(run_ranks(
        check_direct_fold_order, 5, transport=transport,
        env={"CADENCE_NSTREAMS": "3", "CADENCE_SHM_CMA_MIN": "1K"},
        args=(1_200_007,), timeout=600))
    failures = {r: f for r, f in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)


@pytest.mark.parametrize("n,transport", [(3, "shm"), (4, "mixed")])
@pytest.mark.parametrize("forced", [FORCED[0], FORCED[1], FORCED[3]])
def test_single_copy_under_every_algorithm(n, transport, forced):
    """Same-host messages from 1 KiB go by single copy (the receiver reads
    the sender's buffer, reducing on the way), at odd sizes, for reducing
    and moving collectives; results checked against numpy, and the links'
    counters prove the single-copy path ran."""
    env = {"CADENCE_ALGO": forced, "CADENCE_SHM_CMA_MIN": "1K"}
    res = assert_all_ok(run_ranks(
        check_matrix_single_copy, n, transport=transport, env=env,
        args=([4097, 100003], ["float32", "int8", "bfloat16"]), timeout=600))
    failures = {r: f for r, (f, _) in res.items() if f}
    assert not failures, "\n".join(f"rank {r}: {x}" for r, fs in failures.items() for x in fs)
    assert all(single > 0 for _, single in res.values()), res


@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "shm"), (4, "mixed")])
@pytest.mark.parametrize("op", ["broadcast", "allgather"])
def test_senders_help_large_single_copies(n, transport, op):
    """From 2 MiB a single-copy message goes in chunks that the receiver
    reads and the waiting sender writes into the receiver's memory,
    whichever claims each first: results checked against numpy at an odd
    size over several calls, and the links' counters prove senders wrote
    some of it. Receivers come late, so that a sender sleeps until its
    receiver's offer wakes it (without that wake-up the 2-rank broadcast's
    sender never helped; with it, a late call now and then still finds no
    help: a wake-up on this VM can take as long as the read, hence 8
    calls)."""
    res = assert_all_ok(run_ranks(helped_copies, n, transport=transport,
                                  args=(op, 3_000_007, 8), timeout=300))
    failures = {r: f for r, (f, _) in res.items() if f}
    assert not failures, (op, failures)
    assert sum(helped for _, helped in res.values()) > 0, res


@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("stream", [None, "none", "broadcast"])
def test_reduce_streams_where_ranks_have_cores(n, stream):
    """Reduce's messages (4 MiB a rank: even five ranks' blocks pass the
    256 KiB single-copy threshold) stream through shared memory by default,
    a 2-rank broadcast's (the binomial tree) when CADENCE_SHM_STREAM names
    it, allgather's never; with more than two ranks per core, or `none`,
    every one goes by single copy. Results checked against numpy."""
    count = 1 << 20
    streams = n <= 2 * len(os.sched_getaffinity(0))  # the cores the engine counts
    env = {} if stream is None else {"CADENCE_SHM_STREAM": stream}
    for op in ("reduce", "allgather") + (("broadcast",) if n == 2 else ()):
        res = assert_all_ok(run_ranks(single_copies_of, n, env=env, args=(op, count),
                                      timeout=120))
        failures = {r: f for r, (f, _) in res.items() if f}
        assert not failures, (op, failures)
        # The ranks that send whatever the algorithm: all but the root, the
        # broadcast's root alone.
        senders = [r for r in res if op == "allgather" or (r == 0) == (op == "broadcast")]
        single = sum(res[r][1] for r in senders)
        streamed = streams and op == (stream or "reduce")
        assert (single == 0) == streamed, (op, n, stream, {r: s for r, (_, s) in res.items()})
