"""Shared test builders."""

from __future__ import annotations

import fcntl
import json
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

from gpufleet.adapters.local.memory import FakeFleet, RecordingWorkflow, in_memory_ports
from gpufleet.domain.boot import STOCK_TARGETS
from gpufleet.domain.job import Job
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.submitters import Submitter, event_submitter, team_source
from gpufleet.ports import JobStore, Ports
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import queued_job
from gpufleet.settings import Settings
from gpufleet.topology import JOB_LIFECYCLE

if TYPE_CHECKING:
    from gpufleet.emulator.account import Account

T = TypeVar("T")

SPEC_YAML = b"""
name: resnet
team: vision
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [python, train.py]
resources: {gpus: 1, gpu_memory_gib: 16}
timeout: 1h
"""


# The account of the embedded account's principals (moto's), and of events put on its bus.
ACCOUNT = "123456789012"


def sent_as(team: str, account: str = ACCOUNT) -> Submitter:
    """The submitter of an event from team `team`'s source, put from `account`."""
    return event_submitter(team_source(team), account)


def sent_by_its_team(document: object) -> Submitter:
    """The submitter of an event from the source of the team `document` names (a test of
    another rule than who submits); a document naming none gets the source of team `none`."""
    team = document.get("team") if isinstance(document, dict) else None
    return sent_as(team if isinstance(team, str) else "none")


def local_ports(fleet: FakeFleet | None = None) -> Ports:
    return in_memory_ports(fleet=fleet or FakeFleet())


def make_settings(**changes: object) -> Settings:
    """Settings for services built on in-memory ports (names are not used)."""
    values: dict[str, object] = {
        "region": "us-east-1",
        "jobs_table": "jobs",
        "idempotency_table": "idempotency",
        "capacity_table": "capacity",
        "queue_table": "queue",
        "event_bus_name": "gpufleet",
        "intake_bucket": "bucket",
        # A deployment with the stack's default images: one plain template per boot target.
        "launch_templates": {t.name: f"lt-{t.name}" for t in STOCK_TARGETS},
        # Each team keeps its checkpoints under s3://ckpt/<team>/ (as the job role allows).
        "checkpoint_uri": "s3://ckpt",
        **changes,
    }
    return Settings.model_validate(values)


def intake_for(ports: Ports, settings: Settings | None = None) -> IntakeService:
    """Intake as the factory builds it: it plans each job with a lifecycle over the same ports."""
    settings = settings or make_settings()
    return build_intake(ports, settings, build_lifecycle(ports, settings))


def plan_of(ports: Ports, job_id: str) -> LaunchPlan:
    """The plan intake made for the job: the one its workflow was started with."""
    state = cast(RecordingWorkflow, ports.workflow).inputs[job_id]
    return LaunchPlan.model_validate(state["plan"])


def enqueue(
    lifecycle: LifecycleService, ports: Ports, job_id: str, token: str, plan: LaunchPlan
) -> None:
    """The Enqueue task's plain path (no admission on arrival): the job waits for a pass."""
    lifecycle.enqueue(lifecycle.queue_entry(queued_job(ports.jobs.get(job_id)), token, plan))


def wait_for(condition: Callable[[], Any], seconds: float = 30.0) -> Any:
    """The first truthy value of `condition`, polled until `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def stop_running_executions(account: Any) -> None:
    """Stop the lifecycle executions a module's jobs left waiting, before its account closes."""
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    for execution in sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING")["executions"]:
        sfn.stop_execution(executionArn=execution["executionArn"])


def jobs_from(store: JobStore, source: str) -> list[Job]:
    """The jobs a submission (its `source`) made."""
    return [job for job in store.list_jobs() if job.source == source]


def subscribe(account: Any, name: str, pattern: Mapping[str, Any]) -> Callable[[], list[Any]]:
    """A rule of our own on the embedded account's default bus, to an SQS queue: the events it
    matches, as any target would receive them (each call returns those delivered since)."""
    sqs = account.client("sqs")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events = account.client("events")
    events.put_rule(Name=name, EventPattern=json.dumps(pattern))
    events.put_targets(Rule=name, Targets=[{"Id": "q", "Arn": arn}])

    def received() -> list[Any]:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    return received


@contextmanager
def every_requeue_continues_as_new() -> Iterator[None]:
    """Within it, Requeue continues every job in a new execution (a budget of no requeue in
    place, `domain/history.py:requeue_budget`), as a long-lived job does past its budget."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpufleet.services.queue_steps.requeue_budget", lambda _attempts: 0)
        yield


def everything_stored(account: Any, job_id: str) -> str:
    """Every table item, every object of the bucket, the job's workflow history and every log
    event of the account, as one text."""
    texts: list[str] = []
    dynamodb = account.client("dynamodb")
    for table in account.table_names.values():
        for page in dynamodb.get_paginator("scan").paginate(TableName=table):
            texts.append(json.dumps(page["Items"], default=str))
    s3 = account.client("s3")
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=account.bucket):
        for version in page.get("Versions", []):
            body = s3.get_object(
                Bucket=account.bucket, Key=version["Key"], VersionId=version["VersionId"]
            )["Body"].read()
            texts.append(body.decode("utf-8", "replace"))
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    for execution in sfn.list_executions(stateMachineArn=arn)["executions"]:
        history = sfn.get_execution_history(executionArn=execution["executionArn"])
        texts.append(json.dumps(history["events"], default=str))
    logs = account.client("logs")
    for group in logs.describe_log_groups()["logGroups"]:
        events = logs.filter_log_events(logGroupName=group["logGroupName"]).get("events", [])
        texts.append(json.dumps(events))
    assert any(job_id in text for text in texts)  # the search does look where the job is
    return "\n".join(texts)


def with_passes(account: Account, look: Callable[[], T | None], what: str) -> T:
    """What `look` first finds on the embedded account, with admission passes run meanwhile
    (what the one-minute schedule does in AWS)."""
    deadline = time.monotonic() + 90  # generous: CI machines can be slow
    while time.monotonic() < deadline:
        found = look()
        if found is not None:
            return found
        account.client("lambda").invoke(FunctionName=account.function_arns["Dispatch"])
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened")


def shared(folder: Path, name: str, make: Callable[[], T]) -> T:
    """What `make` makes, once per test session: the first process to ask for `name` makes it
    and leaves it pickled in `folder` (the session's, `session_folder`), and the others, xdist's
    other workers, wait on its lock meanwhile, then read it. What fails to be made leaves
    nothing: the next to ask makes it again, and fails on its own."""
    kept = folder / f"{name}.pickle"
    with (folder / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if kept.exists():
            made: T = pickle.loads(kept.read_bytes())
            return made
        made = make()
        kept.write_bytes(pickle.dumps(made))
        return made
