"""Workflow task (.waitForTaskToken): admit the job as it arrives, or park it in the admission
queue."""

from __future__ import annotations

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet import telemetry
from gpufleet.domain.planning import LaunchPlan
from gpufleet.handlers.common import count, dispatcher, logger, metrics, tracer
from gpufleet.handlers.models import EnqueueTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=EnqueueTask)
def handler(task: EnqueueTask, context: LambdaContext) -> None:
    logger.append_keys(job_id=task.job_id)
    if dispatcher().enqueue(task.queued, task.task_token, LaunchPlan.model_validate(task.plan)):
        count(telemetry.ADMITTED)  # as a pass counts its admissions, with their wait
        count(telemetry.WAIT_SECONDS, 0.0)
