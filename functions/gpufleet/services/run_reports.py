"""What the fleet says about a run: its node's start, heartbeats and finish, and the instance
events (a spot warning, an instance gone) that end it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.job import (
    JOB_ID_PATTERN,
    DroppedReport,
    IllegalTransition,
    Job,
    JobChanges,
    JobNotFound,
    JobStatus,
)
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.node_reports import (
    NODE_KEY_DOCUMENT_MAX_BYTES,
    OTHER_RUN,
    NodeKey,
    ReportNotAuthentic,
    node_key_object,
    verify_report,
)
from gpufleet.domain.rendezvous import all_started, ends_run, silent_nodes
from gpufleet.domain.settlement import INTERRUPTED
from gpufleet.domain.spec import MAX_NODES
from gpufleet.errors import TransientError
from gpufleet.ports import ObjectMissing
from gpufleet.services.lifecycle_base import LifecycleBase
from gpufleet.services.workflow_state import WorkflowState

# A process's exit status as Linux reports it, and docker with it: 0 to 255, a death by signal
# n as 128 + n (the agent reports it so). Anything else is no exit status; an unbounded number
# is not even one DynamoDB can store (38 digits at most).
MAX_EXIT_CODE = 255
# A node's start, and a multi-node run's heartbeat, is recorded in a write conditioned on the
# job's version: this many tries when other nodes' writes win the race.
NODE_WRITE_TRIES = 8


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
    # The run's node count, as the node's manifest says: a report of a multi-node run is read
    # against the job's record (which node it is), never applied in one blind write.
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)


class NodeReportNotRecorded(TransientError):
    """Other writes kept winning over a node's start or heartbeat: the report is delivered
    again."""

    def __init__(self, job_id: str, instance_id: str, phase: str) -> None:
        super().__init__(f"the {phase} of {instance_id} (job {job_id}) lost every write race")


class RunReports(LifecycleBase):
    """Node reports and the instance events that end a run."""

    def authenticate(self, report: NodeReport, detail: Mapping[str, Any]) -> None:
        """Raise ReportNotAuthentic unless the report's `detail`, as it came, is signed with
        the key of its job's current run (`runs/<job>/node-key`, which a job's container cannot
        read): what the agent on the job's instance signs. Checked before `node_report` hears
        it; nothing is read of the job or changed."""
        try:
            raw = self._ports.objects.get_bytes(
                node_key_object(report.job_id), NODE_KEY_DOCUMENT_MAX_BYTES
            )
        except ObjectMissing:  # no run of this job was launched: no report can be of one
            raise ReportNotAuthentic(OTHER_RUN, report.job_id) from None
        verify_report(detail, NodeKey.from_document(raw))

    def node_report(self, report: NodeReport) -> DroppedReport | None:
        """A node's start, heartbeat or finish, once `authenticate` took it. A report for a
        job that does not exist, or from an instance the job does not hold (stale, or sent by
        another of the job's runs), changes nothing and is dropped: the answer says which
        (None: the report was heard). One about a stage the job has moved past, or delivered
        again after the job ended, is ignored."""
        try:
            if report.phase == "heartbeat" or report.stage is not None or report.nodes > 1:
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
            self._node_started(job, report.instance_id)
        elif report.phase == "heartbeat":
            self._node_beat(job, report.instance_id)
        elif ends_run(job.placement.instance_ids, report.instance_id, report.exit_code):
            self._node_finished(job, report)
        # else a worker node that ended well: the main node's exit ends the run
        return None

    def _node_started(self, job: Job, instance_id: str) -> None:
        """Note the node's start; the job is RUNNING once every node of its run has started.
        Nodes start together: each write is conditioned on the job as it was read, and one
        that lost the race reads the job again."""
        for _ in range(NODE_WRITE_TRIES):
            placement = job.placement
            if (
                job.status.terminal
                or placement is None
                or instance_id not in placement.instance_ids
            ):
                return  # the run ended meanwhile
            started = sorted({*job.started_instances, instance_id})
            everyone = all_started(placement.instance_ids, started)
            target = JobStatus.RUNNING if everyone else job.status
            if started == job.started_instances and job.status is target:
                return  # a start reported again
            try:
                moved = self._ports.jobs.transition(
                    job.job_id,
                    target,
                    self._now(),
                    JobChanges(started_instances=started),
                    sources=[job.status],
                    holding=instance_id,
                    version=job.version,
                )
            except IllegalTransition as exc:
                job = exc.job if exc.job is not None else self._ports.jobs.get(job.job_id)
                continue
            if moved.status is not job.status:
                self._status_changed(moved, job.status)
            return
        raise NodeReportNotRecorded(job.job_id, instance_id, "start")

    def _node_beat(self, job: Job, instance_id: str) -> None:
        """A node's heartbeat keeps the run's task alive. A multi-node run's beats are noted per
        node, and the task's heartbeat is sent only while none of its nodes is silent: a node
        whose agent died fails the run for all of them (the task times out, as for a lost
        node), however well its peers beat."""
        placement = job.placement
        if placement is not None and len(placement.instance_ids) > 1:
            job_now = self._note_beat(job, instance_id)
            if job_now is None or job_now.placement is None:
                return  # the run ended meanwhile
            job, placement = job_now, job_now.placement
            if silent_nodes(
                placement.instance_ids,
                job.node_beats,
                placement.launched_at,
                self._now(),
                heartbeat_timeout_seconds=self._policy.node_heartbeat_timeout_seconds,
                boot_allowance_seconds=self._policy.boot_allowance_seconds,
            ):
                return
        if job.task_token is not None:
            self._ports.workflow.heartbeat(job.task_token)

    def _note_beat(self, job: Job, instance_id: str) -> Job | None:
        """Note the node's heartbeat on the job (None: the run ended meanwhile). The nodes beat
        at the same time: each write is conditioned on the job as it was read, so that no beat
        overwrites another's."""
        for _ in range(NODE_WRITE_TRIES):
            if (
                job.status.terminal
                or job.placement is None
                or instance_id not in job.placement.instance_ids
            ):
                return None
            beats = {**job.node_beats, instance_id: self._now()}
            try:
                return self._ports.jobs.transition(
                    job.job_id,
                    job.status,
                    self._now(),
                    JobChanges(node_beats=beats),
                    sources=[job.status],
                    holding=instance_id,
                    version=job.version,
                )
            except IllegalTransition as exc:
                job = exc.job if exc.job is not None else self._ports.jobs.get(job.job_id)
        raise NodeReportNotRecorded(job.job_id, instance_id, "heartbeat")

    def _report_in_one_write(self, report: NodeReport) -> Job | None:
        """The usual report, a start of a launching job or the finish of a running one, in the
        one conditional write it causes: the condition checks that the job holds the instance.
        None when it was applied; otherwise the job as the write found it, for the checks that
        decide what the report means (stale, repeated, a finish that overtook its start)."""
        if report.phase == "started":
            target, sources, changes = JobStatus.RUNNING, None, None
        else:
            target, sources = JobStatus.RUNNING, [JobStatus.RUNNING]
            changes = JobChanges(run_result=_run_result(report))
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
        job = self._move(job, JobStatus.RUNNING, JobChanges(run_result=result))
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)

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
            job = self._ports.jobs.update(job_id, self._now(), JobChanges(run_result=result))
        if job.task_token is not None:
            self._ports.workflow.complete_task(job.task_token, result)
        return job_id


# The key of a node's finish (the Launch task's output, `$.run`) under which the job comes
# (`RunOutcome.job`).
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


def finished_job(job_id: str, state: WorkflowState) -> Job | None:
    """The job as its node's finish left it, when the workflow carries it and it has a single
    stage (a multi-stage job's release may keep its instances: it reads the record)."""
    job = state.run.job if state.run is not None else None
    if job is None:
        return None
    return job if job.job_id == job_id and not job.spec.stages else None


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
