"""Workflow task: a checkpointed job goes back to the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.handlers.payloads import RequeueTask

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = RequeueTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    # The attempt that launched the last run is spent: the next launch counts on from it.
    return lifecycle().requeue_input(task.job_id, task.attempt + 1, task.cycles, task.execution)
