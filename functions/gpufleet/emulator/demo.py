"""`gpufleet demo`: sample jobs through the real workflow in the embedded AWS account."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import Job
from gpufleet.domain.submitters import spec_upload_key
from gpufleet.emulator.account import BUCKET_NAME, Account, embedded_account
from gpufleet.emulator.clock import paced_clock
from gpufleet.emulator.faults import CapacityFaults, injected
from gpufleet.emulator.metrics import PublishedMetric, published_metrics
from gpufleet.emulator.nodes import AGENT_LOG_GROUP, Behaviour, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import EMULATOR, ApiCall, Invocation, acting_as
from gpufleet.emulator.scheduler import ScheduleRunner
from gpufleet.emulator.throttling import BucketQuota
from gpufleet.services.arrays import array_progress
from gpufleet.services.reports import job_detail
from gpufleet.topology import (
    CONTROL_PLANE_SOURCE,
    DETAIL_JOB_REJECTED,
    JOB_LIFECYCLE,
    JOBS_TABLE,
    agent_log_stream_prefix,
    execution_arn,
)

EVENTS_DIR = Path(__file__).resolve().parents[3] / "events"


@dataclass(frozen=True)
class Submission:
    """One sample submission: a file uploaded to S3, or an event put on the bus."""

    via: str  # "s3" or "event"
    path: Path
    # Held back until the named job has been RUNNING this long (to stage a preemption).
    after_running: str | None = None
    delay_seconds: float = 0.0
    copy_as: str | None = None  # upload under this name (the same spec as several jobs)


@dataclass
class DemoScenario:
    name: str
    submissions: list[Submission]
    nodes: NodeScenario
    spot_capacity_errors: frozenset[str] = frozenset()
    timeout_seconds: float = 180.0  # emulated seconds (`clock.PacedClock`)
    config: FleetConfig | None = None  # None: the repository's gpufleet.yaml
    # Jobs whose workflow is stopped once they run (StopExecution, as from the console): the
    # backstop ends them.
    stop_workflows: frozenset[str] = frozenset()
    # Created in the account before the first submission: ECR repositories, and Secrets
    # Manager secrets (name -> value, made up for each run so that no file holds one).
    ecr_repositories: tuple[str, ...] = ()
    secrets: dict[str, str] = field(default_factory=dict)
    # Step Functions' StartExecution bucket; None: AWS's for the account's region.
    start_execution: BucketQuota | None = None


@dataclass
class DemoResult:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    rejected: int = 0
    instances_running: int = 0
    api_calls: dict[str, int] = field(default_factory=dict)
    lambda_invocations: int = 0
    state_transitions: int = 0
    capacity_errors_injected: int = 0
    wall_seconds: float = 0.0
    completed: bool = False
    # What the control plane did, one by one (the account's Recorder): not part of the JSON.
    calls: list[ApiCall] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)
    # Every metric the functions and the nodes published to CloudWatch: not part of the JSON.
    metrics: frozenset[PublishedMetric] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "rejected": self.rejected,
            "instances_running": self.instances_running,
            "api_calls": self.api_calls,
            "state_transitions": self.state_transitions,
            "capacity_errors_injected": self.capacity_errors_injected,
            "wall_seconds": round(self.wall_seconds, 2),
            "completed": self.completed,
        }


def nodes_from_config(config: Mapping[str, Any]) -> NodeScenario:
    """The node behaviours of a `demo-scenario.json` document: boot time, and per job name its
    run time and exit code (`gpufleet emulator --scenario` reads the same)."""
    return NodeScenario(
        boot_seconds=float(config.get("boot_seconds", 1.0)),
        behaviours={
            name: Behaviour(float(b["duration_seconds"]), int(b["exit_code"]))
            for name, b in config.get("jobs", {}).items()
        },
    )


def basic_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """The samples in events/: specs under jobs/ go through S3, the event through EventBridge."""
    config = json.loads((events_dir / "demo-scenario.json").read_text())
    submissions = [Submission("s3", path) for path in sorted((events_dir / "jobs").iterdir())]
    submissions.append(Submission("event", events_dir / "submit-job-event.json"))
    return DemoScenario(
        name="basic",
        submissions=submissions,
        nodes=nodes_from_config(config),
        spot_capacity_errors=frozenset(config.get("spot_capacity_errors", [])),
    )


def preemption_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """A low-priority job preempted by a high-priority one, then resumed from its checkpoint."""
    return _scenario_from_folder(events_dir / "scenarios" / "preemption", "preemption")


def spot_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """A spot interruption (checkpoint, requeue, resume) and a fallback to on-demand."""
    return _scenario_from_folder(events_dir / "scenarios" / "spot", "spot")


def stages_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """A three-stage job: preprocess on a CPU-only type, train on GPUs, evaluate on a small
    GPU type, each stage on its own instances and with its own cost."""
    return _scenario_from_folder(events_dir / "scenarios" / "stages", "stages")


def _scenario_from_folder(folder: Path, name: str) -> DemoScenario:
    config = json.loads((folder / "scenario.json").read_text())
    setup = config.get("setup", {})
    return DemoScenario(
        name=name,
        submissions=[
            Submission(
                "s3",
                folder / item["file"],
                after_running=item.get("after_running"),
                delay_seconds=float(item.get("delay_seconds", 0.0)),
            )
            for item in config["submissions"]
        ],
        nodes=NodeScenario(
            boot_seconds=float(config["boot_seconds"]),
            behaviours={
                job: Behaviour(
                    float(b.get("duration_seconds", 3.0)),
                    int(b.get("exit_code", 0)),
                    interrupt_after_seconds=b.get("interrupt_after_seconds"),
                    warned=bool(b.get("warned", True)),
                    runs_command=bool(b.get("runs_command", False)),
                    needs_gpu_memory_gib=float(b.get("needs_gpu_memory_gib", 0.0)),
                    gpu_utilization=float(b.get("gpu_utilization", 90.0)),
                    gpu_memory_growth_mib_per_second=float(
                        b.get("gpu_memory_growth_mib_per_second", 0.0)
                    ),
                    prints_metrics=tuple(
                        (str(name), float(value))
                        for name, value in b.get("prints_metrics", {}).items()
                    ),
                    until_flagged=bool(b.get("until_flagged", False)),
                )
                for job, b in config["jobs"].items()
            },
        ),
        spot_capacity_errors=frozenset(config.get("spot_capacity_errors", [])),
        config=FleetConfig.model_validate(config["config"]) if "config" in config else None,
        ecr_repositories=tuple(setup.get("ecr_repositories", [])),
        secrets={name: secrets.token_urlsafe(24) for name in setup.get("secrets", [])},
    )


def distributed_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """A two-node job whose command really runs on both nodes and meets over TCP (rank
    sum), and a CPU-only job beside it, both through the agent's docker runtime."""
    return _scenario_from_folder(events_dir / "scenarios" / "distributed", "distributed")


