"""The workflow's state, typed: the keys of a job's execution that the services read
(docs/architecture.md, "The workflow's state contract").

The handlers parse each task's payload into these models (`handlers/models.py`), so a service
reads typed fields and never probes a raw mapping. A model ignores the keys it does not read
(the state carries more than any one task needs), and refuses one it reads with the wrong
type: the task then fails, and its workflow's `Catch` settles the job.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.job import Job


class _StateKey(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Admission(_StateKey):
    """`admission`: what the dispatcher told the waiting Enqueue task when it admitted the job
    (when the job's wait began, when it was admitted, until when the capacity memory holds a
    shortage), or that the wait ended because the job was cancelled."""

    admitted: bool = False
    cancelled: bool = False
    queued_at: float | None = None
    admitted_at: float | None = None
    shortages_until: float | None = None


class LaunchStepResult(BaseModel):
    """`launch`: what the Launch task hands back to the state machine's Choice."""

    step: int
    attempt: int  # launch calls over the job's life: each gets its own idempotency token
    tries: int = 0  # launch calls in this run: what the plan's cap counts
    launched: bool = False
    retry_later: bool = False
    give_up: bool = False
    wait_seconds: int = 1  # before the next try, when retry_later
    error: str = ""
    category: str = ""  # of the launch error (capacity, quota, configuration)


class RunOutcome(_StateKey):
    """`run`: how the run ended, as the Launch task's token was completed: by the node's finish
    (`job`: the job as the finish's write left it, when it is small enough), by the end of an
    instance, a cancel or a stop."""

    exit_code: int | None = None
    reason: str | None = None
    interrupted: bool = False
    oom: bool = False  # the container died of GPU out-of-memory
    cancelled: bool = False
    stage: str | None = None  # the stage of a multi-stage job the run was of
    job: Job | None = None


class StepError(_StateKey):
    """`error`: a step that failed through its retries, as its `Catch` recorded it."""

    error: str = Field(default="", alias="Error")
    cause: str = Field(default="", alias="Cause")


class WorkflowState(_StateKey):
    """The state as Release reads it: how the run ended (`run`), the launch (one that gave
    up, the attempts so far), a step that failed (`error`)."""

    run: RunOutcome | None = None
    launch: LaunchStepResult | None = None
    error: StepError | None = None
