"""Step Functions' execution status change events, which moto never emits.

Step Functions sends "Step Functions Execution Status Change" (source `aws.states`) to the
default bus when an execution of a standard workflow changes status, on a best-effort basis. Its
`detail` says what DescribeExecution says: executionArn, stateMachineArn, name, status,
startDate and stopDate (epoch milliseconds), input and inputDetails, output and outputDetails,
and for a failed execution its error and cause. The embedded account sends the same event when
an execution ends (SUCCEEDED, FAILED, TIMED_OUT, ABORTED; not when one starts, which nothing
here listens for), so the rules on it run their targets as in AWS.

The event is put by the thread that ran the execution, as the emulator (its API calls are not
the control plane's), right after moto recorded how the execution ended. Both replacements are
entries of the patch registry (`patches.EXECUTION_ENDED`, `patches.EXECUTION_STOPPED`).

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

from gpufleet.adapters.aws.runtime import new_session
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
_told = threading.Lock()


def emit_on_end(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """`BaseExecutionWorkerCommunication.terminated` (patches.EXECUTION_ENDED): record how the
    execution ended, once, and send the event."""

    def terminated(self: Any) -> None:
        with _told:
            if getattr(self.execution, _ENDED_ONCE, False):
                return  # stopped earlier: its end stands as StopExecution made it
            setattr(self.execution, _ENDED_ONCE, True)
            original(self)
        _emit(self.execution)

    return terminated


def end_at_once(original: Callable[..., None]) -> Callable[..., None]:
    """`Execution.stop` (patches.EXECUTION_STOPPED): the stopped execution ends now, ABORTED,
    as its worker would record it once its task returned."""
    from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication

    def stop(self: Any, stop_date: datetime, error: str | None, cause: str | None) -> None:
        original(self, stop_date=stop_date, error=error, cause=cause)
        if self.exec_worker is not None:
            BaseExecutionWorkerCommunication(self).terminated()

    return stop


def _emit(execution: Any) -> None:
    described = dict(execution.to_describe_output())
    status = described["status"]
    detail = status_change_detail({**described, "status": getattr(status, "value", status)})
    if detail["status"] not in ENDED:
        return
    region = str(execution.exec_arn).split(":")[3]
    with acting_as(EMULATOR):
        new_session().client("events", region_name=region).put_events(
            Entries=[
                {
                    "Source": "aws.states",
                    "DetailType": DETAIL_EXECUTION_STATUS_CHANGE,
                    "Detail": json.dumps(detail),
                    "Resources": [str(execution.exec_arn)],
                }
            ]
        )
