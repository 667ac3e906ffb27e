"""`Job Queued` / `Capacity Freed` / a job's end (`Job Status Changed`) and the schedule -> one
admission pass."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, dispatcher, logger, metrics, tracer
from gpufleet.topology import (
    DETAIL_CAPACITY_FREED,
    DETAIL_JOB_QUEUED,
    DETAIL_JOB_STATUS_CHANGED,
)

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

# Events that say where to look; anything else (the schedule) asks for a full pass, which also
# catches whatever a lost event would have said.
_HINTS = frozenset({DETAIL_JOB_QUEUED, DETAIL_CAPACITY_FREED, DETAIL_JOB_STATUS_CHANGED})


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    result = dispatcher().run_pass(full=event.get("detail-type") not in _HINTS)
    count(telemetry.ADMITTED, len(result.admitted))
    count(telemetry.PREEMPTED, len(result.preempted))
    count(telemetry.BUDGET_BREACHES, len(result.over_budget))
    for waited in result.waited_seconds:
        count(telemetry.WAIT_SECONDS, waited)
    if result.state is not None:
        count(telemetry.RUNNING_JOBS, len(result.state.running))
        count(telemetry.GPUS_HELD, result.state.gpus_held)
        count(telemetry.COST_PER_HOUR, sum(r.job.hourly_usd for r in result.state.running))
        for priority, waiting in result.state.waiting.items():
            count(telemetry.QUEUE_DEPTH, waiting, {telemetry.PRIORITY: priority.value})
    logger.info("admission pass", extra={"admitted": result.admitted, "items": result.items_read})
    summary = asdict(result)
    summary["waiting"] = len(result.waiting)
    summary.pop("state")
    return summary
