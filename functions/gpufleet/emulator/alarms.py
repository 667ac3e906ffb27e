"""CloudWatch alarms for the embedded account: moto stores alarms and metric data but never
evaluates one. This evaluates gpufleet's alarms the way CloudWatch does (the statistic over the
last `EvaluationPeriods` periods against the threshold, missing data not breaching) and, on a
change, sets the alarm state and emits the real `CloudWatch Alarm State Change` event."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.emulator.account import Account
from gpufleet.emulator.ticker import Ticker
from gpufleet.topology import ALARM_PREFIX, DETAIL_ALARM_STATE_CHANGE

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "LessThanThreshold": lambda value, threshold: value < threshold,
    "GreaterThanThreshold": lambda value, threshold: value > threshold,
}


class AlarmEvaluator(Ticker):
    def __init__(self, account: Account, every_seconds: float = 0.5) -> None:
        super().__init__("alarm-evaluator", every_seconds)
        self._cloudwatch = account.client("cloudwatch")
        self._events = account.client("events")

    def tick(self) -> None:
        for alarm in self._cloudwatch.describe_alarms(AlarmNamePrefix=ALARM_PREFIX)["MetricAlarms"]:
            self._evaluate(alarm)

    def _evaluate(self, alarm: dict[str, Any]) -> None:
        period, periods = int(alarm["Period"]), int(alarm["EvaluationPeriods"])
        now = datetime.now(UTC)
        points = self._cloudwatch.get_metric_statistics(
            Namespace=alarm["Namespace"],
            MetricName=alarm["MetricName"],
            Dimensions=alarm["Dimensions"],
            StartTime=now - timedelta(seconds=period * periods),
            EndTime=now,
            Period=period,
            Statistics=[alarm["Statistic"]],
        )["Datapoints"]
        compare = _COMPARE[alarm["ComparisonOperator"]]
        breaching = len(points) >= periods and all(
            compare(p[alarm["Statistic"]], alarm["Threshold"]) for p in points
        )
        state = "ALARM" if breaching else "OK"
        previous = alarm["StateValue"]
        if state == previous or (state == "OK" and previous == "INSUFFICIENT_DATA"):
            return
        reason = f"{len(points)} datapoints {'breaching' if breaching else 'not breaching'}"
        self._cloudwatch.set_alarm_state(
            AlarmName=alarm["AlarmName"], StateValue=state, StateReason=reason
        )
        detail = {
            "alarmName": alarm["AlarmName"],
            "state": {"value": state, "reason": reason, "timestamp": now.isoformat()},
            "previousState": {"value": previous},
            "configuration": {
                "metrics": [
                    {
                        "id": "m1",
                        "metricStat": {
                            "metric": {
                                "namespace": alarm["Namespace"],
                                "name": alarm["MetricName"],
                                "dimensions": {d["Name"]: d["Value"] for d in alarm["Dimensions"]},
                            },
                            "period": period,
                            "stat": alarm["Statistic"],
                        },
                    }
                ]
            },
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
