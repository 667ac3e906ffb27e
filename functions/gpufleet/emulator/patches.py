"""Every place where the embedded account replaces a library's own code, in one registry.

Each `Patch` names the attribute it replaces, the parameters the replacement relies on, and why
no public seam reaches it; `install` applies them all (and nothing else replaces library code).
`tests/unit/test_emulator_patches.py` fails, naming the patch, when the pinned moto (or
Powertools) no longer has what a patch replaces, and `install` refuses to start then.

Everything else the account adds goes through seams: botocore's event system (handlers added to
`botocore.handlers.BUILTIN_HANDLERS`, which every new session registers: placement groups,
EC2's launch rules, CloudWatch's alarm windows and GetMetricData's size, Lambda's account
settings, the Price List API, IAM for job sessions, Step Functions' StartExecution rate, the
faults of a chaos run, and the `Recorder` of who called);
the control plane's port for sessions (`runtime.use_sessions`: sessions that share one loader
of the service models, see `sessions`); the AWS APIs themselves (the stack's resources, routed as
`topology.rules` says, and the account's baseline); and the emulator's own loops (nodes,
schedules). Handlers' output reaches each invocation's log through `sys.stdout` and the
Powertools Logger's stream (`setStream`), both set for the account's lifetime.

The registry (`PATCHES`: 22 attributes, 20 of moto and 2 of Powertools), and why each cannot be
avoided:

- `LambdaFunction._invoke_lambda`: without Docker moto runs no function code. Every invocation
  (direct, Step Functions `lambda:invoke`, S3 notifications, EventBridge targets) ends here, so
  the function's real handler runs in-process, with a Lambda context and its own log.
- `Rule.send_to_targets`: moto delivers a rule's matches to SQS, Logs and buses, and raises
  NotImplementedError for a Lambda target. It is the one path that both in-process clients and
  the HTTP server (`gpufleet emulator`) take, so a rule's Lambda targets (put from
  `topology.rules`) are invoked here, asynchronously and with Lambda's two retries.
- `s3.notifications._invoke_awslambda`: moto invokes a notified function once, synchronously, and
  drops its error; S3 invokes it asynchronously and Lambda retries a failed event twice.
- `s3.notifications._get_s3_event`: S3's records of a versioned bucket carry the object's
  version id (intake keys a job on it); moto builds the record here and leaves it out.
- `DynamoDBBackend.put_item`, `update_item`, `delete_item`, `transact_write_items`: moto checks a
  condition and applies the write without a lock, so two threads can both pass one condition.
  DynamoDB applies each conditional write (and each transaction) atomically: the backend's
  writes are serialized, for in-process and HTTP callers alike.
- `DynamoDBBackend.get_item`, `query`, `scan`: moto applies a transaction's items one by one to
  the live table, so a read made meanwhile sees some of them (and, if the transaction fails,
  writes that never happened: a pass told a job another pass's cancelled batch had admitted).
  DynamoDB's reads never see a transaction in progress: they wait for the writes' lock.
- `copy` in moto's DynamoDB models (with `transact_write_items` above): moto deep-copies every
  table a transaction touches, once per item, to put back if the transaction fails: time in
  proportion to the table times the items (a pass's batch of admissions holds up to 100). The
  copy is the live table, and what a failed transaction wrote is undone from the items it
  touched, as they were before it.
- `CallbackEndpoint.setup_heartbeat_endpoint`: a `.waitForTaskToken` task with a heartbeat whose
  result was sent while its Lambda still ran (Launch handing back a launch that got no capacity)
  waits out a whole heartbeat period in moto, which makes the heartbeat endpoint after the
  result came; Step Functions takes such a result at once. The new endpoint is told of it.
- `HeartbeatEndpoint.clear_and_wait`, `WaitFunction._wait_interval`: moto times a task's
  `HeartbeatSeconds` and a `Wait` state with wall-clock waits, so a loaded machine that delivers
  a heartbeat late fails a healthy node, and a launch's retry comes earlier, in emulated time,
  than under no load. Both wait on the account's clock (`clock`), the one its nodes run on.
- `json_path.parse`: moto's Step Functions interpreter parses each JSONPath at every read with a
  new parser: much of a busy account's CPU. Expressions are immutable: each is parsed once.
- `BaseExecutionWorkerCommunication.terminated`, `Execution.stop`: moto never sends Step
  Functions' execution status change events, and ends a stopped execution only when the task it
  waits on returns (see `executions`).
- `ServiceQuotasBackend.get_service_quota`: moto's Service Quotas knows VPC quotas only; EC2's
  vCPU quotas are answered from the backend, for HTTP callers too (see `account_baseline`).
- `Subnet.get_available_subnet_ip`: EC2 gives an instance an address of its subnet, and no API
  of a launch chooses it; the emulator's nodes are local processes that meet their peers at
  those addresses, so each instance gets a loopback address of its own (see `loopback`).
- `print` in Powertools' metrics modules: EMF metrics are printed. The print writes to the
  invocation's log, whatever `sys.stdout` is at the time (test harnesses swap it).

moto is pinned exactly (requirements.lock): these patches rely on its internals.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import botocore.handlers

from gpufleet.errors import GpufleetError

if TYPE_CHECKING:
    from gpufleet.emulator.clock import EmulatorClock
    from gpufleet.emulator.ec2_rules import Ec2Rules
    from gpufleet.emulator.job_sessions import JobSessions
    from gpufleet.emulator.throttling import BucketQuota, StepFunctionsRateLimits

CONTROL_PLANE = "control-plane"
EMULATOR = "emulator"
NODE = "node"

_local = threading.local()

# botocore names some services differently from the ARNs and the console.
_SERVICE_NAMES = {
    "sfn": "states",
    "cloudwatch": "cloudwatch",
    "eventbridge": "events",
    "cloudwatch-logs": "logs",
    "service-quotas": "servicequotas",
}


class PatchDoesNotFit(GpufleetError, RuntimeError):
    """The installed library no longer has what a patch replaces, as the patch expects it."""


@dataclass(frozen=True)
class Patch:
    """One attribute of a library that the embedded account replaces."""

    module: str
    attribute: str  # "Class.method", or a module-level name
    why: str
    # The parameter names of the original that the replacement relies on (None: any).
    parameters: tuple[str, ...] | None = None
    # The module has no such name: the patch adds one that shadows a builtin its code calls.
    shadows_builtin: bool = False

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"

    def _owner(self) -> tuple[Any, str]:
        owner: Any = importlib.import_module(self.module)
        *path, name = self.attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        return owner, name

    def problems(self) -> list[str]:
        """What the installed library lacks for this patch (none: it fits)."""
        try:
            owner, name = self._owner()
        except (ImportError, AttributeError) as exc:
            return [f"{self.name}: {exc}"]
        if self.shadows_builtin:
            if f"{name}(" not in inspect.getsource(owner):
                return [f"{self.name}: the module no longer calls {name}()"]
            return []
        if not hasattr(owner, name):
            return [f"{self.name} no longer exists"]
        if self.parameters is not None:
            found = tuple(inspect.signature(getattr(owner, name)).parameters)
            if found != self.parameters:
                return [f"{self.name} takes {found}; the patch expects {self.parameters}"]
        return []

    def apply(self, make: Callable[[Any], Any]) -> Callable[[], None]:
        """Replace the attribute with `make(original)` (None when it shadows a builtin); returns
        what puts the original back."""
        problems = self.problems()
        if problems:
            raise PatchDoesNotFit(
                f"{'; '.join(problems)} (the emulator's patch: {self.why}) - pin the moto version "
                "in requirements.lock or update gpufleet/emulator/patches.py"
            )
        owner, name = self._owner()
        had = name in vars(owner)
        raw = vars(owner).get(name)  # as stored (a staticmethod stays one when put back)
        setattr(owner, name, make(getattr(owner, name, None)))

        def undo() -> None:
            if had:
                setattr(owner, name, raw)
            else:
                delattr(owner, name)

        return undo


_DYNAMODB = "moto.dynamodb.models"
_SFN = "moto.stepfunctions.parser"

IN_PROCESS_INVOKE = Patch(
    "moto.awslambda.models",
    "LambdaFunction._invoke_lambda",
    "every invocation runs the function's real handler in-process (moto runs code only in Docker)",
    ("self", "event"),
)
RULE_TARGETS = Patch(
    "moto.events.models",
    "Rule.send_to_targets",
    "a rule's Lambda targets are invoked asynchronously (moto raises NotImplementedError)",
    ("self", "original_event", "transform_input"),
)
S3_TO_LAMBDA = Patch(
    "moto.s3.notifications",
    "_invoke_awslambda",
    "S3 invokes asynchronously, with Lambda's two retries (moto once, dropping the error)",
    ("account_id", "event_body", "fn_arn", "region_name"),
)
S3_RECORD_VERSION = Patch(
    "moto.s3.notifications",
    "_get_s3_event",
    "the records of a versioned bucket carry the object's version id, as S3's do",
    ("event_name", "bucket", "key", "notification_id"),
)
ATOMIC_TRANSACTIONS = Patch(
    _DYNAMODB, "DynamoDBBackend.transact_write_items", "conditional writes are atomic"
)
ATOMIC_WRITES = (
    *(
        Patch(_DYNAMODB, f"DynamoDBBackend.{operation}", "conditional writes are atomic")
        for operation in ("put_item", "update_item", "delete_item")
    ),
    ATOMIC_TRANSACTIONS,
)
COMMITTED_READS = tuple(
    Patch(_DYNAMODB, f"DynamoDBBackend.{operation}", "reads see no transaction in progress")
    for operation in ("get_item", "query", "scan")
)
TABLES_NOT_COPIED = Patch(
    _DYNAMODB,
    "copy",
    "a transaction keeps no copy of its tables: a failed one is undone item by item",
)
HEARTBEAT_TIMEOUTS = Patch(
    f"{_SFN}.asl.eval.callback.callback",
    "HeartbeatEndpoint.clear_and_wait",
    "a task's heartbeat timeout is counted on the emulator's clock (moto: the wall clock's)",
    ("self",),
)
WAIT_STATES = Patch(
    f"{_SFN}.asl.component.state.wait.wait_function.wait_function",
    "WaitFunction._wait_interval",
    "a Wait state waits its seconds on the emulator's clock (moto: the wall clock's)",
    ("self", "env", "wait_seconds"),
)
EARLY_TASK_RESULT = Patch(
    f"{_SFN}.asl.eval.callback.callback",
    "CallbackEndpoint.setup_heartbeat_endpoint",
    "a task's result sent before its heartbeat endpoint existed is taken at once",
    ("self", "heartbeat_seconds"),
)
JSON_PATHS_PARSED_ONCE = Patch(
    f"{_SFN}.asl.utils.json_path",
    "parse",
    "each JSONPath is parsed once, not at every read (CPU only)",
)
EXECUTION_ENDED = Patch(
    f"{_SFN}.backend.execution",
    "BaseExecutionWorkerCommunication.terminated",
    "an execution's end sends Step Functions' status change event",
    ("self",),
)
EXECUTION_STOPPED = Patch(
    f"{_SFN}.backend.execution",
    "Execution.stop",
    "StopExecution ends the execution at once (moto: once its task returns)",
    ("self", "stop_date", "error", "cause"),
)
EC2_VCPU_QUOTAS = Patch(
    "moto.servicequotas.models",
    "ServiceQuotasBackend.get_service_quota",
    "EC2's vCPU quotas are answered (moto knows VPC quotas only)",
    ("self", "service_code", "quota_code"),
)
LOOPBACK_PRIVATE_IPS = Patch(
    "moto.ec2.models.subnets",
    "Subnet.get_available_subnet_ip",
    "each instance's private IP is a loopback address of its own (the nodes are local processes)",
    ("self", "instance"),
)
EMF_PRINTS = tuple(
    Patch(module, "print", "EMF metrics go to the invocation's log", shadows_builtin=True)
    for module in (
        "aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch",
        "aws_lambda_powertools.metrics.base",  # single_metric
    )
)

PATCHES: tuple[Patch, ...] = (
    IN_PROCESS_INVOKE,
    RULE_TARGETS,
    S3_TO_LAMBDA,
    S3_RECORD_VERSION,
    *ATOMIC_WRITES,
    *COMMITTED_READS,
    TABLES_NOT_COPIED,
    HEARTBEAT_TIMEOUTS,
    WAIT_STATES,
    EARLY_TASK_RESULT,
    JSON_PATHS_PARSED_ONCE,
    EXECUTION_ENDED,
    EXECUTION_STOPPED,
    EC2_VCPU_QUOTAS,
    LOOPBACK_PRIVATE_IPS,
    *EMF_PRINTS,
)


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
    "name",  # the execution StartExecution starts
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
    if "RequestItems" in params:  # BatchWriteItem, BatchGetItem: IAM judges each item's key
        kept["RequestItems"] = {
            table: (
                {"Keys": entries["Keys"]}  # BatchGetItem's
                if isinstance(entries, dict)
                else [
                    {
                        kind: {name: request[name] for name in ("Key", "Item") if name in request}
                        for kind, request in entry.items()
                    }
                    for entry in entries
                ]
            )
            for table, entries in params["RequestItems"].items()
        }
    if "Entries" in params:  # PutEvents: IAM judges each entry's bus and source
        kept["Entries"] = [
            {name: entry[name] for name in ("EventBusName", "Source") if name in entry}
            for entry in params["Entries"]
        ]
    return kept


class Recorder:
    """API calls and Lambda invocations made by the control plane. Each boto3 call is counted
    against the actor on the calling thread (control-plane code, the emulator itself, or a
    simulated node), so the demo reports the control plane's calls and nothing else; a call made
    while a handler runs is also logged against that function, with the parameters that name
    what it touches (what IAM judges)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.api_calls: Counter[str] = Counter()
        self.invocations: list[Invocation] = []
        self.calls: list[ApiCall] = []  # those counted in `api_calls`, invocations apart
        # Off for a long-lived emulator (`gpufleet emulator`): the counts stay, the logs of
        # every call and invocation would grow without end.
        self.keeps_log = True

    def hooks(self) -> list[tuple[str, Callable[..., None]]]:
        return [("before-parameter-build", self.count_call)]

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


