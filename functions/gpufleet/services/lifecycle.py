"""The steps of a job's lifecycle, each called by one task of the state machine.

Every step is safe to run twice: the state machine retries tasks, events arrive twice and out of
order, and a Lambda can die half way. Status changes are conditional writes; a step that finds
its work already done returns what it would have returned the first time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gpufleet.domain.catalog import InstanceType
from gpufleet.domain.config import CostPolicy, MetricPolicy, Reservation
from gpufleet.domain.cost import estimated_run_usd, launch_costs
from gpufleet.domain.duration import (
    HISTORY_DEPTH,
    DurationEstimate,
    estimate_duration,
    past_runs,
)
from gpufleet.domain.job import (
    JOB_ID_PATTERN,
    DroppedReport,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    Placement,
    is_job_id,
)
from gpufleet.domain.launch import (
    CapacityType,
    LaunchError,
    LaunchRequest,
    LaunchResult,
    shortage_keys,
)
from gpufleet.domain.planning import LaunchPlan, LaunchStep
from gpufleet.domain.queueing import QueuedJob, QueuePolicy, most_booked, never_admissible
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.settlement import (
    BUDGET,
    DEFAULT_MAX_INTERRUPTIONS,
    INTERRUPTED,
    RESIZED,
    EndKind,
    PublishStatusChange,
    Record,
    ReleaseShare,
    RunEnd,
    RunStageHere,
    Settlement,
    Terminate,
    requeue_changes,
    settle,
)
from gpufleet.domain.spec import JobSpec, Resources
from gpufleet.domain.stages import next_stage_may_reuse, stage_environment
from gpufleet.ports import Freed, Ports, QueueEntry, RunningShare, StatusChange
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    CONTROL_RUN_STAGE,
    DETAIL_CAPACITY_FREED,
    DETAIL_JOB_QUEUED,
    DETAIL_JOB_STATUS_CHANGED,
    RUNS_PREFIX,
)


class Planner(Protocol):
    def __call__(
        self,
        spec: JobSpec,
        *,
        unavailable: frozenset[str],
        expected: DurationEstimate,
        free_reservations: Sequence[tuple[Reservation, int]],
    ) -> LaunchPlan: ...


# For how long after an admission a launch relies on what it said of capacity shortages.
ADMISSION_KNOWS_SHORTAGES_SECONDS = 60.0


@dataclass(frozen=True)
class LifecyclePolicy:
    region: str
    capacity_memory_seconds: int = 300
    reservations: tuple[Reservation, ...] = ()
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS
    gpu_memory_of: Callable[[str], float] = lambda _instance_type: 0.0
    metrics: MetricPolicy = field(default_factory=MetricPolicy)
    cost: CostPolicy = field(default_factory=CostPolicy)
    root_volume_gib: int = 200  # each node's EBS volume
    # Catalog lookup (None: unknown type): whether a stage fits on the last one's instances,
    # and how many GPUs a stage held.
    instance_type_of: Callable[[str], InstanceType | None] = lambda _instance_type: None
    data_bucket: str = ""  # where stages pass data to each other (runs/<job>/stages/<stage>/)
    # The admission policy: a job no state of the fleet could ever admit is refused at intake.
    queue: QueuePolicy = field(default_factory=QueuePolicy)


class JobAlreadyEnded(Exception):
    def __init__(self, job_id: str, status: JobStatus) -> None:
        super().__init__(f"job {job_id} already ended: {status.value}")


# A process's exit status as Linux reports it, and docker with it: 0 to 255, a death by signal
# n as 128 + n (the agent reports it so). Anything else is no exit status; an unbounded number
# is not even one DynamoDB can store (38 digits at most).
MAX_EXIT_CODE = 255


class NodeReport(BaseModel):
    """What a node agent says about its job (the `detail` of its event)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    instance_id: str = Field(max_length=64)
    phase: Literal["started", "heartbeat", "finished"]
    exit_code: int | None = Field(default=None, ge=0, le=MAX_EXIT_CODE, strict=True)
    reason: str = Field(default="", max_length=2000)
    # The node saw its own spot interruption notice (IMDS) and checkpointed.
    interrupted: bool = False
    # The container died of GPU out-of-memory (recognised in its last log lines).
    oom: bool = False
    # The stage of a multi-stage job the node ran (reports of an earlier stage are stale).
    stage: str | None = Field(default=None, max_length=64)


class LaunchStepResult(BaseModel):
    """What the Launch task hands back to the state machine's Choice."""

    step: int
    attempt: int  # launch calls over the job's life: each gets its own idempotency token
    tries: int = 0  # launch calls in this run: what the plan's cap counts
    launched: bool = False
    retry_later: bool = False
    give_up: bool = False
    wait_seconds: int = 1  # before the next try, when retry_later
    error: str = ""
    category: str = ""  # of the launch error (capacity, quota, configuration)


