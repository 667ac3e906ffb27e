"""EventBridge `Node Started|Heartbeat|Finished` (source gpufleet.agent) -> lifecycle."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import envelopes, event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.services.lifecycle import NodeReport


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@event_parser(model=NodeReport, envelope=envelopes.EventBridgeEnvelope)
def handler(report: NodeReport, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=report.job_id, instance_id=report.instance_id)
    lifecycle().node_report(report)
    return {"job_id": report.job_id, "phase": report.phase}
