"""CloudWatch alarms for the embedded account: moto stores alarms and metric data but never
evaluates one. This evaluates gpufleet's alarms the way CloudWatch does (the statistic of each of
the last `EvaluationPeriods` periods against the threshold, missing data not breaching), metric
math alarms too (the `DIFF` of one metric, the only expression gpufleet puts in an alarm), and,
on a change, sets the alarm state and emits the real `CloudWatch Alarm State Change` event."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.emulator.account import Account
from gpufleet.emulator.ticker import Ticker
from gpufleet.topology import ALARM_PREFIX, DETAIL_ALARM_STATE_CHANGE

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "LessThanThreshold": lambda value, threshold: value < threshold,
    "GreaterThanThreshold": lambda value, threshold: value > threshold,
}
_DIFF = re.compile(r"^DIFF\((\w+)\)$")


def diff(values: Sequence[float]) -> list[float]:
    """CloudWatch's DIFF: each value minus the one before it (one fewer value)."""
    return [after - before for before, after in itertools.pairwise(values)]


def breaching(values: Sequence[float], comparison: str, threshold: float, periods: int) -> bool:
    """Every one of the last `periods` values (oldest first) breaches; fewer values than that
    (missing data) do not."""
    recent = values[-periods:] if periods else []
    return len(recent) == periods and all(_COMPARE[comparison](v, threshold) for v in recent)


class AlarmEvaluator(Ticker):
    def __init__(self, account: Account, every_seconds: float = 0.5) -> None:
        super().__init__("alarm-evaluator", every_seconds, account.clock)
        self._cloudwatch = account.client("cloudwatch")
        self._events = account.client("events")

    def tick(self) -> None:
        for alarm in self._cloudwatch.describe_alarms(AlarmNamePrefix=ALARM_PREFIX)["MetricAlarms"]:
            try:
                self._evaluate(alarm)
            except ClientError as exc:
                # Deleted since it was listed (its job was released): nothing left to evaluate.
                if exc.response.get("Error", {}).get("Code") != "ResourceNotFound":
                    raise

    def _series(
        self, metric: dict[str, Any], stat: str, period: int, periods: int, now: datetime
    ) -> list[float]:
        """The statistic of each of the last `periods` periods that has data, oldest first."""
        points = self._cloudwatch.get_metric_statistics(
            Namespace=metric["Namespace"],
            MetricName=metric["MetricName"],
            Dimensions=metric["Dimensions"],
            StartTime=now - timedelta(seconds=period * periods),
            EndTime=now,
            Period=period,
            Statistics=[stat],
        )["Datapoints"]
        return [p[stat] for p in sorted(points, key=lambda p: p["Timestamp"])]

    def _values(
        self, alarm: dict[str, Any], now: datetime
    ) -> tuple[list[float], list[dict[str, Any]]]:
        """The values the alarm compares, and its `configuration` as the event reports it."""
        periods = int(alarm["EvaluationPeriods"])
        queries = alarm.get("Metrics") or []
        if not queries:
            metric = {k: alarm[k] for k in ("Namespace", "MetricName", "Dimensions")}
            period, stat = int(alarm["Period"]), alarm["Statistic"]
            configuration: list[dict[str, Any]] = [
                {"id": "m1", "metricStat": _metric_stat(metric, period, stat)}
            ]
            return self._series(metric, stat, period, periods, now), configuration
        by_id = {q["Id"]: q for q in queries}
        [returned] = [q for q in queries if q.get("ReturnData")]
        match = _DIFF.match(returned.get("Expression", ""))
        if match is None:
            raise ValueError(f"{alarm['AlarmName']}: the emulator evaluates DIFF(id) only")
        stat = by_id[match.group(1)]["MetricStat"]
        period = int(stat["Period"])
        # One period more than the alarm looks at: the first change needs a value before it.
        series = self._series(stat["Metric"], stat["Stat"], period, periods + 1, now)
        return diff(series), [_query_configuration(q) for q in queries]

    def _evaluate(self, alarm: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        values, configuration = self._values(alarm, now)
        is_breaching = breaching(
            values,
            alarm["ComparisonOperator"],
            alarm["Threshold"],
            int(alarm["EvaluationPeriods"]),
        )
        state = "ALARM" if is_breaching else "OK"
        previous = alarm["StateValue"]
        if state == previous or (state == "OK" and previous == "INSUFFICIENT_DATA"):
            return
        reason = f"{len(values)} datapoints {'breaching' if is_breaching else 'not breaching'}"
        self._cloudwatch.set_alarm_state(
            AlarmName=alarm["AlarmName"], StateValue=state, StateReason=reason
        )
        detail = {
            "alarmName": alarm["AlarmName"],
            "state": {"value": state, "reason": reason, "timestamp": now.isoformat()},
            "previousState": {"value": previous},
            "configuration": {"metrics": configuration},
        }
        self._events.put_events(
            Entries=[
                {
                    "Source": "aws.cloudwatch",
                    "DetailType": DETAIL_ALARM_STATE_CHANGE,
                    "Detail": json.dumps(detail),
                    "Resources": [alarm["AlarmArn"]],
                }
            ]
        )


def _metric_stat(metric: dict[str, Any], period: int, stat: str) -> dict[str, Any]:
    """A metric as the alarm event's `configuration.metrics[].metricStat` describes it."""
    return {
        "metric": {
            "namespace": metric["Namespace"],
            "name": metric["MetricName"],
            "dimensions": {d["Name"]: d["Value"] for d in metric["Dimensions"]},
        },
        "period": period,
        "stat": stat,
    }


def _query_configuration(query: dict[str, Any]) -> dict[str, Any]:
    """A metric math alarm's query as the alarm event's `configuration.metrics[]` has it."""
    if "MetricStat" in query:
        stat = query["MetricStat"]
        return {
            "id": query["Id"],
            "metricStat": _metric_stat(stat["Metric"], int(stat["Period"]), stat["Stat"]),
            "returnData": bool(query.get("ReturnData")),
        }
    return {
        "id": query["Id"],
        "expression": query["Expression"],
        "label": query.get("Label", ""),
        "returnData": bool(query.get("ReturnData")),
    }