class Launched(BaseModel):
    """The instances a launch got, for the Launch function's metrics."""

    model_config = ConfigDict(frozen=True)

    capacity_type: CapacityType
    instances: int = Field(ge=1)
    ondemand_fallback: bool  # on-demand, after an earlier step of the plan tried spot


def _unheard(_launched: Launched) -> None:
    """For callers that count no launches."""


def run_manifest_key(job_id: str) -> str:
    return f"{RUNS_PREFIX}{job_id}/run.json"


def control_key(job_id: str) -> str:
    """Where the node agent looks for instructions (checkpoint and stop, run the next stage)."""
    return f"{RUNS_PREFIX}{job_id}/control.json"


def stage_data_root(bucket: str, job_id: str) -> str:
    """Where a multi-stage job's stages write their output, one prefix per stage."""
    return f"s3://{bucket}/{RUNS_PREFIX}{job_id}/stages/"


class LifecycleService:
    def __init__(self, ports: Ports, planner: Planner, policy: LifecyclePolicy) -> None:
        self._ports = ports
        self._planner = planner
        self._policy = policy

    # -- state machine tasks -------------------------------------------------------------------

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
        }

    def queue_entry(self, queued: QueuedJob, task_token: str, plan: LaunchPlan) -> QueueEntry:
        """The queue's entry for the job the workflow describes. `plan` is the one Prepare or
        Requeue made: its first choice is the cost estimate."""
        return QueueEntry(
            job=replace(queued, estimated_cost_usd=self.estimate_usd(plan)),
            task_token=task_token,
            queued_at=self._now(),
        )

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

    def requeue_input(self, job_id: str, attempt: int) -> dict[str, Any]:
        """`requeue`, as the workflow's state for the next wait in the queue."""
        job = self._requeued(job_id)
        return self.workflow_input(job, self._plan(job), attempt)

    def _requeued(self, job_id: str) -> Job:
        job = self._ports.jobs.get(job_id)
        if job.status is JobStatus.QUEUED:
            return job  # a repeated step
        return self._move(job, JobStatus.QUEUED, requeue_changes(job, self._now()))

    def drain(self, job_id: str, reason: str, for_job_id: str | None = None) -> bool:
        """Ask a running job's node to checkpoint and stop; the job is then requeued."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal or job.drain_reason is not None:
            return False
        self._ports.jobs.update(
            job_id,
            self._now(),
            {"drain_reason": reason, "drain_requested_at": self._now()},
        )
        self._ports.objects.put_json(
            control_key(job_id),
            {"action": "checkpoint", "reason": reason, "for_job_id": for_job_id},
        )
        return True

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a waiting or running job. A running job's instances are terminated now, not
        when its workflow gets round to it; the workflow then records the cost. Raises
        JobNotFound or JobAlreadyEnded, with nothing changed, for a job it cannot cancel (one
        that ends while it is being cancelled included)."""
        job = self._operated_job(job_id)
        entry = self._ports.queue.remove(job_id)
        try:
            job = self._move(job, JobStatus.CANCELLED, {"failure_reason": "cancelled"})
        except IllegalTransition as exc:
            if exc.current is not None and exc.current.terminal:
                raise JobAlreadyEnded(job_id, exc.current) from None
            raise
        if entry is not None:
            self._ports.workflow.complete_task(entry.task_token, {"cancelled": True})
            return job.summary()
        self._ports.fleet.terminate_job_instances(job_id)
        if job.placement is not None and job.released_at is None:
            job = self._ports.jobs.update(job_id, self._now(), {"released_at": self._now()})
        if self._ports.queue.release(job_id):
            self._ports.events.publish(
                CONTROL_PLANE_SOURCE, DETAIL_CAPACITY_FREED, {"job_id": job_id}
            )
        if job.task_token is not None:
            self._ports.workflow.complete_task(
                job.task_token, {"exit_code": None, "reason": "cancelled", "cancelled": True}
            )
        return job.summary()

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
        resized = job.model_copy(update={"resources_override": resources})
        JobSpec.model_validate(resized.effective_spec.to_document())
        self._plan(resized)
        job = self._ports.jobs.update(job_id, self._now(), {"resources_override": resources})
        entry = self._ports.queue.remove(job_id)
        if entry is not None:
            self._ports.queue.enqueue(
                QueueEntry(
                    job=replace(entry.job, gpus=resources.total_gpus, instances=resources.nodes),
                    task_token=entry.task_token,
                    queued_at=entry.queued_at,
                )
            )
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

    def instance_interrupted(self, instance_id: str) -> str | None:
        """A spot interruption warning or rebalance recommendation for one of our instances:
        its job checkpoints now (two minutes' notice) and is requeued."""
        job_id = self._ports.fleet.job_of(instance_id)
        if job_id is None:
            return None
        placement = self._ports.jobs.get(job_id).placement
        if placement is None or instance_id not in placement.instance_ids:
            return None  # a leftover instance the job does not run on: the reconciler's
        self.drain(job_id, INTERRUPTED)
        return job_id

    def instance_gone(self, instance_id: str, state: str, job_id: str | None = None) -> str | None:
        """An instance of a running job stopped or terminated without gpufleet releasing it
        (a spot reclaim, a hardware failure, someone's console): the run ends now, and the
        release step decides between requeue (spot) and retry. `job_id`: the job the caller
        knows it for (else read from the instance's tags)."""
        job_id = job_id or self._ports.fleet.job_of(instance_id)
        if job_id is None:
            return None
        job = self._ports.jobs.get(job_id)
        placement = job.placement
        if (
            job.status.terminal
            or job.released_at is not None
            or placement is None
            or instance_id not in placement.instance_ids
        ):
            return None  # released by us, or an instance the job no longer holds
        result = job.run_result  # the run's end is on record (a call that died after writing it)
        if result is None:
            result = {
                "exit_code": None,
                "reason": f"instance {instance_id} is {state}",
                "interrupted": placement.capacity_type == CapacityType.SPOT.value,
            }
            job = self._ports.jobs.update(job_id, self._now(), {"run_result": result})
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)
        return job_id

    def launch(
        self,
        job_id: str,
        plan: LaunchPlan,
        step: int,
        attempt: int,
        task_token: str,
        admission: Mapping[str, Any] | None = None,
        tries: int = 0,
        *,
        launched: Callable[[Launched], None] = _unheard,
    ) -> LaunchStepResult | None:
        """Try one step of the plan (one capacity type over its offerings). The workflow waits
        on `task_token` for the whole run: a launched job parks it with its placement, and the
        node's report completes it; a launch that got no capacity completes it at once with what
        to do next (returned too). `admission` is what the dispatcher said when it admitted the
        job (when it was queued, when admitted). `launched` hears of the instances a launch got,
        once: from the call that recorded them (a repeated step finds them recorded, and says
        nothing)."""
        result = self._launch(
            job_id, plan, step, attempt, tries, task_token, admission or {}, launched
        )
        if result is not None:
            self._ports.workflow.complete_task(task_token, {"launch": result.model_dump()})
        return result

    def _launch(
        self,
        job_id: str,
        plan: LaunchPlan,
        step: int,
        attempt: int,
        tries: int,
        task_token: str,
        admission: Mapping[str, Any],
        launched: Callable[[Launched], None],
    ) -> LaunchStepResult | None:
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            return LaunchStepResult(step=step, attempt=attempt, give_up=True, error="job ended")
        if job.placement is not None:
            # A retry of a launch that already succeeded: park the token, do not launch again.
            job = self._ports.jobs.update(job_id, self._now(), {"task_token": task_token})
            if job.run_result is not None:  # and its node already finished
                self._ports.workflow.complete_task(task_token, job.run_result)
            return None
        self._ports.objects.put_json(
            run_manifest_key(job_id), _run_manifest(job, self._policy.data_bucket)
        )
        # A new run starts with no instruction pending: a checkpoint request was for the last.
        self._ports.objects.put_json(control_key(job_id), {"action": "run"})
        capacity_type = plan.steps[step].capacity_type
        expected = DurationEstimate(plan.expected_seconds, plan.expected_source)
        launch_step = self._current_offerings(
            job.effective_spec, capacity_type, expected, self._memory_may_hold(admission, tries)
        )
        if launch_step is None:
            # Every offering of this capacity type failed moments ago: skip EC2 entirely.
            result = LaunchResult(
                capacity_type=capacity_type,
                errors=[
                    LaunchError(
                        code="InsufficientInstanceCapacity",
                        message="every offering of this capacity type is in the capacity memory",
                    )
                ],
            )
        else:
            # A retry of a launch that died before recording its placement gets the instances
            # that launch made (the fleet's launch is idempotent per attempt and ends whatever
            # else the job holds): a job never has two fleets, nor records ended instances.
            result = self._ports.fleet.launch(
                LaunchRequest(
                    job_id=job_id,
                    attempt=attempt,
                    capacity_type=capacity_type,
                    nodes=plan.nodes,
                    overrides=launch_step.overrides,
                )
            )
            if result.launched:
                fell_back = plan.is_on_demand_fallback(step)
                changes = {
                    **self._admitted_changes(job, admission),
                    "placement": self._placement(result, launch_step),
                    "attempts": job.attempts + 1,
                    "ondemand_fallback": fell_back,
                    "task_token": task_token,
                }
                # Alarms first: a recorded placement is never retried, so it must have them.
                self._ports.alarms.create(job_id, job.effective_spec, self._policy.metrics)
                self._record_launch(job, changes)
                launched(
                    Launched(
                        capacity_type=result.capacity_type,
                        instances=len(result.instance_ids),
                        ondemand_fallback=fell_back,
                    )
                )
                return None
            shortages = shortage_keys(result, self._policy.region)
            until = self._now() + self._policy.capacity_memory_seconds
            self._ports.capacity.remember(shortages, until=until)
            if shortages:
                self._ports.queue.note_shortage(until)
        if job.status is JobStatus.QUEUED:
            # Admitted: the job holds its share while it waits for capacity.
            job = self._record_launch(job, self._admitted_changes(job, admission))
        next_move = plan.after_failure(step, tries + 1, result.error_category)
        return LaunchStepResult(
            step=next_move.step,
            attempt=attempt + 1,
            tries=tries + 1,
            retry_later=next_move.retry_later,
            give_up=next_move.give_up,
            wait_seconds=max(1, next_move.wait_seconds),
            error="; ".join(f"{e.code}: {e.message}" for e in result.errors),
            category=result.error_category.value if result.error_category else "",
        )

    def _record_launch(self, job: Job, changes: dict[str, Any]) -> Job:
        """Move the job to LAUNCHING and tell the queue: its hourly cost, for the fleet's cost
        per hour, and for a job with a budget the moment its cost will reach it, for the
        dispatcher's passes to stop it then. One write spanning both, as a rule; two when that
        one finds the job moved on or its share released (a repeated step, a race)."""
        now = self._now()
        launching = job.model_copy(
            update={**changes, "status": JobStatus.LAUNCHING, "updated_at": now}
        )
        hourly_usd, stop_at = launch_costs(launching)
        change = StatusChange(
            job.job_id, JobStatus.LAUNCHING, frozenset({job.status}), now, changes
        )
        if self._ports.queue.record_launch(change, hourly_usd, stop_at):
            if job.status is not JobStatus.LAUNCHING:
                self._status_changed(launching, job.status)
            return launching
        launching = self._move(job, JobStatus.LAUNCHING, changes)
        self._ports.queue.note_launch(job.job_id, *launch_costs(launching))
        return launching

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
        reason = {"failure_reason": f"stopped: the cost reached {budget}"}
        if how == "checkpoint":
            stopping = self.drain(job_id, BUDGET)
            if stopping:
                self._ports.jobs.update(job_id, self._now(), reason)
            return stopping
        self._ports.jobs.update(
            job_id,
            self._now(),
            {"drain_reason": BUDGET, "drain_requested_at": self._now(), **reason},
        )
        self._ports.fleet.terminate_job_instances(job_id)
        if job.task_token is not None:
            self._ports.workflow.complete_task(
                job.task_token, {"exit_code": None, "reason": "stopped: budget reached"}
            )
        return True

    @staticmethod
    def _admitted_changes(job: Job, admission: Mapping[str, Any]) -> dict[str, Any]:
        """The first launch after an admission notes the wait it ended."""
        if job.status is not JobStatus.QUEUED:
            return {}
        changes: dict[str, Any] = {"preempted_for": None}
        admitted_at, queued_at = admission.get("admitted_at"), admission.get("queued_at")
        if isinstance(admitted_at, int | float) and isinstance(queued_at, int | float):
            changes["waited_seconds"] = job.waited_seconds + max(0.0, admitted_at - queued_at)
            if job.first_admitted_at is None:
                changes["first_admitted_at"] = float(admitted_at)
        return changes

    def node_report(self, report: NodeReport) -> DroppedReport | None:
        """A node's start, heartbeat or finish. A report for a job that does not exist, or from
        an instance the job does not hold (stale, or forged), changes nothing and is dropped:
        the answer says which (None: the report was heard). One about a stage the job has
        moved past, or delivered again after the job ended, is ignored."""
        try:
            if report.phase == "heartbeat" or report.stage is not None:
                job = self._ports.jobs.get(report.job_id)
            else:
                found = self._report_in_one_write(report)
                if found is None:
                    return None
                job = found
        except JobNotFound:
            return DroppedReport.UNKNOWN_JOB
        if job.placement is None or report.instance_id not in job.placement.instance_ids:
            return DroppedReport.UNKNOWN_INSTANCE
        if job.status.terminal:
            return None  # a report delivered again after the job ended
        if report.stage is not None and report.stage != job.stage_name:
            return None
        if report.phase == "started":
            self._move(job, JobStatus.RUNNING)
        elif report.phase == "heartbeat":
            if job.task_token is not None:
                self._ports.workflow.heartbeat(job.task_token)
        else:
            self._node_finished(job, report)
        return None

    def _report_in_one_write(self, report: NodeReport) -> Job | None:
        """The usual report, a start of a launching job or the finish of a running one, in the
        one conditional write it causes: the condition checks that the job holds the instance.
        None when it was applied; otherwise the job as the write found it, for the checks that
        decide what the report means (stale, repeated, a finish that overtook its start)."""
        if report.phase == "started":
            target, sources, changes = JobStatus.RUNNING, None, None
        else:
            target, sources = JobStatus.RUNNING, [JobStatus.RUNNING]
            changes = {"run_result": _run_result(report)}
        try:
            job = self._ports.jobs.transition(
                report.job_id,
                target,
                self._now(),
                changes,
                sources=sources,
                holding=report.instance_id,
            )
        except IllegalTransition as exc:
            return exc.job if exc.job is not None else self._ports.jobs.get(report.job_id)
        if report.phase == "started":
            self._status_changed(job, JobStatus.LAUNCHING)
        elif job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, _finish_output(report, job))
        return None

    def _node_finished(self, job: Job, report: NodeReport) -> None:
        result = _run_result(report, job)
        # A finish can overtake its start; the node evidently ran.
        job = self._move(job, JobStatus.RUNNING, {"run_result": result})
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)

    def release(self, job_id: str, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Settle the end of the job's run (`domain.settlement`) from what the workflow saw,
        and carry it out: terminate every instance of the job, give its share of the quotas
        back to the queue, and either send the job back to the queue (a checkpointed,
        interrupted or retryable run, or the next stage of a multi-stage job: `requeue`) or
        record its final status and cost (`outcome`). A stage whose successor asks for its
        instances and fits on them keeps them instead (`next_stage.here`: the workflow goes
        straight back to Launch)."""
        state = state or {}
        end = run_end_of(state, self._now())
        finished = _finished_job(job_id, state)
        job = finished if finished is not None else self._ports.jobs.get(job_id)
        settlement = self._settle(job, end)
        if any(isinstance(command, RunStageHere) for command in settlement.commands):
            return self._run_stage_here(job, settlement, state)
        terminated = self._release_instances(job)
        if finished is not None:
            settled = self._record_in_one_write(finished, settlement, terminated)
            if settled is not None:
                return settled
            # The job changed since its node finished (or its share did): settle from the record.
            job = self._ports.jobs.get(job_id)
            settlement = self._settle(job, end)
        return self._record_end(job, settlement, terminated)

    def end_abandoned(self, job_id: str, error: str, cause: str) -> dict[str, Any]:
        """End a job whose workflow ended without settling it (a step that failed through its
        retries, an execution stopped or timed out, one that never started): what Release does,
        without the way back to the queue, where no workflow is left to wait. Its instances are
        terminated, its wait in the queue and its share of the quotas end, and it gets its
        final status and cost: its run's own end when its node finished and Release would not
        have requeued it, else FAILED with `error` and `cause`. A job that ended already keeps
        its status (and gets its cost, if it had none yet)."""
        job = self._ports.jobs.get(job_id)
        terminated = self._release_instances(job)
        if job.status is JobStatus.QUEUED:
            self._ports.queue.remove(job_id)
        settlement = None
        if job.run_result is not None:
            settlement = self._settle(job, run_end_of({"run": job.run_result}, self._now()))
        if settlement is None or settlement.requeue is not None:
            # Whatever was to come next (a requeue, a retry) cannot: the workflow's end is the
            # job's, and no drain that was to send it back to the queue has a say.
            abandoned = RunEnd(EndKind.ABANDONED, self._now(), reason=error, cause=cause)
            settlement = self._settle(job, abandoned)
        ended = self._record_end(job, settlement, terminated)
        return {**ended["outcome"], "terminated": terminated}

    def _settle(self, job: Job, end: RunEnd) -> Settlement:
        placement = job.placement
        return settle(
            job,
            end,
            max_interruptions=self._policy.max_interruptions,
            instance_type=self._policy.instance_type_of(placement.instance_type)
            if placement
            else None,
        )

    def _release_instances(self, job: Job) -> list[str]:
        """Terminate every instance of the job, and what lives with them (its alarms, the
        placement group of a multi-node job)."""
        terminated = self._ports.fleet.terminate_job_instances(job.job_id)
        self._ports.alarms.delete(job.job_id)
        if job.effective_spec.resources.nodes > 1:
            self._ports.fleet.delete_placement_group(job.job_id)
        return terminated

    def _record_end(
        self, job: Job, settlement: Settlement, terminated: list[str]
    ) -> dict[str, Any]:
        """Carry out a settlement once the instances are gone (its `Terminate`): the share
        back to the queue, the run's end recorded, the status change published; the answer
        tells the workflow whether to requeue."""
        ended, moved = job, False
        for command in settlement.commands:
            if isinstance(command, ReleaseShare):
                if self._ports.queue.release(job.job_id):
                    self._capacity_freed(job.job_id)
            elif isinstance(command, Record):
                ended, moved = self._write(job, command.status, dict(command.changes))
            elif isinstance(command, PublishStatusChange) and moved:
                self._status_changed(ended, command.previous)
        return _settled(terminated, settlement, ended)

    def _record_in_one_write(
        self, job: Job, settlement: Settlement, terminated: list[str]
    ) -> dict[str, Any] | None:
        """`_record_end` for the usual end of a run, from the job as its node's finish left
        it: the job's write and the return of its share in one transaction, conditioned on the
        job not having changed since. None (nothing written) when it has, or its share has."""
        record = next((c for c in settlement.commands if isinstance(c, Record)), None)
        if job.status.terminal or record is None:
            return None
        now = self._now()
        changes = dict(record.changes)
        change = StatusChange(
            job.job_id, record.status, frozenset({job.status}), now, changes, version=job.version
        )
        freed = self._ports.queue.record_release(change, _share_of(job))
        if freed is None:
            return None
        ended = job.model_copy(
            update={
                **changes,
                "status": record.status,
                "updated_at": now,
                "version": job.version + 1,
            }
        )
        if any(isinstance(c, PublishStatusChange) for c in settlement.commands):
            self._status_changed(ended, job.status)
        if freed is Freed.OTHERS_WAIT:
            self._capacity_freed(job.job_id)
        return _settled(terminated, settlement, ended)

    def _capacity_freed(self, job_id: str) -> None:
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_CAPACITY_FREED, {"job_id": job_id})

    def _run_stage_here(
        self, job: Job, settlement: Settlement, state: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Carry out a settlement that runs the job's next stage on its instances: record the
        stage's end and the move, end the instances it does not need, tell the nodes to run
        the (new) current stage, and give the workflow its plan: Launch finds the instances in
        place and waits for the nodes' report."""
        terminated: list[str] = []
        for command in settlement.commands:
            if isinstance(command, Record):
                job = self._ports.jobs.update(job.job_id, self._now(), dict(command.changes))
            elif isinstance(command, Terminate) and command.instance_ids:
                terminated = list(command.instance_ids)
                self._ports.fleet.terminate_instances(terminated)
        self._ports.objects.put_json(
            run_manifest_key(job.job_id), _run_manifest(job, self._policy.data_bucket)
        )
        self._ports.objects.put_json(
            control_key(job.job_id), {"action": CONTROL_RUN_STAGE, "stage": job.stage_name}
        )
        launch = state.get("launch")
        attempt = launch.get("attempt", 0) if isinstance(launch, Mapping) else 0
        return {
            "terminated": terminated,
            "requeue": False,
            "reason": settlement.reason,
            "next_stage": {
                "here": True,
                "plan": self._plan(job).model_dump(mode="json"),
                "launch": LaunchStepResult(step=0, attempt=int(attempt) + 1).model_dump(),
            },
        }

    # -- helpers -------------------------------------------------------------------------------

    def _now(self) -> float:
        return self._ports.clock.now()

    def _move(self, job: Job, target: JobStatus, changes: dict[str, Any] | None = None) -> Job:
        """Move to `target` with `changes`, and tell who listens; a job already there (a
        repeated step) only gets the changes."""
        moved, changed = self._write(job, target, changes)
        if changed:
            self._status_changed(moved, job.status)
        return moved

    def _write(
        self, job: Job, target: JobStatus, changes: dict[str, Any] | None = None
    ) -> tuple[Job, bool]:
        """`_move` without telling anyone: the job as written, and whether its status moved."""
        if job.status == target:
            updated = self._ports.jobs.update(job.job_id, self._now(), changes) if changes else job
            return updated, False
        try:
            return self._ports.jobs.transition(job.job_id, target, self._now(), changes), True
        except IllegalTransition as exc:
            if exc.current == target:
                if changes:
                    return self._ports.jobs.update(job.job_id, self._now(), changes), False
                return self._ports.jobs.get(job.job_id), False
            raise

    def _status_changed(self, job: Job, previous: JobStatus) -> None:
        detail = {
            "job_id": job.job_id,
            "name": job.spec.name,
            "team": job.spec.team,
            "status": job.status.value,
            "previous": previous.value,
        }
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_STATUS_CHANGED, detail)

    def _plan(self, job: Job) -> LaunchPlan:
        """The order of capacity types and the timeouts for the job as it now is; which
        offerings to try is decided at each launch, against the capacity memory of that moment."""
        spec = job.effective_spec
        return self._planner(
            spec,
            unavailable=frozenset(),
            expected=self._expected_duration(spec),
            free_reservations=self._free_reservations(),
        )

    def _free_reservations(self) -> list[tuple[Reservation, int]]:
        """Active reservations with the instances live jobs do not hold."""
        active = [r for r in self._policy.reservations if r.active_at(self._now())]
        if not active:
            return []
        held: dict[str, int] = {}
        for status in (JobStatus.LAUNCHING, JobStatus.RUNNING):
            for job in self._ports.jobs.list_jobs(status):
                if job.placement is not None and job.placement.reservation_id:
                    held[job.placement.reservation_id] = held.get(
                        job.placement.reservation_id, 0
                    ) + len(job.placement.instance_ids)
        return [(r, r.count - held.get(r.id, 0)) for r in active]

    def _expected_duration(self, spec: JobSpec) -> DurationEstimate:
        if spec.expected_duration_seconds:
            return estimate_duration(spec, [])
        recent = self._ports.jobs.recent_for_team(spec.team, HISTORY_DEPTH)
        return estimate_duration(spec, past_runs(recent))

    def _memory_may_hold(self, admission: Mapping[str, Any], tries: int) -> bool:
        """Whether the capacity memory may hold a shortage now. The first try after a fresh
        admission knows from it (the admission read when the latest remembered shortage
        expires), so the usual launch does not read the memory. A shortage noted since the
        admission is missed: at worst one CreateFleet meets the shortage again."""
        until, admitted_at = admission.get("shortages_until"), admission.get("admitted_at")
        if tries or not isinstance(until, int | float) or not isinstance(admitted_at, int | float):
            return True
        now = self._now()
        return until > now or now - admitted_at > ADMISSION_KNOWS_SHORTAGES_SECONDS

    def _current_offerings(
        self,
        spec: JobSpec,
        capacity_type: CapacityType,
        expected: DurationEstimate,
        memory_may_hold: bool = True,
    ) -> LaunchStep | None:
        """This capacity type's offerings for the spec, minus those without capacity now."""
        now = self._now()
        unavailable = self._ports.capacity.unavailable(now) if memory_may_hold else frozenset()
        try:
            plan = self._planner(
                spec,
                unavailable=unavailable,
                expected=expected,
                free_reservations=self._free_reservations(),
            )
        except NoFeasibleOffering:
            return None
        return next((s for s in plan.steps if s.capacity_type == capacity_type), None)

    def _placement(self, result: LaunchResult, launch_step: LaunchStep) -> Placement:
        assert result.instance_type is not None
        override = launch_step.override_for(result.instance_type, result.zone)
        return Placement(
            instance_ids=result.instance_ids,
            instance_type=result.instance_type,
            capacity_type=result.capacity_type.value,
            zone=result.zone,
            hourly_usd=override.hourly_usd,
            reservation_id=override.reservation_id,
            gpu_memory_gib=self._policy.gpu_memory_of(result.instance_type),
            launched_at=self._now(),
            storage_gib=self._policy.root_volume_gib,
            storage_usd_per_gib_month=self._policy.cost.ebs_usd_per_gib_month,
        )


