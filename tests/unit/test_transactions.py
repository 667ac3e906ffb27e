"""What a refused DynamoDB write means (`adapters/aws/transactions.py`), with a stub client that
answers as DynamoDB does: a cancelled transaction carries each item's named reason; only a
failed condition is a verdict; conflicts and throttles are tried again with bounded, jittered
waits and end, when they persist, in a transient error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.adapters.aws.transactions import (
    Backoff,
    CancellationReason,
    ConditionsFailed,
    QueueContended,
    TransactionCancelled,
    TransactionRefused,
    WriteContended,
    batch_put,
    transact,
    write,
)
from gpufleet.errors import ConditionFailed, Conflict, TransientError

ITEMS: list[dict[str, Any]] = [{"Put": {"TableName": "t", "Item": {}}} for _ in range(4)]
OLD_JOB = {"job_id": {"S": "j-1"}, "status": {"S": "RUNNING"}}


def cancelled(*codes: str, item_at: int | None = None) -> ClientError:
    """A TransactionCanceledException as botocore raises it: one reason per item, in order."""
    reasons: list[dict[str, Any]] = [{"Code": code} for code in codes]
    if item_at is not None:
        reasons[item_at]["Item"] = OLD_JOB
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
            "CancellationReasons": reasons,
        },
        "TransactWriteItems",
    )


def refused(code: str, operation: str = "UpdateItem", **extra: Any) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, **extra}, operation)


class StubClient:
    """Answers each call with the next scripted error; once they run out, succeeds."""

    def __init__(self, *errors: ClientError) -> None:
        self._errors = list(errors)
        self.calls = 0

    def _answer(self) -> dict[str, Any]:
        self.calls += 1
        if self._errors:
            raise self._errors.pop(0)
        return {"Attributes": {}}

    def transact_write_items(self, **_: Any) -> dict[str, Any]:
        return self._answer()

    def update_item(self, **_: Any) -> dict[str, Any]:
        return self._answer()


class Waits:
    """A backoff that records its waits instead of sleeping; every draw is `draw`."""

    def __init__(self, draw: float = 1.0) -> None:
        self.waited: list[float] = []
        self.backoff = Backoff(sleep=self.waited.append, draw=lambda: draw)


THROUGHPUT_OR_CONFLICT = ["ThrottlingError", "ProvisionedThroughputExceeded", "TransactionConflict"]
# What the SDK's standard retry mode retries as throttling, still refused after its attempts.
THROTTLED = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
]


def test_a_failed_condition_is_a_verdict_naming_each_items_reason() -> None:
    client = StubClient(cancelled("None", "None", "ConditionalCheckFailed", "None", item_at=2))
    waits = Waits()
    with pytest.raises(ConditionsFailed) as raised:
        transact(client, ITEMS, waits.backoff)
    failure = raised.value
    assert [r.reason for r in failure.reasons] == [
        CancellationReason.NONE,
        CancellationReason.NONE,
        CancellationReason.CONDITIONAL_CHECK_FAILED,
        CancellationReason.NONE,
    ]
    assert failure.failed_positions == {2} and failure.failed(2) and not failure.failed(3)
    assert failure.reasons[2].item == OLD_JOB  # the item as it was, when the write asked
    assert isinstance(failure, Conflict) and not isinstance(failure, TransientError)
    assert client.calls == 1 and waits.waited == []  # a verdict is not tried again


@pytest.mark.parametrize("code", THROUGHPUT_OR_CONFLICT)
def test_a_transaction_cancelled_for_throughput_or_a_conflict_is_tried_again(code: str) -> None:
    # The F1 case: a throttled item among items that had no error is no failed condition.
    client = StubClient(cancelled("None", "None", code, "None"), cancelled(code, *["None"] * 3))
    waits = Waits()
    transact(client, ITEMS, waits.backoff)  # written on the third try: no error
    assert client.calls == 3
    assert waits.waited == pytest.approx([0.05, 0.1])  # the first waits, doubling


@pytest.mark.parametrize("code", THROUGHPUT_OR_CONFLICT)
def test_a_transaction_cancelled_on_every_try_is_a_transient_error_not_a_verdict(
    code: str,
) -> None:
    backoff_tries = Backoff().tries
    client = StubClient(*[cancelled("None", code, "None", "None")] * backoff_tries)
    waits = Waits(draw=0.5)
    with pytest.raises(QueueContended) as raised:
        transact(client, ITEMS, waits.backoff)
    assert isinstance(raised.value, TransientError) and not isinstance(raised.value, Conflict)
    assert raised.value.failed_positions == frozenset()
    assert raised.value.reasons[1].reason is CancellationReason.of(code)
    assert client.calls == backoff_tries
    # Bounded: half of each draw's ceiling, the ceiling doubling up to one second.
    assert waits.waited == pytest.approx([0.025, 0.05, 0.1, 0.2, 0.4][: backoff_tries - 1])
    assert all(wait <= Backoff().cap_seconds for wait in waits.waited)


def test_the_waits_are_jittered_and_capped() -> None:
    draws = iter([0.0, 0.5, 1.0, 1.0, 1.0])
    waited: list[float] = []
    backoff = Backoff(
        tries=6, base_seconds=0.25, cap_seconds=1.0, sleep=waited.append, draw=lambda: next(draws)
    )
    with pytest.raises(QueueContended):
        transact(StubClient(*[cancelled("ThrottlingError")] * 6), ITEMS[:1], backoff)
    assert waited == pytest.approx([0.0, 0.25, 1.0, 1.0, 1.0])


def test_a_condition_reported_beside_a_throttled_item_is_checked_again() -> None:
    """The throttled item was not evaluated: the failed condition may not be the only one, so
    the transaction is tried again before anything is concluded."""
    client = StubClient(
        cancelled("ConditionalCheckFailed", "ThrottlingError", "None", "None"),
        cancelled("None", "ConditionalCheckFailed", "None", "None"),
    )
    with pytest.raises(ConditionsFailed) as raised:
        transact(client, ITEMS, Waits().backoff)
    assert raised.value.failed_positions == {1} and client.calls == 2


@pytest.mark.parametrize(
    "code", ["ValidationError", "ItemCollectionSizeLimitExceeded", "SomethingNew"]
)
def test_a_transaction_cancelled_for_another_reason_is_refused_never_a_verdict(code: str) -> None:
    client = StubClient(cancelled("None", code, "ConditionalCheckFailed", "ThrottlingError"))
    with pytest.raises(TransactionRefused) as raised:
        transact(client, ITEMS, Waits().backoff)
    failure = raised.value
    assert not isinstance(failure, ConditionFailed | TransientError)
    assert isinstance(failure, TransactionCancelled)
    expected = CancellationReason.UNKNOWN if code == "SomethingNew" else CancellationReason(code)
    assert failure.reasons[1].reason is expected and failure.reasons[1].code == code
    assert code in str(failure)
    assert client.calls == 1


@pytest.mark.parametrize("code", THROTTLED)
def test_a_transaction_throttled_past_the_sdks_retries_is_transient(code: str) -> None:
    client = StubClient(refused(code, "TransactWriteItems"))
    with pytest.raises(QueueContended):
        transact(client, ITEMS, Waits().backoff)


def test_any_other_client_error_is_left_as_it_is() -> None:
    client = StubClient(refused("ResourceNotFoundException", "TransactWriteItems"))
    with pytest.raises(ClientError):
        transact(client, ITEMS, Waits().backoff)
    assert client.calls == 1


# -- single-item writes -------------------------------------------------------------------------


def update(client: StubClient, backoff: Backoff) -> Callable[[], dict[str, Any]]:
    return lambda: write(client.update_item, backoff, TableName="jobs", Key={})


def test_a_write_that_meets_a_transaction_is_tried_again() -> None:
    """F7: botocore's standard retry mode does not retry TransactionConflictException."""
    client = StubClient(refused("TransactionConflictException"))
    waits = Waits()
    assert update(client, waits.backoff)() == {"Attributes": {}}
    assert client.calls == 2 and waits.waited == pytest.approx([0.05])


