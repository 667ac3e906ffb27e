"""The three places where moto needs help to behave like an AWS account running our code.

1. Lambda invoke without Docker runs no code: `LambdaFunction._invoke_lambda` is replaced so the
   function's real handler runs in-process (direct invoke, Step Functions `lambda:invoke`,
   S3 notifications and EventBridge targets all go through it).
2. EventBridge rules deliver only to SQS and Logs: Lambda and Step Functions targets are added,
   with Lambda's asynchronous retry behaviour (two retries). S3 notification records of a
   versioned bucket carry the object's version id, as S3's do.
3. moto checks a DynamoDB condition and applies the write without a lock, so two threads can
   both pass the same condition. DynamoDB applies each conditional write atomically; the
   backend's writes are serialized to match. A transaction that fails is undone item by item:
   moto would deep-copy every table it touches before each transaction, which costs time and
   memory in proportion to the whole table (the jobs table, for a launch or a release).
4. Who called: control-plane code, the emulator itself, or a simulated node. Each boto3 call is
   counted against the actor on the calling thread, so the demo reports the API calls the
   control plane made and nothing else; a call made while a handler runs is also logged
   against that function, with the parameters that name what it touches (what IAM judges).

Besides, each JSONPath the Step Functions interpreter reads is parsed once, not at every read
(CPU only: the results are the same).

A `FaultPlan` (see `planned_faults`) can take over the asynchronous deliveries and wrap every
handler run, for chaos runs: without one, each event is delivered once, on time.

moto is pinned exactly (see requirements.lock): these patches rely on its internals.
"""

from __future__ import annotations

import copy
import functools
import importlib
import io
import json
import logging
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import botocore.handlers

if TYPE_CHECKING:
    from gpufleet.emulator.ec2_rules import Ec2Rules

CONTROL_PLANE = "control-plane"
EMULATOR = "emulator"
NODE = "node"

_local = threading.local()

# botocore names some services differently from the ARNs and the console.
_SERVICE_NAMES = {"sfn": "states", "cloudwatch": "cloudwatch", "eventbridge": "events"}


class FaultPlan(Protocol):
    """How a chaos run bends the account's asynchronous plumbing (the default: not at all)."""

    def deliver(self, attempt: Callable[[], bool]) -> bool:
        """Carry out one asynchronous delivery of an event: call `attempt` (one run of the
        function, True when it did not fail) as often and as late as the plan says, retries
        included."""
        ...

    def invocation(self, function_name: str) -> AbstractContextManager[None]:
        """Wraps each run of a handler, on the thread that runs it."""
        ...


_fault_plan: FaultPlan | None = None


