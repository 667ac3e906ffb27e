"""`gpufleet`: the command line. Each sub-command lives in its own module with a `register`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpufleet.cli import (
    catalog,
    chaos,
    cost,
    demo,
    doctor,
    emulator,
    jobs,
    logs,
    plan,
    queue,
    schema,
    simulate,
    templates,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet", description="Run GPU training jobs on EC2, spot first."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        schema,
        plan,
        templates,
        jobs,
        logs,
        cost,
        catalog,
        queue,
        simulate,
        demo,
        chaos,
        emulator,
        doctor,
    ):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
