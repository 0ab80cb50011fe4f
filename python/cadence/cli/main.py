"""The `cadence` command: one subcommand per module.

A subcommand module provides NAME, HELP, add_arguments(parser) and
run(args) -> exit status. Adding `topo` or `sim`
means writing such a module and listing it in COMMANDS.
"""

from __future__ import annotations

import argparse
import os
import sys

from cadence.cli import bench, cluster, doctor, planner, sim, soak, topo, tune

COMMANDS = (bench, tune, cluster, soak, doctor, topo, sim, planner)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadence",
        description="cadence: a collective communication library that measures, "
        "diagnoses and fuses.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, for notes
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("cadence: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `cadence cluster status | head`: the reader left; say nothing more.
        # Point stdout at /dev/null so the interpreter's final flush does not
        # raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
