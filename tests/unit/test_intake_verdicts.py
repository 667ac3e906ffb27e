"""A verdict for everything, on the pure intake layer (in-memory ports, many examples): any
upload under jobs/ and any event detail ends in a stored job or a refusal, never an exception,
and what intake writes fits where AWS must store or carry it:

- an accepted job's DynamoDB item (as the job store encodes it) within 400 KB, its workflow
  input within Step Functions' 256 KiB;
- a refusal's `Job Rejected` event (the PutEvents entry the publisher sends) within 256 KiB,
  its report next to the upload, naming the fields and the version refused;
- the idempotency record of either verdict (Powertools stores the handler's answer) within
  400 KB.

The embedded account runs the same strategies through both real intake paths, fewer times
(tests/integration/test_intake_properties.py).
"""

from __future__ import annotations

import json
from typing import Any, cast

from aws_lambda_powertools.shared.json_encoder import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.adapters.aws.events import put_events_entry
from gpufleet.adapters.aws.job_store import job_to_item
from gpufleet.adapters.local.memory import InMemoryObjects, RecordingPublisher, RecordingWorkflow
from gpufleet.domain.spec import MAX_REPORTED_FIELDS
from gpufleet.ports import Ports
from gpufleet.services.intake import ERROR_SUFFIX, MAX_KEY_BYTES, IntakeOutcome, describe
from gpufleet.topology import CONTROL_PLANE_SOURCE, DETAIL_JOB_REJECTED
from tests.helpers import intake_for, local_ports, sent_by_its_team
from tests.limits import DYNAMODB_ITEM_LIMIT, PUT_EVENTS_ENTRY_LIMIT, dynamodb_item_size
from tests.spec_strategies import DETAILS, Upload, uploads

STEP_FUNCTIONS_INPUT_LIMIT = 256 * 1024
EXAMPLES = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def idempotency_record(answer: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The item Powertools' DynamoDB layer keeps for a completed delivery."""
    key = "gpufleet-IntakeFromS3.gpufleet.handlers.on_s3_upload.submit#" + "0" * 32
    return {
        "id": {"S": key},
        "expiration": {"N": "1790000000"},
        "in_progress_expiration": {"N": "1790000000000"},
        "status": {"S": "COMPLETED"},
        "data": {"S": json.dumps(answer, cls=Encoder, sort_keys=True)},
    }


def assert_a_verdict(ports: Ports, outcome: IntakeOutcome, source: str) -> dict[str, Any] | None:
    """The outcome is a job or a refusal, each within AWS's limits; the refusal's report."""
    answer = dict(describe(outcome))
    assert dynamodb_item_size(idempotency_record(answer)) <= DYNAMODB_ITEM_LIMIT
    rejected = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_REJECTED)
    if outcome.accepted:
        assert outcome.job_id is not None
        job = ports.jobs.get(outcome.job_id)
        assert job.source == source
        assert dynamodb_item_size(job_to_item(job)) <= DYNAMODB_ITEM_LIMIT
        state = cast(RecordingWorkflow, ports.workflow).inputs.get(job.job_id, {})
        assert len(json.dumps(state).encode()) <= STEP_FUNCTIONS_INPUT_LIMIT
        assert rejected == []
        return None
    if outcome.ignored is not None:
        return None
    report = outcome.error
    assert report is not None and report["error"] == "InvalidJobSpec" and report["message"]
    assert report["source"] == source
    assert len(report["fields"]) <= MAX_REPORTED_FIELDS
    assert rejected == [report]
    entry = put_events_entry("gpufleet", CONTROL_PLANE_SOURCE, DETAIL_JOB_REJECTED, report)
    assert len(json.dumps(entry).encode()) <= PUT_EVENTS_ENTRY_LIMIT
    assert ports.jobs.list_jobs() == []
    return report


@EXAMPLES
@given(upload=uploads())
def test_any_upload_gets_a_job_or_a_bounded_refusal(upload: Upload) -> None:
    ports = local_ports()
    version = cast(InMemoryObjects, ports.objects).upload(upload.key, upload.body)
    source = f"s3://bucket/{upload.key}"
    outcome = intake_for(ports).submit_object(
        upload.key, f"{source}#{version}", source, version_id=version
    )
    report = assert_a_verdict(ports, outcome, source)
    if outcome.ignored is not None:
        # Only an empty folder marker is no submission among these uploads.
        assert upload.key.endswith("/") and upload.body == b""
    if report is not None:
        assert report["version_id"] == version
        if len((upload.key + ERROR_SUFFIX).encode()) <= MAX_KEY_BYTES:
            stored = cast(InMemoryObjects, ports.objects).objects[upload.key + ERROR_SUFFIX]
            assert json.loads(stored) == report


@EXAMPLES
@given(detail=DETAILS | st.lists(st.integers()) | st.text() | st.none())
def test_any_event_detail_gets_a_job_or_a_bounded_refusal(detail: Any) -> None:
    ports = local_ports()
    outcome = intake_for(ports).submit_document(
        detail, "event:1", "event:1", sent_by_its_team(detail)
    )
    assert outcome.ignored is None
    assert_a_verdict(ports, outcome, "event:1")
