"""DynamoDB transactions as the control plane uses them: all or nothing, with the positions of
the items whose condition failed, and collisions with other writers tried again."""

from __future__ import annotations

import random
import time
from typing import Any

from botocore.exceptions import ClientError

# Tries of a transaction that collided with another on the same item, with jittered backoff.
_CONFLICT_RETRIES = 5


class QueueContended(Exception):
    """Transactions kept colliding: the caller (a Lambda) fails and is retried."""


def transact(client: Any, items: list[dict[str, Any]]) -> frozenset[int]:
    """One transaction; the positions of the items whose condition failed (none: it was
    written). A transaction that collided with another on the same item (the queue's shared
    usage item) is tried again: it says nothing about the conditions."""
    for attempt in range(_CONFLICT_RETRIES):
        try:
            client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = exc.response.get("CancellationReasons", [])
            failed = frozenset(
                index
                for index, reason in enumerate(reasons)
                if reason.get("Code") == "ConditionalCheckFailed"
            )
            if failed:
                return failed
            if any(reason.get("Code") == "TransactionConflict" for reason in reasons):
                # Milliseconds, as the SDK backs off on throttling: not a wait for work.
                time.sleep(random.uniform(0, 0.05 * 2**attempt))
                continue
            return frozenset(range(len(items)))  # cancelled for a reason it did not name
        return frozenset()
    raise QueueContended(f"the queue stayed contended over {_CONFLICT_RETRIES} tries")
