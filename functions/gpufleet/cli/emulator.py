"""`gpufleet emulator`: the embedded AWS account as a local endpoint, until Ctrl-C.

    gpufleet emulator [--port 5000] [--env-file PATH] [--config gpufleet.yaml] [--cors ORIGIN]
                      [--scenario events/demo-scenario.json] [--json]

It prints the variables to export (endpoint, credentials, table names, bucket, bus, state
machine, agent log group, and this start's token for moto's control endpoints); `--env-file`
also writes them to a file (`NAME=value` lines) only its owner can read. Every `gpufleet`
command, the AWS CLI and boto3 then talk to it. It listens on 127.0.0.1 unless told otherwise,
answers no web page unless `--cors` names its origin, and refuses `/moto-api/...` (reset,
configuration) without the token. `--scenario` sets how long each job (by name) "trains" and the
exit code its container ends with, as `events/demo-scenario.json` does for the demo; without it
every job runs a few seconds and exits 0. With `--json` the endpoint and the variables are one
JSON object on stdout. A port in use is an error (exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpufleet.cli.output import CliError, ErrorCode, invalid, print_json


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "emulator", help="serve the embedded AWS account on a local endpoint, until Ctrl-C"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (%(default)s; its AWS APIs take any credentials)",
    )
    parser.add_argument("--port", type=int, default=5000, help="0: any free port (%(default)s)")
    parser.add_argument("--env-file", metavar="PATH", help="also write the variables here")
    parser.add_argument(
        "--config",
        default="gpufleet.yaml",
        help="policy file (%(default)s; the repository's when it does not exist)",
    )
    parser.add_argument(
        "--cors",
        metavar="ORIGIN",
        help="the one web origin (e.g. http://localhost:3000) that may call it from a browser; "
        "by default none may",
    )
    parser.add_argument(
        "--scenario",
        metavar="PATH",
        help="how jobs behave, by name: run time and exit code (the format of "
        "events/demo-scenario.json); default: every job runs a few seconds and exits 0",
    )
    parser.set_defaults(run=run)


def _stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    # Imported here: the emulator pulls in moto, which the other commands do not need.
    from gpufleet.domain.config import ConfigFileError, config_from_yaml
    from gpufleet.emulator.private import is_origin
    from gpufleet.emulator.server import STACK_NAME, PortTaken, serve

    if args.cors is not None and not is_origin(args.cors):
        raise invalid(f"--cors takes one origin, scheme://host[:port]: not {args.cors!r}")
    config_path = Path(args.config)
    try:
        config = (
            config_from_yaml(config_path.read_text(encoding="utf-8"))
            if config_path.exists()
            else None
        )
    except ConfigFileError as exc:
        raise CliError(f"{args.config}: {exc}", ErrorCode.INVALID_CONFIG) from None
    nodes = _scenario(args.scenario) if args.scenario else None
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with serve(args.host, args.port, config, nodes, cors_origin=args.cors) as emulator:
            variables = emulator.environment()
            if args.env_file:
                _write_atomically(
                    Path(args.env_file),
                    "".join(f"{k}={shlex.quote(v)}\n" for k, v in variables.items()),
                )
            if args.json:
                print_json(
                    {"endpoint_url": emulator.endpoint_url, "stack": STACK_NAME, "env": variables}
                )
            else:
                print(f"gpufleet emulator on {emulator.endpoint_url} (Ctrl-C stops it)")
                print("# export these, then use gpufleet (or --stack " + STACK_NAME + "):")
                for name, value in variables.items():
                    print(f"export {name}={shlex.quote(value)}")
            sys.stdout.flush()
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    except PortTaken as exc:
        raise CliError(f"cannot serve: {exc.strerror}", details={"port": exc.port}) from None
    except OSError as exc:  # an address this machine does not have, a port it may not use
        raise CliError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


if TYPE_CHECKING:
    from gpufleet.emulator.nodes import NodeScenario


def _scenario(path: str) -> NodeScenario:
    from gpufleet.emulator.demo import nodes_from_config

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        return nodes_from_config(document)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", ErrorCode.NOT_FOUND) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise invalid(f"{path} is not a scenario like events/demo-scenario.json: {exc}") from None


def _write_atomically(path: Path, text: str) -> None:
    """Whoever waits for the file never reads half of it, and only its owner can read it (it
    holds the emulator's token)."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), 0o600)  # an older partial file may have had other bits
        file.write(text)
    os.replace(partial, path)
