"""Metrics -> action on the embedded account: what the node agents publish (moto's CloudWatch),
the MetricWatch function (the real handler, invoked as its schedule does) reading every running
job's series with GetMetricData, and what it does to the job. No alarm is created."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.config import FleetConfig, MetricPolicy
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.scaling import AlarmKind
from gpufleet.domain.settlement import MEMORY_LEAK, RESIZED
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator.account import ACCOUNT_ID, Account, embedded_account
from gpufleet.emulator.patches import CONTROL_PLANE, acting_as, invoke_async
from gpufleet.topology import (
    GPU_MEMORY_METRIC,
    GPU_UTILIZATION_METRIC,
    JOB_DIMENSION,
    JOBS_TABLE,
    METRIC_WATCH,
    METRICS_NAMESPACE,
)

# Periods of 10 s, one of them enough to act.
PERIOD = 10
POLICY = MetricPolicy(period_seconds=PERIOD, high_utilization_periods=1, memory_leak_periods=1)
_jobs = iter(range(1, 1_000_000))


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account(config=FleetConfig(metrics=POLICY)) as created:
        yield created


@pytest.fixture(scope="module")
def store(account: Account) -> DynamoJobStore:
    return DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])


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
    """One datapoint per 10 s period, the last in the period under way: whichever whole
    periods a pass reads, the last values are there."""
    now = time.time()
    account.client("cloudwatch").put_metric_data(
        Namespace=METRICS_NAMESPACE,
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [{"Name": JOB_DIMENSION, "Value": job_id}],
                "Timestamp": datetime.fromtimestamp(now - PERIOD * (len(values) - 1 - n), UTC),
                "Value": value,
            }
            for n, value in enumerate(values)
        ],
    )


def watch(account: Account) -> None:
    """One pass of MetricWatch, invoked as its schedule invokes it."""
    arn = account.function_arns[METRIC_WATCH.construct_id]
    with acting_as(CONTROL_PLANE):
        assert invoke_async(ACCOUNT_ID, arn, {"source": "aws.scheduler"})


def test_busy_gpus_scale_an_elastic_job_out_once(account: Account, store: DynamoJobStore) -> None:
    job_id = running_job(store, "resources: {gpus: 1, nodes: 1, elastic: {max_nodes: 3}}\n")
    publish(account, job_id, GPU_UTILIZATION_METRIC, [96.0, 96.0, 96.0])
    watch(account)
    job = store.get(job_id)
    assert job.resources_override is not None and job.resources_override.nodes == 2
    assert job.drain_reason == RESIZED and job.flags == ["scaled-out"]
    assert job.alarming == [AlarmKind.BUSY]
    version = job.version
    watch(account)  # the same data again: the alarm is already in ALARM, nothing more happens
    assert store.get(job_id).version == version


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
    publish(account, leaking, GPU_MEMORY_METRIC, [20_000.0, 20_900.0, 21_800.0, 22_700.0])
    publish(account, steady, GPU_MEMORY_METRIC, [20_000.0] * 4)
    watch(account)

    assert store.get(leaking).drain_reason == MEMORY_LEAK
    assert store.get(leaking).flags == ["memory-leak"]
    control = account.client("s3").get_object(
        Bucket=account.bucket, Key=f"runs/{leaking}/control.json"
    )
    assert json.loads(control["Body"].read())["action"] == "checkpoint"
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    alerts = [json.loads(m["Body"]) for m in messages]
    assert any(leaking in a["Message"] and "leaks GPU memory" in a["Subject"] for a in alerts)
    assert store.get(steady).drain_reason is None and store.get(steady).alarming == []
    assert account.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
