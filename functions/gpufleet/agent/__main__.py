"""`python3 -m gpufleet.agent --bucket B --bus BUS --region R`, run by the instance's user data."""

from __future__ import annotations

import argparse
import os
import sys

import boto3

from gpufleet.agent.aws import CloudWatchMetrics, EventBridgeReporter, Imds, NvidiaSmi, S3Manifests
from gpufleet.agent.docker import ContainerLogs, DockerRuntime
from gpufleet.agent.node import DEFAULT_HEARTBEAT_SECONDS, JobMetrics, NodeAgent
from gpufleet.topology import ENV_AGENT_LOG_GROUP


def main() -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-agent")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--bus", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--heartbeat-seconds", type=float, default=DEFAULT_HEARTBEAT_SECONDS)
    args = parser.parse_args()
    session = boto3.session.Session(region_name=args.region)
    job_metrics = JobMetrics()
    identity = Imds()
    # The launch template's environment file names the stack's agent log group.
    log_group = os.environ.get(ENV_AGENT_LOG_GROUP)
    logs = ContainerLogs(log_group, args.region, identity.instance_id()) if log_group else None
    agent = NodeAgent(
        identity=identity,
        manifests=S3Manifests(session.client("s3"), args.bucket),
        reporter=EventBridgeReporter(session.client("events"), args.bus),
        runtime=DockerRuntime(output=job_metrics.feed, logs=logs),
        heartbeat_seconds=args.heartbeat_seconds,
        gpu_probe=NvidiaSmi(),
        metrics=CloudWatchMetrics(session.client("cloudwatch")),
        job_metrics=job_metrics,
    )
    outcome = agent.run()
    return 0 if outcome.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
