"""`Step Functions Execution Status Change` (aws.states: FAILED, TIMED_OUT, ABORTED) -> the
backstop ends the job the lifecycle left unsettled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import backstop, logger, settings, tracer
from gpufleet.handlers.payloads import ExecutionStatusChange

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The domain's code comes with the first event, as the services that use it do.
    from gpufleet.domain.history import job_of_execution
    from gpufleet.services.backstop import WorkflowEnd

    event = ExecutionStatusChange.model_validate(raw)
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
