"""Workflow task (.waitForTaskToken): park the token until the node reports."""

from __future__ import annotations

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.handlers.common import lifecycle, logger, tracer
from gpufleet.handlers.models import AwaitNodeTask


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@event_parser(model=AwaitNodeTask)
def handler(task: AwaitNodeTask, context: LambdaContext) -> None:
    logger.append_keys(job_id=task.job_id)
    lifecycle().await_node(task.job_id, task.task_token)
