"""What every handler shares: Powertools utilities and the services, built once per cold start."""

from __future__ import annotations

import os
from functools import cache

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
)

from gpufleet.adapters.aws.runtime import aws_ports
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import (
    build_dispatcher,
    build_intake,
    build_lifecycle,
    build_reconciler,
)
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.reconciler import ReconcilerService
from gpufleet.settings import Settings

logger = Logger(service="gpufleet")
tracer = Tracer(service="gpufleet")
metrics = Metrics(namespace="GpuFleet", service="gpufleet")


@cache
def settings() -> Settings:
    return Settings.from_env(os.environ)


@cache
def intake() -> IntakeService:
    return build_intake(aws_ports(settings()))


@cache
def lifecycle() -> LifecycleService:
    return build_lifecycle(aws_ports(settings()), settings())


@cache
def dispatcher() -> DispatcherService:
    return build_dispatcher(aws_ports(settings()), settings(), lifecycle())


@cache
def reconciler() -> ReconcilerService:
    return build_reconciler(aws_ports(settings()), settings())


@cache
def idempotency_store() -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(table_name=settings().idempotency_table)


# A delivery is remembered for a day: S3 and EventBridge redeliver within minutes to hours.
IDEMPOTENCY = IdempotencyConfig(event_key_jmespath="delivery_key", expires_after_seconds=86400)