def _routed_print(*values: Any, **kwargs: Any) -> None:
    """`print` for Powertools' metrics: to the invocation's log when a handler runs."""
    buffer = getattr(_local, "log_buffer", None)
    if buffer is not None and "file" not in kwargs:
        kwargs["file"] = buffer
    print(*values, **kwargs)


def _resolve_handler(path: str) -> Callable[[Any, Any], Any]:
    module_name, _, attribute = path.rpartition(".")
    module = importlib.import_module(module_name)
    handler: Callable[[Any, Any], Any] = getattr(module, attribute)
    return handler


@dataclass
class Installed:
    """The patches and hooks of one embedded account, and what removes them."""

    recorder: Recorder
    ec2_rules: Ec2Rules
    job_sessions: JobSessions
    start_executions: StepFunctionsRateLimits
    _undo: list[tuple[Patch | None, Callable[[], None]]] = field(default_factory=list)

    def remove(self, *patches: Patch) -> None:
        """Put back the patches named (everything, hooks included, when none is named), last
        installed first; what was put back already is skipped."""
        for entry in reversed(list(self._undo)):
            patch, undo = entry
            if not patches or patch in patches:
                undo()
                self._undo.remove(entry)


def install(
    recorder: Recorder,
    write_log: Callable[[str, str], None],
    clock: EmulatorClock,
    start_execution: BucketQuota,
) -> Installed:
    """Apply every patch of the registry and the account's hooks; `write_log(log_group, text)`
    stores a handler's output; heartbeat timeouts are counted on `clock`, and Step Functions'
    StartExecution bucket (`start_execution`) refills on it."""
    from gpufleet.adapters.aws import runtime
    from gpufleet.emulator import (
        account_baseline,
        cloudwatch_rules,
        dynamodb_rules,
        executions,
        loopback,
        pricing,
    )
    from gpufleet.emulator.ec2_rules import Ec2Rules
    from gpufleet.emulator.job_sessions import JobSessions
    from gpufleet.emulator.placement_groups import PlacementGroups
    from gpufleet.emulator.sessions import SessionsSharingModels
    from gpufleet.emulator.throttling import StepFunctionsRateLimits

    write_lock = threading.RLock()
    replacements: dict[Patch, Callable[[Any], Any]] = {
        IN_PROCESS_INVOKE: lambda _original: _in_process_invoke(recorder, write_log),
        RULE_TARGETS: _lambda_targets,
        S3_TO_LAMBDA: lambda _original: _s3_invoke,
        S3_RECORD_VERSION: _with_version_ids,
        **{
            patch: functools.partial(_serialized, write_lock)
            for patch in (*ATOMIC_WRITES, *COMMITTED_READS)
        },
        # A failed transaction is undone inside the lock.
        ATOMIC_TRANSACTIONS: lambda original: _serialized(
            write_lock, _undone_item_by_item(original)
        ),
        TABLES_NOT_COPIED: lambda _module: _TablesKeptLive,
        HEARTBEAT_TIMEOUTS: lambda _original: _heartbeat_wait_on(clock),
        WAIT_STATES: lambda _original: _wait_state_on(clock),
        EARLY_TASK_RESULT: _told_of_an_earlier_result,
        JSON_PATHS_PARSED_ONCE: functools.lru_cache(maxsize=1024),
        EXECUTION_ENDED: executions.emit_on_end,
        EXECUTION_STOPPED: executions.end_at_once,
        EC2_VCPU_QUOTAS: account_baseline.answer_ec2_vcpu_quotas,
        LOOPBACK_PRIVATE_IPS: loopback.loopback_subnet_ips,
        **{patch: lambda _none: _routed_print for patch in EMF_PRINTS},
    }
    groups = PlacementGroups()
    installed = Installed(
        recorder,
        Ec2Rules(groups),
        JobSessions(),
        StepFunctionsRateLimits(start_execution, clock.now),
    )
    try:
        for patch in PATCHES:
            installed._undo.append((patch, patch.apply(replacements[patch])))
        installed._undo.append((None, runtime.use_sessions(SessionsSharingModels())))
        # moto has no EC2 placement groups, and launches what EC2 refuses: hooks answer for
        # them. And every boto3 call made from now on is counted, by the actor on its thread.
        # CloudWatch's alarm windows and GetMetricData's 500 queries a call likewise
        # (`cloudwatch_rules`), BatchWriteItem's 25 requests (`dynamodb_rules`), and what
        # moto lacks of Lambda's account settings (`account_baseline`), and the Price List API
        # (`pricing`). A job session's requests are judged by the job role's policy
        # (`job_sessions`), and StartExecution is throttled at Step Functions' bucket
        # (`throttling`).
        hooks = [
            *groups.hooks(),
            *installed.ec2_rules.hooks(),
            *cloudwatch_rules.hooks(),
            *dynamodb_rules.hooks(),
            *account_baseline.hooks(),
            *pricing.hooks(),
            *installed.job_sessions.hooks(),
            *installed.start_executions.hooks(),
            *recorder.hooks(),
        ]
        for hook in hooks:
            botocore.handlers.BUILTIN_HANDLERS.append(hook)
            installed._undo.append(
                (None, functools.partial(botocore.handlers.BUILTIN_HANDLERS.remove, hook))
            )
        _route_handler_output(installed)
    except BaseException:
        installed.remove()
        raise
    logging.getLogger("botocore").setLevel(logging.WARNING)
    return installed


