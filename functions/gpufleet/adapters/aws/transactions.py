"""DynamoDB writes as the control plane makes them, and what their refusals mean.

A transaction (`transact`) is all or nothing. DynamoDB cancels one with a reason per item
(`CancellationReasons`, in the order of the items): its condition failed, it met another
transaction on the same item, the table or an index was throttled, the request was invalid.
Only a failed condition says something about the state (a verdict: `ConditionsFailed`, naming
each item's reason). A conflict or a throttle says nothing: the transaction is tried again with
jittered backoff, and when the tries run out the caller gets a transient error
(`QueueContended`), never a verdict. Any other reason is a fault of the request
(`TransactionRefused`).

A single-item write (`write`) that meets a transaction on its item fails with
`TransactionConflictException`, which the SDK's standard retry mode does not retry (it retries
throttling): it is tried again the same way, and its failed condition is `ConditionFailed`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.errors import ConditionFailed, GpufleetError, TransientError


class CancellationReason(StrEnum):
    """The codes of DynamoDB's `CancellationReasons[].Code` (TransactWriteItems API reference);
    `UNKNOWN` stands for a code this list does not have."""

    NONE = "None"  # this item had no error: another one cancelled the transaction
    CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailed"
    TRANSACTION_CONFLICT = "TransactionConflict"
    THROTTLING_ERROR = "ThrottlingError"  # an on-demand table or index scaling up
    PROVISIONED_THROUGHPUT_EXCEEDED = "ProvisionedThroughputExceeded"
    VALIDATION_ERROR = "ValidationError"
    ITEM_COLLECTION_SIZE_LIMIT_EXCEEDED = "ItemCollectionSizeLimitExceeded"
    UNKNOWN = "Unknown"

    @classmethod
    def of(cls, code: str) -> CancellationReason:
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


# Reasons that say nothing about the items: the same transaction may go through when tried again.
RETRIED = frozenset(
    {
        CancellationReason.TRANSACTION_CONFLICT,
        CancellationReason.THROTTLING_ERROR,
        CancellationReason.PROVISIONED_THROUGHPUT_EXCEEDED,
    }
)
# What a single-item request answers when DynamoDB throttles it (after the SDK's own retries)
# or when a transaction holds its item.
_THROTTLED_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
_CONFLICT_CODE = "TransactionConflictException"


@dataclass(frozen=True)
class ItemReason:
    """Why one item of a cancelled transaction did not go through (`NONE`: it would have)."""

    reason: CancellationReason
    code: str  # as DynamoDB sent it (an UNKNOWN reason's own code)
    message: str = ""
    item: Mapping[str, Any] | None = None  # as it was, when the item's write asked for it back


class TransactionCancelled(GpufleetError):
    """DynamoDB cancelled a transaction: nothing of it was written. `reasons`: each item's, in
    the order of the items."""

    def __init__(self, reasons: Sequence[ItemReason], message: str = "") -> None:
        codes = ", ".join(r.code for r in reasons)
        super().__init__(f"{message or 'transaction cancelled'}" + (f" [{codes}]" if codes else ""))
        self.reasons = tuple(reasons)

    def failed(self, position: int) -> bool:
        """Whether the condition of the item at `position` failed."""
        return (
            position < len(self.reasons)
            and self.reasons[position].reason is CancellationReason.CONDITIONAL_CHECK_FAILED
        )

    @property
    def failed_positions(self) -> frozenset[int]:
        return frozenset(i for i in range(len(self.reasons)) if self.failed(i))


class ConditionsFailed(TransactionCancelled, ConditionFailed):
    """A verdict: the conditions of the items `failed_positions` name did not hold, and every
    other item's reason is `NONE`."""

    def __init__(self, reasons: Sequence[ItemReason]) -> None:
        TransactionCancelled.__init__(self, reasons, "conditions failed")


class QueueContended(TransactionCancelled, TransientError):
    """The transaction was still cancelled for other transactions or for throughput after every
    try (or its request was throttled past the SDK's retries): nothing was decided. The caller
    (a Lambda) fails and is retried."""


