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
- on every tick of the schedule a second dispatch pass races the scheduled one;
- events are lost, every copy (as when each delivery fails into the dead-letter queue): a share
  of the jobs lose their node's first finish report, a share of the interrupted ones their spot
  warning and their instance's state change, and a share are reclaimed without a warning, their
  node gone with the instance, and lose the state change that was all that told of it.

The verdict comes from what an operator could see, never from the control plane's own answer:
the specs submitted, the jobs table, EC2 (every launch and termination, as CloudTrail would
show them, and what runs at the end), and the behaviour each job was given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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

import botocore.handlers
import yaml

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import Job
from gpufleet.domain.submitters import team_source, upload_key
from gpufleet.emulator.account import ACCOUNT_ID, BUCKET_NAME, Account, embedded_account
from gpufleet.emulator.faults import (
    CapacityFaults,
    CrashAfterWrites,
    DynamoThrottling,
    HookSpec,
    LostEvents,
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
    DETAIL_NODE_FINISHED,
    DETAIL_SPOT_WARNING,
    DETAIL_STATE_CHANGE,
    DISPATCH,
    INTAKE_FROM_EVENT,
    INTAKE_FROM_S3,
    JOB_LIFECYCLE,
    JOBS_TABLE,
    SCHEDULES,
    TAG_JOB_ID,
    TAG_MANAGED,
    execution_arn,
)

# Short waits so that hundreds of jobs finish in minutes; nothing else differs from the demo.
CHAOS_ENV = {
    "GPUFLEET_RETRY_WAIT_SECONDS": "1",
    "GPUFLEET_CAPACITY_MEMORY_SECONDS": "5",
    # The reconciler's waits at the run's scale (a "minute" is one schedule period, 2 s): 5
    # minutes before it judges an instance, 15 before it ends a job its workflow left.
    "GPUFLEET_RECONCILE_GRACE_SECONDS": "10",
    "GPUFLEET_ABANDONED_AFTER_SECONDS": "30",
}
# The events a run loses (every copy), and how each loss is made up for (docs/chaos.md).
LOST_KINDS = frozenset({DETAIL_NODE_FINISHED, DETAIL_SPOT_WARNING, DETAIL_STATE_CHANGE})
TEAMS = ("vision", "nlp", "audio")
# The emulator runs every function in one process, where Lambda gives each its own execution
# environments. The two intake handlers share one Powertools idempotency layer
# (handlers/common.py), and Powertools sets the calling function's key prefix on it at every
# call: two of them running at once compute each other's keys, and a crashed delivery's
# in-progress record is then never deleted (its retries all fail as "already in progress").
# Separate environments cannot interfere, so their runs are serialized here.
_SHARING_IDEMPOTENCY = {f"gpufleet-{f.construct_id}" for f in (INTAKE_FROM_S3, INTAKE_FROM_EVENT)}
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
    crash_sweep_every: int = 3  # and each function's crash points are swept (faults.py)
    throttle_share: float = 0.05  # of the control plane's DynamoDB requests
    lost_report_share: float = 0.1  # of jobs: their node's first finish report is lost
    lost_warning_share: float = 0.5  # of interrupted jobs: their warning and state change
    unwarned_reclaim_share: float = 0.05  # of jobs on spot: reclaimed unwarned, unheard
    finish_resend_seconds: float = 4.0  # the agent's copies of its finish report (2 minutes)
    schedule_period_seconds: float = 2.0  # one "minute" of the schedule
    # A node boots in about a minute on EC2, i.e. one period of the schedule.
    boot_seconds: float = 2.0
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
    # Kinds of event whose first one about the job is lost, every copy of it.
    lost_events: frozenset[str] = frozenset()

    def expected(self) -> tuple[str, int]:
        """The final status and exit code the job's behaviour implies. Every run of it exits
        the same way, so retries cannot change the outcome, and nothing the chaos does
        (duplicates, capacity errors, interruptions, crashes, throttling) may."""
        code = self.behaviour.exit_code
        return ("SUCCEEDED", 0) if code == 0 else ("FAILED", code)


def plan_workload(config: ChaosConfig) -> list[ChaosJob]:
    """The jobs of a run, drawn from the seed alone. The shares of interrupted, spot-short and
    lost-event jobs are exact (at least one job each when the share is not 0)."""
    rng = random.Random(f"workload-{config.seed}")
    interrupted = _some(rng, config.jobs, config.interruption_share)
    short_of_spot = _some(rng, config.jobs, config.spot_capacity_error_share)
    jobs = [
        _job(rng, index, index in interrupted, index in short_of_spot)
        for index in range(config.jobs)
    ]
    return _with_lost_events(jobs, config)


