"""Stopping or reshaping a job from outside its run: an operator's cancel and resize, and the
stop of a job whose cost reached its budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from gpufleet.domain.arrays import child_job_id
from gpufleet.domain.job import (
    IllegalTransition,
    Job,
    JobChanges,
    JobNotFound,
    JobStatus,
    is_job_id,
)
from gpufleet.domain.settlement import BUDGET, RESIZED
from gpufleet.domain.spec import JobSpec, Resources
from gpufleet.ports import NO_WORKFLOW_YET
from gpufleet.services.lifecycle_base import JobAlreadyEnded, LifecycleBase


class JobCommands(LifecycleBase):
    """Cancel, resize and budget stops."""

    def cancel(self, job_id: str, reason: str = "cancelled") -> dict[str, Any]:
        """Cancel a waiting or running job, for `reason` (an operator's cancel, or a
        dependency that ended as the job may not run after). A running job's instances are
        terminated now, not when its workflow gets round to it; the workflow then records the
        cost. Raises JobNotFound or JobAlreadyEnded, with nothing changed, for a job it cannot
        cancel (one that ends while it is being cancelled included)."""
        job = self._operated_job(job_id)
        if job.spec.is_array:
            return self._cancel_array(job, reason)
        entry = self._ports.queue.remove(job_id)
        changes = JobChanges(failure_reason=reason)
        if entry is not None:
            # Its wait ends here: counted as an admission counts it.
            waited = max(0.0, self._now() - entry.queued_at)
            changes |= JobChanges(waited_seconds=job.waited_seconds + waited)
        try:
            job = self._move(job, JobStatus.CANCELLED, changes)
        except IllegalTransition as exc:
            if exc.current is not None and exc.current.terminal:
                raise JobAlreadyEnded(job_id, exc.current) from None
            raise
        if entry is not None:
            if entry.task_token != NO_WORKFLOW_YET:  # a child of an array has none yet
                self._ports.workflow.complete_task(entry.task_token, {"cancelled": True})
            return job.summary()
        self._ports.fleet.terminate_job_instances(job_id)
        if job.placement is not None and job.released_at is None:
            job = self._ports.jobs.update(job_id, self._now(), JobChanges(released_at=self._now()))
        if self._ports.queue.release(job_id):
            self._capacity_freed(job_id)
        if job.task_token is not None:
            self._ports.workflow.complete_task(
                job.task_token, {"exit_code": None, "reason": "cancelled", "cancelled": True}
            )
        return job.summary()

    def _cancel_array(self, array: Job, reason: str) -> dict[str, Any]:
        """Cancel every child of an array that has not ended (each as a job is cancelled),
        then the array's own record; `cancelled`: how many children it ended."""
        cancelled = 0
        for index in range(array.spec.size):
            try:
                self.cancel(child_job_id(array.job_id, index), reason)
            except (JobAlreadyEnded, JobNotFound):
                continue  # it ended already (or, failed at intake, the array has no children)
            cancelled += 1
        try:
            array = self._move(array, JobStatus.CANCELLED, JobChanges(failure_reason=reason))
        except IllegalTransition as exc:
            if exc.current is not None and exc.current.terminal:
                raise JobAlreadyEnded(array.job_id, exc.current) from None
            raise
        return {**array.summary(), "cancelled": cancelled}

    def resize(self, job_id: str, shape: Resources | Mapping[str, Any]) -> dict[str, Any]:
        """Give a job a new shape: `shape` is the whole of it, or new values of some fields of
        its current one (`{"gpus": 8}`). A waiting job waits with it; a running one
        checkpoints and resumes on the new shape without being resubmitted. A shape the job
        already has changes nothing.

        Judged as a submission is, before anything changes: raises JobNotFound or
        JobAlreadyEnded for a job it cannot resize, pydantic's ValidationError when the shape,
        or the job's spec with it, breaks a rule of the spec (a cap, the elastic range), and
        NoFeasibleOffering (what `gpufleet plan` says of the shape) when nothing in the
        catalog can hold it."""
        job = self._operated_job(job_id)
        current = job.effective_spec.resources
        resources = (
            shape
            if isinstance(shape, Resources)
            else Resources.model_validate({**current.model_dump(), **shape})
        )
        if resources == current:
            return job.summary()
        change = JobChanges(resources_override=resources)
        resized = job.with_changes(change)
        JobSpec.model_validate(resized.effective_spec.to_document())
        self._plan(resized)
        job = self._ports.jobs.update(job_id, self._now(), change)
        entry = self._ports.queue.remove(job_id)
        if entry is not None:
            # In its place, and held still if it was.
            job_resized = replace(entry.job, gpus=resources.total_gpus, instances=resources.nodes)
            self._ports.queue.enqueue(replace(entry, job=job_resized))
        elif job.status in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            self.drain(job_id, RESIZED)
        return job.summary()

    def _operated_job(self, job_id: str) -> Job:
        """The job an operator's command names, which must exist and not have ended."""
        if not is_job_id(job_id):
            raise JobNotFound(job_id)  # no store holds it, and a malformed key may not be read
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            raise JobAlreadyEnded(job_id, job.status)
        return job

    def over_budget(self, job_id: str) -> bool:
        """A running job's cost reached its own budget: stop it as its spec says."""
        job = self._ports.jobs.get(job_id)
        budget = f"its budget of ${job.spec.budget_usd or 0:.2f}"
        return self.stop_for_budget(job_id, budget, job.spec.on_budget)

    def stop_for_budget(self, job_id: str, budget: str, how: Literal["checkpoint", "stop"]) -> bool:
        """A running job's cost (or its team's this month) reached `budget`: tell the
        operators, and stop it, after a checkpoint or at once; either way it ends FAILED."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal or job.drain_reason == BUDGET:
            return False
        self._ports.notifier.notify(
            f"gpufleet: job {job.spec.name} stopped for budget",
            f"Job {job_id} ({job.spec.name}, team {job.spec.team}) reached {budget}; it is "
            + ("stopped after a checkpoint." if how == "checkpoint" else "stopped now."),
        )
        reason = JobChanges(failure_reason=f"stopped: the cost reached {budget}")
        if how == "checkpoint":
            stopping = self.drain(job_id, BUDGET)
            if stopping:
                self._ports.jobs.update(job_id, self._now(), reason)
            return stopping
        self._ports.jobs.update(
            job_id,
            self._now(),
            JobChanges(drain_reason=BUDGET, drain_requested_at=self._now()) | reason,
        )
        self._ports.fleet.terminate_job_instances(job_id)
        if job.task_token is not None:
            self._ports.workflow.complete_task(
                job.task_token, {"exit_code": None, "reason": "stopped: budget reached"}
            )
        return True
