"""Schedule -> terminate instances that no live job holds; end the runs and jobs whose events
were lost."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, logger, metrics, reconciler, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The schedule's event carries nothing the pass needs.
    result = reconciler().run()
    count(telemetry.ORPHANS_TERMINATED, len(result.terminated))
    if result.terminated:
        logger.warning("terminated orphaned instances", extra={"instances": result.terminated})
    if result.runs_ended or result.jobs_ended:
        # Each one is an event that never arrived: worth a look when it happens often.
        logger.warning(
            "ended what lost events left behind",
            extra={"runs": result.runs_ended, "jobs": result.jobs_ended},
        )
    if result.reservation_drains:
        logger.info(
            "runs on an ending reservation asked to checkpoint",
            extra={"jobs": result.reservation_drains},
        )
    return asdict(result)