def distributed_node_loss_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """The two-node job with one node lost mid-run: retried as a whole."""
    folder = events_dir / "scenarios" / "distributed-node-loss"
    return _scenario_from_folder(folder, "distributed-node-loss")


def sweep_scenario(events_dir: Path = EVENTS_DIR) -> DemoScenario:
    """A sweep of 20 runs and an evaluation depending on all of them, beside another team's
    array, sharing the fleet (docs/arrays.md)."""
    return _scenario_from_folder(events_dir / "scenarios" / "sweep", "sweep")


SCENARIOS = {
    "basic": basic_scenario,
    "preemption": preemption_scenario,
    "spot": spot_scenario,
    "stages": stages_scenario,
    "distributed": distributed_scenario,
    "distributed-node-loss": distributed_node_loss_scenario,
    "sweep": sweep_scenario,
}


class RejectionObserver:
    """An SQS queue subscribed to the control plane's `Job Rejected` events (emulator-only)."""

    def __init__(self, account: Account, name: str = "emulator-observer") -> None:
        self._sqs = account.client("sqs")
        self._url = self._sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = self._sqs.get_queue_attributes(QueueUrl=self._url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        events = account.client("events")
        events.put_rule(
            Name=name,
            EventBusName=account.bus,
            EventPattern=json.dumps(
                {"source": [CONTROL_PLANE_SOURCE], "detail-type": [DETAIL_JOB_REJECTED]}
            ),
        )
        events.put_targets(Rule=name, EventBusName=account.bus, Targets=[{"Id": "q", "Arn": arn}])
        self.rejections: list[dict[str, Any]] = []

    def poll(self) -> None:
        """Take every rejection delivered so far."""
        while messages := self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            for message in messages:
                self.rejections.append(json.loads(message["Body"])["detail"])
                self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])

    def of(self, source: str) -> list[dict[str, Any]]:
        """The rejections delivered so far of submissions from `source`."""
        self.poll()
        return [r for r in self.rejections if r.get("source") == source]