class TransactionRefused(TransactionCancelled):
    """Cancelled for a reason no retry changes (`ValidationError`,
    `ItemCollectionSizeLimitExceeded`, or a code this adapter does not know): a fault of the
    request, never a verdict on the state."""


class WriteContended(TransientError):
    """A single-item write still met a transaction on its item after every try, or DynamoDB
    still throttled it after the SDK's retries: nothing was written."""


@dataclass(frozen=True)
class Backoff:
    """Tries of a write that DynamoDB refused for throughput or for another writer, with a wait
    before each retry drawn uniformly up to `base_seconds` * 2^n, at most `cap_seconds` ("full
    jitter": writers that collided do not collide again in step). Milliseconds, as the SDK
    backs off on throttling: not a wait for work. CloudWatch's metric reads draw their waits
    from one too (`metric_data`)."""

    tries: int = 6
    base_seconds: float = 0.05
    cap_seconds: float = 1.0
    sleep: Callable[[float], None] = time.sleep
    draw: Callable[[], float] = random.random

    def delay(self, retry: int) -> float:
        """The wait before retry `retry` (0 for the first)."""
        return float(self.draw() * min(self.cap_seconds, self.base_seconds * 2**retry))

    def wait(self, retry: int) -> None:
        self.sleep(self.delay(retry))


BACKOFF = Backoff()


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _reasons(exc: ClientError) -> list[ItemReason]:
    return [
        ItemReason(
            reason=CancellationReason.of(str(entry.get("Code", ""))),
            code=str(entry.get("Code", "")),
            message=str(entry.get("Message", "")),
            item=entry.get("Item"),
        )
        for entry in exc.response.get("CancellationReasons", [])
    ]


def transact(client: Any, items: list[dict[str, Any]], backoff: Backoff = BACKOFF) -> None:
    """One transaction, written whole, or raise why not: `ConditionsFailed` (a verdict),
    `QueueContended` (tried `backoff.tries` times, cancelled each time for other transactions
    or throughput: no verdict) or `TransactionRefused` (an invalid request)."""
    reasons: list[ItemReason] = []
    for retry in range(backoff.tries):
        if retry:
            backoff.wait(retry - 1)
        try:
            client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            code = _error_code(exc)
            if code in _THROTTLED_CODES:  # the request itself, past the SDK's retries
                raise QueueContended([], f"the transaction was throttled: {code}") from exc
            if code != "TransactionCanceledException":
                raise
            reasons = _reasons(exc)
            kinds = {r.reason for r in reasons}
            unexplained = (
                kinds
                - RETRIED
                - {
                    CancellationReason.NONE,
                    CancellationReason.CONDITIONAL_CHECK_FAILED,
                }
            )
            if unexplained or not kinds - {CancellationReason.NONE}:
                raise TransactionRefused(reasons) from exc
            if kinds & RETRIED:
                # An item was not evaluated (throttled) or met another writer: the conditions
                # the others report may not be the whole story, so it is all tried again.
                continue
            raise ConditionsFailed(reasons) from exc
        return
    raise QueueContended(reasons, f"cancelled over {backoff.tries} tries")


def written(client: Any, items: list[dict[str, Any]], backoff: Backoff = BACKOFF) -> bool:
    """`transact`, for a caller to whom any failed condition means the same: False when one
    failed (nothing written)."""
    try:
        transact(client, items, backoff)
    except ConditionsFailed:
        return False
    return True


def write(
    operation: Callable[..., dict[str, Any]], backoff: Backoff = BACKOFF, **request: Any
) -> dict[str, Any]:
    """One single-item write (`client.put_item`, `update_item`, `delete_item` with its
    request); its response. Raise `ConditionFailed` when its condition did not hold (with the
    item as it was, when the request asked for it back), `WriteContended` when it still met a
    transaction on its item after `backoff.tries` tries, or DynamoDB throttled it past the
    SDK's retries."""
    for retry in range(backoff.tries):
        if retry:
            backoff.wait(retry - 1)
        try:
            return operation(**request)
        except ClientError as exc:
            code = _error_code(exc)
            if code == "ConditionalCheckFailedException":
                raise ConditionFailed(
                    f"the condition of the write to {request.get('TableName')} failed",
                    exc.response.get("Item"),
                ) from exc
            if code in _THROTTLED_CODES:
                raise WriteContended(f"the write was throttled: {code}") from exc
            if code != _CONFLICT_CODE:
                raise
    raise WriteContended(f"the item stayed in transactions over {backoff.tries} tries")


