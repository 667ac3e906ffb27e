"""Release: the end of a run, settled by `domain.settlement.settle` and carried out (instances
terminated, the share of the quotas back, the job requeued or ended, or its next stage run on
the instances it holds); and the end of a job whose workflow ended without settling it.
"""

from __future__ import annotations

from typing import Any

from gpufleet.domain.arrays import holds_settled_by
from gpufleet.domain.fair_share import UsageCharge, charge
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.settlement import (
    ChargeUsage,
    EndKind,
    PublishStatusChange,
    Record,
    ReleaseShare,
    RunEnd,
    RunStageHere,
    Settlement,
    Terminate,
    settle,
)
from gpufleet.ports import Freed, RunningShare, StatusChange
from gpufleet.services.lifecycle_base import (
    LifecycleBase,
    control_key,
    run_manifest,
    run_manifest_key,
)
from gpufleet.services.run_reports import finished_job
from gpufleet.services.workflow_state import (
    LaunchStepResult,
    RunOutcome,
    WorkflowState,
)
from gpufleet.topology import CONTROL_RUN_STAGE


class ReleaseSteps(LifecycleBase):
    """Release, and the end of an abandoned job."""

    def release(self, job_id: str, state: WorkflowState | None = None) -> dict[str, Any]:
        """Settle the end of the job's run (`domain.settlement`) from what the workflow saw,
        and carry it out: terminate every instance of the job, give its share of the quotas
        back to the queue, and either send the job back to the queue (a checkpointed,
        interrupted or retryable run, or the next stage of a multi-stage job: `requeue`) or
        record its final status and cost (`outcome`). A stage whose successor asks for its
        instances and fits on them keeps them instead (`next_stage.here`: the workflow goes
        straight back to Launch)."""
        state = state or WorkflowState()
        end = run_end_of(state, self._now())
        finished = finished_job(job_id, state)
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
            recorded = WorkflowState(run=RunOutcome.model_validate(job.run_result))
            settlement = self._settle(job, run_end_of(recorded, self._now()))
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
            reservations=self._policy.reservations,
        )

    def _release_instances(self, job: Job) -> list[str]:
        """Terminate every instance of the job, and what lives with them (the placement
        group of a multi-node job)."""
        terminated = self._ports.fleet.terminate_job_instances(job.job_id)
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
                if self._ports.queue.release(job.job_id, self._charge(command)):
                    self._capacity_freed(job.job_id)
            elif isinstance(command, Record):
                ended, moved = self._write(job, command.status, command.changes)
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
        share = next((c for c in settlement.commands if isinstance(c, ReleaseShare)), None)
        if job.status.terminal or record is None or share is None:
            return None
        now = self._now()
        change = StatusChange(
            job.job_id,
            record.status,
            frozenset({job.status}),
            now,
            record.changes,
            version=job.version,
        )
        freed = self._ports.queue.record_release(
            change,
            _share_of(job),
            self._charge(share),
            settles=holds_settled_by(job.job_id, job.array_id),
        )
        if freed is None:
            return None
        ended = job.with_changes(record.changes).model_copy(
            update={"status": record.status, "updated_at": now, "version": job.version + 1}
        )
        if any(isinstance(c, PublishStatusChange) for c in settlement.commands):
            # The write asked whether jobs are held on this end: the pass they need, if any, is
            # woken below (`Capacity Freed`), not by the end (`DependencyRule`).
            self._status_changed(ended, job.status, holds_asked=True)
        if freed is Freed.OTHERS_WAIT:
            self._capacity_freed(job.job_id)
        return _settled(terminated, settlement, ended)

    def _charge(self, used: ReleaseShare | ChargeUsage) -> UsageCharge:
        """The run's GPU-hours as its team's fair-share ledger takes them."""
        half_life = self._policy.queue.fair_share_half_life_seconds
        return charge(used.gpu_hours, used.at, half_life)

    def _run_stage_here(
        self, job: Job, settlement: Settlement, state: WorkflowState
    ) -> dict[str, Any]:
        """Carry out a settlement that runs the job's next stage on its instances: record the
        stage's end and the move, end the instances it does not need, tell the nodes to run
        the (new) current stage, and give the workflow its plan: Launch finds the instances in
        place and waits for the nodes' report."""
        terminated: list[str] = []
        for command in settlement.commands:
            if isinstance(command, Record):
                job = self._ports.jobs.update(job.job_id, self._now(), command.changes)
            elif isinstance(command, Terminate) and command.instance_ids:
                terminated = list(command.instance_ids)
                self._ports.fleet.terminate_instances(terminated)
            elif isinstance(command, ChargeUsage):
                # After the record: a repeated step finds the stage moved past, charging none.
                self._ports.queue.charge(command.team, self._charge(command))
        self._ports.objects.put_json(
            run_manifest_key(job.job_id),
            run_manifest(
                job,
                self._policy.data_bucket,
                self._policy.data_sources,
                self._policy.instance_type_of,
            ),
        )
        self._ports.objects.put_json(
            control_key(job.job_id), {"action": CONTROL_RUN_STAGE, "stage": job.stage_name}
        )
        attempt = state.launch.attempt if state.launch is not None else 0
        return {
            "terminated": terminated,
            "requeue": False,
            "reason": settlement.reason,
            "next_stage": {
                "here": True,
                "plan": self._plan(job).model_dump(mode="json"),
                "launch": LaunchStepResult(step=0, attempt=attempt + 1).model_dump(),
            },
        }


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


def run_end_of(state: WorkflowState, at: float) -> RunEnd:
    """How the run ended, from the workflow's state when it reaches Release: the node's (or
    the instance's, or a cancel's) word under `run`, a launch that gave up, or the error a
    step failed with; `at` is when the run ended."""
    run, launch, error = state.run, state.launch, state.error
    if run is not None:
        code = run.exit_code
        if run.cancelled:
            kind = EndKind.CANCELLED
        elif run.interrupted:
            kind = EndKind.INTERRUPTED
        else:
            kind = EndKind.NODE_LOST if code is None else EndKind.EXITED
        return RunEnd(
            kind, at, exit_code=code, oom=run.oom, reason=run.reason or "", stage=run.stage
        )
    if launch is not None and launch.give_up:
        return RunEnd(EndKind.LAUNCH_GAVE_UP, at, reason=launch.error)
    if error is not None:
        kind = {
            "States.HeartbeatTimeout": EndKind.HEARTBEAT_TIMEOUT,
            "States.Timeout": EndKind.TIMED_OUT,
        }.get(error.error, EndKind.STEP_FAILED)
        return RunEnd(kind, at, reason=error.error, cause=error.cause)
    return RunEnd(EndKind.NO_RESULT, at)


def _share_of(job: Job) -> RunningShare:
    """The share of the quotas a job was admitted with, as its shape now says."""
    resources = job.effective_spec.resources
    return RunningShare(job.spec.team, resources.total_gpus, resources.nodes)
