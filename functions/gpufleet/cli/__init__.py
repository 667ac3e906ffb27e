"""`gpufleet`: the command line. Each sub-command lives in its own module with a `register`;
every one of them keeps the output contract of `gpufleet.cli.output` (docs/cli.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata

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
    review,
    run,
    schema,
    simulate,
    templates,
    usage_page,
)
from gpufleet.cli.output import CliError, Parser, report, run_command

# In the order `gpufleet --help` lists them.
COMMANDS = (
    schema,
    plan,
    templates,
    jobs,
    usage_page,
    review,
    run,
    logs,
    cost,
    catalog,
    queue,
    simulate,
    demo,
    chaos,
    emulator,
    doctor,
)


def version() -> str:
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(
        prog="gpufleet",
        description="Run GPU training jobs on EC2, spot first.",
        epilog="Every command takes --json and --debug; exit codes: 0 ok, 2 refused or not "
        "found, 1 unexpected (docs/cli.md).",
        common_flags=False,
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(arguments)
    except CliError as exc:  # a usage error: before the command's own --json is known
        return report(exc, as_json="--json" in arguments)
    except SystemExit as exc:  # --help, --version: printed, and done
        return int(exc.code or 0)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