def test_a_write_that_keeps_meeting_transactions_is_a_transient_error() -> None:
    tries = Backoff().tries
    client = StubClient(*[refused("TransactionConflictException")] * tries)
    with pytest.raises(WriteContended):
        update(client, Waits().backoff)()
    assert client.calls == tries


@pytest.mark.parametrize("code", THROTTLED)
def test_a_write_throttled_past_the_sdks_retries_is_a_transient_error(code: str) -> None:
    client = StubClient(refused(code))
    with pytest.raises(WriteContended) as raised:
        update(client, Waits().backoff)()
    assert isinstance(raised.value, TransientError) and client.calls == 1


def test_a_failed_condition_of_a_write_carries_the_item_as_it_was() -> None:
    client = StubClient(refused("ConditionalCheckFailedException", Item=OLD_JOB))
    with pytest.raises(ConditionFailed) as raised:
        update(client, Waits().backoff)()
    assert raised.value.item == OLD_JOB and client.calls == 1


class BatchStub:
    """BatchWriteItem as DynamoDB answers it under load: each call leaves its last
    `unprocessed` requests unwritten (UnprocessedItems), `throttled` calls first fail whole."""

    def __init__(self, unprocessed: int = 0, throttled: int = 0, refuse_for: int = 0) -> None:
        self.unprocessed = unprocessed
        self.throttled = throttled
        self.refuse_for = refuse_for  # calls that leave everything unprocessed
        self.calls: list[int] = []
        self.written: list[str] = []

    def batch_write_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        (table, requests), *_ = RequestItems.items()
        self.calls.append(len(requests))
        if self.throttled:
            self.throttled -= 1
            raise refused("ProvisionedThroughputExceededException", "BatchWriteItem")
        if self.refuse_for:
            self.refuse_for -= 1
            return {"UnprocessedItems": {table: requests}}
        kept = max(0, len(requests) - self.unprocessed)
        self.unprocessed = 0
        self.written += [r["PutRequest"]["Item"]["pk"]["S"] for r in requests[:kept]]
        left = requests[kept:]
        return {"UnprocessedItems": {table: left} if left else {}}


def items(count: int) -> list[dict[str, Any]]:
    return [{"pk": {"S": f"k{i}"}} for i in range(count)]


def test_batch_put_sends_25_a_call_and_retries_what_is_left_unprocessed() -> None:
    waits: list[float] = []
    stub = BatchStub(unprocessed=5, throttled=1)
    batch_put(stub, "t", items(60), Backoff(sleep=waits.append, draw=lambda: 1.0))
    assert stub.calls == [25, 25, 5, 25, 10]  # throttled whole, then 5 left over, then the rest
    assert sorted(stub.written) == sorted(f"k{i}" for i in range(60))
    assert len(waits) == 2  # before each call that sends again what was not written


def test_batch_put_gives_up_with_a_transient_error_when_items_stay_unprocessed() -> None:
    stub = BatchStub(refuse_for=10)
    with pytest.raises(WriteContended, match="25 items stayed unprocessed over 3 tries"):
        batch_put(stub, "t", items(30), Backoff(tries=3, sleep=lambda _: None))
    assert stub.calls == [25, 25, 25]
