"""A burst of launches against CloudWatch's alarm rates (3 PutMetricAlarm and 3 DeleteAlarms a
second per account and region), with the account's rates applied by the emulator
(`emulator/throttling.py`) on a simulated clock: every job gets its alarms, paced to the quota,
and its release deletes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from gpufleet.adapters.aws.alarms import CloudWatchAlarms, alarm_name
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.scaling import job_alarm_rules
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator.faults import injected
from gpufleet.emulator.throttling import CloudWatchRateLimits

BURST = 20
SPEC = parse_spec(
    "name: a\nteam: t\nimage: img:1\ncommand: [python]\n"
    "resources: {gpus: 1, elastic: {max_nodes: 2}}\n"
    "scale_on: {metric: samples_per_second, below: 1000, for_minutes: 10}\n"
)
POLICY = MetricPolicy()


class SimulatedClock:
    """The seconds CloudWatch's rates are counted in: time passes only when the code sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimulatedClock:
    simulated = SimulatedClock()
    monkeypatch.setattr("time.sleep", simulated.sleep)
    return simulated


@pytest.fixture
def throttled(clock: SimulatedClock) -> Iterator[tuple[Any, CloudWatchRateLimits]]:
    """A CloudWatch client of an account that throttles at CloudWatch's rates; without the
    SDK's own retries, so that every throttle reaches the code under test."""
    limits = CloudWatchRateLimits(clock=clock)
    with mock_aws(), injected(limits):
        client = boto3.session.Session().client(
            "cloudwatch", region_name="us-east-1", config=Config(retries={"total_max_attempts": 1})
        )
        yield client, limits


def test_a_burst_of_launches_gets_every_alarm_at_cloudwatchs_rate(
    throttled: tuple[Any, CloudWatchRateLimits], clock: SimulatedClock
) -> None:
    client, limits = throttled
    alarms = CloudWatchAlarms(client)
    jobs = [f"j-{index:020x}" for index in range(BURST)]
    for job_id in jobs:
        alarms.create(job_id, SPEC, POLICY)
    rules = job_alarm_rules(SPEC, POLICY)
    expected = {alarm_name(job_id, rule.kind) for job_id in jobs for rule in rules}
    assert len(expected) == BURST * 5
    # CloudWatch did throttle: 100 alarms at once are more than 3 a second.
    assert limits.throttled > 0
    pages = client.get_paginator("describe_alarms").paginate()
    assert {a["AlarmName"] for page in pages for a in page["MetricAlarms"]} == expected
    assert sorted(limits.created) == sorted(expected)  # each put once it got through
    # Paced to the quota: 100 requests at 3 a second (3 at once) take at least 32 s.
    assert clock.now >= (len(expected) - 3) / 3

    for job_id in jobs:
        alarms.delete(job_id)
    assert client.describe_alarms()["MetricAlarms"] == []
    assert set(limits.deleted) >= expected


def test_a_throttle_that_outlasts_the_patience_is_raised(
    throttled: tuple[Any, CloudWatchRateLimits],
) -> None:
    client, _ = throttled
    patient, impatient = CloudWatchAlarms(client), CloudWatchAlarms(client, patience_seconds=0)
    patient.create("j-" + "0" * 20, SPEC, POLICY)  # 5 calls: the account's second is spent
    with pytest.raises(ClientError, match="Rate exceeded"):
        impatient.create("j-" + "1" * 20, SPEC, POLICY)