def _run_manifest(job: Job, data_bucket: str) -> dict[str, Any]:
    """What the node agent needs to run the job (its current stage): read by the agent, never
    passed to a shell."""
    spec = job.effective_spec
    stage_env = stage_environment(job, stage_data_root(data_bucket, job.job_id))
    return {
        "job_id": job.job_id,
        "name": spec.name,
        "image": spec.image,
        "command": list(spec.command),
        "env": {**spec.env, **stage_env},
        "gpus": spec.resources.gpus,
        "checkpoint": spec.checkpoint,
        "timeout_seconds": spec.timeout_seconds,
        # An earlier run was stopped (preempted, interrupted, resized, moved, restarted): the
        # job resumes from its checkpoint, if it writes one.
        "resume": job.prior_held_seconds > 0 and spec.checkpoint is not None,
        "stage": job.stage_name,
        # The next stage may run on these instances: the agent waits for it after this one.
        "await_next_stage": next_stage_may_reuse(job),
    }


# The queue's view of a job travels in the workflow's state as JSON.
_QUEUED_JOB: TypeAdapter[QueuedJob] = TypeAdapter(QueuedJob)


def queued_job(job: Job) -> QueuedJob:
    """What the queue needs to know of a job (its cost estimate comes from the plan)."""
    spec = job.effective_spec
    return QueuedJob(
        job_id=job.job_id,
        team=spec.team,
        priority=spec.priority,
        gpus=spec.resources.total_gpus,
        instances=spec.resources.nodes,
        enqueued_at=job.created_at,
        preempted_for=job.preempted_for,
        preemptions=job.preemptions,
    )


