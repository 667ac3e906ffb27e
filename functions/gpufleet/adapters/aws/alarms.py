"""Per-job CloudWatch alarms on the metrics the node agents publish (`GpuFleet/Jobs`, `JobId`).

Which alarms a job gets is decided by `domain.scaling.job_alarm_rules` from the job's spec (the
stored job, read here, so that launching code only names the job). A rule on a metric's change
per period becomes a metric-math alarm (`DIFF`); the others are plain metric alarms.

CloudWatch takes 3 `PutMetricAlarm` and 3 `DeleteAlarms` requests a second for the whole
account and region (CloudWatch service quotas), and a burst of launches asks for 3 to 5 alarms
each: a call still throttled after the SDK's own retries is tried again with jittered backoff,
for up to `THROTTLE_PATIENCE_SECONDS`, so that a burst of launches is paced to the quota
instead of failing. 20 launches at once are about 30 s of it, shared by the launches that
wait; one waits 45 s at most with the SDK's retries, within its function's 90 s. A larger
burst fails some launches, which the state machine retries (the fleet's launch is idempotent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.adapters.aws.transactions import Backoff
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.scaling import AlarmKind, AlarmRule, job_alarm_rules
from gpufleet.domain.spec import JobSpec
from gpufleet.topology import ALARM_PREFIX, JOB_DIMENSION, METRICS_NAMESPACE

# How long one create or delete keeps trying throttled calls: with a call's own SDK retries
# (about 15 s at most) still within the Launch and Release functions' timeouts (`topology`).
THROTTLE_PATIENCE_SECONDS = 30.0
_BACKOFF = Backoff(base_seconds=0.1, cap_seconds=2.0)
# What CloudWatch answers past its rates (the query error code the SDK reports).
_THROTTLED = frozenset({"Throttling", "ThrottlingException"})


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
    def __init__(self, client: Any, patience_seconds: float = THROTTLE_PATIENCE_SECONDS) -> None:
        self._client = client
        self._patience = patience_seconds

    def create(self, job_id: str, spec: JobSpec, policy: MetricPolicy) -> None:
        patience = _Patience(self._patience)
        for rule in job_alarm_rules(spec, policy):
            patience.call(self._client.put_metric_alarm, **alarm_parameters(job_id, rule))

    def delete(self, job_id: str) -> None:
        # Every kind, whichever this run got: deleting an alarm that does not exist is no error.
        names = [alarm_name(job_id, kind) for kind in AlarmKind]
        _Patience(self._patience).call(self._client.delete_alarms, AlarmNames=names)


class _Patience:
    """Calls tried again while CloudWatch throttles them, with full-jitter exponential backoff,
    until `patience_seconds` have passed since the first; then the throttle is raised."""

    def __init__(self, patience_seconds: float) -> None:
        self._deadline = time.monotonic() + patience_seconds
        self._tries = 0

    def call(self, request: Callable[..., object], **parameters: Any) -> None:
        while True:
            try:
                request(**parameters)
                return
            except ClientError as exc:
                throttled = exc.response.get("Error", {}).get("Code") in _THROTTLED
                if not throttled or time.monotonic() >= self._deadline:
                    raise
            self._tries += 1
            time.sleep(_BACKOFF.delay(self._tries))
