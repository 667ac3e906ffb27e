"""Wiring for the AWS runtime: boto3 clients and adapters from settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from gpufleet.adapters.aws.capacity_memory import DynamoCapacityMemory
from gpufleet.adapters.aws.clock import SystemClock
from gpufleet.adapters.aws.events import EventBridgePublisher
from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.adapters.aws.metric_data import CloudWatchMetricData
from gpufleet.adapters.aws.notifier import SnsNotifier
from gpufleet.adapters.aws.objects import S3ObjectStore
from gpufleet.adapters.aws.queue import DynamoJobQueue
from gpufleet.adapters.aws.warm_pool import DynamoWarmPool
from gpufleet.adapters.aws.workflow import StepFunctionsWorkflow
from gpufleet.ports import Ports
from gpufleet.settings import Settings

# Standard retry mode with a few attempts: throttled requests are retried by the SDK. What it
# does not retry, DynamoDB's cancelled transactions (for conflicts or throughput) and writes that
# meet a transaction (`TransactionConflictException`), the adapters retry
# (`transactions.Backoff`); everything else surfaces to the state machine's Retry/Catch.
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5)


# Where each client's session comes from: a new one per client (a boto3 session is not
# thread-safe; its clients are). The embedded account hands in its own (`use_sessions`).
_new_session: Callable[[], boto3.session.Session] = boto3.session.Session


def use_sessions(factory: Callable[[], boto3.session.Session]) -> Callable[[], None]:
    """Clients are made from `factory()`'s sessions from now on; returns what puts boto3's
    own back."""
    global _new_session
    previous, _new_session = _new_session, factory

    def undo() -> None:
        global _new_session
        _new_session = previous

    return undo


def new_session() -> boto3.session.Session:
    return _new_session()


def client(service: str, region: str) -> Any:
    return new_session().client(service, region_name=region, config=_CLIENT_CONFIG)


class Clients:
    """The boto3 clients of one set of ports: one per service, each built the first time an
    adapter calls it. A client costs tens of milliseconds to build, and most handlers use two or
    three of the services the ports cover: the others are never built in that process."""

    def __init__(self, region: str) -> None:
        self._region = region
        self._built: dict[str, Any] = {}

    def built(self, service: str) -> Any:
        if service not in self._built:
            self._built[service] = client(service, self._region)
        return self._built[service]

    def __call__(self, service: str) -> Any:
        return _LazyClient(self, service)


class _LazyClient:
    """Stands for a service's client until it is first called."""

    __slots__ = ("_clients", "_service")

    def __init__(self, clients: Clients, service: str) -> None:
        self._clients = clients
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._clients.built(self._service), name)


def ec2_fleet(settings: Settings, clients: Clients) -> Ec2Fleet:
    pool = settings.config.warm_pool
    warm_pool = None
    if pool is not None:
        warm_pool = DynamoWarmPool(clients("dynamodb"), settings.queue_table, pool, SystemClock())
    return Ec2Fleet(
        clients("ec2"),
        settings.launch_templates,
        settings.subnet_ids,
        warm_pool=warm_pool,
    )


def aws_ports(settings: Settings) -> Ports:
    """Every port on AWS, sharing one lazily built client per service."""
    clients = Clients(settings.region)
    return Ports(
        clock=SystemClock(),
        jobs=DynamoJobStore(clients("dynamodb"), settings.jobs_table),
        events=EventBridgePublisher(clients("events"), settings.event_bus_name),
        objects=S3ObjectStore(clients("s3"), settings.intake_bucket),
        workflow=StepFunctionsWorkflow(clients("stepfunctions"), settings.job_state_machine_arn),
        fleet=ec2_fleet(settings, clients),
        capacity=DynamoCapacityMemory(
            clients("dynamodb"), settings.capacity_table, settings.region
        ),
        queue=DynamoJobQueue(
            clients("dynamodb"), settings.queue_table, jobs_table=settings.jobs_table
        ),
        metrics=CloudWatchMetricData(clients("cloudwatch")),
        notifier=SnsNotifier(clients("sns"), settings.notify_topic_arn),
    )
