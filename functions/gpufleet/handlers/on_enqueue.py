"""Workflow task (.waitForTaskToken): admit the job as it arrives, or park it in the admission
queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, dispatcher, logger, metrics, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    # The domain's models come with the first event, as the services that use them do.
    from gpufleet.domain.planning import LaunchPlan
    from gpufleet.handlers.models import EnqueueTask

    task = EnqueueTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    if dispatcher().enqueue(task.queued, task.task_token, LaunchPlan.model_validate(task.plan)):
        count(telemetry.ADMITTED)  # as a pass counts its admissions, with their wait
        count(telemetry.WAIT_SECONDS, 0.0)
