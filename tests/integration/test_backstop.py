"""A workflow killed under a running job, on the embedded account: the execution's status change
event reaches the backstop, which releases the job's instances and ends it FAILED with the
reason and its cost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import Job, JobStatus
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.clock import paced_clock
from gpufleet.emulator.nodes import Behaviour, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.topology import (
    DETAIL_EXECUTION_STATUS_CHANGE,
    INTAKE_PREFIX,
    JOB_LIFECYCLE,
    JOBS_TABLE,
    QUEUE_TABLE,
    TAG_JOB_ID,
    execution_arn,
)
from tests.helpers import SPEC_YAML, subscribe, wait_for


@pytest.fixture
def account() -> Iterator[Account]:
    # Emulated time: the job's minute-long run outlasts the test however loaded the machine.
    with paced_clock() as clock, embedded_account(clock=clock) as created, acting_as(EMULATOR):
        nodes = NodeSimulator(
            created, NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=60))
        )
        nodes.start()
        yield created
        nodes.stop()


def _store(account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


def _running_job(account: Account, name: str) -> Job:
    account.client("s3").put_object(
        Bucket=account.bucket,
        Key=f"{INTAKE_PREFIX}vision/{name}.yaml",
        Body=SPEC_YAML.replace(b"name: resnet", f"name: {name}".encode()),
    )
    store = _store(account)
    return wait_for(  # type: ignore[no-any-return]
        lambda: next(
            (
                job
                for job in store.list_jobs(JobStatus.RUNNING)
                if job.spec.name == name and job.placement
            ),
            None,
        )
    )


def _live_instances(account: Account, job_id: str) -> list[str]:
    reservations = account.client("ec2").describe_instances(
        Filters=[
            {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    return [i["InstanceId"] for r in reservations for i in r["Instances"]]


def _running_shares(account: Account) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = account.client("dynamodb").scan(
        TableName=account.table_names[QUEUE_TABLE.construct_id]
    )["Items"]
    return [item for item in items if item["sk"]["S"].startswith("running#")]


def test_a_stopped_workflow_releases_the_running_jobs_instances_and_fails_it(
    account: Account,
) -> None:
    received = subscribe(
        account,
        "execution-events",
        {"source": ["aws.states"], "detail-type": [DETAIL_EXECUTION_STATUS_CHANGE]},
    )
    job = _running_job(account, "stopped")
    assert _live_instances(account, job.job_id) and _running_shares(account)
    sfn = account.client("stepfunctions")
    arn = execution_arn(account.state_machine_arns[JOB_LIFECYCLE.construct_id], job.job_id)
    sfn.stop_execution(executionArn=arn)  # an operator's console, or an execution limit

    store = _store(account)
    ended = wait_for(lambda: (j := store.get(job.job_id)).status.terminal and j)
    assert ended.status is JobStatus.FAILED
    assert ended.failure_reason == "WorkflowAborted: the job's workflow was stopped"
    assert ended.cost_usd is not None and ended.cost_usd > 0
    assert _live_instances(account, job.job_id) == []
    assert _running_shares(account) == []  # its GPUs count against no quota any more

    # What told the backstop: the event in the shape Step Functions sends.
    [event] = wait_for(received)
    assert (event["source"], event["detail-type"]) == ("aws.states", DETAIL_EXECUTION_STATUS_CHANGE)
    assert event["resources"] == [arn]
    detail = event["detail"]
    described = sfn.describe_execution(executionArn=arn)
    assert described["status"] == "ABORTED"
    assert set(detail) == {
        "executionArn",
        "stateMachineArn",
        "name",
        "status",
        "startDate",
        "stopDate",
        "input",
        "inputDetails",
        "output",
        "outputDetails",
    }
    assert (detail["name"], detail["status"], detail["executionArn"]) == (
        job.job_id,
        "ABORTED",
        arn,
    )
    assert detail["stateMachineArn"] == described["stateMachineArn"]
    # Epoch milliseconds, as Step Functions sends them (not DescribeExecution's timestamps).
    assert detail["startDate"] == int(described["startDate"].timestamp() * 1000)
    assert detail["stopDate"] == int(described["stopDate"].timestamp() * 1000)
    assert json.loads(detail["input"])["job_id"] == job.job_id
    assert detail["inputDetails"] == {"included": True}
    assert (detail["output"], detail["outputDetails"]) == (None, None)