def _with_lost_events(jobs: list[ChaosJob], config: ChaosConfig) -> list[ChaosJob]:
    """The lost events of the run, drawn apart (the rest of the workload is as without them):
    finish reports, the warnings and state changes of interrupted jobs, and the state changes
    of jobs spot reclaims unwarned (chosen among jobs that launch on spot and are not
    interrupted otherwise)."""
    rng = random.Random(f"lost-{config.seed}")
    interrupted = [i for i, job in enumerate(jobs) if job.behaviour.interrupt_after_seconds]
    on_spot = [
        i
        for i, job in enumerate(jobs)
        if job.document["spot"] != "never" and not job.spot_capacity_errors and i not in interrupted
    ]
    lost_report = _some(rng, len(jobs), config.lost_report_share)
    lost_warning = {interrupted[i] for i in _some(rng, len(interrupted), config.lost_warning_share)}
    unwarned = {on_spot[i] for i in _some(rng, len(on_spot), config.unwarned_reclaim_share)}
    planned = []
    for index, job in enumerate(jobs):
        lost: set[str] = set()
        behaviour = job.behaviour
        if index in lost_report:
            lost.add(DETAIL_NODE_FINISHED)
        if index in lost_warning:
            lost |= {DETAIL_SPOT_WARNING, DETAIL_STATE_CHANGE}
        if index in unwarned:
            lost.add(DETAIL_STATE_CHANGE)
            behaviour = dataclasses.replace(
                behaviour,
                duration_seconds=rng.uniform(1.2, 2.0),
                interrupt_after_seconds=rng.uniform(0.4, 0.8),
                warned=False,
            )
        planned.append(dataclasses.replace(job, behaviour=behaviour, lost_events=frozenset(lost)))
    return planned


def _job(rng: random.Random, index: int, interrupted: bool, short_of_spot: bool) -> ChaosJob:
    """One job of the workload, drawn in turn from the workload's generator."""
    name = f"chaos-{index:04d}"
    exit_code = rng.choices([0, RETRYABLE_EXIT, NON_RETRYABLE_EXIT], weights=[75, 15, 10])[0]
    document: dict[str, Any] = {
        "name": name,
        "team": rng.choice(TEAMS),
        "priority": rng.choice(["low", "normal", "normal", "high"]),
        "image": "public.ecr.aws/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "command": ["python", "train.py", "--seed", str(index)],
        "resources": {
            "gpus": rng.choice([1, 1, 1, 2, 4]),
            "nodes": 2 if rng.random() < 0.05 else 1,
        },
        "spot": rng.choice(["auto", "auto", "auto", "never"]),
        "checkpoint": f"s3://chaos-checkpoints/{name}/",
        "max_retries": rng.randint(0, 2),
        "no_retry_exit_codes": [NON_RETRYABLE_EXIT],
        "timeout": "1h",
    }
    # Long enough for an interruption to land mid-run.
    duration = rng.uniform(1.2, 2.0) if interrupted else rng.uniform(0.5, 1.5)
    return ChaosJob(
        name=name,
        via="event" if rng.random() < 0.3 else "s3",
        document=document,
        behaviour=Behaviour(
            duration_seconds=duration,
            exit_code=exit_code,
            interrupt_after_seconds=rng.uniform(0.4, 0.8) if interrupted else None,
        ),
        spot_capacity_errors=short_of_spot,
    )


def _some(rng: random.Random, count: int, share: float) -> set[int]:
    """`share` of the indexes below `count`, at least one unless the share is 0."""
    if share <= 0 or count == 0:
        return set()
    return set(rng.sample(range(count), max(1, round(count * share))))


