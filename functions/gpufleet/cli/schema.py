"""`gpufleet schema`: print the JSON Schema of a job spec (JSON either way: `--json` is
accepted, as by every command, and changes nothing)."""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.cli.output import print_json
from gpufleet.domain.spec import json_schema


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "schema", help="print the JSON Schema of a job spec"
    )
    parser.set_defaults(run=run)


def run(_args: argparse.Namespace) -> int:
    print_json(json_schema())
    return 0
