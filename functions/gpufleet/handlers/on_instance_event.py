"""EC2 events on the default bus: spot interruption warnings, rebalance recommendations, and
instances stopping or terminating."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer
from gpufleet.handlers.payloads import InstanceEvent
from gpufleet.topology import DETAIL_STATE_CHANGE

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = InstanceEvent.model_validate(raw)
    instance_id = event.detail.instance_id
    logger.append_keys(instance_id=instance_id, event=event.detail_type)
    if event.detail_type == DETAIL_STATE_CHANGE:
        job_id = lifecycle().instance_gone(instance_id, event.detail.state or "gone")
    else:
        job_id = lifecycle().instance_interrupted(instance_id)
        if job_id is not None:
            count(telemetry.SPOT_INTERRUPTIONS)
    return {"instance_id": instance_id, "job_id": job_id}
