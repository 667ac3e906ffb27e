"""`Job Queued` / `Capacity Freed` events and the schedule -> one admission pass."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import dispatcher, logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Any trigger means the same thing: look at the queue now. The event itself carries nothing
    # the pass needs, so it is not parsed.
    result = dispatcher().run_pass()
    metrics.add_metric(name="Admitted", unit="Count", value=len(result.admitted))
    metrics.add_metric(name="Preempted", unit="Count", value=len(result.preempted))
    logger.info("admission pass", extra={"admitted": result.admitted, "items": result.items_read})
    summary = asdict(result)
    summary["waiting"] = len(result.waiting)
    return summary
