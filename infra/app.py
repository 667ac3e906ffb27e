"""CDK app entry point: `python infra/app.py [-c key=value ...]` or `cdk synth/deploy`.

Run directly, it reads the context defaults from cdk.json itself (the CDK CLI passes them when it
runs the app) and writes the cloud assembly to ./cdk.out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, Python puts infra/ first on sys.path, where infra/constructs would shadow the
# `constructs` library. Put the repository (for `infra`) and functions/ (for `gpufleet`) instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
for _path in (str(ROOT / "functions"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import aws_cdk as cdk  # noqa: E402

from gpufleet.domain.config import ConfigFileError, config_from_yaml  # noqa: E402
from infra.config import ConfigError, GpuFleetConfig  # noqa: E402
from infra.constructs.code import code_source  # noqa: E402
from infra.stack import GpuFleetStack  # noqa: E402


def cdk_json_context(path: Path = ROOT / "cdk.json") -> dict[str, Any]:
    if not path.exists():
        return {}
    context = json.loads(path.read_text(encoding="utf-8")).get("context", {})
    return dict(context)


def build_app(
    context: Mapping[str, Any] | None = None, outdir: str | None = None
) -> tuple[cdk.App, GpuFleetStack]:
    """The app and its one stack. Context given here sits under CLI context (CDK_CONTEXT_JSON)."""
    merged = {**cdk_json_context(), **(context or {})}
    app_kwargs: dict[str, Any] = {"context": merged}
    if outdir is not None:
        app_kwargs["outdir"] = outdir
    elif "CDK_OUTDIR" not in os.environ:
        app_kwargs["outdir"] = str(ROOT / "cdk.out")
    app = cdk.App(**app_kwargs)
    GpuFleetConfig.check_keys(app.node.get_all_context())  # cdk.json's and every -c key=value
    config = GpuFleetConfig.from_context(app.node.try_get_context)
    code = code_source(config.lambda_asset, ROOT)
    config_path = Path(config.config_file)
    if not config_path.is_absolute():
        config_path = ROOT / config_path
    try:
        fleet_config = config_from_yaml(config_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config_file {config_path}: {exc.strerror}") from None
    except ConfigFileError as exc:
        raise ConfigError(f"config_file {config_path}: {exc}") from None
    # Environment-agnostic: account and region come from the deploy's credentials.
    stack = GpuFleetStack(
        app,
        config.stack_name,
        config=config,
        fleet_config=fleet_config,
        code=code,
        description="gpufleet: serverless control plane for GPU training jobs on EC2",
    )
    return app, stack


def _parse_args(argv: Sequence[str]) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "-c", "--context", action="append", default=[], metavar="KEY=VALUE", help="context value"
    )
    args = parser.parse_args(argv)
    context: dict[str, str] = {}
    for item in args.context:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"context {item!r} is not KEY=VALUE")
        context[key] = value
    return context


def main(argv: Sequence[str] | None = None) -> int:
    try:
        app, stack = build_app(_parse_args(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"gpufleet: bad context: {exc}", file=sys.stderr)
        return 2
    assembly = app.synth()
    print(f"synthesized {stack.stack_name} into {assembly.directory}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
