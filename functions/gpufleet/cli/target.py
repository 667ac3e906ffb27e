"""Which gpufleet the CLI talks to.

`--stack NAME` reads a deployed stack's outputs (table names, bus, bucket, state machine, agent
log group). Without it, the CLI reads the same environment variables the functions get
(`JOBS_TABLE`, `QUEUE_TABLE`, ...): that is how it runs against the emulator (`gpufleet emulator`
prints them), or against a stack whose outputs you exported. `--endpoint-url URL` (or
`AWS_ENDPOINT_URL`) sends every AWS call to another endpoint, e.g. the emulator's. The policy
(quotas, windows, templates) comes from the local `gpufleet.yaml` (`--config`), the file the
stack was deployed with.
"""

from __future__ import annotations

import argparse
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet import topology
from gpufleet.cli.output import CliError, ErrorCode
from gpufleet.domain.config import FleetConfig, config_from_yaml, config_to_env
from gpufleet.settings import Settings

if TYPE_CHECKING:
    from gpufleet.domain.job import Job
    from gpufleet.ports import JobQueue, JobStore, Ports, UsageReader
    from gpufleet.services.lifecycle import LifecycleService

# botocore reads it whenever it builds a client (boto3 >= 1.28), for every service.
ENV_ENDPOINT_URL = "AWS_ENDPOINT_URL"


class TargetError(CliError):
    """No gpufleet to talk to: exit 2, with what is missing."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.NO_TARGET) -> None:
        super().__init__(message, code)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", help="a deployed gpufleet stack (default: the environment)")
    parser.add_argument(
        "--region", help="AWS region of the stack (default: $AWS_REGION, $AWS_DEFAULT_REGION)"
    )
    parser.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="send every AWS call here, e.g. the emulator's (default: $AWS_ENDPOINT_URL)",
    )
    parser.add_argument(
        "--config", default="gpufleet.yaml", help="policy file the stack uses (%(default)s)"
    )


def _stack_environment(stack: str, region: str | None) -> dict[str, str]:
    import boto3
    from botocore.exceptions import ClientError

    # No credentials, no region, no endpoint: the CLI's runner says so (gpufleet.cli.output).
    cloudformation = boto3.session.Session(region_name=region).client("cloudformation")
    try:
        described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        if exc.response["Error"].get("Code") != "ValidationError":  # access denied, throttled
            raise
        where = f" in {region}" if region else ""
        raise TargetError(
            f"stack {stack}{where}: {exc.response['Error']['Message']} (--stack names the "
            "stack cdk deploy created; --region its region)",
            ErrorCode.NOT_FOUND,
        ) from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    return {env: outputs[key] for key, env in topology.STACK_OUTPUTS.items() if key in outputs}


def _policy(path: str) -> FleetConfig:
    config_path = Path(path)
    if not config_path.exists():
        return FleetConfig()
    return config_from_yaml(config_path.read_text(encoding="utf-8"))


def _environment(args: argparse.Namespace) -> dict[str, str]:
    """The deployment variables of the target, as the functions would see them."""
    if args.endpoint_url:
        # The clients are built later, by the adapters, from the process environment: this is
        # the one setting every one of them (and the stack lookup) honours. One command is one
        # process, so nothing else sees it.
        os.environ[ENV_ENDPOINT_URL] = args.endpoint_url
    env = dict(os.environ)
    env[topology.ENV_CONFIG] = config_to_env(_policy(args.config))
    if not args.stack:
        _check_deployment(env)
    # The functions (and Settings) read AWS_REGION first, boto3 AWS_DEFAULT_REGION, then the
    # profile's: the CLI resolves it once, and never guesses one.
    region = args.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        import boto3

        region = boto3.session.Session().region_name
    if not region:
        raise TargetError(
            "no AWS region: give --region, export AWS_REGION, or set one in the profile"
        )
    env["AWS_REGION"] = region
    if args.stack:
        env.update(_stack_environment(args.stack, region))
        _check_deployment(env)
    return env


def _check_deployment(env: dict[str, str]) -> None:
    missing = [name for name in topology.COMMON_ENV if not env.get(name)]
    if missing:
        raise TargetError(
            "no gpufleet to talk to: give --stack NAME, or set " + ", ".join(sorted(missing))
        )


class Connection:
    """A resolved target: what the everyday commands work with. Only what a command uses is
    built (on first use): a boto3 client costs a tenth of a second or more to build, and these
    commands read one table, where all the ports take a second."""

    def __init__(self, settings: Settings, agent_log_group: str | None) -> None:
        self.settings = settings
        self.agent_log_group = agent_log_group

    @cached_property
    def jobs(self) -> JobStore:
        """The job store alone: all that status, list and cost read."""
        from gpufleet.adapters.aws.job_store import DynamoJobStore

        return DynamoJobStore(self.client("dynamodb"), self.settings.jobs_table)

    @cached_property
    def queue(self) -> JobQueue:
        """The admission queue alone, for a point read."""
        from gpufleet.adapters.aws.queue import DynamoJobQueue

        return DynamoJobQueue(self.client("dynamodb"), self.settings.queue_table)

    @cached_property
    def usage(self) -> UsageReader:
        """The nodes' usage documents of a job (runs/<job>/usage/ in the intake bucket)."""
        from gpufleet.adapters.aws.usage import S3UsageReader

        return S3UsageReader(self.client("s3"), self.settings.intake_bucket)

    def current_wait_seconds(self, job: Job) -> float | None:
        """How long a waiting job has been in the admission queue this time (the job's record
        counts a wait once it ends); None for a job that is not waiting there now."""
        import time

        from gpufleet.domain.job import JobStatus
        from gpufleet.services.lifecycle_base import queued_job

        if job.status is not JobStatus.QUEUED:
            return None
        entry = self.queue.waiting_entry(queued_job(job))
        return None if entry is None else max(0.0, time.time() - entry.queued_at)

    @cached_property
    def ports(self) -> Ports:
        """Every port, for the commands that act on the queue or a job's lifecycle."""
        from gpufleet.adapters.aws.runtime import aws_ports

        return aws_ports(self.settings)

    @cached_property
    def lifecycle(self) -> LifecycleService:
        from gpufleet.services.factory import build_lifecycle

        return build_lifecycle(self.ports, self.settings)

    def client(self, service: str) -> Any:
        """A boto3 client for what no port covers (uploading a spec, reading logs)."""
        from gpufleet.adapters.aws.runtime import client

        return client(service, self.settings.region)


def connect(args: argparse.Namespace) -> Connection:
    env = _environment(args)
    try:
        settings = Settings.from_env(env)
    except ValueError as exc:  # a variable set by hand that no deployment writes
        raise TargetError(
            f"not a gpufleet's variables: {exc} (give --stack NAME, or export what "
            "`gpufleet emulator` or the stack's outputs say)"
        ) from None
    return Connection(settings, env.get(topology.ENV_AGENT_LOG_GROUP) or None)
