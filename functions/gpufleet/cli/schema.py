"""`gpufleet schema`: print the JSON Schema of a job spec."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpufleet.domain.spec import json_schema


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "schema", help="print the JSON Schema of a job spec"
    )
    parser.set_defaults(run=run)


def run(_args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0
