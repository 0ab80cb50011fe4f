"""Command-line options that `cadence bench`, `cadence tune` and
`cadence sim` share, and what they resolve to."""

from __future__ import annotations

import argparse

from cadence import testbed
from cadence.units import parse_size

# argparse names a type function in its errors ("invalid _positive value:
# 'x'"): the names keep their underscore so those messages stay as they were.


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """--cluster and --ranks-per-host, as `cadence bench` and `cadence tune` take them."""
    p.add_argument("--cluster", metavar="NAME", help="run across this emulated cluster's hosts")
    p.add_argument(
        "--ranks-per-host", type=_positive, default=1, help="ranks per host with --cluster (1)"
    )


def add_sweep_arguments(p: argparse.ArgumentParser, *, stepfactor: int) -> None:
    """The size sweep and iteration counts (-b, -e, -f, -n, -w)."""
    p.add_argument("-b", "--minbytes", type=_size, default="8", help="smallest size (8)")
    p.add_argument("-e", "--maxbytes", type=_size, default="64M", help="largest size (64M)")
    p.add_argument(
        "-f", "--stepfactor", type=int, default=stepfactor,
        help=f"size multiplier per step ({stepfactor})",
    )  # fmt: skip
    p.add_argument(
        "-n", "--iters", type=_positive, default=20, help="timed iterations per size (20)"
    )
    p.add_argument(
        "-w", "--warmup-iters", type=int, default=5,
        help="warm-up iterations per size, each a batch of calls as a sample (5)",
    )


def resolve_ranks(args: argparse.Namespace):
    """(cluster or None, ranks) from --nranks, --cluster, --ranks-per-host;
    ValueError when they disagree."""
    if args.ranks_per_host != 1 and not args.cluster:
        raise ValueError("--ranks-per-host needs --cluster")
    if not args.cluster:
        return None, args.nranks or 2
    try:
        cluster = testbed.require(args.cluster)
    except testbed.TestbedError as e:
        raise ValueError(str(e)) from None
    nranks = len(cluster.hosts) * args.ranks_per_host
    if args.nranks not in (None, nranks):
        raise ValueError(f"--nranks {args.nranks} disagrees with cluster {cluster.name}: "
                         f"{len(cluster.hosts)} hosts x {args.ranks_per_host} ranks per host")
    return cluster, nranks
