"""A throttle never ends a job, nor leaks its share of the quotas: each transaction of the
enqueue, admission, launch and release paths (on moto's DynamoDB) has its first
tries cancelled with a `ThrottlingError` reason, as DynamoDB cancels them when the queue's hot
`usage#global` item runs out of throughput, and the job still ends as its run did, with its
share back. Throttled past every try, a step fails with a transient error and changes
nothing, and its retry goes through."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.adapters.aws.transactions import Backoff, QueueContended
from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryObjects,
    ManualClock,
    RecordingWorkflow,
    in_memory_ports,
)
from gpufleet.domain.job import JobChanges, JobStatus
from gpufleet.emulator.account import table_definition
from gpufleet.errors import TransientError
from gpufleet.ports import Ports
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import build_dispatcher, build_lifecycle
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import queued_job
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from gpufleet.topology import JOBS_TABLE
from tests.helpers import SPEC_YAML, enqueue, intake_for, make_settings, plan_of
from tests.integration.dynamo_faults import cancelled_first_tries
from tests.integration.test_queue_contract import dynamo_queue

SETTINGS = make_settings()
THROTTLED = "ThrottlingError"


@dataclass
class Fleet:
    """The control plane over the embedded account's tables (the rest in memory)."""

    client: Any
    ports: Ports
    lifecycle: LifecycleService
    dispatcher: DispatcherService
    waits: list[float]
    job_id: str

    @property
    def workflow(self) -> RecordingWorkflow:
        return cast(RecordingWorkflow, self.ports.workflow)

    def share_held(self) -> tuple[list[str], int]:
        state = self.ports.queue.state()
        return [r.job.job_id for r in state.running], state.gpus_held


@pytest.fixture(scope="module")
def dynamodb(aws_env: None) -> Iterator[tuple[Any, str]]:
    """Only DynamoDB, as moto has it, with the jobs table as the stack makes it: the paths
    under test write nothing else (a whole embedded account costs a module seconds)."""
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        jobs_table = "gpufleet-jobs"
        client.create_table(**table_definition(JOBS_TABLE, jobs_table))
        yield client, jobs_table


@pytest.fixture
def fleet(dynamodb: tuple[Any, str]) -> Fleet:
    client, jobs_table = dynamodb
    waits: list[float] = []
    backoff = Backoff(sleep=waits.append)  # the waits it asks for, not taken
    ports = in_memory_ports(
        jobs=DynamoJobStore(client, jobs_table, backoff),
        queue=dynamo_queue(client, jobs_table, backoff),
        fleet=FakeFleet(),
    )
    key = f"jobs/vision/{uuid.uuid4().hex}.yaml"  # a job of its own: the jobs table is the module's
    cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
    job_id = intake_for(ports, SETTINGS).submit_object(key, f"{key}#etag", f"s3://b/{key}").job_id
    assert job_id is not None
    lifecycle = build_lifecycle(ports, SETTINGS)
    return Fleet(
        client, ports, lifecycle, build_dispatcher(ports, SETTINGS, lifecycle), waits, job_id
    )


def admit(fleet: Fleet, on_arrival: bool) -> dict[str, Any]:
    """The Enqueue task, and the admission its workflow hears."""
    job_id, plan = fleet.job_id, plan_of(fleet.ports, fleet.job_id)
    if on_arrival:  # nothing waits: its own Enqueue admits it
        job = fleet.ports.jobs.get(job_id)
        assert fleet.dispatcher.enqueue(queued_job(job), "enqueue", plan)
    else:  # it waits for a pass
        enqueue(fleet.lifecycle, fleet.ports, job_id, "enqueue", plan)
        assert "enqueue" not in fleet.workflow.completed  # waiting, not told it was cancelled
        assert fleet.dispatcher.run_pass().admitted == [job_id]
    admission = fleet.workflow.completed["enqueue"]
    assert admission["admitted"] is True
    return admission


