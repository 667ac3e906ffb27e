"""`Job Status Changed` (gpufleet.control-plane) -> the topics the job's team names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import logger, status_notifications, tracer
from gpufleet.handlers.payloads import StatusChanged

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from gpufleet.domain.notify import StatusChange

    change = StatusChange.model_validate(StatusChanged.model_validate(raw).detail)
    logger.append_keys(job_id=change.job_id, status=change.status)
    topics = status_notifications().status_changed(change)
    return {"job_id": change.job_id, "notified": len(topics)}
