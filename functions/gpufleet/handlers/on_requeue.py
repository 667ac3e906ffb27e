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
    plan = lifecycle().requeue(task.job_id)
    # A fresh state for the next run: the plan for the job as it now is (a resize, more GPU
    # memory), and launch attempts counted on, so that a new launch never reuses an earlier
    # one's idempotency token.
    return {
        "job_id": task.job_id,
        "plan": plan.model_dump(mode="json"),
        "launch": {"step": 0, "attempt": task.attempt},
    }