@contextmanager
def planned_faults(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Deliveries and handler runs follow `plan` inside the block (one plan at a time)."""
    global _fault_plan
    if _fault_plan is not None:
        raise RuntimeError("a fault plan is already active")
    _fault_plan = plan
    try:
        yield plan
    finally:
        _fault_plan = None


def current_actor() -> str:
    return getattr(_local, "actor", CONTROL_PLANE)


@contextmanager
def acting_as(actor: str) -> Iterator[None]:
    previous = current_actor()
    _local.actor = actor
    try:
        yield
    finally:
        _local.actor = previous


@dataclass
class Invocation:
    function_name: str
    errored: bool
    seconds: float


# The request parameters that name what a call touches (or tag what it creates: IAM judges
# `aws:RequestTag` on them), kept as they are.
_NAMING_PARAMS = (
    "TableName",
    "IndexName",
    "Bucket",
    "Key",
    "VersionId",  # a read of one version is s3:GetObjectVersion
    "stateMachineArn",
    "executionArn",
    "InstanceIds",
    "GroupName",
    "TagSpecifications",
    "AlarmName",
    "AlarmNames",
    "TopicArn",
)


@dataclass(frozen=True)
class ApiCall:
    """One boto3 call of the control plane, with the parameters that name what it touches."""

    function: str | None  # construct id of the function whose handler made it (None: no handler)
    service: str  # as botocore names it: "dynamodb", "sfn", "eventbridge", ...
    operation: str  # "PutItem"
    params: dict[str, Any]

    @property
    def action(self) -> str:
        """The IAM action: "states:SendTaskSuccess"."""
        return f"{_SERVICE_NAMES.get(self.service, self.service)}:{self.operation}"


def _naming_params(params: dict[str, Any]) -> dict[str, Any]:
    kept = {name: params[name] for name in _NAMING_PARAMS if name in params}
    if "TransactItems" in params:  # each item: {"Put" | "Update" | ...: {"TableName": ...}}
        # IAM judges each item as its own call: its table and its key (for a put, the item).
        kept["TransactItems"] = [
            {
                kind: {
                    name: request[name] for name in ("TableName", "Key", "Item") if name in request
                }
                for kind, request in item.items()
            }
            for item in params["TransactItems"]
        ]
    if "Entries" in params:  # PutEvents: IAM judges each entry's bus and source
        kept["Entries"] = [
            {name: entry[name] for name in ("EventBusName", "Source") if name in entry}
            for entry in params["Entries"]
        ]
    return kept


class Recorder:
    """API calls and Lambda invocations made by the control plane."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.api_calls: Counter[str] = Counter()
        self.invocations: list[Invocation] = []
        self.calls: list[ApiCall] = []  # those counted in `api_calls`, invocations apart
        # Off for a long-lived emulator (`gpufleet emulator`): the counts stay, the logs of
        # every call and invocation would grow without end.
        self.keeps_log = True

    def count_call(self, event_name: str, params: dict[str, Any] | None = None, **_: Any) -> None:
        # event_name: "before-parameter-build.<service>.<Operation>"
        if current_actor() != CONTROL_PLANE:
            return
        service, operation = event_name.split(".")[1:3]
        if service == "lambda":
            return  # Lambda is counted by invocation, which also covers S3 and EventBridge
        call = None
        if self.keeps_log:  # built outside the lock, and only when kept
            named = _naming_params(params or {})
            call = ApiCall(getattr(_local, "function", None), service, operation, named)
        with self._lock:
            self.api_calls[_SERVICE_NAMES.get(service, service)] += 1
            if call is not None:
                self.calls.append(call)

    def count_invocation(self, invocation: Invocation) -> None:
        with self._lock:
            if self.keeps_log:
                self.invocations.append(invocation)
            self.api_calls["lambda"] += 1

    def reset(self) -> None:
        with self._lock:
            self.api_calls.clear()
            self.invocations.clear()
            self.calls.clear()


class _LambdaContext:
    """The attributes of the Lambda context object that handlers and Powertools read."""

    def __init__(self, function: Any) -> None:
        self.function_name = function.function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = function.function_arn
        self.memory_limit_in_mb = int(function.memory_size)
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function.function_name}"
        self.log_stream_name = self.aws_request_id
        self._deadline = time.monotonic() + float(function.timeout)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class _ThreadRoutedStream(io.TextIOBase):
    """stdout that sends what a handler prints to that invocation's log, per thread."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback

    def write(self, text: str) -> int:
        buffer = getattr(_local, "log_buffer", None)
        if buffer is not None:
            return int(buffer.write(text))
        return int(self._fallback.write(text))

    def flush(self) -> None:
        self._fallback.flush()


def _resolve_handler(path: str) -> Callable[[Any, Any], Any]:
    module_name, _, attribute = path.rpartition(".")
    module = importlib.import_module(module_name)
    handler: Callable[[Any, Any], Any] = getattr(module, attribute)
    return handler


@dataclass
class Patches:
    recorder: Recorder
    undo: list[Callable[[], None]]
    ec2_rules: Ec2Rules

    def remove(self) -> None:
        for undo in reversed(self.undo):
            undo()


def install(recorder: Recorder, write_log: Callable[[str, str], None]) -> Patches:
    """Install the patches; `write_log(log_group, text)` stores a handler's output."""
    from moto.awslambda.models import LambdaFunction
    from moto.events import notifications
    from moto.events.models import Rule
    from moto.s3 import notifications as s3_notifications

    undo: list[Callable[[], None]] = []

    # 1. Real handlers, in-process.
    def invoke_in_process(self: Any, event: Any = None) -> tuple[str, bool, str]:
        payload = json.loads(event) if isinstance(event, str | bytes) else (event or {})
        context = _LambdaContext(self)
        started = time.monotonic()
        buffer = io.StringIO()
        previous_buffer = getattr(_local, "log_buffer", None)
        _local.log_buffer = buffer
        # Handlers run nested (a handler's PutEvents runs the rule's target on its thread):
        # the calls belong to the innermost one. Functions are named gpufleet-<construct id>.
        previous_function = getattr(_local, "function", None)
        _local.function = self.function_name.removeprefix("gpufleet-")
        errored = False
        plan = _fault_plan
        try:
            with (
                acting_as(CONTROL_PLANE),
                plan.invocation(self.function_name) if plan else nullcontext(),
            ):
                result = _resolve_handler(self.handler)(payload, context)
            output = json.dumps(result)
        except Exception as exc:
            errored = True
            output = json.dumps(
                {
                    "errorType": type(exc).__name__,
                    "errorMessage": str(exc)[:1000],
                    "stackTrace": traceback.format_exc().splitlines()[-5:],
                }
            )
            buffer.write(traceback.format_exc())
        finally:
            _local.log_buffer = previous_buffer
            _local.function = previous_function
        recorder.count_invocation(
            Invocation(self.function_name, errored, time.monotonic() - started)
        )
        logs = buffer.getvalue()
        write_log(context.log_group_name, logs)
        return output, errored, logs

    _replace(LambdaFunction, "_invoke_lambda", invoke_in_process, undo)

    # 2. EventBridge -> Lambda and Step Functions targets; S3 -> Lambda with async retries.
    original_send = Rule.send_to_targets

    def send_to_targets(self: Any, original_event: Any, transform_input: bool = True) -> None:
        if not self.event_pattern.matches_event(original_event):
            return
        others = []
        for target in self.targets:
            arn = str(target["Arn"])
            if ":lambda:" in arn:
                invoke_async(self.account_id, arn, original_event)
            elif ":states:" in arn:
                notifications._start_sfn_execution(
                    self.account_id, region=self.region_name, sfn_arn=arn, event=original_event
                )
            else:
                others.append(target)
        if others:
            saved = self.targets
            self.targets = others
            try:
                original_send(self, original_event, transform_input)
            finally:
                self.targets = saved

    _replace(Rule, "send_to_targets", send_to_targets, undo)

    def s3_invoke(account_id: str, event_body: Any, fn_arn: str, *_region: str) -> None:
        invoke_async(account_id, fn_arn, event_body)

    _replace(s3_notifications, "_invoke_awslambda", s3_invoke, undo)

    # S3 names the object version in each record of a versioned bucket; moto leaves it out.
    original_event = s3_notifications._get_s3_event

    def s3_event(event_name: str, bucket: Any, key: Any, notification_id: str) -> Any:
        event = original_event(event_name, bucket, key, notification_id)
        if bucket.is_versioned:
            for record in event["Records"]:
                record["s3"]["object"]["versionId"] = key.version_id
        return event

    _replace(s3_notifications, "_get_s3_event", s3_event, undo)

    # 3. Conditional writes are atomic in DynamoDB.
    from moto.dynamodb.models import DynamoDBBackend

    _undo_transactions_item_by_item(undo)
    write_lock = threading.RLock()
    for operation in ("put_item", "update_item", "delete_item", "transact_write_items"):
        original = getattr(DynamoDBBackend, operation)

        def atomic(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            with write_lock:
                return __original(self, *args, **kwargs)

        _replace(DynamoDBBackend, operation, atomic, undo)

    # A `.waitForTaskToken` task with a heartbeat: moto waits for the first heartbeat before it
    # looks for the task's result, so a result sent while the task's Lambda still ran (Launch
    # handing back a launch that got no capacity) waits out a whole heartbeat period. Step
    # Functions takes such a result at once.
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service_callback as callback,
    )
    from moto.stepfunctions.parser.asl.eval.callback.callback import HeartbeatTimedOut

    def wait_with_heartbeat(
        _task: Any, env: Any, callback_endpoint: Any, heartbeat_endpoint: Any
    ) -> Any:
        outcome = callback_endpoint.get_outcome()
        while env.is_running() and outcome is None:
            received = heartbeat_endpoint.clear_and_wait()
            if not received and env.is_running():
                return callback_endpoint.get_outcome() or HeartbeatTimedOut()
            outcome = callback_endpoint.get_outcome()
        return outcome

    _replace(
        callback.StateTaskServiceCallback,
        "_wait_for_task_token_heartbeat",
        wait_with_heartbeat,
        undo,
    )

    # moto's Step Functions interpreter parses every JSONPath of every state each time it
    # reads one, building a new parser each time: much of a busy emulator's CPU. Expressions
    # are immutable, so each distinct path is parsed once.
    from jsonpath_ng.ext.parser import parse as parse_json_path
    from moto.stepfunctions.parser.asl.utils import json_path

    _replace(json_path, "parse", functools.lru_cache(maxsize=1024)(parse_json_path), undo)

    # moto has no EC2 placement groups: the emulator answers for them. And it launches what
    # EC2 refuses: the emulator holds launches to EC2's rules (see `ec2_rules`).
    from gpufleet.emulator.ec2_rules import Ec2Rules
    from gpufleet.emulator.placement_groups import PlacementGroups

    groups = PlacementGroups()
    ec2_rules = Ec2Rules(groups)
    # CloudWatch's alarm windows, likewise (see `cloudwatch_rules`).
    from gpufleet.emulator import cloudwatch_rules

    for hook in [*groups.hooks(), *ec2_rules.hooks(), *cloudwatch_rules.hooks()]:
        botocore.handlers.BUILTIN_HANDLERS.append(hook)
        undo.append(functools.partial(botocore.handlers.BUILTIN_HANDLERS.remove, hook))

    # 4. Count every boto3 call made from now on, by the actor on the calling thread.
    handler_entry = ("before-parameter-build", recorder.count_call)
    botocore.handlers.BUILTIN_HANDLERS.append(handler_entry)
    undo.append(lambda: botocore.handlers.BUILTIN_HANDLERS.remove(handler_entry))

    # EMF metrics are printed: the print inside Powertools' CloudWatch provider writes to the
    # invocation's log, whatever sys.stdout is at the time (test harnesses swap it).
    from aws_lambda_powertools.metrics.provider.cloudwatch_emf import cloudwatch as emf

    def routed_print(*values: Any, **kwargs: Any) -> None:
        buffer = getattr(_local, "log_buffer", None)
        if buffer is not None and "file" not in kwargs:
            kwargs["file"] = buffer
        print(*values, **kwargs)

    # Both Powertools' metrics and its single metrics (`single_metric`) print.
    from aws_lambda_powertools.metrics import base as metrics_base

    for module in (emf, metrics_base):
        module.print = routed_print  # type: ignore[attr-defined]
        undo.append(functools.partial(delattr, module, "print"))

    # Handler output (Powertools Logger, EMF metrics) goes to each invocation's log group.
    routed = _ThreadRoutedStream(sys.stdout)
    saved_stdout = sys.stdout
    sys.stdout = routed
    undo.append(lambda: setattr(sys, "stdout", saved_stdout))
    # The shared Powertools Logger keeps the stream it was created with: point it here too,
    # whenever the handlers were first imported.
    from gpufleet.handlers import common

    for handler in common.logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            previous = handler.setStream(routed)
            undo.append(functools.partial(handler.setStream, previous))
    logging.getLogger("botocore").setLevel(logging.WARNING)
    return Patches(recorder=recorder, undo=undo, ec2_rules=ec2_rules)


