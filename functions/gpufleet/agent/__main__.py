"""`python3 -m gpufleet.agent --bucket B --bus BUS --region R`, run by the instance's user data.

The exit status is the agent's, never the job's: 0 when the agent did its work, whatever the job
did (its outcome goes to the control plane in the finish report); 1 when the agent itself
failed (an exception: the network, an AWS API), which systemd restarts (the ledger keeps the
restarted agent from running the job again); 2 when it was started with bad arguments, which no
restart fixes.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

import boto3

from gpufleet.agent.aws import (
    AwsNodeSecrets,
    CloudWatchMetrics,
    EventBridgeReporter,
    Imds,
    NvidiaSmi,
    S3Manifests,
)
from gpufleet.agent.credentials import job_credentials
from gpufleet.agent.docker import ContainerLogs, DockerRuntime, docker_cli_environment
from gpufleet.agent.ledger import RunLedger
from gpufleet.agent.node import (
    DEFAULT_FINISH_RESENDS,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_USAGE_SECONDS,
    JobMetrics,
    NodeAgent,
)
from gpufleet.agent.prepare import SubprocessRunner, prepare
from gpufleet.agent.usage import UsageRecorder, UsageSampler
from gpufleet.topology import ENV_AGENT_LOG_GROUP

# systemd's StateDirectory=gpufleet: kept across restarts of the agent, gone with the instance.
DEFAULT_STATE_DIR = "/var/lib/gpufleet"
EXIT_BAD_ARGUMENTS = 2  # argparse's own status for a usage error


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpufleet-agent")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--bus", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--job-role", required=True, help="the role each job's session opens")
    parser.add_argument("--heartbeat-seconds", type=float, default=DEFAULT_HEARTBEAT_SECONDS)
    parser.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR))
    return parser.parse_args(argv)


def build_agent(args: argparse.Namespace) -> NodeAgent:
    session = boto3.session.Session(region_name=args.region)
    job_metrics = JobMetrics()
    identity = Imds()
    # The launch template's environment file names the stack's agent log group.
    log_group = os.environ.get(ENV_AGENT_LOG_GROUP)
    logs = ContainerLogs(log_group, args.region, identity.instance_id()) if log_group else None
    # A registry login must land where `docker create` looks: the CLI's own environment.
    runner = SubprocessRunner(docker_cli_environment(os.environ))
    secrets = AwsNodeSecrets(session.client)
    objects = S3Manifests(session.client("s3"), args.bucket)
    sampler = UsageSampler(SubprocessRunner(dict(os.environ)))
    return NodeAgent(
        identity=identity,
        manifests=objects,
        reporter=EventBridgeReporter(session.client("events"), args.bus),
        runtime=DockerRuntime(
            output=job_metrics.feed,
            logs=logs,
            preparation=functools.partial(prepare, runner=runner, aws=secrets),
            credentials=functools.partial(
                job_credentials, sts=session.client("sts"), role_arn=args.job_role
            ),
        ),
        heartbeat_seconds=args.heartbeat_seconds,
        gpu_probe=NvidiaSmi(),
        metrics=CloudWatchMetrics(session.client("cloudwatch")),
        job_metrics=job_metrics,
        ledger=RunLedger(args.state_dir),
        finish_resends=DEFAULT_FINISH_RESENDS,
        usage=functools.partial(
            UsageRecorder, sampler, objects, interval_seconds=DEFAULT_USAGE_SECONDS
        ),
    )


def main(argv: list[str] | None = None) -> int:
    agent = build_agent(_arguments(argv))
    agent.run()  # the job's outcome is in its finish report, not in our exit status
    return 0


if __name__ == "__main__":
    sys.exit(main())
