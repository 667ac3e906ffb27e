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
        self._put(
            job_id,
            IDLE,
            "GPUs idle",
            metric=GPU_UTILIZATION_METRIC,
            statistic="Average",
            periods=policy.low_utilization_periods,
            threshold=policy.low_utilization_percent,
            comparison="LessThanThreshold",
            period=policy.period_seconds,
        )
        self._put(
            job_id,
            HOT,
            "a GPU runs too hot",
            metric=GPU_TEMPERATURE_METRIC,
            statistic="Maximum",
            periods=policy.hot_periods,
            threshold=policy.hot_temperature_celsius,
            comparison="GreaterThanThreshold",
            period=policy.period_seconds,
        )

    def _put(
        self,
        job_id: str,
        kind: str,
        what: str,
        *,
        metric: str,
        statistic: str,
        periods: int,
        threshold: float,
        comparison: str,
        period: int,
    ) -> None:
        self._client.put_metric_alarm(
            AlarmName=alarm_name(job_id, kind),
            AlarmDescription=f"gpufleet job {job_id}: {what}",
            Namespace=METRICS_NAMESPACE,
            MetricName=metric,
            Dimensions=[{"Name": JOB_DIMENSION, "Value": job_id}],
            Statistic=statistic,
            Period=period,
            EvaluationPeriods=periods,
            Threshold=threshold,
            ComparisonOperator=comparison,
            # No data (booting, checkpointing) is neither idle nor hot.
            TreatMissingData="notBreaching",
        )

    def delete(self, job_id: str) -> None:
        self._client.delete_alarms(AlarmNames=[alarm_name(job_id, k) for k in (IDLE, HOT)])
