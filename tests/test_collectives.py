"""Every collective × dtype × op against numpy, on shared memory, TCP and a mix,
for rank counts that are and are not powers of two."""

import pytest
from checks import check_algorithms, check_matrix, check_random_floats
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
    big = (ONE_MIB_ODD,) if n > 4 else (ONE_MIB_ODD, SIXTEEN_MIB)
    _run(check_matrix, n, transport, SMALL, None, big)


def test_mixed_hosts():
    """Two ranks per host: shared memory inside a host, TCP across."""
    _run(check_matrix, 6, "mixed", [0, 7, 4097], None, (ONE_MIB_ODD,))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [3, 4])
def test_every_allreduce_algorithm(n, transport):
    _run(check_algorithms, n, transport, [0, 1, 7, 4097, 100003])


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_random_floats_identical_on_all_ranks(transport):
    _run(check_random_floats, 5, transport, 300007)
