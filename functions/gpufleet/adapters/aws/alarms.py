"""Per-job CloudWatch alarms on the GPU utilization the node agents publish."""

from __future__ import annotations

from typing import Any

from gpufleet.domain.config import MetricPolicy
from gpufleet.topology import (
    ALARM_PREFIX,
    GPU_TEMPERATURE_METRIC,
    GPU_UTILIZATION_METRIC,
    JOB_DIMENSION,
    METRICS_NAMESPACE,
)

IDLE = "idle"
HOT = "hot"


def alarm_name(job_id: str, kind: str) -> str:
    return f"{ALARM_PREFIX}{job_id}-{kind}"


def parse_alarm_name(name: str) -> tuple[str, str] | None:
    """(job id, kind) of one of our alarms; None for anyone else's."""
    if not name.startswith(ALARM_PREFIX):
        return None
    job_id, _, kind = name[len(ALARM_PREFIX) :].rpartition("-")
    return (job_id, kind) if job_id and kind else None


class CloudWatchAlarms:
    def __init__(self, client: Any) -> None:
        self._client = client

    def create(self, job_id: str, policy: MetricPolicy) -> None:
        if not policy.enabled:
            return
        self._client.put_metric_alarm(
            AlarmName=alarm_name(job_id, IDLE),
            AlarmDescription=f"gpufleet job {job_id}: GPUs idle",
            Namespace=METRICS_NAMESPACE,
            MetricName=GPU_UTILIZATION_METRIC,
            Dimensions=[{"Name": JOB_DIMENSION, "Value": job_id}],
            Statistic="Average",
            Period=policy.period_seconds,
            EvaluationPeriods=policy.low_utilization_periods,
            Threshold=policy.low_utilization_percent,
            ComparisonOperator="LessThanThreshold",
            # No data (booting, checkpointing) is not idleness.
            TreatMissingData="notBreaching",
        )

        self._client.put_metric_alarm(
            AlarmName=alarm_name(job_id, HOT),
            AlarmDescription=f"gpufleet job {job_id}: a GPU runs too hot",
            Namespace=METRICS_NAMESPACE,
            MetricName=GPU_TEMPERATURE_METRIC,
            Dimensions=[{"Name": JOB_DIMENSION, "Value": job_id}],
            Statistic="Maximum",
            Period=policy.period_seconds,
            EvaluationPeriods=policy.hot_periods,
            Threshold=policy.hot_temperature_celsius,
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
        )

    def delete(self, job_id: str) -> None:
        self._client.delete_alarms(AlarmNames=[alarm_name(job_id, k) for k in (IDLE, HOT)])
