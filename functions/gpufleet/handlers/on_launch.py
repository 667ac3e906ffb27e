"""Workflow task (.waitForTaskToken): one CreateFleet attempt for one step of the plan; the
token then waits for the node's report of the run. Counts the instances a launch got (once: a
repeated step reports none) and the launch failures, by category."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet import telemetry
from gpufleet.handlers.common import count, lifecycle, logger, metrics, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from gpufleet.services.launch_steps import Launched


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    # The domain's models come with the first event, as the services that use them do.
    from gpufleet.domain.planning import LaunchPlan
    from gpufleet.handlers.models import LaunchTask

    task = LaunchTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    plan = LaunchPlan.model_validate(task.plan)
    failed = lifecycle().launch(
        task.job_id,
        plan,
        task.step,
        task.attempt,
        task.task_token,
        task.admission,
        task.tries,
        launched=count_launch,
    )
    if failed is not None:
        count(
            telemetry.LAUNCH_FAILURES,
            dimensions={
                telemetry.ERROR_CATEGORY: failed.category or telemetry.UNKNOWN_ERROR_CATEGORY
            },
        )


def count_launch(launched: Launched) -> None:
    count(
        telemetry.INSTANCES_LAUNCHED,
        launched.instances,
        {telemetry.CAPACITY_TYPE: launched.capacity_type.value},
    )
    if launched.ondemand_fallback:
        count(telemetry.ONDEMAND_FALLBACKS)
