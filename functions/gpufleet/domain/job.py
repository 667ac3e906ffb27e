"""A job's record and the legal moves of its status."""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.spec import JobSpec, Resources


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


class IllegalTransition(Exception):
    """A status change that the lifecycle does not allow (or that lost a race)."""

    def __init__(self, job_id: str, current: JobStatus | None, target: JobStatus) -> None:
        super().__init__(f"job {job_id}: cannot move from {current} to {target}")
        self.job_id = job_id
        self.current = current
        self.target = target


class JobNotFound(Exception):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


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


class Job(BaseModel):
    """The stored record of a job."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    status: JobStatus
    spec: JobSpec
    source: str = Field(description="Where the spec came from, e.g. s3://bucket/key")
    created_at: float
    updated_at: float
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
    # What the job now asks for, when it differs from its spec: a resize, or more GPU memory
    # after a run ran out of it.
    resources_override: Resources | None = None
    # What the fleet noticed about the job's runs (e.g. "low-utilization").
    flags: list[str] = Field(default_factory=list)

    @property
    def effective_spec(self) -> JobSpec:
        if self.resources_override is None:
            return self.spec
        return self.spec.model_copy(update={"resources": self.resources_override})

    prior_cost_usd: float = 0.0
    prior_held_seconds: float = 0.0
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
            "failure_reason": self.failure_reason,
        }