def _undo_transactions_item_by_item(undo: list[Callable[[], None]]) -> None:
    """moto keeps a deep copy of each table a transaction touches, to put back if it fails.
    Here its copy is the live table (so putting it back changes nothing), and what a failed
    transaction wrote is undone from the items it touched, as they were before."""
    from moto.dynamodb import models as dynamodb_models
    from moto.dynamodb.models.table import Table

    class TablesKeptLive:
        @staticmethod
        def deepcopy(value: Any, memo: Any = None) -> Any:
            return value if isinstance(value, Table) else copy.deepcopy(value, memo)

    _replace(dynamodb_models, "copy", TablesKeptLive, undo)
    original = dynamodb_models.DynamoDBBackend.transact_write_items

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        before = [_item_before(self, op) for item in transact_items for op in item.values()]
        try:
            original(self, transact_items)
        except Exception:
            for table_name, key, attributes in before:
                if attributes is None:
                    if self.get_item(table_name, key) is not None:
                        self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, attributes)
            raise

    _replace(dynamodb_models.DynamoDBBackend, "transact_write_items", transact_write_items, undo)


def _item_before(backend: Any, op: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """(table, key, the item's attributes now, or None) of one item of a transaction."""
    table = backend.get_table(op["TableName"])
    key = op.get("Key")
    if key is None:
        names = [table.hash_key_attr, table.range_key_attr]
        key = {name: op["Item"][name] for name in names if name is not None}
    current = backend.get_item(op["TableName"], key)
    return op["TableName"], key, None if current is None else current.to_json()["Attributes"]


def _replace(owner: Any, name: str, replacement: Any, undo: list[Callable[[], None]]) -> None:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    undo.append(lambda: setattr(owner, name, original))


def invoke_async(account_id: str, function_arn: str, event: Any) -> bool:
    """An asynchronous Lambda invocation: Lambda retries a failed one twice, then gives up
    (in AWS the event then goes to the function's dead-letter queue)."""
    from moto.awslambda.utils import get_backend

    region = function_arn.split(":")[3]
    function = get_backend(account_id, region).get_function(function_arn)

    def attempt() -> bool:
        _output, errored, _logs = function._invoke_lambda(json.dumps(event))
        return not errored

    plan = _fault_plan
    if plan is not None:
        return plan.deliver(attempt)
    return any(attempt() for _attempt in range(3))
