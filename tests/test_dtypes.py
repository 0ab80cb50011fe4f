"""One list of element types (cadence._dtypes): the others derive from it."""

from __future__ import annotations

from cadence import _core, _dtypes, reference
from cadence.bench.common import DTYPES as BENCH_DTYPES


def test_names_are_the_cores():
    assert _dtypes.NAMES == _core.DTYPES
    assert "bfloat16" in _dtypes.NAMES and "float32" in _dtypes.NAMES
    assert _dtypes.FLOATS + _dtypes.INTS == _dtypes.NAMES
    assert _dtypes.FLOATS == ("float16", "bfloat16", "float32", "float64")


def test_the_other_lists_derive_from_it():
    assert reference.DTYPES == list(_dtypes.NAMES)
    assert reference.FLOATS + reference.INTS == reference.DTYPES
    # `--dtype` lists float32, the default, first.
    assert list(BENCH_DTYPES) == ["float32", *(n for n in _dtypes.NAMES if n != "float32")]
    assert all(BENCH_DTYPES[n].name == n for n in BENCH_DTYPES)
