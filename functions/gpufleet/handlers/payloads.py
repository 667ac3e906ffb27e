"""Shapes of the events the handlers receive, with no domain model in them: a handler module
imports these when Lambda loads it, and the domain's models (`handlers/models.py`) with its
first event, as its services do. Each is parsed with pydantic at the handler's edge.

The S3 notification model is deliberately tolerant: real S3 sends more fields than we need, and
the embedded emulator fewer; we read only the bucket, key and the fields that identify one
delivery. `EventBridgeEvent` is the envelope every EventBridge event has ([event
structure](https://docs.aws.amazon.com/eventbridge/latest/ref/overiew-event-structure.html)),
the fields Powertools' `EventBridgeModel` reads, without importing the Powertools parser's
models of every other AWS event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field


class _Payload(BaseModel):
    # Each model's validator is built by its first validation, not at import: a function
    # imports every payload model and parses its event with one or two.
    model_config = ConfigDict(defer_build=True)


class EventBridgeEvent(_Payload):
    """What every EventBridge event carries; `detail` is typed by each event's model."""

    model_config = ConfigDict(populate_by_name=True)

    version: str
    id: str
    source: str
    account: str
    time: datetime
    region: str
    resources: list[str]
    detail_type: str = Field(alias="detail-type")
    detail: Any
    replay_name: str | None = Field(default=None, alias="replay-name")


class _Open(_Payload):
    model_config = ConfigDict(extra="ignore")


class S3Bucket(_Open):
    name: str


class S3Object(_Open):
    key: str
    size: int | None = None
    eTag: str | None = None
    versionId: str | None = None
    sequencer: str | None = None

    @property
    def decoded_key(self) -> str:
        # Keys arrive URL-encoded with '+' for spaces.
        return unquote_plus(self.key)


class S3Entity(_Open):
    bucket: S3Bucket
    object: S3Object


class S3Record(_Open):
    eventName: str = ""
    s3: S3Entity


class S3Notification(_Open):
    Records: list[S3Record] = Field(default_factory=list)


class SubmittedEvent(EventBridgeEvent):
    """`Job Submitted`: the spec is the detail. The id names the job's source: EventBridge
    gives a UUID; a direct invocation gets no unbounded one into the job's item."""

    id: str = Field(min_length=1, max_length=256)
    detail: Any


class Delivery(_Payload):
    """One delivery of one spec; `delivery_key` names it uniquely (the idempotency key)."""

    delivery_key: str
    source: str
    object_key: str | None = None
    version_id: str | None = None  # the uploaded object's version, read by intake
    document: Any = None
    # An event's: who sent it (domain/submitters.py decides what team it may submit for).
    event_source: str = ""
    account: str = ""


class JobTask(_Payload):
    job_id: str = Field(pattern=r"^j-[0-9a-f]{20}$")


class TokenTask(JobTask):
    """A `.waitForTaskToken` task: the workflow waits until something completes the token."""

    task_token: str = Field(min_length=1, max_length=4096)


class RequeueTask(JobTask):
    attempt: int = Field(ge=0)
    cycles: int = Field(ge=0)  # requeues so far in this execution
    execution: str = Field(pattern=r"^[A-Za-z0-9_-]{1,80}$")  # this execution's name


class InstanceEventDetail(_Open):
    instance_id: str = Field(alias="instance-id", pattern=r"^i-[0-9a-f]{8,17}$")
    state: str | None = None
    instance_action: str | None = Field(default=None, alias="instance-action")


class InstanceEvent(EventBridgeEvent):
    """EC2's own events: interruption warning, rebalance recommendation, state change."""

    detail: InstanceEventDetail


class BlockExpirationDetail(_Open):
    capacity_reservation_id: str = Field(
        alias="capacity-reservation-id", pattern=r"^cr-[0-9a-f]{8,17}$"
    )
    end_date: datetime = Field(alias="end-date")


class BlockExpirationWarning(EventBridgeEvent):
    """EC2's warning, forty minutes before a Capacity Block ends, that its instances begin to
    terminate in ten."""

    detail: BlockExpirationDetail


class ExecutionStatusDetail(_Open):
    """What Step Functions says of an execution that changed status: what DescribeExecution
    says (input and output, which the backstop does not need, are left out)."""

    executionArn: str = Field(max_length=2048)
    stateMachineArn: str = Field(max_length=2048)
    name: str = Field(max_length=80)
    status: str = Field(max_length=32)
    error: str | None = Field(default=None, max_length=256)
    cause: str | None = Field(default=None, max_length=32768)


class ExecutionStatusChange(EventBridgeEvent):
    """`Step Functions Execution Status Change` (aws.states, default bus)."""

    detail: ExecutionStatusDetail


class StatusChanged(EventBridgeEvent):
    """`Job Status Changed` (gpufleet.control-plane, the gpufleet bus): its detail is the
    domain's `StatusChange` (domain/notify.py), parsed with the handler's first event."""

    detail: dict[str, Any]
