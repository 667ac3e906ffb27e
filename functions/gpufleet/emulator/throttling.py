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

`StepFunctionsRateLimits` holds `StartExecution` to Step Functions' token bucket for Standard
workflows, per account and region ("Step Functions service quotas", API action throttling): a
bucket of 1,300 refilled at 300 a second in US East (N. Virginia), US West (Oregon) and Europe
(Ireland), of 800 refilled at 150 a second in every other region. Past it, Step Functions answers
HTTP 400 `ThrottlingException`, "Rate exceeded" (its common errors; the answer public issues
quote: gchq/sleeper#4506, HumanCellAtlas/data-store#1061), in its JSON 1.0 protocol (the type in
the body; botocore's model names no such shape, so the SDK reports the type's name). The
embedded account installs it with its own clock (`patches.install`): in a demo, the bucket
refills by emulated seconds.
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


@dataclass(frozen=True)
class BucketQuota:
    """A token bucket's quota: at most `size` requests at once, `refill_per_second` after."""

    size: float
    refill_per_second: float


# Step Functions' StartExecution for Standard workflows, per account and region (the
# service quotas page, "Quotas related to API action throttling").
_LARGE_REGIONS = frozenset({"us-east-1", "us-west-2", "eu-west-1"})
START_EXECUTION_LARGE_REGIONS = BucketQuota(size=1_300, refill_per_second=300)
START_EXECUTION_OTHER_REGIONS = BucketQuota(size=800, refill_per_second=150)


def start_execution_quota(region: str) -> BucketQuota:
    """Step Functions' StartExecution bucket in `region`."""
    if region in _LARGE_REGIONS:
        return START_EXECUTION_LARGE_REGIONS
    return START_EXECUTION_OTHER_REGIONS


@dataclass
class TokenBucket:
    """`quota.refill_per_second` requests a second, at most `quota.size` of them at once; it
    starts full."""

    quota: BucketQuota
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _at: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = self.quota.size
        self._at = self.clock()

    def take(self) -> bool:
        now = self.clock()
        refilled = self._tokens + (now - self._at) * self.quota.refill_per_second
        self._tokens = min(self.quota.size, refilled)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class RateLimits:
    """Throttle the account's calls of `service`'s operations, each at its bucket's quota,
    answering a call past it with `answer(request)`; counts the calls it let through (by
    operation) and those it throttled."""

    def __init__(
        self,
        service: str,
        quotas: Mapping[str, BucketQuota],
        answer: Callable[[AWSPreparedRequest], AWSResponse],
        clock: Callable[[], float],
    ) -> None:
        self._service = service
        self._buckets = {op: TokenBucket(quota, clock) for op, quota in quotas.items()}
        self._answer = answer
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()  # the requests that got through
        self.throttled = 0

    def hooks(self) -> list[HookSpec]:
        # First: moto answers at `before-send` too, and the first answer is the one used.
        return [
            (f"before-send.{self._service}.{operation}", self, botocore.handlers.REGISTER_FIRST)
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
        return self._answer(request)


class CloudWatchRateLimits(RateLimits):
    """The account's CloudWatch calls at CloudWatch's rates (AWS documents no burst for these
    quotas: one second's worth is assumed)."""

    def __init__(
        self,
        rates: Mapping[str, float] = CLOUDWATCH_RATES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        quotas = {operation: BucketQuota(rate, rate) for operation, rate in rates.items()}
        super().__init__("cloudwatch", quotas, _cloudwatch_throttling_answer, clock)


class StepFunctionsRateLimits(RateLimits):
    """The account's StartExecution calls at Step Functions' bucket (`start_execution_quota`
    of the account's region, or a smaller one a test names)."""

    def __init__(self, start_execution: BucketQuota, clock: Callable[[], float]) -> None:
        super().__init__(
            "sfn",
            {"StartExecution": start_execution},
            _step_functions_throttling_answer,
            clock,
        )


def _cloudwatch_throttling_answer(request: AWSPreparedRequest) -> AWSResponse:
    """CloudWatch's answer to a request past its rate, in the JSON protocol botocore uses for
    CloudWatch (`x-amzn-query-mode`): the query error code is what the SDK reports."""
    return _throttling_answer(request, {"x-amzn-query-error": "Throttling;Sender"})


def _step_functions_throttling_answer(request: AWSPreparedRequest) -> AWSResponse:
    """Step Functions' answer to a request past its bucket (JSON 1.0: the type names it)."""
    return _throttling_answer(request, {})


def _throttling_answer(request: AWSPreparedRequest, headers: Mapping[str, str]) -> AWSResponse:
    url = request.url
    # Pointed away from AWS, the throttled request is one moto's stubber leaves alone: it never
    # reaches the account's service, as in AWS.
    request.url = NOWHERE
    body = json.dumps(
        {
            "__type": "com.amazon.coral.availability#ThrottlingException",
            "message": THROTTLING_MESSAGE,
        }
    ).encode()
    answered = {
        "Content-Type": "application/x-amz-json-1.0",
        "x-amzn-RequestId": "THROTTLED0000000000000000000000000000000000000000000",
        **headers,
    }
    return AWSResponse(url, 400, answered, RawBody(body))
