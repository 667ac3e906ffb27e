"""What every handler shares: Powertools utilities and the services, built once per cold start."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
)

from gpufleet import telemetry
from gpufleet.adapters.aws.runtime import aws_ports
from gpufleet.services.actions import MetricActions
from gpufleet.services.backstop import BackstopService
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import (
    build_actions,
    build_backstop,
    build_dispatcher,
    build_intake,
    build_lifecycle,
    build_reconciler,
)
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.reconciler import ReconcilerService
from gpufleet.settings import Settings

logger = Logger(service=telemetry.SERVICE)
tracer = Tracer(service=telemetry.SERVICE)
metrics = Metrics(namespace=telemetry.NAMESPACE, service=telemetry.SERVICE)


def count(
    metric: telemetry.Metric, value: float = 1.0, dimensions: Mapping[str, str] | None = None
) -> None:
    """Publish one of the control plane's metrics (gpufleet.telemetry). A metric with
    dimensions of its own goes out alone, so they do not attach to the handler's others."""
    if not dimensions:
        metrics.add_metric(name=metric.name, unit=metric.unit, value=value)
        return
    with single_metric(
        name=metric.name, unit=MetricUnit(metric.unit), value=value, namespace=telemetry.NAMESPACE
    ) as alone:
        alone.add_dimension(name="service", value=telemetry.SERVICE)
        for name, dimension_value in dimensions.items():
            alone.add_dimension(name=name, value=dimension_value)


@cache
def settings() -> Settings:
    return Settings.from_env(os.environ)


@cache
def intake() -> IntakeService:
    return build_intake(aws_ports(settings()), settings(), lifecycle())


@cache
def lifecycle() -> LifecycleService:
    return build_lifecycle(aws_ports(settings()), settings())


@cache
def dispatcher() -> DispatcherService:
    return build_dispatcher(aws_ports(settings()), settings(), lifecycle())


@cache
def actions() -> MetricActions:
    return build_actions(aws_ports(settings()), settings(), lifecycle())


@cache
def reconciler() -> ReconcilerService:
    return build_reconciler(aws_ports(settings()), settings(), lifecycle())


@cache
def backstop() -> BackstopService:
    return build_backstop(aws_ports(settings()), lifecycle())


@cache
def idempotency_store() -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(table_name=settings().idempotency_table)


# A delivery is remembered for a day: S3 and EventBridge redeliver within minutes to hours.
IDEMPOTENCY = IdempotencyConfig(event_key_jmespath="delivery_key", expires_after_seconds=86400)
