"""Faults for the emulator, injected at the SDK's edge: the control plane's code is untouched.

- `CapacityFaults`: moto's CreateFleet never runs out of capacity. A `before-call` hook answers
  CreateFleet with the real error shape (HTTP 200, no instances, `Errors[]` with
  `InsufficientInstanceCapacity`) for the jobs and capacity types a scenario names.
- `DynamoThrottling`: a share of the control plane's DynamoDB calls is answered with the real
  throttling error (HTTP 400, `ProvisionedThroughputExceededException` or
  `ThrottlingException`). It answers at `before-send`, inside botocore's retry loop, so the
  client's retry policy sees exactly what AWS would send.
- `CrashAfterWrites`: a share of handler runs die right after one of their writes succeeded (the
  write happened; what the handler meant to do next did not), as a Lambda does that times out
  or is killed mid-way. Whoever invoked it then retries as Lambda or the state machine would.
- `LostEvents`: chosen events never reach their rule's target, every copy of them, as when each
  delivery fails until it ends in the dead-letter queue (or, for AWS's own events, which are
  best effort, is never sent): PutEvents answers as EventBridge does, and nothing is delivered.

Hooks are active for clients created inside `injected(...)` (handlers create theirs at cold
start, inside the embedded account).
"""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import botocore.handlers
from botocore.awsrequest import AWSResponse

from gpufleet.emulator.patches import CONTROL_PLANE, current_actor
from gpufleet.errors import GpufleetError
from gpufleet.topology import IDEMPOTENCY_TABLE, RUNS_PREFIX, TAG_JOB_ID

_JOB_ID = re.compile(r"^j-[0-9a-f]{20}$")

# A botocore handler spec: (event, handler) or (event, handler, botocore.handlers.REGISTER_FIRST).
HookSpec = tuple[Any, ...]


class Injector(Protocol):
    def hooks(self) -> list[HookSpec]: ...


@contextmanager
def injected(*injectors: Injector) -> Iterator[None]:
    """The injectors' hooks, for every botocore session created inside the block."""
    entries = [hook for injector in injectors for hook in injector.hooks()]
    botocore.handlers.BUILTIN_HANDLERS.extend(entries)
    try:
        yield
    finally:
        for entry in entries:
            botocore.handlers.BUILTIN_HANDLERS.remove(entry)


def _job_name(bucket: str, job_id: str) -> str:
    """The job's name from its run manifest, read from the backend (not an API call)."""
    from moto.s3.models import s3_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    backend = s3_backends[ACCOUNT_ID]["global"]
    key = backend.get_object(bucket, f"{RUNS_PREFIX}{job_id}/run.json")
    return str(json.loads(key.value).get("name", "")) if key else ""


