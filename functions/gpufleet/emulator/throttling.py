"""API rate limits of the account, which moto never applies, for the embedded account.

CloudWatch takes at most 3 `PutMetricAlarm` requests a second per account and region (a quota
that can be raised) and 3 `DeleteAlarms` (one that cannot), and 50 `GetMetricData`
("CloudWatch service quotas", recorded in design.md; the GetMetricData knowledge-center article
gives its 50 TPS and 180,000 data points a second). Past it, CloudWatch answers HTTP 400 with
the error code `Throttling` and the message "Rate exceeded" (the answers public issues quote:
aws/aws-cli#3002, hortonworks/cloudbreak#10689). botocore speaks CloudWatch's JSON protocol in
its query compatible form, so the answer here is that protocol's: the type in the body, and the
query error code the SDK reports in `x-amzn-query-error`.

`CloudWatchRateLimits` holds each operation to a token bucket at AWS's rate, at the SDK's edge
(`before-send`, inside botocore's retry loop, as `faults.DynamoThrottling` answers): the client's
retry policy sees exactly what CloudWatch sends. Every request that is not the emulator's own
(the stack's resources, which CloudFormation creates) draws from the account's bucket. It is
installed like the faults, for the clients created inside `faults.injected(...)`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import botocore.handlers
from botocore.awsrequest import AWSPreparedRequest, AWSResponse

from gpufleet.emulator.faults import NOWHERE, HookSpec, RawBody
from gpufleet.emulator.patches import EMULATOR, current_actor

# Requests a second per account and region (CloudWatch service quotas).
CLOUDWATCH_RATES: Mapping[str, float] = {
    "PutMetricAlarm": 3.0,
    "DeleteAlarms": 3.0,
    "GetMetricData": 50.0,
}
THROTTLING_MESSAGE = "Rate exceeded"


@dataclass
class TokenBucket:
    """`rate` requests a second, at most `rate` of them at once (AWS does not document a burst
    for these quotas: one second's worth is assumed)."""

    rate: float
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _at: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = self.rate
        self._at = self.clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class CloudWatchRateLimits:
    """Throttle the account's CloudWatch calls at CloudWatch's rates; counts the calls it let
    through (by operation) and those it throttled."""

    def __init__(
        self,
        rates: Mapping[str, float] = CLOUDWATCH_RATES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._buckets = {operation: TokenBucket(rate, clock) for operation, rate in rates.items()}
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()  # the requests that got through
        self.throttled = 0

    def hooks(self) -> list[HookSpec]:
        # First: moto answers at `before-send` too, and the first answer is the one used.
        return [
            (f"before-send.cloudwatch.{operation}", self, botocore.handlers.REGISTER_FIRST)
            for operation in self._buckets
        ]

    def __call__(
        self, request: AWSPreparedRequest, event_name: str, **_: object
    ) -> AWSResponse | None:
        if current_actor() == EMULATOR:
            return None
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            if self._buckets[operation].take():
                self.calls[operation] += 1
                return None
            self.throttled += 1
        return _throttling_answer(request)


def _throttling_answer(request: AWSPreparedRequest) -> AWSResponse:
    """CloudWatch's answer to a request past its rate, in the JSON protocol botocore uses for
    CloudWatch (`x-amzn-query-mode`): the query error code is what the SDK reports."""
    url = request.url
    # Pointed away from AWS, the throttled request is one moto's stubber leaves alone: it never
    # reaches the account's CloudWatch, as in CloudWatch.
    request.url = NOWHERE
    body = json.dumps(
        {
            "__type": "com.amazon.coral.availability#ThrottlingException",
            "message": THROTTLING_MESSAGE,
        }
    ).encode()
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "x-amzn-query-error": "Throttling;Sender",
        "x-amzn-RequestId": "THROTTLED0000000000000000000000000000000000000000000",
    }
    return AWSResponse(url, 400, headers, RawBody(body))
