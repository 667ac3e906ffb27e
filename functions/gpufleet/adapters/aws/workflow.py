"""The job lifecycle state machine on Step Functions."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.domain.history import execution_name, job_of_execution
from gpufleet.errors import TransientError
from gpufleet.ports import WorkflowRun, latest_run
from gpufleet.topology import execution_arn

# Errors that mean the task is no longer waiting: it finished, timed out, or was completed by a
# duplicate report. Completing it again is a harmless no-op.
_STALE_TOKEN_ERRORS = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})


class StepFunctionsWorkflow:
    def __init__(self, client: Any, state_machine_arn: str) -> None:
        self._client = client
        self._arn = state_machine_arn

    def start(self, job_id: str, state: Mapping[str, Any], continuation: int = 0) -> None:
        try:
            # The execution is named after the job (and its continuation): Step Functions
            # refuses a second execution of the same name (and answers a same-input retry with
            # the first), so a job can never run two lifecycles at once.
            self._client.start_execution(
                stateMachineArn=self._arn,
                name=execution_name(job_id, continuation),
                input=json.dumps(state),
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "ThrottlingException":  # past the SDK's retries
                raise TransientError(f"StartExecution was throttled: {exc}") from exc
            if code != "ExecutionAlreadyExists":
                raise

    def complete_task(self, token: str, output: Mapping[str, Any]) -> bool:
        return self._unless_stale(
            lambda: self._client.send_task_success(taskToken=token, output=json.dumps(output))
        )

    def heartbeat(self, token: str) -> bool:
        return self._unless_stale(lambda: self._client.send_task_heartbeat(taskToken=token))

    def running_jobs(self) -> frozenset[str]:
        pages = self._client.get_paginator("list_executions").paginate(
            stateMachineArn=self._arn, statusFilter="RUNNING"
        )
        return frozenset(
            job_of_execution(e["name"])[0] for page in pages for e in page["executions"]
        )

    def run_of(self, job_id: str) -> WorkflowRun | None:
        return latest_run(job_id, self._run_named)

    def _run_named(self, name: str) -> WorkflowRun | None:
        try:
            execution = self._client.describe_execution(executionArn=execution_arn(self._arn, name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
                return None
            raise
        stopped = execution.get("stopDate")
        return WorkflowRun(
            status=str(execution["status"]),
            stopped_at=stopped.timestamp() if stopped is not None else None,
            error=str(execution.get("error") or ""),
            cause=str(execution.get("cause") or ""),
        )

    @staticmethod
    def _unless_stale(call: Callable[[], object]) -> bool:
        try:
            call()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _STALE_TOKEN_ERRORS:
                return False
            raise
        return True
