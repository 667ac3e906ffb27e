"""`Step Functions Execution Status Change` (aws.states: FAILED, TIMED_OUT, ABORTED) -> the
backstop ends the job the lifecycle left unsettled."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.history import job_of_execution
from gpufleet.handlers.common import backstop, logger, settings, tracer
from gpufleet.handlers.models import ExecutionStatusChange
from gpufleet.services.backstop import WorkflowEnd


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@event_parser(model=ExecutionStatusChange)
def handler(event: ExecutionStatusChange, context: LambdaContext) -> dict[str, Any]:
    detail = event.detail
    job_id, _ = job_of_execution(detail.name)  # `<job_id>-<n>` when the job continued
    logger.append_keys(job_id=job_id, status=detail.status)
    if detail.stateMachineArn != settings().job_state_machine_arn:
        return {"job_id": job_id, "ended": False}  # another state machine's execution
    end = WorkflowEnd(job_id, detail.status, detail.error or "", detail.cause or "")
    ended = backstop().workflow_ended(end)
    if ended is not None:
        logger.warning("ended a job its workflow left unsettled", extra={"outcome": ended})
    return {"job_id": job_id, "ended": ended is not None}