class CapacityFaults:
    """Fail spot CreateFleet calls for chosen jobs; counts what it injected."""

    def __init__(self, bucket: str, should_fail: Callable[[str, str], bool]) -> None:
        self._bucket = bucket
        self._should_fail = should_fail
        self._lock = threading.Lock()
        self.injected = 0

    def hooks(self) -> list[HookSpec]:
        return [("before-call.ec2.CreateFleet", self)]

    def __call__(
        self, params: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = params.get("body", {})
        if not isinstance(body, dict) or body.get("Action") != "CreateFleet":
            return None
        capacity_type = str(body.get("TargetCapacitySpecification.DefaultTargetCapacityType", ""))
        job_ids = [v for v in body.values() if isinstance(v, str) and _JOB_ID.match(v)]
        if not job_ids or not self._should_fail(_job_name(self._bucket, job_ids[0]), capacity_type):
            return None
        with self._lock:
            self.injected += 1
        overrides = {
            "InstanceType": body.get("LaunchTemplateConfigs.1.Overrides.1.InstanceType", ""),
            "SubnetId": body.get("LaunchTemplateConfigs.1.Overrides.1.SubnetId", ""),
        }
        parsed = {
            "FleetId": "fleet-00000000-0000-0000-0000-000000000000",
            "Instances": [],
            "Errors": [
                {
                    "LaunchTemplateAndOverrides": {"Overrides": overrides},
                    "Lifecycle": capacity_type,
                    "ErrorCode": "InsufficientInstanceCapacity",
                    "ErrorMessage": "We currently do not have sufficient capacity in the "
                    "Availability Zone you requested.",
                }
            ],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        http = AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None)
        return http, parsed


class RawBody:
    """The raw stream botocore reads an HTTP response body from."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


# What DynamoDB answers when it throttles (JSON 1.0 protocol: the type names the error).
_THROTTLES = (
    (
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API.",
    ),
    (
        "com.amazon.coral.availability#ThrottlingException",
        "Throughput exceeds the current capacity of your table or index.",
    ),
)


NOWHERE = "https://throttled.invalid/"


class DynamoThrottling:
    """Throttle `rate` of the control plane's DynamoDB requests (each attempt is drawn anew, so
    the SDK's retries usually get through, as in AWS)."""

    def __init__(self, rate: float, rng: random.Random) -> None:
        self._rate = rate
        self._rng = rng
        self._lock = threading.Lock()
        self.injected = 0

    def hooks(self) -> list[HookSpec]:
        # First: moto answers at `before-send` too, and the first answer is the one used.
        return [("before-send.dynamodb", self, botocore.handlers.REGISTER_FIRST)]

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        if current_actor() != CONTROL_PLANE:
            return None
        with self._lock:
            if self._rng.random() >= self._rate:
                return None
            error_type, message = _THROTTLES[self.injected % len(_THROTTLES)]  # both, in turn
            self.injected += 1
        url = request.url
        # botocore hands the request to every `before-send` handler and uses the first answer:
        # pointed away from AWS, it is one moto's stubber leaves alone, so a throttled request
        # never reaches the table, as in DynamoDB.
        request.url = NOWHERE
        body = json.dumps({"__type": error_type, "message": message}).encode()
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "x-amzn-RequestId": "THROTTLED0000000000000000000000000000000000000000000",
        }
        return AWSResponse(url, 400, headers, RawBody(body))


class HandlerCrashed(GpufleetError):
    """The injected death of a handler run, right after a write it made succeeded."""


# Operations that change something (by name: the APIs gpufleet calls follow the convention).
_WRITES = re.compile(
    r"^(Put|Update|Delete|TransactWrite|BatchWrite|Create|Run|Terminate|Start|Stop|Send|Publish"
    r"|Set)"
)
_BOOKKEEPING = "gpufleet_chaos_bookkeeping"


@dataclass
class _Run:
    function_name: str
    crash_after: int | None  # the write after which this run dies; None: it lives
    # A sweep run: dies after its first kind of write the sweep has not crashed after yet.
    sweeping: bool = False
    writes: int = 0


