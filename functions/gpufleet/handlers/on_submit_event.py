"""EventBridge `Job Submitted` (source gpufleet) -> intake."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import (
    IDEMPOTENCY,
    count_submission,
    intake,
    logger,
    metrics,
    once_per_delivery,
    tracer,
)
from gpufleet.handlers.models import Delivery, SubmittedEvent
from gpufleet.services.intake import describe


@once_per_delivery
def submit(delivery: Delivery) -> dict[str, Any]:
    outcome = intake().submit_document(delivery.document, delivery.delivery_key, delivery.source)
    count_submission(outcome.accepted)
    return dict(describe(outcome))


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    IDEMPOTENCY.register_lambda_context(context)
    submitted = parse(event=event, model=SubmittedEvent)
    # The event id names the delivery: EventBridge keeps it across its own retries.
    delivery = Delivery(
        delivery_key=f"event:{submitted.id}",
        source=f"event:{submitted.id}",
        document=submitted.detail,
    )
    logger.append_keys(delivery=delivery.delivery_key)
    result: dict[str, Any] = submit(delivery=delivery)
    return result
