"""EventBridge `Node Started` / `Node Finished` (source gpufleet.agent) -> lifecycle."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.handlers.models import NodeReportEvent
from gpufleet.services.lifecycle import NodeReport
from gpufleet.topology import DETAIL_NODE_STARTED


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@event_parser(model=NodeReportEvent)
def handler(event: NodeReportEvent, context: LambdaContext) -> dict[str, Any]:
    report = NodeReport.model_validate(event.detail)
    logger.append_keys(job_id=report.job_id, instance_id=report.instance_id)
    if event.detail_type == DETAIL_NODE_STARTED:
        lifecycle().node_started(report)
    else:
        lifecycle().node_finished(report)
    return {"job_id": report.job_id, "report": event.detail_type}
