"""`CloudWatch Alarm State Change` (default bus) for a job's metric alarms -> its action."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet import telemetry
from gpufleet.adapters.aws.alarms import parse_alarm_name
from gpufleet.domain.scaling import AlarmKind
from gpufleet.handlers.common import actions, count, logger, metrics, tracer
from gpufleet.handlers.models import AlarmEvent

_COUNTED = {AlarmKind.IDLE: telemetry.IDLE_JOBS, AlarmKind.HOT: telemetry.OVERHEATED_JOBS}


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=AlarmEvent)
def handler(event: AlarmEvent, context: LambdaContext) -> dict[str, Any]:
    parsed = parse_alarm_name(event.detail.alarmName)
    if parsed is None or event.detail.state.value != "ALARM":
        return {"ignored": event.detail.alarmName}
    job_id, kind = parsed
    logger.append_keys(job_id=job_id, alarm=kind.value)
    flags = actions().on_alarm(job_id, kind)
    if kind in _COUNTED:
        count(_COUNTED[kind])
    return {"job_id": job_id, "alarm": kind.value, "flags": flags}
