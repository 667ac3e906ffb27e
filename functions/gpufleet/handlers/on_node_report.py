"""EventBridge `Node Started|Heartbeat|Finished` (source gpufleet.agent) -> lifecycle.

A report is heard only when its node agent signed it with the key of its job's current run
(`domain/node_reports.py`), checked before anything else is read or changed. A report that
cannot be heard (malformed, unsigned or wrongly signed, for a job that does not exist, from
an instance the job does not hold) is logged, counted and dropped: it returns normally, so
Lambda does not retry it, and costs one invocation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpufleet import telemetry
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from gpufleet.domain.job import DroppedReport

# What of a refused report goes in the log: where it is wrong, never what it says (a forged
# report can be large, and is not ours to store).
_LOGGED_PROBLEMS = 5


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The domain's models come with the first event, as the services that use them do.
    from gpufleet.domain.job import DroppedReport
    from gpufleet.domain.node_reports import ReportNotAuthentic
    from gpufleet.handlers.models import NodeReportEvent

    try:
        report = NodeReportEvent.model_validate(event).detail
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)[:_LOGGED_PROBLEMS]
        ]
        return _dropped(DroppedReport.INVALID, problems=problems)
    logger.append_keys(job_id=report.job_id, instance_id=report.instance_id)
    try:
        lifecycle().authenticate(report, event["detail"])
    except ReportNotAuthentic as refused:
        return _dropped(DroppedReport(refused.problem), phase=report.phase)
    dropped = lifecycle().node_report(report)
    if dropped is not None:
        return _dropped(dropped, phase=report.phase)
    return {"job_id": report.job_id, "phase": report.phase}


def _dropped(problem: DroppedReport, **details: Any) -> dict[str, Any]:
    logger.warning("node report dropped", extra={"problem": problem.value, **details})
    count(telemetry.NODE_REPORTS_DROPPED, dimensions={telemetry.REPORT_PROBLEM: problem.value})
    return {"dropped": problem.value}
