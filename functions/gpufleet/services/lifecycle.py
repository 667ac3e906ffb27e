"""The steps of a job's lifecycle, each called by one task of the state machine.

Every step is safe to run twice: the state machine retries tasks, events arrive twice and out of
order, and a Lambda can die half way. Status changes are conditional writes; a step that finds
its work already done returns what it would have returned the first time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.config import MetricPolicy, Reservation
from gpufleet.domain.cost import fleet_hourly_usd, held_seconds, run_cost_usd
from gpufleet.domain.duration import DurationEstimate, PastRun, estimate_duration
from gpufleet.domain.job import IllegalTransition, Job, JobStatus, Placement
from gpufleet.domain.launch import (
    CapacityType,
    LaunchError,
    LaunchRequest,
    LaunchResult,
    shortage_keys,
)
from gpufleet.domain.planning import LaunchPlan, LaunchStep, outcome_of
from gpufleet.domain.queueing import QueuedJob
from gpufleet.domain.retry import (
    DEFAULT_MAX_INTERRUPTIONS,
    IDLE,
    INTERRUPTED,
    OUT_OF_MEMORY,
    OVERHEATED,
    PREEMPTED,
    RECLAIMED,
    RESIZED,
    RETRY,
    after_run,
)
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.spec import JobSpec, Resources
from gpufleet.ports import Ports, QueueEntry
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    DETAIL_CAPACITY_FREED,
    DETAIL_JOB_FLAGGED,
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


# How many of a team's recent jobs are read to estimate a run time.
HISTORY_DEPTH = 100


@dataclass(frozen=True)
class LifecyclePolicy:
    region: str
    capacity_memory_seconds: int = 300
    reservations: tuple[Reservation, ...] = ()
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS
    gpu_memory_of: Callable[[str], float] = lambda _instance_type: 0.0
    metrics: MetricPolicy = field(default_factory=MetricPolicy)


class JobAlreadyEnded(Exception):
    def __init__(self, job_id: str, status: JobStatus) -> None:
        super().__init__(f"job {job_id} already ended: {status.value}")


class NodeReport(BaseModel):
    """What a node agent says about its job (the `detail` of its event)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str = Field(pattern=r"^j-[0-9a-f]{20}$")
    instance_id: str = Field(max_length=64)
    phase: Literal["started", "heartbeat", "finished"]
    exit_code: int | None = None
    reason: str = Field(default="", max_length=2000)
    # The node saw its own spot interruption notice (IMDS) and checkpointed.
    interrupted: bool = False
    # The container died of GPU out-of-memory (recognised in its last log lines).
    oom: bool = False


class LaunchStepResult(BaseModel):
    """What the Launch task hands back to the state machine's Choice."""

    step: int
    attempt: int
    launched: bool = False
    retry_later: bool = False
    give_up: bool = False
    wait_seconds: int = 1  # before the next try, when retry_later
    error: str = ""


FLAG_LOW_UTILIZATION = "low-utilization"
FLAG_OVERHEATING = "overheating"


def run_manifest_key(job_id: str) -> str:
    return f"{RUNS_PREFIX}{job_id}/run.json"


def control_key(job_id: str) -> str:
    """Where the node agent looks for instructions (checkpoint and stop)."""
    return f"{RUNS_PREFIX}{job_id}/control.json"