class ChaoticDelivery:
    """The account's asynchronous deliveries under the chaos plan (a `patches.FaultPlan`):
    every event `copies_per_event` times, some copies late, failed runs retried twice as
    Lambda retries asynchronous invocations (one "minute", then two, later), and every handler
    run exposed to crashes. `later(delay, run)` runs a late delivery (on a timer thread when
    not given; a test runs them by hand)."""

    def __init__(
        self,
        config: ChaosConfig,
        rng: random.Random,
        crashes: CrashAfterWrites,
        later: Callable[[float, Callable[[], None]], None] | None = None,
    ) -> None:
        self._config = config
        self._rng = rng
        self._crashes = crashes
        self._schedule = later or _on_a_timer
        self._lock = threading.Condition()
        self._pending = 0  # late deliveries and retries not yet run
        self._closed = False
        self.deliveries = 0
        self.delayed = 0
        self.retried = 0
        self.dropped = 0  # failed three times (in AWS: to the dead-letter queue)
        self.errors: Counter[str] = Counter()  # what handler runs died of, injected or not
        self._one_intake_at_a_time = threading.RLock()

    def deliver(self, attempt: Callable[[], bool]) -> bool:
        delivered = True
        for _copy in range(self._config.copies_per_event):
            with self._lock:
                self.deliveries += 1
                late = self._rng.random() < self._config.delayed_share
                if late:
                    self.delayed += 1
                delay = self._rng.uniform(0.05, self._config.max_delay_seconds) if late else 0.0
            if late:
                self._later(delay, attempt, retries_left=2)
            else:
                delivered = self._run(attempt, retries_left=2) and delivered
        return delivered

    @contextmanager
    def invocation(self, function_name: str) -> Iterator[None]:
        try:
            with (
                self._one_intake_at_a_time
                if function_name in _SHARING_IDEMPOTENCY
                else contextlib.nullcontext(),
                self._crashes.invocation(function_name),
            ):
                yield
        except Exception as exc:
            with self._lock:
                self.errors[f"{function_name}: {type(exc).__name__}: {str(exc)[:160]}"] += 1
            raise

    def _run(self, attempt: Callable[[], bool], retries_left: int) -> bool:
        if attempt():
            return True
        if retries_left == 0:
            with self._lock:
                self.dropped += 1
            return False
        with self._lock:
            self.retried += 1
        # Lambda waits a minute before the first retry and two before the second.
        wait = self._config.schedule_period_seconds * (3 - retries_left)
        self._later(wait, attempt, retries_left - 1)
        return False

    def _later(self, delay: float, attempt: Callable[[], bool], retries_left: int) -> None:
        with self._lock:
            self._pending += 1
        self._schedule(delay, functools.partial(self._run_later, attempt, retries_left))

    def _run_later(self, attempt: Callable[[], bool], retries_left: int) -> None:
        try:
            with self._lock:
                closed = self._closed
            if not closed:
                with acting_as(CONTROL_PLANE):
                    self._run(attempt, retries_left)
        finally:
            with self._lock:
                self._pending -= 1
                self._lock.notify_all()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self, timeout: float) -> None:
        """Give late deliveries and retries up to `timeout` to run; drop those still pending
        then (the account is about to go)."""
        with self._lock:
            self._lock.wait_for(lambda: self._pending == 0, timeout)
            self._closed = True


