"""EC2's "Capacity Block Reservation Expiration Warning" (default bus) -> the block's runs
checkpoint and go back to the queue now, ahead of the reconciler's scheduled drain."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import lifecycle, logger, metrics, tracer
from gpufleet.handlers.payloads import BlockExpirationWarning

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = BlockExpirationWarning.model_validate(raw)
    reservation_id = event.detail.capacity_reservation_id
    logger.append_keys(reservation_id=reservation_id)
    drained = lifecycle().block_warned(reservation_id, event.detail.end_date.timestamp())
    logger.info("runs on an ending Capacity Block asked to checkpoint", extra={"jobs": drained})
    return {"reservation_id": reservation_id, "drained": drained}
