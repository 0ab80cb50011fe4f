"""The collectives' numpy references moved to cadence.reference; this name
stays for the code that imports them from here."""

from cadence.reference import (  # noqa: F401 - their old home
    DTYPES,
    FACTOR,
    FLOATS,
    INTS,
    OPS,
    allgather,
    alltoall,
    compare,
    empty_user,
    from_user,
    gen,
    np_dtype,
    ops_for,
    reduce_scatter,
    reference,
    scatter,
    split_counts,
    to_user,
)
