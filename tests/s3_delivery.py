"""Late S3 notifications: S3 delivers them asynchronously, possibly after later uploads to the
same key. The embedded account delivers each within its upload; a test can hold them back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def held_s3_notifications() -> Iterator[list[Callable[[], None]]]:
    """The notifications of the uploads made inside the block, held back: each is a call that
    delivers it (the account's own delivery, with Lambda's retries) when the test makes it."""
    from moto.s3 import notifications

    held: list[Callable[[], None]] = []
    deliver = notifications._invoke_awslambda

    def hold(*args: Any) -> None:
        held.append(lambda: deliver(*args))

    notifications._invoke_awslambda = hold
    try:
        yield held
    finally:
        notifications._invoke_awslambda = deliver
