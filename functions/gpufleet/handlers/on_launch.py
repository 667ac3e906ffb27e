"""Workflow task (.waitForTaskToken): one CreateFleet attempt for one step of the plan; the
token then waits for the node's report of the run."""

from __future__ import annotations

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet import telemetry
from gpufleet.domain.planning import LaunchPlan
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer
from gpufleet.handlers.models import LaunchTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@event_parser(model=LaunchTask)
def handler(task: LaunchTask, context: LambdaContext) -> None:
    logger.append_keys(job_id=task.job_id)
    plan = LaunchPlan.model_validate(task.plan)
    failed = lifecycle().launch(
        task.job_id, plan, task.step, task.attempt, task.task_token, task.admission, task.tries
    )
    if failed is not None:
        count(
            telemetry.LAUNCH_FAILURES,
            dimensions={
                telemetry.ERROR_CATEGORY: failed.category or telemetry.UNKNOWN_ERROR_CATEGORY
            },
        )
