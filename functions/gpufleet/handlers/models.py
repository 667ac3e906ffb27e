"""The payloads that carry the domain's models (a queue entry, the workflow's state, a node's
report); a handler imports them with its first event, as its services import the domain. The
workflow's state that a task reads is typed by `services/workflow_state.py`; the lighter
payloads are in `handlers/payloads.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpufleet.domain.queueing import QueuedJob
from gpufleet.handlers.payloads import EventBridgeEvent, JobTask, TokenTask
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState


class EnqueueTask(TokenTask):
    plan: dict[str, Any]
    queued: QueuedJob


class LaunchTask(TokenTask):
    plan: dict[str, Any]
    step: int = Field(ge=0)
    attempt: int = Field(ge=0)
    tries: int = Field(default=0, ge=0)
    admission: Admission = Field(default_factory=Admission)


class ReleaseTask(JobTask):
    state: WorkflowState


class NodeReportEvent(EventBridgeEvent):
    """A `Node ...` event whose detail is a node report."""

    detail: NodeReport