class CrashAfterWrites:
    """Handler runs that die right after one of their writes succeeded.

    - `rate` of runs, N drawn from 1..`max_write` (a run with fewer writes lives);
    - and a sweep over the kinds of write: every `sweep_every`th run of each function (its
      1st, then 1 + sweep_every, ...) dies after the first write of a kind (PutItem,
      CreateFleet, ...) that no sweep has crashed that function after yet. Every kind of write
      of every handler that runs often enough is then crashed after in every chaos run,
      whatever the dice say; runs in between are spared by the sweep, so a retry is not
      crashed again by it. 0 turns the sweep off.

    Writes to the idempotency table do not count: they are Powertools' bookkeeping, whose
    in-progress record outlives a retry in the emulator (its expiry is the function's real
    timeout, while the emulator's minutes are seconds)."""

    def __init__(
        self, rate: float, max_write: int, rng: random.Random, sweep_every: int = 0
    ) -> None:
        self._rate = rate
        self._max_write = max_write
        self._rng = rng
        self._sweep_every = sweep_every
        self._lock = threading.Lock()
        self._runs = threading.local()
        self._runs_of: Counter[str] = Counter()
        self._swept: dict[str, set[str]] = {}  # function -> operations a sweep crashed after
        self.crashes: list[str] = []  # "function after Operation (write N)"

    def hooks(self) -> list[HookSpec]:
        return [
            ("before-parameter-build.dynamodb", self._note_bookkeeping),
            ("after-call", self._after_call),
        ]

    @contextmanager
    def invocation(self, function_name: str) -> Iterator[None]:
        """One handler run; runs nest (a handler's event can be delivered synchronously)."""
        run = self._plan_run(function_name)
        stack: list[_Run] = self._runs.__dict__.setdefault("stack", [])
        stack.append(run)
        try:
            yield
        finally:
            stack.pop()

    def _plan_run(self, function_name: str) -> _Run:
        with self._lock:
            dies = self._rng.random() < self._rate
            drawn = self._rng.randint(1, self._max_write)
            index = self._runs_of[function_name]
            self._runs_of[function_name] += 1
            if self._sweep_every and index % self._sweep_every == 0:
                return _Run(function_name, None, sweeping=True)
            return _Run(function_name, drawn if dies else None)

    def _note_bookkeeping(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context[_BOOKKEEPING] = IDEMPOTENCY_TABLE.construct_id in str(params.get("TableName", ""))

    def _after_call(
        self,
        event_name: str,
        http_response: Any,
        parsed: dict[str, Any],
        context: dict[str, Any],
        **_: Any,
    ) -> None:
        stack: list[_Run] = getattr(self._runs, "stack", [])
        if not stack or current_actor() != CONTROL_PLANE:
            return
        run = stack[-1]
        operation = event_name.rsplit(".", 1)[-1]
        if (
            (run.crash_after is None and not run.sweeping)
            or not _WRITES.match(operation)
            or context.get(_BOOKKEEPING)
            or http_response.status_code >= 300
            # An instant fleet that got no capacity answers 200 and launched nothing.
            or (operation == "CreateFleet" and not parsed.get("Instances"))
        ):
            return
        run.writes += 1
        with self._lock:
            if run.sweeping:
                swept = self._swept.setdefault(run.function_name, set())
                if operation in swept:
                    return
                swept.add(operation)
            elif run.writes != run.crash_after:
                return
            run.crash_after, run.sweeping = None, False  # one death per run
            what = f"{run.function_name} after {operation} (write {run.writes})"
            self.crashes.append(what)
        raise HandlerCrashed(f"injected crash: {what}")


def _job_of_instance(instance_id: str) -> str:
    """The job an instance was launched for, from its tags in the backend (not an API call)."""
    from moto.ec2.models import ec2_backends

    from gpufleet.emulator.account import ACCOUNT_ID, REGION

    return str(ec2_backends[ACCOUNT_ID][REGION].tags.get(instance_id, {}).get(TAG_JOB_ID, ""))


_LOST = "gpufleet_lost_event"


class LostEvents:
    """The first event of each kind in `kinds` about a job `lose(kind, job name)` picks is lost:
    PutEvents takes it (its answer says so, with an event id) and delivers it nowhere. Later
    events of the kind about the same job (a report sent again) get through. A job is found
    from the event's `job_id` (node reports) or `instance-id` (EC2's events)."""

    def __init__(
        self, bucket: str, kinds: frozenset[str], lose: Callable[[str, str], bool]
    ) -> None:
        self._bucket = bucket
        self._kinds = kinds
        self._lose = lose
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self.lost: Counter[str] = Counter()  # by detail type

    def hooks(self) -> list[HookSpec]:
        return [
            ("before-parameter-build.eventbridge.PutEvents", self._note),
            ("before-call.eventbridge.PutEvents", self._answer),
        ]

    def _note(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        entries = params.get("Entries", [])
        if len(entries) != 1 or entries[0].get("DetailType") not in self._kinds:
            return  # gpufleet puts one event at a time
        [entry] = entries
        kind = str(entry["DetailType"])
        detail = json.loads(entry.get("Detail", "{}"))
        job_id = str(detail.get("job_id") or _job_of_instance(str(detail.get("instance-id", ""))))
        if not job_id or not self._lose(kind, _job_name(self._bucket, job_id)):
            return
        with self._lock:
            if (kind, job_id) in self._seen:
                return
            self._seen.add((kind, job_id))
            self.lost[kind] += 1
        context[_LOST] = True

    @staticmethod
    def _answer(context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if not context.get(_LOST):
            return None
        parsed = {
            "FailedEntryCount": 0,
            "Entries": [{"EventId": str(uuid.uuid4())}],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        return AWSResponse("https://events.us-east-1.amazonaws.com/", 200, {}, None), parsed
