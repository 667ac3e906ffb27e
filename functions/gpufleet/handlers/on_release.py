"""Workflow task: terminate every instance of the job; say whether it goes back to the queue."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.handlers.models import RecordOutcomeTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@event_parser(model=RecordOutcomeTask)
def handler(task: RecordOutcomeTask, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=task.job_id)
    return lifecycle().release(task.job_id, task.state)
