"""A job's record and the legal moves of its status."""

from __future__ import annotations

import hashlib
import re
import types
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.domain import node_reports
from gpufleet.domain.scaling import AlarmKind
from gpufleet.domain.spec import JobSpec, Resources, SpotPolicy
from gpufleet.errors import Conflict, NotFound, RefusedInput


class JobStatus(StrEnum):
    SUBMITTED = "SUBMITTED"
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

# target status -> the statuses it may be reached from. Requeueing (LAUNCHING/RUNNING -> QUEUED)
# is how capacity errors and spot interruptions send a job back to wait.
ALLOWED_SOURCES: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.SUBMITTED: frozenset(),
    JobStatus.QUEUED: frozenset({JobStatus.SUBMITTED, JobStatus.LAUNCHING, JobStatus.RUNNING}),
    JobStatus.LAUNCHING: frozenset({JobStatus.QUEUED}),
    JobStatus.RUNNING: frozenset({JobStatus.LAUNCHING}),
    JobStatus.SUCCEEDED: frozenset({JobStatus.RUNNING}),
    JobStatus.FAILED: frozenset(
        {JobStatus.SUBMITTED, JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING}
    ),
    JobStatus.CANCELLED: frozenset(
        {JobStatus.SUBMITTED, JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING}
    ),
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return current in ALLOWED_SOURCES[target]


class IllegalTransition(Conflict):
    """A status change that the lifecycle does not allow (or that lost a race)."""

    def __init__(
        self,
        job_id: str,
        current: JobStatus | None,
        target: JobStatus,
        job: Job | None = None,
    ) -> None:
        super().__init__(f"job {job_id}: cannot move from {current} to {target}")
        self.job_id = job_id
        self.current = current
        self.target = target
        self.job = job  # the job as the refused write found it, when the store returns it


class JobNotFound(NotFound):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class DroppedReport(StrEnum):
    """Why a node's report about a job was dropped unheard (the `Problem` of the
    NodeReportsDropped metric). A report of the job's own instance that comes late (after the
    job ended, or about a stage it moved past) is harmless and is not one of these."""

    UNKNOWN_JOB = "unknown-job"
    UNKNOWN_INSTANCE = "unknown-instance"  # not one the job holds: stale, or forged
    INVALID = "invalid"  # NodeReport refuses it (an exit code out of range, a bad job id...)
    # Not signed with the key of the job's current run (domain/node_reports.py).
    UNSIGNED = node_reports.UNSIGNED
    OTHER_RUN = node_reports.OTHER_RUN
    BAD_SIGNATURE = node_reports.BAD_SIGNATURE


def s3_delivery_key(bucket: str, key: str, marker: str) -> str:
    """Names one upload of a spec: its object and a marker of that upload (the object version,
    S3's sequencer or the ETag)."""
    return f"s3://{bucket}/{key}#{marker}"


# What `job_id_for_delivery` makes: anything else names no job.
JOB_ID_PATTERN = r"^j-[0-9a-f]{20}$"


def is_job_id(text: str) -> bool:
    return re.fullmatch(JOB_ID_PATTERN, text) is not None


def job_id_for_delivery(delivery_key: str) -> str:
    """A job id derived from the delivery that carried the spec.

    The same delivery (an S3 object version, an EventBridge event id) always names the same job,
    so a redelivery can never create a second one, even if every other guard failed.
    """
    digest = hashlib.sha256(delivery_key.encode("utf-8")).hexdigest()
    return f"j-{digest[:20]}"


class Placement(BaseModel):
    """Where a job's nodes run: recorded at launch, read at release and for cost."""

    model_config = ConfigDict(frozen=True)

    instance_ids: list[str]
    instance_type: str
    capacity_type: str
    zone: str | None = None
    hourly_usd: float = Field(ge=0, description="Price of one node per hour")
    reservation_id: str | None = None
    gpu_memory_gib: float = Field(default=0, ge=0, description="Memory per GPU of the type")
    launched_at: float = Field(description="Epoch seconds")
    storage_gib: float = Field(default=0, ge=0, description="EBS volume of each node")
    storage_usd_per_gib_month: float = Field(default=0, ge=0)
    # Instance id -> private IP, as EC2 assigned them: how the nodes of a run find each other
    # (`domain/rendezvous.py`).
    private_ips: dict[str, str] = Field(default_factory=dict)

    @property
    def fleet_hourly_usd(self) -> float:
        """Price per hour of all the job's nodes together."""
        return self.hourly_usd * len(self.instance_ids)