def _submit(account: Account, submission: Submission) -> None:
    if submission.via == "s3":
        body = submission.path.read_bytes()
        account.client("s3").put_object(
            Bucket=account.bucket,
            # Under its team's folder, as `gpufleet submit` puts it.
            Key=spec_upload_key(body, submission.copy_as or submission.path.name),
            Body=body,
        )
        return
    entry = json.loads(submission.path.read_text())
    account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": entry["Source"],
                "DetailType": entry["DetailType"],
                "Detail": json.dumps(entry["Detail"]),
            }
        ]
    )


def _set_up(account: Account, scenario: DemoScenario) -> None:
    """What the scenario's jobs need the account to hold: their ECR repositories, secrets."""
    ecr = account.client("ecr")
    for repository in scenario.ecr_repositories:
        ecr.create_repository(repositoryName=repository)
    secretsmanager = account.client("secretsmanager")
    for name, value in scenario.secrets.items():
        secretsmanager.create_secret(Name=name, SecretString=value)


def run_demo(
    scenario: DemoScenario,
    progress: TextIO | None = None,
    before_teardown: Callable[[Account], None] | None = None,
    on_ready: Callable[[Account], None] | None = None,
) -> DemoResult:
    """Run `scenario` on a fresh embedded account; `on_ready` adds to the account before the
    first submission (a subscription of the test's), `before_teardown` looks at it once the
    demo has ended, before it goes."""
    started = time.monotonic()

    def say(text: str) -> None:
        if progress is not None:
            progress.write(f"{time.monotonic() - started:6.1f}s  {text}\n")
            progress.flush()

    result = DemoResult()
    faults = CapacityFaults(
        BUCKET_NAME,
        lambda name, capacity: capacity == "spot" and name in scenario.spot_capacity_errors,
    )
    # Emulated time: a loaded machine makes the demo slower, never another demo.
    with (
        injected(faults),
        paced_clock() as clock,
        embedded_account(
            config=scenario.config, clock=clock, start_execution=scenario.start_execution
        ) as account,
    ):
        with acting_as(EMULATOR):
            store = DynamoJobStore(
                account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
            )
            _set_up(account, scenario)
            if on_ready is not None:
                on_ready(account)
            observer = RejectionObserver(account)
            nodes = NodeSimulator(account, scenario.nodes)
            nodes.start()
            scheduler = ScheduleRunner(account)
            scheduler.start()
            count = len(scenario.submissions)
            say(f"embedded AWS account ready in {account.region}; submitting {count} jobs")
            held_back = [s for s in scenario.submissions if s.after_running]
            for submission in scenario.submissions:
                if not submission.after_running:
                    _submit(account, submission)
                    say(f"submitted {submission.path.name} via {submission.via}")
            seen: dict[str, str] = {}
            running_since: dict[str, float] = {}
            deadline = clock.now() + scenario.timeout_seconds
            jobs: list[Job] = []
            while clock.now() < deadline:
                observer.poll()
                jobs = store.list_jobs()
                for job in sorted(jobs, key=lambda j: j.created_at):
                    # A multi-stage job's stage changes are news even when its status is not.
                    stage = f" [{job.stage_name}]" if job.stage_name else ""
                    if seen.get(job.job_id) != job.status.value + stage:
                        seen[job.job_id] = job.status.value + stage
                        where = (
                            f" on {job.placement.instance_type} ({job.placement.capacity_type})"
                            if job.placement and job.status.value == "RUNNING"
                            else ""
                        )
                        reason = f": {job.failure_reason}" if job.failure_reason else ""
                        status = job.status.value + stage
                        say(f"{job.job_id} {job.spec.name:<16} {status}{where}{reason}")
                        if job.status.value == "RUNNING":
                            running_since.setdefault(job.spec.name, clock.now())
                            if job.spec.name in scenario.stop_workflows:
                                _stop_workflow(account, job.job_id)
                                say(f"{job.job_id} {job.spec.name:<16} workflow stopped")
                for submission in list(held_back):
                    since = running_since.get(submission.after_running or "")
                    if since is not None and clock.now() - since >= submission.delay_seconds:
                        held_back.remove(submission)
                        _submit(account, submission)
                        say(f"submitted {submission.path.name} via {submission.via}")
                running = nodes.running_instances()
                settled = len(jobs) + len(observer.rejections) >= len(scenario.submissions)
                # An array's record runs nothing: its children are the jobs that end.
                ended = all(j.status.terminal for j in jobs if not j.spec.is_array)
                if settled and ended and not running:
                    result.completed = _executions_finished(account)
                    if result.completed:
                        break
                clock.sleep(0.25)
            for rejection in observer.rejections:
                say(f"rejected {rejection.get('source')}: {rejection.get('message')}")
            scheduler.stop()
            nodes.stop()
            result.jobs = [
                _job_entry(job, job.job_id in nodes.resumed)
                | (_array_entry(store, job) if job.spec.is_array else {})
                | (
                    {"container_log": _container_log(account, job.job_id)}
                    if scenario.nodes.runs_commands(job.spec.name)
                    else {}
                )
                for job in sorted(jobs, key=lambda j: j.spec.name)
            ]
            result.rejected = len(observer.rejections)
            result.instances_running = len(nodes.running_instances())
            result.state_transitions = _state_transitions(account)
            result.metrics = published_metrics(account)
            if before_teardown is not None:
                before_teardown(account)
        result.api_calls = dict(sorted(account.recorder.api_calls.items()))
        result.calls = list(account.recorder.calls)
        result.invocations = list(account.recorder.invocations)
        result.capacity_errors_injected = faults.injected
    result.wall_seconds = time.monotonic() - started
    return result


