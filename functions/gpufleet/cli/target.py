"""Which gpufleet the CLI talks to.

`--stack NAME` reads a deployed stack's outputs (table names, bus, bucket, state machine).
Without it, the CLI reads the same environment variables the functions get (`JOBS_TABLE`,
`QUEUE_TABLE`, ...): that is how it runs against the embedded account in tests, or against a
stack whose outputs you exported. The policy (quotas, windows) comes from the local
`gpufleet.yaml` (`--config`), the file the stack was deployed with.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gpufleet import topology
from gpufleet.domain.config import FleetConfig, config_from_yaml, config_to_env
from gpufleet.settings import Settings

# Stack output -> the environment variable the functions read.
_OUTPUTS = {
    **{f"{t.construct_id}Name": t.env_var for t in topology.TABLES},
    "EventBusName": topology.ENV_EVENT_BUS,
    "IntakeBucketName": topology.ENV_INTAKE_BUCKET,
    f"{topology.JOB_LIFECYCLE.construct_id}Arn": topology.ENV_STATE_MACHINE,
    "LaunchTemplateId": topology.ENV_LAUNCH_TEMPLATE,
}


class TargetError(Exception):
    pass


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", help="a deployed gpufleet stack (default: the environment)")
    parser.add_argument("--region", help="AWS region of the stack")
    parser.add_argument(
        "--config", default="gpufleet.yaml", help="policy file the stack uses (%(default)s)"
    )


def _stack_environment(stack: str, region: str | None) -> dict[str, str]:
    import boto3

    cloudformation = boto3.session.Session(region_name=region).client("cloudformation")
    described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    return {env: outputs[key] for key, env in _OUTPUTS.items() if key in outputs}


def _policy(path: str) -> FleetConfig:
    config_path = Path(path)
    if not config_path.exists():
        return FleetConfig()
    return config_from_yaml(config_path.read_text(encoding="utf-8"))


def resolve(args: argparse.Namespace) -> Settings:
    env: dict[str, Any] = dict(os.environ)
    if args.region:
        env["AWS_REGION"] = args.region
    if args.stack:
        env.update(_stack_environment(args.stack, args.region))
    env[topology.ENV_CONFIG] = config_to_env(_policy(args.config))
    missing = [name for name in topology.COMMON_ENV if not env.get(name)]
    if missing:
        raise TargetError(
            "no gpufleet to talk to: give --stack NAME, or set " + ", ".join(sorted(missing))
        )
    return Settings.from_env(env)
