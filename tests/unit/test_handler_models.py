"""The handlers' event models against real-shaped events (events/aws/) and moto's thinner ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_lambda_powertools.utilities.parser import envelopes, parse
from pydantic import ValidationError

from gpufleet.handlers.models import EnqueueTask, LaunchTask, ReleaseTask
from gpufleet.handlers.payloads import (
    BlockExpirationWarning,
    ExecutionStatusChange,
    JobTask,
    RequeueTask,
    S3Notification,
    SubmittedEvent,
    TokenTask,
)
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from gpufleet.topology import RULES

EVENTS = Path(__file__).resolve().parents[2] / "events" / "aws"


def load(name: str) -> dict[str, object]:
    return json.loads((EVENTS / name).read_text())


def test_an_execution_status_change_names_the_job_and_how_its_workflow_ended() -> None:
    event = parse(event=load("states-execution-failed.json"), model=ExecutionStatusChange)
    detail = event.detail
    assert (detail.name, detail.status, detail.error) == (
        "j-0123456789abcdef0123",
        "FAILED",
        "RequeueFailed",
    )
    assert detail.stateMachineArn.endswith(":stateMachine:gpufleet-JobLifecycle")
    # The documented shape of an execution stopped by StopExecution: no error, no cause.
    aborted = load("states-execution-failed.json")
    aborted["detail"] = {  # type: ignore[index]
        **{k: v for k, v in aborted["detail"].items() if k not in ("error", "cause")},  # type: ignore[attr-defined]
        "status": "ABORTED",
    }
    assert parse(event=aborted, model=ExecutionStatusChange).detail.cause is None


def test_a_capacity_block_expiration_warning_names_its_block_and_a_bad_one_is_refused() -> None:
    event = BlockExpirationWarning.model_validate(load("capacity-block-expiration-warning.json"))
    assert event.detail.capacity_reservation_id == "cr-0123456789abcdef0"
    assert event.detail.end_date.isoformat() == "2025-03-02T12:00:00+00:00"
    assert event.detail_type in {r.pattern["detail-type"][0] for r in RULES}
    bad = load("capacity-block-expiration-warning.json")
    bad["detail"] = {"capacity-reservation-id": "i-0123456789abcdef0", "end-date": "soon"}
    with pytest.raises(ValidationError) as refused:
        BlockExpirationWarning.model_validate(bad)
    assert {e["loc"][-1] for e in refused.value.errors()} == {
        "capacity-reservation-id",
        "end-date",
    }


def test_a_real_s3_notification_yields_the_decoded_key_and_version() -> None:
    notification = parse(event=load("s3-object-created.json"), model=S3Notification)
    record = notification.Records[0]
    assert record.s3.bucket.name == "gpufleet-intake-123456789012"
    assert record.s3.object.decoded_key == "jobs/vision/resnet baseline(2).yaml"
    assert record.s3.object.versionId == "096fKKXTRTtl3on89fVO.nfljtsv6qko"


def test_a_moto_shaped_s3_notification_without_optional_fields_parses() -> None:
    thin = {
        "Records": [
            {
                "eventName": "ObjectCreated:Put",
                "s3": {"bucket": {"name": "b"}, "object": {"key": "jobs/a.yaml", "eTag": "e"}},
            }
        ]
    }
    record = parse(event=thin, model=S3Notification).Records[0]
    assert record.s3.object.versionId is None and record.s3.object.eTag == "e"


def test_the_submitted_event_keeps_its_id_and_detail() -> None:
    event = parse(event=load("eventbridge-job-submitted.json"), model=SubmittedEvent)
    assert event.id == "6a7e8feb-b491-4cf7-a9f1-bf3703467718"
    assert event.detail["name"] == "speech-asr"


def test_node_reports_parse_and_validate_the_job_id() -> None:
    event = load("node-finished.json")
    report = parse(event=event, model=NodeReport, envelope=envelopes.EventBridgeEnvelope)
    assert report.exit_code == 0 and report.phase == "finished"
    detail = dict(event["detail"])  # type: ignore[call-overload]
    with pytest.raises(ValidationError):
        NodeReport.model_validate({**detail, "job_id": "../../etc/passwd"})
    with pytest.raises(ValidationError):
        NodeReport.model_validate({**detail, "phase": "exploded"})


@pytest.mark.parametrize(
    "payload",
    [{}, {"job_id": "nope"}, {"job_id": 7}, {"job_id": "j-" + "0" * 20 + "; rm"}],
)
def test_task_payloads_with_bad_job_ids_are_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        JobTask.model_validate(payload)


JOB_ID = "j-" + "0" * 20


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        (
            EnqueueTask,
            {
                "plan": {},
                "queued": {
                    "job_id": JOB_ID,
                    "team": "ml",
                    "priority": "normal",
                    "gpus": 1,
                    "instances": 1,
                    "enqueued_at": 0.0,
                },
            },
        ),
        (LaunchTask, {"plan": {}, "step": 0, "attempt": 0}),
    ],
)
def test_token_tasks_need_a_token(model: type[TokenTask], fields: dict[str, object]) -> None:
    assert model.model_validate({"job_id": JOB_ID, "task_token": "t", **fields}).task_token == "t"
    for bad in ({"task_token": ""}, {}):
        with pytest.raises(ValidationError):
            model.model_validate({"job_id": JOB_ID, **fields, **bad})


def test_a_launch_task_carries_the_admission_when_there_is_one() -> None:
    base = {"job_id": JOB_ID, "task_token": "t", "plan": {}, "step": 1, "attempt": 2}
    assert LaunchTask.model_validate(base).admission == Admission()
    admission = {"admitted": True, "queued_at": 10.0, "admitted_at": 70.0}
    parsed = LaunchTask.model_validate({**base, "admission": admission}).admission
    assert (parsed.admitted, parsed.queued_at, parsed.admitted_at) == (True, 10.0, 70.0)
    assert parsed.shortages_until is None
    for bad in ({"step": -1}, {"attempt": -1}, {"admission": {"admitted_at": "soon"}}):
        with pytest.raises(ValidationError):
            LaunchTask.model_validate({**base, **bad})


def test_the_release_task_parses_the_workflows_state_into_typed_keys() -> None:
    """What Release reads of the state, typed at the edge: the run's end, the launch, a failed
    step's error; keys it does not read are ignored, one it reads mistyped is refused."""
    state = {
        "job_id": JOB_ID,
        "plan": {"steps": []},
        "cycles": 2,
        "admission": {"admitted": True},
        "launch": {"step": 1, "attempt": 3, "give_up": True, "error": "no capacity"},
        "run": {"exit_code": 137, "reason": "killed", "oom": True, "stage": "train"},
        "error": {"Error": "States.Timeout", "Cause": "late"},
    }
    parsed = ReleaseTask.model_validate({"job_id": JOB_ID, "state": state}).state
    assert parsed.run is not None and parsed.launch is not None and parsed.error is not None
    assert (parsed.run.exit_code, parsed.run.oom, parsed.run.stage) == (137, True, "train")
    assert parsed.run.job is None and not parsed.run.cancelled
    assert (parsed.launch.attempt, parsed.launch.give_up) == (3, True)
    assert (parsed.error.error, parsed.error.cause) == ("States.Timeout", "late")
    assert ReleaseTask.model_validate({"job_id": JOB_ID, "state": {}}).state == WorkflowState()
    for bad in ({"run": {"exit_code": "zero"}}, {"launch": {"step": 0}}, {"run": {"job": {}}}):
        with pytest.raises(ValidationError):
            ReleaseTask.model_validate({"job_id": JOB_ID, "state": bad})


def test_a_requeue_task_needs_the_attempt_it_counts_on_from() -> None:
    assert (
        RequeueTask.model_validate(
            {"job_id": JOB_ID, "attempt": 3, "cycles": 0, "execution": JOB_ID}
        ).attempt
        == 3
    )
    for bad in ({}, {"attempt": -1}):
        with pytest.raises(ValidationError):
            RequeueTask.model_validate({"job_id": JOB_ID, **bad})
