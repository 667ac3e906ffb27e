"""Into the admission queue: a new job's first plan (Prepare, at intake), the workflow's wait
in the queue (Enqueue), and the way back after a run (Requeue).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import TypeAdapter

from gpufleet.domain.arrays import shared_plan_key
from gpufleet.domain.cost import estimated_run_usd
from gpufleet.domain.history import job_of_execution, requeue_budget
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.queueing import QueuedJob, most_booked, never_admissible
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.settlement import requeue_changes
from gpufleet.ports import NO_WORKFLOW_YET, QueueEntry
from gpufleet.services.lifecycle_base import LifecycleBase, queued_job
from gpufleet.services.pass_reads import DependencyStatuses
from gpufleet.services.workflow_state import LaunchStepResult
from gpufleet.topology import CONTROL_PLANE_SOURCE, DETAIL_JOB_QUEUED

# The queue's view of a job travels in the workflow's state as JSON.
_QUEUED_JOB: TypeAdapter[QueuedJob] = TypeAdapter(QueuedJob)


class QueueSteps(LifecycleBase):
    """Prepare, Enqueue and Requeue."""

    def prepare(self, job: Job) -> tuple[Job, dict[str, Any] | None]:
        """A new job's first plan, made at intake before the job is stored: the job is QUEUED
        with its workflow's input, or FAILED (and no workflow starts) when nothing in the
        catalog can run it, when it (or any of its stages) could never be admitted, or when
        its estimate exceeds its budget."""
        try:
            plans = self._plan_stages(job)
        except NoFeasibleOffering as exc:
            failed = job.model_copy(update={"status": JobStatus.FAILED, "failure_reason": str(exc)})
            return failed, None
        plan = plans[0]
        estimate = round(sum(self.estimate_usd(p) for p in plans), 6)
        reason = self._never_admissible(job, self.estimate_usd(plan))
        budget = job.spec.budget_usd
        if reason is None and budget is not None and estimate > budget:
            reason = f"its estimated cost ${estimate:.2f} exceeds its budget ${budget:.2f}"
        if reason is not None:
            failed = job.model_copy(
                update={
                    "status": JobStatus.FAILED,
                    "failure_reason": reason,
                    "estimated_cost_usd": estimate,
                }
            )
            return failed, None
        queued = job.model_copy(update={"status": JobStatus.QUEUED, "estimated_cost_usd": estimate})
        return queued, self.workflow_input(queued, plan, attempt=0)

    def _never_admissible(self, job: Job, first_estimate_usd: float) -> str | None:
        """Why the admission queue could never admit the job's first run (which waits with
        `first_estimate_usd`, judged against its team's monthly budget) or a later stage of
        it; None when it could. The team's bookings are read only for a shape that its quota
        cannot hold."""
        policy = self._policy.queue
        for index in range(len(job.spec.stages)) if job.spec.stages else [job.stage_index]:
            queued = queued_job(job.model_copy(update={"stage_index": index}))
            if index == job.stage_index:
                queued = replace(queued, estimated_cost_usd=first_estimate_usd)
            reason = never_admissible(queued, policy)
            if reason is not None:
                booked = most_booked(queued.team, self._ports.queue.bookings(), self._now())
                reason = never_admissible(queued, policy, booked) if booked else reason
            if reason is not None and job.spec.stages:
                return f"stage {job.spec.stages[index].name!r}: {reason}"
            if reason is not None:
                return reason
        return None

    def _plan_stages(self, job: Job) -> list[LaunchPlan]:
        """The job's first plan, and for a multi-stage job one for every stage: a stage nothing
        in the catalog can run fails the job at intake, not after the stages before it ran.
        Raises NoFeasibleOffering naming the stage."""
        if not job.spec.stages:
            return [self._plan(job)]
        plans = []
        for index, stage in enumerate(job.spec.stages):
            try:
                plans.append(self._plan(job.model_copy(update={"stage_index": index})))
            except NoFeasibleOffering as exc:
                raise NoFeasibleOffering(
                    f"stage {stage.name!r}: {exc}", exc.constraint, exc.region
                ) from None
        return plans

    def estimate_usd(self, plan: LaunchPlan) -> float:
        """Before a run: what the plan's first choice costs for its expected hours."""
        return estimated_run_usd(
            plan, root_volume_gib=self._policy.root_volume_gib, cost=self._policy.cost
        )

    @staticmethod
    def workflow_input(job: Job, plan: LaunchPlan, attempt: int) -> dict[str, Any]:
        """The state a run of the lifecycle starts from: the plan for the job as it now is,
        launch attempts counted on (so a new launch never reuses an earlier one's idempotency
        token), and what the queue needs to know of the job (so that Enqueue reads nothing)."""
        return {
            "job_id": job.job_id,
            "plan": plan.model_dump(mode="json"),
            "launch": LaunchStepResult(step=0, attempt=attempt).model_dump(),
            "queued": _QUEUED_JOB.dump_python(queued_job(job), mode="json"),
            "cycles": 0,  # requeues in this execution (see requeue_input)
        }

    def queue_entry(
        self,
        queued: QueuedJob,
        task_token: str,
        plan: LaunchPlan,
        dependencies: DependencyStatuses | None = None,
    ) -> QueueEntry:
        """The queue's entry for the job the workflow describes. `plan` is the one Prepare or
        Requeue made: its first choice is the cost estimate, its expected run time the one the
        queue reserves by. A job that waits for a dependency is held on it, out of its stream
        (`arrays.held_on`, its dependencies read through `dependencies`, once each)."""
        job = replace(
            queued,
            estimated_cost_usd=self.estimate_usd(plan),
            expected_seconds=plan.expected_seconds,
            not_before=plan.block_start,
        )
        held_on = None
        if job.depends_on:
            held_on = (dependencies or DependencyStatuses(self._ports.jobs)).held_on(job)
        return QueueEntry(job=job, task_token=task_token, queued_at=self._now(), held_on=held_on)

    def array_entries(
        self, children: Sequence[Job], workflow_input: Mapping[str, Any]
    ) -> list[QueueEntry]:
        """The queue's entries of an array's children, all planned as their array was
        (`workflow_input`, Prepare's): they differ only in their environment. They wait with
        no workflow: admission starts each one's (`start_admitted`)."""
        plan = LaunchPlan.model_validate(workflow_input["plan"])
        dependencies = DependencyStatuses(self._ports.jobs)
        return [
            self.queue_entry(queued_job(child), NO_WORKFLOW_YET, plan, dependencies)
            for child in children
        ]

    def start_admitted(
        self, job_id: str, admission: Mapping[str, Any], plans: dict[str, LaunchPlan]
    ) -> None:
        """An admitted child of an array: its workflow starts now, past Enqueue, with its
        admission (the state machine's `Waits for admission?`), planned as the job now is:
        with the plan in `plans` (the pass's, by `arrays.shared_plan_key`) that an earlier child
        of its array got, else planned and kept there. Starting it again (a pass that tells an
        admission again) is a no-op."""
        job = self._ports.jobs.get(job_id)
        key = shared_plan_key(job)
        plan = plans.get(key) if key is not None else None
        if plan is None:
            plan = self._plan(job)
            if key is not None:
                plans[key] = plan
        state = self.workflow_input(job, plan, attempt=0)
        self._ports.workflow.start(job_id, {**state, "admission": {"admitted": True, **admission}})

    def enqueue(self, entry: QueueEntry) -> None:
        """Put the job in the admission queue with the workflow's token, and wake a dispatcher.
        A job that ended meanwhile (cancelled) is not queued: its workflow hears `cancelled`."""
        if not self._ports.queue.enqueue(entry):
            self._ports.workflow.complete_task(entry.task_token, {"cancelled": True})
            return
        job = entry.job
        self._ports.events.publish(
            CONTROL_PLANE_SOURCE,
            DETAIL_JOB_QUEUED,
            {"job_id": job.job_id, "team": job.team, "priority": job.priority.value},
        )

    def requeue(self, job_id: str) -> LaunchPlan:
        """Back to the queue after a checkpoint (preemption, reclaim, spot interruption) or for
        a retry: the run's cost is kept, its placement and workflow plumbing are cleared, and
        the launch is planned again for what the job now asks for (a resize, more GPU memory)."""
        return self._plan(self._requeued(job_id))

    def requeue_input(
        self, job_id: str, attempt: int, cycles: int = 0, execution: str = ""
    ) -> dict[str, Any]:
        """`requeue`, as the workflow's state for the next wait in the queue, in the execution
        named `execution` that has requeued the job `cycles` times. Past its budget
        (`domain/history.py`) the job's next execution starts from that state instead
        (a retried step finds it started: a no-op), and the state says `continued`."""
        job = self._requeued(job_id)
        plan = self._plan(job)
        state = self.workflow_input(job, plan, attempt)
        if cycles < requeue_budget(plan.max_launch_attempts):
            return {**state, "cycles": cycles + 1, "continued": False}
        _, continuation = job_of_execution(execution or job_id)  # "": the job's first
        self._ports.workflow.start(job_id, state, continuation + 1)
        return {**state, "continued": True}

    def _requeued(self, job_id: str) -> Job:
        job = self._ports.jobs.get(job_id)
        if job.status is JobStatus.QUEUED:
            return job  # a repeated step
        return self._move(job, JobStatus.QUEUED, requeue_changes(job, self._now()))