def _route_handler_output(installed: Installed) -> None:
    """Handler output (Powertools Logger, EMF metrics) goes to each invocation's log group."""
    routed = _ThreadRoutedStream(sys.stdout)
    saved_stdout = sys.stdout
    sys.stdout = routed
    installed._undo.append((None, lambda: setattr(sys, "stdout", saved_stdout)))
    # The shared Powertools Logger keeps the stream it was created with: point it here too,
    # whenever the handlers were first imported.
    from gpufleet.handlers import common

    for handler in common.logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            previous = handler.setStream(routed)
            installed._undo.append((None, functools.partial(handler.setStream, previous)))


def _in_process_invoke(
    recorder: Recorder, write_log: Callable[[str, str], None]
) -> Callable[..., tuple[str, bool, str]]:
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

    return invoke_in_process


def _lambda_targets(original: Callable[..., None]) -> Callable[..., None]:
    def send_to_targets(self: Any, original_event: Any, transform_input: bool = True) -> None:
        if not self.event_pattern.matches_event(original_event):
            return
        functions = [t for t in self.targets if ":lambda:" in str(t["Arn"])]
        for target in functions:
            invoke_async(self.account_id, str(target["Arn"]), original_event)
        others = [t for t in self.targets if t not in functions]
        if others:  # SQS, Logs, buses: moto's own delivery
            saved = self.targets
            self.targets = others
            try:
                original(self, original_event, transform_input)
            finally:
                self.targets = saved

    return send_to_targets


