"""Workflow task: a checkpointed job goes back to the queue."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.handlers.models import RequeueTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@event_parser(model=RequeueTask)
def handler(task: RequeueTask, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=task.job_id)
    # The attempt that launched the last run is spent: the next launch counts on from it.
    return lifecycle().requeue_input(task.job_id, task.attempt + 1, task.cycles, task.execution)