def _on_a_timer(delay: float, run: Callable[[], None]) -> None:
    timer = threading.Timer(delay, run)
    timer.daemon = True
    timer.start()


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
        # First among the after-call hooks: the crash injector raises in one, and a launch that
        # happened is on record whatever the handler does next.
        first = botocore.handlers.REGISTER_FIRST
        return [
            ("before-parameter-build.ec2.CreateFleet", self._note_job),
            ("before-parameter-build.ec2.RunInstances", self._note_job),
            ("before-parameter-build.ec2.CreateTags", self._note_job),
            ("after-call.ec2.CreateFleet", self._fleet, first),
            ("after-call.ec2.RunInstances", self._reservation, first),
            ("after-call.ec2.CreateTags", self._claim, first),
            ("after-call.ec2.TerminateInstances", self._termination, first),
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

    def _claim(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        """A warm-pool instance tagged with the job that claimed it: a launch for that job."""
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


def _live_instances(ec2: Any) -> list[dict[str, Any]]:
    """Instances gpufleet launched that are pending or running."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


class _LiveNodes(NodeSimulator):
    """The node simulator, looking for new instances among the live ones only, and at most every
    `WATCH_SECONDS` (it polls every 0.1 s): a long run leaves hundreds of terminated instances,
    and listing them that often would take a good part of the run's CPU. Boots are noticed a
    little later; the boot itself takes `boot_seconds`."""

    WATCH_SECONDS = 1.0

    def __init__(self, account: Account, scenario: NodeScenario) -> None:
        super().__init__(account, scenario)
        self._listed: tuple[float, list[dict[str, Any]]] = (float("-inf"), [])

    def _managed_instances(self) -> list[dict[str, Any]]:
        listed_at, instances = self._listed
        if time.monotonic() - listed_at >= self.WATCH_SECONDS:
            instances = _live_instances(self._ec2)
            self._listed = (time.monotonic(), instances)
        return instances


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
                    "Source": team_source(job.document["team"]),
                    "DetailType": DETAIL_JOB_SUBMITTED,
                    "Detail": json.dumps(job.document),
                }
            ]
        )
        return
    as_json = int(job.name.rsplit("-", 1)[-1]) % 2 == 0
    account.client("s3").put_object(
        Bucket=account.bucket,
        Key=upload_key(job.document["team"], f"{job.name}.{'json' if as_json else 'yaml'}"),
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
        config.crash_share,
        config.crash_max_write,
        random.Random(f"crash-{config.seed}"),
        sweep_every=config.crash_sweep_every,
    )
    lost_by_name = {job.name: job.lost_events for job in workload}
    lost = LostEvents(
        BUCKET_NAME, LOST_KINDS, lambda kind, name: kind in lost_by_name.get(name, ())
    )
    delivery = ChaoticDelivery(config, random.Random(f"delivery-{config.seed}"), crashes)
    ledger = Ec2Ledger(clock=lambda: time.monotonic() - started)
    result = ChaosResult(seed=config.seed, jobs=config.jobs)
    scenario = NodeScenario(
        boot_seconds=config.boot_seconds,
        heartbeat_seconds=60.0,
        metrics_seconds=30.0,  # no GPU alarms in this run: the datapoints only cost CPU
        notice_seconds=1.0,
        behaviours={job.name: job.behaviour for job in workload},
        finish_resend_seconds=config.finish_resend_seconds,
    )
    with (
        injected(capacity, throttling, crashes, ledger, lost),
        embedded_account(extra_env=CHAOS_ENV) as account,
    ):
        # The emulator's own clients (harness and nodes): one per service for the whole run
        # (boto3 clients are thread-safe); a session per call would take much of a long run's CPU.
        account.client = functools.cache(account.client)  # type: ignore[method-assign]
        with planned_faults(delivery), acting_as(EMULATOR):
            ec2 = account.client("ec2")
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
            result.completed = _wait_until_settled(account, store, nodes, delivery, config, say)
            schedule.stop()
            delivery.close(timeout=30)
            jobs = store.list_jobs()
            nodes.stop()
            result.leaked_instances = [i["InstanceId"] for i in _live_instances(ec2)]
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
        "retried_deliveries": delivery.retried,
        "dropped_deliveries": delivery.dropped,
        "spot_capacity_errors": capacity.injected,
        "spot_interruptions": len(nodes.interrupted_jobs),
        "handler_crashes": len(crashes.crashes),
        "dynamodb_throttles": throttling.injected,
        "rival_dispatch_passes": schedule.rival_passes,
        "lost_finish_reports": lost.lost[DETAIL_NODE_FINISHED],
        "lost_spot_warnings": lost.lost[DETAIL_SPOT_WARNING],
        "lost_state_changes": lost.lost[DETAIL_STATE_CHANGE],
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
) -> bool:
    """Poll until every submission has a terminal job, every workflow has ended, no late
    delivery is pending and no instance runs; False when the run timed out first. Leaked
    instances (nothing left to release them) are given a few seconds, then reported."""
    deadline = time.monotonic() + config.timeout_seconds
    quiet_since: float | None = None
    said_at = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        report = time.monotonic() - said_at >= 10
        if not report and (delivery.pending or _running_executions(account)):
            continue  # the jobs table (a scan) is read only when it can tell something
        jobs = store.list_jobs()
        terminal = sum(1 for job in jobs if job.status.terminal)
        running = nodes.running_instances()
        if report:
            said_at = time.monotonic()
            say(f"{len(jobs)} jobs, {terminal} terminal, {len(running)} instances running")
        settled = (
            len(jobs) >= config.jobs
            and terminal == len(jobs)
            and delivery.pending == 0
            and not _running_executions(account)
        )
        if not settled:
            quiet_since = None
            continue
        quiet_since = quiet_since or time.monotonic()
        if not running or time.monotonic() - quiet_since > 10:
            return True
    return False


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
    """Each job with its workflow: the execution's status (None: there is none), the steps it
    entered and those that failed: what went wrong where."""
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    described = []
    for entry in entries:
        status, events = None, []
        if entry["job_id"] is not None:
            execution = execution_arn(arn, entry["job_id"])
            with contextlib.suppress(sfn.exceptions.ExecutionDoesNotExist):
                status = sfn.describe_execution(executionArn=execution)["status"]
                events = sfn.get_execution_history(executionArn=execution, maxResults=1000)[
                    "events"
                ]
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
        described.append({**entry, "execution": status, "steps": entered, "failed_steps": failures})
    return described