# BatchWriteItem takes at most this many requests a call (and refuses two of one key).
MAX_BATCH_WRITE = 25
# BatchGetItem: at most 100 keys a call (and 16 MB of items; the attributes read here are few).
MAX_BATCH_GET = 100


def _until_processed(
    send: Callable[[Any], Any],
    pending: Any,
    backoff: Backoff,
    unfinished: Callable[[Any], TransientError],
) -> None:
    """Call `send` with what is `pending` (it answers what the call left unprocessed, falsy
    when nothing), again after `backoff`'s wait while something is left or the call was
    throttled whole; raise `unfinished(what is left)` after `backoff.tries` tries."""
    for retry in range(backoff.tries):
        if retry:
            backoff.wait(retry - 1)
        try:
            pending = send(pending)
        except ClientError as exc:
            if _error_code(exc) not in _THROTTLED_CODES:
                raise
            continue
        if not pending:
            return
    raise unfinished(pending)


def batch_put(
    client: Any, table: str, items: Sequence[Mapping[str, Any]], backoff: Backoff = BACKOFF
) -> None:
    """Put every item, unconditionally (BatchWriteItem takes no condition), 25 a call. What a
    call leaves in `UnprocessedItems` (throughput), or a call throttled whole, is sent again
    after `backoff`'s wait; raise `WriteContended` when some is still unwritten after
    `backoff.tries` tries of one call (what was written stays: each put is idempotent)."""

    def send(pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = client.batch_write_item(RequestItems={table: pending})
        left: list[dict[str, Any]] = response.get("UnprocessedItems", {}).get(table, [])
        return left

    for start in range(0, len(items), MAX_BATCH_WRITE):
        batch = [{"PutRequest": {"Item": item}} for item in items[start : start + MAX_BATCH_WRITE]]
        _until_processed(
            send,
            batch,
            backoff,
            lambda left: WriteContended(
                f"{len(left)} items stayed unprocessed over {backoff.tries} tries"
            ),
        )


class ReadContended(TransientError):
    """A batch read still had keys DynamoDB left unprocessed (throughput) after every try."""


def batch_get(
    client: Any,
    table: str,
    keys: Sequence[Mapping[str, Any]],
    attributes: Sequence[str],
    backoff: Backoff = BACKOFF,
) -> list[dict[str, Any]]:
    """The items of `keys` that exist (only `attributes`, read consistently), 100 keys a call.
    What a call leaves in `UnprocessedKeys`, or a call throttled whole, is asked again after
    `backoff`'s wait; raise `ReadContended` when some is still unread after `backoff.tries`."""
    names = {f"#a{i}": name for i, name in enumerate(attributes)}
    found: list[dict[str, Any]] = []

    def send(request: dict[str, Any]) -> dict[str, Any] | None:
        response = client.batch_get_item(RequestItems={table: request})
        found.extend(response.get("Responses", {}).get(table, []))
        left: dict[str, Any] | None = response.get("UnprocessedKeys", {}).get(table)
        return left

    for start in range(0, len(keys), MAX_BATCH_GET):
        request = {
            "Keys": list(keys[start : start + MAX_BATCH_GET]),
            "ConsistentRead": True,
            "ProjectionExpression": ", ".join(names),
            "ExpressionAttributeNames": names,
        }
        _until_processed(
            send,
            request,
            backoff,
            lambda left: ReadContended(
                f"{len(left['Keys'])} keys stayed unprocessed over {backoff.tries} tries"
            ),
        )
    return found