class StageRecord(BaseModel):
    """How one stage of a multi-stage job ended: where its last run ran, and what every run of
    it (retries, requeues) held and cost."""

    model_config = ConfigDict(frozen=True)

    name: str
    status: JobStatus
    instance_type: str | None = None
    capacity_type: str | None = None
    instance_ids: list[str] = Field(default_factory=list)
    gpus: int | None = Field(default=None, description="GPUs of its instances, all together")
    # What its (last run's) instances cost per hour, all nodes together: a price they had.
    hourly_usd: float | None = None
    cost_usd: float = 0.0
    held_seconds: float = 0.0
    # The job's counters count each stage on its own: these are the stage's.
    retries: int = 0
    preemptions: int = 0
    interruptions: int = 0
    reused_previous: bool = False  # ran on the previous stage's instances


# A stage's status in reports before it ran: still to come, or never run because the job ended.
STAGE_PENDING = "PENDING"
STAGE_SKIPPED = "SKIPPED"


class Job(BaseModel):
    """The stored record of a job."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    status: JobStatus
    spec: JobSpec
    source: str = Field(description="Where the spec came from, e.g. s3://bucket/key")
    created_at: float
    updated_at: float
    # Writes so far: a write conditioned on it applies only to the job as its writer saw it.
    version: int = 0
    placement: Placement | None = None
    released_at: float | None = None
    cost_usd: float | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    attempts: int = 0
    # Workflow plumbing: the task token the lifecycle waits on, and a node's report that
    # arrived before the token was parked (the two race; whichever lands second completes).
    task_token: str | None = None
    run_result: dict[str, Any] | None = None
    # The nodes of the current run that reported their start: RUNNING once all have.
    started_instances: list[str] = Field(default_factory=list)
    # A multi-node run's last heartbeat of each node (instance id -> epoch seconds): a node
    # silent while its peers beat fails the run (`rendezvous.silent_nodes`).
    node_beats: dict[str, float] = Field(default_factory=dict)
    # Checkpoint-and-requeue: why the current run was asked to stop (preempted, reclaimed,
    # interrupted), for whom, and what the job's earlier runs held and cost.
    drain_reason: str | None = None
    drain_requested_at: float | None = None
    preempted_for: str | None = None
    preemptions: int = 0
    interruptions: int = 0
    retries: int = 0
    # The job's last launch went on-demand after spot had no capacity.
    ondemand_fallback: bool = False
    # Spot kept being reclaimed (the safety cap of `spot: auto`): on-demand from now on.
    on_demand_only: bool = False
    # How long its earlier runs (of the current stage) held spot instances: with
    # `interruptions`, what plans rank spot's hazard by (`planning.job_observed_hazard`).
    spot_held_seconds: float = 0.0
    # What the job now asks for, when it differs from its spec: a resize, or more GPU memory
    # after a run ran out of it.
    resources_override: Resources | None = None
    # What the fleet noticed about the job's runs (e.g. "low-utilization").
    flags: list[str] = Field(default_factory=list)
    # The current run's metric alarms in ALARM at the last evaluation (MetricWatch): an action
    # is due only when one goes there, so a repeated evaluation acts once. A launch clears it.
    alarming: list[AlarmKind] = Field(default_factory=list)

    # A child of an array or sweep (docs/arrays.md): its array's record and its index there.
    # The array's own record (its spec's `array` or `sweep` set) runs nothing itself.
    array_id: str | None = None
    array_index: int | None = None

    # Multi-stage jobs: the stage now running (or waiting), and how the earlier ones ended.
    stage_index: int = 0
    stage_records: list[StageRecord] = Field(default_factory=list)

    @property
    def effective_spec(self) -> JobSpec:
        """What the job now asks for: its current stage's spec, with the override if any, on
        on-demand only once it gave up on spot."""
        spec = self.spec.for_stage(self.stage_index) if self.spec.stages else self.spec
        changes: dict[str, Any] = {}
        if self.resources_override is not None:
            changes["resources"] = self.resources_override
        if self.on_demand_only:
            changes["spot"] = SpotPolicy.NEVER
        return spec.model_copy(update=changes) if changes else spec

    @property
    def stage_name(self) -> str | None:
        """The current stage's name; None for a job without stages."""
        return self.spec.stages[self.stage_index].name if self.spec.stages else None

    prior_cost_usd: float = 0.0  # instances and storage, of every earlier run
    prior_held_seconds: float = 0.0
    prior_storage_usd: float = 0.0  # the storage part of prior_cost_usd
    # The instances' part of prior_cost_usd by capacity type (spot, on-demand, reserved).
    prior_capacity_usd: dict[str, float] = Field(default_factory=dict)
    storage_usd: float | None = None  # the storage part of cost_usd, once the job ended
    # Before the first run: price x expected hours x the estimate factor, plus storage.
    estimated_cost_usd: float | None = None
    first_admitted_at: float | None = None
    waited_seconds: float = 0.0  # in the admission queue, over every run

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def team(self) -> str:
        return self.spec.team

    def summary(self) -> dict[str, Any]:
        placement = self.placement
        return {
            "id": self.job_id,
            "name": self.spec.name,
            "team": self.spec.team,
            "status": self.status.value,
            "instance_type": placement.instance_type if placement else None,
            "capacity_type": placement.capacity_type if placement else None,
            "hourly_usd": placement.hourly_usd if placement else None,
            "cost_usd": self.cost_usd,
            "storage_usd": self.storage_usd,
            "estimated_cost_usd": self.estimated_cost_usd,
            "failure_reason": self.failure_reason,
            "stages": self.stage_summaries(),
        }

    def status_event(self, previous: JobStatus | None) -> dict[str, Any]:
        """The detail of the `Job Status Changed` event of its move from `previous` (None: as
        it was created): what the Notify function tells people (domain/notify.py), so that it
        needs no read of the job."""
        detail: dict[str, Any] = {
            "job_id": self.job_id,
            "name": self.spec.name,
            "team": self.spec.team,
            "status": self.status.value,
            "reason": self.failure_reason,
            "cost_usd": self.cost_usd,
        }
        if previous is not None:
            detail["previous"] = previous.value
        if self.spec.notify is not None:
            detail["notify"] = self.spec.notify
        return detail

    def stage_summaries(self) -> list[dict[str, Any]]:
        """One line per stage of the spec, in order: the ended ones as recorded, the current
        one with the job's status and placement, the others pending (or skipped, once the job
        ended). Empty for a job without stages."""
        lines = [record.model_dump(mode="json") for record in self.stage_records]
        for index in range(len(self.stage_records), len(self.spec.stages)):
            current = index == self.stage_index and not self.status.terminal
            placement = self.placement if current else None
            status = STAGE_SKIPPED if self.status.terminal else STAGE_PENDING
            lines.append(
                {
                    "name": self.spec.stages[index].name,
                    "status": self.status.value if current else status,
                    "instance_type": placement.instance_type if placement else None,
                    "capacity_type": placement.capacity_type if placement else None,
                    "instance_ids": list(placement.instance_ids) if placement else [],
                    "gpus": None,
                    "hourly_usd": round(placement.fleet_hourly_usd, 6) if placement else None,
                    # Not known yet for the current stage (its run is not over); none for the rest.
                    "cost_usd": None if current else 0.0,
                    "held_seconds": None if current else 0.0,
                    "retries": self.retries if current else 0,
                    "preemptions": self.preemptions if current else 0,
                    "interruptions": self.interruptions if current else 0,
                    "reused_previous": None,
                }
            )
        return lines

    def with_changes(self, changes: JobChanges, *, status: JobStatus | None = None) -> Job:
        """The job with `changes` applied (and moved to `status`, when given): what every job
        store writes (and what a step that knows the job predicts of the write). No validation
        is repeated here: each field of `JobChanges` has the type of this model's field,
        checked when the changes were made."""
        update = changes.fields()
        if status is not None:
            update["status"] = status
        return self.model_copy(update=update)

    def total(self, counter: Literal["retries", "preemptions", "interruptions"]) -> int:
        """`counter` over the whole job. A multi-stage job's counters start again at each
        stage, so this adds up the ended stages' and the current one's."""
        current = getattr(self, counter) if len(self.stage_records) <= self.stage_index else 0
        ended = sum(int(getattr(record, counter)) for record in self.stage_records)
        return int(current) + ended


