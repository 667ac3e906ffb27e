"""EventBridge `Job Submitted` (source gpufleet.team.<team>) -> intake."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import (
    count_submission,
    idempotency,
    intake,
    logger,
    metrics,
    once_per_delivery,
    tracer,
)
from gpufleet.handlers.payloads import Delivery, SubmittedEvent

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@once_per_delivery
def submit(delivery: Delivery) -> dict[str, Any]:
    from gpufleet.services.intake import describe

    outcome = intake().submit_event(
        delivery.document,
        delivery.delivery_key,
        delivery.source,
        delivery.event_source,
        delivery.account,
    )
    count_submission(outcome.accepted)
    return dict(describe(outcome))


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    idempotency().register_lambda_context(context)
    submitted = SubmittedEvent.model_validate(event)
    # The event id names the delivery: EventBridge keeps it across its own retries.
    delivery = Delivery(
        delivery_key=f"event:{submitted.id}",
        source=f"event:{submitted.id}",
        document=submitted.detail,
        event_source=submitted.source,
        account=submitted.account,
    )
    logger.append_keys(delivery=delivery.delivery_key)
    result: dict[str, Any] = submit(delivery=delivery)
    return result
