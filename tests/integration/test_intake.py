"""Both intake paths on the embedded account: acceptance, duplicates, and rejection; the
notified version read; and `gpufleet submit` (run in this process against the account) reporting
the verdict of its own upload, with what submitters wrote printed escaped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.cli import main
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.submitters import team_source, upload_key
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import RejectionObserver
from gpufleet.services.intake import ERROR_SUFFIX
from gpufleet.topology import INTAKE_FROM_EVENT, INTAKE_FROM_S3, JOB_LIFECYCLE, JOBS_TABLE
from tests.helpers import SPEC_YAML, jobs_from, wait_for
from tests.s3_delivery import held_s3_notifications


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


def s3_notification(bucket: str, key: str, upload: dict[str, Any]) -> dict[str, Any]:
    """The record S3 sends for an upload to the (versioned) bucket."""
    obj = {"key": key, "eTag": upload["ETag"].strip('"'), "versionId": upload["VersionId"]}
    return {
        "Records": [
            {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": bucket}, "object": obj}}
        ]
    }


def executions_for(account: Account, job_id: str) -> list[dict[str, Any]]:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    return [
        e for e in sfn.list_executions(stateMachineArn=arn)["executions"] if e["name"] == job_id
    ]


def test_an_upload_under_jobs_starts_one_lifecycle(account: Account, store: DynamoJobStore) -> None:
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key="jobs/vision/upload-once.yaml", Body=SPEC_YAML)
    source = f"s3://{account.bucket}/jobs/vision/upload-once.yaml"
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
        "source": "gpufleet.team.t",
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
    upload = s3.put_object(Bucket=account.bucket, Key="jobs/vision/twice.yaml", Body=SPEC_YAML)
    source = f"s3://{account.bucket}/jobs/vision/twice.yaml"
    wait_for(lambda: jobs_from(store, source))
    notification = s3_notification(account.bucket, "jobs/vision/twice.yaml", upload)
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
        "source": "gpufleet.team.t",
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
                "Source": "gpufleet.team.t",
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
        Key="jobs/t/bad.yaml",
        Body=b"name: Bad!\nteam: t\nimage: i\ncommand: 'rm -rf /'\nresources: {gpus: 99}\n",
    )
    report = json.loads(
        s3.get_object(Bucket=account.bucket, Key="jobs/t/bad.yaml.error.json")["Body"].read()
    )
    assert report["error"] == "InvalidJobSpec"
    assert {f["field"] for f in report["fields"]} == {"name", "command", "resources.gpus"}
    assert jobs_from(store, f"s3://{account.bucket}/jobs/t/bad.yaml") == []
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
        "source": "gpufleet.team.t",
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


# -- who submits decides the team (domain/submitters.py) ---------------------------------------


@pytest.fixture(scope="module")
def rejections(account: Account) -> RejectionObserver:
    return RejectionObserver(account, "intake-rejections")


def executions_started(account: Account) -> int:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    return len(sfn.list_executions(stateMachineArn=arn)["executions"])


@pytest.mark.parametrize(
    ("key", "problem", "field"),
    [
        # SPEC_YAML is team vision's: uploaded to team nlp's folder, it claims another team.
        (upload_key("nlp", "claims-vision.yaml"), "submitted as team nlp", "team"),
        ("jobs/loose.yaml", "submit under jobs/<team>/", "(submitter)"),
    ],
    ids=["another-teams-folder", "no-teams-folder"],
)
def test_an_upload_outside_its_teams_folder_is_rejected_and_nothing_else_happens(
    account: Account,
    store: DynamoJobStore,
    rejections: RejectionObserver,
    key: str,
    problem: str,
    field: str,
) -> None:
    s3 = account.client("s3")
    started = executions_started(account)
    s3.put_object(Bucket=account.bucket, Key=key, Body=SPEC_YAML)  # intake runs within
    source = f"s3://{account.bucket}/{key}"
    [rejected] = wait_for(lambda: rejections.of(source))
    assert problem in rejected["message"]
    assert [f["field"] for f in rejected["fields"]] == [field]
    report = s3.get_object(Bucket=account.bucket, Key=key + ERROR_SUFFIX)["Body"].read()
    assert json.loads(report) == rejected
    assert jobs_from(store, source) == []
    assert executions_started(account) == started


def test_a_checkpoint_in_another_teams_folder_is_rejected_its_own_accepted(
    account: Account, store: DynamoJobStore, rejections: RejectionObserver
) -> None:
    """The embedded stack keeps checkpoints under s3://gpufleet-checkpoints/<team>/, where the
    job role lets each team's sessions write: team vision naming team nlp's is refused."""
    s3 = account.client("s3")
    started = executions_started(account)
    theirs = upload_key("vision", "checkpoint-of-nlp.yaml")
    body = SPEC_YAML + b"checkpoint: s3://gpufleet-checkpoints/nlp/llm/\n"
    s3.put_object(Bucket=account.bucket, Key=theirs, Body=body)
    source = f"s3://{account.bucket}/{theirs}"
    [rejected] = wait_for(lambda: rejections.of(source))
    assert rejected["fields"] == [
        {
            "field": "checkpoint",
            "message": "team vision's jobs keep checkpoints under s3://gpufleet-checkpoints/vision/",
        }
    ]
    assert jobs_from(store, source) == []
    assert executions_started(account) == started
    own = upload_key("vision", "checkpoint-of-its-own.yaml")
    body = SPEC_YAML + b"checkpoint: s3://gpufleet-checkpoints/vision/resnet/\n"
    s3.put_object(Bucket=account.bucket, Key=own, Body=body)
    [job] = wait_for(lambda: jobs_from(store, f"s3://{account.bucket}/{own}"))
    assert job.spec.checkpoint == "s3://gpufleet-checkpoints/vision/resnet/"
    assert executions_started(account) == started + 1


def put_submission(account: Account, source: str, name: str) -> str:
    """A `Job Submitted` event of team vision's spec from `source`: the event's id."""
    detail = {"name": name, "team": "vision", "image": "img", "command": ["x"]}
    [entry] = account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": source,
                "DetailType": "Job Submitted",
                "Detail": json.dumps(detail),
            }
        ]
    )["Entries"]
    event_id: str = entry["EventId"]
    return event_id


def test_an_event_from_another_teams_source_is_rejected_its_own_accepted(
    account: Account, store: DynamoJobStore, rejections: RejectionObserver
) -> None:
    started = executions_started(account)
    claimed = put_submission(account, team_source("nlp"), "claims-vision")
    [rejected] = wait_for(lambda: rejections.of(f"event:{claimed}"))
    assert "submitted as team nlp, the spec claims team vision" in rejected["message"]
    assert jobs_from(store, f"event:{claimed}") == []
    assert executions_started(account) == started
    own = put_submission(account, team_source("vision"), "its-own")
    [job] = wait_for(lambda: jobs_from(store, f"event:{own}"))
    assert (job.spec.team, job.status) == ("vision", JobStatus.QUEUED)
    assert executions_started(account) == started + 1


def test_two_quick_uploads_to_one_key_each_run_their_own_version(
    account: Account, store: DynamoJobStore
) -> None:
    """S3 notifies late: both uploads are in the bucket when intake hears of the first. Each
    delivery reads the version it names, so each spec runs once."""
    s3 = account.client("s3")
    key, source = "jobs/vision/quick.yaml", f"s3://{account.bucket}/jobs/vision/quick.yaml"
    with held_s3_notifications() as held:
        for name in ("first", "second"):
            s3.put_object(
                Bucket=account.bucket, Key=key, Body=SPEC_YAML.replace(b"resnet", name.encode())
            )
    for deliver in held:
        deliver()
    jobs = wait_for(lambda: (found := jobs_from(store, source)) and len(found) == 2 and found)
    assert sorted(job.spec.name for job in jobs) == ["first", "second"]


def test_a_refusal_names_the_version_it_refused(account: Account, store: DynamoJobStore) -> None:
    s3 = account.client("s3")
    upload = s3.put_object(
        Bucket=account.bucket, Key="jobs/vision/versioned-bad.yaml", Body=b"name: ["
    )
    report = json.loads(
        s3.get_object(Bucket=account.bucket, Key="jobs/vision/versioned-bad.yaml.error.json")[
            "Body"
        ].read()
    )
    assert report["version_id"] == upload["VersionId"]
    assert report["source"] == f"s3://{account.bucket}/jobs/vision/versioned-bad.yaml"


@pytest.mark.parametrize(
    ("bucket", "key"),
    [("someone-elses-bucket", "jobs/vision/theirs.yaml"), (None, "runs/theirs.yaml")],
    ids=["other-bucket", "outside-the-prefix"],
)
def test_a_record_for_another_bucket_or_prefix_is_dropped(
    account: Account, store: DynamoJobStore, bucket: str | None, key: str
) -> None:
    s3 = account.client("s3")
    # The object exists in our bucket: only the record's bucket or prefix is wrong.
    upload = s3.put_object(Bucket=account.bucket, Key=key, Body=SPEC_YAML)
    named = bucket or account.bucket
    result = invoke(account, INTAKE_FROM_S3.construct_id, s3_notification(named, key, upload))
    assert result == {"results": []}
    assert jobs_from(store, f"s3://{named}/{key}") == []
    listed = s3.list_objects_v2(Bucket=account.bucket, Prefix=key + ".error")
    assert listed.get("KeyCount", 0) == 0


# -- gpufleet submit and what it prints --------------------------------------------------------

CLI_SPEC = "name: {name}\nteam: vision\nimage: img:1\ncommand: [python, train.py]\n"
CONFIG = str(Path(__file__).resolve().parents[2] / "gpufleet.yaml")


def gpufleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--config", CONFIG])
    out, err = capsys.readouterr()
    return code, out, err


def spec_file(directory: Path, file_name: str, text: str) -> str:
    path = directory / file_name
    path.write_text(text)
    return str(path)


def keys_under(account: Account, prefix: str) -> list[str]:
    listed = account.client("s3").list_objects_v2(Bucket=account.bucket, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


def test_submit_reports_the_refusal_of_its_own_upload_not_an_earlier_one(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A template the deployed config lacks: only intake can refuse it.
    first = CLI_SPEC.format(name="first") + "template: no-such-template\n"
    path = spec_file(tmp_path, "verdict.yaml", first)
    code, _, err = gpufleet(capsys, "submit", path)
    assert code == 2 and "unknown resource template" in err
    # Uploaded again, and notified late: the earlier refusal, next to the same key and maybe
    # in the same second, is not this upload's.
    spec_file(tmp_path, "verdict.yaml", CLI_SPEC.format(name="second") + "template: another\n")
    with held_s3_notifications() as held:
        code, out, err = gpufleet(capsys, "submit", path, "--wait", "1", "--json")
    assert code == 0, err
    submitted: dict[str, Any] = json.loads(out)
    assert submitted["status"] is None and "has not recorded" in err
    for deliver in held:
        deliver()
    report = json.loads(
        account.client("s3")
        .get_object(Bucket=account.bucket, Key="jobs/vision/verdict.yaml.error.json")["Body"]
        .read()
    )
    assert report["version_id"] == submitted["version_id"]


def test_submit_refuses_a_name_intake_keeps_for_its_reports(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    valid = {"name": "train", "team": "vision", "image": "img:1", "command": ["x"]}
    path = spec_file(tmp_path, "train.error.json", json.dumps(valid))
    code, _, err = gpufleet(capsys, "submit", path)
    assert code == 2 and "error reports" in err
    assert keys_under(account, "jobs/vision/train.error") == []


def test_a_duration_too_large_for_a_float_is_refused_before_upload(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, "forever.yaml", CLI_SPEC.format(name="x") + "timeout: 1" + "0" * 400)
    code, _, err = gpufleet(capsys, "submit", path)
    assert code == 2 and "timeout:" in err and "Traceback" not in err
    assert keys_under(account, "jobs/vision/forever") == []


def test_control_characters_in_a_key_are_printed_escaped_unless_raw(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "red\x1b[31m\u202e.yaml"  # an ANSI colour and a bidi override
    path = spec_file(tmp_path, name, CLI_SPEC.format(name="red"))
    code, out, _ = gpufleet(capsys, "submit", path)
    assert code == 0
    assert "\x1b" not in out and "\u202e" not in out
    assert "red\\x1b[31m\\u202e.yaml" in out
    job_id = out.split()[0]
    code, out, _ = gpufleet(capsys, "status", job_id)
    [source] = [line for line in out.splitlines() if line.startswith("source:")]
    assert source.endswith("jobs/vision/red\\x1b[31m\\u202e.yaml")
    code, out, _ = gpufleet(capsys, "status", job_id, "--raw")
    assert f"jobs/vision/{name}" in out