# The key of a node's finish (the Launch task's output, `$.run`) under which the job comes.
_FINISHED_JOB = "job"
# The largest job handed over that way. Step Functions fails an execution whose state passes
# 256 KiB (States.DataLimitExceeded, which no Catch takes), and a spec may be that large: a
# larger job stays behind, and the release step reads its record.
_FINISHED_JOB_MAX_BYTES = 32 * 1024


def _finish_output(report: NodeReport, job: Job) -> dict[str, Any]:
    """A node's finish as the waiting task gets it: the run's result and, when it is small
    enough, the job as the finish's write left it, for the release step to settle from in
    one write (unless the job changes meanwhile)."""
    output = _run_result(report, job)
    document = job.model_dump(mode="json")
    if len(json.dumps(document).encode()) <= _FINISHED_JOB_MAX_BYTES:
        output[_FINISHED_JOB] = document
    return output


def _finished_job(job_id: str, state: Mapping[str, Any]) -> Job | None:
    """The job as its node's finish left it, when the workflow carries it and it has a single
    stage (a multi-stage job's release may keep its instances: it reads the record)."""
    run = state.get("run")
    document = run.get(_FINISHED_JOB) if isinstance(run, Mapping) else None
    if not isinstance(document, Mapping):
        return None
    job = Job.model_validate(document)
    return job if job.job_id == job_id and not job.spec.stages else None


