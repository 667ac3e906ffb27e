"""Step Functions' execution status change events, which moto never emits.

Step Functions sends "Step Functions Execution Status Change" (source `aws.states`) to the
default bus when an execution of a standard workflow changes status, on a best-effort basis. Its
`detail` says what DescribeExecution says: executionArn, stateMachineArn, name, status,
startDate and stopDate (epoch milliseconds), input and inputDetails, output and outputDetails,
and for a failed execution its error and cause. The embedded account sends the same event when
an execution ends (SUCCEEDED, FAILED, TIMED_OUT, ABORTED; not when one starts, which nothing
here listens for), so the rules on it run their targets as in AWS.

The event is put by the thread that ran the execution, as the emulator (its API calls are not
the control plane's), right after moto recorded how the execution ended.

moto also stops an execution only once the task it waits on returns (a `.waitForTaskToken` task
may wait for hours), where StopExecution ends it at once: a stopped execution is ABORTED, and
its event sent, when StopExecution answers. Whatever its thread does later changes nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import boto3

from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.topology import DETAIL_EXECUTION_STATUS_CHANGE

ENDED = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


def status_change_detail(execution: dict[str, Any]) -> dict[str, Any]:
    """The event's detail from DescribeExecution's answer (boto3's shape: datetimes)."""
    ended = execution["status"] in ENDED
    detail: dict[str, Any] = {
        "executionArn": execution["executionArn"],
        "stateMachineArn": execution["stateMachineArn"],
        "name": execution["name"],
        "status": execution["status"],
        "startDate": _millis(execution["startDate"]),
        "stopDate": _millis(execution["stopDate"]) if ended else None,
        "input": execution.get("input"),
        "inputDetails": {"included": True},
        "output": execution.get("output"),
        "outputDetails": {"included": True} if "output" in execution else None,
    }
    for optional in ("error", "cause"):
        if execution.get(optional) is not None:
            detail[optional] = execution[optional]
    return detail


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


_ENDED_ONCE = "_gpufleet_end_told"  # set on an execution whose end was recorded and told


def install() -> Callable[[], None]:
    """Emit the event whenever an execution ends, and end stopped executions at once, from now
    on; returns what undoes it."""
    from moto.stepfunctions.parser.backend.execution import (
        BaseExecutionWorkerCommunication,
        Execution,
    )

    original_terminated = BaseExecutionWorkerCommunication.terminated
    original_stop = Execution.stop
    lock = threading.Lock()

    def terminated(self: Any) -> None:
        with lock:
            if getattr(self.execution, _ENDED_ONCE, False):
                return  # stopped earlier: its end stands as StopExecution made it
            setattr(self.execution, _ENDED_ONCE, True)
            original_terminated(self)
        _emit(self.execution)

    def stop(self: Any, stop_date: datetime, error: str | None, cause: str | None) -> None:
        original_stop(self, stop_date=stop_date, error=error, cause=cause)
        if self.exec_worker is not None:
            self.exec_worker._execution_communication.terminated()

    BaseExecutionWorkerCommunication.terminated = terminated  # type: ignore[method-assign]
    Execution.stop = stop  # type: ignore[method-assign]

    def undo() -> None:
        BaseExecutionWorkerCommunication.terminated = original_terminated  # type: ignore[method-assign]
        Execution.stop = original_stop  # type: ignore[method-assign]

    return undo


def _emit(execution: Any) -> None:
    described = dict(execution.to_describe_output())
    status = described["status"]
    detail = status_change_detail({**described, "status": getattr(status, "value", status)})
    if detail["status"] not in ENDED:
        return
    region = str(execution.exec_arn).split(":")[3]
    with acting_as(EMULATOR):
        boto3.session.Session().client("events", region_name=region).put_events(
            Entries=[
                {
                    "Source": "aws.states",
                    "DetailType": DETAIL_EXECUTION_STATUS_CHANGE,
                    "Detail": json.dumps(detail),
                    "Resources": [str(execution.exec_arn)],
                }
            ]
        )
