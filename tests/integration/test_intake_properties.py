"""A verdict for everything, through both real intake paths of the embedded account: generated
uploads (tests/spec_strategies.py) put under jobs/ and generated details put on the bus each end
in a job or a refusal (a `Job Rejected` event, and for an upload its report), and no handler
raises. The account is as strict as AWS about sizes (tests/limits.py): a PutEvents entry over
256 KiB or a DynamoDB item over 400 KB is refused as AWS refuses it, so intake writing one would
fail here; the idempotency records Powertools updated are sized at the end.

Few examples (each is a real upload or event); the pure layer runs many
(tests/unit/test_intake_verdicts.py).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import botocore.handlers
import pytest
from hypothesis import HealthCheck, assume, given, settings

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.submitters import team_source
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import RejectionObserver
from gpufleet.services.intake import ERROR_SUFFIX
from gpufleet.topology import (
    DETAIL_JOB_SUBMITTED,
    IDEMPOTENCY_TABLE,
    INTAKE_FROM_EVENT,
    INTAKE_FROM_S3,
    INTAKE_PREFIX,
    JOBS_TABLE,
)
from tests.helpers import jobs_from
from tests.limits import (
    DYNAMODB_ITEM_LIMIT,
    PUT_EVENTS_ENTRY_LIMIT,
    AwsSizeLimits,
    dynamodb_item_size,
)
from tests.spec_strategies import DETAILS, Upload, uploads

EXAMPLES = settings(
    max_examples=10,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_numbers = itertools.count()


@pytest.fixture(scope="module")
def limits() -> Iterator[AwsSizeLimits]:
    """Registered before the module's handlers create their clients (at their cold start)."""
    limits = AwsSizeLimits()
    botocore.handlers.BUILTIN_HANDLERS.extend(limits.hooks())
    yield limits
    for hook in limits.hooks():
        botocore.handlers.BUILTIN_HANDLERS.remove(hook)


@pytest.fixture(scope="module")
def store(limits: AwsSizeLimits, account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


@pytest.fixture(scope="module")
def rejections(account: Account) -> RejectionObserver:
    return RejectionObserver(account, "property-rejections")


@pytest.fixture(scope="module")
def s3(account: Account) -> Any:
    return account.client("s3")  # one client: each costs its service model's load


@pytest.fixture(scope="module")
def events(account: Account) -> Any:
    return account.client("events")


def _intake_errors(account: Account, since: int) -> list[str]:
    intake = {f"gpufleet-{f.construct_id}" for f in (INTAKE_FROM_S3, INTAKE_FROM_EVENT)}
    made = account.recorder.invocations[since:]
    return [i.function_name for i in made if i.function_name in intake and i.errored]


@EXAMPLES
@given(upload=uploads())
def test_any_upload_gets_a_job_or_a_refusal(
    account: Account,
    store: DynamoJobStore,
    rejections: RejectionObserver,
    limits: AwsSizeLimits,
    s3: Any,
    upload: Upload,
) -> None:
    key = _one_per_example(upload.key, next(_numbers))
    before = len(account.recorder.invocations)
    put = s3.put_object(Bucket=account.bucket, Key=key, Body=upload.body)  # intake runs within
    assert _intake_errors(account, before) == [] and limits.refused == []
    source = f"s3://{account.bucket}/{key}"
    jobs, refused = jobs_from(store, source), rejections.of(source)
    if key.endswith("/") and upload.body == b"":
        assert (jobs, refused) == ([], [])  # a folder marker: no submission
        return
    assert len(jobs) + len(refused) == 1, (jobs, refused)
    if refused:
        report = json.loads(
            s3.get_object(Bucket=account.bucket, Key=key + ERROR_SUFFIX)["Body"].read()
        )
        assert report == refused[0] and report["version_id"] == put["VersionId"]


def _one_per_example(key: str, number: int) -> str:
    """`key` with the name under its team's folder (or under jobs/) made unique."""
    team, slash, rest = key.removeprefix(INTAKE_PREFIX).partition("/")
    return (
        f"{INTAKE_PREFIX}{team}/p{number}-{rest}" if slash else f"{INTAKE_PREFIX}p{number}-{team}"
    )


def _source_of_its_team(detail: Any) -> str:
    """The event source of the team the detail names (a source EventBridge takes), so that
    what is judged is the spec; a detail naming none comes from team `none`'s."""
    team = detail.get("team") if isinstance(detail, dict) else None
    return team_source(team if isinstance(team, str) and 0 < len(team) < 64 else "none")


@EXAMPLES
@given(detail=DETAILS)
def test_any_event_detail_gets_a_job_or_a_refusal(
    account: Account,
    store: DynamoJobStore,
    rejections: RejectionObserver,
    limits: AwsSizeLimits,
    events: Any,
    detail: Any,
) -> None:
    try:
        text = json.dumps(detail, allow_nan=False)
    except ValueError:
        assume(False)  # EventBridge takes JSON only
    assume(len(text.encode()) < PUT_EVENTS_ENTRY_LIMIT - 100)  # what one entry can carry
    before = len(account.recorder.invocations)
    response = events.put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": _source_of_its_team(detail),
                "DetailType": DETAIL_JOB_SUBMITTED,
                "Detail": text,
            }
        ]
    )
    assert response["FailedEntryCount"] == 0
    assert _intake_errors(account, before) == [] and limits.refused == []
    source = f"event:{response['Entries'][0]['EventId']}"
    assert len(jobs_from(store, source)) + len(rejections.of(source)) == 1


def test_every_record_intake_kept_fits_dynamodb(account: Account, limits: AwsSizeLimits) -> None:
    """After the examples above: the idempotency records (updated with each delivery's answer)
    and the jobs, sized as DynamoDB sizes them."""
    dynamodb = account.client("dynamodb")
    sizes = [
        dynamodb_item_size(item)
        for table in (IDEMPOTENCY_TABLE, JOBS_TABLE)
        for page in dynamodb.get_paginator("scan").paginate(
            TableName=account.table_names[table.construct_id]
        )
        for item in page["Items"]
    ]
    assert sizes and max(sizes) <= DYNAMODB_ITEM_LIMIT
    assert limits.largest_entry <= PUT_EVENTS_ENTRY_LIMIT
