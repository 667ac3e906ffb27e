"""Node reports a job cannot forge: the canonical encoding, signing and verifying."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.domain.node_reports import (
    BAD_SIGNATURE,
    NODE_KEY_BYTES,
    OTHER_RUN,
    UNSIGNED,
    InvalidNodeKey,
    NodeKey,
    ReportNotAuthentic,
    canonical_report,
    node_key_object,
    sign_report,
    verify_report,
)
from gpufleet.errors import RefusedInput

KEY = NodeKey(run=3, secret=bytes(range(NODE_KEY_BYTES)))
OTHER_JOBS_KEY = NodeKey(run=3, secret=bytes(range(1, NODE_KEY_BYTES + 1)))
JOB = "j-0123456789abcdef0123"
OTHER_JOB = "j-ffffffffffffffffffff"
FINISH = {
    "job_id": JOB,
    "instance_id": "i-0abc",
    "phase": "finished",
    "exit_code": 0,
    "reason": "",
}


def signed(detail: dict[str, Any] = FINISH, key: NodeKey = KEY) -> dict[str, Any]:
    return sign_report(detail, key, sent_ms=1_800_000_000_000)


def refusal(detail: dict[str, Any], key: NodeKey = KEY) -> str:
    with pytest.raises(ReportNotAuthentic) as refused:
        verify_report(detail, key)
    assert isinstance(refused.value, RefusedInput)  # a structured error, of the one base
    return refused.value.problem


def test_a_signed_report_verifies_and_names_its_run_and_when_it_was_sent() -> None:
    report = signed()
    verify_report(report, KEY)
    assert report["run"] == 3
    assert report["sent_ms"] == 1_800_000_000_000
    assert len(report["signature"]) == 64  # hex SHA-256
    # As EventBridge hands it on: a JSON round trip changes nothing that is signed.
    verify_report(json.loads(json.dumps(report)), KEY)


def test_the_encoding_is_canonical_whatever_the_order_of_the_fields() -> None:
    shuffled = dict(reversed(list(signed().items())))
    assert canonical_report(shuffled) == canonical_report(signed())
    verify_report(shuffled, KEY)
    assert b"signature" not in canonical_report(signed())


@pytest.mark.parametrize(
    "change",
    [
        {"exit_code": 1},
        {"phase": "heartbeat"},
        {"instance_id": "i-0def"},
        {"reason": "oom"},
        {"interrupted": True},  # a field added
        {"sent_ms": 1_800_000_000_001},
        {"run": 4},
    ],
)
def test_a_changed_report_is_refused(change: dict[str, Any]) -> None:
    problem = refusal(signed() | change)
    assert problem == (OTHER_RUN if "run" in change else BAD_SIGNATURE)


def test_a_field_taken_out_is_refused() -> None:
    report = signed()
    del report["exit_code"]
    assert refusal(report) == BAD_SIGNATURE


def test_a_report_signed_with_another_key_is_refused() -> None:
    assert refusal(signed(key=OTHER_JOBS_KEY)) == BAD_SIGNATURE


def test_a_report_of_one_job_is_no_report_of_another() -> None:
    """Job A's agent (or whoever saw its report) cannot make it one of job B: B's key does not
    verify it, and with the job id changed A's key no longer does either."""
    report_of_a = signed(key=OTHER_JOBS_KEY)
    replayed_for_b = report_of_a | {"job_id": OTHER_JOB}
    assert refusal(replayed_for_b, KEY) == BAD_SIGNATURE
    assert refusal(replayed_for_b, OTHER_JOBS_KEY) == BAD_SIGNATURE


def test_a_report_of_an_earlier_run_is_refused() -> None:
    earlier = NodeKey(run=2, secret=KEY.secret)
    assert refusal(signed(key=earlier)) == OTHER_RUN


@pytest.mark.parametrize("signature", [None, "", 7, ["a"]], ids=["none", "empty", "number", "list"])
def test_an_unsigned_report_is_refused(signature: object) -> None:
    report = {**FINISH, "run": 3, "sent_ms": 1}
    if signature is not None:
        report["signature"] = signature
    assert refusal(report) == UNSIGNED


@pytest.mark.parametrize(
    "change",
    [
        {"signature": "zz" * 32},  # not hex
        {"signature": "AB" * 32},  # hex, not as signed (lower case)
        {"sent_ms": "1800000000000"},  # not a number of milliseconds
        {"reason": float("nan")},  # nothing JSON carries
    ],
)
def test_a_malformed_signed_report_is_refused(change: dict[str, Any]) -> None:
    assert refusal(signed() | change) == BAD_SIGNATURE


def test_a_run_given_as_true_is_not_run_1() -> None:
    key = NodeKey(run=1, secret=KEY.secret)
    assert refusal(signed(key=key) | {"run": True}) == OTHER_RUN


def test_the_key_document_round_trips_and_never_shows_the_secret() -> None:
    document = json.dumps(KEY.document()).encode()
    assert NodeKey.from_document(document) == KEY
    assert KEY.secret.hex() not in repr(KEY)
    assert node_key_object(JOB) == f"runs/{JOB}/node-key"


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"run": 1}',
        b'{"run": "1", "key": "00"}',
        b'{"run": true, "key": "' + b"00" * 32 + b'"}',
        b'{"run": 1, "key": "0011"}',  # too short
        b'{"run": 0, "key": "' + b"00" * 32 + b'"}',
        b'{"run": 1, "key": "' + b"zz" * 32 + b'"}',
    ],
)
def test_a_damaged_key_document_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidNodeKey):
        NodeKey.from_document(raw)
