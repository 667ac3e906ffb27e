"""Both intake paths on the embedded account: acceptance, duplicates, and rejection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.emulator.account import Account
from gpufleet.topology import INTAKE_FROM_EVENT, INTAKE_FROM_S3, JOB_LIFECYCLE, JOBS_TABLE
from tests.helpers import SPEC_YAML, jobs_from, wait_for


@pytest.fixture(scope="module")
def store(account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


def invoke(account: Account, function: str, event: dict[str, Any]) -> dict[str, Any]:
    response = account.client("lambda").invoke(
        FunctionName=account.function_arns[function], Payload=json.dumps(event).encode()
    )
    assert "FunctionError" not in response, response["Payload"].read()
    result: dict[str, Any] = json.loads(response["Payload"].read())
    return result


def executions_for(account: Account, job_id: str) -> list[dict[str, Any]]:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    return [
        e for e in sfn.list_executions(stateMachineArn=arn)["executions"] if e["name"] == job_id
    ]


def test_an_upload_under_jobs_starts_one_lifecycle(account: Account, store: DynamoJobStore) -> None:
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key="jobs/upload-once.yaml", Body=SPEC_YAML)
    source = f"s3://{account.bucket}/jobs/upload-once.yaml"
    [job] = wait_for(lambda: jobs_from(store, source))
    assert job.spec.name == "resnet"
    [execution] = executions_for(account, job.job_id)
    # Intake planned the job: its lifecycle starts from the plan, at the first launch step.
    described = account.client("stepfunctions").describe_execution(
        executionArn=execution["executionArn"]
    )
    state = json.loads(described["input"])
    assert state["job_id"] == job.job_id
    assert LaunchPlan.model_validate(state["plan"]).steps
    assert (state["launch"]["step"], state["launch"]["attempt"]) == (0, 0)


def test_a_spec_nothing_can_run_is_stored_failed_without_a_lifecycle(
    account: Account, store: DynamoJobStore
) -> None:
    event = {
        "version": "0",
        "id": "77777777-2222-3333-4444-555555555555",
        "detail-type": "Job Submitted",
        "source": "gpufleet",
        "account": "123456789012",
        "time": "2026-11-29T17:31:30Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {
            "name": "too-big",
            "team": "t",
            "image": "img",
            "command": ["x"],
            "resources": {"gpus": 1, "gpu_memory_gib": 1000},
        },
    }
    # Invoked directly: once it answers, any lifecycle it would start has been started.
    result = invoke(account, INTAKE_FROM_EVENT.construct_id, event)
    assert result["accepted"]
    [job] = jobs_from(store, f"event:{event['id']}")
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None and "1000 GiB" in job.failure_reason
    assert executions_for(account, job.job_id) == []


def test_the_same_s3_notification_delivered_twice_creates_one_job(
    account: Account, store: DynamoJobStore
) -> None:
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key="jobs/twice.yaml", Body=SPEC_YAML)
    etag = s3.head_object(Bucket=account.bucket, Key="jobs/twice.yaml")["ETag"].strip('"')
    source = f"s3://{account.bucket}/jobs/twice.yaml"
    wait_for(lambda: jobs_from(store, source))
    notification = {
        "Records": [
            {
                "eventName": "ObjectCreated:Put",
                "s3": {
                    "bucket": {"name": account.bucket},
                    "object": {"key": "jobs/twice.yaml", "eTag": etag},
                },
            }
        ]
    }
    first = invoke(account, INTAKE_FROM_S3.construct_id, notification)
    second = invoke(account, INTAKE_FROM_S3.construct_id, notification)
    assert first == second
    [job] = jobs_from(store, source)
    assert first["results"][0]["job_id"] == job.job_id
    assert len(executions_for(account, job.job_id)) == 1


def test_the_same_event_delivered_twice_creates_one_job(
    account: Account, store: DynamoJobStore
) -> None:
    event = {
        "version": "0",
        "id": "11111111-2222-3333-4444-555555555555",
        "detail-type": "Job Submitted",
        "source": "gpufleet",
        "account": "123456789012",
        "time": "2026-11-29T17:31:30Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {"name": "from-event", "team": "t", "image": "img", "command": ["x"]},
    }
    first = invoke(account, INTAKE_FROM_EVENT.construct_id, event)
    second = invoke(account, INTAKE_FROM_EVENT.construct_id, event)
    assert first == second and first["accepted"]
    assert len(jobs_from(store, f"event:{event['id']}")) == 1


def test_put_events_on_the_bus_reaches_intake(account: Account, store: DynamoJobStore) -> None:
    before = {job.job_id for job in store.list_jobs()}
    account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": "gpufleet",
                "DetailType": "Job Submitted",
                "Detail": json.dumps(
                    {"name": "via-bus", "team": "t", "image": "img", "command": ["x"]}
                ),
            }
        ]
    )
    new = wait_for(lambda: [j for j in store.list_jobs() if j.job_id not in before])
    assert [job.spec.name for job in new] == ["via-bus"]


def test_a_bad_upload_gets_an_error_report_and_nothing_else_happens(
    account: Account, store: DynamoJobStore
) -> None:
    s3 = account.client("s3")
    s3.put_object(
        Bucket=account.bucket,
        Key="jobs/bad.yaml",
        Body=b"name: Bad!\nteam: t\nimage: i\ncommand: 'rm -rf /'\nresources: {gpus: 99}\n",
    )
    report = json.loads(
        s3.get_object(Bucket=account.bucket, Key="jobs/bad.yaml.error.json")["Body"].read()
    )
    assert report["error"] == "InvalidJobSpec"
    assert {f["field"] for f in report["fields"]} == {"name", "command", "resources.gpus"}
    assert jobs_from(store, f"s3://{account.bucket}/jobs/bad.yaml") == []
    # The error report itself is not taken for a spec.
    assert not any(
        k["Key"].endswith(".error.json.error.json")
        for k in s3.list_objects_v2(Bucket=account.bucket, Prefix="jobs/")["Contents"]
    )


def test_a_bad_event_is_refused_without_a_job(account: Account, store: DynamoJobStore) -> None:
    event = {
        "version": "0",
        "id": "99999999-2222-3333-4444-555555555555",
        "detail-type": "Job Submitted",
        "source": "gpufleet",
        "account": "123456789012",
        "time": "2026-11-29T17:31:30Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {"name": "x", "team": "t", "image": "img", "command": "echo hi"},
    }
    result = invoke(account, INTAKE_FROM_EVENT.construct_id, event)
    assert not result["accepted"]
    assert result["error"]["fields"][0]["field"] == "command"
    assert jobs_from(store, f"event:{event['id']}") == []
