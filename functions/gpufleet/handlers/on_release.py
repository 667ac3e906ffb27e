"""Workflow task: terminate every instance of the job; then back to the queue, or the final
status and cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The domain's models come with the first event, as the services that use them do.
    from gpufleet.handlers.models import ReleaseTask

    task = ReleaseTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    released = lifecycle().release(task.job_id, task.state)
    outcome = released.get("outcome")
    if outcome is not None:
        count(telemetry.JOBS_ENDED, dimensions={telemetry.STATUS: outcome["status"]})
        count(telemetry.JOB_COST, value=float(outcome.get("cost_usd") or 0.0))
    return {**released, "status": outcome["status"] if outcome else "QUEUED"}
