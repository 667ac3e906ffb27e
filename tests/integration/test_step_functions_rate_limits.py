"""Step Functions' StartExecution bucket as the embedded account applies it
(`emulator/throttling.py:StepFunctionsRateLimits`), on a simulated clock: the calls past the
bucket are answered as Step Functions answers them, and the workflow adapter reads that answer
as nothing started (`TransientError`, which the dispatcher's passes wait out)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from gpufleet.adapters.aws.workflow import StepFunctionsWorkflow
from gpufleet.emulator.faults import injected
from gpufleet.emulator.throttling import (
    START_EXECUTION_LARGE_REGIONS,
    START_EXECUTION_OTHER_REGIONS,
    BucketQuota,
    StepFunctionsRateLimits,
    start_execution_quota,
)
from gpufleet.errors import TransientError

DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}})
ROLE = "arn:aws:iam::123456789012:role/sfn"


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock()


@pytest.fixture
def throttled(clock: SimulatedClock) -> Iterator[tuple[Any, str, StepFunctionsRateLimits]]:
    """A Step Functions client of an account whose bucket holds 3 starts, refilled at 2 a
    second; without the SDK's own retries, so that every throttle reaches the code."""
    limits = StepFunctionsRateLimits(BucketQuota(size=3, refill_per_second=2), clock)
    with mock_aws(), injected(limits):
        client = boto3.session.Session().client(
            "stepfunctions",
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1}),
        )
        arn = client.create_state_machine(name="m", definition=DEFINITION, roleArn=ROLE)[
            "stateMachineArn"
        ]
        yield client, arn, limits


def test_starts_past_the_bucket_are_refused_as_step_functions_refuses_them(
    throttled: tuple[Any, str, StepFunctionsRateLimits], clock: SimulatedClock
) -> None:
    client, arn, limits = throttled
    for name in ("a", "b", "c"):  # the bucket's 3 at once
        client.start_execution(stateMachineArn=arn, name=name)
    with pytest.raises(ClientError) as refused:
        client.start_execution(stateMachineArn=arn, name="d")
    error = refused.value.response
    assert error["Error"] == {"Code": "ThrottlingException", "Message": "Rate exceeded"}
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    # The refused start never reached the account.
    started = client.list_executions(stateMachineArn=arn)["executions"]
    assert {e["name"] for e in started} == {"a", "b", "c"}
    clock.now += 0.5  # one token back
    client.start_execution(stateMachineArn=arn, name="d")
    with pytest.raises(ClientError, match="ThrottlingException"):
        client.start_execution(stateMachineArn=arn, name="e")
    assert (limits.calls["StartExecution"], limits.throttled) == (4, 2)


def test_a_throttled_start_is_transient_for_the_workflow_adapter(
    throttled: tuple[Any, str, StepFunctionsRateLimits],
) -> None:
    client, arn, _ = throttled
    workflow = StepFunctionsWorkflow(client, arn)
    for index in range(3):
        workflow.start(f"j-{index:020x}", {})
    with pytest.raises(TransientError, match="StartExecution was throttled"):
        workflow.start(f"j-{3:020x}", {})


def test_the_bucket_is_the_regions() -> None:
    assert start_execution_quota("us-east-1") == BucketQuota(1_300, 300)
    assert start_execution_quota("eu-west-1") == START_EXECUTION_LARGE_REGIONS
    assert start_execution_quota("ap-southeast-2") == BucketQuota(800, 150)
    assert start_execution_quota("eu-central-1") == START_EXECUTION_OTHER_REGIONS
