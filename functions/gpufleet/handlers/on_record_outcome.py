"""Workflow task: the job's final status and cost."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, metrics, tracer
from gpufleet.handlers.models import RecordOutcomeTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=RecordOutcomeTask)
def handler(task: RecordOutcomeTask, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=task.job_id)
    summary = lifecycle().record_outcome(task.job_id, task.state)
    metrics.add_metric(name=f"Jobs{summary['status'].title()}", unit="Count", value=1)
    return summary
