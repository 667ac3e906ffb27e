"""EventBridge `Node Started|Heartbeat|Finished` (source gpufleet.agent) -> lifecycle.

A report that cannot be heard (malformed, for a job that does not exist, from an instance the
job does not hold) is logged, counted and dropped: it returns normally, so Lambda does not
retry it, and costs one invocation.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import ValidationError, parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet import telemetry
from gpufleet.domain.job import DroppedReport
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer
from gpufleet.services.run_reports import NodeReport

# What of a refused report goes in the log: where it is wrong, never what it says (a forged
# report can be large, and is not ours to store).
_LOGGED_PROBLEMS = 5


class NodeReportEvent(EventBridgeModel):
    """A `Node ...` event whose detail is a node report."""

    detail: NodeReport


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        report = parse(event=event, model=NodeReportEvent).detail
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)[:_LOGGED_PROBLEMS]
        ]
        return _dropped(DroppedReport.INVALID, problems=problems)
    logger.append_keys(job_id=report.job_id, instance_id=report.instance_id)
    dropped = lifecycle().node_report(report)
    if dropped is not None:
        return _dropped(dropped, phase=report.phase)
    return {"job_id": report.job_id, "phase": report.phase}


def _dropped(problem: DroppedReport, **details: Any) -> dict[str, Any]:
    logger.warning("node report dropped", extra={"problem": problem.value, **details})
    count(telemetry.NODE_REPORTS_DROPPED, dimensions={telemetry.REPORT_PROBLEM: problem.value})
    return {"dropped": problem.value}
