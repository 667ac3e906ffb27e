"""Launch: one step of the plan (one capacity type over its offerings), against the capacity
memory of the moment; a launched job parks the workflow's token with its placement.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.cost import launch_costs
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.job import Job, JobChanges, JobStatus, Placement
from gpufleet.domain.launch import (
    CapacityType,
    LaunchError,
    LaunchRequest,
    LaunchResult,
    shortage_keys,
)
from gpufleet.domain.node_reports import (
    NODE_KEY_BYTES,
    NODE_KEY_DOCUMENT_MAX_BYTES,
    NodeKey,
    node_key_object,
)
from gpufleet.domain.planning import LaunchPlan, LaunchStep, job_observed_hazard
from gpufleet.domain.reserved import warned_blocks
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.ports import ObjectMissing, StatusChange
from gpufleet.services.lifecycle_base import (
    LifecycleBase,
    control_key,
    run_manifest,
    run_manifest_key,
)
from gpufleet.services.workflow_state import Admission, LaunchStepResult

# For how long after an admission a launch relies on what it said of capacity shortages.
ADMISSION_KNOWS_SHORTAGES_SECONDS = 60.0


class Launched(BaseModel):
    """The instances a launch got, for the Launch function's metrics."""

    model_config = ConfigDict(frozen=True)

    capacity_type: CapacityType
    instances: int = Field(ge=1)
    ondemand_fallback: bool  # on-demand, after an earlier step of the plan tried spot


def _unheard(_launched: Launched) -> None:
    """For callers that count no launches."""


class LaunchSteps(LifecycleBase):
    """Launch."""

    def launch(
        self,
        job_id: str,
        plan: LaunchPlan,
        step: int,
        attempt: int,
        task_token: str,
        admission: Admission | None = None,
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
            job_id, plan, step, attempt, tries, task_token, admission or Admission(), launched
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
        admission: Admission,
        launched: Callable[[Launched], None],
    ) -> LaunchStepResult | None:
        job = self._ports.jobs.get(job_id)
        if job.status.terminal:
            return LaunchStepResult(step=step, attempt=attempt, give_up=True, error="job ended")
        if job.placement is not None:
            # A retry of a launch that already succeeded: park the token, do not launch again.
            job = self._ports.jobs.update(job_id, self._now(), JobChanges(task_token=task_token))
            if job.run_result is not None:  # and its node already finished
                self._ports.workflow.complete_task(task_token, job.run_result)
            return None
        self._ports.objects.put_json(run_manifest_key(job_id), self._manifest(job))
        self._keep_node_key(job)
        # A new run starts with no instruction pending: a checkpoint request was for the last.
        self._ports.objects.put_json(control_key(job_id), {"action": "run"})
        capacity_type = plan.steps[step].capacity_type
        expected = DurationEstimate(plan.expected_seconds, plan.expected_source)
        launch_step = self._current_offerings(
            job, capacity_type, expected, self._memory_may_hold(admission, tries)
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
                placement = self._placement(result, launch_step)
                # The manifest again, now naming the nodes: each finds its rank and its peers.
                self._ports.objects.put_json(
                    run_manifest_key(job_id),
                    self._manifest(job.model_copy(update={"placement": placement})),
                )
                changes = self._admitted_changes(job, admission) | JobChanges(
                    placement=placement,
                    started_instances=[],
                    node_beats={},
                    attempts=job.attempts + 1,
                    ondemand_fallback=fell_back,
                    task_token=task_token,
                    # A new run's alarms start afresh (MetricWatch acts on each going off).
                    alarming=[],
                )
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

    def _keep_node_key(self, job: Job) -> None:
        """The key the run about to launch signs its reports with (domain/node_reports.py): a
        new one for a new run; the one already made when a launch of this run is tried again
        (its instances may have booted and read it before this launch died)."""
        run = job.attempts + 1
        key_object = node_key_object(job.job_id)
        try:
            raw = self._ports.objects.get_bytes(key_object, NODE_KEY_DOCUMENT_MAX_BYTES)
        except ObjectMissing:
            raw = None
        if raw is not None and NodeKey.from_document(raw).run == run:
            return
        key = NodeKey(run=run, secret=secrets.token_bytes(NODE_KEY_BYTES))
        self._ports.objects.put_json(key_object, key.document())

    def _manifest(self, job: Job) -> dict[str, Any]:
        return run_manifest(
            job,
            self._policy.data_bucket,
            self._policy.data_sources,
            self._policy.instance_type_of,
        )

    def _record_launch(self, job: Job, changes: JobChanges) -> Job:
        """Move the job to LAUNCHING and tell the queue: its hourly cost, for the fleet's cost
        per hour, and for a job with a budget the moment its cost will reach it, for the
        dispatcher's passes to stop it then. One write spanning both, as a rule; two when that
        one finds the job moved on or its share released (a repeated step, a race)."""
        now = self._now()
        launching = job.with_changes(changes).model_copy(
            update={"status": JobStatus.LAUNCHING, "updated_at": now}
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

    @staticmethod
    def _admitted_changes(job: Job, admission: Admission) -> JobChanges:
        """The first launch after an admission notes the wait it ended."""
        if job.status is not JobStatus.QUEUED:
            return JobChanges()
        changes = JobChanges(preempted_for=None)
        admitted_at, queued_at = admission.admitted_at, admission.queued_at
        if admitted_at is not None and queued_at is not None:
            waited = job.waited_seconds + max(0.0, admitted_at - queued_at)
            changes |= JobChanges(waited_seconds=waited)
        if admitted_at is not None and job.first_admitted_at is None:
            changes |= JobChanges(first_admitted_at=admitted_at)
        return changes

    def _memory_may_hold(self, admission: Admission, tries: int) -> bool:
        """Whether the capacity memory may hold a shortage now. The first try after a fresh
        admission knows from it (the admission read when the latest remembered shortage
        expires), so the usual launch does not read the memory. A shortage noted since the
        admission is missed: at worst one CreateFleet meets the shortage again."""
        until, admitted_at = admission.shortages_until, admission.admitted_at
        if tries or until is None or admitted_at is None:
            return True
        now = self._now()
        return until > now or now - admitted_at > ADMISSION_KNOWS_SHORTAGES_SECONDS

    def _current_offerings(
        self,
        job: Job,
        capacity_type: CapacityType,
        expected: DurationEstimate,
        memory_may_hold: bool = True,
    ) -> LaunchStep | None:
        """This capacity type's offerings for the job as it now is, minus those without
        capacity now."""
        now = self._now()
        # A launch into a reservation always reads the memory: a Capacity Block EC2 warned of
        # since the job's admission is in it, and takes no run (`reserved.warned_blocks`).
        reads = memory_may_hold or capacity_type is CapacityType.RESERVED
        unavailable = self._ports.capacity.unavailable(now) if reads else frozenset()
        try:
            plan = self._planner(
                job.effective_spec,
                unavailable=unavailable,
                expected=expected,
                free_reservations=self._free_reservations(warned_blocks(unavailable)),
                observed_hazard=job_observed_hazard(job),
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
            zone=result.availability_zone or result.zone,
            hourly_usd=override.hourly_usd,
            reservation_id=override.reservation_id,
            gpu_memory_gib=self._policy.gpu_memory_of(result.instance_type),
            launched_at=self._now(),
            storage_gib=self._policy.root_volume_gib,
            storage_usd_per_gib_month=self._policy.cost.ebs_usd_per_gib_month,
            private_ips=result.private_ips,
        )
