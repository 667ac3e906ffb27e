"""`gpufleet chaos`: many jobs through the embedded account while everything around the control
plane misbehaves, and the invariants that must hold anyway, checked from the outside.

The faults (docs/chaos.md) are injected at the edges only: the SDK (botocore hooks in
`faults`), the account's asynchronous delivery (a `FaultPlan` in `patches`), and the schedule.
The control plane's code runs as it is.

- every asynchronous event (S3 and EventBridge to Lambda, the schedule) is delivered twice, and
  a share of the deliveries are held back so later events overtake them;
- a share of the jobs get `InsufficientInstanceCapacity` on every spot launch;
- a share of the jobs are interrupted by spot mid-run (warning, then termination);
- a share of handler runs crash right after one of their writes, and are retried as Lambda
  (asynchronous: two retries) or the state machine's `Retry` would;
- a share of the control plane's DynamoDB requests are throttled (the SDK retries them);
- on every tick of the schedule a second dispatch pass races the scheduled one.

The verdict comes from what an operator could see, never from the control plane's own answer:
the specs submitted, the jobs table, EC2 (every launch and termination, as CloudTrail would
show them, and what runs at the end), and the behaviour each job was given.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, TextIO

import botocore.loaders
import botocore.session
import yaml

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import Job
from gpufleet.emulator.account import ACCOUNT_ID, BUCKET_NAME, Account, embedded_account
from gpufleet.emulator.faults import (
    CapacityFaults,
    CrashAfterWrites,
    DynamoThrottling,
    HookSpec,
    injected,
)
from gpufleet.emulator.nodes import Behaviour, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import (
    CONTROL_PLANE,
    EMULATOR,
    acting_as,
    invoke_async,
    planned_faults,
)
from gpufleet.emulator.scheduler import ScheduleRunner
from gpufleet.topology import (
    DETAIL_JOB_SUBMITTED,
    DISPATCH,
    INTAKE_PREFIX,
    JOB_LIFECYCLE,
    JOBS_TABLE,
    SCHEDULES,
    SUBMIT_SOURCE,
    TAG_JOB_ID,
    TAG_MANAGED,
)

# Short waits so that hundreds of jobs finish in minutes; nothing else differs from the demo.
CHAOS_ENV = {
    "GPUFLEET_RETRY_WAIT_SECONDS": "1",
    "GPUFLEET_CAPACITY_MEMORY_SECONDS": "5",
}
TEAMS = ("vision", "nlp", "audio")
RETRYABLE_EXIT = 3
NON_RETRYABLE_EXIT = 2


@dataclass(frozen=True)
class ChaosConfig:
    jobs: int
    seed: int
    copies_per_event: int = 2
    delayed_share: float = 0.2  # of deliveries, held back up to `max_delay_seconds`
    max_delay_seconds: float = 1.5
    spot_capacity_error_share: float = 0.3  # of jobs
    interruption_share: float = 0.1  # of jobs
    crash_share: float = 0.05  # of handler runs
    crash_max_write: int = 6  # a crashing run dies after its Nth write, N in 1..this
    throttle_share: float = 0.05  # of the control plane's DynamoDB requests
    schedule_period_seconds: float = 2.0  # one "minute" of the schedule
    timeout_seconds: float = 900.0


@dataclass(frozen=True)
class ChaosJob:
    """One submission of the run: its spec, how it is submitted, and how its container and the
    market treat it."""

    name: str
    via: str  # "s3" or "event"
    document: dict[str, Any]
    behaviour: Behaviour
    spot_capacity_errors: bool

    def expected(self) -> tuple[str, int]:
        """The final status and exit code the job's behaviour implies. Every run of it exits
        the same way, so retries cannot change the outcome, and nothing the chaos does
        (duplicates, capacity errors, interruptions, crashes, throttling) may."""
        code = self.behaviour.exit_code
        return ("SUCCEEDED", 0) if code == 0 else ("FAILED", code)


def plan_workload(config: ChaosConfig) -> list[ChaosJob]:
    """The jobs of a run, drawn from the seed alone."""
    rng = random.Random(f"workload-{config.seed}")
    jobs = []
    for index in range(config.jobs):
        name = f"chaos-{index:04d}"
        exit_code = rng.choices([0, RETRYABLE_EXIT, NON_RETRYABLE_EXIT], weights=[75, 15, 10])[0]
        gpus = rng.choice([1, 1, 1, 2, 4])
        interrupted = rng.random() < config.interruption_share
        document: dict[str, Any] = {
            "name": name,
            "team": rng.choice(TEAMS),
            "priority": rng.choice(["low", "normal", "normal", "high"]),
            "image": "public.ecr.aws/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
            "command": ["python", "train.py", "--seed", str(index)],
            "resources": {"gpus": gpus, "nodes": 2 if rng.random() < 0.05 else 1},
            "spot": rng.choice(["auto", "auto", "auto", "never"]),
            "checkpoint": f"s3://chaos-checkpoints/{name}/",
            "max_retries": rng.randint(0, 2),
            "no_retry_exit_codes": [NON_RETRYABLE_EXIT],
            "timeout": "1h",
        }
        jobs.append(
            ChaosJob(
                name=name,
                via="event" if rng.random() < 0.3 else "s3",
                document=document,
                behaviour=Behaviour(
                    # Long enough for an interruption to land mid-run.
                    duration_seconds=rng.uniform(1.2, 2.0)
                    if interrupted
                    else rng.uniform(0.5, 1.5),
                    exit_code=exit_code,
                    interrupt_after_seconds=rng.uniform(0.4, 0.8) if interrupted else None,
                ),
                spot_capacity_errors=rng.random() < config.spot_capacity_error_share,
            )
        )
    return jobs


class ChaoticDelivery:
    """The account's asynchronous deliveries under the chaos plan (a `patches.FaultPlan`):
    every event `copies` times, some copies late, and every handler run exposed to crashes."""

    def __init__(self, config: ChaosConfig, rng: random.Random, crashes: CrashAfterWrites) -> None:
        self._config = config
        self._rng = rng
        self._crashes = crashes
        self._lock = threading.Condition()
        self._pending = 0
        self._closed = False
        self.deliveries = 0
        self.delayed = 0
        self.dropped = 0  # deliveries that failed three times (in AWS: the dead-letter queue)
        self.errors: Counter[str] = Counter()  # what handler runs died of, injected or not

    def deliver(self, delivery: Callable[[], bool]) -> bool:
        delivered = True
        for _copy in range(self._config.copies_per_event):
            with self._lock:
                self.deliveries += 1
                late = self._rng.random() < self._config.delayed_share
                delay = self._rng.uniform(0.05, self._config.max_delay_seconds) if late else 0.0
                if late:
                    self.delayed += 1
                    self._pending += 1
            if late:
                timer = threading.Timer(delay, self._late, args=(delivery,))
                timer.daemon = True
                timer.start()
            else:
                delivered = self._count(delivery()) and delivered
        return delivered

    @contextmanager
    def invocation(self, function_name: str) -> Iterator[None]:
        try:
            with self._crashes.invocation(function_name):
                yield
        except Exception as exc:
            with self._lock:
                self.errors[f"{function_name}: {type(exc).__name__}: {str(exc)[:160]}"] += 1
            raise

    def _late(self, delivery: Callable[[], bool]) -> None:
        try:
            with self._lock:
                closed = self._closed
            if not closed:
                with acting_as(CONTROL_PLANE):
                    self._count(delivery())
        finally:
            with self._lock:
                self._pending -= 1
                self._lock.notify_all()

    def _count(self, delivered: bool) -> bool:
        if not delivered:
            with self._lock:
                self.dropped += 1
        return delivered

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self, timeout: float) -> None:
        """No more late deliveries; wait for those running now."""
        with self._lock:
            self._closed = True
            self._lock.wait_for(lambda: self._pending == 0, timeout)


@dataclass
class _Launch:
    job_id: str
    key: str  # the fleet, reservation or tagging that gave the job these instances
    instance_ids: list[str]
    at: float


class Ec2Ledger:
    """What CloudTrail would show of EC2: every launch, claim and termination, whoever made
    it, with the time it took effect."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.launches: list[_Launch] = []
        self.terminated: dict[str, float] = {}

    def hooks(self) -> list[HookSpec]:
        return [
            ("before-parameter-build.ec2.CreateFleet", self._note_job),
            ("before-parameter-build.ec2.RunInstances", self._note_job),
            ("before-parameter-build.ec2.CreateTags", self._note_job),
            ("after-call.ec2.CreateFleet", self._fleet),
            ("after-call.ec2.RunInstances", self._reservation),
            ("after-call.ec2.CreateTags", self._claim),
            ("after-call.ec2.TerminateInstances", self._termination),
        ]

    @staticmethod
    def _note_job(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        tags = [t for spec in params.get("TagSpecifications", []) for t in spec.get("Tags", [])]
        tags += params.get("Tags", [])
        job_id = next((t.get("Value") for t in tags if t.get("Key") == TAG_JOB_ID), None)
        if job_id:
            context["chaos_job_id"] = job_id
            context["chaos_resources"] = list(params.get("Resources", []))

    def _record(self, context: dict[str, Any], key: str, instance_ids: list[str]) -> None:
        job_id = context.get("chaos_job_id")
        if job_id and instance_ids:
            with self._lock:
                self.launches.append(_Launch(job_id, key, instance_ids, self._clock()))

    def _fleet(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        ids = [i for group in parsed.get("Instances", []) for i in group.get("InstanceIds", [])]
        self._record(context, str(parsed.get("FleetId", "")), ids)

    def _reservation(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        ids = [instance["InstanceId"] for instance in parsed.get("Instances", [])]
        self._record(context, str(parsed.get("ReservationId", "")), ids)

    def _claim(
        self, http_response: Any, context: dict[str, Any], **_: Any
    ) -> None:  # a warm instance tagged for a job
        if http_response.status_code < 300:
            resources = [r for r in context.get("chaos_resources", []) if r.startswith("i-")]
            self._record(context, "tagged:" + ",".join(resources), resources)

    def _termination(self, parsed: dict[str, Any], **_: Any) -> None:
        now = self._clock()
        with self._lock:
            for change in parsed.get("TerminatingInstances", []):
                self.terminated.setdefault(change["InstanceId"], now)

    def double_launches(self) -> dict[str, list[dict[str, Any]]]:
        """Jobs that had instances of two different launches alive at the same time, with the
        launches in question."""
        by_job: dict[str, list[_Launch]] = defaultdict(list)
        with self._lock:
            for launch in self.launches:
                by_job[launch.job_id].append(launch)
            terminated = dict(self.terminated)
        found: dict[str, list[dict[str, Any]]] = {}
        for job_id, launches in by_job.items():
            overlapping: dict[str, _Launch] = {}
            for first, second in combinations(launches, 2):
                if first.key != second.key and self._overlap(first, second, terminated):
                    overlapping[first.key], overlapping[second.key] = first, second
            if overlapping:
                found[job_id] = [
                    {
                        "launch": launch.key,
                        "instances": launch.instance_ids,
                        "at": round(launch.at, 3),
                        "terminated": [terminated.get(i) for i in launch.instance_ids],
                    }
                    for launch in sorted(overlapping.values(), key=lambda launch: launch.at)
                ]
        return found

    @staticmethod
    def _overlap(first: _Launch, second: _Launch, terminated: dict[str, float]) -> bool:
        for a in first.instance_ids:
            for b in second.instance_ids:
                end = min(terminated.get(a, float("inf")), terminated.get(b, float("inf")))
                if max(first.at, second.at) < end:
                    return True
        return False


class TwoDispatchers(ScheduleRunner):
    """The schedule, with a second dispatch pass started alongside the scheduled one on every
    tick: two dispatchers at once, as overlapping Lambda invocations would be."""

    def __init__(self, account: Account, period_seconds: float) -> None:
        super().__init__(account, period_seconds)
        self._dispatch_arn = account.function_arns[DISPATCH.construct_id]
        self.rival_passes = 0

    def tick(self) -> None:
        rival = threading.Thread(target=self._rival_pass, name="rival-dispatcher", daemon=True)
        rival.start()
        super().tick()
        rival.join()

    def _rival_pass(self) -> None:
        schedule = next(s for s in SCHEDULES if s.target_function == DISPATCH.construct_id)
        with acting_as(CONTROL_PLANE):
            invoke_async(
                ACCOUNT_ID,
                self._dispatch_arn,
                {"source": "aws.scheduler", "schedule": schedule.construct_id},
            )
        self.rival_passes += 1


class _LiveNodes(NodeSimulator):
    """The node simulator, asking EC2 only for live instances: a long run leaves hundreds of
    terminated ones, which the simulator skips anyway, and listing them every 0.1 s would take
    most of the run's CPU."""

    def _managed_instances(self) -> list[dict[str, Any]]:
        response = self._ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        return [i for r in response["Reservations"] for i in r["Instances"]]


@contextmanager
def _shared_service_models() -> Iterator[None]:
    """Every botocore session of the run shares one loader of service models. The emulator
    makes a session per client, and each new session parses the models' JSON again, which
    would dominate a long run's CPU; the models are only read, so nothing else changes."""
    original = botocore.session.create_loader
    loaders: dict[str | None, botocore.loaders.Loader] = {}
    lock = threading.Lock()

    def shared(search_path_string: str | None = None) -> botocore.loaders.Loader:
        with lock:
            if search_path_string not in loaders:
                loaders[search_path_string] = original(search_path_string)
            return loaders[search_path_string]

    botocore.session.create_loader = shared
    try:
        yield
    finally:
        botocore.session.create_loader = original


@dataclass
class ChaosResult:
    seed: int
    jobs: int
    terminal: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)
    double_launches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    leaked_instances: list[str] = field(default_factory=list)
    wrong_status: list[dict[str, Any]] = field(default_factory=list)
    duplicate_jobs: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    errored_invocations: dict[str, int] = field(default_factory=dict)
    handler_errors: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    completed: bool = False

    @property
    def holds(self) -> bool:
        """Every invariant holds."""
        return not (
            self.lost
            or self.double_launches
            or self.leaked_instances
            or self.wrong_status
            or self.duplicate_jobs
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "jobs": self.jobs,
            "terminal": self.terminal,
            "lost": len(self.lost),
            "double_launches": len(self.double_launches),
            "leaked_instances": len(self.leaked_instances),
            "wrong_status": len(self.wrong_status),
            "duplicate_jobs": len(self.duplicate_jobs),
            "completed": self.completed,
            "wall_seconds": round(self.wall_seconds, 1),
            "faults": self.faults,
            "crashes": self.crashes,
            "errored_invocations": self.errored_invocations,
            "handler_errors": self.handler_errors,
            "violations": {
                "lost": self.lost,
                "double_launches": self.double_launches,
                "leaked_instances": self.leaked_instances,
                "wrong_status": self.wrong_status,
                "duplicate_jobs": self.duplicate_jobs,
            },
        }


def _submit(account: Account, job: ChaosJob) -> None:
    if job.via == "event":
        account.client("events").put_events(
            Entries=[
                {
                    "EventBusName": account.bus,
                    "Source": SUBMIT_SOURCE,
                    "DetailType": DETAIL_JOB_SUBMITTED,
                    "Detail": json.dumps(job.document),
                }
            ]
        )
        return
    as_json = int(job.name.rsplit("-", 1)[-1]) % 2 == 0
    account.client("s3").put_object(
        Bucket=account.bucket,
        Key=f"{INTAKE_PREFIX}{job.name}.{'json' if as_json else 'yaml'}",
        Body=(json.dumps(job.document) if as_json else yaml.safe_dump(job.document)).encode(),
    )


def run_chaos(config: ChaosConfig, progress: TextIO | None = None) -> ChaosResult:
    started = time.monotonic()

    def say(text: str) -> None:
        if progress is not None:
            progress.write(f"{time.monotonic() - started:6.1f}s  {text}\n")
            progress.flush()

    workload = plan_workload(config)
    short_of_spot = {job.name for job in workload if job.spot_capacity_errors}
    capacity = CapacityFaults(
        BUCKET_NAME, lambda name, capacity_type: capacity_type == "spot" and name in short_of_spot
    )
    throttling = DynamoThrottling(config.throttle_share, random.Random(f"throttle-{config.seed}"))
    crashes = CrashAfterWrites(
        config.crash_share, config.crash_max_write, random.Random(f"crash-{config.seed}")
    )
    delivery = ChaoticDelivery(config, random.Random(f"delivery-{config.seed}"), crashes)
    ledger = Ec2Ledger()
    result = ChaosResult(seed=config.seed, jobs=config.jobs)
    scenario = NodeScenario(
        boot_seconds=0.2,
        heartbeat_seconds=60.0,
        metrics_seconds=30.0,  # no GPU alarms in this run: the datapoints only cost CPU
        notice_seconds=1.0,
        behaviours={job.name: job.behaviour for job in workload},
    )
    with (
        _shared_service_models(),
        injected(capacity, throttling, crashes, ledger),
        embedded_account(extra_env=CHAOS_ENV) as account,
    ):
        with planned_faults(delivery), acting_as(EMULATOR):
            store = DynamoJobStore(
                account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
            )
            nodes = _LiveNodes(account, scenario)
            nodes.start()
            schedule = TwoDispatchers(account, config.schedule_period_seconds)
            schedule.start()
            say(f"embedded account ready; submitting {len(workload)} jobs (seed {config.seed})")
            for job in workload:
                _submit(account, job)
            say("all submitted")
            jobs = _wait_until_settled(account, store, nodes, delivery, config, say)
            result.completed = jobs is not None
            schedule.stop()
            delivery.close(timeout=30)
            jobs = store.list_jobs()
            nodes.stop()
            result.leaked_instances = nodes.running_instances()
            result.double_launches = {
                _name_of(jobs, job_id): launches
                for job_id, launches in ledger.double_launches().items()
            }
            _judge(workload, jobs, result)
            result.wrong_status = _with_history(account, result.wrong_status)
            result.lost = _with_history(account, result.lost)
        errored = Counter(i.function_name for i in account.recorder.invocations if i.errored)
        result.errored_invocations = dict(sorted(errored.items()))
    result.handler_errors = dict(delivery.errors.most_common())
    result.crashes = dict(sorted(Counter(c.split(" (")[0] for c in crashes.crashes).items()))
    result.faults = {
        "deliveries": delivery.deliveries,
        "delayed_deliveries": delivery.delayed,
        "dropped_deliveries": delivery.dropped,
        "spot_capacity_errors": capacity.injected,
        "spot_interruptions": len(nodes.interrupted_jobs),
        "handler_crashes": len(crashes.crashes),
        "dynamodb_throttles": throttling.injected,
        "rival_dispatch_passes": schedule.rival_passes,
    }
    result.wall_seconds = time.monotonic() - started
    say(
        f"done: {result.terminal}/{result.jobs} terminal, lost {len(result.lost)}, double "
        f"launches {len(result.double_launches)}, leaked {len(result.leaked_instances)}, wrong "
        f"status {len(result.wrong_status)}"
    )
    return result


def _wait_until_settled(
    account: Account,
    store: DynamoJobStore,
    nodes: NodeSimulator,
    delivery: ChaoticDelivery,
    config: ChaosConfig,
    say: Callable[[str], None],
) -> list[Job] | None:
    """Poll until every submission has a terminal job, every workflow has ended, no late
    delivery is pending and no instance runs; None when the run timed out first. Leaked
    instances (nothing left to release them) are given a few seconds, then reported."""
    deadline = time.monotonic() + config.timeout_seconds
    quiet_since: float | None = None
    last_said = 0.0
    while time.monotonic() < deadline:
        jobs = store.list_jobs()
        terminal = sum(1 for job in jobs if job.status.terminal)
        running = nodes.running_instances()
        if time.monotonic() - last_said >= 5:
            last_said = time.monotonic()
            say(f"{len(jobs)} jobs, {terminal} terminal, {len(running)} instances running")
        settled = (
            len(jobs) >= config.jobs
            and terminal == len(jobs)
            and delivery.pending == 0
            and not _running_executions(account)
        )
        if settled:
            quiet_since = quiet_since or time.monotonic()
            if not running or time.monotonic() - quiet_since > 10:
                return jobs
        else:
            quiet_since = None
        time.sleep(1.0)
    return None


def _running_executions(account: Account) -> bool:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    response = sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING", maxResults=1)
    return bool(response["executions"])


def _name_of(jobs: list[Job], job_id: str) -> str:
    return next((job.spec.name for job in jobs if job.job_id == job_id), job_id)


def _judge(workload: list[ChaosJob], jobs: list[Job], result: ChaosResult) -> None:
    """Lost, wrong and duplicated jobs, against the submissions and their behaviours."""
    by_name: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_name[job.spec.name].append(job)
    result.terminal = sum(1 for job in jobs if job.status.terminal)
    result.duplicate_jobs = sorted(name for name, found in by_name.items() if len(found) > 1)
    for submitted in workload:
        found = by_name.get(submitted.name, [])
        if not found:
            result.lost.append({"job": submitted.name, "job_id": None, "status": None})
            continue
        stuck = [job for job in found if not job.status.terminal]
        if stuck:
            result.lost += [
                {"job": submitted.name, "job_id": job.job_id, "status": job.status.value}
                for job in stuck
            ]
            continue
        expected_status, expected_exit = submitted.expected()
        for job in found:
            if (job.status.value, job.exit_code) != (expected_status, expected_exit):
                result.wrong_status.append(
                    {
                        "job": submitted.name,
                        "job_id": job.job_id,
                        "expected": f"{expected_status} (exit {expected_exit})",
                        "got": f"{job.status.value} (exit {job.exit_code})",
                        "reason": job.failure_reason,
                    }
                )


def _with_history(account: Account, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job with the failed steps of its workflow and the step it is in or ended at: what
    went wrong where."""
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    prefix = arn.replace(":stateMachine:", ":execution:")
    described = []
    for entry in entries:
        events = []
        if entry["job_id"] is not None:
            with contextlib.suppress(sfn.exceptions.ExecutionDoesNotExist):
                events = sfn.get_execution_history(
                    executionArn=f"{prefix}:{entry['job_id']}", maxResults=1000
                )["events"]
        failures = [
            f"{details.get('error')}: {str(details.get('cause', ''))[:300]}"
            for event in events
            if (
                details := event.get("taskFailedEventDetails")
                or event.get("lambdaFunctionFailedEventDetails")
            )
        ]
        entered = [
            e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
        ]
        described.append({**entry, "failed_steps": failures, "steps": entered})
    return described