class LifecycleService:
    def __init__(self, ports: Ports, planner: Planner, policy: LifecyclePolicy) -> None:
        self._ports = ports
        self._planner = planner
        self._policy = policy

    # -- state machine tasks -------------------------------------------------------------------

    def prepare(self, job_id: str) -> dict[str, Any]:
        """Check the stored job, queue it, and plan its launch."""
        job = self._ports.jobs.get(job_id)
        plan = self._plan(job)
        self._move(job, JobStatus.QUEUED)
        return {
            "job_id": job_id,
            "plan": plan.model_dump(mode="json"),
            "launch": LaunchStepResult(step=0, attempt=0).model_dump(),
        }

    def enqueue(self, job_id: str, task_token: str, plan: LaunchPlan) -> None:
        """Put the job in the admission queue with the workflow's token, and wake a dispatcher.
        `plan` is the one Prepare or Requeue made: its first choice is the cost estimate."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            self._ports.workflow.complete_task(task_token, {"cancelled": True})
            return
        spec = job.effective_spec
        entry = QueueEntry(
            job=QueuedJob(
                job_id=job_id,
                team=spec.team,
                priority=spec.priority,
                gpus=spec.resources.total_gpus,
                instances=spec.resources.nodes,
                enqueued_at=job.created_at,
                preempted_for=job.preempted_for,
                preemptions=job.preemptions,
                estimated_cost_usd=round(plan.estimated_cost_usd(), 6),
            ),
            task_token=task_token,
            queued_at=self._now(),
        )
        self._ports.queue.enqueue(entry)
        self._ports.events.publish(
            CONTROL_PLANE_SOURCE,
            DETAIL_JOB_QUEUED,
            {"job_id": job_id, "team": spec.team, "priority": spec.priority.value},
        )

    def requeue(self, job_id: str) -> LaunchPlan:
        """Back to the queue after a checkpoint (preemption, reclaim, spot interruption) or for
        a retry: the run's cost is kept, its placement and workflow plumbing are cleared, and
        the launch is planned again for what the job now asks for (a resize, more GPU memory)."""
        job = self._ports.jobs.get(job_id)
        if job.status is JobStatus.QUEUED:
            return self._plan(job)  # a repeated step
        run_cost, run_held = 0.0, 0.0
        if job.placement is not None:
            released_at = job.released_at if job.released_at is not None else self._now()
            run_cost = run_cost_usd(job.placement, released_at)
            run_held = held_seconds(job.placement, released_at)
        counter = {
            INTERRUPTED: "interruptions",
            RETRY: "retries",
            OUT_OF_MEMORY: "retries",
            PREEMPTED: "preemptions",
            RECLAIMED: "preemptions",
        }.get(job.drain_reason or "")
        changes: dict[str, Any] = {}
        if counter is not None:
            changes[counter] = getattr(job, counter) + 1
        if job.drain_reason == OUT_OF_MEMORY and job.placement is not None:
            # Next time, only GPUs with more memory than those it ran out of.
            resources = job.effective_spec.resources
            floor = job.placement.gpu_memory_gib + 0.5
            changes["resources_override"] = resources.model_copy(
                update={"gpu_memory_gib": max(resources.gpu_memory_gib, floor)}
            )
        self._move(
            job,
            JobStatus.QUEUED,
            {
                "placement": None,
                "released_at": None,
                "task_token": None,
                "run_result": None,
                "drain_reason": None,
                "drain_requested_at": None,
                "prior_cost_usd": job.prior_cost_usd + run_cost,
                "prior_held_seconds": job.prior_held_seconds + run_held,
                **changes,
            },
        )
        return self._plan(self._ports.jobs.get(job_id))

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
        when its workflow gets round to it; the workflow then records the cost."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            raise JobAlreadyEnded(job_id, job.status)
        entry = self._ports.queue.remove(job_id)
        job = self._move(job, JobStatus.CANCELLED, {"failure_reason": "cancelled"})
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

    def resize(self, job_id: str, resources: Resources) -> dict[str, Any]:
        """Give a job a new shape. A waiting job waits with it; a running one checkpoints and
        resumes on the new shape without being resubmitted."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            raise JobAlreadyEnded(job_id, job.status)
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

    def gpus_idle(self, job_id: str) -> list[str]:
        """The job's GPUs stayed below the utilization threshold for the whole window: flag
        it, and checkpoint-and-release it when its spec says so."""
        job = self._ports.jobs.get(job_id)
        if job.status is not JobStatus.RUNNING:
            return job.flags
        flags = sorted({*job.flags, FLAG_LOW_UTILIZATION})
        self._ports.jobs.update(job_id, self._now(), {"flags": flags})
        self._ports.events.publish(
            CONTROL_PLANE_SOURCE, DETAIL_JOB_FLAGGED, {"job_id": job_id, "flags": flags}
        )
        if job.effective_spec.on_idle == "release":
            self.drain(job_id, IDLE)
        return flags

    def gpus_hot(self, job_id: str) -> list[str]:
        """A GPU of the job ran above the temperature limit: tell the operators, and move the
        job off that hardware (checkpoint, requeue, resume elsewhere)."""
        job = self._ports.jobs.get(job_id)
        if job.status is not JobStatus.RUNNING:
            return job.flags
        flags = sorted({*job.flags, FLAG_OVERHEATING})
        self._ports.jobs.update(job_id, self._now(), {"flags": flags})
        placement = job.placement
        where = f" on {', '.join(placement.instance_ids)}" if placement else ""
        self._ports.notifier.notify(
            f"gpufleet: job {job.spec.name} overheating",
            f"A GPU of job {job_id} ({job.spec.name}, team {job.spec.team}){where} ran above "
            f"{self._policy.metrics.hot_temperature_celsius:g} C. The job is checkpointed and "
            "moved to other hardware; check the instance's cooling and health.",
        )
        self.drain(job_id, OVERHEATED)
        return flags

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

    def instance_gone(self, instance_id: str, state: str) -> str | None:
        """An instance of a running job stopped or terminated without gpufleet releasing it
        (a spot reclaim, a hardware failure, someone's console): the run ends now, and the
        release step decides between requeue (spot) and retry."""
        job_id = self._ports.fleet.job_of(instance_id)
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
        result = {
            "exit_code": None,
            "reason": f"instance {instance_id} is {state}",
            "interrupted": placement.capacity_type == CapacityType.SPOT.value,
        }
        job = self._ports.jobs.update(job_id, self._now(), {"run_result": result})
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)
        return job_id

    def launch(self, job_id: str, plan: LaunchPlan, step: int, attempt: int) -> LaunchStepResult:
        """Try one step of the plan (one capacity type over its offerings)."""
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            return LaunchStepResult(step=step, attempt=attempt, give_up=True, error="job ended")
        job = self._move(job, JobStatus.LAUNCHING)
        if job.placement is not None:
            # A retry of a launch that already succeeded: do not launch again.
            return LaunchStepResult(step=step, attempt=attempt, launched=True)
        self._ports.objects.put_json(run_manifest_key(job_id), _run_manifest(job))
        # A new run starts with no instruction pending: a checkpoint request was for the last.
        self._ports.objects.put_json(control_key(job_id), {"action": "run"})
        capacity_type = plan.steps[step].capacity_type
        expected = DurationEstimate(plan.expected_seconds, plan.expected_source)
        launch_step = self._current_offerings(job.effective_spec, capacity_type, expected)
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
                fell_back = capacity_type is CapacityType.ON_DEMAND and any(
                    s.capacity_type is CapacityType.SPOT for s in plan.steps[:step]
                )
                self._record_placement(job, result, launch_step, fell_back)
                self._ports.alarms.create(job_id, self._policy.metrics)
                return LaunchStepResult(step=step, attempt=attempt + 1, launched=True)
            self._ports.capacity.remember(
                shortage_keys(result, self._policy.region),
                until=self._now() + self._policy.capacity_memory_seconds,
            )
        next_move = plan.after_failure(step, attempt + 1, result.error_category)
        return LaunchStepResult(
            step=next_move.step,
            attempt=attempt + 1,
            retry_later=next_move.retry_later,
            give_up=next_move.give_up,
            wait_seconds=max(1, next_move.wait_seconds),
            error="; ".join(f"{e.code}: {e.message}" for e in result.errors),
        )

    def await_node(self, job_id: str, task_token: str) -> None:
        """Park the workflow's token; complete it at once if the node already finished."""
        job = self._ports.jobs.update(job_id, self._ports.clock.now(), {"task_token": task_token})
        if job.run_result is not None:
            self._ports.workflow.complete_task(task_token, job.run_result)

    def node_report(self, report: NodeReport) -> None:
        """A node's start, heartbeat or finish. Reports from instances the job does not hold
        (stale, or forged) are ignored."""
        job = self._ports.jobs.get(report.job_id)
        if job.placement is None or report.instance_id not in job.placement.instance_ids:
            return
        if report.phase == "started":
            self._move(job, JobStatus.RUNNING)
        elif report.phase == "heartbeat":
            if job.task_token is not None:
                self._ports.workflow.heartbeat(job.task_token)
        else:
            self._node_finished(job, report)

    def _node_finished(self, job: Job, report: NodeReport) -> None:
        # A finish can overtake its start; the node evidently ran.
        job = self._move(job, JobStatus.RUNNING)
        result = {
            "exit_code": report.exit_code,
            "reason": report.reason,
            "interrupted": report.interrupted,
            "oom": report.oom,
        }
        job = self._ports.jobs.update(job.job_id, self._ports.clock.now(), {"run_result": result})
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)

    def release(self, job_id: str, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Terminate every instance of the job, note when its cost stopped, give its share of
        the quotas back to the queue, and say whether the job goes back to it (a checkpointed,
        interrupted or retryable run) or ends here."""
        terminated = self._ports.fleet.terminate_job_instances(job_id)
        self._ports.alarms.delete(job_id)
        job = self._ports.jobs.get(job_id)
        if job.effective_spec.resources.nodes > 1:
            self._ports.fleet.delete_placement_group(job_id)
        changes: dict[str, Any] = {}
        if job.released_at is None and job.placement is not None:
            changes["released_at"] = self._now()
        released_at = changes.get("released_at", job.released_at)
        ran = held_seconds(job.placement, released_at) if job.placement and released_at else None
        verdict = after_run(
            job.spec,
            state or {},
            drain_reason=job.drain_reason,
            retries=job.retries,
            interruptions=job.interruptions,
            ran_seconds=ran,
            max_interruptions=self._policy.max_interruptions,
        )
        if verdict.requeue and not job.status.terminal:
            changes["drain_reason"] = verdict.kind
            changes["failure_reason"] = verdict.reason
        if changes:
            self._ports.jobs.update(job_id, self._now(), changes)
        if self._ports.queue.release(job_id):
            self._ports.events.publish(
                CONTROL_PLANE_SOURCE, DETAIL_CAPACITY_FREED, {"job_id": job_id}
            )
        return {
            "terminated": terminated,
            "requeue": verdict.requeue and not job.status.terminal,
            "reason": verdict.reason,
        }

    def record_outcome(self, job_id: str, state: Mapping[str, Any]) -> dict[str, Any]:
        """Set the final status and cost from what the workflow saw."""
        job = self._ports.jobs.get(job_id)
        released_at = job.released_at if job.released_at is not None else self._now()
        if job.status.terminal:
            if job.cost_usd is None and job.placement is not None:  # cancelled while running
                cost = job.prior_cost_usd + run_cost_usd(job.placement, released_at)
                job = self._ports.jobs.update(job_id, self._now(), {"cost_usd": round(cost, 6)})
            return job.summary()
        ran = held_seconds(job.placement, released_at) if job.placement else None
        status, reason, exit_code = outcome_of(
            state, ran_seconds=ran, timeout_seconds=job.spec.timeout_seconds
        )
        if job.drain_reason == INTERRUPTED:
            # Stopped for a spot interruption and not requeued: the interruption cap was hit.
            status = JobStatus.FAILED
            reason = f"interrupted {job.interruptions + 1} times; giving up"
        elif job.drain_reason == IDLE:
            status = JobStatus.CANCELLED
            reason = "released at a checkpoint: its GPUs stayed idle (on_idle: release)"
        changes: dict[str, Any] = {"failure_reason": reason or None, "exit_code": exit_code}
        run_cost = run_cost_usd(job.placement, released_at) if job.placement else 0.0
        if job.placement is not None or job.prior_cost_usd:
            changes["cost_usd"] = round(job.prior_cost_usd + run_cost, 6)
        job = self._move(job, status, changes)
        return job.summary()

    # -- helpers -------------------------------------------------------------------------------

    def _now(self) -> float:
        return self._ports.clock.now()

    def _move(self, job: Job, target: JobStatus, changes: dict[str, Any] | None = None) -> Job:
        """Move to `target` unless the job is already there (a repeated step)."""
        if job.status == target:
            return job
        try:
            moved = self._ports.jobs.transition(job.job_id, target, self._now(), changes)
        except IllegalTransition as exc:
            if exc.current == target:
                return self._ports.jobs.get(job.job_id)
            raise
        detail = {
            "job_id": moved.job_id,
            "name": moved.spec.name,
            "team": moved.spec.team,
            "status": target.value,
            "previous": job.status.value,
        }
        self._ports.events.publish(CONTROL_PLANE_SOURCE, DETAIL_JOB_STATUS_CHANGED, detail)
        return moved

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
        history = [
            PastRun(past.spec.image, past.spec.resources, held_seconds(past.placement, released))
            for past in self._ports.jobs.recent_for_team(spec.team, HISTORY_DEPTH)
            if past.status is JobStatus.SUCCEEDED
            and past.placement is not None
            and (released := past.released_at) is not None
        ]
        return estimate_duration(spec, history)

    def _current_offerings(
        self, spec: JobSpec, capacity_type: CapacityType, expected: DurationEstimate
    ) -> LaunchStep | None:
        """This capacity type's offerings for the spec, minus those without capacity now."""
        unavailable = self._ports.capacity.unavailable(self._now())
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

    def _record_placement(
        self, job: Job, result: LaunchResult, launch_step: LaunchStep, fell_back: bool
    ) -> None:
        assert result.instance_type is not None
        override = launch_step.override_for(result.instance_type, result.zone)
        placement = Placement(
            instance_ids=result.instance_ids,
            instance_type=result.instance_type,
            capacity_type=result.capacity_type.value,
            zone=result.zone,
            hourly_usd=override.hourly_usd,
            reservation_id=override.reservation_id,
            gpu_memory_gib=self._policy.gpu_memory_of(result.instance_type),
            launched_at=self._now(),
        )
        self._ports.jobs.update(
            job.job_id,
            self._now(),
            {"placement": placement, "attempts": job.attempts + 1, "ondemand_fallback": fell_back},
        )


def _run_manifest(job: Job) -> dict[str, Any]:
    """What the node agent needs to run the job: read by the agent, never passed to a shell."""
    spec = job.effective_spec
    return {
        "job_id": job.job_id,
        "name": spec.name,
        "image": spec.image,
        "command": list(spec.command),
        "env": dict(spec.env),
        "gpus": spec.resources.gpus,
        "checkpoint": spec.checkpoint,
        "timeout_seconds": spec.timeout_seconds,
        # An earlier run was stopped at a checkpoint: the job resumes from it.
        "resume": bool(job.preemptions or job.interruptions) and spec.checkpoint is not None,
    }


def cost_report(job: Job) -> dict[str, Any]:
    """The job's cost line, as the demo and the CLI print it."""
    placement = job.placement
    if placement is None or job.released_at is None:
        return {
            "hourly_usd": None,
            "held_seconds": round(job.prior_held_seconds, 3),
            "cost_usd": job.cost_usd or 0.0,
        }
    # Every run of the job counts: a preempted or interrupted run was paid for too. Over
    # several runs (possibly on different types) the hourly price is the held-time average, so
    # that cost = hourly x held / 3600 always holds.
    held = job.prior_held_seconds + held_seconds(placement, job.released_at)
    hourly = fleet_hourly_usd(placement)
    if job.prior_held_seconds and job.cost_usd is not None and held > 0:
        hourly = job.cost_usd * 3600 / held
    return {
        "hourly_usd": round(hourly, 6),
        "held_seconds": round(held, 3),
        "cost_usd": job.cost_usd,
    }
