"""Schedule (every minute) -> every running job's metrics against its alarms, and their actions."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, logger, metric_watch, metrics, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The schedule's event carries nothing the pass needs. The domain's code comes with the
    # first event, as the service that uses it does.
    from gpufleet.domain.scaling import AlarmKind
    from gpufleet.services.metric_watch import fired_count

    result = metric_watch().run()
    counted = {AlarmKind.IDLE: telemetry.IDLE_JOBS, AlarmKind.HOT: telemetry.OVERHEATED_JOBS}
    for kind, metric in counted.items():
        count(metric, fired_count(result, kind))
    if result.fired:
        logger.info("metric alarms acted", extra={"fired": result.fired})
    return asdict(result)
