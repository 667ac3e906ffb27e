"""DynamoDB's cancelled transactions, injected at the SDK's edge of one client: moto never
cancels one for throughput or for another writer."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.awsrequest import AWSResponse

from gpufleet.topology import QUEUE_STATE_PARTITION

_MESSAGES = {
    "TransactionConflict": "Transaction is ongoing for the item",
    "ThrottlingError": "Throughput exceeds the current capacity of your table or index.",
    "ProvisionedThroughputExceeded": (
        "The level of configured provisioned throughput for the table was exceeded."
    ),
}


def _hot_item(items: list[dict[str, Any]]) -> int:
    """The item that meets the others or runs out of throughput first: the queue's usage item,
    which every enqueue, admission and release writes (else the last)."""
    for index, item in enumerate(items):
        (action,) = item.values()
        key = action.get("Key") or action.get("Item", {})
        if key.get("pk", {}).get("S") == QUEUE_STATE_PARTITION and key.get("sk", {}).get(
            "S", ""
        ).startswith("usage#global"):
            return index
    return len(items) - 1


@contextmanager
def cancelled_first_tries(client: Any, code: str, tries: int = 1) -> Iterator[Counter[str]]:
    """Each transaction the client sends has its first `tries` tries cancelled as DynamoDB
    cancels one with `code` on its hot item: TransactionCanceledException, that reason for the
    item and `None` for the others. A transaction is its items (the SDK's idempotency token
    differs between tries). Yields how often each transaction was cancelled."""
    cancelled: Counter[str] = Counter()

    def cancel(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        items = json.loads(params["body"])["TransactItems"]
        transaction = json.dumps(items, sort_keys=True)
        if cancelled[transaction] >= tries:
            return None
        cancelled[transaction] += 1
        reasons: list[dict[str, str]] = [{"Code": "None"} for _ in items]
        reasons[_hot_item(items)] = {"Code": code, "Message": _MESSAGES[code]}
        parsed = {
            "Error": {
                "Code": "TransactionCanceledException",
                "Message": "Transaction cancelled, please refer cancellation reasons for "
                f"specific reasons [{', '.join(r['Code'] for r in reasons)}]",
            },
            "CancellationReasons": reasons,
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
        return AWSResponse("https://dynamodb", 400, {}, None), parsed

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", cancel)
    try:
        yield cancelled
    finally:
        client.meta.events.unregister("before-call.dynamodb.TransactWriteItems", cancel)


@contextmanager
def writes_in_a_transaction(client: Any, operation: str, times: int = 1) -> Iterator[list[str]]:
    """The client's next `times` calls of `operation` (`UpdateItem`, `PutItem`, `DeleteItem`)
    fail as DynamoDB fails a write to an item an ongoing transaction holds:
    `TransactionConflictException`, which the SDK's standard retry mode does not retry. Yields
    the operations it failed."""
    failed: list[str] = []

    def conflict(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if len(failed) >= times:
            return None
        failed.append(operation)
        parsed = {
            "Error": {
                "Code": "TransactionConflictException",
                "Message": "Transaction is ongoing for the item",
            },
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
        return AWSResponse("https://dynamodb", 400, {}, None), parsed

    event = f"before-call.dynamodb.{operation}"
    client.meta.events.register(event, conflict)
    try:
        yield failed
    finally:
        client.meta.events.unregister(event, conflict)
