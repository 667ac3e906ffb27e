"""MetricWatch's reads against CloudWatch's rates and limits, applied by the emulator
(`emulator/throttling.py`, `emulator/cloudwatch_rules.py`) on a simulated clock: 50
GetMetricData a second, at most 500 queries a call; and the alarm writes no code makes any more
(3 PutMetricAlarm and 3 DeleteAlarms a second, alarm windows of a day or a week) still held
to what CloudWatch allows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from gpufleet.adapters.aws.metric_data import CloudWatchMetricData, metric_data_query
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.scaling import (
    MAX_QUERIES_PER_CALL,
    SeriesQuery,
    job_alarm_rules,
    metric_batches,
    watched_series,
)
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator import cloudwatch_rules
from gpufleet.emulator.faults import injected
from gpufleet.emulator.throttling import CloudWatchRateLimits
from gpufleet.topology import GPU_UTILIZATION_METRIC

SPEC = parse_spec("name: a\nteam: t\nimage: img:1\ncommand: [python]\n")
NOW = 1_767_225_600.0


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
    """A CloudWatch client of an account that throttles at CloudWatch's rates and refuses what
    it refuses; without the SDK's own retries, so that every throttle reaches the code."""
    limits = CloudWatchRateLimits(clock=clock)
    with mock_aws(), injected(limits):
        client = boto3.session.Session().client(
            "cloudwatch", region_name="us-east-1", config=Config(retries={"total_max_attempts": 1})
        )
        for event, hook in cloudwatch_rules.hooks():
            client.meta.events.register(event, hook)
        yield client, limits


def test_a_pass_over_10000_running_jobs_reads_them_all_at_getmetricdatas_rate(
    throttled: tuple[Any, CloudWatchRateLimits], clock: SimulatedClock
) -> None:
    client, limits = throttled
    rules = job_alarm_rules(SPEC, MetricPolicy())
    wanted = watched_series({f"j-{index:020x}": rules for index in range(10_000)})
    batches = metric_batches(wanted, NOW)
    reader = CloudWatchMetricData(client)
    # 60 calls at once are more than CloudWatch's 50 a second: some are throttled, and tried
    # again until they get through.
    for batch in batches:
        read = reader.read(batch)
        assert set(read) == set(batch.queries)
        assert not any(read.values())  # no job published anything
    assert limits.calls["GetMetricData"] == len(batches) == 60
    assert limits.throttled > 0
    assert clock.now >= (len(batches) - 50) / 50


def test_a_call_of_more_than_500_queries_is_refused(
    throttled: tuple[Any, CloudWatchRateLimits],
) -> None:
    client, _ = throttled
    queries = [
        metric_data_query(
            f"q{index}", SeriesQuery(f"j-{index}", GPU_UTILIZATION_METRIC, "Average", 60)
        )
        for index in range(MAX_QUERIES_PER_CALL + 1)
    ]
    window = {"StartTime": NOW - 600, "EndTime": NOW}
    with pytest.raises(ClientError, match="must not have a size greater than 500") as refused:
        client.get_metric_data(MetricDataQueries=queries, **window)
    assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
    answer = client.get_metric_data(MetricDataQueries=queries[:MAX_QUERIES_PER_CALL], **window)
    assert len(answer["MetricDataResults"]) == MAX_QUERIES_PER_CALL


def test_a_throttle_that_outlasts_the_patience_is_raised(
    throttled: tuple[Any, CloudWatchRateLimits],
) -> None:
    client, _ = throttled
    batch = metric_batches(watched_series({"j-1": job_alarm_rules(SPEC, MetricPolicy())}), NOW)[0]
    patient, impatient = CloudWatchMetricData(client), CloudWatchMetricData(client, 0)
    for _ in range(50):
        patient.read(batch)  # the account's second is spent
    with pytest.raises(ClientError, match="Rate exceeded"):
        impatient.read(batch)


def test_alarm_writes_are_still_throttled_at_3_a_second(
    throttled: tuple[Any, CloudWatchRateLimits],
) -> None:
    client, limits = throttled
    alarm = {
        "Namespace": "GpuFleet/Jobs",
        "MetricName": GPU_UTILIZATION_METRIC,
        "Statistic": "Average",
        "Period": 60,
        "EvaluationPeriods": 1,
        "Threshold": 1.0,
        "ComparisonOperator": "LessThanThreshold",
    }
    for index in range(3):
        client.put_metric_alarm(AlarmName=f"a-{index}", **alarm)
    with pytest.raises(ClientError, match="Rate exceeded"):
        client.put_metric_alarm(AlarmName="a-3", **alarm)
    client.delete_alarms(AlarmNames=["a-0"])
    assert limits.calls == {"PutMetricAlarm": 3, "DeleteAlarms": 1}


@pytest.mark.parametrize(
    ("period", "periods"),
    [(120, 721), (3600, 169)],  # a day and two minutes; a week and an hour
)
def test_the_account_refuses_an_alarm_window_past_cloudwatchs(
    throttled: tuple[Any, CloudWatchRateLimits], period: int, periods: int
) -> None:
    client, _ = throttled
    name = f"too-long-{period}"
    with pytest.raises(ClientError, match="ValidationError"):
        client.put_metric_alarm(
            AlarmName=name,
            Namespace="GpuFleet/Jobs",
            MetricName=GPU_UTILIZATION_METRIC,
            Statistic="Average",
            Period=period,
            EvaluationPeriods=periods,
            Threshold=1.0,
            ComparisonOperator="LessThanThreshold",
        )
    assert client.describe_alarms(AlarmNames=[name])["MetricAlarms"] == []
