"""Workflow task: one CreateFleet attempt for one step of the plan."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.planning import LaunchPlan
from gpufleet.handlers.common import lifecycle, logger, metrics, tracer
from gpufleet.handlers.models import LaunchTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=LaunchTask)
def handler(task: LaunchTask, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(job_id=task.job_id)
    plan = LaunchPlan.model_validate(task.plan)
    result = lifecycle().launch(task.job_id, plan, task.step, task.attempt)
    metrics.add_metric(
        name="Launched" if result.launched else "LaunchFailures", unit="Count", value=1
    )
    return result.model_dump()
