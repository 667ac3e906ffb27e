"""Workflow task: terminate every instance of the job; then back to the queue, or the final
status and cost."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet import telemetry
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer
from gpufleet.handlers.models import ReleaseTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=ReleaseTask)
def handler(task: ReleaseTask, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=task.job_id)
    released = lifecycle().release(task.job_id, task.state)
    outcome = released.get("outcome")
    if outcome is not None:
        count(telemetry.JOBS_ENDED, dimensions={telemetry.STATUS: outcome["status"]})
        count(telemetry.JOB_COST, value=float(outcome.get("cost_usd") or 0.0))
    return {**released, "status": outcome["status"] if outcome else "QUEUED"}