# Fields no change names: fixed when the job is made, or written by the job store itself on
# every write (the status by `transition`, `updated_at` and `version` always).
STORE_WRITTEN_FIELDS = frozenset({"status", "updated_at", "version"})
FIXED_FIELDS = frozenset({"job_id", "spec", "source", "created_at", "array_id", "array_index"})


def _allows_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


# The fields changes may set that a `Job` cannot be without: set, never cleared.
_NEVER_EMPTY = frozenset(
    name
    for name, field in Job.model_fields.items()
    if not _allows_none(field.annotation) and name not in FIXED_FIELDS | STORE_WRITTEN_FIELDS
)


class InvalidJobChanges(RefusedInput):
    """Changes to a job that name a field a job does not have, or give one a value of the wrong
    type: nothing is written. `fields`: the fields refused, each with why."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        listed = "; ".join(f"{name}: {why}" for name, why in fields.items())
        super().__init__(f"invalid job changes: {listed}")
        self.fields = dict(fields)


class JobChanges(BaseModel):
    """What one write of a job sets: the fields named (`fields()`), each typed as `Job`'s; the
    others keep their values. None clears a field that may be empty, and is refused for one
    that may not (a counter, a flag). An unknown field is refused: the changes are checked
    when they are made, so every job store gets (and writes) the same ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    placement: Placement | None = None
    released_at: float | None = None
    cost_usd: float | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    attempts: int | None = None
    task_token: str | None = None
    run_result: dict[str, Any] | None = None
    started_instances: list[str] | None = None
    node_beats: dict[str, float] | None = None
    drain_reason: str | None = None
    drain_requested_at: float | None = None
    preempted_for: str | None = None
    preemptions: int | None = None
    interruptions: int | None = None
    retries: int | None = None
    ondemand_fallback: bool | None = None
    on_demand_only: bool | None = None
    spot_held_seconds: float | None = None
    resources_override: Resources | None = None
    flags: list[str] | None = None
    alarming: list[AlarmKind] | None = None
    stage_index: int | None = None
    stage_records: list[StageRecord] | None = None
    prior_cost_usd: float | None = None
    prior_held_seconds: float | None = None
    prior_storage_usd: float | None = None
    prior_capacity_usd: dict[str, float] | None = None
    storage_usd: float | None = None
    estimated_cost_usd: float | None = None
    first_admitted_at: float | None = None
    waited_seconds: float | None = None

    @field_validator(*_NEVER_EMPTY, mode="before")
    @classmethod
    def _not_cleared(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("a job always has it: it cannot be cleared")
        return value

    @classmethod
    def parse(cls, fields: Mapping[str, Any]) -> JobChanges:
        """Changes from a mapping of field names (a test's, an operator's): raises
        InvalidJobChanges naming each field refused."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise InvalidJobChanges(_refused_fields(exc)) from None

    def fields(self) -> dict[str, Any]:
        """The fields these changes set, with their values."""
        return {name: getattr(self, name) for name in self.model_fields_set}

    def __or__(self, later: JobChanges) -> JobChanges:
        """Both changes, `later`'s value where both set a field. Each was checked when it was
        made: their union is not validated again. (Changes are frozen: with nothing on one
        side, the other serves as it is.)"""
        if not later.model_fields_set:
            return self
        if not self.model_fields_set:
            return later
        return self.model_copy(update=later.fields())

    def __bool__(self) -> bool:
        """Whether these changes set anything (no field named: nothing to write)."""
        return bool(self.model_fields_set)


# Changes that set nothing (frozen: one serves every caller).
NO_CHANGES = JobChanges()


def _refused_fields(exc: ValidationError) -> dict[str, str]:
    """Each field a validation refused, with why (the first reason, when there are several)."""
    refused: dict[str, str] = {}
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "changes"
        why = "no change sets it" if error["type"] == "extra_forbidden" else error["msg"]
        refused.setdefault(name, why)
    return refused
