"""`CloudWatch Alarm State Change` (default bus) for a job's GPU alarms -> its policy."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.adapters.aws.alarms import HOT, IDLE, parse_alarm_name
from gpufleet.handlers.common import lifecycle, logger, metrics, tracer
from gpufleet.handlers.models import AlarmEvent


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=AlarmEvent)
def handler(event: AlarmEvent, context: LambdaContext) -> dict[str, Any]:
    parsed = parse_alarm_name(event.detail.alarmName)
    if parsed is None or event.detail.state.value != "ALARM":
        return {"ignored": event.detail.alarmName}
    job_id, kind = parsed
    logger.append_keys(job_id=job_id, alarm=kind)
    if kind == IDLE:
        flags = lifecycle().gpus_idle(job_id)
        metrics.add_metric(name="IdleJobs", unit="Count", value=1)
    elif kind == HOT:
        flags = lifecycle().gpus_hot(job_id)
        metrics.add_metric(name="OverheatedJobs", unit="Count", value=1)
    else:
        flags = []
    return {"job_id": job_id, "flags": flags}
