"""The backstop: no job outlives its workflow.

The lifecycle's workflow settles every job it runs, on every path, in Release. But a workflow
can end without settling its job: Release failing through its retries (`ReleaseFailed`),
Requeue failing (`RequeueFailed`: a resize to a shape nothing can hold), an execution stopped
by hand (ABORTED) or past its time limit (TIMED_OUT). The job would then hold its instances
and its share of the quotas for ever, and never get a final status or cost.

Step Functions tells EventBridge when an execution ends ("Step Functions Execution Status
Change"; best effort). `workflow_ended` takes that event and ends the job as Release would have
(`LifecycleService.end_abandoned`): instances terminated, share returned, FAILED with the
reason, cost recorded. The reconciler's pass is the second line (`abandoned`): a job that is not
terminal while no execution of it has run for `abandoned_after_seconds` (the event was lost, or
the workflow never started) is ended the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.domain.job import Job, JobNotFound, JobStatus
from gpufleet.ports import Ports, WorkflowRun
from gpufleet.services.lifecycle import LifecycleService

# The status of a job's workflow that has no execution at all.
NEVER_STARTED = "NEVER_STARTED"


@dataclass(frozen=True)
class WorkflowEnd:
    """How a job's workflow ended, from its status change event or from DescribeExecution."""

    job_id: str
    status: str  # FAILED, TIMED_OUT, ABORTED (or NEVER_STARTED: no execution at all)
    error: str = ""
    cause: str = ""

    @classmethod
    def of(cls, job_id: str, run: WorkflowRun | None) -> WorkflowEnd:
        if run is None:
            return cls(job_id, NEVER_STARTED)
        return cls(job_id, run.status, run.error, run.cause)


def failure_of(end: WorkflowEnd) -> tuple[str, str]:
    """The error and cause a job whose workflow ended so is FAILED with."""
    if end.status == "ABORTED":
        return "WorkflowAborted", _readable(end.cause) or "the job's workflow was stopped"
    if end.status == "TIMED_OUT":
        return "WorkflowTimedOut", "the job's workflow ran past its time limit"
    if end.status == NEVER_STARTED:
        return "WorkflowLost", "the job's workflow never started"
    return end.error or f"Workflow{end.status.title()}", _readable(end.cause)


def _readable(cause: str) -> str:
    """A Lambda task's failure arrives as its JSON error document: keep its type and message."""
    try:
        document = json.loads(cause)
    except ValueError:
        return cause
    if isinstance(document, dict) and "errorMessage" in document:
        return f"{document.get('errorType', 'Error')}: {document['errorMessage']}"
    return cause


class BackstopService:
    def __init__(self, ports: Ports, lifecycle: LifecycleService) -> None:
        self._ports = ports
        self._lifecycle = lifecycle

    def workflow_ended(self, end: WorkflowEnd) -> dict[str, Any] | None:
        """A job's workflow ended without succeeding (the lifecycle's own end of a job that
        failed is a success of its workflow): end the job. None when there is nothing to end."""
        try:
            job = self._ports.jobs.get(end.job_id)
        except JobNotFound:
            return None  # an execution of another machine's naming, or a job long gone
        error, cause = failure_of(end)
        return self._lifecycle.end_abandoned(job.job_id, error, cause)

    def abandoned(self, live_jobs: Iterable[Job], now: float, after_seconds: float) -> list[str]:
        """End the live jobs whose workflow has not run for `after_seconds`: ended that long ago
        (its event lost), or never started while the job is that old. The ids ended."""
        running = self._ports.workflow.running_jobs()
        ended = []
        for job in live_jobs:
            if job.status.terminal or job.job_id in running or now - job.updated_at < after_seconds:
                continue
            run = self._ports.workflow.run_of(job.job_id)
            if run is not None and (run.running or now - (run.stopped_at or now) < after_seconds):
                continue  # it runs (it started since the listing), or its event may still come
            if run is None and job.array_id is not None and job.status is JobStatus.QUEUED:
                continue  # a child of an array waiting in the queue: admission starts its run
            if self.workflow_ended(WorkflowEnd.of(job.job_id, run)) is not None:
                ended.append(job.job_id)
        return ended
