"""Per-job CloudWatch alarms on the metrics the node agents publish (`GpuFleet/Jobs`, `JobId`).

Which alarms a job gets is decided by `domain.scaling.job_alarm_rules` from the job's spec (the
stored job, read here, so that launching code only names the job). A rule on a metric's change
per period becomes a metric-math alarm (`DIFF`); the others are plain metric alarms.
"""

from __future__ import annotations

from typing import Any

from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.scaling import AlarmKind, AlarmRule, job_alarm_rules
from gpufleet.domain.spec import JobSpec
from gpufleet.topology import ALARM_PREFIX, JOB_DIMENSION, METRICS_NAMESPACE


def alarm_name(job_id: str, kind: str) -> str:
    return f"{ALARM_PREFIX}{job_id}-{kind}"


def parse_alarm_name(name: str) -> tuple[str, AlarmKind] | None:
    """(job id, kind) of one of our alarms; None for anyone else's."""
    if not name.startswith(ALARM_PREFIX):
        return None
    job_id, _, kind = name[len(ALARM_PREFIX) :].rpartition("-")
    if not job_id or kind not in AlarmKind.__members__.values():
        return None
    return job_id, AlarmKind(kind)


def alarm_parameters(job_id: str, rule: AlarmRule) -> dict[str, Any]:
    """PutMetricAlarm's parameters for one rule of one job."""
    metric = {
        "Namespace": METRICS_NAMESPACE,
        "MetricName": rule.metric,
        "Dimensions": [{"Name": JOB_DIMENSION, "Value": job_id}],
    }
    parameters: dict[str, Any] = {
        "AlarmName": alarm_name(job_id, rule.kind),
        "AlarmDescription": f"gpufleet job {job_id}: {rule.description}",
        "EvaluationPeriods": rule.periods,
        "DatapointsToAlarm": rule.periods,
        "Threshold": rule.threshold,
        "ComparisonOperator": rule.comparison.value,
        # No data (booting, checkpointing) is neither idle, busy, hot nor leaking.
        "TreatMissingData": "notBreaching",
    }
    if not rule.change:
        return {**parameters, **metric, "Statistic": rule.statistic, "Period": rule.period_seconds}
    return {
        **parameters,
        "Metrics": [
            {
                "Id": "m1",
                "MetricStat": {
                    "Metric": metric,
                    "Period": rule.period_seconds,
                    "Stat": rule.statistic,
                },
                "ReturnData": False,
            },
            {
                "Id": "e1",
                "Expression": "DIFF(m1)",
                "Label": f"{rule.metric} change per period",
                "ReturnData": True,
            },
        ],
    }


class CloudWatchAlarms:
    def __init__(self, client: Any) -> None:
        self._client = client

    def create(self, job_id: str, spec: JobSpec, policy: MetricPolicy) -> None:
        for rule in job_alarm_rules(spec, policy):
            self._client.put_metric_alarm(**alarm_parameters(job_id, rule))

    def delete(self, job_id: str) -> None:
        # Every kind, whichever this run got: deleting an alarm that does not exist is no error.
        self._client.delete_alarms(AlarmNames=[alarm_name(job_id, kind) for kind in AlarmKind])
