"""Wiring for the AWS runtime: boto3 clients and adapters from settings."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from gpufleet.adapters.aws.alarms import CloudWatchAlarms
from gpufleet.adapters.aws.capacity_memory import DynamoCapacityMemory
from gpufleet.adapters.aws.clock import SystemClock
from gpufleet.adapters.aws.events import EventBridgePublisher
from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.adapters.aws.notifier import SnsNotifier
from gpufleet.adapters.aws.objects import S3ObjectStore
from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.aws.warm_pool import DynamoWarmPool
from gpufleet.adapters.aws.workflow import StepFunctionsWorkflow
from gpufleet.domain.catalog import load_bundled
from gpufleet.ports import Ports
from gpufleet.settings import Settings

# Standard retry mode with a few attempts: throttling is retried by the SDK, everything else
# surfaces to the state machine's Retry/Catch.
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5)


def client(service: str, region: str) -> Any:
    return boto3.session.Session().client(service, region_name=region, config=_CLIENT_CONFIG)


def ec2_fleet(settings: Settings) -> Ec2Fleet:
    region = settings.region
    pool = settings.config.warm_pool
    warm_pool = None
    if pool is not None:
        warm_pool = DynamoWarmPool(
            client("dynamodb", region), settings.queue_table, pool, SystemClock()
        )
    return Ec2Fleet(
        client("ec2", region),
        settings.launch_template_id,
        settings.subnet_ids,
        efa_launch_template_id=settings.efa_launch_template_id,
        efa_types=frozenset(t.name for t in load_bundled().instance_types() if t.efa),
        warm_pool=warm_pool,
    )


def aws_ports(settings: Settings) -> Ports:
    region = settings.region
    jobs = DynamoJobStore(client("dynamodb", region), settings.jobs_table)
    return Ports(
        clock=SystemClock(),
        jobs=jobs,
        events=EventBridgePublisher(client("events", region), settings.event_bus_name),
        objects=S3ObjectStore(client("s3", region), settings.intake_bucket),
        workflow=StepFunctionsWorkflow(
            client("stepfunctions", region), settings.job_state_machine_arn
        ),
        fleet=ec2_fleet(settings),
        capacity=DynamoCapacityMemory(client("dynamodb", region), settings.capacity_table, region),
        queue=DynamoJobQueue(
            client("dynamodb", region), settings.queue_table, jobs_table=settings.jobs_table
        ),
        alarms=CloudWatchAlarms(client("cloudwatch", region)),
        notifier=SnsNotifier(client("sns", region), settings.notify_topic_arn),
    )