def run(fleet: Fleet, admission: dict[str, Any]) -> dict[str, Any]:
    """Launch, and the node's run to its end: what the run's task completes with."""
    job_id = fleet.job_id
    plan = plan_of(fleet.ports, job_id)
    assert (
        fleet.lifecycle.launch(job_id, plan, 0, 0, "run", Admission.model_validate(admission))
        is None
    )
    job = fleet.ports.jobs.get(job_id)
    assert job.status is JobStatus.LAUNCHING and job.placement is not None
    instance = job.placement.instance_ids[0]
    fleet.lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
    cast(ManualClock, fleet.ports.clock).advance(600)
    fleet.lifecycle.node_report(
        NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
    )
    return fleet.workflow.completed["run"]


@pytest.mark.parametrize(
    ("on_arrival", "changed_after_the_finish", "tries", "transactions"),
    [
        # Admission on arrival, launch, release in one write.
        pytest.param(True, False, 1, 3, id="admitted-on-arrival"),
        # Enqueue, a pass's admission, launch, release (whose one write finds the job changed
        # since its finish: the record's settlement, and the share's own release).
        pytest.param(False, True, 2, 5, id="admitted-by-a-pass"),
    ],
)
def test_a_job_whose_every_transaction_is_throttled_first_ends_as_its_run_did(
    fleet: Fleet, on_arrival: bool, changed_after_the_finish: bool, tries: int, transactions: int
) -> None:
    job_id = fleet.job_id
    with cancelled_first_tries(fleet.client, THROTTLED, tries) as cancelled:
        admission = admit(fleet, on_arrival)
        finished = run(fleet, admission)
        if changed_after_the_finish:  # e.g. an alarm flagged it meanwhile
            fleet.ports.jobs.update(job_id, fleet.ports.clock.now(), JobChanges(flags=["idle"]))
        released = fleet.lifecycle.release(job_id, WorkflowState.model_validate({"run": finished}))
    # Every transaction of the paths was throttled, and tried again until it went through.
    assert len(cancelled) == transactions
    assert set(cancelled.values()) == {tries}
    assert len(fleet.waits) == transactions * tries
    assert released["requeue"] is False and released["outcome"]["status"] == "SUCCEEDED"
    assert fleet.ports.jobs.get(job_id).status is JobStatus.SUCCEEDED
    assert fleet.share_held() == ([], 0)  # its share is back
    assert cast(FakeFleet, fleet.ports.fleet).live == {}


def test_an_enqueue_throttled_past_every_try_fails_transiently_and_cancels_nothing(
    fleet: Fleet,
) -> None:
    with (
        cancelled_first_tries(fleet.client, THROTTLED, Backoff().tries),
        pytest.raises(QueueContended) as raised,
    ):
        enqueue(
            fleet.lifecycle,
            fleet.ports,
            fleet.job_id,
            "enqueue",
            plan_of(fleet.ports, fleet.job_id),
        )
    assert isinstance(raised.value, TransientError)  # the state machine retries the step
    assert fleet.workflow.completed == {}  # its workflow was not told it was cancelled
    assert fleet.ports.jobs.get(fleet.job_id).status is JobStatus.QUEUED
    assert fleet.ports.queue.waiting() == []  # nothing written
    admission = admit(fleet, on_arrival=False)  # the step's retry
    assert admission["admitted"] is True


def test_a_release_throttled_past_every_try_fails_transiently_and_keeps_the_share(
    fleet: Fleet,
) -> None:
    job_id = fleet.job_id
    finished = run(fleet, admit(fleet, on_arrival=True))
    with (
        cancelled_first_tries(fleet.client, THROTTLED, Backoff().tries),
        pytest.raises(QueueContended),
    ):
        fleet.lifecycle.release(job_id, WorkflowState.model_validate({"run": finished}))
    # Nothing settled: the share is still the job's, for the step's retry to give back.
    assert not fleet.ports.jobs.get(job_id).status.terminal
    assert fleet.share_held() == ([job_id], 1)
    released = fleet.lifecycle.release(job_id, WorkflowState.model_validate({"run": finished}))
    assert released["outcome"]["status"] == "SUCCEEDED"
    assert fleet.share_held() == ([], 0)