def _s3_invoke(
    account_id: str,
    event_body: Any,
    fn_arn: str,
    region_name: str,  # noqa: ARG001 - moto's signature; the function's ARN names its region
) -> None:
    invoke_async(account_id, fn_arn, event_body)


def _with_version_ids(original: Callable[..., Any]) -> Callable[..., Any]:
    def s3_event(event_name: str, bucket: Any, key: Any, notification_id: str) -> Any:
        event = original(event_name, bucket, key, notification_id)
        if bucket.is_versioned:
            for record in event["Records"]:
                record["s3"]["object"]["versionId"] = key.version_id
        return event

    return s3_event


class _TablesKeptLive:
    """moto's DynamoDB models' `copy` module, whose `deepcopy` hands a table back as it is."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.table import Table

        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def _undone_item_by_item(original: Callable[..., Any]) -> Callable[..., Any]:
    """moto's transaction, undone from the items it touched when it fails (its own copies of
    the tables are the live ones: `_TablesKeptLive`)."""

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        before = [
            _item_before(self, op)
            for item in transact_items
            for op in item.values()
            if op.get("TableName") in self.tables
        ]
        try:
            original(self, transact_items)
        except Exception:
            for table_name, key, attributes in reversed(before):
                if attributes is not None:
                    self.put_item(table_name, attributes)
                elif self.get_item(table_name, key) is not None:
                    self.delete_item(table_name, key)
            raise

    return transact_write_items


def _item_before(backend: Any, op: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """(table, key, the item's attributes now, or None) of one item of a transaction."""
    table = backend.get_table(op["TableName"])
    key = op.get("Key")
    if key is None:
        names = [table.hash_key_attr, table.range_key_attr]
        key = {name: op["Item"][name] for name in names if name is not None}
    current = backend.get_item(op["TableName"], key)
    return op["TableName"], key, None if current is None else current.to_json()["Attributes"]


def _serialized(lock: threading.RLock, original: Callable[..., Any]) -> Callable[..., Any]:
    def atomic(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(self, *args, **kwargs)

    return atomic


def _heartbeat_wait_on(clock: EmulatorClock) -> Callable[[Any], bool]:
    def clear_and_wait(self: Any) -> bool:
        # moto's own body, with its wall-clock `Event.wait` on the account's clock.
        with self._mutex:
            if self._next_heartbeat_event.is_set():
                self._next_heartbeat_event.clear()
                return True
        return clock.wait(self._next_heartbeat_event, self._heartbeat_seconds)

    return clear_and_wait


# How often a Wait state looks whether its execution was stopped meanwhile (moto pulses an
# event then, which a wait on the clock can miss).
_WAIT_STATE_LOOK_SECONDS = 0.5


def _wait_state_on(clock: EmulatorClock) -> Callable[[Any, Any, int], None]:
    def wait_interval(self: Any, env: Any, wait_seconds: int) -> None:  # noqa: ARG001 - a method
        # moto waits out the seconds unless the execution ends meanwhile; so does this.
        deadline = clock.now() + wait_seconds
        while env.is_running() and (left := deadline - clock.now()) > 0:
            clock.wait(env.program_state_event, min(left, _WAIT_STATE_LOOK_SECONDS))

    return wait_interval


def _told_of_an_earlier_result(original: Callable[..., Any]) -> Callable[..., Any]:
    def setup_heartbeat_endpoint(self: Any, heartbeat_seconds: int) -> Any:
        endpoint = original(self, heartbeat_seconds)
        # Told after the endpoint exists: a result that comes meanwhile tells it itself.
        if self.get_outcome() is not None:
            endpoint.notify()
        return endpoint

    return setup_heartbeat_endpoint


def invoke_async(account_id: str, function_arn: str, event: Any) -> bool:
    """An asynchronous Lambda invocation: Lambda retries a failed one twice, then gives up
    (in AWS the event then goes to the function's dead-letter queue). A `FaultPlan` may deliver
    it otherwise; without one, it is delivered once, at once, on the calling thread."""
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