def _share_of(job: Job) -> RunningShare:
    """The share of the quotas a job was admitted with, as its shape now says."""
    resources = job.effective_spec.resources
    return RunningShare(job.spec.team, resources.total_gpus, resources.nodes)


def _settled(terminated: list[str], settlement: Settlement, ended: Job) -> dict[str, Any]:
    """What the release step hands the workflow: what it terminated, whether the job goes
    back to the queue (and why), and otherwise its final summary (`outcome`)."""
    result: dict[str, Any] = {
        "terminated": terminated,
        "requeue": settlement.requeue is not None,
        "reason": settlement.reason,
        "next_stage": {"here": False},
    }
    if settlement.requeue is None:
        result["outcome"] = ended.summary()
    return result


def run_end_of(state: Mapping[str, Any], at: float) -> RunEnd:
    """How the run ended, from the workflow's state when it reaches Release: the node's (or
    the instance's, or a cancel's) word under `run`, a launch that gave up, or the error a
    step failed with; `at` is when the run ended."""
    run = state.get("run")
    if isinstance(run, Mapping):
        exit_code = run.get("exit_code")
        code = exit_code if isinstance(exit_code, int) else None
        stage = run.get("stage")
        if run.get("cancelled"):
            kind = EndKind.CANCELLED
        elif run.get("interrupted"):
            kind = EndKind.INTERRUPTED
        else:
            kind = EndKind.NODE_LOST if code is None else EndKind.EXITED
        return RunEnd(
            kind,
            at,
            exit_code=code,
            oom=bool(run.get("oom")),
            reason=str(run.get("reason") or ""),
            stage=stage if isinstance(stage, str) else None,
        )
    launch = state.get("launch")
    if isinstance(launch, Mapping) and launch.get("give_up"):
        return RunEnd(EndKind.LAUNCH_GAVE_UP, at, reason=str(launch.get("error", "")))
    error = state.get("error")
    if isinstance(error, Mapping):
        name = str(error.get("Error", ""))
        kind = {
            "States.HeartbeatTimeout": EndKind.HEARTBEAT_TIMEOUT,
            "States.Timeout": EndKind.TIMED_OUT,
        }.get(name, EndKind.STEP_FAILED)
        return RunEnd(kind, at, reason=name, cause=str(error.get("Cause", "")))
    return RunEnd(EndKind.NO_RESULT, at)


def _run_result(report: NodeReport, job: Job | None = None) -> dict[str, Any]:
    """What a node's finish hands the workflow (and the job keeps)."""
    result: dict[str, Any] = {
        "exit_code": report.exit_code,
        "reason": report.reason,
        "interrupted": report.interrupted,
        "oom": report.oom,
    }
    stage = report.stage if report.stage is not None else job.stage_name if job else None
    if stage is not None:
        result["stage"] = stage  # which stage's run the release step looks at
    return result