def _job_entry(job: Job, resumed: bool) -> dict[str, Any]:
    """What `gpufleet status` says of the job, and what only the emulator can tell: whether
    its node resumed from a checkpoint."""
    return {
        **job_detail(job),
        "wait_seconds": round(job.waited_seconds, 2),
        "resumed_from_checkpoint": resumed,
    }


def _array_entry(store: DynamoJobStore, array: Job) -> dict[str, Any]:
    """An array's status is its children's (`gpufleet list --array`), with their counts."""
    progress = array_progress(store, array)
    return {"status": progress["status"], "children": progress["counts"]}


def _container_log(account: Account, job_id: str) -> list[str]:
    """What the job's containers printed, every run and node, as its log streams hold it."""
    logs = account.client("logs")
    streams = logs.describe_log_streams(
        logGroupName=AGENT_LOG_GROUP, logStreamNamePrefix=agent_log_stream_prefix(job_id)
    )["logStreams"]
    events = [
        event
        for stream in streams
        for event in logs.get_log_events(
            logGroupName=AGENT_LOG_GROUP, logStreamName=stream["logStreamName"]
        )["events"]
    ]
    return [event["message"] for event in sorted(events, key=lambda e: e["timestamp"])]


def _stop_workflow(account: Account, job_id: str) -> None:
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    account.client("stepfunctions").stop_execution(executionArn=execution_arn(arn, job_id))


def _executions(account: Account) -> list[dict[str, Any]]:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    executions: list[dict[str, Any]] = sfn.list_executions(stateMachineArn=arn)["executions"]
    return executions


def _executions_finished(account: Account) -> bool:
    return all(e["status"] != "RUNNING" for e in _executions(account))


def _state_transitions(account: Account) -> int:
    """States entered across every execution: what Step Functions bills as transitions."""
    sfn = account.client("stepfunctions")
    total = 0
    for execution in _executions(account):
        history = sfn.get_execution_history(executionArn=execution["executionArn"], maxResults=1000)
        total += sum(1 for event in history["events"] if event["type"].endswith("StateEntered"))
    return total
