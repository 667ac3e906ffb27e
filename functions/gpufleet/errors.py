"""The project's errors: one base, and the four kinds a caller tells apart.

Every exception gpufleet defines derives from `GpufleetError` through one of the kinds. The
kinds are for code that catches; the state machine and `domain/settlement.JOB_ERRORS` match a failed
step by its error's own class name (the Lambda runtime's `errorType`), which is why each class
keeps the name it has.

- `RefusedInput`: what was asked is wrong, or cannot be done as asked (a spec, a config file, a
  booking); the same request fails the same way again.
- `NotFound`: what was asked about does not exist.
- `Conflict`: the state is not what the request required (a condition of a write did not
  hold: a race lost, a step repeated, a job that moved on). Nothing was written.
- `TransientError`: nothing was decided (throttled, contended); the same request may succeed
  later, and a step that raises it is retried, never read as a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class GpufleetError(Exception):
    """The base of every error gpufleet raises on purpose."""


class RefusedInput(GpufleetError):
    """What was asked is wrong or cannot be done as asked: asking again fails the same way."""


class NotFound(GpufleetError):
    """What was asked about does not exist."""


class Conflict(GpufleetError):
    """The state is not what the request required: nothing was written."""


class TransientError(GpufleetError):
    """Nothing was decided (throttled, contended): the same request may succeed later."""


class ConditionFailed(Conflict):
    """A conditional write of one item found the item other than the condition required (or
    absent), and wrote nothing. `item`: the item as the write found it, when the write asked
    for it back (DynamoDB's `ReturnValuesOnConditionCheckFailure`); None when it did not, or
    there is no such item."""

    def __init__(self, message: str, item: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.item = item
