"""Alarm -> action on the embedded account: the per-job alarms CloudWatch holds (moto), the
emulator's evaluation of them, the real `CloudWatch Alarm State Change` event on the default bus,
the GpuAlarmRule, the MetricAlarm function (the real handler) and what it does to the job."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.adapters.aws.alarms import CloudWatchAlarms, alarm_name
from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.scaling import AlarmKind
from gpufleet.domain.settlement import MEMORY_LEAK, RESIZED
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator.account import Account
from gpufleet.emulator.alarms import AlarmEvaluator
from gpufleet.topology import (
    DETAIL_ALARM_STATE_CHANGE,
    GPU_MEMORY_METRIC,
    GPU_UTILIZATION_METRIC,
    JOB_DIMENSION,
    JOBS_TABLE,
    METRICS_NAMESPACE,
)
from tests.helpers import subscribe

# One period of 10 s: the emulator's evaluation sees a breach at once.
POLICY = MetricPolicy(period_seconds=10, high_utilization_periods=1, memory_leak_periods=1)
_jobs = iter(range(1, 1_000_000))


@pytest.fixture(scope="module")
def store(account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


@pytest.fixture(scope="module")
def alarm_events(account: Account) -> Callable[[], list[dict[str, Any]]]:
    """Every alarm state change put on the default bus, as a subscriber would see it."""
    return subscribe(account, "alarm-events", {"detail-type": [DETAIL_ALARM_STATE_CHANGE]})


def running_job(store: DynamoJobStore, body: str = "") -> str:
    job_id = f"j-{next(_jobs):020x}"
    spec = parse_spec(f"name: train\nteam: vision\nimage: img\ncommand: [python]\n{body}")
    now = time.time()
    placement = Placement(
        instance_ids=["i-0123456789abcdef0"],
        instance_type="g5.xlarge",
        capacity_type="spot",
        hourly_usd=0.5,
        launched_at=now,
    )
    job = Job(
        job_id=job_id,
        status=JobStatus.RUNNING,
        spec=spec,
        source="test",
        created_at=now,
        updated_at=now,
        placement=placement,
    )
    assert store.put_new(job)
    return job_id


def publish(account: Account, job_id: str, metric: str, values: list[float]) -> None:
    """One datapoint per 10 s period, the last in the current period."""
    now = datetime.now(UTC)
    account.client("cloudwatch").put_metric_data(
        Namespace=METRICS_NAMESPACE,
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [{"Name": JOB_DIMENSION, "Value": job_id}],
                "Timestamp": now - timedelta(seconds=10 * (len(values) - 1 - n) + 1),
                "Value": value,
            }
            for n, value in enumerate(values)
        ],
    )


def eventually(check: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_an_elastic_job_gets_its_alarms_and_the_leak_alarm_is_metric_math(
    account: Account, store: DynamoJobStore
) -> None:
    job_id = running_job(
        store,
        "resources: {gpus: 1, nodes: 1, elastic: {max_nodes: 2}}\n"
        "scale_on: {metric: samples_per_second, below: 1000, for_minutes: 1}\n",
    )
    alarms = CloudWatchAlarms(account.client("cloudwatch"))
    alarms.create(job_id, store.get(job_id).effective_spec, POLICY)
    cloudwatch = account.client("cloudwatch")
    described = {
        a["AlarmName"]: a
        for a in cloudwatch.describe_alarms(AlarmNamePrefix=f"gpufleet-{job_id}")["MetricAlarms"]
    }
    assert set(described) == {alarm_name(job_id, kind) for kind in AlarmKind}
    leak = described[alarm_name(job_id, AlarmKind.LEAK)]
    [expression] = [m for m in leak["Metrics"] if m.get("ReturnData")]
    assert expression["Expression"] == "DIFF(m1)"
    [memory] = [m for m in leak["Metrics"] if "MetricStat" in m]
    assert memory["MetricStat"]["Metric"]["MetricName"] == GPU_MEMORY_METRIC
    own = described[alarm_name(job_id, AlarmKind.SCALE_ON)]
    assert (own["MetricName"], own["EvaluationPeriods"]) == ("samples_per_second", 6)
    alarms.delete(job_id)
    assert cloudwatch.describe_alarms(AlarmNamePrefix=f"gpufleet-{job_id}")["MetricAlarms"] == []


@pytest.mark.parametrize(
    ("period", "periods"),
    [(120, 721), (3600, 169)],  # a day and two minutes; a week and an hour
)
def test_the_account_refuses_an_alarm_window_past_cloudwatchs(
    account: Account, period: int, periods: int
) -> None:
    cloudwatch = account.client("cloudwatch")
    name = f"too-long-{period}"
    with pytest.raises(ClientError, match="ValidationError"):
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace="GpuFleet/Jobs",
            MetricName=GPU_MEMORY_METRIC,
            Statistic="Maximum",
            Period=period,
            EvaluationPeriods=periods,
            Threshold=1.0,
            ComparisonOperator="GreaterThanThreshold",
        )
    assert cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"] == []


def test_busy_gpus_scale_an_elastic_job_out_through_the_alarm_and_its_event(
    account: Account, store: DynamoJobStore, alarm_events: Callable[[], list[dict[str, Any]]]
) -> None:
    job_id = running_job(store, "resources: {gpus: 1, nodes: 1, elastic: {max_nodes: 3}}\n")
    CloudWatchAlarms(account.client("cloudwatch")).create(
        job_id, store.get(job_id).effective_spec, POLICY
    )
    publish(account, job_id, GPU_UTILIZATION_METRIC, [96.0])
    AlarmEvaluator(account).tick()

    def scaled() -> bool:
        override = store.get(job_id).resources_override
        return override is not None and override.nodes == 2

    assert eventually(scaled)
    job = store.get(job_id)
    assert job.drain_reason == RESIZED and job.flags == ["scaled-out"]
    seen = [e for e in alarm_events() if e["detail"]["alarmName"].startswith(f"gpufleet-{job_id}")]
    assert [e["detail"]["alarmName"] for e in seen] == [alarm_name(job_id, AlarmKind.BUSY)]
    assert seen[0]["source"] == "aws.cloudwatch"
    assert seen[0]["detail"]["state"]["value"] == "ALARM"
    [metric] = seen[0]["detail"]["configuration"]["metrics"]
    assert metric["metricStat"]["metric"]["name"] == GPU_UTILIZATION_METRIC


def test_growing_gpu_memory_alerts_by_sns_and_restarts_the_job(
    account: Account, store: DynamoJobStore
) -> None:
    sqs, sns = account.client("sqs"), account.client("sns")
    url = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=account.notify_topic_arn, Protocol="sqs", Endpoint=arn)
    leaking, steady = running_job(store), running_job(store)
    for job_id in (leaking, steady):
        CloudWatchAlarms(account.client("cloudwatch")).create(
            job_id, store.get(job_id).effective_spec, POLICY
        )
    publish(account, leaking, GPU_MEMORY_METRIC, [20_000.0, 20_900.0])
    publish(account, steady, GPU_MEMORY_METRIC, [20_000.0, 20_000.0])
    AlarmEvaluator(account).tick()

    assert eventually(lambda: store.get(leaking).drain_reason == MEMORY_LEAK)
    assert store.get(leaking).flags == ["memory-leak"]
    control = account.client("s3").get_object(
        Bucket=account.bucket, Key=f"runs/{leaking}/control.json"
    )
    assert json.loads(control["Body"].read())["action"] == "checkpoint"
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    alerts = [json.loads(m["Body"]) for m in messages]
    assert any(leaking in a["Message"] and "leaks GPU memory" in a["Subject"] for a in alerts)
    state = account.client("cloudwatch").describe_alarms(
        AlarmNames=[alarm_name(steady, AlarmKind.LEAK)]
    )["MetricAlarms"][0]["StateValue"]
    assert state == "OK" and store.get(steady).drain_reason is None
