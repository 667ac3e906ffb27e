"""What every handler shares: Powertools utilities and the services, built once per cold start.

Each handler builds only the services it calls, on its first event, over one set of ports
(`ports`) whose boto3 clients are built when first used. The service modules are imported by
the builders, not here: a function imports the code it runs and no other handler's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from gpufleet import telemetry

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
    )

    from gpufleet.ports import Ports
    from gpufleet.services.backstop import BackstopService
    from gpufleet.services.dispatcher import DispatcherService
    from gpufleet.services.intake import IntakeService
    from gpufleet.services.lifecycle import LifecycleService
    from gpufleet.services.metric_watch import MetricWatch
    from gpufleet.services.notifications import StatusNotifications
    from gpufleet.services.reconciler import ReconcilerService
    from gpufleet.settings import Settings

logger = Logger(service=telemetry.SERVICE)
# Only the AWS SDK's calls are traced: patching every library X-Ray supports imports them all
# (requests, httplib, ...) at every cold start, for calls the functions never make.
tracer = Tracer(service=telemetry.SERVICE, patch_modules=("botocore",))
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
        alone.add_dimension(name=telemetry.SERVICE_DIMENSION, value=telemetry.SERVICE)
        for name, dimension_value in dimensions.items():
            alone.add_dimension(name=name, value=dimension_value)


def count_submission(accepted: bool) -> None:
    """One spec through intake, from either intake function: a job, or a rejection."""
    count(telemetry.JOBS_ACCEPTED if accepted else telemetry.JOBS_REJECTED)


@cache
def settings() -> Settings:
    # Imported here, as the services are: the settings bring the fleet config's models, which
    # a handler needs once its first event reads them, not to be imported.
    from gpufleet.settings import Settings

    return Settings.from_env(os.environ)


@cache
def ports() -> Ports:
    """The one set of ports of this process, shared by every service it builds."""
    from gpufleet.adapters.aws.runtime import aws_ports

    return aws_ports(settings())


@cache
def intake() -> IntakeService:
    from gpufleet.services.factory import build_intake

    return build_intake(ports(), settings(), lifecycle())


@cache
def lifecycle() -> LifecycleService:
    from gpufleet.services.factory import build_lifecycle

    return build_lifecycle(ports(), settings())


@cache
def dispatcher() -> DispatcherService:
    from gpufleet.services.factory import build_dispatcher

    return build_dispatcher(ports(), settings(), lifecycle())


@cache
def metric_watch() -> MetricWatch:
    from gpufleet.services.factory import build_metric_watch

    return build_metric_watch(ports(), settings(), lifecycle())


@cache
def reconciler() -> ReconcilerService:
    from gpufleet.services.factory import build_reconciler

    return build_reconciler(ports(), settings(), lifecycle())


@cache
def backstop() -> BackstopService:
    from gpufleet.services.factory import build_backstop

    return build_backstop(ports(), lifecycle())


@cache
def status_notifications() -> StatusNotifications:
    from gpufleet.services.factory import build_status_notifications

    return build_status_notifications(ports(), settings())


# The idempotency utility is imported by the first delivery that needs it: the functions that
# do not take deliveries never import it.
@cache
def idempotency_store() -> DynamoDBPersistenceLayer:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    return DynamoDBPersistenceLayer(table_name=settings().idempotency_table)


@cache
def idempotency() -> IdempotencyConfig:
    """A delivery is remembered for a day: S3 and EventBridge redeliver within minutes to
    hours. One config per process: it holds the invocation's context, for the records' expiry."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    return IdempotencyConfig(event_key_jmespath="delivery_key", expires_after_seconds=86400)


Answer = Callable[..., dict[str, Any]]


def once_per_delivery(submit: Answer) -> Answer:
    """`submit(delivery=...)` runs once per delivery key (`idempotency()`); a repeated delivery gets
    the first one's answer. The persistence layer, and its DynamoDB client, is built by the
    first delivery, not when the handler module is imported (a decorator built at import would
    build it at every cold start, before the handler runs). The records are keyed by `submit`'s
    own module and name."""

    @functools.wraps(submit)
    def guarded(*, delivery: Any) -> dict[str, Any]:
        from aws_lambda_powertools.utilities.idempotency import idempotent_function

        idempotent = idempotent_function(
            data_keyword_argument="delivery",
            persistence_store=idempotency_store(),
            config=idempotency(),
        )
        answer: dict[str, Any] = idempotent(submit)(delivery=delivery)
        return answer

    return guarded
